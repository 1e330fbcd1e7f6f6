//! The instance detectors, fed one completed call at a time: `slow-rank`, `degraded-collective`,
//! `mismatch` and `comm-error`. The collector feeds it as records arrive (live); `commscope
//! analyze` feeds it a job's trace merged in time order (batch) — the same code gives both
//! verdicts.
//!
//! **Slow rank, clock-free.** In a synchronizing collective (all-reduce, all-gather,
//! reduce-scatter, all-to-all, barrier) every member leaves at about the same moment, so a member's
//! duration tells how long it waited: the member with the shortest duration arrived last, and a
//! member's lateness is `median(duration) − its duration`. Only host durations on each rank's own
//! clock are compared, never timestamps of different hosts.
//!
//! Lateness alone does not make a root: a rank can arrive late because it waited in another
//! communicator (a pipeline receive, a tensor-parallel all-reduce behind a straggler). So each
//! rank's own *compute* before the instance is measured, again on its own clock: the time since
//! its previous call on the same communicator minus the time it spent inside any communication
//! call in between. A late member is blamed only for the part of its lateness its own extra
//! compute explains: `min(lateness, compute − median(compute))`. Victims wait inside calls,
//! roots compute; the difference is what separates them.
//!
//! Blame is accumulated per rank with exponential decay (time constant `tau`) across all
//! communicators; `blame / tau` is the share of wall time the job spends waiting for that rank.
//! A rank is flagged when its share is at least `min_share`, at least `dominance` times the
//! median rank's share, and it was late in at least `min_late` (decayed) instances; the finding
//! resolves when its share falls below half the threshold. When at least half of a node's ranks
//! are flagged together, they are one finding (a slow node).
//!
//! **Degraded collective.** Per (communicator, op, size class) the bus bandwidth (nccl-tests
//! factors) of each instance is computed from the *last arriver's* duration — the time the
//! transfer itself took, unaffected by stragglers. The median of the last `window` instances is
//! the collective's current bandwidth; its best value so far is the communicator's own
//! baseline. When the current value falls below `degraded_ratio` × baseline while none of the
//! members is a flagged slow rank, the collective is degraded (recovered above
//! `recover_ratio`). Only messages of at least `degraded_min_bytes` count (small messages are
//! latency-bound, their bandwidth means nothing). Every degraded collective of a job is one
//! finding (one slow transport), each listed in its evidence.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::{Op, dtype, flags};
use commscope_wire::record::{Call, Skip};
use serde_json::json;

use crate::detectors::comm_error::CommErrors;
use crate::detectors::degraded::{Degraded, Explained};
use crate::detectors::mismatch::{self, Mismatch};
use crate::finding::{Class, Finding, Kind, State, finding_id, ranks_phrase};

/// The detectors' thresholds (documented in docs/diagnosis.md).
#[derive(Clone, Debug)]
pub struct Tuning {
    /// Blame decay time constant, seconds.
    pub tau_s: f64,
    /// Flag a rank whose share of wall time others wait for it is at least this.
    pub min_share: f64,
    /// … and at least this many times the median rank's share.
    pub dominance: f64,
    /// … and that was late (with its own extra compute) in at least this many decayed instances.
    pub min_late: f64,
    /// … and that was late in at least this share of its instances on some communicator.
    pub min_late_ratio: f64,
    /// Own extra compute below this (ns) is noise, not lateness.
    pub min_excess_ns: u64,
    /// Instances whose median is a collective's current bus bandwidth.
    pub window: usize,
    /// Degraded below this fraction of the baseline; recovered above `recover_ratio`.
    pub degraded_ratio: f64,
    pub recover_ratio: f64,
    /// Smallest message whose bandwidth is judged.
    pub degraded_min_bytes: u64,
    /// Instances waiting for their members, at most (oldest dropped and counted).
    pub max_pending: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            tau_s: 5.0,
            min_share: 0.05,
            dominance: 4.0,
            min_late: 4.0,
            min_late_ratio: 0.1,
            min_excess_ns: 200_000,
            window: 5,
            degraded_ratio: 0.5,
            recover_ratio: 0.75,
            degraded_min_bytes: 256 << 10,
            max_pending: 65_536,
        }
    }
}

/// Mismatched instances kept per job (the first ones: a program that diverged keeps diverging).
const MAX_MISMATCHES: usize = 64;
/// How long a mismatch that ties waits for its siblings' votes, seconds.
const TIE_WAIT_S: f64 = 10.0;
/// Agreed instances kept per communicator with a parent (for siblings' votes).
const AGREED_KEPT: usize = 64;
/// Communicators whose family is known, at most.
const MAX_FAMILIES: usize = 65_536;

/// One member's call of an instance.
#[derive(Clone, Copy, Debug)]
struct Entry {
    rank: i32,
    dur_ns: u64,
    /// Own compute since its previous call on this communicator (None: first call, or the
    /// previous one was not blocking).
    compute_ns: Option<u64>,
    /// The rank's blame total when it left its previous call on this communicator: blame
    /// given since then already accounts for part of its extra compute.
    blamed_before_ns: u64,
    shape: Shape,
    blocking: bool,
    /// Consistent sampling: the instances this one stands for (its modulus).
    weight: u32,
}

/// What a member called: op, fixed size, root, datatype — members of an instance must agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    pub op: u8,
    /// Bytes, for ops whose size all members share.
    pub bytes: Option<u64>,
    /// Root, for rooted ops.
    pub root: Option<i32>,
    pub dtype: Option<u16>,
}

impl Shape {
    /// The shape of a collective call (op, bytes, root or peer, datatype, flags).
    pub fn of(op: Op, bytes: u64, root: i32, dt: u16, fl: u16) -> Shape {
        let intra = fl & flags::INTERCOMM == 0;
        let fixed = matches!(
            op,
            Op::Allreduce
                | Op::Broadcast
                | Op::Reduce
                | Op::Allgather
                | Op::Alltoall
                | Op::Scan
                | Op::Exscan
        ) && intra;
        Shape {
            op: op as u8,
            bytes: fixed.then_some(bytes),
            root: (op.is_rooted() && intra).then_some(root),
            dtype: (fixed && !matches!(dt, dtype::NONE | dtype::DERIVED | dtype::MIXED))
                .then_some(dt),
        }
    }

    /// "broadcast of 8 B rooted at 0".
    pub fn describe(&self) -> String {
        let mut s = Op::from_code(self.op).name().to_owned();
        if let Some(b) = self.bytes {
            s += &format!(" of {b} B");
        }
        if let Some(d) = self.dtype {
            s += &format!(" ({})", dtype::name(d));
        }
        if let Some(r) = self.root {
            s += &format!(" rooted at {r}");
        }
        s
    }
}

#[derive(Debug)]
struct Pending {
    size: usize,
    entries: Vec<Entry>,
}

#[derive(Debug, Default)]
struct RankSt {
    node: String,
    /// Time spent inside blocking calls so far (ns, own clock).
    inside_ns: u64,
    /// Its agent samples its calls: compute is known only where the agent measured it
    /// ([`flags::COMPUTE_KNOWN`]); time inside left-out calls is not seen here.
    sampled: bool,
    /// comm → (t_exit, inside_ns after it) of the previous blocking call on it.
    last_on_comm: HashMap<u64, (u64, u64, u64)>,
    /// Blame given to this rank so far (ns, undecayed).
    blamed_ns: u64,
    /// Decayed blame (seconds others waited for this rank's own compute), decayed late count,
    /// decayed count of judged instances, at time `at_s`.
    blame_s: f64,
    /// The largest single instance's blame, decayed alike: left out of the share, so one
    /// hiccup never makes a slow rank by itself; with sampling (each instance weighted by its
    /// modulus) the second largest too.
    max_obs_s: f64,
    max2_obs_s: f64,
    late: f64,
    judged: f64,
    at_s: f64,
    /// Undecayed totals.
    total_blame_s: f64,
    total_late: u64,
    /// When it was first judged.
    first_s: Option<f64>,
    /// Per communicator: decayed (late, judged) — persistence.
    per_comm: HashMap<u64, (f64, f64)>,
}

impl RankSt {
    fn decay_to(&mut self, t: f64, tau: f64) {
        if t > self.at_s {
            let k = (-(t - self.at_s) / tau).exp();
            self.blame_s *= k;
            self.max_obs_s *= k;
            self.max2_obs_s *= k;
            self.late *= k;
            self.judged *= k;
            for v in self.per_comm.values_mut() {
                v.0 *= k;
                v.1 *= k;
            }
            self.at_s = t;
        }
    }
}

/// A slow-rank finding while it is open.
#[derive(Debug, Clone)]
struct SlowOpen {
    ranks: Vec<i32>,
    /// The ranks it opened with (its id stays when a node's ranks join it).
    id_ranks: Vec<i32>,
    node: Option<String>,
    opened_s: f64,
}

/// The detectors of one job.
#[derive(Debug)]
pub struct Detectors {
    job: String,
    pub tuning: Tuning,
    ranks: HashMap<i32, RankSt>,
    pending: HashMap<(u64, u64), Pending>,
    pending_order: VecDeque<(u64, u64)>,
    degraded: Degraded,
    errors: CommErrors,
    mismatches: BTreeMap<(u64, u64), Mismatch>,
    /// Communicator → (parent, size): siblings break a mismatch's tie.
    families: HashMap<u64, (u64, i32)>,
    /// Communicator → its latest agreed instances (seq, what every member called).
    agreed: HashMap<u64, VecDeque<(u64, Shape)>>,
    /// (comm, op) → (instances completed, first and last completion time): step inference.
    cadence: HashMap<(u64, u8), (u64, f64, f64)>,
    slow_open: Vec<SlowOpen>,
    /// `commscope_step` markers: per rank (last step, its time), and the latest step intervals.
    markers: HashMap<i32, (u64, f64)>,
    step_intervals: VecDeque<f64>,
    /// The slow-link detector (link records of NCCL's profiler plugin).
    pub links: crate::links::Links,
    now_s: f64,
    /// Instances judged, and instances dropped before all members arrived.
    pub instances: u64,
    pub incomplete: u64,
}

/// The lower quartile (0 when empty).
fn lower_quartile(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 4]
}

/// A rank's node, when known.
fn node_of(ranks: &HashMap<i32, RankSt>, r: i32) -> Option<String> {
    ranks
        .get(&r)
        .map(|x| x.node.clone())
        .filter(|n| !n.is_empty())
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mid = v.len() / 2;
    let (_, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    *m
}

/// The upper quartile (of two: the larger).
fn upper_quartile_u64(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = (3 * v.len() / 4).min(v.len() - 1);
    *v.select_nth_unstable(i).1
}

/// The lower quartile (of two: the smaller).
fn lower_quartile_u64(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = (v.len() - 1) / 4;
    *v.select_nth_unstable(i).1
}

fn fmt_dur(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

pub(crate) fn fmt_bw(bytes_per_s: f64) -> String {
    if bytes_per_s >= 1e9 {
        format!("{:.1} GB/s", bytes_per_s / 1e9)
    } else {
        format!("{:.0} MB/s", bytes_per_s / 1e6)
    }
}

impl Detectors {
    pub fn new(job: &str, tuning: Tuning) -> Detectors {
        Detectors {
            job: job.to_owned(),
            tuning,
            ranks: HashMap::new(),
            pending: HashMap::new(),
            pending_order: VecDeque::new(),
            degraded: Degraded::default(),
            errors: CommErrors::default(),
            mismatches: BTreeMap::new(),
            families: HashMap::new(),
            agreed: HashMap::new(),
            cadence: HashMap::new(),
            slow_open: Vec::new(),
            markers: HashMap::new(),
            step_intervals: VecDeque::new(),
            links: crate::links::Links::default(),
            now_s: 0.0,
            instances: 0,
            incomplete: 0,
        }
    }

    /// Tells which node a rank runs on.
    pub fn rank_node(&mut self, rank: i32, node: &str) {
        let r = self.ranks.entry(rank).or_default();
        if r.node != node {
            r.node = node.to_owned();
        }
    }

    /// One link record (NCCL's profiler plugin), at `now_ns` on the common time base.
    pub fn link(&mut self, l: &commscope_wire::record::Link, now_ns: u64) {
        let now = now_ns as f64 / 1e9;
        if now > self.now_s {
            self.now_s = now;
        }
        self.links.record(l, now);
    }

    /// One completed call of `rank`, in the rank's own order; `now_ns` is the common time base
    /// (the collector's clock live, the aligned trace time in batch).
    pub fn call(&mut self, c: &Call, now_ns: u64) {
        let now = now_ns as f64 / 1e9;
        if now > self.now_s {
            self.now_s = now;
        }
        let op = c.op();
        // NCCL calls carry their GPU interval: when the kernel ran, waiting for its peers
        // included. (A call captured into a CUDA graph shares the persistent bit: not blocking.)
        let (t_start, t_end) = c.span();
        let blocking = c.flags & (flags::NONBLOCKING | flags::PERSISTENT | flags::UNTRACKED) == 0;
        let r = self.ranks.entry(c.rank).or_default();
        r.sampled |= c.sample_shift > 0 || c.flags & flags::COMPUTE_KNOWN != 0;
        // Own compute since the previous blocking call on this communicator.
        let mut compute = None;
        let mut blamed_before = 0;
        if r.sampled {
            // Measured by the agent over every call, kept or not.
            if c.flags & flags::COMPUTE_KNOWN != 0 {
                compute = Some(c.op_seq2);
            }
            if let Some(&(_, _, blamed)) = r.last_on_comm.get(&c.comm_id) {
                blamed_before = blamed;
            }
            if r.last_on_comm.len() >= 1024 && !r.last_on_comm.contains_key(&c.comm_id) {
                r.last_on_comm.clear();
            }
            r.last_on_comm.insert(c.comm_id, (t_end, 0, r.blamed_ns));
        } else if blocking {
            if let Some(&(t_exit, inside, blamed)) = r.last_on_comm.get(&c.comm_id) {
                blamed_before = blamed;
                let span = t_start.saturating_sub(t_exit);
                compute = Some(span.saturating_sub(r.inside_ns.saturating_sub(inside)));
            }
            r.inside_ns += c.span_ns();
            if r.last_on_comm.len() >= 1024 && !r.last_on_comm.contains_key(&c.comm_id) {
                // A program that makes communicators without end: start over.
                r.last_on_comm.clear();
            }
            r.last_on_comm
                .insert(c.comm_id, (t_end, r.inside_ns, r.blamed_ns));
        } else {
            // Its wait is not known: the next instance on this comm has no compute measure.
            r.last_on_comm.remove(&c.comm_id);
        }
        self.errors.call(c, now);
        if op.is_p2p() || op == Op::None || c.comm_size <= 0 {
            return;
        }
        let key = (c.comm_id, c.seq);
        let size = c.comm_size as usize;
        let p = self.pending.entry(key).or_insert_with(|| {
            self.pending_order.push_back(key);
            Pending {
                size,
                entries: Vec::with_capacity(size.min(64)),
            }
        });
        p.entries.push(Entry {
            rank: c.rank,
            dur_ns: c.span_ns(),
            compute_ns: compute,
            blamed_before_ns: blamed_before,
            shape: Shape::of(op, c.bytes, c.peer, c.dtype, c.flags),
            blocking,
            weight: c.sample_modulus() as u32,
        });
        if p.entries.len() >= p.size {
            let p = self.pending.remove(&key).expect("present");
            self.complete(key, p, c.bytes, now);
        }
        while self.pending.len() > self.tuning.max_pending {
            let Some(old) = self.pending_order.pop_front() else {
                break;
            };
            if let Some(p) = self.pending.remove(&old) {
                self.incomplete += 1;
                self.check_shapes(old, &p, now);
            }
        }
        if self.pending_order.len() > 4 * self.tuning.max_pending.max(16) {
            let pending = &self.pending;
            self.pending_order.retain(|k| pending.contains_key(k));
        }
    }

    /// A communicator that could not be created, or that its library reported broken
    /// asynchronously (a `comm` record with event `failed`).
    pub fn comm_failed(&mut self, c: &commscope_wire::record::Comm, now_ns: u64) {
        let now = now_ns as f64 / 1e9;
        if now > self.now_s {
            self.now_s = now;
        }
        self.errors.comm_failed(c, now);
    }

    /// Calls of `rank` that consistent sampling left out (a `skip` record): from now on its
    /// compute comes from its agent. (The step cadence counts each kept instance as the
    /// instances it stands for, so skips, which arrive late, add nothing to it.)
    pub fn skip(&mut self, k: &Skip, now_ns: u64) {
        let now = now_ns as f64 / 1e9;
        if now > self.now_s {
            self.now_s = now;
        }
        self.ranks.entry(k.rank).or_default().sampled = true;
    }

    /// Records a mismatch if members called different things.
    fn check_shapes(&mut self, key: (u64, u64), p: &Pending, now: f64) -> bool {
        let first = p.entries[0].shape;
        if p.entries.iter().all(|e| e.shape == first) {
            return false;
        }
        let mut shapes: BTreeMap<Shape, Vec<i32>> = BTreeMap::new();
        for e in &p.entries {
            shapes.entry(e.shape).or_default().push(e.rank);
        }
        if self.mismatches.len() < MAX_MISMATCHES {
            self.mismatches.entry(key).or_insert(Mismatch {
                comm: key.0,
                seq: key.1,
                size: p.size,
                shapes,
                at_s: now,
            });
        }
        true
    }

    fn complete(&mut self, key: (u64, u64), p: Pending, bytes: u64, now: f64) {
        self.instances += 1;
        if self.check_shapes(key, &p, now) {
            return;
        }
        if self.families.contains_key(&key.0) {
            let a = self.agreed.entry(key.0).or_default();
            if a.len() >= AGREED_KEPT {
                a.pop_front();
            }
            a.push_back((key.1, p.entries[0].shape));
        }
        let op = Op::from_code(p.entries[0].shape.op);
        let cad = self
            .cadence
            .entry((key.0, op as u8))
            .or_insert((0, now, now));
        // An instance kept under modulus K stands for K of them.
        let weight = p.entries.iter().map(|e| e.weight).max().unwrap_or(1).max(1);
        cad.0 += u64::from(weight);
        cad.2 = now;
        if !op.is_synchronizing() || p.entries.iter().any(|e| !e.blocking) || p.size < 2 {
            return;
        }
        // The references are quartiles, not medians, so that up to three quarters of the
        // members may be late (most of a job slow) and the waiters still set the reference.
        let mut durs: Vec<u64> = p.entries.iter().map(|e| e.dur_ns).collect();
        let d_med = upper_quartile_u64(&mut durs);
        let d_min = p.entries.iter().map(|e| e.dur_ns).min().unwrap_or(0);
        // Blame.
        if p.entries.iter().all(|e| e.compute_ns.is_some()) {
            let mut comp: Vec<u64> = p.entries.iter().filter_map(|e| e.compute_ns).collect();
            // The lower quartile: with two members, the slower one's excess is over the faster.
            let c_med = lower_quartile_u64(&mut comp);
            let tau = self.tuning.tau_s;
            let min_ex = self.tuning.min_excess_ns;
            for e in &p.entries {
                let late = d_med.saturating_sub(e.dur_ns);
                let r = self.ranks.entry(e.rank).or_default();
                // Extra compute not already blamed at an instance in between (a tensor-parallel
                // all-reduce inside a data-parallel step): each unit of it is blamed once.
                let already = r.blamed_ns.saturating_sub(e.blamed_before_ns);
                let own = late.min(
                    e.compute_ns
                        .unwrap_or(0)
                        .saturating_sub(c_med)
                        .saturating_sub(already),
                );
                let w = f64::from(weight);
                r.decay_to(now, tau);
                r.first_s.get_or_insert(now);
                r.judged += w;
                if r.per_comm.len() >= 64 && !r.per_comm.contains_key(&key.0) {
                    r.per_comm.retain(|_, v| v.1 >= 0.5);
                }
                let pc = r.per_comm.entry(key.0).or_default();
                pc.1 += w;
                if own >= min_ex {
                    pc.0 += w;
                    // The wait it caused, for every instance this one stands for; lateness
                    // itself is counted as seen: repetition needs as many late instances
                    // sampled or not (the single largest blame is left out of the share).
                    r.blamed_ns += own * u64::from(weight);
                    // Blame charged at this communicator's own instance is not "blamed in
                    // between" for the rank's next call on it: its snapshot moves too.
                    if let Some(x) = r.last_on_comm.get_mut(&key.0) {
                        x.2 += own * u64::from(weight);
                    }
                    let s = own as f64 / 1e9 * w;
                    r.blame_s += s;
                    if s > r.max_obs_s {
                        r.max2_obs_s = r.max_obs_s;
                        r.max_obs_s = s;
                    } else if s > r.max2_obs_s {
                        r.max2_obs_s = s;
                    }
                    r.late += 1.0;
                    r.total_blame_s += s;
                    r.total_late += 1;
                }
            }
        }
        // Bus bandwidth, from the last arriver's duration.
        if bytes >= self.tuning.degraded_min_bytes
            && d_min > 0
            // Judged where every member moves the same volume (not gather/scatter).
            && !matches!(op, Op::Gather | Op::Scatter)
            && let Some(f) = commscope_wire::op::busbw_factor(op, p.size as i32)
        {
            let bw = bytes as f64 * f / (d_min as f64 / 1e9);
            let ranks = &self.ranks;
            self.degraded
                .observe(key.0, op, bytes, p.size, bw, self.tuning.window, || {
                    let mut members: Vec<i32> = p.entries.iter().map(|e| e.rank).collect();
                    members.sort_unstable();
                    let nodes: BTreeSet<&str> = members
                        .iter()
                        .filter_map(|m| ranks.get(m).map(|x| x.node.as_str()))
                        .collect();
                    (members, nodes.len())
                });
        }
    }

    fn share(&self, r: &RankSt) -> f64 {
        let k = if self.now_s > r.at_s {
            (-(self.now_s - r.at_s) / self.tuning.tau_s).exp()
        } else {
            1.0
        };
        // The decayed sum over a history shorter than a few time constants covers less time:
        // divide by the time it does cover (bias correction), at least one second.
        let tau = self.tuning.tau_s;
        let covered = match r.first_s {
            Some(f) => tau * (1.0 - (-(self.now_s - f).max(tau / 2.0) / tau).exp()),
            None => tau,
        };
        let outliers = r.max_obs_s + if r.sampled { r.max2_obs_s } else { 0.0 };
        (r.blame_s - outliers).max(0.0) * k / covered
    }

    fn late_now(&self, r: &RankSt) -> f64 {
        let k = if self.now_s > r.at_s {
            (-(self.now_s - r.at_s) / self.tuning.tau_s).exp()
        } else {
            1.0
        };
        r.late * k
    }

    /// Moves "now" forward without a record (a quiet job decays).
    pub fn advance(&mut self, now_ns: u64) {
        let now = now_ns as f64 / 1e9;
        if now > self.now_s {
            self.now_s = now;
        }
    }

    /// The application marked step `step` (`commscope_step`) at `now_ns` on `rank`.
    pub fn step_marker(&mut self, rank: i32, step: u64, now_ns: u64) {
        let now = now_ns as f64 / 1e9;
        if let Some((last, at)) = self.markers.insert(rank, (step, now))
            && step > last
            && now > at
        {
            self.step_intervals
                .push_back((now - at) / (step - last) as f64);
            if self.step_intervals.len() > 64 {
                self.step_intervals.pop_front();
            }
        }
    }

    /// The step period: from the application's `commscope_step` markers when it calls it, else
    /// inferred from the least frequent collective that repeats: (seconds, where it came from).
    fn step_period(&self) -> Option<(f64, String)> {
        if self.step_intervals.len() >= 2 {
            let mut v: Vec<f64> = self.step_intervals.iter().copied().collect();
            return Some((median(&mut v), "commscope_step".to_owned()));
        }
        self.cadence
            .iter()
            .filter(|(_, (n, first, last))| *n >= 3 && last > first)
            .map(|((comm, op), (n, first, last))| {
                ((last - first) / (*n - 1) as f64, *comm, *op, *last)
            })
            // Still recurring: its last instance is within three periods of now.
            .filter(|(p, _, _, last)| self.now_s - last <= 3.0 * p + 1.0)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(p, comm, op, _)| {
                (
                    p,
                    format!(
                        "the period of {} on communicator {}",
                        Op::from_code(op).name(),
                        format_comm_id(comm)
                    ),
                )
            })
    }

    /// The findings open now (slow-rank, degraded-collective, mismatch, comm-error), with their
    /// state updated (hysteresis for slow ranks and degraded collectives).
    pub fn findings(&mut self) -> Vec<Finding> {
        let now_ns = (self.now_s * 1e9) as u64;
        let mut out = Vec::new();
        self.slow_findings(now_ns, &mut out);
        let ranks = &self.ranks;
        self.links
            .findings(&self.job, self.now_s, |r| node_of(ranks, r), &mut out);
        self.degraded_findings(&mut out);
        // One finding per communicator and diverging ranks: their first mismatched instance
        // (the ones after it follow from it).
        let mut seen: BTreeSet<(String, Vec<i32>)> = BTreeSet::new();
        for m in self.mismatches.values() {
            let siblings = self.siblings_at(m.comm, m.seq);
            // A tie waits (up to TIE_WAIT_S) for the siblings that have not completed that
            // instance yet: naming both ranks, then one, would be two findings for one cause.
            if mismatch::majority(m, &siblings).is_none()
                && siblings.len() < self.siblings(m.comm).count()
                && self.now_s - m.at_s < TIE_WAIT_S
            {
                continue;
            }
            let ranks = &self.ranks;
            let f = mismatch::finding(&self.job, m, &siblings, |r| node_of(ranks, r));
            if seen.insert((f.comm.clone().unwrap_or_default(), f.ranks.clone())) {
                out.push(f);
            }
        }
        let ranks = &self.ranks;
        self.errors
            .findings(&self.job, |r| node_of(ranks, r), &mut out);
        out
    }

    /// Current share of each rank (for evidence and tests): rank → share of wall time.
    pub fn shares(&self) -> BTreeMap<i32, f64> {
        self.ranks
            .iter()
            .map(|(r, st)| (*r, self.share(st)))
            .collect()
    }

    fn slow_findings(&mut self, now_ns: u64, out: &mut Vec<Finding>) {
        let t = &self.tuning;
        // (rank, share, decayed late count — zero unless it is late repeatedly on some
        // communicator: a one-off hiccup is not a slow rank)
        let mut shares: Vec<(i32, f64, f64)> = self
            .ranks
            .iter()
            .map(|(r, st)| {
                let repeated = st
                    .per_comm
                    .values()
                    .any(|(l, j)| *j >= 2.0 && l / j >= t.min_late_ratio);
                (
                    *r,
                    self.share(st),
                    if repeated { self.late_now(st) } else { 0.0 },
                )
            })
            .collect();
        shares.sort_by_key(|s| s.0);
        // The reference is the lower quartile, not the median: with half the job slow (a slow
        // node of a 2-node job) the median rank is itself slow.
        let mut all: Vec<f64> = shares.iter().map(|s| s.1).collect();
        let med = lower_quartile(&mut all);
        // A rank far below the slowest one (under a third of its share) is the noise around
        // it, not a cause of its own.
        let top = shares.iter().map(|s| s.1).fold(0.0, f64::max);
        let high = |s: f64, late: f64| {
            s >= t.min_share && s >= t.dominance * med && late >= t.min_late && 3.0 * s >= top
        };
        let low = |s: f64| s >= t.min_share / 2.0 && s >= t.dominance * med / 2.0;
        let share_of: HashMap<i32, f64> = shares.iter().map(|s| (s.0, s.1)).collect();
        // Keep the open ones that stay above the lower threshold.
        let mut open: Vec<SlowOpen> = Vec::new();
        let mut taken: BTreeSet<i32> = BTreeSet::new();
        for o in std::mem::take(&mut self.slow_open) {
            if o.ranks
                .iter()
                .any(|r| low(share_of.get(r).copied().unwrap_or(0.0)))
            {
                taken.extend(o.ranks.iter().copied());
                open.push(o);
            }
        }
        let node_of = |r: &i32| {
            self.ranks
                .get(r)
                .map(|x| x.node.clone())
                .unwrap_or_default()
        };
        let mut node_ranks: HashMap<String, usize> = HashMap::new();
        let mut node_members: HashMap<String, Vec<i32>> = HashMap::new();
        for (r, st) in &self.ranks {
            *node_ranks.entry(st.node.clone()).or_default() += 1;
            node_members.entry(st.node.clone()).or_default().push(*r);
        }
        // Per node: ranks above the lower threshold, and whether one is above the upper one.
        let mut by_node: BTreeMap<String, (Vec<i32>, bool)> = BTreeMap::new();
        for (r, s, late) in &shares {
            if low(*s) {
                let e = by_node.entry(node_of(r)).or_default();
                e.0.push(*r);
                e.1 |= high(*s, *late) && !taken.contains(r);
            }
        }
        for (node, (lows, any_high)) in by_node {
            let on_node = node_ranks.get(&node).copied().unwrap_or(0);
            // A slow node is slow against other nodes: a job on one node has ranks only.
            let is_node = !node.is_empty()
                && node_ranks.len() >= 2
                && lows.len() >= 2
                && 2 * lows.len() >= on_node;
            if is_node {
                // Half the node or more is slow: one finding for the node. Three quarters or
                // more: the whole node (the rest are slow too, only less visibly: their waits
                // fall on the others' instances); fewer: only the ranks that are.
                let mut lows = if 4 * lows.len() >= 3 * on_node {
                    node_members.get(&node).cloned().unwrap_or(lows)
                } else {
                    // Only the ranks near the slowest: not a neighbour with mild skew.
                    let share = |r: &i32| share_of.get(r).copied().unwrap_or(0.0);
                    let top = lows.iter().map(share).fold(0.0, f64::max);
                    lows.into_iter().filter(|r| share(r) >= top / 2.0).collect()
                };
                lows.sort_unstable();
                // A slow node: one finding. It takes over open single-rank findings on the
                // node (keeping the first one's id) once a rank crosses the upper threshold.
                let existing = open
                    .iter()
                    .position(|o| o.ranks.iter().any(|r| node_of(r) == node));
                match existing {
                    Some(i) => {
                        let mut merged: BTreeSet<i32> = lows.iter().copied().collect();
                        let mut id_ranks = open[i].id_ranks.clone();
                        let mut opened = open[i].opened_s;
                        let mut j = 0;
                        while j < open.len() {
                            if open[j].ranks.iter().any(|r| node_of(r) == node) {
                                let o = open.remove(j);
                                merged.extend(o.ranks);
                                if o.opened_s < opened {
                                    opened = o.opened_s;
                                    id_ranks = o.id_ranks;
                                }
                            } else {
                                j += 1;
                            }
                        }
                        open.push(SlowOpen {
                            ranks: merged.into_iter().collect(),
                            id_ranks,
                            node: Some(node),
                            opened_s: opened,
                        });
                    }
                    None if any_high => open.push(SlowOpen {
                        ranks: lows.clone(),
                        id_ranks: lows,
                        node: Some(node),
                        opened_s: self.now_s,
                    }),
                    None => {}
                }
            } else {
                for r in lows {
                    let (s, late) = shares
                        .iter()
                        .find(|x| x.0 == r)
                        .map_or((0.0, 0.0), |x| (x.1, x.2));
                    if !taken.contains(&r) && high(s, late) {
                        open.push(SlowOpen {
                            ranks: vec![r],
                            id_ranks: vec![r],
                            node: None,
                            opened_s: self.now_s,
                        });
                    }
                }
            }
        }
        let step = self.step_period();
        for o in &open {
            out.push(self.slow_finding(o, &share_of, step.as_ref(), now_ns));
        }
        self.slow_open = open;
    }

    fn slow_finding(
        &self,
        o: &SlowOpen,
        share_of: &HashMap<i32, f64>,
        step: Option<&(f64, String)>,
        now_ns: u64,
    ) -> Finding {
        let share: f64 = o
            .ranks
            .iter()
            .map(|r| share_of.get(r).copied().unwrap_or(0.0))
            .fold(0.0, f64::max);
        let nodes: Vec<String> = o
            .ranks
            .iter()
            .filter_map(|r| node_of(&self.ranks, *r))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let (late, _judged, total_blame, total_late) = o
            .ranks
            .iter()
            .filter_map(|r| self.ranks.get(r))
            .fold((0.0f64, 0.0f64, 0.0f64, 0u64), |a, st| {
                (
                    a.0.max(self.late_now(st)),
                    a.1.max(st.judged),
                    a.2.max(st.total_blame_s),
                    a.3.max(st.total_late),
                )
            });
        // Persistent: late in at least half of its instances on some communicator.
        let persistent = o
            .ranks
            .iter()
            .filter_map(|r| self.ranks.get(r))
            .flat_map(|st| st.per_comm.values())
            .any(|(l, j)| *j >= 2.0 && l / j >= 0.5);
        let job_median = {
            let mut all: Vec<f64> = share_of.values().copied().collect();
            median(&mut all)
        };
        let impact = match step {
            Some((p, _)) => format!(
                "the others wait {} per step for it ({:.0} % of the {} step)",
                fmt_dur(share * p),
                share * 100.0,
                fmt_dur(*p)
            ),
            None => format!("the others wait for it {:.0} % of the time", share * 100.0),
        };
        let who = match &o.node {
            Some(n) => format!("{n} ({})", ranks_phrase(&o.ranks)),
            None => format!(
                "{} on {}",
                ranks_phrase(&o.ranks),
                nodes.first().map_or("an unknown node", String::as_str)
            ),
        };
        let what_next = match &o.node {
            Some(_) => {
                "every rank of the node computes slowly: check the node's CPU/GPU clocks, thermal throttling and noisy neighbours, or drain it"
            }
            None => {
                "it computes longer than its peers before each collective: check that rank's data shard, GPU health and CPU contention (top/nvidia-smi on that node)"
            }
        };
        Finding {
            id: finding_id(Kind::SlowRank, &self.job, None, &o.id_ranks, None),
            kind: Kind::SlowRank,
            class: Class::NonCommunicationSlow,
            state: State::Open,
            job: self.job.clone(),
            comm: None,
            seq: None,
            ranks: o.ranks.clone(),
            nodes: nodes.clone(),
            link: None,
            opened_at: (o.opened_s * 1e9) as u64,
            resolved_at: None,
            confidence: if persistent { 0.9 } else { 0.7 },
            summary: format!(
                "{who} arrives last at collectives ({}): {impact} — {what_next}",
                if persistent {
                    "persistently"
                } else {
                    "in bursts"
                }
            ),
            evidence: json!({
                "share_of_time": share,
                "persistence": if persistent { "persistent" } else { "transient" },
                "late_instances_decayed": late,
                "late_instances_total": total_late,
                "blame_total_s": total_blame,
                "step_s": step.map(|s| s.0),
                "step_from": step.map(|s| s.1.clone()),
                "job_median_share": job_median,
                "at_ns": now_ns,
            }),
        }
    }

    fn degraded_findings(&mut self, out: &mut Vec<Finding>) {
        let slow: BTreeSet<i32> = self
            .slow_open
            .iter()
            .flat_map(|o| o.ranks.iter().copied())
            .collect();
        // A communicator with a slow link is that finding's (one finding per root cause).
        let slow_links = self.links.slow_comms();
        let ranks = &self.ranks;
        self.degraded.findings(
            &self.job,
            &self.tuning,
            self.now_s,
            &Explained {
                slow_ranks: &slow,
                slow_link_comms: &slow_links,
            },
            |r| node_of(ranks, r),
            out,
        );
    }
}

/// Bytes in binary units ("1.5 MiB").
pub fn fmt_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

impl Detectors {
    /// A communicator was created (its parent, 0 when none, and size): siblings, made by the
    /// same parent with the same size, break a mismatch's tie.
    pub fn comm_created(&mut self, comm: u64, parent: u64, size: i32) {
        if parent != 0 && self.families.len() < MAX_FAMILIES {
            self.families.insert(comm, (parent, size));
        }
    }

    /// The sibling communicators of `comm`: same parent, same size.
    fn siblings(&self, comm: u64) -> impl Iterator<Item = u64> + '_ {
        let fam = self.families.get(&comm);
        self.families
            .iter()
            .filter(move |(c, f)| **c != comm && Some(*f) == fam)
            .map(|(c, _)| *c)
    }

    /// What sibling communicators of `comm` agreed on at instance `seq`.
    fn siblings_at(&self, comm: u64, seq: u64) -> Vec<Shape> {
        self.siblings(comm)
            .filter_map(|c| {
                self.agreed
                    .get(&c)?
                    .iter()
                    .find(|(s, _)| *s == seq)
                    .map(|(_, shape)| *shape)
            })
            .collect()
    }
}

impl Detectors {
    /// Calls entered and not completed (in-flight) join the shape check: a rank that called
    /// another collective where its peers wait is a mismatch even though the instance never
    /// completes. `calls`: (rank, comm, seq, shape).
    pub fn in_flight_shapes(&mut self, calls: impl IntoIterator<Item = (i32, u64, u64, Shape)>) {
        let mut by: HashMap<(u64, u64), Vec<(i32, Shape)>> = HashMap::new();
        for (r, comm, seq, s) in calls {
            by.entry((comm, seq)).or_default().push((r, s));
        }
        for (key, calls) in by {
            if self.mismatches.contains_key(&key) {
                continue;
            }
            let mut shapes: BTreeMap<Shape, Vec<i32>> = BTreeMap::new();
            let mut seen: BTreeSet<i32> = BTreeSet::new();
            let size = self.pending.get(&key).map_or(0, |p| p.size);
            if let Some(p) = self.pending.get(&key) {
                for e in &p.entries {
                    if seen.insert(e.rank) {
                        let s = Shape {
                            root: None,
                            dtype: None,
                            ..e.shape
                        };
                        shapes.entry(s).or_default().push(e.rank);
                    }
                }
            }
            for (r, s) in calls {
                if seen.insert(r) {
                    shapes.entry(s).or_default().push(r);
                }
            }
            if shapes.len() > 1 && self.mismatches.len() < MAX_MISMATCHES {
                self.mismatches.insert(
                    key,
                    Mismatch {
                        comm: key.0,
                        seq: key.1,
                        size: size.max(seen.len()),
                        shapes,
                        at_s: self.now_s,
                    },
                );
            }
        }
    }

    /// The shape an in-flight call of this op would have (in-flight tables carry no root or
    /// datatype: only op and size are compared).
    pub fn in_flight_shape(op: Op, bytes: u64) -> Shape {
        Shape {
            root: None,
            dtype: None,
            ..Shape::of(op, bytes, -1, dtype::NONE, 0)
        }
    }
}

impl Detectors {
    /// Per rank: (share, decayed late, max per-comm late ratio) — for looking into verdicts.
    pub fn debug_ranks(&self) -> Vec<(i32, f64, f64, f64, f64)> {
        let mut v: Vec<(i32, f64, f64, f64, f64)> = self
            .ranks
            .iter()
            .map(|(r, st)| {
                let ratio = st
                    .per_comm
                    .values()
                    .filter(|(_, j)| *j >= 2.0)
                    .map(|(l, j)| l / j)
                    .fold(0.0, f64::max);
                (
                    *r,
                    self.share(st),
                    self.late_now(st),
                    ratio,
                    st.total_blame_s,
                )
            })
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }

    /// Per (communicator, op): (instances counted, first and last time) — the step cadence.
    pub fn debug_cadence(&self) -> Vec<(u64, u8, u64, f64, f64)> {
        let mut v: Vec<_> = self
            .cadence
            .iter()
            .map(|((c, o), (n, a, b))| (*c, *o, *n, *a, *b))
            .collect();
        v.sort_by_key(|x| std::cmp::Reverse(x.2));
        v
    }
}
