//! `commscope agent`: the node daemon.
//!
//! - Accepts shim registrations on its Unix socket (checked by [`crate::registration`]) and maps
//!   each process's region.
//! - The pump drains every ring from the agent cursor, ships record batches to the collector
//!   over one gRPC stream, and moves the cursor only once the collector has acknowledged them
//!   as durable — or once they are synced in the spool while the collector is unreachable.
//! - Sends in-flight snapshots, notices process exits (pidfd) and their status (process-events
//!   connector), and appends an `OBSERVED` exit record after a process's last records.
//! - Serves `/metrics` and `/healthz` on `--http`.
//!
//! Without a collector (`--trace-dir` only) the agent runs a collector inside itself that
//! writes the job traces under that directory, so the two modes share one path.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use commscope_wire::grpc::ingest_request::Payload;
use commscope_wire::grpc::{
    InFlightEntry, InFlightSnapshot, IngestAck, IngestRequest, ProcessId, RecordBatch, SampleRate,
};
use commscope_wire::op::Op;
use commscope_wire::record::{RECORD_SIZE, Record};
use commscope_wire::sampling::{Rates, Sampler};
use commscope_wire::shm::{Consumer, Counter, InFlight};
use tokio::sync::{mpsc, watch};

use crate::clock::ClockEstimate;
use crate::exits::{Ending, ExitWatcher};
use crate::registration::{self, Registered};
use crate::spool::Spool;

/// How long an ended process's exit status may take to come from the kernel's connector after
/// its pidfd said it ended (the connector's thread can be kept off a loaded node's CPUs for a
/// while; the status was missed once, under a full test suite on two cores, at 200 ms).
const EXIT_EVENT_WAIT: Duration = Duration::from_secs(1);

/// Agent settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The registration socket.
    pub socket: PathBuf,
    /// The collectors' gRPC addresses (`http://host:port`): one, or the replicas a job is
    /// routed over by rendezvous hashing of its id ([`commscope_wire::route`]). Required to
    /// start. (The CLI's local mode, `--trace-dir` without a collector, starts one in the same
    /// process first.)
    pub collectors: Vec<String>,
    /// This node's name.
    pub node: String,
    /// `/metrics` address (None: not served).
    pub http: Option<SocketAddr>,
    /// [`Running::stop`] waits this long for its tasks (the collector link among them).
    pub shutdown_timeout: Duration,
    /// The spool directory and its bound.
    pub spool_dir: PathBuf,
    pub spool_max_bytes: u64,
    /// Records per batch at most.
    pub batch_records: usize,
    /// How often rings are drained.
    pub poll: Duration,
    /// How often in-flight tables are looked at.
    pub snapshot_every: Duration,
    /// Unreachable collector: after this long, batches go to the spool.
    pub spool_after: Duration,
    /// Batches sent and not yet acknowledged, at most.
    pub max_unacked: usize,
    /// Take a hang culprit's stacks (gdb, py-spy) when the collector asks.
    pub stacks: bool,
    /// Where NIC counters are read ([`crate::nic`]: `/sys`; None: not read), and how often.
    pub sysfs: Option<PathBuf>,
    pub nic_every: Duration,
    /// The transport view's eBPF probes ([`crate::transport`]); None: off (`--no-ebpf`).
    pub ebpf: Option<crate::transport::Options>,
    /// Where processes' `cgroup` and `environ` files are read for their attribution.
    pub proc_root: PathBuf,
    /// The node's pod list ([`crate::attribution`]); None: pods are not named.
    pub pods: Option<crate::attribution::PodSource>,
    /// The token the collector requires (`--auth-token-file`).
    pub auth_token: Option<commscope_wire::auth::Token>,
    /// TLS to the collector (an `https://` URL): the CA that signed its certificate, and this
    /// agent's certificate and key for mutual TLS.
    pub tls: commscope_wire::tls::TlsFiles,
}

impl Config {
    /// Defaults for a node.
    pub fn new(node: impl Into<String>) -> Config {
        Config {
            socket: PathBuf::from(commscope_wire::registration::DEFAULT_SOCKET),
            collectors: Vec::new(),
            node: node.into(),
            http: None,
            shutdown_timeout: Duration::from_secs(10),
            spool_dir: PathBuf::from("/var/lib/commscope/spool"),
            spool_max_bytes: 1 << 30,
            batch_records: 4096,
            poll: Duration::from_millis(20),
            snapshot_every: Duration::from_millis(250),
            spool_after: Duration::from_secs(2),
            max_unacked: 64,
            stacks: true,
            sysfs: Some(PathBuf::from("/sys")),
            // PMA counters cost a management datagram per read: no faster than every few
            // seconds.
            nic_every: Duration::from_secs(5),
            ebpf: Some(crate::transport::Options::default()),
            proc_root: PathBuf::from("/proc"),
            pods: None,
            auth_token: None,
            tls: Default::default(),
        }
    }
}

/// Counters the agent exports.
#[derive(Debug, Default)]
pub struct Stats {
    pub records_read: AtomicU64,
    /// Calls consistent sampling left out (each counted in a `skip` record).
    pub calls_sampled_out: AtomicU64,
    pub records_acked: AtomicU64,
    pub records_spooled: AtomicU64,
    pub records_refused: AtomicU64,
    pub batches_sent: AtomicU64,
    pub batches_resent: AtomicU64,
    pub registrations: AtomicU64,
    pub registrations_refused: AtomicU64,
    pub exits: AtomicU64,
    pub spool_errors: AtomicU64,
    pub connected: AtomicBool,
    pub connects: AtomicU64,
    /// Snapshot of per-process views for `/metrics`.
    pub processes: Mutex<Vec<ProcessView>>,
    pub spool_bytes: AtomicU64,
    pub spool_batches: AtomicU64,
    pub unacked: AtomicU64,
    pub clock: Mutex<Option<(i64, u64)>>,
    /// Drop counters of processes that are gone (so totals never go backwards).
    pub gone_drops: Mutex<[u64; 4]>,
    /// NIC counters since the agent started.
    pub nic: Mutex<crate::nic::Totals>,
    /// What the eBPF probes see, and how they stand.
    pub transport: Arc<crate::transport::Shared>,
}

/// What `/metrics` shows per traced process.
#[derive(Clone, Debug)]
pub struct ProcessView {
    pub job: String,
    pub rank: i32,
    pub pid: u32,
    pub fill: f64,
    pub in_flight: usize,
    /// ring_full, in_flight_table, other (requests, p2p, comms, internal), overrun.
    pub drops: [u64; 4],
}

/// A running agent.
#[derive(Debug)]
pub struct Running {
    pub stats: Arc<Stats>,
    pub http: Option<SocketAddr>,
    pub socket: PathBuf,
    shutdown_timeout: Duration,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops: drains what it can for a moment, then returns (the socket file is removed).
    /// Tasks still running after the shutdown timeout (a collector link stuck on a dead path)
    /// are cut: what was not acknowledged stays in the rings and the spool.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        let mut cut = 0;
        for mut t in self.tasks {
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                t.abort();
                cut += 1;
            }
        }
        if cut > 0 {
            tracing::warn!(
                "shutdown: {cut} task(s) still running after {:.0?}; cut them (what was not acknowledged stays in the rings and the spool)",
                self.shutdown_timeout
            );
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Starts the agent; returns once the socket is listening.
pub async fn start(cfg: Config) -> Result<Running> {
    if cfg.collectors.is_empty() {
        anyhow::bail!("the agent needs a collector (--collector URL)");
    }
    if let Some(dir) = cfg.socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if cfg.socket.exists() {
        // A stale socket of an agent that died (a live one would answer).
        if std::os::unix::net::UnixStream::connect(&cfg.socket).is_ok() {
            anyhow::bail!(
                "another agent is listening on {}; stop it first or use --socket",
                cfg.socket.display()
            );
        }
        let _ = std::fs::remove_file(&cfg.socket);
    }
    let listener = tokio::net::UnixListener::bind(&cfg.socket)
        .with_context(|| format!("cannot listen on {}", cfg.socket.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&cfg.socket, std::fs::Permissions::from_mode(0o666));
    }
    let (spool, warnings) = Spool::open(&cfg.spool_dir, cfg.spool_max_bytes)
        .with_context(|| format!("cannot open the spool {}", cfg.spool_dir.display()))?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    if !spool.is_empty() {
        tracing::info!(
            "{} spooled batches ({} bytes) from an earlier run will be sent",
            spool.len(),
            spool.bytes()
        );
    }
    let (exits, warn) = ExitWatcher::start();
    if let Some(w) = warn {
        tracing::warn!("{w}");
    }
    let stats = Arc::new(Stats::default());
    let (stop, stop_rx) = watch::channel(false);
    let (ev_tx, ev_rx) = mpsc::channel::<Event>(1024);
    let mut tasks = Vec::new();

    // Registrations.
    {
        let ev = ev_tx.clone();
        let mut stop_rx = stop_rx.clone();
        let stats = stats.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    c = listener.accept() => c,
                    _ = stopped(&mut stop_rx) => break,
                };
                let Ok((stream, _)) = conn else { continue };
                let ev = ev.clone();
                let stats = stats.clone();
                tokio::task::spawn_blocking(move || {
                    let std_stream = match stream.into_std() {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                    let _ = std_stream.set_nonblocking(false);
                    match registration::handle(std_stream) {
                        Ok(r) => {
                            stats.registrations.fetch_add(1, Ordering::Relaxed);
                            let _ = ev.blocking_send(Event::Registered(Box::new(r)));
                        }
                        Err(e) => {
                            stats.registrations_refused.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!("refused a registration: {e}");
                        }
                    }
                });
            }
        }));
    }

    // NIC counters; what says a link is failing becomes link events of every job on the node.
    if let Some(root) = cfg.sysfs.clone() {
        let stats = stats.clone();
        let mut stop_rx = stop_rx.clone();
        let every = cfg.nic_every;
        let ev = ev_tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped(&mut stop_rx) => break,
                }
                let root = root.clone();
                let Ok(read) = tokio::task::spawn_blocking(move || crate::nic::read(&root)).await
                else {
                    continue;
                };
                let changes = stats
                    .nic
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .update(&read);
                if !changes.is_empty() {
                    let events = crate::nic::link_events(&changes, now_mono());
                    let n = events.len() as u64;
                    if ev.try_send(Event::NodeLinkEvents(events)).is_err() {
                        stats
                            .transport
                            .records_dropped
                            .fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
        }));
    }

    // The transport view (eBPF). Flows are attributed to this node's traced processes.
    if let Some(mut opts) = cfg.ebpf.clone() {
        if let Some(root) = &cfg.sysfs {
            opts.sysfs = root.clone();
        }
        let shared = stats.transport.clone();
        let owners = {
            let stats = stats.clone();
            move || {
                stats
                    .processes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|p| crate::transport::Owner {
                        pid: p.pid,
                        job: p.job.clone(),
                        rank: p.rank,
                    })
                    .collect::<Vec<_>>()
            }
        };
        // Flow records join the queue through the pump; a full channel loses them (counted),
        // never blocks the probes' task.
        let sink = {
            let ev = ev_tx.clone();
            let shared = shared.clone();
            move |job: String, records: Vec<Record>| {
                let n = records.len() as u64;
                if ev.try_send(Event::Transport(job, records)).is_err() {
                    shared.records_dropped.fetch_add(n, Ordering::Relaxed);
                }
            }
        };
        // Processes recorded without the preload join the pump like registered ones.
        let adopt = {
            let ev = ev_tx.clone();
            let stats = stats.clone();
            move |r: crate::registration::Registered| {
                stats.registrations.fetch_add(1, Ordering::Relaxed);
                if ev.try_send(Event::Registered(Box::new(r))).is_err() {
                    tracing::warn!(
                        "a process recorded from uprobes was lost: the agent's queue is full"
                    );
                }
            }
        };
        tasks.push(tokio::spawn(crate::transport::run(
            opts,
            shared,
            crate::transport::Outputs {
                owners,
                sink,
                adopt,
                node: cfg.node.clone(),
                socket: cfg.socket.clone(),
            },
            stop_rx.clone(),
        )));
    }

    // The collector links: one per replica.
    for (replica, url) in cfg.collectors.iter().enumerate() {
        let target = crate::uplink::Target {
            replica,
            url: url.clone(),
            node: cfg.node.clone(),
            token: cfg.auth_token.clone(),
            tls: cfg.tls.clone(),
            log_failures: true,
        };
        tasks.push(tokio::spawn(crate::uplink::run(
            target,
            ev_tx.clone(),
            stop_rx.clone(),
        )));
    }

    // `/metrics`.
    let mut http = None;
    if let Some(addr) = cfg.http {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for HTTP on {addr}"))?;
        http = Some(l.local_addr()?);
        let registry = crate::metrics::registry(stats.clone(), cfg.node.clone())?;
        let app = crate::metrics::router(registry);
        let mut stop_rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let _ = axum::serve(l, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped(&mut stop_rx).await;
                })
                .await;
        }));
    }

    // The pump.
    let pump = Pump {
        cfg: cfg.clone(),
        sources: BTreeMap::new(),
        next_source: 1,
        queue: VecDeque::new(),
        pending: BTreeMap::new(),
        next_batch: 1,
        next_order: 1,
        links: cfg
            .collectors
            .iter()
            .map(|url| Link {
                url: url.clone(),
                tx: None,
                disconnected_since: Some(Instant::now()),
                clock: ClockEstimate::default(),
                hello_sent_ns: None,
                unacked: 0,
            })
            .collect(),
        routes: HashMap::new(),
        spool_routes: HashMap::new(),
        spool,
        spool_loaded: Vec::new(),
        copies: HashMap::new(),
        spool_blocked_until: None,
        stats: stats.clone(),
        exits,
        events: ev_tx.clone(),
        rates: HashMap::new(),
        transport: HashMap::new(),
        pods: Arc::new(tokio::sync::Mutex::new(crate::attribution::Pods::new(
            cfg.pods.clone(),
        ))),
    };
    tasks.push(tokio::spawn(pump.run(ev_rx, stop_rx)));
    tracing::info!(
        "node {}: registrations on {}, records to {}, metrics on {}",
        cfg.node,
        cfg.socket.display(),
        cfg.collectors.join(","),
        http.map_or_else(|| "-".to_owned(), |a| a.to_string()),
    );
    Ok(Running {
        stats,
        http,
        socket: cfg.socket.clone(),
        shutdown_timeout: cfg.shutdown_timeout,
        stop,
        tasks,
    })
}

enum Event {
    Registered(Box<Registered>),
    /// Replica `.0`'s stream opened (its hello sent at `.2`), closed, or answered.
    Connected(usize, mpsc::Sender<IngestRequest>, u64),
    Ack(usize, IngestAck, u64),
    Disconnected(usize, String),
    /// A registered process ended (and how, when the kernel said).
    /// A process ended: its source, how, and when it was seen (realtime, monotonic ns).
    Exited(u64, Option<Ending>, (u64, u64)),
    /// The transport view's records (`flow`, `link_event`) of one job for an interval.
    Transport(String, Vec<Record>),
    /// Link events of the whole node (NIC counters, ports): every job on it gets them.
    NodeLinkEvents(Vec<commscope_wire::record::LinkEvent>),
    /// A registered process's pod and job ([`crate::attribution`]).
    Attributed(u64, commscope_wire::grpc::Attribution),
}

impl From<crate::uplink::Link> for Event {
    fn from(l: crate::uplink::Link) -> Event {
        use crate::uplink::Link;
        match l {
            Link::Connected(r, tx, hello) => Event::Connected(r, tx, hello),
            Link::Ack(r, a, t) => Event::Ack(r, a, t),
            Link::Disconnected(r, why) => Event::Disconnected(r, why),
        }
    }
}

/// Resolves once a stop is requested (the watch guard is never held across an await).
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await.map(|_| ());
}

pub(crate) fn stop_requested(rx: &watch::Receiver<bool>) -> bool {
    *rx.borrow()
}

/// Host wall clock (ns since the epoch).
pub fn now_real() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Host CLOCK_MONOTONIC (ns).
pub(crate) fn now_mono() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct Source {
    reg: Registered,
    process: ProcessId,
    /// Next ring position to read.
    read_pos: u64,
    /// Batches read from the ring and not yet done, in ring order: (end position, done).
    batches: VecDeque<(u64, bool)>,
    exited: Option<Instant>,
    /// When the exit was seen (realtime, monotonic ns): the exit record's time.
    exited_at: (u64, u64),
    /// How it ended (when the kernel said).
    ending: Option<Ending>,
    /// The agent's exit batch was acknowledged or spooled.
    exit_done: bool,
    /// The exit record was queued.
    exit_queued: bool,
    /// The exit was logged (an exit batch taken back and queued again is not logged twice).
    exit_logged: bool,
    last_snapshot: Option<(Vec<InFlight>, Instant)>,
    /// Consistent sampling of this process's calls.
    sampler: Sampler,
}

enum Origin {
    Ring {
        source: u64,
        end_pos: u64,
    },
    /// The agent's final heartbeat and exit record of a process.
    Exit {
        source: u64,
    },
    /// The agent's own records (the transport view's flows), under its per-job identity.
    Transport,
    Spool(u64),
}

struct Outgoing {
    /// Creation order: batches are sent, resent and spooled in this order.
    order: u64,
    batch: RecordBatch,
    origin: Origin,
    records: u64,
    not_before: Option<Instant>,
}

/// The stream to one collector replica.
struct Link {
    url: String,
    tx: Option<mpsc::Sender<IngestRequest>>,
    disconnected_since: Option<Instant>,
    /// This agent's clock against that collector's.
    clock: ClockEstimate,
    /// When the current stream's hello left (realtime ns), until its acknowledgement came.
    hello_sent_ns: Option<u64>,
    /// Batches sent to it and not yet answered.
    unacked: usize,
}

struct Pump {
    cfg: Config,
    sources: BTreeMap<u64, Source>,
    next_source: u64,
    /// Batches waiting to be sent, in order.
    queue: VecDeque<Outgoing>,
    /// Sent and not yet acknowledged, by batch id (with the send time and the replica).
    pending: BTreeMap<u64, (Outgoing, u64, usize)>,
    next_batch: u64,
    next_order: u64,
    /// One per collector replica.
    links: Vec<Link>,
    /// Per job: its replica (rendezvous hashing, cached).
    routes: HashMap<String, usize>,
    /// Per spooled batch read before: its replica (so that batches of a replica that is away
    /// are not read again and again).
    spool_routes: HashMap<u64, usize>,
    spool: Spool,
    /// Spool entries already loaded into the queue (or held: copies, below).
    spool_loaded: Vec<u64>,
    /// Batches of processes that ended, copied into the spool while they are still on their
    /// way (by creation order: the copy's spool entry). An ended process's ring goes with the
    /// last mapping of it, this agent's: should the agent die before the collector has
    /// acknowledged them, the next agent sends the copies. A copy is removed once its batch is
    /// acknowledged.
    copies: HashMap<u64, u64>,
    /// After a spool failure, reading rings pauses until then.
    spool_blocked_until: Option<Instant>,
    stats: Arc<Stats>,
    exits: ExitWatcher,
    events: mpsc::Sender<Event>,
    /// Consistent sampling: the collector's rates, per job.
    rates: HashMap<String, Rates>,
    /// Per job: the identity the agent writes its transport records under, and its next
    /// `rec_seq`.
    transport: HashMap<String, (ProcessId, u64)>,
    /// The node's pods, for attribution.
    pods: Arc<tokio::sync::Mutex<crate::attribution::Pods>>,
}

impl Pump {
    async fn run(mut self, mut ev: mpsc::Receiver<Event>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.cfg.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_snap = Instant::now();
        loop {
            tokio::select! {
                e = ev.recv() => match e {
                    Some(e) => self.event(e).await,
                    None => break,
                },
                _ = tick.tick() => {
                    self.drain_rings();
                    if last_snap.elapsed() >= self.cfg.snapshot_every {
                        last_snap = Instant::now();
                        self.snapshots();
                    }
                    self.flush();
                    self.publish();
                }
                _ = stopped(&mut stop) => break,
            }
        }
        // Leaving: whatever is not acknowledged stays in the rings (cursor not moved) or the
        // spool, for the next agent.
        for l in &mut self.links {
            l.tx = None;
        }
        self.spool_everything();
    }

    /// Leaving: what was read and not acknowledged goes to the spool, in order, for the next
    /// agent — the rings of processes that ended leave with this one. (Rings of live processes
    /// are read again from their cursors; the collector drops what arrives twice.)
    fn spool_everything(&mut self) {
        self.drain_rings();
        let mut all: Vec<Outgoing> = std::mem::take(&mut self.pending)
            .into_values()
            .map(|(o, _, _)| o)
            .collect();
        all.extend(self.queue.drain(..));
        all.sort_by_key(|o| o.order);
        // Loaded from the spool, or copied there when their process ended: already there.
        let (there, all): (Vec<Outgoing>, Vec<Outgoing>) = all.into_iter().partition(|o| {
            matches!(o.origin, Origin::Spool(_)) || self.copies.contains_key(&o.order)
        });
        let mut written = 0;
        for out in all {
            if !self.spool_one(out) {
                break;
            }
            written += 1;
        }
        let kept = there.len() + written;
        if kept > 0 {
            tracing::info!(
                "stopping: {kept} unacknowledged batches kept in the spool for the next agent ({written} written now, the rest there already)"
            );
        }
    }

    async fn event(&mut self, e: Event) {
        match e {
            Event::Registered(r) => self.register(*r),
            Event::Connected(r, tx, hello_ns) => {
                let l = &mut self.links[r];
                l.hello_sent_ns = Some(hello_ns);
                if let Some(since) = l.disconnected_since.take() {
                    tracing::info!(
                        "connected to the collector {} (after {:.1} s without)",
                        l.url,
                        since.elapsed().as_secs_f64()
                    );
                }
                l.tx = Some(tx);
                l.unacked = 0;
                self.stats.connects.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .connected
                    .store(self.links.iter().all(|l| l.tx.is_some()), Ordering::Relaxed);
                self.flush();
            }
            Event::Disconnected(r, why) => {
                let l = &mut self.links[r];
                if l.tx.take().is_some() || l.disconnected_since.is_none() {
                    tracing::warn!("{why}; retrying");
                }
                l.unacked = 0;
                l.disconnected_since.get_or_insert_with(Instant::now);
                self.stats.connected.store(false, Ordering::Relaxed);
                // Everything unacknowledged by it goes back into the queue, in order.
                let ids: Vec<u64> = self
                    .pending
                    .iter()
                    .filter(|(_, (_, _, pr))| *pr == r)
                    .map(|(id, _)| *id)
                    .collect();
                for id in ids {
                    if let Some((o, _, _)) = self.pending.remove(&id) {
                        self.requeue(o);
                    }
                }
            }
            Event::Ack(r, ack, t4) => self.ack(r, ack, t4),
            Event::Exited(id, ending, seen) => {
                if let Some(s) = self.sources.get_mut(&id) {
                    self.stats.exits.fetch_add(1, Ordering::Relaxed);
                    s.exited = Some(Instant::now());
                    s.exited_at = seen;
                    s.ending = ending;
                }
                // The exit batch follows once the ring is read to its end.
                self.drain_rings();
                self.flush();
            }
            Event::Transport(job, records) => self.queue_transport(job, records),
            Event::Attributed(id, a) => self.attributed(id, a),
            Event::NodeLinkEvents(events) => {
                let jobs: std::collections::BTreeSet<String> = self
                    .sources
                    .values()
                    .map(|s| s.process.job.clone())
                    .collect();
                for job in jobs {
                    let records = events.iter().map(|e| Record::LinkEvent(*e)).collect();
                    self.queue_transport(job, records);
                }
            }
        }
    }

    /// Queues the transport view's records of `job` under the agent's identity for that job:
    /// this node, the agent's pid and start time, rank [`TRANSPORT_RANK`].
    fn queue_transport(&mut self, job: String, mut flows: Vec<Record>) {
        if flows.is_empty() {
            return;
        }
        let Some(template) = self
            .sources
            .values()
            .find(|s| s.process.job == job)
            .map(|s| s.process.clone())
        else {
            return;
        };
        let (id, next) = self.transport.entry(job.clone()).or_insert_with(|| {
            (
                ProcessId {
                    job,
                    node: self.cfg.node.clone(),
                    pid: std::process::id(),
                    start_time: commscope_wire::registration::process_start_time(),
                    rank: commscope_wire::record::TRANSPORT_RANK,
                    world_size: template.world_size,
                    flavour: template.flavour.clone(),
                    mono_anchor_ns: now_mono(),
                    real_anchor_ns: now_real(),
                    library: String::new(),
                    attribution: None,
                },
                1,
            )
        });
        let first = *next;
        let mut records = Vec::with_capacity(flows.len() * RECORD_SIZE);
        for f in &mut flows {
            f.set_rec_seq(*next);
            *next += 1;
            records.extend_from_slice(&f.encode());
        }
        let process = id.clone();
        self.next_order += 1;
        self.queue.push_back(Outgoing {
            order: self.next_order,
            batch: RecordBatch {
                process: Some(process),
                first_rec_seq: first,
                record_size: RECORD_SIZE as u32,
                records,
                clock_offset_ns: None,
                clock_error_ns: 0,
                dropped_overrun: 0,
            },
            origin: Origin::Transport,
            records: flows.len() as u64,
            not_before: None,
        });
        self.flush();
    }

    fn register(&mut self, r: Registered) {
        let req = &r.request;
        let shm = r.region.shm();
        // The same process registering again (its link restarted): replace the old view.
        let old: Vec<u64> = self
            .sources
            .iter()
            .filter(|(_, s)| s.process.pid == req.pid && s.process.start_time == req.start_time)
            .map(|(k, _)| *k)
            .collect();
        for k in old {
            self.sources.remove(&k);
            self.queue
                .retain(|o| !matches!(o.origin, Origin::Ring { source, .. } if source == k));
        }
        // The process's clocks are this host's: one simultaneous reading relates them.
        let (mono, real) = (now_mono(), now_real());
        let process = ProcessId {
            job: req.job.clone(),
            // The agent's node name wins: in a container the shim sees the pod's host name.
            node: self.cfg.node.clone(),
            pid: req.pid,
            start_time: req.start_time,
            rank: req.rank,
            world_size: req.world_size,
            flavour: req.flavour.clone(),
            mono_anchor_ns: mono,
            real_anchor_ns: real,
            library: String::new(),
            attribution: None,
        };
        let read_pos = shm.cursor(Consumer::Agent);
        let id = self.next_source;
        self.next_source += 1;
        self.exits.watch(req.pid);
        match crate::exits::pidfd(req.pid) {
            Ok(fd) => {
                // The exit is awaited on the runtime; the task owns the fd.
                let ev = self.events.clone();
                // The exit status is awaited here, not in the pump, which goes on draining.
                let exits = self.exits.clone();
                let pid = req.pid;
                tokio::spawn(async move {
                    // SAFETY: `fd` is an open pidfd, owned by the AsyncFd for its whole life.
                    let registered = unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(
                            fd,
                            tokio::io::Interest::READABLE,
                        )
                    };
                    if let Ok(afd) = registered {
                        let _ = afd.readable().await;
                    }
                    let mut seen = (now_real(), now_mono());
                    let ending = exits.ending(pid, EXIT_EVENT_WAIT).await;
                    // The kernel's time of the exit, when the connector gave it: exact, where
                    // the pidfd's readiness comes whenever this task runs. Which rank of a job
                    // ended first can be milliseconds (a launcher's teardown).
                    if let Some((_, at)) = ending
                        && at > 0
                        && at <= seen.1
                    {
                        seen = (seen.0 - (seen.1 - at), at);
                    }
                    let ending = ending.map(|e| e.0);
                    let _ = ev.send(Event::Exited(id, ending, seen)).await;
                });
            }
            // Gone already (a process the agent records itself may be registered after its
            // last call): it ended when it was seen, status unknown.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                let ev = self.events.clone();
                let exits = self.exits.clone();
                let pid = req.pid;
                let seen = (now_real(), now_mono());
                tokio::spawn(async move {
                    // The kernel's report of its exit, if the connector saw it.
                    let ending = exits.ending(pid, Duration::ZERO).await.map(|e| e.0);
                    let _ = ev.send(Event::Exited(id, ending, seen)).await;
                });
            }
            Err(e) => tracing::warn!("cannot watch pid {} for its exit: {e}", req.pid),
        }
        let pid = req.pid;
        tracing::info!(
            "registered rank {} of job {} (pid {}, {} ranks, {}), reading from record {}",
            req.rank,
            req.job,
            req.pid,
            req.world_size,
            req.flavour,
            read_pos
        );
        self.sources.insert(
            id,
            Source {
                reg: r,
                process,
                read_pos,
                batches: VecDeque::new(),
                exited: None,
                exited_at: (0, 0),
                ending: None,
                exit_done: false,
                exit_queued: false,
                exit_logged: false,
                sampler: Sampler::default(),
                last_snapshot: None,
            },
        );
        // Its pod and job: read off the pump (the pod list is a network call).
        let (ev, pods, root) = (
            self.events.clone(),
            self.pods.clone(),
            self.cfg.proc_root.clone(),
        );
        tokio::spawn(async move {
            let a = crate::attribution::attribute(&root, pid, &pods).await;
            if a != commscope_wire::grpc::Attribution::default() {
                let _ = ev.send(Event::Attributed(id, a)).await;
            }
        });
    }

    /// A process's attribution arrived: its batches from now on carry it (the transport
    /// records of its job too, when it is the first of the job to have one).
    fn attributed(&mut self, id: u64, a: commscope_wire::grpc::Attribution) {
        let Some(s) = self.sources.get_mut(&id) else {
            return;
        };
        if !a.pod.is_empty() {
            tracing::info!(
                "rank {} of job {} (pid {}) runs in pod {}/{} (container {}, {})",
                s.process.rank,
                s.process.job,
                s.process.pid,
                a.namespace,
                a.pod,
                if a.container.is_empty() {
                    "?"
                } else {
                    &a.container
                },
                a.owner
            );
        }
        if let Some((t, _)) = self.transport.get_mut(&s.process.job)
            && t.attribution.is_none()
        {
            t.attribution = Some(commscope_wire::grpc::Attribution {
                pod: String::new(),
                container: String::new(),
                ..a.clone()
            });
        }
        s.process.attribution = Some(a);
    }

    /// Whether batches for replica `r` should go to the spool instead of the collector now.
    fn spooling(&self, r: usize) -> bool {
        let l = &self.links[r];
        l.tx.is_none()
            && l.disconnected_since
                .is_some_and(|t| t.elapsed() >= self.cfg.spool_after)
    }

    /// The replica that owns `job`.
    fn replica(&mut self, job: &str) -> usize {
        if self.links.len() <= 1 {
            return 0;
        }
        if let Some(r) = self.routes.get(job) {
            return *r;
        }
        if self.routes.len() > 100_000 {
            self.routes.clear();
        }
        let urls: Vec<&str> = self.links.iter().map(|l| l.url.as_str()).collect();
        let r = commscope_wire::route::replica_of(job, &urls).unwrap_or(0);
        self.routes.insert(job.to_owned(), r);
        r
    }

    /// The replica the batch at `i` in the queue goes to.
    fn replica_of_queued(&mut self, i: usize) -> usize {
        if self.links.len() <= 1 {
            return 0;
        }
        let job = self.queue[i]
            .batch
            .process
            .as_ref()
            .map_or_else(String::new, |p| p.job.clone());
        self.replica(&job)
    }

    /// The replica a batch goes to.
    fn replica_of(&mut self, b: &RecordBatch) -> usize {
        let job = b.process.as_ref().map_or("", |p| p.job.as_str());
        self.replica(job)
    }

    fn backlog(&self) -> usize {
        self.queue.len() + self.pending.len()
    }

    /// Reads new records from every ring into batches.
    fn drain_rings(&mut self) {
        if self.spool_blocked_until.is_some_and(|t| Instant::now() < t) {
            return;
        }
        self.spool_blocked_until = None;
        let limit = self.cfg.max_unacked * 4;
        let ids: Vec<u64> = self.sources.keys().copied().collect();
        for id in ids {
            // Straight to the spool while the job's replica has been away too long.
            let (spooling, ended) = match self.sources.get(&id) {
                Some(s) => {
                    let job = s.process.job.clone();
                    let ended = s.exited.is_some();
                    let r = self.replica(&job);
                    (self.spooling(r), ended)
                }
                None => continue,
            };
            loop {
                // A process that ended is read to its end whatever the backlog: its ring lasts
                // only as long as this agent (its batches are then copied to the spool).
                if !spooling && !ended && self.backlog() >= limit {
                    break;
                }
                let Some(s) = self.sources.get_mut(&id) else {
                    break;
                };
                let shm = s.reg.region.shm();
                let mut bytes: Vec<u8> =
                    Vec::with_capacity(self.cfg.batch_records.min(1024) * RECORD_SIZE);
                let from = s.read_pos;
                let end =
                    shm.read_from(from, self.cfg.batch_records, |r| bytes.extend_from_slice(r));
                if bytes.is_empty() {
                    if end != from {
                        // Skipped overwritten records (counted by the ring): nothing to send.
                        s.read_pos = end;
                        s.batches.push_back((end, true));
                        advance(s);
                    }
                    break;
                }
                // Ring records consumed (what a rewind gives back), whatever sampling keeps.
                let n = (bytes.len() / RECORD_SIZE) as u64;
                let rates = self.rates.get(&s.process.job).filter(|r| !r.is_empty());
                // (Sampling just stopped: what it still holds goes out as its calls age.)
                if rates.is_some() || s.sampler.has_open() {
                    let none = Rates::default();
                    let mut kept = Vec::with_capacity(bytes.len());
                    let f = s.sampler.filter(rates.unwrap_or(&none), &bytes, &mut kept);
                    self.stats
                        .calls_sampled_out
                        .fetch_add(f.left_out, Ordering::Relaxed);
                    bytes = kept;
                    if bytes.is_empty() {
                        // Every record was left out (their skip goes later): nothing to send,
                        // the ring space is free.
                        self.stats.records_read.fetch_add(n, Ordering::Relaxed);
                        s.read_pos = end;
                        s.batches.push_back((end, true));
                        advance(s);
                        continue;
                    }
                }
                let Some(first) = bytes.get(..8).and_then(|b| b.try_into().ok()) else {
                    break;
                };
                let first = u64::from_le_bytes(first);
                s.read_pos = end;
                s.batches.push_back((end, false));
                let batch = RecordBatch {
                    process: Some(s.process.clone()),
                    first_rec_seq: first,
                    record_size: RECORD_SIZE as u32,
                    records: bytes,
                    clock_offset_ns: None,
                    clock_error_ns: 0,
                    dropped_overrun: shm.counter(Counter::ConsumerOverrun),
                };
                self.stats.records_read.fetch_add(n, Ordering::Relaxed);
                self.next_order += 1;
                let out = Outgoing {
                    order: self.next_order,
                    batch,
                    origin: Origin::Ring {
                        source: id,
                        end_pos: end,
                    },
                    records: n,
                    not_before: None,
                };
                if spooling {
                    if !self.spool_one(out) {
                        return;
                    }
                } else {
                    self.queue.push_back(out);
                }
                if (n as usize) < self.cfg.batch_records {
                    break;
                }
            }
        }
        // A process that ended and whose ring is read to its end gets its exit batch.
        let ready: Vec<u64> = self
            .sources
            .iter()
            .filter(|(_, s)| {
                // A slot reserved but never published (the process died inside the push) would
                // hold this back forever: after two seconds the exit goes regardless.
                // A process the agent records itself ends once its writer has written its last
                // records (events still on their way from the probes), or after two seconds.
                let writer_done = s
                    .reg
                    .writer_done
                    .as_ref()
                    .is_none_or(|d| d.load(Ordering::Acquire));
                !s.exit_queued
                    && s.exited.is_some_and(|t| {
                        (writer_done && s.read_pos >= s.reg.region.shm().head())
                            || t.elapsed() > Duration::from_secs(2)
                    })
            })
            .map(|(k, _)| *k)
            .collect();
        for id in ready {
            self.queue_exit(id);
        }
        self.secure_ended();
        // A source is done once its exit batch and every ring batch are acknowledged.
        let done: Vec<u64> = self
            .sources
            .iter()
            .filter(|(_, s)| s.exit_done && s.batches.is_empty())
            .map(|(k, _)| *k)
            .collect();
        for k in done {
            if let Some(s) = self.sources.remove(&k) {
                let d = drops_of(&s);
                let mut g = self
                    .stats
                    .gone_drops
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                for i in 0..4 {
                    g[i] += d[i];
                }
            }
        }
    }

    /// Copies into the spool the batches of processes that ended and are not acknowledged yet
    /// (see `copies`), all with one sync. Best effort: a full spool leaves them to the live path.
    fn secure_ended(&mut self) {
        let ended: std::collections::HashSet<u64> = self
            .sources
            .iter()
            .filter(|(_, s)| s.exited.is_some())
            .map(|(k, _)| *k)
            .collect();
        if ended.is_empty() {
            return;
        }
        let of_ended = |o: &Outgoing| match o.origin {
            Origin::Ring { source, .. } | Origin::Exit { source } => ended.contains(&source),
            Origin::Transport | Origin::Spool(_) => false,
        };
        let todo: Vec<(u64, RecordBatch)> = self
            .queue
            .iter()
            .chain(self.pending.values().map(|(o, _, _)| o))
            .filter(|o| of_ended(o) && !self.copies.contains_key(&o.order))
            .map(|o| (o.order, o.batch.clone()))
            .collect();
        // One sync for the lot: a tail of many small batches must be on disk in milliseconds,
        // before this agent can be gone too.
        let (orders, batches): (Vec<u64>, Vec<RecordBatch>) = todo.into_iter().unzip();
        for (order, written) in orders.into_iter().zip(self.spool.push_all(&batches)) {
            let Ok(seq) = written else { break };
            self.copies.insert(order, seq);
            // Held: not sent from the spool while the batch itself is on its way.
            self.spool_loaded.push(seq);
        }
    }

    /// Writes a ring batch to the spool and releases its ring space. False when the spool
    /// cannot take it (the batch is put back: its records are read again later).
    fn spool_one(&mut self, out: Outgoing) -> bool {
        // Already copied (its process ended): the copy is its spool entry now.
        if let Some(seq) = self.copies.remove(&out.order) {
            self.spool_loaded.retain(|s| *s != seq);
            self.stats
                .records_spooled
                .fetch_add(out.records, Ordering::Relaxed);
            self.complete_ring(&out.origin);
            return true;
        }
        match self.spool.push(&out.batch) {
            Ok(_) => {
                self.stats
                    .records_spooled
                    .fetch_add(out.records, Ordering::Relaxed);
                self.complete_ring(&out.origin);
                true
            }
            Err(e) => {
                self.stats.spool_errors.fetch_add(1, Ordering::Relaxed);
                if self.spool_blocked_until.is_none() {
                    tracing::warn!(
                        "{e}; rings are not drained until the collector is back or the spool has room (the processes count what their rings cannot hold)"
                    );
                }
                self.spool_blocked_until = Some(Instant::now() + Duration::from_secs(1));
                match out.origin {
                    // Put the batch back: rewind the source to its start (the records are
                    // still in the ring).
                    Origin::Ring { source, end_pos } => {
                        let start = end_pos - out.records;
                        // What this source queued after the batch goes back too: its later ring
                        // batches (read again from `start`) and its exit batch, which must not
                        // reach the spool, and so the collector, before these records.
                        let mut later = 0;
                        let mut had_exit = false;
                        self.queue.retain(|o| match o.origin {
                            Origin::Ring {
                                source: s,
                                end_pos: e,
                            } if s == source && e > start => {
                                later += o.records;
                                false
                            }
                            Origin::Exit { source: s } if s == source => {
                                had_exit = true;
                                false
                            }
                            _ => true,
                        });
                        if let Some(s) = self.sources.get_mut(&source) {
                            s.batches.retain(|(e, _)| *e <= start);
                            s.read_pos = s.read_pos.min(start);
                            // The records are read again: sampling starts over on them.
                            s.sampler = Sampler::default();
                            if had_exit {
                                s.exit_queued = false;
                            }
                            self.stats
                                .records_read
                                .fetch_sub(out.records + later, Ordering::Relaxed);
                        }
                    }
                    // Small and not in any ring: kept in memory until it can go.
                    Origin::Exit { .. } | Origin::Transport => self.requeue(out),
                    Origin::Spool(_) => {}
                }
                false
            }
        }
    }

    /// Marks a ring batch done and moves the cursor over every leading done batch (or marks
    /// the exit batch done).
    fn complete_ring(&mut self, origin: &Origin) {
        match origin {
            Origin::Ring { source, end_pos } => {
                if let Some(s) = self.sources.get_mut(source) {
                    if let Some(b) = s.batches.iter_mut().find(|(e, _)| e == end_pos) {
                        b.1 = true;
                    }
                    advance(s);
                }
            }
            Origin::Exit { source } => {
                if let Some(s) = self.sources.get_mut(source) {
                    s.exit_done = true;
                }
            }
            Origin::Transport | Origin::Spool(_) => {}
        }
    }

    /// Sends what the queue holds, each batch to its job's replica as far as that replica's
    /// window allows; spools the batches of a replica that has been away too long.
    fn flush(&mut self) {
        // Batches whose replica has been away too long go to the spool, in order.
        if (0..self.links.len()).any(|r| self.spooling(r)) {
            let mut i = 0;
            while i < self.queue.len() {
                let r = self.replica_of_queued(i);
                if !self.spooling(r) {
                    i += 1;
                    continue;
                }
                let Some(o) = self.queue.remove(i) else {
                    break;
                };
                match o.origin {
                    Origin::Ring { .. } | Origin::Exit { .. } | Origin::Transport => {
                        // The spool is full: the batch went back (its source rewound).
                        if !self.spool_one(o) {
                            break;
                        }
                    }
                    // Already on disk; it is read again when the replica is back.
                    Origin::Spool(seq) => self.spool_loaded.retain(|s| *s != seq),
                }
            }
        }
        if self.links.iter().all(|l| l.tx.is_none()) {
            return;
        }
        // Spooled batches first (older), a few at a time, those of replicas that are there.
        if self.queue.len() < self.cfg.max_unacked {
            for seq in self.spool.pending() {
                if self.spool_loaded.contains(&seq) {
                    continue;
                }
                if self.spool_loaded.len() >= self.cfg.max_unacked {
                    break;
                }
                if let Some(&r) = self.spool_routes.get(&seq)
                    && self.links[r].tx.is_none()
                {
                    continue;
                }
                match self.spool.read(seq) {
                    Ok(batch) => {
                        let r = self.replica_of(&batch);
                        if self.spool_routes.len() > 100_000 {
                            self.spool_routes.clear();
                        }
                        self.spool_routes.insert(seq, r);
                        if self.links[r].tx.is_none() {
                            continue;
                        }
                        let records = (batch.records.len() / RECORD_SIZE) as u64;
                        self.spool_loaded.push(seq);
                        // Spooled batches are older than anything in memory.
                        self.requeue(Outgoing {
                            order: 0,
                            batch,
                            origin: Origin::Spool(seq),
                            records,
                            not_before: None,
                        });
                    }
                    Err(e) => {
                        tracing::warn!("spooled batch {seq} unreadable ({e}); removed");
                        self.spool.remove(seq);
                    }
                }
            }
        }
        let now = Instant::now();
        // Per replica, order is kept: nothing overtakes a batch its collector asked to wait,
        // or one its window has no room for. Other replicas' batches go on.
        let mut blocked = vec![false; self.links.len()];
        let queue = std::mem::take(&mut self.queue);
        let mut kept = VecDeque::with_capacity(queue.len());
        for mut o in queue {
            let r = self.replica_of(&o.batch);
            let link = &mut self.links[r];
            let Some(tx) = link.tx.as_ref().filter(|_| !blocked[r]) else {
                kept.push_back(o);
                continue;
            };
            if link.unacked >= self.cfg.max_unacked || o.not_before.is_some_and(|t| now < t) {
                blocked[r] = true;
                kept.push_back(o);
                continue;
            }
            let id = self.next_batch;
            if let Some((off, err)) = link.clock.get() {
                o.batch.clock_offset_ns = Some(off);
                o.batch.clock_error_ns = err;
            }
            let t1 = now_real();
            let req = IngestRequest {
                batch_id: id,
                agent_send_ns: t1,
                payload: Some(Payload::Records(o.batch.clone())),
            };
            match tx.try_send(req) {
                Ok(()) => {
                    self.next_batch += 1;
                    link.unacked += 1;
                    self.stats.batches_sent.fetch_add(1, Ordering::Relaxed);
                    self.pending.insert(id, (o, t1, r));
                }
                Err(_) => {
                    blocked[r] = true;
                    kept.push_back(o);
                }
            }
        }
        self.queue = kept;
    }

    fn ack(&mut self, r: usize, ack: IngestAck, t4: u64) {
        if !ack.probes.is_empty() {
            self.probe(&ack.probes);
        }
        if ack.rates_update {
            // Not an acknowledgement: the sampling rates of this node's communicators.
            self.set_rates(&ack.rates);
            return;
        }
        if ack.batch_id == 0 {
            // The hello's acknowledgement: the first clock sample, so that even the stream's
            // first batch (a short job's only one) carries the node's alignment.
            if let Some(t1) = self.links[r].hello_sent_ns.take() {
                self.links[r]
                    .clock
                    .sample(t1, ack.collector_recv_ns, ack.collector_send_ns, t4);
            }
            return;
        }
        let Some((out, t1, sent_to)) = self.pending.remove(&ack.batch_id) else {
            return;
        };
        if sent_to != r {
            // Not this replica's to answer: back where it was.
            self.pending.insert(ack.batch_id, (out, t1, sent_to));
            return;
        }
        let link = &mut self.links[r];
        link.unacked = link.unacked.saturating_sub(1);
        link.clock
            .sample(t1, ack.collector_recv_ns, ack.collector_send_ns, t4);
        if ack.durable {
            self.stats
                .records_acked
                .fetch_add(out.records, Ordering::Relaxed);
            self.done(out);
        } else if ack.retry_after_ms > 0 {
            self.stats.batches_resent.fetch_add(1, Ordering::Relaxed);
            let mut out = out;
            out.not_before =
                Some(Instant::now() + Duration::from_millis(u64::from(ack.retry_after_ms)));
            self.requeue(out);
        } else {
            tracing::warn!(
                "the collector refused a batch of {} records: {}; they are counted as dropped",
                out.records,
                ack.error
            );
            self.stats
                .records_refused
                .fetch_add(out.records, Ordering::Relaxed);
            self.done(out);
        }
        self.flush();
    }

    /// Applies the collector's rates (the node's whole list): communicators not in it keep
    /// everything from now on.
    fn set_rates(&mut self, rates: &[SampleRate]) {
        let mut listed: HashMap<&str, Vec<&SampleRate>> = HashMap::new();
        for r in rates {
            listed.entry(r.job.as_str()).or_default().push(r);
        }
        for (job, table) in &mut self.rates {
            let keep: std::collections::HashSet<u64> = listed
                .get(job.as_str())
                .map(|v| v.iter().map(|r| r.comm_id).collect())
                .unwrap_or_default();
            let gone: Vec<u64> = table
                .iter()
                .filter(|(c, _)| !keep.contains(c))
                .map(|(c, _)| c)
                .collect();
            for c in gone {
                table.set(c, 1, 0);
            }
        }
        let mut sampled = 0;
        for (job, list) in listed {
            let table = self.rates.entry(job.to_owned()).or_default();
            for r in list {
                table.set(r.comm_id, r.modulus, r.from_seq);
                sampled += usize::from(r.modulus > 1);
            }
        }
        self.rates.retain(|_, t| !t.is_empty());
        tracing::info!(
            "consistent sampling: {sampled} communicator{} sampled now",
            if sampled == 1 { "" } else { "s" }
        );
    }

    /// Puts a batch back into the queue at its place in creation order.
    fn requeue(&mut self, out: Outgoing) {
        let at = self.queue.partition_point(|o| o.order <= out.order);
        self.queue.insert(at, out);
    }

    fn done(&mut self, out: Outgoing) {
        if let Some(seq) = self.copies.remove(&out.order) {
            self.spool.remove(seq);
            self.spool_loaded.retain(|s| *s != seq);
        }
        match out.origin {
            Origin::Ring { .. } | Origin::Exit { .. } => self.complete_ring(&out.origin),
            Origin::Transport => {}
            Origin::Spool(seq) => {
                self.spool.remove(seq);
                self.spool_loaded.retain(|s| *s != seq);
            }
        }
    }

    /// After a process's last records: the final counters and an exit record, written by the
    /// agent for it.
    fn queue_exit(&mut self, id: u64) {
        let Some(s) = self.sources.get_mut(&id) else {
            return;
        };
        if s.exit_queued {
            return;
        }
        s.exit_queued = true;
        let ending = s.ending;
        let shm = s.reg.region.shm();
        let head = shm.head();
        let closing = crate::closing::closing_records(
            shm,
            crate::closing::Who {
                pid: s.process.pid,
                start_time: s.process.start_time,
                rank: s.process.rank,
                world_size: s.process.world_size,
            },
            crate::closing::Seen {
                ending,
                t_real: if s.exited_at.0 > 0 {
                    s.exited_at.0
                } else {
                    now_real()
                },
                t_mono: if s.exited_at.1 > 0 {
                    s.exited_at.1
                } else {
                    now_mono()
                },
            },
            (now_real(), now_mono()),
        );
        let how = match ending {
            Some(Ending::Exited(c)) => format!("exited with status {c}"),
            Some(Ending::Signaled(sig, None)) => format!("was killed by signal {sig}"),
            Some(Ending::Signaled(sig, Some(by))) => format!(
                "was killed by signal {sig}, sent by {}",
                by.describe(s.process.pid)
            ),
            None => "ended (status unknown)".into(),
        };
        let finalized = shm.state() == commscope_wire::shm::state::FINALIZED;
        if !s.exit_logged {
            s.exit_logged = true;
            tracing::info!(
                "rank {} of job {} (pid {}) {how}{}",
                s.process.rank,
                s.process.job,
                s.process.pid,
                if finalized { " after finalizing" } else { "" }
            );
        }
        // Left-out calls still held by sampling go first.
        let mut records = Vec::new();
        let skips = s.sampler.flush(&mut records);
        for r in &closing {
            records.extend_from_slice(&r.encode());
        }
        self.next_order += 1;
        let out = Outgoing {
            order: self.next_order,
            batch: RecordBatch {
                process: Some(s.process.clone()),
                first_rec_seq: head + 1,
                record_size: RECORD_SIZE as u32,
                records,
                clock_offset_ns: None,
                clock_error_ns: 0,
                dropped_overrun: shm.counter(Counter::ConsumerOverrun),
            },
            origin: Origin::Exit { source: id },
            records: closing.len() as u64 + skips,
            not_before: None,
        };
        // In ring order: behind the process's last batches (the queue is flushed, or spooled,
        // in order).
        self.queue.push_back(out);
    }

    /// Takes the stacks of processes the collector asked about (a hang's culprits), on a blocking
    /// thread, and sends them back.
    fn probe(&mut self, probes: &[commscope_wire::grpc::ProbeRequest]) {
        for pr in probes {
            let r = self.replica(&pr.job);
            let Some(link) = self.links[r].tx.clone() else {
                continue;
            };
            let Some(s) = self.sources.values().find(|s| {
                s.process.pid == pr.pid
                    && s.process.start_time == pr.start_time
                    && s.process.job == pr.job
            }) else {
                continue;
            };
            let process = s.process.clone();
            let enabled = self.cfg.stacks;
            tracing::info!(
                "the collector asks for the stacks of rank {} of job {} (pid {}){}",
                process.rank,
                process.job,
                process.pid,
                if enabled { "" } else { ": off (--no-stacks)" }
            );
            tokio::task::spawn_blocking(move || {
                let (native, python, error) = if enabled {
                    crate::procstate::stacks(process.pid, 16 << 10, Duration::from_secs(30))
                } else {
                    (
                        String::new(),
                        String::new(),
                        "stacks are off on this agent (--no-stacks)".into(),
                    )
                };
                let req = IngestRequest {
                    batch_id: 0,
                    agent_send_ns: now_real(),
                    payload: Some(Payload::Probe(commscope_wire::grpc::ProcessProbe {
                        process: Some(process),
                        native_stack: native,
                        python_stack: python,
                        error,
                    })),
                };
                let _ = link.blocking_send(req);
            });
        }
    }

    /// Sends each live process's in-flight table when it changed, and at least once a second
    /// with the process's state.
    fn snapshots(&mut self) {
        let now = Instant::now();
        let jobs: std::collections::BTreeSet<String> = self
            .sources
            .values()
            .map(|s| s.process.job.clone())
            .collect();
        let links: HashMap<String, mpsc::Sender<IngestRequest>> = jobs
            .into_iter()
            .filter_map(|j| {
                let r = self.replica(&j);
                self.links[r].tx.clone().map(|tx| (j, tx))
            })
            .collect();
        for s in self.sources.values_mut() {
            if s.exited.is_some() {
                continue;
            }
            let Some(link) = links.get(&s.process.job) else {
                continue;
            };
            let shm = s.reg.region.shm();
            let entries: Vec<InFlight> = shm.in_flight().into_iter().map(|(_, e)| e).collect();
            // At least once a second: the process's state and CPU time go with it.
            let unchanged = s.last_snapshot.as_ref().is_some_and(|(prev, at)| {
                *prev == entries && at.elapsed() < Duration::from_secs(1)
            });
            if unchanged {
                continue;
            }
            let snap = InFlightSnapshot {
                process: Some(s.process.clone()),
                t_mono_ns: now_mono(),
                entries: entries
                    .iter()
                    .map(|e| InFlightEntry {
                        comm_id: e.comm_id,
                        seq: e.seq,
                        op: Op::from_code(e.op).name().into(),
                        t_enter_ns: e.t_enter,
                        bytes: e.bytes,
                        peer: e.peer,
                        tag: e.tag,
                        comm_rank: e.comm_rank,
                        status: u32::from(e.status),
                        tid: e.tid,
                        count: e.count,
                        dtype: u32::from(e.dtype),
                        red_op: u32::from(e.red_op),
                    })
                    .collect(),
                dropped_ring_full: shm.counter(Counter::DroppedRingFull),
                last_beat_ns: shm.last_beat(),
                ..Default::default()
            };
            let mut snap = snap;
            if let Some(p) = crate::procstate::sample(s.process.pid) {
                snap.proc_state = p.state;
                snap.wchan = p.wchan;
                snap.cpu_ns = p.cpu_ns;
            }
            let req = IngestRequest {
                batch_id: 0,
                agent_send_ns: now_real(),
                payload: Some(Payload::InFlight(snap)),
            };
            if link.try_send(req).is_ok() {
                s.last_snapshot = Some((entries, now));
            }
        }
    }

    fn publish(&self) {
        let views = self
            .sources
            .values()
            .map(|s| {
                let shm = s.reg.region.shm();
                let cap = shm.geometry().ring_capacity.max(1);
                ProcessView {
                    job: s.process.job.clone(),
                    rank: s.process.rank,
                    pid: s.process.pid,
                    fill: shm.head().saturating_sub(shm.cursor(Consumer::Agent)) as f64
                        / cap as f64,
                    in_flight: shm.in_flight_count(),
                    drops: drops_of(s),
                }
            })
            .collect();
        *self
            .stats
            .processes
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = views;
        self.stats
            .spool_bytes
            .store(self.spool.bytes(), Ordering::Relaxed);
        self.stats
            .spool_batches
            .store(self.spool.len() as u64, Ordering::Relaxed);
        self.stats
            .unacked
            .store(self.pending.len() as u64, Ordering::Relaxed);
        // The first replica's estimate (replicas keep their clocks in step among themselves).
        *self.stats.clock.lock().unwrap_or_else(|p| p.into_inner()) =
            self.links.iter().find_map(|l| l.clock.get());
    }
}

fn drops_of(s: &Source) -> [u64; 4] {
    let shm = s.reg.region.shm();
    [
        shm.counter(Counter::DroppedRingFull),
        shm.counter(Counter::DroppedInFlight),
        shm.counter(Counter::DroppedRequests)
            + shm.counter(Counter::DroppedP2pSeq)
            + shm.counter(Counter::DroppedComms)
            + shm.counter(Counter::DroppedInternal),
        shm.counter(Counter::ConsumerOverrun),
    ]
}

/// Moves the ring cursor over every leading batch that is done.
fn advance(s: &mut Source) {
    let mut to = None;
    while let Some(&(end, true)) = s.batches.front() {
        to = Some(end);
        s.batches.pop_front();
    }
    if let Some(end) = to {
        s.reg.region.shm().advance(Consumer::Agent, end);
    }
}
