//! The simulated nodes' streams to the collector, kept as their agents keep them: one stream per
//! node through the agent's own uplink ([`commscope_agent::uplink`]: hello, TLS and token,
//! reconnecting with backoff), and every record batch held until the collector acknowledges it,
//! sent again, in order, on the node's next stream. In-flight snapshots are sent only while the
//! node's stream is up (the next one supersedes a lost one).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use commscope_agent::uplink::{self, Link};
use commscope_wire::grpc::IngestRequest;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, watch};

/// Sampling rates a node's stream received: (node index, (comm, modulus, from_seq) list).
pub type RatesMsg = (usize, Vec<(u64, u32, u64)>);

/// Record batches held for acknowledgement, at most (the oldest beyond it are dropped and
/// counted): a 4,096-rank job holds about 60 MiB through a 15 s outage.
const HELD_MAX_BYTES: usize = 1 << 30;

/// Disconnections logged one by one; the rest are counted in the summary.
const LOGGED_DISCONNECTS: u64 = 5;

/// What the streams did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    /// Messages sent for the first time: record batches and in-flight snapshots.
    pub sent: u64,
    /// Answers: acknowledged, refused (with an error: dropped), and refused with a retry delay
    /// (held and sent again after it, as an agent does).
    pub acked: u64,
    pub refused: u64,
    pub retried: u64,
    /// Record batches made, and those still unacknowledged (at the end: lost).
    pub batches: u64,
    pub unacked: u64,
    /// Record batches sent again on a new stream, and the streams opened after a first one.
    pub resent: u64,
    pub reconnects: u64,
    /// Record batches dropped unsent because the held ones passed [`HELD_MAX_BYTES`].
    pub dropped: u64,
}

#[derive(Default)]
struct Node {
    tx: Option<mpsc::Sender<IngestRequest>>,
    /// Record batches not yet acknowledged, by batch id (ids grow: this is the node's order).
    held: BTreeMap<u64, (IngestRequest, usize)>,
    /// The last batch id sent on the current stream, and on any stream.
    sent_now: u64,
    sent_ever: u64,
    connected_once: bool,
    /// Batches the collector asked to send again, and when.
    retry: Vec<(Instant, u64)>,
    /// Why its stream is down.
    why: Option<String>,
    /// Its collector takes a node's records in one message (its hello's answer said so).
    node_records: bool,
    /// Its stream was closed from this side at the end, and has not ended yet.
    closing: bool,
}

struct State {
    nodes: Vec<Node>,
    names: Vec<String>,
    held_bytes: usize,
    totals: Totals,
    /// Streams that ended (the first few are logged).
    disconnects: u64,
    /// The run is over: streams are closed as they open.
    closing: bool,
}

impl State {
    /// Sends what node `n` holds beyond what its stream has taken, in order, as far as the
    /// stream takes it now.
    fn flush(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        let Some(tx) = node.tx.clone() else { return };
        // Refused with a retry delay that has passed: again, as far as the stream takes them.
        if !node.retry.is_empty() {
            let now = Instant::now();
            let mut later = Vec::new();
            for (at, id) in std::mem::take(&mut node.retry) {
                let Some((req, _)) = node.held.get(&id) else {
                    continue;
                };
                if at > now || tx.try_send(req.clone()).is_err() {
                    later.push((at, id));
                }
            }
            node.retry = later;
        }
        let from = node.sent_now + 1;
        for (&id, (req, _)) in node.held.range(from..) {
            match tx.try_send(req.clone()) {
                Ok(()) => {
                    node.sent_now = id;
                    if id <= node.sent_ever {
                        self.totals.resent += 1;
                    } else {
                        node.sent_ever = id;
                        self.totals.sent += 1;
                    }
                }
                Err(TrySendError::Full(_)) => break,
                Err(TrySendError::Closed(_)) => {
                    node.tx = None;
                    break;
                }
            }
        }
    }

    fn on_link(&mut self, l: Link, rates: &mpsc::UnboundedSender<RatesMsg>) {
        match l {
            Link::Connected(n, tx, _) => {
                let node = &mut self.nodes[n];
                if self.closing {
                    // Opened again as the run ends: closed at once (the sender dropped).
                    node.closing = true;
                    return;
                }
                if node.connected_once {
                    self.totals.reconnects += 1;
                }
                node.connected_once = true;
                node.tx = Some(tx);
                node.why = None;
                node.sent_now = 0;
                // Everything held goes again on the new stream, in order.
                node.retry.clear();
                self.flush(n);
            }
            Link::Ack(n, a, _) if a.batch_id == 0 => {
                // The collector's sampling rates for this node (or the hello's answer).
                if !a.rates_update {
                    self.nodes[n].node_records = a.node_records;
                }
                if a.rates_update {
                    let list = a
                        .rates
                        .iter()
                        .map(|r| (r.comm_id, r.modulus, r.from_seq))
                        .collect();
                    let _ = rates.send((n, list));
                }
            }
            Link::Ack(n, a, _) if !a.error.is_empty() && a.retry_after_ms > 0 => {
                // Not now (the collector is at its memory bound, or over a rate): held, and
                // sent again after the delay.
                if self.nodes[n].held.contains_key(&a.batch_id) {
                    self.totals.retried += 1;
                    let at = Instant::now() + Duration::from_millis(u64::from(a.retry_after_ms));
                    self.nodes[n].retry.push((at, a.batch_id));
                    if self.totals.retried == 1 {
                        tracing::warn!(target: "commscope_simulate", "{}: batch refused for now: {}; it is sent again in {} ms", self.names[n], a.error, a.retry_after_ms);
                    }
                }
            }
            Link::Ack(n, a, _) => {
                if let Some((_, size)) = self.nodes[n].held.remove(&a.batch_id) {
                    self.held_bytes -= size;
                }
                if a.error.is_empty() {
                    self.totals.acked += 1;
                } else {
                    self.totals.refused += 1;
                    if self.totals.refused <= 5 {
                        tracing::warn!(target: "commscope_simulate", "{}: batch refused: {}", self.names[n], a.error);
                    }
                }
            }
            Link::Disconnected(n, why) => {
                let node = &mut self.nodes[n];
                node.closing = false;
                if node.tx.take().is_some() {
                    self.disconnects += 1;
                    if self.disconnects <= LOGGED_DISCONNECTS {
                        tracing::warn!(target: "commscope_simulate", "{}: {why}; reconnecting, its unacknowledged batches to be sent again", self.names[n]);
                    }
                }
                node.why = Some(why);
            }
        }
    }
}

/// How long the streams closed at the end may take to end.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Every simulated node's stream.
pub struct Links {
    state: Arc<Mutex<State>>,
    stop: watch::Sender<bool>,
}

impl Links {
    /// Opens a stream for each node in `names` to `url`; rates the collector sends go to
    /// `rates`.
    pub fn start(
        url: &str,
        token: Option<commscope_wire::auth::Token>,
        tls: &commscope_wire::tls::TlsFiles,
        names: Vec<String>,
        rates: mpsc::UnboundedSender<RatesMsg>,
    ) -> Links {
        let (stop, stop_rx) = watch::channel(false);
        let (ev_tx, mut ev_rx) = mpsc::channel::<Link>(1 << 16);
        for (n, name) in names.iter().enumerate() {
            let target = uplink::Target {
                replica: n,
                url: url.to_owned(),
                node: name.clone(),
                token: token.clone(),
                tls: tls.clone(),
                // Its own summary says what happened: 512 nodes' failures would drown it.
                log_failures: false,
            };
            tokio::spawn(uplink::run(target, ev_tx.clone(), stop_rx.clone()));
        }
        let state = Arc::new(Mutex::new(State {
            nodes: names.iter().map(|_| Node::default()).collect(),
            names,
            held_bytes: 0,
            totals: Totals::default(),
            disconnects: 0,
            closing: false,
        }));
        let st = state.clone();
        tokio::spawn(async move {
            while let Some(l) = ev_rx.recv().await {
                lock(&st).on_link(l, &rates);
            }
        });
        Links { state, stop }
    }

    /// Waits until every node's stream is open; fails after `timeout` with why one is not, and
    /// at once when the collector refuses the credentials.
    pub async fn wait_connected(&self, timeout: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            {
                let s = lock(&self.state);
                if let Some(why) = s.nodes.iter().find_map(|n| {
                    n.why
                        .as_deref()
                        .filter(|w| w.starts_with(uplink::AUTH_REFUSED))
                }) {
                    bail!("{why}");
                }
                let down = s.nodes.iter().position(|n| n.tx.is_none());
                let Some(i) = down else { return Ok(()) };
                if t.elapsed() >= timeout {
                    let why = s.nodes[i].why.as_deref().unwrap_or("no answer");
                    bail!("{} after {} s: {why}", s.names[i], timeout.as_secs());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether node `n`'s collector takes its processes' records in one message.
    pub fn node_records(&self, n: usize) -> bool {
        lock(&self.state).nodes[n].node_records
    }

    /// A record batch of node `n` (one process's or several): held until acknowledged, sent
    /// now if its stream takes it.
    pub fn send_batch(&self, n: usize, req: IngestRequest) {
        let size = req.payload.as_ref().map_or(0, |p| p.record_bytes()) + 256;
        let mut s = lock(&self.state);
        s.totals.batches += 1;
        s.held_bytes += size;
        s.nodes[n].held.insert(req.batch_id, (req, size));
        while s.held_bytes > HELD_MAX_BYTES {
            // The oldest held batch of any node goes.
            let oldest = s
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, node)| node.held.keys().next().map(|id| (*id, i)))
                .min();
            let Some((id, i)) = oldest else { break };
            if let Some((_, size)) = s.nodes[i].held.remove(&id) {
                s.held_bytes -= size;
                s.totals.dropped += 1;
            }
        }
        s.flush(n);
    }

    /// An in-flight snapshot of node `n`: sent if its stream is up, has taken every record
    /// batch made before it (a snapshot never overtakes the records it follows, as an agent's
    /// never does), and takes it now.
    pub fn send_snapshot(&self, n: usize, req: IngestRequest) {
        let mut s = lock(&self.state);
        let node = &s.nodes[n];
        let caught_up = node.held.range(node.sent_now + 1..).next().is_none();
        let sent = caught_up && node.tx.as_ref().is_some_and(|tx| tx.try_send(req).is_ok());
        if sent {
            s.totals.sent += 1;
        }
    }

    /// Bytes of record batches not yet acknowledged.
    pub fn held_bytes(&self) -> usize {
        lock(&self.state).held_bytes
    }

    /// Record batches not yet acknowledged.
    pub fn held(&self) -> usize {
        lock(&self.state).nodes.iter().map(|n| n.held.len()).sum()
    }

    /// Sends what every node holds beyond what its stream took (a stream that was full).
    pub fn flush(&self) {
        let mut s = lock(&self.state);
        for n in 0..s.nodes.len() {
            s.flush(n);
        }
    }

    /// Waits until every record batch is acknowledged — through collector restarts, giving up
    /// only once `stall` passes without an acknowledgement; then closes the streams as an agent
    /// that leaves would, each ending its requests and waiting (2 s at most) for the collector
    /// to end its answers: a stream cut off instead reads as an error there. Returns the totals
    /// (`unacked`: batches never acknowledged).
    pub async fn finish(self, stall: Duration) -> Totals {
        let mut last = (Instant::now(), 0u64);
        loop {
            let (done, answered) = {
                let s = lock(&self.state);
                (
                    s.nodes.iter().all(|n| n.held.is_empty()),
                    s.totals.acked + s.totals.refused,
                )
            };
            if answered != last.1 {
                last = (Instant::now(), answered);
            }
            if done || last.0.elapsed() >= stall {
                break;
            }
            self.flush();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        {
            let mut s = lock(&self.state);
            s.closing = true;
            for node in &mut s.nodes {
                node.closing = node.tx.take().is_some();
            }
        }
        let t = Instant::now();
        while t.elapsed() < CLOSE_WAIT && lock(&self.state).nodes.iter().any(|n| n.closing) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.stop.send(true);
        let s = lock(&self.state);
        let mut totals = s.totals;
        totals.unacked = s.nodes.iter().map(|n| n.held.len() as u64).sum();
        totals
    }
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}
