//! The collector's metric families, filled from its state at each scrape (see
//! `commscope_telemetry::metrics`). The catalog, with label bounds, is in `docs/metrics.md`, and
//! a test keeps the two the same. The job is labelled `job_id` (Prometheus keeps `job` for the
//! scrape job):
//!
//! - collector health and ingest: records by result, batches, commits, refusals by reason, log
//!   and segment I/O, streams, jobs by state;
//! - per job: ranks, records, drops by reason, open findings by kind;
//! - per job, communicator and op: calls, bytes and a duration histogram — at most
//!   [`MAX_COMM_SERIES`] communicators per job by call count, the rest summed under
//!   `comm="other"`;
//! - per job and node pair: NCCL proxy link bytes and times — at most [`MAX_LINK_SERIES`];
//! - per job and rank: calls, calls in flight, age of the oldest in-flight call, time since
//!   last seen — for at most [`MAX_RANK_SERIES`] ranks per job (the lowest ranks);
//! - per node: clock offset and error.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use commscope_analyzer::finding::Kind as FindingKind;
use commscope_telemetry::metrics::{Def, Sink};
use commscope_wire::hash::format_comm_id;
use commscope_wire::op::Op;

use crate::Shared;
use crate::state::{BUCKETS, JobAttribution, JobState, OpStats, SIZE_CLASSES, now_ns};
use commscope_analyzer::links::NodePair;

/// Communicators with their own series per job.
pub const MAX_COMM_SERIES: usize = 32;
/// Node pairs per job with their own link series; the rest are summed under `other`.
pub const MAX_LINK_SERIES: usize = 64;
/// Ranks with their own series per job.
pub const MAX_RANK_SERIES: usize = 4096;

// Every per-job series leads with the job and its attribution (empty when unknown, which
// Prometheus stores as no label): see [`JobSink`].
const J: &[&str] = &["job_id", "namespace", "owner", "slurm_job_id"];
const COP: &[&str] = &["job_id", "namespace", "owner", "slurm_job_id", "comm", "op"];
const LINK: &[&str] = &["job_id", "namespace", "owner", "slurm_job_id", "src", "dst"];
const RANK: &[&str] = &[
    "job_id",
    "namespace",
    "owner",
    "slurm_job_id",
    "rank",
    "node",
    "pod",
];

static UP: Def = Def::gauge(
    "commscope_collector_up",
    "1 while the collector serves.",
    &[],
);
static UPTIME: Def = Def::gauge(
    "commscope_collector_uptime_seconds",
    "Seconds since the collector started.",
    &[],
);
static RECEIVED: Def = Def::counter(
    "commscope_collector_records_received_total",
    "Records received in batches (before dedup).",
    &[],
);
static RECORDS: Def = Def::counter(
    "commscope_collector_records_total",
    "Records by what became of them: stored, duplicate (resent, skipped), invalid (undecodable).",
    &["result"],
);
static BATCHES: Def = Def::counter(
    "commscope_collector_batches_total",
    "Record batches stored and acknowledged.",
    &[],
);
static COMMITS: Def = Def::counter(
    "commscope_collector_commits_total",
    "Group commits (one sync of the write-ahead logs each).",
    &[],
);
static COMMIT_ERRORS: Def = Def::counter(
    "commscope_collector_commit_errors_total",
    "Group commits that failed (nothing in them was acknowledged).",
    &[],
);
static LOG_BYTES: Def = Def::counter(
    "commscope_collector_log_bytes_total",
    "Bytes appended to write-ahead logs.",
    &[],
);
static SEGMENTS_WRITTEN: Def = Def::counter(
    "commscope_collector_segments_written_total",
    "Parquet segments written.",
    &[],
);
static SEGMENT_ROWS: Def = Def::counter(
    "commscope_collector_segment_rows_total",
    "Rows written to Parquet segments.",
    &[],
);
static SEGMENT_ERRORS: Def = Def::counter(
    "commscope_collector_segment_errors_total",
    "Segments that failed to write (their logs are kept).",
    &[],
);
static SEGMENTS_DELETED: Def = Def::counter(
    "commscope_collector_segments_deleted_total",
    "Segments deleted by retention.",
    &[],
);
static SEGMENT_BYTES: Def = Def::gauge(
    "commscope_collector_segment_bytes",
    "Bytes of Parquet segments on disk.",
    &[],
);
static STREAMS: Def = Def::gauge(
    "commscope_collector_streams",
    "Agent streams open now.",
    &[],
);
static AGENT_CONNECTED: Def = Def::gauge(
    "commscope_collector_agent_connected",
    "1 while a node's agent has a stream open; 0 once its last stream ended (the collector's log says why: a keepalive unanswered means the node or its network is gone).",
    &["node"],
);
static NODE_LAG: Def = Def::gauge(
    "commscope_collector_node_lag_seconds",
    "How far behind the wall clock the newest data applied from a node's agent is, while its stream is open: the agent's spool replaying, its stream queued behind this collector's storage, or a node with nothing to send.",
    &["node"],
);
static JOB_BEHIND: Def = Def::gauge(
    "commscope_collector_job_behind_seconds",
    "How far behind the wall clock a running job is judged: its hang and dead-rank verdicts are made as of its nodes' data, never ahead of it. Large while the collector or the agents are behind (overload, a restart catching up).",
    &["job"],
);
static NODES_OUT_OF_CONTACT: Def = Def::gauge(
    "commscope_collector_nodes_out_of_contact",
    "Nodes of running jobs with no agent stream open: their ranks are out of sight, and findings naming them are held open.",
    &[],
);
static MEMORY: Def = Def::gauge(
    "commscope_collector_memory_bytes",
    "The collector's resident memory, sampled five times a second.",
    &[],
);
static MEMORY_LIMIT: Def = Def::gauge(
    "commscope_collector_memory_limit_bytes",
    "The collector's memory bound (--memory-limit): near it, busy communicators are sampled harder; at it, record batches are refused with a retry delay.",
    &[],
);
static OVERLOAD: Def = Def::gauge(
    "commscope_collector_overload",
    "How close the collector is to its memory bound: 0 normal, 1 pressed (sampling harder), 2 full (refusing record batches, which agents send again).",
    &[],
);
static STREAMS_TOTAL: Def = Def::counter(
    "commscope_collector_streams_total",
    "Agent streams accepted.",
    &[],
);
static BAD_MESSAGES: Def = Def::counter(
    "commscope_collector_bad_messages_total",
    "Agent streams that ended with an undecodable or oversized message.",
    &[],
);
static BUDGET_HELD: Def = Def::gauge(
    "commscope_collector_ingest_budget_held_bytes",
    "Bytes of records read from the agents and not yet stored and applied (at most --ingest-budget-bytes; at it, the agents are slowed down).",
    &[],
);
static BUDGET_WAITS: Def = Def::counter(
    "commscope_collector_ingest_budget_waits_total",
    "Record batches that waited for the ingest budget (--ingest-budget-bytes) before being stored.",
    &[],
);
static REFUSED: Def = Def::counter(
    "commscope_collector_refused_total",
    "Requests refused, by reason.",
    &["reason"],
);
static OTLP_EXPORTS: Def = Def::counter(
    "commscope_collector_otlp_exports_total",
    "OTLP exports (--otlp), by signal (metrics, spans) and result (ok, error).",
    &["signal", "result"],
);
static OTLP_DROPPED: Def = Def::counter(
    "commscope_collector_otlp_spans_dropped_total",
    "Spans left out of OTLP export over its bounds (slow collective calls beyond 256 per job between exports, findings beyond 10,000 queued).",
    &[],
);
static CLOCK_OFFSET: Def = Def::gauge(
    "commscope_node_clock_offset_seconds",
    "Collector clock minus the node's clock, as the node's agent measured it.",
    &["node"],
);
static CLOCK_ERROR: Def = Def::gauge(
    "commscope_node_clock_error_seconds",
    "Bound on the error of the node's clock offset.",
    &["node"],
);
static FINDINGS_OPEN: Def = Def::gauge(
    "commscope_findings_open",
    "Open findings, by job and kind (see docs/diagnosis.md).",
    &["job_id", "namespace", "owner", "slurm_job_id", "kind"],
);
static JOBS: Def = Def::gauge(
    "commscope_collector_jobs",
    "Jobs in memory, by state.",
    &["state"],
);
static JOBS_RELEASED: Def = Def::counter(
    "commscope_collector_jobs_released_total",
    "Jobs whose state was released (ended and lingered, or evicted over the job limit).",
    &[],
);
static SAMPLE_FACTOR: Def = Def::gauge(
    "commscope_collector_sample_factor",
    "Consistent sampling: busy communicators keep 1 instance in this many (1: everything kept).",
    &[],
);
static BUDGET: Def = Def::gauge(
    "commscope_collector_sample_budget_calls_per_second",
    "Consistent sampling: the calls per second taken in full now — --sample-budget, divided near the memory bound and while running jobs' data arrives late.",
    &[],
);
static OFFERED: Def = Def::gauge(
    "commscope_collector_calls_offered_per_second",
    "Consistent sampling: calls per second the running jobs make (kept and left out), at the last policy tick.",
    &[],
);
static JOB_RANKS: Def = Def::gauge("commscope_job_ranks", "Ranks seen in the job.", J);
static JOB_RECORDS: Def = Def::counter(
    "commscope_job_records_total",
    "Records stored for the job.",
    J,
);
static JOB_SAMPLED_OUT: Def = Def::counter(
    "commscope_job_calls_sampled_out_total",
    "Calls of the job that consistent sampling left out (counted through skip records).",
    J,
);
static JOB_SAMPLED_COMMS: Def = Def::gauge(
    "commscope_job_sampled_comms",
    "Communicators of the job sampled now (modulus above 1).",
    J,
);
static JOB_AWAITING: Def = Def::gauge(
    "commscope_job_records_awaiting_order",
    "Records of the job held until every live rank's stream has passed their time, before the detectors see them.",
    J,
);
static JOB_OUT_OF_ORDER: Def = Def::counter(
    "commscope_job_records_out_of_order_total",
    "Records of the job the detectors saw out of time order: arrived behind the watermark, or handed over early from a full reorder buffer.",
    J,
);
static JOB_DROPPED: Def = Def::counter(
    "commscope_job_dropped_records_total",
    "Records the job's processes or agents could not deliver, by reason.",
    &["job_id", "namespace", "owner", "slurm_job_id", "reason"],
);
static CALLS: Def = Def::counter(
    "commscope_collective_calls_total",
    "Calls completed, one per rank per call.",
    COP,
);
static BYTES: Def = Def::counter(
    "commscope_collective_bytes_total",
    "Bytes moved by completed calls (per the op's rule in docs/trace-format.md).",
    COP,
);
static DURATION: Def = Def::histogram(
    "commscope_collective_duration_seconds",
    "Duration of completed calls: their GPU interval when they have one (NCCL), else the time inside the call (calls captured into or replayed by CUDA graphs are not timed).",
    COP,
);
static BUS_BYTES: Def = Def::counter(
    "commscope_collective_bus_bytes_total",
    "Bytes times the op's nccl-tests bus-bandwidth factor; over the duration sum, the mean bus bandwidth.",
    COP,
);
static ALGBW: Def = Def::gauge(
    "commscope_collective_algbw_bytes_per_second",
    "Moving average of the calls' algorithm bandwidth (bytes over GPU time for NCCL, host time for MPI).",
    COP,
);
static BUSBW: Def = Def::gauge(
    "commscope_collective_busbw_bytes_per_second",
    "Moving average of the calls' bus bandwidth (nccl-tests factors; 0 on one rank).",
    COP,
);
static SIZE_DURATION: Def = Def::histogram(
    "commscope_collective_size_duration_seconds",
    "Duration of completed collectives by op and message-size class, all communicators together (size: the class's upper bound).",
    &["job_id", "namespace", "owner", "slurm_job_id", "op", "size"],
);
static SIZE_BUS_BYTES: Def = Def::counter(
    "commscope_collective_size_bus_bytes_total",
    "Bus bytes of completed collectives by op and message-size class; over the duration sum, the mean bus bandwidth of that size.",
    &["job_id", "namespace", "owner", "slurm_job_id", "op", "size"],
);
static COMM_PROGRESS: Def = Def::gauge(
    "commscope_comm_progress",
    "Collectives completed in order on a communicator by its slowest and its fastest member (bound: slowest or fastest).",
    &[
        "job_id",
        "namespace",
        "owner",
        "slurm_job_id",
        "comm",
        "bound",
    ],
);
static JOB_LAG: Def = Def::gauge(
    "commscope_job_ingest_lag_seconds",
    "How long after it completed the job's latest call reached the detectors (delivery and ingest delay).",
    J,
);
static LINK_BYTES: Def = Def::counter(
    "commscope_link_bytes_total",
    "Bytes NCCL's proxy sent from one node to another (profiler plugin, proxy steps).",
    LINK,
);
static LINK_NETWORK: Def = Def::counter(
    "commscope_link_network_seconds_total",
    "Channel-seconds those sends were on the network; bytes over it is the link's per-channel rate.",
    LINK,
);
static LINK_GPU_WAIT: Def = Def::counter(
    "commscope_link_gpu_wait_seconds_total",
    "Channel-seconds those sends waited for the GPU to produce their data.",
    LINK,
);
static RANK_CALLS: Def = Def::counter(
    "commscope_rank_calls_total",
    "Calls completed by the rank.",
    RANK,
);
static RANK_IN_FLIGHT: Def = Def::gauge(
    "commscope_rank_in_flight",
    "Calls the rank has in flight (latest in-flight snapshot).",
    RANK,
);
static RANK_IN_FLIGHT_AGE: Def = Def::gauge(
    "commscope_rank_in_flight_age_seconds",
    "Age of the rank's oldest call in flight (0 when none).",
    RANK,
);
static RANK_SHARE: Def = Def::gauge(
    "commscope_rank_blame_share",
    "Share of wall time the job waits for this rank's own compute (the slow-rank detector's measure, decayed over about 30 s).",
    RANK,
);
static RANK_LATE: Def = Def::gauge(
    "commscope_rank_late_ratio",
    "Share of the rank's judged collectives in which it arrived late.",
    RANK,
);
static RANK_LAST_SEEN: Def = Def::gauge(
    "commscope_rank_last_seen_age_seconds",
    "Seconds since the collector last heard of the rank.",
    RANK,
);

/// Every family the collector exports (besides the process collector's `process_*`).
pub static CATALOG: &[&Def] = &[
    &UP,
    &AGENT_CONNECTED,
    &NODE_LAG,
    &JOB_BEHIND,
    &NODES_OUT_OF_CONTACT,
    &MEMORY,
    &MEMORY_LIMIT,
    &OVERLOAD,
    &UPTIME,
    &RECEIVED,
    &RECORDS,
    &BATCHES,
    &COMMITS,
    &COMMIT_ERRORS,
    &LOG_BYTES,
    &SEGMENTS_WRITTEN,
    &SEGMENT_ROWS,
    &SEGMENT_ERRORS,
    &SEGMENTS_DELETED,
    &SEGMENT_BYTES,
    &STREAMS,
    &STREAMS_TOTAL,
    &BAD_MESSAGES,
    &BUDGET_HELD,
    &BUDGET_WAITS,
    &REFUSED,
    &OTLP_EXPORTS,
    &OTLP_DROPPED,
    &CLOCK_OFFSET,
    &CLOCK_ERROR,
    &FINDINGS_OPEN,
    &JOBS,
    &JOBS_RELEASED,
    &SAMPLE_FACTOR,
    &BUDGET,
    &OFFERED,
    &JOB_RANKS,
    &JOB_RECORDS,
    &JOB_SAMPLED_OUT,
    &JOB_SAMPLED_COMMS,
    &JOB_AWAITING,
    &JOB_OUT_OF_ORDER,
    &JOB_DROPPED,
    &CALLS,
    &BYTES,
    &DURATION,
    &BUS_BYTES,
    &ALGBW,
    &BUSBW,
    &SIZE_DURATION,
    &SIZE_BUS_BYTES,
    &COMM_PROGRESS,
    &JOB_LAG,
    &LINK_BYTES,
    &LINK_NETWORK,
    &LINK_GPU_WAIT,
    &RANK_CALLS,
    &RANK_IN_FLIGHT,
    &RANK_IN_FLIGHT_AGE,
    &RANK_LAST_SEEN,
    &RANK_SHARE,
    &RANK_LATE,
];

/// The collector's registry: the process collector and [`CATALOG`], filled from `shared` while
/// it lives.
pub fn registry(shared: Weak<Shared>) -> prometheus::Result<prometheus::Registry> {
    commscope_telemetry::metrics::registry(CATALOG, move |sink| {
        if let Some(s) = shared.upgrade() {
            fill(&s, sink);
        }
    })
}

/// The exposition text of every series.
pub fn render(s: &Arc<Shared>) -> String {
    match s.registry.get() {
        Some(r) => commscope_telemetry::metrics::encode(r),
        None => String::new(),
    }
}

fn fill(s: &Shared, o: &mut Sink) {
    ingest(s, o);
    clocks(s, o);
    findings(s, o);
    // Every shard at once: one consistent scrape, jobs in name order.
    let shards: Vec<_> = s.state.iter().collect();
    let mut jobs: Vec<_> = shards.iter().flat_map(|st| st.jobs.values()).collect();
    let running = jobs.iter().filter(|j| j.ended.is_none()).count();
    o.value(&JOBS, &["running"], running as f64);
    o.value(&JOBS, &["ended"], (jobs.len() - running) as f64);
    let released: u64 = shards.iter().map(|st| st.released + st.evicted).sum();
    o.value(&JOBS_RELEASED, &[], released as f64);
    jobs.sort_by(|a, b| a.job.cmp(&b.job));
    let now = now_ns();
    for j in jobs {
        job(j, o);
        collectives(j, o);
        links(j, o);
        ranks(j, now, o);
    }
}

fn ingest(s: &Shared, o: &mut Sink) {
    let st = s.store.stats();
    let m = &s.metrics;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
    o.value(&UP, &[], 1.0);
    o.value(&UPTIME, &[], s.started.elapsed().as_secs_f64());
    o.value(&RECEIVED, &[], load(&m.records_in));
    for (k, v) in [
        ("stored", st.records_stored),
        ("duplicate", st.records_duplicate),
        ("invalid", st.records_invalid),
    ] {
        o.value(&RECORDS, &[k], v as f64);
    }
    for (def, v) in [
        (&BATCHES, st.batches),
        (&COMMITS, st.commits),
        (&COMMIT_ERRORS, st.commit_errors),
        (&LOG_BYTES, st.log_bytes),
        (&SEGMENTS_WRITTEN, st.segments_written),
        (&SEGMENT_ROWS, st.segment_rows),
        (&SEGMENT_ERRORS, st.segment_errors),
        (&SEGMENTS_DELETED, st.segments_deleted),
        (&SEGMENT_BYTES, st.segment_bytes),
    ] {
        o.value(def, &[], v as f64);
    }
    o.value(&STREAMS_TOTAL, &[], load(&m.streams_total));
    o.value(&BAD_MESSAGES, &[], load(&m.bad_messages));
    o.value(&STREAMS, &[], load(&m.streams_open));
    o.value(&BUDGET_HELD, &[], s.budget_held_bytes() as f64);
    o.value(&BUDGET_WAITS, &[], load(&m.budget_waits));
    let now = crate::state::now_ns();
    let nodes = s
        .contact
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .nodes()
        .clone();
    for (node, l) in &nodes {
        o.value(
            &AGENT_CONNECTED,
            &[node],
            f64::from(u8::from(l.streams > 0)),
        );
        if l.streams > 0 {
            o.value(&NODE_LAG, &[node], l.lag_ns(now) as f64 / 1e9);
        }
    }
    let standing = s
        .findings
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .standing();
    o.value(
        &NODES_OUT_OF_CONTACT,
        &[],
        standing.out_of_contact.len() as f64,
    );
    for (job, behind_ns) in &standing.behind_ns {
        o.value(&JOB_BEHIND, &[job], *behind_ns as f64 / 1e9);
    }
    o.value(&MEMORY, &[], s.memory.rss() as f64);
    o.value(&MEMORY_LIMIT, &[], s.memory.limit as f64);
    o.value(&OVERLOAD, &[], f64::from(s.memory.pressure() as u8));
    let refusals: Vec<(&'static str, u64)> = m
        .refusals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| (*k, *v))
        .collect();
    for (reason, n) in refusals {
        o.value(&REFUSED, &[reason], n as f64);
    }
    if s.config.otlp.is_some() {
        let exports: Vec<((&'static str, &'static str), u64)> = m
            .otlp_exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        for ((signal, result), n) in exports {
            o.value(&OTLP_EXPORTS, &[signal, result], n as f64);
        }
        o.value(&OTLP_DROPPED, &[], load(&m.otlp_spans_dropped));
    }
    let p = s.sampling.lock().unwrap_or_else(|p| p.into_inner());
    o.value(&SAMPLE_FACTOR, &[], p.factor.max(1) as f64);
    o.value(&OFFERED, &[], p.offered.round());
    o.value(&BUDGET, &[], p.budget.round());
}

fn clocks(s: &Shared, o: &mut Sink) {
    let c = s.clocks.lock().unwrap_or_else(|p| p.into_inner());
    for (node, a) in c.iter() {
        o.value(&CLOCK_OFFSET, &[node], a.offset_ns as f64 / 1e9);
        o.value(&CLOCK_ERROR, &[node], a.error_ns as f64 / 1e9);
    }
}

/// Every kind for every job in memory, 0 when none is open, so that dashboards and alert
/// rules see a series before the first finding.
fn findings(s: &Shared, o: &mut Sink) {
    let mut n: BTreeMap<(String, &'static str), u64> = Default::default();
    let mut attribution: HashMap<String, JobAttribution> = HashMap::new();
    for st in s.state.iter() {
        for (name, j) in &st.jobs {
            for k in FindingKind::ALL {
                n.insert((name.clone(), k.name()), 0);
            }
            attribution.insert(name.clone(), j.attribution.clone());
        }
    }
    {
        let e = s.findings.lock().unwrap_or_else(|p| p.into_inner());
        for f in e.tracker.open.values() {
            *n.entry((f.job.clone(), f.kind.name())).or_default() += 1;
        }
    }
    let none = JobAttribution::default();
    for ((job, kind), c) in n {
        let a = attribution.get(&job).unwrap_or(&none);
        JobSink::new(o, &job, a).value(&FINDINGS_OPEN, &[kind], c as f64);
    }
}

/// Writes one job's series: its `job_id` and attribution labels, then the family's own.
struct JobSink<'a> {
    o: &'a mut Sink,
    head: [&'a str; 4],
}

impl<'a> JobSink<'a> {
    fn new(o: &'a mut Sink, job: &'a str, a: &'a JobAttribution) -> JobSink<'a> {
        let [ns, owner, slurm] = a.labels();
        JobSink {
            o,
            head: [job, ns, owner, slurm],
        }
    }

    fn labels<'l>(&self, rest: &[&'l str]) -> Vec<&'l str>
    where
        'a: 'l,
    {
        let mut l = self.head.to_vec();
        l.extend_from_slice(rest);
        l
    }

    fn value(&mut self, def: &'static Def, rest: &[&str], v: f64) {
        let l = self.labels(rest);
        self.o.value(def, &l, v);
    }

    fn histogram(&mut self, def: &'static Def, rest: &[&str], s: &OpStats) {
        let l = self.labels(rest);
        self.o
            .histogram(def, &l, &BUCKETS, &s.buckets, s.timed, s.duration_sum_s);
    }
}

fn job(j: &JobState, o: &mut Sink) {
    let mut o = JobSink::new(o, &j.job, &j.attribution);
    o.value(&JOB_RANKS, &[], j.rank_count() as f64);
    o.value(&JOB_RECORDS, &[], j.records as f64);
    o.value(&JOB_SAMPLED_OUT, &[], j.sampled_out as f64);
    o.value(&JOB_SAMPLED_COMMS, &[], j.sampled_comms as f64);
    o.value(&JOB_AWAITING, &[], j.reorder.len() as f64);
    o.value(
        &JOB_OUT_OF_ORDER,
        &[],
        (j.reorder.late + j.reorder.forced) as f64,
    );
    o.value(&JOB_LAG, &[], j.lag_ns as f64 / 1e9);
    let mut d = [0u64; 4];
    for r in j.ranks.values() {
        d[0] += r.dropped_ring_full;
        d[1] += r.dropped_in_flight;
        d[2] += r.dropped_other;
        d[3] += r.dropped_overrun;
    }
    for (reason, v) in ["ring_full", "in_flight_table", "other", "overrun"]
        .into_iter()
        .zip(d)
    {
        o.value(&JOB_DROPPED, &[reason], v as f64);
    }
}

fn add_stats(e: &mut OpStats, s: &OpStats) {
    e.calls += s.calls;
    e.timed += s.timed;
    e.bytes += s.bytes;
    e.duration_sum_s += s.duration_sum_s;
    e.bus_bytes += s.bus_bytes;
    e.algbw_avg = e.algbw_avg.max(s.algbw_avg);
    e.busbw_avg = e.busbw_avg.max(s.busbw_avg);
    for (k, b) in s.buckets.iter().enumerate() {
        e.buckets[k] += b;
    }
}

fn collectives(j: &JobState, o: &mut Sink) {
    let mut o = JobSink::new(o, &j.job, &j.attribution);
    let mut comms: Vec<(u64, u64)> = j
        .comms
        .iter()
        .map(|(id, c)| (*id, c.ops.values().map(|s| s.calls).sum()))
        .collect();
    comms.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut other: BTreeMap<u8, OpStats> = Default::default();
    for (i, (id, _)) in comms.iter().enumerate() {
        let c = &j.comms[id];
        let mut ops: Vec<_> = c.ops.iter().collect();
        ops.sort_by_key(|(op, _)| **op);
        for (op, s) in ops {
            if i >= MAX_COMM_SERIES {
                add_stats(other.entry(*op).or_default(), s);
            } else {
                op_series(&format_comm_id(*id), *op, s, &mut o);
            }
        }
    }
    for (op, s) in &other {
        op_series("other", *op, s, &mut o);
    }
    for ((op, size), s) in &j.by_size {
        let l = [Op::from_code(*op).name(), SIZE_CLASSES[*size as usize].1];
        o.histogram(&SIZE_DURATION, &l, s);
        o.value(&SIZE_BUS_BYTES, &l, s.bus_bytes.round());
    }
    for (id, _) in comms.iter().take(MAX_COMM_SERIES) {
        let c = &j.comms[id];
        let (Some(lo), Some(hi)) = (c.progress.values().min(), c.progress.values().max()) else {
            continue;
        };
        let comm = format_comm_id(*id);
        o.value(&COMM_PROGRESS, &[&comm, "slowest"], *lo as f64);
        o.value(&COMM_PROGRESS, &[&comm, "fastest"], *hi as f64);
    }
}

fn op_series(comm: &str, op: u8, s: &OpStats, o: &mut JobSink) {
    let l = [comm, Op::from_code(op).name()];
    o.value(&CALLS, &l, s.calls as f64);
    o.value(&BYTES, &l, s.bytes as f64);
    o.histogram(&DURATION, &l, s);
    o.value(&BUS_BYTES, &l, s.bus_bytes.round());
    if s.algbw_avg > 0.0 {
        o.value(&ALGBW, &l, s.algbw_avg.round());
        o.value(&BUSBW, &l, s.busbw_avg.round());
    }
}

/// Per (sending node, receiving node): NCCL's step-timed proxy sends.
fn links(j: &JobState, o: &mut Sink) {
    let mut o = JobSink::new(o, &j.job, &j.attribution);
    let pairs = j.detectors.node_pairs();
    let mut emit = |p: &NodePair| {
        let l = [p.src.as_str(), p.dst.as_str()];
        o.value(&LINK_BYTES, &l, p.bytes as f64);
        o.value(&LINK_NETWORK, &l, p.net_ns as f64 / 1e9);
        o.value(&LINK_GPU_WAIT, &l, p.gpu_wait_ns as f64 / 1e9);
    };
    let mut rest = NodePair {
        src: "other".into(),
        dst: "other".into(),
        ..Default::default()
    };
    for (i, p) in pairs.iter().enumerate() {
        if i < MAX_LINK_SERIES {
            emit(p);
        } else {
            rest.bytes += p.bytes;
            rest.net_ns += p.net_ns;
            rest.gpu_wait_ns += p.gpu_wait_ns;
        }
    }
    if pairs.len() > MAX_LINK_SERIES {
        emit(&rest);
    }
}

fn ranks(j: &JobState, now: u64, o: &mut Sink) {
    let mut o = JobSink::new(o, &j.job, &j.attribution);
    let health: HashMap<i32, (f64, f64)> = j
        .detectors
        .health()
        .iter()
        .map(|h| (h.rank, (h.share, h.late_ratio)))
        .collect();
    for r in j.ranks.values().take(MAX_RANK_SERIES) {
        let rank = r.rank.to_string();
        let l = [rank.as_str(), r.node.as_str(), r.pod.as_str()];
        let live = r.live_in_flight();
        o.value(&RANK_CALLS, &l, r.calls as f64);
        o.value(&RANK_IN_FLIGHT, &l, live.len() as f64);
        let oldest = live.iter().map(|c| c.for_s).fold(0.0, f64::max);
        o.value(&RANK_IN_FLIGHT_AGE, &l, oldest);
        o.value(
            &RANK_LAST_SEEN,
            &l,
            now.saturating_sub(r.last_seen_ns) as f64 / 1e9,
        );
        if let Some((share, late)) = health.get(&r.rank) {
            o.value(&RANK_SHARE, &l, *share);
            o.value(&RANK_LATE, &l, *late);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_metrics_md_matches_the_registry() {
        let doc = include_str!("../../docs/metrics.md");
        let problems = commscope_telemetry::metrics::check_doc(doc, "Collector", CATALOG);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn the_catalog_registers() {
        let r = registry(Weak::new()).expect("a valid catalog");
        // Nothing to fill from: only the process collector's families.
        assert!(
            commscope_telemetry::metrics::names(&r)
                .iter()
                .all(|n| n.starts_with("process_"))
        );
    }
}
