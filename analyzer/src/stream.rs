//! The instance detectors, fed one completed call at a time: `slow-rank`, `degraded-collective`,
//! `mismatch` and `comm-error`. The collector feeds it as records arrive (live); `commscope
//! analyze` feeds it a job's trace merged in time order (batch) — the same code gives both
//! verdicts.
//!
//! The slow-rank detector is [`crate::detectors::slow_rank`]; this module measures what it
//! needs and hands it each completed instance.
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

use crate::FastMap;

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::{Op, dtype, flags, red_op};
use commscope_wire::record::{Call, Skip};

use crate::detectors::comm_error::CommErrors;
use crate::detectors::degraded::{Degraded, Explained, Nodes};
use crate::detectors::mismatch::{self, Mismatch};
use crate::detectors::slow_rank::{
    CallTimes, Context as SlowContext, Member, RankHealth, SlowRanks,
};
use crate::finding::Finding;

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
    /// A degraded collective is reported once it has been degraded this long (s) and over at
    /// least `window` instances since: bursts of CPU contention on a node, another job's
    /// traffic for a moment, halve a collective's bandwidth for a second.
    pub degraded_sustain_s: f64,
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
            degraded_sustain_s: 5.0,
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
    member: Member,
    shape: Shape,
    blocking: bool,
    /// Consistent sampling: the instances this one stands for (its modulus).
    weight: u32,
}

/// What a member called: op, fixed size, root, datatype, reduction — members of an instance
/// must agree. A field is `None` where the op has no such thing, or where the record did not
/// say (an `enter` record written before calls in flight carried their whole signature).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    pub op: u8,
    /// Bytes, for ops whose size all members share.
    pub bytes: Option<u64>,
    /// Root, for rooted ops.
    pub root: Option<i32>,
    pub dtype: Option<u16>,
    /// The reduction ([`red_op`]), for reducing ops.
    pub red_op: Option<u8>,
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
            red_op: None,
        }
    }

    /// The shape of a collective's `call` or `enter` record, its reduction included.
    pub fn of_call(c: &Call) -> Shape {
        Shape::of(c.op(), c.bytes, c.peer, c.dtype, c.flags).reducing(c.red_op)
    }

    /// The same call, reducing with `code` ([`red_op`]; not known: left out).
    pub fn reducing(self, code: u8) -> Shape {
        Shape {
            red_op: (Op::from_code(self.op).is_reducing() && code != red_op::UNKNOWN)
                .then_some(code),
            ..self
        }
    }

    /// The fields every one of `shapes` whose op has them knows: a field one of them lacks
    /// (an `enter` record written before calls in flight carried their whole signature) is left
    /// out of all, so a call whose record says less is compared on what it says. A field an op
    /// does not have (a broadcast's reduction) leaves the others' alone.
    fn known_to_all<'a>(shapes: impl IntoIterator<Item = &'a Shape>) -> [bool; 4] {
        let mut known = [true; 4];
        for s in shapes {
            let op = Op::from_code(s.op);
            let fixed = Shape::of(op, 0, 0, dtype::BYTE, 0).bytes.is_some();
            let has = [
                (fixed, s.bytes.is_some()),
                (op.is_rooted(), s.root.is_some()),
                (fixed, s.dtype.is_some()),
                (op.is_reducing(), s.red_op.is_some()),
            ];
            for (k, (applies, h)) in known.iter_mut().zip(has) {
                if applies && !h {
                    *k = false;
                }
            }
        }
        known
    }

    /// The same call as far as both say (a field one of them lacks is not compared).
    pub fn agrees_with(&self, other: &Shape) -> bool {
        fn same<T: PartialEq>(a: Option<T>, b: Option<T>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
        }
        self.op == other.op
            && same(self.bytes, other.bytes)
            && same(self.root, other.root)
            && same(self.dtype, other.dtype)
            && same(self.red_op, other.red_op)
    }

    fn keeping(self, known: [bool; 4]) -> Shape {
        Shape {
            op: self.op,
            bytes: self.bytes.filter(|_| known[0]),
            root: self.root.filter(|_| known[1]),
            dtype: self.dtype.filter(|_| known[2]),
            red_op: self.red_op.filter(|_| known[3]),
        }
    }

    /// Members grouped by what they called, compared on what every member's record says.
    pub fn group(calls: &[(i32, Shape)]) -> BTreeMap<Shape, Vec<i32>> {
        let known = Shape::known_to_all(calls.iter().map(|(_, s)| s));
        let mut out: BTreeMap<Shape, Vec<i32>> = BTreeMap::new();
        for (r, s) in calls {
            out.entry(s.keeping(known)).or_default().push(*r);
        }
        out
    }

    /// "broadcast of 8 B (int) rooted at 0", "allreduce of 2048 B (double, sum)".
    pub fn describe(&self) -> String {
        let mut s = Op::from_code(self.op).name().to_owned();
        if let Some(b) = self.bytes {
            s += &format!(" of {b} B");
        }
        match (self.dtype, self.red_op) {
            (Some(d), Some(r)) => s += &format!(" ({}, {})", dtype::name(d), red_op::name(r)),
            (Some(d), None) => s += &format!(" ({})", dtype::name(d)),
            (None, Some(r)) => s += &format!(" ({})", red_op::name(r)),
            (None, None) => {}
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

/// The detectors of one job.
#[derive(Debug)]
pub struct Detectors {
    job: String,
    pub tuning: Tuning,
    /// Rank → node.
    nodes: FastMap<i32, String>,
    /// Node → the summed line rate of its network ports (Mbit/s), where its ranks said.
    network: HashMap<String, u64>,
    slow: SlowRanks,
    pending: FastMap<(u64, u64), Pending>,
    pending_order: VecDeque<(u64, u64)>,
    degraded: Degraded,
    errors: CommErrors,
    mismatches: BTreeMap<(u64, u64), Mismatch>,
    /// Communicator → (parent, size): siblings break a mismatch's tie.
    families: FastMap<u64, (u64, i32)>,
    /// Communicator → its latest agreed instances (seq, what every member called).
    agreed: FastMap<u64, VecDeque<(u64, Shape)>>,
    /// (comm, op) → (instances completed, first and last completion time): step inference.
    cadence: FastMap<(u64, u8), (u64, f64, f64)>,
    /// `commscope_step` markers: per rank (last step, its time), and the latest step intervals.
    markers: FastMap<i32, (u64, f64)>,
    step_intervals: VecDeque<f64>,
    /// The slow-link detector (link records of NCCL's profiler plugin).
    pub links: crate::links::Links,
    pub flows: crate::flows::FlowLinks,
    pub link_errors: crate::link_errors::LinkErrors,
    pub nic: crate::nic::NicCounters,
    now_s: f64,
    /// Instances judged, and instances dropped before all members arrived.
    pub instances: u64,
    pub incomplete: u64,
}

/// A rank's node, when known.
fn node_of(nodes: &FastMap<i32, String>, r: i32) -> Option<String> {
    nodes.get(&r).filter(|n| !n.is_empty()).cloned()
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mid = v.len() / 2;
    let (_, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    *m
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
            nodes: FastMap::default(),
            network: HashMap::new(),
            slow: SlowRanks::default(),
            pending: FastMap::default(),
            pending_order: VecDeque::new(),
            degraded: Degraded::default(),
            errors: CommErrors::default(),
            mismatches: BTreeMap::new(),
            families: FastMap::default(),
            agreed: FastMap::default(),
            cadence: FastMap::default(),
            markers: FastMap::default(),
            step_intervals: VecDeque::new(),
            links: crate::links::Links::default(),
            flows: crate::flows::FlowLinks::default(),
            link_errors: crate::link_errors::LinkErrors::default(),
            nic: crate::nic::NicCounters::default(),
            now_s: 0.0,
            instances: 0,
            incomplete: 0,
        }
    }

    /// Tells which node a rank runs on.
    pub fn rank_node(&mut self, rank: i32, node: &str) {
        if self.nodes.get(&rank).is_none_or(|n| n != node) {
            self.nodes.insert(rank, node.to_owned());
        }
    }

    /// `rank`'s node offers `mbps` of network line rate (its `network` process record).
    pub fn network(&mut self, rank: i32, mbps: u64) {
        if let Some(node) = self.nodes.get(&rank).filter(|n| !n.is_empty())
            && mbps > 0
        {
            self.network.insert(node.clone(), mbps);
        }
    }

    /// One link record (NCCL's profiler plugin), at `now_ns` on the common time base.
    /// One flow record of the agents' transport view: its node is its owning rank's.
    pub fn flow(&mut self, f: &commscope_wire::record::Flow, now_ns: u64) {
        let now = now_ns as f64 / 1e9;
        if now > self.now_s {
            self.now_s = now;
        }
        let Some(node) = node_of(&self.nodes, f.rank) else {
            return;
        };
        self.flows.record(&node, f, now);
    }

    /// One link event of `node`'s agent (its transport view or NIC counters).
    pub fn link_event(&mut self, node: &str, e: &commscope_wire::record::LinkEvent, now_ns: u64) {
        let now = now_ns as f64 / 1e9;
        if now > self.now_s {
            self.now_s = now;
        }
        // Each keeps what is its own: failures, or congestion and loss counters.
        self.nic.record(node, e, now);
        self.link_errors.record(node, e, now);
    }

    /// The links the transport view shows dead at `now_ns` (or at the latest record, when that
    /// is later) — for the hang detector's view.
    pub fn dead_links(&self, now_ns: u64) -> Vec<crate::view::DeadLink> {
        self.flows.dead_links(self.now_s.max(now_ns as f64 / 1e9))
    }

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
        let member = self.slow.call(&CallTimes {
            rank: c.rank,
            comm: c.comm_id,
            start_ns: t_start,
            end_ns: t_end,
            blocking,
            sampled: c.sample_shift > 0 || c.flags & flags::COMPUTE_KNOWN != 0,
            agent_compute_ns: (c.flags & flags::COMPUTE_KNOWN != 0).then_some(c.op_seq2),
        });
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
            member,
            shape: Shape::of_call(c),
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
        if k.calls > 0 {
            self.slow.sampled(k.rank);
        }
    }

    /// Records a mismatch if members called different things.
    fn check_shapes(&mut self, key: (u64, u64), p: &Pending, now: f64) -> bool {
        let first = p.entries[0].shape;
        if p.entries.iter().all(|e| e.shape == first) {
            return false;
        }
        let calls: Vec<(i32, Shape)> = p.entries.iter().map(|e| (e.member.rank, e.shape)).collect();
        let shapes = Shape::group(&calls);
        if shapes.len() < 2 {
            return false;
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
        let members: Vec<Member> = p.entries.iter().map(|e| e.member).collect();
        self.slow.judge(key.0, &members, weight, now, &self.tuning);
        let d_min = members.iter().map(|m| m.dur_ns).min().unwrap_or(0);
        // Bus bandwidth, from the last arriver's duration.
        if bytes >= self.tuning.degraded_min_bytes
            && d_min > 0
            // Judged where every member moves the same volume (not gather/scatter).
            && !matches!(op, Op::Gather | Op::Scatter)
            && let Some(f) = commscope_wire::op::busbw_factor(op, p.size as i32)
        {
            let bw = bytes as f64 * f / (d_min as f64 / 1e9);
            let node_names = &self.nodes;
            self.degraded
                .observe(key.0, op, bytes, p.size, bw, self.tuning.window, || {
                    let mut members: Vec<i32> = members.iter().map(|m| m.rank).collect();
                    members.sort_unstable();
                    let nodes: BTreeSet<&str> = members
                        .iter()
                        .filter_map(|m| node_names.get(m).map(String::as_str))
                        .collect();
                    (members, nodes.len())
                });
        }
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

    /// The link totals per node pair ([`crate::links::NodePair`]), most bytes first.
    pub fn node_pairs(&self) -> Vec<crate::links::NodePair> {
        self.links.node_pairs(|r| node_of(&self.nodes, r))
    }

    /// Per rank: its health ([`RankHealth`]) now.
    pub fn health(&self) -> Vec<RankHealth> {
        self.slow.health(self.now_s, self.tuning.tau_s)
    }

    /// The step period and where it came from, when known.
    pub fn step(&self) -> Option<(f64, String)> {
        self.step_period()
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
        let mut out = Vec::new();
        let cx = SlowContext {
            job: &self.job,
            now_s: self.now_s,
            tuning: &self.tuning,
            nodes: &self.nodes,
            step: self.step_period(),
        };
        self.slow.findings(&cx, &mut out);
        let ranks = &self.nodes;
        self.links
            .findings(&self.job, self.now_s, |r| node_of(ranks, r), &mut out);
        self.flows.findings(&self.job, self.now_s, &mut out);
        // What the NIC counters of a slow link's nodes say.
        self.nic.corroborate(&mut out, self.now_s);
        let flows = &self.flows;
        self.link_errors
            .findings(&self.job, self.now_s, |a| flows.node_of_addr(a), &mut out);
        // A slow TCP path explains the job's slow collectives (one finding per root cause).
        if !self.flows.any_slow() {
            self.degraded_findings(&mut out);
        }
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
            let ranks = &self.nodes;
            let f = mismatch::finding(&self.job, m, &siblings, |r| node_of(ranks, r));
            if seen.insert((f.comm.clone().unwrap_or_default(), f.ranks.clone())) {
                out.push(f);
            }
        }
        let ranks = &self.nodes;
        self.errors
            .findings(&self.job, |r| node_of(ranks, r), &mut out);
        out
    }

    /// Current share of each rank (for evidence and tests): rank → share of wall time.
    pub fn shares(&self) -> BTreeMap<i32, f64> {
        self.slow.shares(self.now_s, self.tuning.tau_s)
    }

    fn degraded_findings(&mut self, out: &mut Vec<Finding>) {
        let slow = self.slow.open_ranks();
        // A communicator with a slow link is that finding's (one finding per root cause).
        let slow_links = self.links.slow_comms();
        let ranks = &self.nodes;
        // Each rank's share of its node's line rate (bytes/s): the node's ports are shared by
        // the job's ranks on it.
        let mut on_node: HashMap<&str, usize> = HashMap::new();
        for n in ranks.values() {
            *on_node.entry(n.as_str()).or_default() += 1;
        }
        let network = &self.network;
        let line_share = |r: i32| -> Option<(f64, u64, usize)> {
            let node = ranks.get(&r)?;
            let mbps = *network.get(node)?;
            let n = on_node.get(node.as_str()).copied().unwrap_or(1).max(1);
            Some((mbps as f64 * 1e6 / 8.0 / n as f64, mbps, n))
        };
        self.degraded.findings(
            &self.job,
            &self.tuning,
            self.now_s,
            &Explained {
                slow_ranks: &slow,
                slow_link_comms: &slow_links,
            },
            &Nodes {
                node_of: &|r| node_of(ranks, r),
                line_share: &line_share,
            },
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
    /// completes. `calls`: (rank, comm, seq, shape, the communicator's size or 0). An instance
    /// is judged once every member is seen in it (entered, or completed): live, the members'
    /// snapshots arrive one by one, and the first disagreement seen is kept — judged on two of
    /// eight members, it would be a tie that names the wrong rank.
    pub fn in_flight_shapes(
        &mut self,
        calls: impl IntoIterator<Item = (i32, u64, u64, Shape, usize)>,
    ) {
        /// Per instance: the communicator's size, and each member's call.
        type Calls = (usize, Vec<(i32, Shape)>);
        let mut by: HashMap<(u64, u64), Calls> = HashMap::new();
        for (r, comm, seq, s, size) in calls {
            let e = by.entry((comm, seq)).or_default();
            e.0 = e.0.max(size);
            e.1.push((r, s));
        }
        for (key, (comm_size, calls)) in by {
            if self.mismatches.contains_key(&key) {
                continue;
            }
            let mut members: Vec<(i32, Shape)> = Vec::new();
            let mut seen: BTreeSet<i32> = BTreeSet::new();
            let size = self.pending.get(&key).map_or(0, |p| p.size).max(comm_size);
            if let Some(p) = self.pending.get(&key) {
                for e in &p.entries {
                    if seen.insert(e.member.rank) {
                        members.push((e.member.rank, e.shape));
                    }
                }
            }
            for (r, s) in calls {
                if seen.insert(r) {
                    members.push((r, s));
                }
            }
            if seen.len() < size {
                continue;
            }
            let shapes = Shape::group(&members);
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
}

impl Detectors {
    /// Per rank, highest share first: (rank, share, decayed late, max per-comm late ratio,
    /// blame in seconds) — for looking into verdicts.
    pub fn debug_ranks(&self) -> Vec<(i32, f64, f64, f64, f64)> {
        self.slow.debug_ranks(self.now_s, self.tuning.tau_s)
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
