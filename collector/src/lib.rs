//! The commscope collector: ingests record batches from node agents over gRPC, stores them
//! durably (write-ahead log, then Parquet segments per job), keeps bounded live state per job,
//! and serves it: the JSON API and `/metrics` over HTTP, the query service over gRPC.
//!
//! - [`store`]: durability, dedup, segments, retention.
//! - [`state`]: live per-job state; [`shards`]: the state split by job.
//! - [`ingest`]: the agent stream.
//! - [`query`]: the gRPC query service (the TUI's view).
//! - [`http`]: `/healthz`, `/readyz`, `/metrics`, `/api/v1/...`.
//! - [`findings`]: the live findings engine; [`contact`]: what it can see of each node, and
//!   how far behind.

pub mod auth;
pub mod contact;
pub mod findings;
pub mod history;
pub mod http;
pub mod ingest;
pub mod memory;
pub mod metrics;
pub mod otlp;
pub mod peers;
pub mod query;
pub mod quiet;
pub mod sampling;
pub mod shards;
pub mod state;
pub mod store;
mod tls;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use commscope_wire::parquet::ClockAlignment;

pub use state::Limits;

/// Collector settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// gRPC address (agent ingest and the query service).
    pub listen: SocketAddr,
    /// HTTP address (JSON API, `/metrics`, health).
    pub http: SocketAddr,
    /// Where traces live: `<dir>/<job>/seg-*.parquet` and the write-ahead logs.
    pub trace_dir: PathBuf,
    /// A job's log rolls into a Parquet segment at this size ...
    pub segment_bytes: u64,
    /// ... or this age.
    pub segment_age: Duration,
    /// [`Running::stop`] waits this long for the listeners and their connections.
    pub shutdown_timeout: Duration,
    /// Segments older than this are deleted.
    pub retention: Option<Duration>,
    /// Oldest segments are deleted while all together exceed this.
    pub retention_bytes: Option<u64>,
    /// Largest gRPC message accepted (bytes).
    pub max_message_bytes: usize,
    /// Records per second one agent stream may send; more is refused with a retry delay.
    pub max_agent_rate: u64,
    /// Bytes of records read from all agents and not yet stored and applied, at most: beyond,
    /// the streams wait (flow control slows their agents) until the store catches up.
    pub ingest_budget_bytes: usize,
    /// Jobs, and processes, one agent stream may send records of; batches of more are refused
    /// (the agent counts their records as refused).
    pub max_jobs_per_agent: usize,
    pub max_ranks_per_agent: usize,
    /// The shared token every gRPC request and every HTTP request but the health checks must
    /// carry; None: open.
    pub auth_token: Option<commscope_wire::auth::Token>,
    /// The listeners' TLS certificate and key, and the CA that signs the agents' certificates
    /// (mutual TLS on gRPC); empty: plaintext.
    pub tls: commscope_wire::tls::TlsFiles,
    /// Live-state bounds.
    pub limits: Limits,
    /// Jobs are split over this many shards of live state and store (each job in one): jobs
    /// apply, store and evaluate on separate cores.
    pub shards: usize,
    /// The other replicas' HTTP base URLs: the API and the query service answer for their
    /// jobs too.
    pub peers: Vec<String>,
    /// A collective in flight this long while members have not entered it is a hang.
    pub hang_floor: Duration,
    /// Consistent sampling: calls per second (all jobs) the collector takes in full; above it,
    /// busy communicators are sampled.
    pub sample_budget: u64,
    /// Consistent sampling: this modulus on every communicator, whatever the load.
    pub sample_modulus: Option<u32>,
    /// Resident memory at most (bytes); None: [`memory::default_limit`].
    pub memory_limit: Option<u64>,
    /// OTLP gRPC endpoint to export metrics and spans to, and how often.
    pub otlp: Option<String>,
    pub otlp_interval: Duration,
}

impl Config {
    /// Defaults: loopback ports 4317 (gRPC) and 9464 (HTTP), traces under `dir`.
    pub fn new(trace_dir: impl Into<PathBuf>) -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_GRPC_PORT)),
            http: SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT)),
            trace_dir: trace_dir.into(),
            segment_bytes: 64 << 20,
            segment_age: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(10),
            retention: None,
            retention_bytes: None,
            max_message_bytes: 16 << 20,
            max_agent_rate: 2_000_000,
            ingest_budget_bytes: 256 << 20,
            max_jobs_per_agent: 64,
            max_ranks_per_agent: 4096,
            auth_token: None,
            tls: Default::default(),
            limits: Limits::default(),
            shards: default_shards(),
            peers: Vec::new(),
            hang_floor: Duration::from_secs(5),
            sample_budget: 150_000,
            sample_modulus: None,
            memory_limit: None,
            otlp: None,
            otlp_interval: Duration::from_secs(10),
        }
    }
}

/// One shard per CPU, at most 16.
pub fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
}

/// Default gRPC port.
pub const DEFAULT_GRPC_PORT: u16 = 4650;
/// Default HTTP port.
pub const DEFAULT_HTTP_PORT: u16 = 4651;

/// Ingest counters.
#[derive(Debug, Default)]
pub struct Metrics {
    pub records_in: AtomicU64,
    pub streams_open: AtomicU64,
    pub streams_total: AtomicU64,
    pub bad_messages: AtomicU64,
    pub rate_limited: AtomicU64,
    /// Record batches that waited for the ingest budget.
    pub budget_waits: AtomicU64,
    pub refusals: Mutex<HashMap<&'static str, u64>>,
    /// OTLP: exports by (signal, result), and spans left out.
    pub otlp_exports: Mutex<HashMap<(&'static str, &'static str), u64>>,
    pub otlp_spans_dropped: AtomicU64,
    /// Per client address and kind of request: when a refusal was last logged.
    pub auth_logged: Mutex<HashMap<(std::net::IpAddr, String), std::time::Instant>>,
}

impl Metrics {
    /// Counts an OTLP export.
    pub fn otlp_exported(&self, signal: &'static str, result: &'static str) {
        *self
            .otlp_exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((signal, result))
            .or_insert(0) += 1;
    }

    /// Counts a refused request by reason.
    pub fn refused(&self, reason: &'static str) {
        *self
            .refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_insert(0) += 1;
    }
}

/// What every service shares.
#[derive(Debug)]
pub struct Shared {
    pub config: Config,
    pub store: store::Store,
    pub state: shards::Shards,
    pub metrics: Metrics,
    /// Per node: the latest clock alignment its agent reported.
    pub clocks: Mutex<HashMap<String, ClockAlignment>>,
    pub ready: AtomicBool,
    /// OTLP (`--otlp`): findings resolved since the last export.
    pub otlp_findings: Mutex<Vec<commscope_analyzer::Finding>>,
    /// Every job on disk and its findings, across restarts and releases.
    pub history: history::History,
    /// The process's metric registry (`/metrics`), set once at start.
    pub registry: std::sync::OnceLock<prometheus::Registry>,
    pub started: std::time::Instant,
    /// Open and recently resolved findings.
    pub findings: Mutex<findings::Engine>,
    /// Per node: processes its agent is asked to probe (stacks of hang culprits), and every
    /// process asked about so far (each at most once).
    pub probes: Mutex<HashMap<String, Vec<commscope_wire::grpc::ProbeRequest>>>,
    pub probed: Mutex<std::collections::HashSet<(String, u32, u64)>>,
    /// Consistent sampling: the policy, and the rates per node it last set (each agent stream
    /// sends its node's when they change).
    pub sampling: Mutex<sampling::Policy>,
    pub rates: tokio::sync::watch::Sender<Arc<sampling::ByNode>>,
    /// Per node: its agent's streams and how recent its data is ([`contact`]).
    pub contact: Mutex<contact::Contact>,
    /// Per node: what its agent sent, for the per-agent bounds.
    pub agent_usage: Mutex<ingest::AgentUsage>,
    /// The other replicas (`--peers`).
    pub peers: peers::Peers,
    /// The ingest budget (`ingest_budget_bytes`) in KiB permits: a record batch holds its share
    /// from when it is read until it is stored and applied.
    pub ingest_budget: Arc<tokio::sync::Semaphore>,
    /// The memory bound and where memory stands against it ([`memory`]).
    pub memory: memory::MemoryBound,
    /// Agent streams that ended: logged a few a minute ([`quiet`]).
    pub streams_ended_log: Mutex<quiet::Quiet>,
    /// Nodes whose agent stream ended without an error (the agent closed it, or its connection
    /// went quiet), not yet logged: the next findings tick tells whether that left ranks of a
    /// running job out of contact (a warning) or nothing anyone waits for (an agent leaving
    /// after its jobs ended, a simulated fleet done: a line of information).
    closed_streams: Mutex<Vec<String>>,
}

/// The ingest budget (`ingest_budget_bytes`) in KiB, at least one.
fn budget_kib(config: &Config) -> usize {
    (config.ingest_budget_bytes >> 10).max(1)
}

impl Shared {
    /// The ingest budget in KiB.
    fn budget_kib(&self) -> usize {
        budget_kib(&self.config)
    }

    /// Takes the share of the ingest budget of a batch of `bytes` (a batch larger than the
    /// whole budget takes it all), waiting while other batches hold it; None only if the
    /// budget was closed.
    pub async fn hold(&self, bytes: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let kib = bytes.div_ceil(1024).clamp(1, self.budget_kib()) as u32;
        if let Ok(p) = self.ingest_budget.clone().try_acquire_many_owned(kib) {
            return Some(p);
        }
        self.metrics.budget_waits.fetch_add(1, Ordering::Relaxed);
        self.ingest_budget
            .clone()
            .acquire_many_owned(kib)
            .await
            .ok()
    }

    /// Bytes of the ingest budget held now.
    pub fn budget_held_bytes(&self) -> u64 {
        let free = self.ingest_budget.available_permits();
        (self.budget_kib().saturating_sub(free) as u64) << 10
    }
}

/// How often the collector pings an agent's connection, and how long it waits for the answer:
/// a node whose network failed is known within their sum. (At 2 s and 4 s a collector starved
/// of CPU by 8,192 streams answered late and dropped thousands of healthy streams, whose resent
/// batches loaded it further.)
pub const KEEPALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Shared {
    fn contact(&self) -> std::sync::MutexGuard<'_, contact::Contact> {
        self.contact.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An agent's stream said hello.
    pub fn agent_connected(&self, node: &str, now_ns: u64) {
        self.contact().connected(node, now_ns);
    }

    /// An agent's stream ended: `why` is the transport's error, if there was one.
    pub fn agent_stream_ended(&self, node: &str, why: Option<&str>, now_ns: u64) {
        if !self.contact().stream_ended(node, why, now_ns) {
            return;
        }
        match why {
            Some(why) => self.warn_stream_ended(node, why),
            None => self
                .closed_streams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(node.to_owned()),
        }
    }

    fn warn_stream_ended(&self, node: &str, why: &str) {
        if self
            .streams_ended_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allow()
        {
            tracing::warn!(
                "no stream from node {node}'s agent any more ({why}): its ranks are out of contact until it reconnects"
            );
        }
    }

    /// Logs the streams that ended `closed` (without an error), now that the findings tick
    /// knows which nodes of running jobs are out of contact.
    fn tell_closed_streams(&self, closed: Vec<String>, out_of_contact: &BTreeSet<String>) {
        let (warn, quiet): (Vec<String>, Vec<String>) =
            closed.into_iter().partition(|n| out_of_contact.contains(n));
        for n in &warn {
            self.warn_stream_ended(n, "its stream ended");
        }
        match quiet.len() {
            0 => {}
            1 => tracing::info!(
                "no stream from node {}'s agent any more (its stream ended); no running rank of a job is on it",
                quiet[0]
            ),
            k => tracing::info!(
                "no stream from {k} nodes' agents any more (e.g. {}: their streams ended); no running rank of a job is on them",
                quiet[0]
            ),
        }
    }

    /// Data of `node` up to `content_ns` (realtime) was applied just now.
    pub fn arrived(&self, node: &str, content_ns: u64) {
        if content_ns > 0 {
            self.contact().arrived(node, content_ns, state::now_ns());
        }
    }

    /// Asks the agents of these ranks of `job` for their processes' stacks (once per process).
    pub fn ask_for_stacks(&self, job: &str, ranks: &[i32]) {
        let wanted: Vec<(String, commscope_wire::grpc::ProbeRequest)> = {
            let st = self.state.of(job);
            let Some(j) = st.jobs.get(job) else { return };
            j.ranks
                .values()
                .filter(|r| ranks.contains(&r.rank) && r.status == state::RankStatus::Running)
                .map(|r| {
                    (
                        r.node.clone(),
                        commscope_wire::grpc::ProbeRequest {
                            job: job.to_owned(),
                            pid: r.pid,
                            start_time: r.start_time,
                        },
                    )
                })
                .collect()
        };
        let mut probed = self.probed.lock().unwrap_or_else(|p| p.into_inner());
        let mut probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
        for (node, req) in wanted {
            if probed.len() > 100_000 {
                probed.clear();
            }
            if probed.insert((req.job.clone(), req.pid, req.start_time)) {
                tracing::info!(
                    "asking the agent of {node} for the stacks of pid {} (job {})",
                    req.pid,
                    req.job
                );
                probes.entry(node).or_default().push(req);
            }
        }
    }

    /// Probe requests waiting for a node's agent.
    pub fn take_probes(&self, node: &str) -> Vec<commscope_wire::grpc::ProbeRequest> {
        let mut probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
        probes.remove(node).unwrap_or_default()
    }

    fn set_node_clock(&self, node: &str, c: ClockAlignment) {
        self.clocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_owned(), c);
    }

    /// A job ended: its log becomes a segment now.
    async fn job_ended(&self, job: &str) {
        let (ranks, records) = self
            .state
            .of(job)
            .jobs
            .get(job)
            .map(|j| (j.rank_count(), j.records))
            .unwrap_or_default();
        tracing::info!(
            "job {job} ended: {ranks} ranks, {records} records; writing its trace segment"
        );
        self.store.roll(job).await;
        let line = self.state.of(job).jobs.get(job).map(http::job_line);
        if let Some(line) = line
            && let Err(e) = self.history.record_job(&line)
        {
            tracing::warn!("{e}; the job is listed until this collector stops");
        }
    }

    /// Writes the summary of every job that changed state, or took records more than 5 s
    /// after its last write, to its `job.json`.
    fn persist_jobs(&self, persisted: &mut HashMap<String, (&'static str, std::time::Instant)>) {
        let now = std::time::Instant::now();
        let live: std::collections::HashSet<String> = self.state.job_names().into_iter().collect();
        persisted.retain(|j, _| live.contains(j));
        let mut due: Vec<(http::JobLine, &'static str)> = Vec::new();
        for st in self.state.iter() {
            due.extend(
                st.jobs
                    .values()
                    .filter(|j| match persisted.get(&j.job) {
                        None => true,
                        Some((state, at)) => {
                            *state != j.state_name()
                                || (j.last_touch > *at
                                    && now.duration_since(*at) >= Duration::from_secs(5))
                        }
                    })
                    .map(|j| (http::job_line(j), j.state_name())),
            );
        }
        for (line, state) in due {
            match self.history.record_job(&line) {
                Ok(()) => {
                    persisted.insert(line.job.clone(), (state, now));
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
    }
}

/// A running collector.
#[derive(Debug)]
pub struct Running {
    pub shared: Arc<Shared>,
    /// The bound addresses (useful with port 0).
    pub listen: SocketAddr,
    pub http: SocketAddr,
    shutdown: tokio::sync::watch::Sender<bool>,
    shutdown_timeout: Duration,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops serving, writes every open log out as a segment, and returns. Connections that do
    /// not close within the shutdown timeout (an agent behind a dead network path, whose TCP
    /// cannot drain) are cut: what they had acknowledged is in the write-ahead logs already.
    pub async fn stop(self) {
        tracing::info!("shutting down: writing open logs out as segments");
        let _ = self.shutdown.send(true);
        let cut = join_until(self.tasks, self.shutdown_timeout).await;
        if cut > 0 {
            tracing::warn!(
                "shutdown: {cut} listener(s) still had connections open after {:.0?}; cut them (what was acknowledged is kept)",
                self.shutdown_timeout
            );
        }
        self.shared.store.flush().await;
    }
}

/// Awaits `tasks` until `timeout` has passed, then aborts those still running; returns how
/// many were aborted.
pub async fn join_until(tasks: Vec<tokio::task::JoinHandle<()>>, timeout: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut cut = 0;
    for mut t in tasks {
        if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
            t.abort();
            cut += 1;
        }
    }
    cut
}

/// Opens the store (recovering what a previous run left) and starts serving. Returns once both
/// listeners are bound.
pub async fn start(config: Config) -> Result<Running> {
    let mut scfg = store::Config::new(&config.trace_dir);
    scfg.roll_bytes = config.segment_bytes;
    scfg.roll_age = config.segment_age;
    scfg.retention = config.retention;
    scfg.retention_bytes = config.retention_bytes;
    scfg.segment_threads = config.shards;
    let mut limits = config.limits.clone();
    if config.otlp.is_some() {
        limits.slow_calls = 256;
    }
    let st = shards::Shards::new(limits, config.shards);
    let (store, recovered) = store::Store::open(scfg, &mut |h, recs| {
        st.of(&h.job).apply(h, None, recs);
    })
    .map_err(anyhow::Error::msg)?;
    let (history, history_warnings) = history::History::open(&config.trace_dir);
    let shared = Arc::new(Shared {
        config: config.clone(),
        store,
        state: st,
        metrics: Metrics::default(),
        clocks: Mutex::new(HashMap::new()),
        ready: AtomicBool::new(false),
        started: std::time::Instant::now(),
        findings: Mutex::new(findings::Engine::new(config.hang_floor)),
        probes: Mutex::new(HashMap::new()),
        probed: Mutex::new(std::collections::HashSet::new()),
        sampling: Mutex::new(sampling::Policy::default()),
        rates: tokio::sync::watch::channel(Arc::default()).0,
        registry: std::sync::OnceLock::new(),
        otlp_findings: Mutex::new(Vec::new()),
        history,
        contact: Mutex::new(Default::default()),
        agent_usage: Mutex::new(Default::default()),
        ingest_budget: Arc::new(tokio::sync::Semaphore::new(budget_kib(&config))),
        memory: memory::MemoryBound::new(config.memory_limit.unwrap_or_else(memory::default_limit)),
        streams_ended_log: Mutex::new(quiet::Quiet::new("agent streams ended")),
        closed_streams: Mutex::new(Vec::new()),
        peers: peers::Peers::new(
            config.peers.clone(),
            config.auth_token.clone(),
            config.tls.clone(),
        ),
    });
    take_back(&shared);
    let registry = metrics::registry(Arc::downgrade(&shared))?;
    let _ = shared.registry.set(registry);
    for w in recovered.warnings.iter().chain(&history_warnings) {
        tracing::warn!("recovery: {w}");
    }
    tracing::info!(
        "traces under {}: {} segments, {} processes' marks, {} pending log entries recovered ({} records)",
        config.trace_dir.display(),
        recovered.segments,
        recovered.high_water.len(),
        recovered.pending_entries,
        recovered.pending_records
    );

    let (shutdown, rx) = tokio::sync::watch::channel(false);
    let grpc = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", config.listen))?;
    let http_l = tokio::net::TcpListener::bind(config.http)
        .await
        .with_context(|| format!("cannot listen for HTTP on {}", config.http))?;
    let listen = grpc.local_addr()?;
    let http_addr = http_l.local_addr()?;

    let mut tasks = Vec::new();
    let ingest = commscope_wire::grpc::ingest_server::IngestServer::new(ingest::IngestService {
        shared: shared.clone(),
    })
    .max_decoding_message_size(config.max_message_bytes);
    let ingest = tonic::service::interceptor::InterceptedService::new(
        ingest,
        auth::grpc_check(shared.clone(), "an agent stream"),
    );
    let query = tonic::service::interceptor::InterceptedService::new(
        commscope_wire::grpc::query_server::QueryServer::new(query::QueryService {
            shared: shared.clone(),
        }),
        auth::grpc_check(shared.clone(), "a query"),
    );
    let grpc_tls = config
        .tls
        .server(&[b"h2"], true)
        .map_err(anyhow::Error::msg)?;
    let http_tls = config
        .tls
        .server(&[b"http/1.1"], false)
        .map_err(anyhow::Error::msg)?;
    let mut r1 = rx.clone();
    // Keepalive pings: a stream whose node is cut off ends within seconds instead of waiting
    // for TCP to give up.
    let grpc_server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_EVERY))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(ingest)
        .add_service(query);
    let grpc_stop = async move {
        let _ = r1.wait_for(|s| *s).await;
    };
    match grpc_tls {
        Some(tls) => {
            let incoming =
                tls::incoming(grpc, tls, shared.clone(), "a gRPC connection", rx.clone());
            tasks.push(tokio::spawn(async move {
                let _ = grpc_server
                    .serve_with_incoming_shutdown(incoming, grpc_stop)
                    .await;
            }));
        }
        None => {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc);
            tasks.push(tokio::spawn(async move {
                let _ = grpc_server
                    .serve_with_incoming_shutdown(incoming, grpc_stop)
                    .await;
            }));
        }
    }
    let app = http::router(shared.clone());
    let mut r2 = rx.clone();
    match http_tls {
        Some(tls) => {
            tasks.push(tokio::spawn(tls::serve_https(
                http_l,
                app,
                tls,
                shared.clone(),
                rx.clone(),
            )));
        }
        None => tasks.push(tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let _ = axum::serve(http_l, app)
                .with_graceful_shutdown(async move {
                    let _ = r2.wait_for(|s| *s).await;
                })
                .await;
        })),
    }
    // Housekeeping: release ended jobs after their linger time; end jobs whose processes all
    // went silent is the agents' business (they report exits).
    let sh = shared.clone();
    let mut r3 = rx.clone();
    tasks.push(tokio::spawn(async move {
        let mut persisted = HashMap::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = r3.wait_for(|s| *s) => break,
            }
            let quiet: Vec<String> = sh
                .state
                .iter()
                .flat_map(|mut s| s.end_quiet(Duration::from_secs(5)))
                .collect();
            for j in quiet {
                sh.job_ended(&j).await;
            }
            sh.persist_jobs(&mut persisted);
            let gone: Vec<String> = sh
                .state
                .iter()
                .flat_map(|mut s| s.release_ended())
                .collect();
            for g in gone {
                tracing::info!("job {g} released from memory");
            }
        }
    }));
    // The memory bound: sampled five times a second.
    let sh = shared.clone();
    let mut r5 = rx.clone();
    tasks.push(tokio::spawn(async move {
        let mut trimmed = std::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = r5.wait_for(|s| *s) => break,
            }
            memory_tick(&sh, &mut trimmed);
        }
    }));
    // The findings engine (every second) and the sampling policy (every other tick) on a thread
    // of their own: a runtime busy with ingest must not delay a verdict. An evaluation holds its
    // jobs' state, and ingest waits for it meanwhile: ticks start at least
    // [`EVAL_SPACING`] times the last one's duration apart (at 65,536 ranks an evaluation
    // takes a few hundred milliseconds, and every second it would hold the state half the time).
    let sh = shared.clone();
    let r4 = rx.clone();
    tasks.push(tokio::task::spawn_blocking(move || {
        let mut ticks = 0u64;
        let mut next = std::time::Instant::now();
        loop {
            while std::time::Instant::now() < next {
                if *r4.borrow() {
                    return;
                }
                std::thread::sleep(
                    next.saturating_duration_since(std::time::Instant::now())
                        .min(Duration::from_millis(100)),
                );
            }
            let began = std::time::Instant::now();
            findings_tick(&sh);
            ticks += 1;
            if ticks.is_multiple_of(2) {
                sampling_tick(&sh);
            }
            // A tick that ran long does not make the next ones bunch up.
            next = (next + Duration::from_secs(1))
                .max(began + began.elapsed() * EVAL_SPACING)
                .max(std::time::Instant::now());
        }
    }));
    if let Some(url) = config.otlp.clone() {
        tasks.push(tokio::spawn(otlp::run(
            shared.clone(),
            url,
            config.otlp_interval,
            rx.clone(),
        )));
    }
    shared.ready.store(true, Ordering::Release);
    tracing::info!(
        "listening: gRPC on {listen}, HTTP on {http_addr}{}{}",
        if config.tls.is_empty() {
            ""
        } else if config.tls.ca.is_some() {
            "; TLS on both (https://), agents' certificates checked against the CA"
        } else {
            "; TLS on both (https://)"
        },
        if config.auth_token.is_some() {
            "; a token required"
        } else {
            ""
        }
    );
    Ok(Running {
        shared,
        listen,
        http: http_addr,
        shutdown,
        shutdown_timeout: config.shutdown_timeout,
        tasks,
    })
}

/// After recovery: the nodes of the running jobs the logs brought back are out of contact
/// until their agents reconnect, and those jobs' findings are taken back (the open ones held
/// open until their nodes are current again), so that a restart neither forgets a finding nor
/// judges silence it could not see.
fn take_back(sh: &Shared) {
    let now = state::now_ns();
    let mut jobs = Vec::new();
    for st in sh.state.iter() {
        for j in st.jobs.values().filter(|j| j.ended.is_none()) {
            jobs.push(j.job.clone());
            let mut c = sh.contact();
            for r in j.ranks.values() {
                c.recovered(&r.node, r.last_heard_ns, now);
            }
        }
    }
    let mut engine = sh.findings.lock().unwrap_or_else(|p| p.into_inner());
    let mut open = 0;
    for job in &jobs {
        let found = sh.history.of_job(job);
        open += found
            .iter()
            .filter(|f| f.state == commscope_analyzer::finding::State::Open)
            .count();
        engine.restore(found);
    }
    if !jobs.is_empty() {
        tracing::info!(
            "recovery: {} running job(s) and {} node(s) taken back, {open} open finding(s) held until their agents reconnect and catch up",
            jobs.len(),
            sh.contact().nodes().len()
        );
    }
}

/// Findings ticks start at least this many times the last one's duration apart.
const EVAL_SPACING: u32 = 4;

/// Re-evaluates every job's findings; logs what opened and resolved.
fn findings_tick(sh: &Shared) {
    // Streams closed before the copy below are in it.
    let closed = std::mem::take(&mut *sh.closed_streams.lock().unwrap_or_else(|p| p.into_inner()));
    // A copy: ingest updates the nodes' contact on every batch, the evaluation takes a while.
    let contact = sh.contact().clone();
    let (changes, out_of_contact) = {
        let mut engine = sh.findings.lock().unwrap_or_else(|p| p.into_inner());
        engine.overload = sh.memory.overload();
        let changes = engine.tick(&sh.state, &contact);
        (changes, engine.standing().out_of_contact)
    };
    if !closed.is_empty() {
        sh.tell_closed_streams(closed, &out_of_contact);
    }
    for c in &changes {
        match c {
            findings::Change::Opened(f) => {
                if f.kind == commscope_analyzer::Kind::Hang {
                    sh.ask_for_stacks(&f.job, &f.ranks);
                }
                tracing::info!(
                    "finding {} opened: {} {}: {}",
                    f.id,
                    f.job,
                    f.kind.name(),
                    f.summary
                )
            }
            findings::Change::Resolved(f) => {
                otlp::finding_resolved(sh, f);
                tracing::info!(
                    "finding {} resolved: {} {} of {}",
                    f.id,
                    f.job,
                    f.kind.name(),
                    ranks_list(&f.ranks)
                )
            }
        }
    }
    // Then onto disk with the job's trace (synced; after the log lines, which are cheap).
    if let Err(e) = sh.history.record_findings(&changes) {
        tracing::warn!("{e}; these findings are kept in memory only");
    }
}

/// Samples resident memory against the bound: logs a change of state, and while full hands
/// freed memory back to the system (at most every two seconds).
fn memory_tick(sh: &Shared, trimmed: &mut std::time::Instant) {
    use memory::Pressure;
    if let Some((was, now)) = sh.memory.sample() {
        if now > was {
            tracing::warn!("{}", sh.memory.note());
        } else if now == Pressure::Normal {
            tracing::info!(
                "the collector is back under its memory bound ({:.1} of {:.1} GiB)",
                sh.memory.rss() as f64 / f64::from(1u32 << 30),
                sh.memory.limit as f64 / f64::from(1u32 << 30)
            );
        } else {
            tracing::info!("{}", sh.memory.note());
        }
    }
    if sh.memory.pressure() == Pressure::Full && trimmed.elapsed() >= Duration::from_secs(2) {
        *trimmed = std::time::Instant::now();
        memory::trim();
    }
}

/// Re-decides consistent sampling from the calls offered since the last tick; pushes changed
/// rates to the agents. Near the memory bound the budget is smaller: busy communicators are
/// thinned harder.
fn sampling_tick(sh: &Shared) {
    let pressure = sh.memory.pressure();
    let behind_ns = sh
        .findings
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .most_behind_ns();
    let (changed, lag_moved, lag_was, budget, divisor, g, offered) = {
        let mut policy = sh.sampling.lock().unwrap_or_else(|p| p.into_inner());
        let lag_was = policy.lag.divisor;
        let lag_moved = policy.lag.tick(behind_ns);
        let divisor = policy.lag.divisor;
        let budget =
            sh.config.sample_budget as f64 / pressure.budget_divisor() / f64::from(divisor);
        policy.budget = budget;
        policy.min_instances = pressure.min_instances();
        let changed = policy.tick(
            &mut sh.state.iter().collect::<Vec<_>>(),
            budget,
            sh.config.sample_modulus,
        );
        (
            changed,
            lag_moved,
            lag_was,
            budget,
            divisor,
            policy.factor,
            policy.offered,
        )
    };
    if lag_moved {
        let late = behind_ns as f64 / 1e9;
        match divisor {
            1 => tracing::info!(
                "running jobs' data no longer falls behind ({late:.1} s late): sampling budget back to {budget:.0} calls/s"
            ),
            d if d > lag_was => tracing::warn!(
                "running jobs' data arrives later and later ({late:.1} s late): sampling harder, to a budget of {budget:.0} calls/s (1/{d} of --sample-budget)"
            ),
            d => tracing::info!(
                "running jobs' data no longer falls further behind ({late:.1} s late): sampling budget up to {budget:.0} calls/s (1/{d} of --sample-budget)"
            ),
        }
    }
    if let Some(rates) = changed {
        tracing::info!(
            "consistent sampling: {offered:.0} calls/s offered (budget {budget:.0}); busy communicators keep 1 instance in {g}"
        );
        sh.rates.send_replace(rates);
    }
}

fn ranks_list(r: &[i32]) -> String {
    commscope_analyzer::finding::ranks_phrase(r)
}
