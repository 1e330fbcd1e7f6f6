//! The agent ingest service (`commscope.v1.Ingest/Stream`): one bidirectional stream per agent.
//!
//! Each request is checked, its records handed to the store, and answered in order; record
//! batches are answered only once durable. A stream's batches are pipelined (the next is queued
//! while the previous one is being synced), so one agent can fill a group commit by itself, and
//! each is handed to the live state in the stream's order as soon as it is stored, without
//! waiting for the ones ahead of it to be applied (one small batch after another would otherwise
//! pay a round trip to the shard's applier each).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use commscope_wire::cst::{self, Header};
use commscope_wire::grpc::ingest_request::Payload;
use commscope_wire::grpc::ingest_server::Ingest;
use commscope_wire::grpc::{IngestAck, IngestRequest, ProcessId};
use commscope_wire::op::Op;
use commscope_wire::record::RECORD_LAYOUT_VERSION as LAYOUT_VERSION;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::Shared;
use crate::state::{InFlightCall, now_ns};

mod records;

/// Records one batch may carry at most.
pub const MAX_BATCH_RECORDS: usize = 1 << 16;

/// Acknowledgements a stream may have waiting for its agent to read them; beyond, the stream
/// ends (an agent keeps at most its window of batches unacknowledged).
const MAX_UNSENT_ACKS: usize = 1 << 16;

/// An agent that reads no acknowledgement for this long is no longer answered.
const UNREAD_ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A request's acknowledgement, once its work is done.
type AckFuture = Pin<Box<dyn Future<Output = IngestAck> + Send>>;

/// A request's work as far as handing it to the live state, run in the stream's order; what it
/// resolves with finishes it (runs in order too, behind, while the next requests are stored).
type Work = Pin<Box<dyn Future<Output = Finishing> + Send>>;

/// The rest of a request's work, once handed to the live state: resolves with its
/// acknowledgement.
struct Finishing(AckFuture);

/// Requests of one stream handed to the live state and not yet finished, at most.
const MAX_APPLYING: usize = 256;

/// The service.
#[derive(Debug, Clone)]
pub struct IngestService {
    pub(crate) shared: Arc<Shared>,
}

/// Per-stream bookkeeping: who is on the other end and how fast it sends.
struct Peer {
    node: Option<String>,
    addr: String,
    /// Token bucket for the per-agent record rate.
    tokens: f64,
    last: Instant,
    /// After a refusal, every batch is refused until then, so none overtakes the refused one.
    blocked_until: Option<Instant>,
}

/// Per node: the jobs its agent sent records of, when each was first admitted, and their
/// processes — kept across the agent's reconnections (a fresh stream gets no fresh budget); a
/// job leaves once the collector no longer holds it.
pub type AgentUsage = std::collections::HashMap<String, NodeJobs>;

/// One node's admitted jobs: when each was first admitted, and its processes (pid, start).
pub type NodeJobs =
    std::collections::HashMap<String, (Instant, std::collections::HashSet<(u32, u64)>)>;

/// A job admitted this long ago and no longer in memory no longer counts against its node.
const USAGE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the per-agent bounds admit records of `p` from `node`'s agent: a job or a process
/// beyond them is refused (why, and the refusal's reason label). The agent's own transport
/// identity is not a rank.
fn admits(shared: &Shared, node: &str, p: &ProcessId) -> Result<(), (String, &'static str)> {
    let (max_jobs, max_ranks) = (
        shared.config.max_jobs_per_agent,
        shared.config.max_ranks_per_agent,
    );
    let mut usage = shared.agent_usage.lock().unwrap_or_else(|e| e.into_inner());
    let jobs = usage.entry(node.to_owned()).or_default();
    let ranks = |jobs: &NodeJobs| jobs.values().map(|(_, p)| p.len()).sum::<usize>();
    let is_rank = p.rank != commscope_wire::record::TRANSPORT_RANK;
    let known = jobs
        .get(&p.job)
        .is_some_and(|(_, procs)| !is_rank || procs.contains(&(p.pid, p.start_time)));
    if known {
        return Ok(());
    }
    // At a bound: forget the jobs the collector released first.
    if jobs.len() >= max_jobs || ranks(jobs) >= max_ranks {
        let live: std::collections::HashSet<String> =
            shared.state.job_names().into_iter().collect();
        jobs.retain(|j, (at, _)| at.elapsed() < USAGE_GRACE || live.contains(j));
    }
    if !jobs.contains_key(&p.job) && jobs.len() >= max_jobs {
        return Err((
            format!(
                "node {node}'s agent already sends {} jobs, the most one agent may (--max-jobs-per-agent); job {} is refused",
                jobs.len(),
                p.job
            ),
            "agent-jobs",
        ));
    }
    if is_rank && ranks(jobs) >= max_ranks {
        return Err((
            format!(
                "node {node}'s agent already sends {} processes, the most one agent may (--max-ranks-per-agent); rank {} of job {} is refused",
                ranks(jobs),
                p.rank,
                p.job
            ),
            "agent-ranks",
        ));
    }
    let (_, procs) = jobs
        .entry(p.job.clone())
        .or_insert_with(|| (Instant::now(), Default::default()));
    if is_rank {
        procs.insert((p.pid, p.start_time));
    }
    Ok(())
}

/// The process a message (`what`: "a record batch", "a snapshot", "a probe") speaks for, once it
/// names one and the per-agent bounds admit it: whatever makes a job or a process known to the
/// collector is held to the same bounds, or one agent could fill it with jobs through snapshots.
fn admitted<'a>(
    shared: &Shared,
    peer: &Peer,
    process: Option<&'a ProcessId>,
    what: &str,
) -> Result<&'a ProcessId, String> {
    let m = &shared.metrics;
    let Some(process) = process else {
        m.refused("malformed");
        return Err(format!("{what} without its process"));
    };
    if process.job.is_empty() || process.node.is_empty() {
        m.refused("malformed");
        return Err(format!("{what} without job or node"));
    }
    let node = peer.node.as_deref().unwrap_or_default();
    admits(shared, node, process).map_err(|(why, reason)| {
        m.refused(reason);
        why
    })?;
    Ok(process)
}

impl Peer {
    /// Takes `n` records from the bucket (it may go into debt: a batch larger than a second's
    /// worth passes when the bucket is full); on refusal, how long until it would pass (ms).
    fn take(&mut self, n: usize, rate: f64) -> Result<(), u32> {
        let rate = rate.max(1.0);
        let now = Instant::now();
        if let Some(t) = self.blocked_until {
            if now < t {
                return Err((t - now).as_millis().max(1) as u32);
            }
            self.blocked_until = None;
        }
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(rate);
        self.last = now;
        let need = (n as f64).min(rate);
        if self.tokens >= need {
            self.tokens -= n as f64;
            Ok(())
        } else {
            let wait = ((need - self.tokens) / rate * 1000.0).ceil().max(1.0) as u32;
            self.blocked_until = Some(now + std::time::Duration::from_millis(u64::from(wait)));
            Err(wait)
        }
    }
}

#[tonic::async_trait]
impl Ingest for IngestService {
    type StreamStream = ReceiverStream<Result<IngestAck, Status>>;

    async fn stream(
        &self,
        request: Request<Streaming<IngestRequest>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let addr = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "unknown".into());
        let mut inbound = request.into_inner();
        let shared = self.shared.clone();
        let (ack_tx, ack_rx) = mpsc::channel::<Result<IngestAck, Status>>(256);
        let (q_tx, mut q_rx) = mpsc::channel::<Work>(256);
        shared.metrics.streams_open.fetch_add(1, Ordering::Relaxed);
        shared.metrics.streams_total.fetch_add(1, Ordering::Relaxed);

        // Storer and finisher: do each request's work in order (a record batch: stored, handed
        // to the live state; then applied, its share of the ingest budget returned), whether or
        // not the agent reads its acknowledgements.
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<IngestAck>();
        let (applying_tx, mut applying_rx) = mpsc::channel::<AckFuture>(MAX_APPLYING);
        let unsent = Arc::new(AtomicUsize::new(0));
        let finisher_unsent = unsent.clone();
        tokio::spawn(async move {
            while let Some(work) = q_rx.recv().await {
                let Finishing(rest) = work.await;
                if applying_tx.send(rest).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            while let Some(f) = applying_rx.recv().await {
                let ack = f.await;
                finisher_unsent.fetch_add(1, Ordering::Relaxed);
                let _ = done_tx.send(ack);
            }
        });

        // Acknowledger: answers in order. An agent that reads no answer for a minute is not
        // answered any more (its stream then ends with the reader).
        let node: Arc<std::sync::OnceLock<String>> = Arc::default();
        let ack_node = node.clone();
        let ack_shared = shared.clone();
        let mut acks = Some(ack_tx.clone());
        let acker_unsent = unsent.clone();
        tokio::spawn(async move {
            while let Some(mut ack) = done_rx.recv().await {
                acker_unsent.fetch_sub(1, Ordering::Relaxed);
                let Some(tx) = &acks else { continue };
                ack.collector_send_ns = now_ns();
                if let Some(n) = ack_node.get() {
                    ack.probes = ack_shared.take_probes(n);
                }
                match tokio::time::timeout(UNREAD_ACK_TIMEOUT, tx.send(Ok(ack))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => acks = None,
                    Err(_) => {
                        tracing::warn!(
                            "an agent stream read no acknowledgement for {} s; it is no longer answered",
                            UNREAD_ACK_TIMEOUT.as_secs()
                        );
                        acks = None;
                    }
                }
            }
        });

        // Sampling rates: the node's, whenever they change (not behind acknowledgements, which
        // wait for storage).
        // A weak handle: the stream's answers end when the reader and acknowledger are done.
        let rate_acks = ack_tx.downgrade();
        let rate_node = node.clone();
        let mut rates_rx = shared.rates.subscribe();
        tokio::spawn(async move {
            // The node is known after the hello.
            let n = loop {
                if let Some(n) = rate_node.get() {
                    break n.clone();
                }
                if rate_acks.upgrade().is_none_or(|s| s.is_closed()) {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            };
            let mut sent_any = false;
            loop {
                let rates = rates_rx.borrow_and_update().get(&n).cloned();
                if rates.is_some() || sent_any {
                    sent_any = true;
                    let msg = IngestAck {
                        batch_id: 0,
                        durable: true,
                        collector_send_ns: now_ns(),
                        rates: rates.unwrap_or_default(),
                        rates_update: true,
                        ..Default::default()
                    };
                    let Some(tx) = rate_acks.upgrade() else {
                        return;
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                }
                // Wake up for new rates, or now and then to see whether the stream is over.
                loop {
                    match tokio::time::timeout(
                        std::time::Duration::from_secs(1),
                        rates_rx.changed(),
                    )
                    .await
                    {
                        Ok(Err(_)) => return,
                        Ok(Ok(())) => break,
                        Err(_) if rate_acks.upgrade().is_none() => return,
                        Err(_) => {}
                    }
                }
            }
        });

        // Reader: checks each request and queues its work.
        tokio::spawn(async move {
            let mut peer = Peer {
                node: None,
                addr,
                tokens: shared.config.max_agent_rate as f64,
                last: Instant::now(),
                blocked_until: None,
            };
            let mut ended: Option<String> = None;
            loop {
                let msg = match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(status) => {
                        shared.metrics.bad_messages.fetch_add(1, Ordering::Relaxed);
                        if shared
                            .streams_ended_log
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .allow()
                        {
                            tracing::warn!(
                                "agent stream from {} ({}) ended with an error: {}",
                                peer.addr,
                                peer.node.as_deref().unwrap_or("no hello"),
                                status.message()
                            );
                        }
                        ended = Some(format!("{} ({})", status.message(), peer.addr));
                        break;
                    }
                };
                if unsent.load(Ordering::Relaxed) > MAX_UNSENT_ACKS {
                    tracing::warn!(
                        "agent stream from {} ({}) ended: it reads none of its acknowledgements",
                        peer.addr,
                        peer.node.as_deref().unwrap_or("no hello")
                    );
                    let _ = ack_tx.try_send(Err(Status::resource_exhausted(format!(
                        "more than {MAX_UNSENT_ACKS} acknowledgements unread; read them"
                    ))));
                    ended = Some(format!("its acknowledgements unread ({})", peer.addr));
                    break;
                }
                // A record batch waits here, before it is taken any further, while the batches
                // of all streams not yet stored hold the whole ingest budget: the agents are slowed
                // down (flow control), and the collector's memory stays bounded.
                let held = match &msg.payload {
                    Some(p @ (Payload::Records(_) | Payload::NodeRecords(_))) => {
                        shared.hold(p.record_bytes()).await
                    }
                    _ => None,
                };
                let recv_ns = now_ns();
                let work = match handle(&shared, &mut peer, msg, recv_ns, held) {
                    Ok(w) => w,
                    Err(status) => {
                        let _ = ack_tx.send(Err(status)).await;
                        break;
                    }
                };
                if let Some(n) = &peer.node
                    && node.set(n.clone()).is_ok()
                {
                    shared.agent_connected(n, recv_ns);
                }
                if q_tx.send(work).await.is_err() {
                    break;
                }
            }
            if let Some(n) = node.get() {
                shared.agent_stream_ended(n, ended.as_deref(), now_ns());
            }
            shared.metrics.streams_open.fetch_sub(1, Ordering::Relaxed);
        });
        Ok(Response::new(ReceiverStream::new(ack_rx)))
    }
}

fn ack(batch_id: u64, recv_ns: u64) -> IngestAck {
    IngestAck {
        batch_id,
        durable: true,
        collector_recv_ns: recv_ns,
        ..Default::default()
    }
}

fn refused(batch_id: u64, recv_ns: u64, error: String, retry_after_ms: u32) -> IngestAck {
    IngestAck {
        batch_id,
        durable: false,
        collector_recv_ns: recv_ns,
        error,
        retry_after_ms,
        ..Default::default()
    }
}

/// Work already done: its acknowledgement.
fn ready(a: IngestAck) -> Work {
    Box::pin(std::future::ready(done(a)))
}

/// A finished request's acknowledgement.
fn done(a: IngestAck) -> Finishing {
    Finishing(Box::pin(std::future::ready(a)))
}

/// The process identity of a request as a trace header.
pub fn header_of(p: &ProcessId) -> Header {
    Header {
        version: cst::FORMAT_VERSION,
        job: p.job.clone(),
        node: p.node.clone(),
        pid: p.pid,
        rank: p.rank,
        world_size: p.world_size,
        start_time: p.start_time,
        mono_anchor: p.mono_anchor_ns,
        real_anchor: p.real_anchor_ns,
        library: p.library.clone(),
        flavour: p.flavour.clone(),
        writer_version: String::new(),
    }
}

/// Checks one request; returns the work whose result is its acknowledgement, or a status that
/// ends the stream (a protocol violation).
fn handle(
    shared: &Arc<Shared>,
    peer: &mut Peer,
    msg: IngestRequest,
    recv_ns: u64,
    held: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<Work, Status> {
    let id = msg.batch_id;
    let m = &shared.metrics;
    let Some(payload) = msg.payload else {
        m.refused("empty");
        return Ok(ready(refused(
            id,
            recv_ns,
            "a request without a payload".into(),
            0,
        )));
    };
    if peer.node.is_none() && !matches!(payload, Payload::Hello(_)) {
        m.refused("no-hello");
        return Err(Status::failed_precondition(
            "the first message on an ingest stream must be a hello",
        ));
    }
    match payload {
        Payload::Hello(h) => {
            if h.layout_version != LAYOUT_VERSION {
                m.refused("layout-version");
                tracing::warn!(
                    "refused agent {} at {}: record layout version {}, this collector reads {}",
                    h.node,
                    peer.addr,
                    h.layout_version,
                    LAYOUT_VERSION
                );
                return Err(Status::failed_precondition(format!(
                    "record layout version {} is not supported (this collector reads version {LAYOUT_VERSION}); run matching commscope versions",
                    h.layout_version
                )));
            }
            if h.node.is_empty() {
                m.refused("hello");
                return Err(Status::invalid_argument("hello without a node name"));
            }
            tracing::info!(
                "agent {} connected from {} (commscope {})",
                h.node,
                peer.addr,
                h.agent_version
            );
            peer.node = Some(h.node);
            Ok(ready(IngestAck {
                node_records: true,
                ..ack(id, recv_ns)
            }))
        }
        Payload::Records(b) => match records::check(shared, peer, b) {
            Ok(b) => Ok(records::take(shared, peer, vec![b], id, recv_ns, held)),
            Err(why) => Ok(ready(refused(id, recv_ns, why, 0))),
        },
        Payload::NodeRecords(n) => {
            if n.batches.is_empty() {
                m.refused("malformed");
                return Ok(ready(refused(
                    id,
                    recv_ns,
                    "a node's records without any batch".into(),
                    0,
                )));
            }
            let mut batches = Vec::with_capacity(n.batches.len());
            for (i, b) in n.batches.into_iter().enumerate() {
                match records::check(shared, peer, b) {
                    Ok(b) => batches.push(b),
                    Err(why) => {
                        return Ok(ready(refused(
                            id,
                            recv_ns,
                            format!("batch {i} of the node's records: {why}"),
                            0,
                        )));
                    }
                }
            }
            Ok(records::take(shared, peer, batches, id, recv_ns, held))
        }
        Payload::InFlight(s) => {
            let process = match admitted(shared, peer, s.process.as_ref(), "a snapshot") {
                Ok(p) => p,
                Err(why) => return Ok(ready(refused(id, recv_ns, why, 0))),
            };
            if shared.memory.pressure() == crate::memory::Pressure::Full {
                // Not applied while the records it follows are held back: the node's data
                // would look current when it is not. The next one comes within a second.
                m.refused("memory");
                return Ok(ready(refused(
                    id,
                    recv_ns,
                    "the collector is at its memory bound".into(),
                    0,
                )));
            }
            let header = header_of(process);
            let calls = s
                .entries
                .iter()
                .map(|e| InFlightCall {
                    rank: process.rank,
                    comm_id: e.comm_id,
                    seq: e.seq,
                    op: if Op::from_name(&e.op).is_some() {
                        e.op.clone()
                    } else {
                        "unknown".into()
                    },
                    t_enter: e.t_enter_ns,
                    bytes: e.bytes,
                    peer: e.peer,
                    tag: e.tag,
                    posted: e.status == u32::from(commscope_wire::shm::in_flight_status::POSTED),
                    for_s: s.t_mono_ns.saturating_sub(e.t_enter_ns) as f64 / 1e9,
                    issued_only: e.status
                        == u32::from(commscope_wire::shm::in_flight_status::ISSUED),
                    count: e.count,
                    dtype: u16::try_from(e.dtype).unwrap_or(0),
                    red_op: u8::try_from(e.red_op).unwrap_or(0),
                })
                .collect();
            let proc = (!s.proc_state.is_empty()).then(|| crate::state::ProcSample {
                state: s.proc_state.chars().take(4).collect(),
                wchan: s.wchan.chars().take(64).collect(),
                cpu_ns: s.cpu_ns,
            });
            // Applied in its stream's order: never before the record batches sent ahead of it.
            let shared = shared.clone();
            let (t_mono_ns, last_beat_ns) = (s.t_mono_ns, s.last_beat_ns);
            Ok(Box::pin(async move {
                let h = header.clone();
                let taking = shared.state.dispatch(&header.job, move |st| {
                    st.snapshot(&h, t_mono_ns, last_beat_ns, calls, proc)
                });
                Finishing(Box::pin(async move {
                    if let Ok(taken) = taking.await {
                        shared.arrived(&header.node, taken);
                    }
                    ack(id, recv_ns)
                }))
            }))
        }
        Payload::Exit(_) => Ok(ready(ack(id, recv_ns))),
        Payload::Probe(p) => {
            let process = match admitted(shared, peer, p.process.as_ref(), "a probe") {
                Ok(p) => p,
                Err(why) => return Ok(ready(refused(id, recv_ns, why, 0))),
            };
            let header = header_of(process);
            let cap = |s: String| s.chars().take(32 << 10).collect::<String>();
            let stacks = crate::state::Stacks {
                native: cap(p.native_stack),
                python: cap(p.python_stack),
                error: cap(p.error),
                at_ns: recv_ns,
            };
            let shared = shared.clone();
            Ok(Box::pin(async move {
                let job = header.job.clone();
                let setting = shared
                    .state
                    .dispatch(&job, move |st| st.set_stacks(&header, stacks));
                Finishing(Box::pin(async move {
                    let _ = setting.await;
                    ack(id, recv_ns)
                }))
            }))
        }
    }
}
