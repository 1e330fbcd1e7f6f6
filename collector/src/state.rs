//! Live per-job state: jobs, nodes, ranks, communicators with their members and progress,
//! calls in flight, per-(comm, op) statistics. Bounded: at most [`Limits::max_jobs`] jobs
//! (ended jobs are released first, then the least recently seen), at most
//! [`Limits::max_comms_per_job`] communicators per job (further ones are counted, not kept).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use commscope_analyzer::reorder::Reorder;
use commscope_analyzer::stream::{Detectors, Tuning};
use commscope_wire::cst::Header;
use commscope_wire::hash::format_comm_id;
use commscope_wire::op::{Op, flags};
use commscope_wire::parquet::ClockAlignment;
use commscope_wire::record::{Call, CommEvent, EXIT_STATUS_UNKNOWN, ProcessEvent, Record};
use serde::Serialize;

use crate::store::ProcessKey;

/// How often a job's reorder buffer hands records to its detectors (arrival time).
const RELEASE_EVERY_NS: u64 = 100_000_000;

/// Bounds on what is kept.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_jobs: usize,
    pub max_comms_per_job: usize,
    /// How long an ended job stays visible before its state is released.
    pub linger: Duration,
    /// Keep slow collective calls for export as spans (OTLP), at most this many per job
    /// between exports (0: none).
    pub slow_calls: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_jobs: 256,
            max_comms_per_job: 4096,
            linger: Duration::from_secs(300),
            slow_calls: 0,
        }
    }
}

/// Upper bounds (seconds) of the duration histogram buckets.
pub const BUCKETS: [f64; 14] = [
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0,
];

/// Per (communicator, op) statistics.
#[derive(Clone, Debug, Default)]
pub struct OpStats {
    pub calls: u64,
    /// Calls whose duration counts (not those captured into, or replayed by, a CUDA graph: their
    /// time is the capture's, or the whole graph's): the histogram's count.
    pub timed: u64,
    pub bytes: u64,
    /// Σ bytes × the op's bus-bandwidth factor (nccl-tests): over `duration_sum_s`, the mean bus
    /// bandwidth.
    pub bus_bytes: f64,
    /// Moving averages (weight 1/20 per call) of the calls' algorithm and bus bandwidth, bytes/s.
    pub algbw_avg: f64,
    pub busbw_avg: f64,
    pub duration_sum_s: f64,
    /// Cumulative counts per bucket of [`BUCKETS`] (plus +Inf = `timed`).
    pub buckets: [u64; BUCKETS.len()],
}

impl OpStats {
    /// Counts a completed call; returns its duration (s) when it is timed.
    pub fn add(&mut self, c: &Call, op: Op) -> Option<f64> {
        self.calls += 1;
        self.bytes += c.bytes;
        // A call captured into (or replayed by) a CUDA graph, or seen only from the host by
        // uprobes, is counted, not timed.
        if !c.timed() {
            return None;
        }
        self.timed += 1;
        let d = c.span_ns() as f64 / 1e9;
        self.duration_sum_s += d;
        if let Some(f) = commscope_wire::op::busbw_factor(op, c.comm_size) {
            self.bus_bytes += c.bytes as f64 * f;
        }
        if let (Some(a), Some(b)) = (c.algbw(), c.busbw()) {
            const W: f64 = 0.05;
            if self.algbw_avg == 0.0 {
                (self.algbw_avg, self.busbw_avg) = (a, b);
            } else {
                self.algbw_avg += W * (a - self.algbw_avg);
                self.busbw_avg += W * (b - self.busbw_avg);
            }
        }
        for (i, b) in BUCKETS.iter().enumerate() {
            if d <= *b {
                self.buckets[i] += 1;
            }
        }
        Some(d)
    }
}

/// A collective call much slower than its communicator's usual for that op: at least
/// [`SLOW_CALL_FACTOR`] times the mean of the calls before it, and at least [`SLOW_CALL_MIN_S`].
#[derive(Clone, Debug, PartialEq)]
pub struct SlowCall {
    pub rank: i32,
    pub node: String,
    pub comm_id: u64,
    pub seq: u64,
    pub op: u8,
    pub bytes: u64,
    /// Collector time (ns since the epoch).
    pub start_ns: u64,
    pub end_ns: u64,
    /// The communicator's mean for the op before it (s).
    pub usual_s: f64,
}

/// A collective call is slow at this many times its communicator's mean for the op …
pub const SLOW_CALL_FACTOR: f64 = 4.0;
/// … and this long at least (s), after at least [`SLOW_CALL_AFTER`] timed calls.
pub const SLOW_CALL_MIN_S: f64 = 0.005;
pub const SLOW_CALL_AFTER: u64 = 16;

/// Message-size classes of the per-size series: a call falls in the first class whose bound
/// (bytes) it does not exceed; the last is unbounded.
pub const SIZE_CLASSES: [(u64, &str); 6] = [
    (1 << 10, "1KiB"),
    (16 << 10, "16KiB"),
    (256 << 10, "256KiB"),
    (4 << 20, "4MiB"),
    (64 << 20, "64MiB"),
    (u64::MAX, "+Inf"),
];

/// The size class (index into [`SIZE_CLASSES`]) of a call of `bytes`.
pub fn size_class(bytes: u64) -> u8 {
    SIZE_CLASSES
        .iter()
        .position(|(b, _)| bytes <= *b)
        .unwrap_or(5) as u8
}

/// How a rank's process stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RankStatus {
    Running,
    Finalized,
    Exited,
    Killed,
}

impl RankStatus {
    pub fn name(self) -> &'static str {
        match self {
            RankStatus::Running => "running",
            RankStatus::Finalized => "finalized",
            RankStatus::Exited => "exited",
            RankStatus::Killed => "killed",
        }
    }
    fn terminal(self) -> bool {
        self != RankStatus::Running
    }
}

/// One traced process.
#[derive(Clone, Debug)]
pub struct RankInfo {
    pub rank: i32,
    pub node: String,
    pub pid: u32,
    pub start_time: u64,
    pub status: RankStatus,
    /// It shut down cleanly (final heartbeat or its own exit record) before it ended.
    pub finalized: bool,
    pub exit_status: Option<i32>,
    pub signal: Option<i32>,
    /// Who sent that signal, when the agent saw it.
    pub sent_by: Option<commscope_analyzer::view::Sender>,
    /// When the agent saw the process end (its realtime clock, ns), and whether it was inside
    /// a communication call then.
    pub ended_at_ns: Option<u64>,
    pub died_in_call: bool,
    /// When its exit arrived here.
    pub exit_arrived: Option<Instant>,
    /// The end the process recorded itself (exit without finalizing, `MPI_Abort`, a fatal
    /// signal), on the records' clock: how it ended, and when it began to, once its agent
    /// confirms it is gone.
    pub own_end: Option<commscope_analyzer::view::Ending>,
    /// Its stacks, when its agent took them (a hang's culprit).
    pub stacks: Option<Stacks>,
    /// The process as its agent last saw it, and when its CPU time last grew.
    pub proc: Option<ProcSample>,
    pub cpu_advanced_at: Option<Instant>,
    pub records: u64,
    pub calls: u64,
    /// Collector time (ns since the epoch) of the last record or snapshot.
    pub last_seen_ns: u64,
    pub dropped_ring_full: u64,
    pub dropped_in_flight: u64,
    pub dropped_other: u64,
    /// Dropped by the agent (ring overrun), from its batches.
    pub dropped_overrun: u64,
    pub clock: Option<ClockAlignment>,
    pub mono_anchor: u64,
    pub real_anchor: u64,
    /// Calls in flight at the latest snapshot, with the snapshot's host time (kept after the
    /// process ended: what it was inside then).
    pub in_flight: Vec<InFlightCall>,
    /// Realtime (collector clock, ns) of the last record the process itself wrote.
    pub last_heard_ns: u64,
    pub snapshot_mono: u64,
    /// The latest snapshot's time on the collector's clock (realtime ns; 0: none): with
    /// `last_heard_ns`, how far its data is complete.
    pub snapshot_real: u64,
    /// When the latest snapshot arrived (ages grow from there).
    pub snapshot_at: Option<Instant>,
    /// Its latest completed calls (at most [`RECENT_CALLS`]), oldest first.
    pub recent: std::collections::VecDeque<RecentCall>,
    /// Its Kubernetes pod and container, when its agent named them.
    pub pod: String,
    pub container: String,
}

/// Completed calls each rank keeps for the operator's rank view.
pub const RECENT_CALLS: usize = 32;

/// A completed call, as the rank view shows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecentCall {
    pub comm_id: u64,
    pub seq: u64,
    pub op: u8,
    pub bytes: u64,
    pub duration_ns: u64,
    /// Collector time of its end (ns since the epoch).
    pub end_ns: u64,
    pub peer: i32,
}

impl RankInfo {
    /// Calls in flight now: none once the process ended.
    pub fn live_in_flight(&self) -> &[InFlightCall] {
        if self.status == RankStatus::Running {
            &self.in_flight
        } else {
            &[]
        }
    }

    /// Records lost for this process, every reason together.
    pub fn dropped(&self) -> u64 {
        self.dropped_ring_full + self.dropped_in_flight + self.dropped_other + self.dropped_overrun
    }
}

/// A call in flight (from an agent's snapshot of the in-flight table).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InFlightCall {
    pub rank: i32,
    #[serde(serialize_with = "ser_comm")]
    pub comm_id: u64,
    pub seq: u64,
    pub op: String,
    /// Host monotonic time the call entered.
    #[serde(skip)]
    pub t_enter: u64,
    pub bytes: u64,
    pub peer: i32,
    /// Point-to-point: the tag (-1 for a collective).
    pub tag: i32,
    /// A nonblocking request posted and not yet seen complete.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub posted: bool,
    /// Age at the snapshot, in seconds.
    pub for_s: f64,
    /// Seen from the host only (a process recorded without the preload): the rank's latest
    /// collective on the communicator, issued, its completion unknown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub issued_only: bool,
    /// Elements, datatype and reduction codes (0: not known), and the record's flags: with op,
    /// bytes and peer (the root), what members of a collective instance must agree on.
    #[serde(skip)]
    pub count: u64,
    #[serde(skip)]
    pub dtype: u16,
    #[serde(skip)]
    pub red_op: u8,
}

impl InFlightCall {
    /// The collective's signature as far as the snapshot tells.
    pub fn shape(&self, op: Op) -> commscope_analyzer::stream::Shape {
        commscope_analyzer::stream::Shape::of(op, self.bytes, self.peer, self.dtype, 0)
            .reducing(self.red_op)
    }
}

fn ser_comm<S: serde::Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_comm_id(*id))
}

/// A process's stacks as its agent took them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stacks {
    pub native: String,
    pub python: String,
    /// Why a stack is missing.
    pub error: String,
    pub at_ns: u64,
}

/// A process's kernel state (from its agent's snapshots).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcSample {
    /// "R", "S", "D", …
    pub state: String,
    pub wchan: String,
    pub cpu_ns: u64,
}

impl RankInfo {
    /// The process's state for evidence: state letter, wait channel, whether its CPU time grew
    /// in the last 2 s.
    pub fn proc_evidence(&self) -> serde_json::Value {
        match &self.proc {
            None => serde_json::Value::Null,
            Some(p) => serde_json::json!({
                "state": p.state,
                "state_name": state_name(&p.state),
                "wchan": p.wchan,
                "cpu_s": p.cpu_ns as f64 / 1e9,
                "cpu_advancing": self.cpu_advanced_at.is_some_and(|t| t.elapsed() < Duration::from_secs(2)),
            }),
        }
    }
}

pub use commscope_analyzer::detectors::hang::state_name;

/// One communicator.
#[derive(Clone, Debug, Default)]
pub struct CommInfo {
    pub name: String,
    pub size: i32,
    /// Global rank → collectives completed in order (highest completed `seq` + 1).
    pub progress: BTreeMap<i32, u64>,
    /// Rank in the communicator → global rank.
    pub members: BTreeMap<i32, i32>,
    /// Longest completed blocking call on it (seconds): the hang threshold adapts to it.
    pub max_duration_s: f64,
    pub ops: HashMap<u8, OpStats>,
    pub p2p_sends: u64,
    pub p2p_recvs: u64,
    pub local_id: bool,
    /// Consistent sampling: the modulus its latest skip was left out under (1: none).
    pub modulus: u32,
}

/// One job.
#[derive(Debug)]
pub struct JobState {
    pub job: String,
    pub flavour: String,
    pub world_size: i32,
    pub ranks: BTreeMap<ProcessKey, RankInfo>,
    pub comms: HashMap<u64, CommInfo>,
    pub comms_dropped: u64,
    pub records: u64,
    pub first_seen_ns: u64,
    pub last_seen_ns: u64,
    pub ended: Option<Instant>,
    pub(crate) last_touch: Instant,
    /// The instance detectors (slow-rank, degraded-collective, mismatch, comm-error), fed in
    /// time order through `reorder`.
    pub detectors: Detectors,
    pub reorder: Reorder,
    /// When `reorder` last handed records over (arrival time, ns).
    released_at: u64,
    /// Consistent sampling: calls left out by agents (counted in their skips), communicators
    /// sampled now.
    pub sampled_out: u64,
    pub sampled_comms: u64,
    /// How far the records' own time trailed arrival at the latest call (ns): the detectors run
    /// on record time, and a quiet job's clock moves on with arrival time less this.
    pub lag_ns: u64,
    /// Per (op, size class): collectives' statistics, all communicators together.
    pub by_size: BTreeMap<(u8, u8), OpStats>,
    /// Slow collective calls not yet exported ([`SlowCall`]), and those left out over the
    /// per-export bound.
    pub slow_calls: Vec<SlowCall>,
    pub slow_calls_dropped: u64,
    /// Its namespace, owner, Slurm job and torchrun run, from its processes' attribution.
    pub attribution: JobAttribution,
}

/// A job's place in the cluster's schedulers: each field as the first of its processes to know
/// it named it (they agree; a process that knows less does not blank it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct JobAttribution {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The workload behind its pods, "Kind/name".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub slurm_job_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub torchrun_run_id: String,
}

impl JobAttribution {
    pub fn is_empty(&self) -> bool {
        *self == JobAttribution::default()
    }

    /// Fills what is still unknown from one process's attribution.
    fn merge(&mut self, a: &commscope_wire::grpc::Attribution) {
        for (have, new) in [
            (&mut self.namespace, &a.namespace),
            (&mut self.owner, &a.owner),
            (&mut self.slurm_job_id, &a.slurm_job_id),
            (&mut self.torchrun_run_id, &a.torchrun_run_id),
        ] {
            if have.is_empty() && !new.is_empty() {
                have.clone_from(new);
            }
        }
    }

    /// The metric labels it gives every per-job series: `namespace`, `owner`, `slurm_job_id`
    /// (empty when unknown, which Prometheus stores as no label).
    pub fn labels(&self) -> [&str; 3] {
        [&self.namespace, &self.owner, &self.slurm_job_id]
    }
}

impl JobState {
    fn new(job: &str, now_ns: u64) -> JobState {
        JobState {
            job: job.to_owned(),
            flavour: String::new(),
            world_size: 0,
            ranks: BTreeMap::new(),
            comms: HashMap::new(),
            comms_dropped: 0,
            records: 0,
            first_seen_ns: now_ns,
            last_seen_ns: now_ns,
            ended: None,
            last_touch: Instant::now(),
            detectors: Detectors::new(job, Tuning::default()),
            reorder: Reorder::default(),
            released_at: 0,
            sampled_out: 0,
            sampled_comms: 0,
            lag_ns: 0,
            by_size: BTreeMap::new(),
            slow_calls: Vec::new(),
            slow_calls_dropped: 0,
            attribution: JobAttribution::default(),
        }
    }

    /// Whether ranks are ending right now (an exit arrived within the last second): who died
    /// first, and who only followed, is not known yet.
    pub fn in_flux(&self) -> bool {
        self.ranks.values().any(|r| {
            r.exit_arrived
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        })
    }

    /// The instance detectors' findings now; calls in flight join the mismatch check.
    pub fn instance_findings(&mut self, now: u64) -> Vec<commscope_analyzer::Finding> {
        let reached = self.release(now);
        self.detectors.advance(reached);
        let comms = &self.comms;
        let calls: Vec<(i32, u64, u64, commscope_analyzer::stream::Shape, usize)> = self
            .ranks
            .values()
            .flat_map(|r| r.live_in_flight().iter())
            .filter_map(|c| {
                let op = Op::from_name(&c.op)?;
                let size = comms.get(&c.comm_id).map_or(0, |m| m.size.max(0) as usize);
                (!op.is_p2p()).then(|| (c.rank, c.comm_id, c.seq, c.shape(op), size))
            })
            .collect();
        self.detectors.in_flight_shapes(calls);
        self.detectors.findings()
    }

    /// The job's present on its records' clock: arrival time less the latest lag.
    fn record_now(&self, now: u64) -> u64 {
        now.saturating_sub(self.lag_ns)
    }

    /// Hands the detectors what every live rank's stream has passed (everything once the job
    /// ended); returns how far the detectors' time may go.
    fn release(&mut self, now: u64) -> u64 {
        self.released_at = now;
        let t = self.record_now(now);
        if self.ended.is_some() || self.all_exited() {
            self.reorder.release_all(&mut self.detectors);
            t
        } else {
            self.reorder.release(t, &mut self.detectors)
        }
    }

    /// "running" or "ended".
    pub fn state_name(&self) -> &'static str {
        if self.ended.is_some() {
            "ended"
        } else {
            "running"
        }
    }

    /// Distinct global ranks seen.
    pub fn rank_count(&self) -> usize {
        let mut r: Vec<i32> = self.ranks.values().map(|r| r.rank).collect();
        r.sort_unstable();
        r.dedup();
        r.len()
    }

    /// Node names, sorted.
    pub fn nodes(&self) -> Vec<String> {
        let mut n: Vec<String> = self.ranks.values().map(|r| r.node.clone()).collect();
        n.sort();
        n.dedup();
        n
    }

    /// Calls in flight across ranks (latest snapshots).
    pub fn in_flight(&self) -> Vec<InFlightCall> {
        let mut v: Vec<InFlightCall> = self
            .ranks
            .values()
            .flat_map(|r| r.live_in_flight().iter().cloned())
            .collect();
        v.sort_by_key(|c| (c.rank, c.comm_id, c.seq));
        v
    }

    /// Records dropped, all reasons.
    pub fn dropped(&self) -> u64 {
        self.ranks.values().map(RankInfo::dropped).sum()
    }

    /// Every rank of the job is known and its process has ended (an agent saw it go).
    fn all_exited(&self) -> bool {
        // The cheap test first: a running job fails it at its first rank.
        self.ranks
            .values()
            .all(|r| matches!(r.status, RankStatus::Exited | RankStatus::Killed))
            && self.complete()
    }

    /// Every rank of the job is known and finalized or gone.
    fn all_terminal(&self) -> bool {
        self.ranks.values().all(|r| r.status.terminal()) && self.complete()
    }

    fn complete(&self) -> bool {
        !self.ranks.is_empty()
            && (self.world_size <= 0 || self.rank_count() >= self.world_size as usize)
    }
}

/// Everything the collector knows live.
#[derive(Debug, Default)]
pub struct State {
    pub jobs: HashMap<String, JobState>,
    pub limits: Limits,
    /// Jobs released (ended and lingered, or evicted over the limit).
    pub released: u64,
    pub evicted: u64,
}

/// Wall clock in ns since the epoch.
/// When a record of `header`'s process happened, on the collector's clock: its host-mono time
/// `t_mono` through the process's clock anchors and the node's `offset`; never ahead of `now`
/// (arrival), at most a minute behind it; `now` when the time is unknown.
fn event_time(header: &Header, offset: i64, now: u64, t_mono: u64) -> u64 {
    if header.mono_anchor == 0 || header.real_anchor == 0 || t_mono == 0 {
        return now;
    }
    let real = i128::from(header.real_anchor) + i128::from(t_mono) - i128::from(header.mono_anchor)
        + i128::from(offset);
    real.clamp(
        i128::from(now.saturating_sub(60_000_000_000)),
        i128::from(now),
    ) as u64
}

pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl State {
    pub fn new(limits: Limits) -> State {
        State {
            limits,
            ..Default::default()
        }
    }

    fn job_mut(&mut self, job: &str) -> &mut JobState {
        if !self.jobs.contains_key(job) && self.jobs.len() >= self.limits.max_jobs {
            self.evict_one();
        }
        let now = now_ns();
        self.jobs
            .entry(job.to_owned())
            .or_insert_with(|| JobState::new(job, now))
    }

    fn evict_one(&mut self) {
        let victim = self
            .jobs
            .values()
            .min_by_key(|j| (j.ended.is_none(), j.last_touch))
            .map(|j| j.job.clone());
        if let Some(v) = victim {
            self.jobs.remove(&v);
            self.evicted += 1;
        }
    }

    /// One process's attribution (sent with its batches): its job's namespace, owner and
    /// scheduler ids, its own pod and container.
    pub fn attribute(&mut self, header: &Header, a: &commscope_wire::grpc::Attribution) {
        let Some(job) = self.jobs.get_mut(&header.job) else {
            return;
        };
        job.attribution.merge(a);
        if let Some(r) = job.ranks.get_mut(&ProcessKey::of(header))
            && r.pod.is_empty()
            && !a.pod.is_empty()
        {
            r.pod.clone_from(&a.pod);
            r.container.clone_from(&a.container);
        }
    }

    /// Applies stored records of one process. Returns whether the job just ended.
    pub fn apply(
        &mut self,
        header: &Header,
        clock: Option<ClockAlignment>,
        records: &[Record],
    ) -> bool {
        let max_comms = self.limits.max_comms_per_job;
        let slow_bound = self.limits.slow_calls;
        let now = now_ns();
        let job = self.job_mut(&header.job);
        job.last_touch = Instant::now();
        job.last_seen_ns = now;
        if job.flavour.is_empty() {
            job.flavour = header.flavour.clone();
        }
        job.world_size = job.world_size.max(header.world_size);
        job.reorder.expect_ranks(job.world_size.max(0) as usize);
        job.records += records.len() as u64;
        // The node agent's transport records: not a rank of the job.
        if header.is_transport() {
            let offset = clock.map_or(0, |c| c.offset_ns);
            for r in records {
                match r {
                    Record::Flow(f) => job
                        .detectors
                        .flow(f, event_time(header, offset, now, f.t_end)),
                    Record::LinkEvent(e) => job.detectors.link_event(
                        &header.node,
                        e,
                        event_time(header, offset, now, e.t),
                    ),
                    _ => {}
                }
            }
            return false;
        }
        let key = ProcessKey::of(header);
        let rank = job.ranks.entry(key).or_insert_with(|| RankInfo {
            rank: header.rank,
            node: header.node.clone(),
            pid: header.pid,
            start_time: header.start_time,
            status: RankStatus::Running,
            finalized: false,
            exit_status: None,
            signal: None,
            sent_by: None,
            ended_at_ns: None,
            died_in_call: false,
            records: 0,
            calls: 0,
            last_seen_ns: now,
            dropped_ring_full: 0,
            dropped_in_flight: 0,
            dropped_other: 0,
            dropped_overrun: 0,
            clock: None,
            mono_anchor: header.mono_anchor,
            real_anchor: header.real_anchor,
            in_flight: Vec::new(),
            last_heard_ns: 0,
            snapshot_mono: 0,
            snapshot_real: 0,
            snapshot_at: None,
            recent: std::collections::VecDeque::new(),
            proc: None,
            cpu_advanced_at: None,
            stacks: None,
            exit_arrived: None,
            own_end: None,
            pod: String::new(),
            container: String::new(),
        });
        rank.last_seen_ns = now;
        rank.records += records.len() as u64;
        if rank.records == records.len() as u64 {
            job.detectors.rank_node(header.rank, &header.node);
        }
        if clock.is_some() {
            rank.clock = clock;
        }
        // The detectors' clock: when a record happened (its host time on the collector's clock),
        // not when it arrived — agents deliver in bursts, and blame is a rate over time.
        let offset = clock.or(rank.clock).map_or(0, |c| c.offset_ns);
        let at = |t_mono: u64| event_time(header, offset, now, t_mono);
        let mut calls = 0u64;
        let mut status = rank.status;
        let mut exit = (rank.exit_status, rank.signal, rank.sent_by);
        let mut finalized = rank.finalized;
        let mut own_end = rank.own_end;
        let mut ended_at = None;
        let mut drops = None;
        let mut heard = 0u64;
        // The batch's last calls only: the rank keeps [`RECENT_CALLS`].
        let mut recent: std::collections::VecDeque<RecentCall> =
            std::collections::VecDeque::with_capacity(RECENT_CALLS);
        for r in records {
            match r {
                Record::Call(c) => {
                    calls += 1;
                    let t = if c.clock() == commscope_wire::op::Clock::HostMono {
                        at(c.span().1)
                    } else {
                        now
                    };
                    if recent.len() == RECENT_CALLS {
                        recent.pop_front();
                    }
                    recent.push_back(RecentCall {
                        comm_id: c.comm_id,
                        seq: c.seq,
                        op: c.op,
                        bytes: c.bytes,
                        duration_ns: c.span_ns(),
                        end_ns: t,
                        peer: c.peer,
                    });
                    heard = heard.max(t);
                    job.lag_ns = now - t;
                    job.reorder.call(c, t, &mut job.detectors);
                    if job.comms.len() >= max_comms && !job.comms.contains_key(&c.comm_id) {
                        job.comms_dropped += 1;
                        continue;
                    }
                    let comm = job.comms.entry(c.comm_id).or_default();
                    if c.comm_size > 0 {
                        comm.size = c.comm_size;
                    }
                    let op = c.op();
                    if op.is_p2p() {
                        match op {
                            Op::Send => comm.p2p_sends += 1,
                            Op::Recv => comm.p2p_recvs += 1,
                            _ => {
                                comm.p2p_sends += 1;
                                comm.p2p_recvs += 1;
                            }
                        }
                    } else {
                        let p = comm.progress.entry(c.rank).or_insert(0);
                        *p = (*p).max(c.seq + 1);
                    }
                    if c.flags & flags::LOCAL_COMM_ID != 0 {
                        comm.local_id = true;
                    }
                    let stats = comm.ops.entry(c.op).or_default();
                    let usual = (slow_bound > 0 && stats.timed >= SLOW_CALL_AFTER)
                        .then(|| stats.duration_sum_s / stats.timed as f64);
                    if let Some(d) = stats.add(c, op)
                        && c.flags & (flags::NONBLOCKING | flags::PERSISTENT) == 0
                    {
                        comm.max_duration_s = comm.max_duration_s.max(d);
                        if !op.is_p2p()
                            && let Some(u) = usual
                            && d >= SLOW_CALL_FACTOR * u
                            && d >= SLOW_CALL_MIN_S
                        {
                            if job.slow_calls.len() < slow_bound {
                                job.slow_calls.push(SlowCall {
                                    rank: header.rank,
                                    node: header.node.clone(),
                                    comm_id: c.comm_id,
                                    seq: c.seq,
                                    op: c.op,
                                    bytes: c.bytes,
                                    start_ns: t.saturating_sub((d * 1e9) as u64),
                                    end_ns: t,
                                    usual_s: u,
                                });
                            } else {
                                job.slow_calls_dropped += 1;
                            }
                        }
                    }
                    if !op.is_p2p() {
                        job.by_size
                            .entry((c.op, size_class(c.bytes)))
                            .or_default()
                            .add(c, op);
                    }
                }
                Record::Link(l) => job.detectors.link(l, at(l.t_end)),
                Record::Flow(f) => job.detectors.flow(f, at(f.t_end)),
                // The agent's records only (handled above); never a rank's.
                Record::LinkEvent(_) => {}
                Record::Skip(k) => {
                    calls += k.calls;
                    job.sampled_out += k.calls;
                    job.reorder.skip(k, at(k.t_last), &mut job.detectors);
                    if job.comms.len() >= max_comms && !job.comms.contains_key(&k.comm_id) {
                        job.comms_dropped += 1;
                        continue;
                    }
                    let comm = job.comms.entry(k.comm_id).or_default();
                    if k.comm_size > 0 {
                        comm.size = k.comm_size;
                    }
                    comm.modulus = k.modulus;
                    let op = k.op();
                    if op.is_p2p() {
                        match op {
                            Op::Send => comm.p2p_sends += k.calls,
                            Op::Recv => comm.p2p_recvs += k.calls,
                            _ => {
                                comm.p2p_sends += k.calls;
                                comm.p2p_recvs += k.calls;
                            }
                        }
                    } else {
                        let p = comm.progress.entry(k.rank).or_insert(0);
                        *p = (*p).max(k.last_seq + 1);
                    }
                    let s = comm.ops.entry(k.op).or_default();
                    s.calls += k.calls;
                    s.bytes += k.bytes;
                    s.duration_sum_s += k.inside_ns as f64 / 1e9;
                }
                Record::Comm(c) => {
                    match c.event {
                        CommEvent::Failed => job.detectors.comm_failed(c, at(c.t)),
                        CommEvent::Created => {
                            job.detectors.comm_created(c.comm_id, c.parent, c.size)
                        }
                        _ => {}
                    }
                    if job.comms.len() >= max_comms && !job.comms.contains_key(&c.comm_id) {
                        job.comms_dropped += 1;
                        continue;
                    }
                    let comm = job.comms.entry(c.comm_id).or_default();
                    match c.event {
                        CommEvent::Created => {
                            comm.size = c.size;
                            comm.progress.entry(c.rank).or_insert(0);
                            comm.members.insert(c.comm_rank, c.rank);
                        }
                        CommEvent::Named | CommEvent::Freed | CommEvent::Failed => {}
                    }
                    if !c.name().is_empty() && c.event != CommEvent::Freed {
                        comm.name = c.name().to_owned();
                    }
                    if c.flags & flags::LOCAL_COMM_ID != 0 {
                        comm.local_id = true;
                    }
                }
                Record::Heartbeat(h) => {
                    drops = Some((h.dropped_ring_full, h.dropped_in_flight, h.dropped_other));
                    if h.flags & flags::AGENT_BEAT == 0 {
                        heard = heard.max(at(h.t_mono));
                        // Beating on a second after it recorded its end: it lived on (its own
                        // handler caught the signal), and that was no end.
                        if own_end.is_some_and(|e| at(h.t_mono) >= e.at_ns + 1_000_000_000) {
                            own_end = None;
                        }
                    }
                    job.reorder.reached(header.rank, at(h.t_mono));
                    if h.flags & flags::FINAL != 0 {
                        finalized = true;
                        if status == RankStatus::Running {
                            status = RankStatus::Finalized;
                        }
                    }
                }
                Record::Process(p) if p.event == ProcessEvent::Exit => {
                    if p.flags & flags::OBSERVED != 0 {
                        // The agent saw the process end.
                        ended_at = Some(if p.t_real > 0 { p.t_real } else { now });
                        if p.signal != 0 {
                            exit = (
                                None,
                                Some(p.signal),
                                commscope_analyzer::view::Sender::of(p),
                            );
                            status = RankStatus::Killed;
                        } else {
                            if p.exit_status != EXIT_STATUS_UNKNOWN {
                                exit.0 = Some(p.exit_status);
                            }
                            status = RankStatus::Exited;
                        }
                    } else if p.flags & flags::UNFINALIZED != 0 {
                        // The shim's own record of an unclean end: the agent confirms it.
                        let t = at(p.t_mono);
                        heard = heard.max(t);
                        own_end = Some(commscope_analyzer::view::Ending {
                            at_ns: t,
                            observed: true,
                            recorded: true,
                            status: (p.signal == 0 && p.exit_status != EXIT_STATUS_UNKNOWN)
                                .then_some(p.exit_status),
                            signal: (p.signal != 0).then_some(p.signal),
                            aborted: p.flags & flags::ABORTED != 0,
                            sent_by: None,
                        });
                    } else {
                        // The shim's own record of a clean end: MPI_Finalize.
                        finalized = true;
                        if status == RankStatus::Running {
                            status = RankStatus::Finalized;
                        }
                    }
                }
                Record::Process(p) if p.event == ProcessEvent::Network => {
                    job.detectors.network(header.rank, p.step);
                }
                Record::Process(p) if p.event == ProcessEvent::Step => {
                    job.reorder
                        .step_marker(header.rank, p.step, at(p.t_mono), &mut job.detectors);
                }
                Record::Process(_) => {}
                Record::Enter(_) => {}
            }
        }
        let rank = job
            .ranks
            .get_mut(&ProcessKey::of(header))
            .expect("inserted above");
        rank.calls += calls;
        rank.recent.extend(recent);
        while rank.recent.len() > RECENT_CALLS {
            rank.recent.pop_front();
        }
        rank.last_heard_ns = rank.last_heard_ns.max(heard);
        rank.status = status;
        rank.finalized = finalized;
        rank.own_end = own_end;
        (rank.exit_status, rank.signal, rank.sent_by) = exit;
        // The counters only grow; a batch that arrives late (spooled, resent) carries older ones.
        if let Some((a, b, c)) = drops {
            rank.dropped_ring_full = rank.dropped_ring_full.max(a);
            rank.dropped_in_flight = rank.dropped_in_flight.max(b);
            rank.dropped_other = rank.dropped_other.max(c);
        }
        if let Some(t) = ended_at {
            rank.ended_at_ns.get_or_insert(t);
            rank.exit_arrived.get_or_insert_with(Instant::now);
            // In a call when it died: its last snapshot showed one it had not completed since.
            let progress = |comm: u64| {
                job.comms
                    .get(&comm)
                    .and_then(|c| c.progress.get(&header.rank))
                    .copied()
                    .unwrap_or(0)
            };
            rank.died_in_call = !rank.finalized
                && rank.in_flight.iter().any(|c| {
                    Op::from_name(&c.op).is_some_and(|op| op.is_p2p())
                        || c.seq >= progress(c.comm_id)
                });
        }
        if status.terminal() || finalized {
            job.reorder.rank_ended(header.rank);
        }
        if job.ended.is_none() && job.all_exited() {
            job.release(now);
            job.ended = Some(Instant::now());
            return true;
        }
        // The watermark costs a pass over the job's ranks: ten times a second at most.
        if now >= job.released_at + RELEASE_EVERY_NS {
            job.release(now);
        }
        false
    }

    /// Records what an agent counted as lost for a process (ring overrun).
    pub fn set_overrun(&mut self, header: &Header, dropped: u64) {
        if let Some(job) = self.jobs.get_mut(&header.job)
            && let Some(r) = job.ranks.get_mut(&ProcessKey::of(header))
        {
            r.dropped_overrun = r.dropped_overrun.max(dropped);
        }
    }

    /// Replaces a process's in-flight view with an agent's snapshot, taken at host time
    /// `t_mono`, when the process's last heartbeat was at `last_beat` (host mono; 0: not
    /// known). Returns the snapshot's time on the collector's clock (0 when the process is not
    /// known here): how recent the data of its node now is.
    pub fn snapshot(
        &mut self,
        header: &Header,
        t_mono: u64,
        last_beat: u64,
        calls: Vec<InFlightCall>,
        proc: Option<ProcSample>,
    ) -> u64 {
        let now = now_ns();
        // A snapshot updates a process the records made known; it makes no job known itself
        // (one of a job this collector no longer holds would bring it back empty).
        let Some(job) = self.jobs.get_mut(&header.job) else {
            return 0;
        };
        job.last_touch = Instant::now();
        let key = ProcessKey::of(header);
        let Some(r) = job.ranks.get_mut(&key) else {
            return 0;
        };
        let offset = r.clock.map_or(0, |c| c.offset_ns);
        let taken = event_time(header, offset, now, t_mono);
        {
            r.last_seen_ns = now;
            // The agent read the process's heartbeat from its shared memory: alive then,
            // whatever records are still on their way.
            if last_beat > 0 && r.status == RankStatus::Running {
                r.last_heard_ns = r
                    .last_heard_ns
                    .max(event_time(header, offset, now, last_beat).min(taken));
            }
            if r.status == RankStatus::Running {
                r.in_flight = calls;
                r.snapshot_mono = t_mono;
                r.snapshot_real = r.snapshot_real.max(taken);
                r.snapshot_at = Some(Instant::now());
                if let Some(p) = proc {
                    if r.proc.as_ref().is_none_or(|old| p.cpu_ns > old.cpu_ns) {
                        r.cpu_advanced_at = Some(Instant::now());
                    }
                    r.proc = Some(p);
                }
            }
        }
        taken
    }

    /// Realtime (collector clock) of the newest record of a process (0: not known).
    pub fn heard_ns(&self, header: &Header) -> u64 {
        self.jobs
            .get(&header.job)
            .and_then(|j| j.ranks.get(&ProcessKey::of(header)))
            .map_or(0, |r| r.last_heard_ns)
    }

    /// Stores the stacks an agent took of a process.
    pub fn set_stacks(&mut self, header: &Header, stacks: Stacks) {
        if let Some(j) = self.jobs.get_mut(&header.job)
            && let Some(r) = j.ranks.get_mut(&ProcessKey::of(header))
        {
            r.stacks = Some(stacks);
        }
    }

    /// Ends jobs whose ranks all finalized (or exited) and that have been quiet for `quiet`
    /// (no agent reported the processes' exits: e.g. they run on without MPI). Returns them.
    pub fn end_quiet(&mut self, quiet: Duration) -> Vec<String> {
        let mut out = Vec::new();
        for j in self.jobs.values_mut() {
            if j.ended.is_none() && j.all_terminal() && j.last_touch.elapsed() >= quiet {
                j.ended = Some(Instant::now());
                out.push(j.job.clone());
            }
        }
        out
    }

    /// Releases jobs that ended more than the linger time ago. Returns their names.
    pub fn release_ended(&mut self) -> Vec<String> {
        let linger = self.limits.linger;
        let gone: Vec<String> = self
            .jobs
            .values()
            .filter(|j| j.ended.is_some_and(|t| t.elapsed() >= linger))
            .map(|j| j.job.clone())
            .collect();
        for g in &gone {
            self.jobs.remove(g);
            self.released += 1;
        }
        gone
    }

    /// Whether the live state holds this process of its job.
    pub fn has_process(&self, header: &Header) -> bool {
        self.jobs
            .get(&header.job)
            .is_some_and(|j| j.ranks.contains_key(&ProcessKey::of(header)))
    }

    /// Marks a job ended now (e.g. every process gone although not all reported an exit).
    pub fn end_job(&mut self, job: &str) -> bool {
        match self.jobs.get_mut(job) {
            Some(j) if j.ended.is_none() => {
                j.ended = Some(Instant::now());
                true
            }
            _ => false,
        }
    }
}
