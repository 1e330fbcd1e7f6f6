//! A synthetic training job for testing the detectors: N ranks on N/8 nodes, a tensor-parallel
//! communicator per node, pipeline stages joined by point-to-point sends, data-parallel
//! communicators across replicas and the world communicator; each step is microbatches of
//! compute and collectives (forward and backward through the pipeline), a gradient all-reduce per
//! data-parallel group, and a loss all-reduce on the world communicator (so the world
//! communicator's `seq` is the step number). Compute has jitter and rare OS-noise spikes; each
//! node's monotonic clock has its own offset, as on real machines.
//!
//! Faults (the contract's `--fault` tokens) change what the ranks do; [`expected`] says what a
//! correct diagnosis names. The job runs in virtual time ([`run_virtual`]: whole traces in
//! milliseconds, for the accuracy benchmark) or step by step in real time (`commscope simulate`,
//! which streams the records to a collector as the nodes' agents would).

use std::collections::{BTreeSet, HashMap};

use commscope_analyzer::finding::Kind;
use commscope_wire::cst::Header;
use commscope_wire::hash::Hasher;
use commscope_wire::op::{Clock, Op, dtype, flags};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::{
    Call, Comm, CommEvent, EXIT_STATUS_UNKNOWN, Heartbeat, Link, Process, ProcessEvent,
    RECORD_SIZE, Record,
};
use commscope_wire::sampling::{Rates, Sampler};

/// A small deterministic generator (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-12);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// An injected fault (the contract's `--fault` tokens).
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The rank computes slower from the onset step on.
    Straggler { rank: i32 },
    /// Every rank of the node computes slower from the onset step on.
    SlowNode { node: String },
    /// The rank stops calling (computes forever) at world seq `seq`: at the step's start or
    /// between two of the step's collectives.
    Hang { rank: i32, seq: Option<u64> },
    /// The rank calls a broadcast where the others call the world all-reduce `seq`.
    Mismatch { rank: i32, seq: Option<u64> },
    /// The rank's process is killed (signal 9) at world seq `seq`, between calls or inside
    /// one; its peers never exit.
    Dead { rank: i32, seq: Option<u64> },
    /// Inter-node transfers slow down from the onset step on (`degraded:0`: from the start).
    Degraded { from: Option<u64> },
    /// Every member of the world communicator enters instance `seq` and it never completes;
    /// every process stays alive and keeps its heartbeats.
    Stall { seq: Option<u64> },
    /// The rank dies at `seq` and the launcher kills every other rank about 1 s later.
    Teardown { rank: i32, seq: Option<u64> },
    /// The rank's process stops, heartbeats included, inside its next collective after `seq`,
    /// once its peers in it have entered too.
    Freeze { rank: i32, seq: Option<u64> },
    /// The rank is a straggler one step in `every`.
    Flaky { rank: i32, every: u64 },
}

/// The tokens, for messages.
const TOKENS: &str = "straggler:R, slow-node:NODE, hang:R[:SEQ], mismatch:R[:SEQ], dead:R[:SEQ], degraded[:STEP], stall[:SEQ], teardown:R[:SEQ], freeze:R[:SEQ] or flaky:R[:EVERY]";

impl Fault {
    /// Parses a token (see [`TOKENS`]).
    pub fn parse(s: &str) -> Result<Fault, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let rank = |i: usize| -> Result<i32, String> {
            parts
                .get(i)
                .ok_or_else(|| format!("fault {s:?}: a rank is missing (e.g. {}:3)", parts[0]))?
                .parse::<i32>()
                .ok()
                .filter(|r| *r >= 0)
                .ok_or_else(|| format!("fault {s:?}: {:?} is not a rank", parts[i]))
        };
        let number = |i: usize| -> Result<Option<u64>, String> {
            match parts.get(i) {
                None => Ok(None),
                Some(x) => x
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| format!("fault {s:?}: {x:?} is not a number")),
            }
        };
        let max_parts = match parts[0] {
            "degraded" | "stall" | "straggler" | "slow-node" => 2,
            _ => 3,
        };
        if parts.len() > max_parts {
            return Err(format!("fault {s:?}: too many fields"));
        }
        Ok(match parts[0] {
            "straggler" => Fault::Straggler { rank: rank(1)? },
            "slow-node" => Fault::SlowNode {
                node: parts
                    .get(1)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| {
                        format!("fault {s:?}: a node is missing (e.g. slow-node:node-003)")
                    })?
                    .to_string(),
            },
            "hang" => Fault::Hang {
                rank: rank(1)?,
                seq: number(2)?,
            },
            "mismatch" => Fault::Mismatch {
                rank: rank(1)?,
                seq: number(2)?,
            },
            "dead" => Fault::Dead {
                rank: rank(1)?,
                seq: number(2)?,
            },
            "degraded" => Fault::Degraded { from: number(1)? },
            "stall" => Fault::Stall { seq: number(1)? },
            "teardown" => Fault::Teardown {
                rank: rank(1)?,
                seq: number(2)?,
            },
            "freeze" => Fault::Freeze {
                rank: rank(1)?,
                seq: number(2)?,
            },
            "flaky" => Fault::Flaky {
                rank: rank(1)?,
                every: match number(2)? {
                    None => 4,
                    Some(e) if e >= 2 => e,
                    Some(e) => return Err(format!("fault {s:?}: EVERY is {e}; use 2 or more")),
                },
            },
            other => return Err(format!("unknown fault {other:?}: use {TOKENS}")),
        })
    }

    /// The token again.
    pub fn token(&self) -> String {
        let opt = |s: &Option<u64>| s.map(|s| format!(":{s}")).unwrap_or_default();
        match self {
            Fault::Straggler { rank } => format!("straggler:{rank}"),
            Fault::SlowNode { node } => format!("slow-node:{node}"),
            Fault::Hang { rank, seq } => format!("hang:{rank}{}", opt(seq)),
            Fault::Mismatch { rank, seq } => format!("mismatch:{rank}{}", opt(seq)),
            Fault::Dead { rank, seq } => format!("dead:{rank}{}", opt(seq)),
            Fault::Degraded { from } => format!("degraded{}", opt(from)),
            Fault::Stall { seq } => format!("stall{}", opt(seq)),
            Fault::Teardown { rank, seq } => format!("teardown:{rank}{}", opt(seq)),
            Fault::Freeze { rank, seq } => format!("freeze:{rank}{}", opt(seq)),
            Fault::Flaky { rank, every } => format!("flaky:{rank}:{every}"),
        }
    }

    /// The world seq (step) at which it starts, given the job's onset step.
    /// A straggler, slow node, flaky rank or degradation: it makes things slow, not stuck.
    pub fn is_slow(&self) -> bool {
        matches!(
            self,
            Fault::Straggler { .. }
                | Fault::SlowNode { .. }
                | Fault::Flaky { .. }
                | Fault::Degraded { .. }
        )
    }

    pub fn start(&self, onset: u64) -> u64 {
        match self {
            Fault::Hang { seq, .. }
            | Fault::Mismatch { seq, .. }
            | Fault::Dead { seq, .. }
            | Fault::Stall { seq }
            | Fault::Teardown { seq, .. }
            | Fault::Freeze { seq, .. } => seq.unwrap_or(onset),
            Fault::Degraded { from } => from.unwrap_or(onset),
            _ => onset,
        }
    }

    /// The rank it is injected into, if one.
    pub fn rank(&self) -> Option<i32> {
        match self {
            Fault::Straggler { rank }
            | Fault::Hang { rank, .. }
            | Fault::Mismatch { rank, .. }
            | Fault::Dead { rank, .. }
            | Fault::Teardown { rank, .. }
            | Fault::Freeze { rank, .. }
            | Fault::Flaky { rank, .. } => Some(*rank),
            _ => None,
        }
    }
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Spec {
    pub job: String,
    /// Ranks (a multiple of `per_node`).
    pub ranks: usize,
    pub per_node: usize,
    /// Steps at most (a hang ends the job earlier).
    pub steps: u64,
    pub seed: u64,
    pub faults: Vec<Fault>,
    /// Microbatches per step.
    pub micro: usize,
    /// Forward compute per microbatch (backward is twice that), ms.
    pub compute_ms: f64,
    /// Relative standard deviation of compute.
    pub jitter: f64,
    /// Probability of an OS-noise spike per compute phase, and its size (ms).
    pub spike_p: f64,
    pub spike_ms: f64,
    /// Step at which stragglers, slow nodes and degradation start; default world seq of
    /// hangs, mismatches and deaths.
    pub onset_step: u64,
    /// Compute slowdown of stragglers and slow nodes (1.5: 50 % longer).
    pub slow_factor: f64,
    /// Transfer slowdown of `degraded`.
    pub degrade_factor: f64,
    /// Seconds the job stays up after every rank stopped progressing.
    pub tail_s: f64,
    /// Consistent sampling from the start: every communicator at this modulus (1: none), as
    /// agents told so by the collector would apply it.
    pub sample_modulus: u32,
    /// Tensor-parallel group size (0: a node's ranks) and pipeline stages (0: 4 when there are
    /// at least 8 tensor-parallel groups in a multiple of 4, else 1); data parallelism takes
    /// the rest.
    pub tp: usize,
    pub pp: usize,
    /// Members leave a collective up to this far apart (ns), in the algorithm's order.
    pub exit_spread_ns: u64,
    /// Relative standard deviation of each rank's own, persistent compute speed.
    pub skew: f64,
    /// Also write the link records NCCL's profiler plugin would (ring sends between nodes).
    pub links: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            job: "sim".into(),
            ranks: 1024,
            per_node: 8,
            steps: 40,
            seed: 1,
            faults: Vec::new(),
            micro: 2,
            compute_ms: 10.0,
            jitter: 0.02,
            spike_p: 0.002,
            spike_ms: 15.0,
            onset_step: 6,
            slow_factor: 1.5,
            degrade_factor: 4.0,
            tail_s: 12.0,
            sample_modulus: 1,
            tp: 0,
            pp: 0,
            exit_spread_ns: 30_000,
            skew: 0.005,
            links: false,
        }
    }
}

/// When a record happened on its process's monotonic clock (None: it carries no time).
fn record_mono(rec: &Record) -> Option<u64> {
    Some(match rec {
        Record::Call(c) => c.span().1,
        Record::Enter(c) => c.t_enter,
        Record::Heartbeat(h) => h.t_mono,
        Record::Skip(k) => k.t_last,
        Record::Process(p) => p.t_mono,
        Record::Comm(c) => c.t,
        Record::Link(l) => l.t_end,
        _ => return None,
    })
}

/// How ranks are laid out: rank = ((replica × stages) + stage) × tp + t; nodes hold
/// `per_node` consecutive ranks.
#[derive(Clone, Copy, Debug)]
pub struct Topology {
    pub per_node: usize,
    pub nodes: usize,
    /// Tensor-parallel group size.
    pub tp: usize,
    /// Pipeline stages.
    pub stages: usize,
    /// Data-parallel replicas.
    pub replicas: usize,
}

impl Topology {
    /// The default shape of `ranks` ranks (tensor parallelism over a node).
    pub fn of(ranks: usize, per_node: usize) -> Topology {
        Topology::new(ranks, per_node, 0, 0).unwrap_or(Topology {
            per_node: per_node.max(1),
            nodes: ranks.div_ceil(per_node.max(1)).max(1),
            tp: per_node.max(1),
            stages: 1,
            replicas: ranks.div_ceil(per_node.max(1)).max(1),
        })
    }

    /// A shape: `tp` 0 is a node's ranks, `pp` 0 picks as [`Spec::pp`] says.
    pub fn new(ranks: usize, per_node: usize, tp: usize, pp: usize) -> Result<Topology, String> {
        let per_node = per_node.max(1);
        if ranks < 2 || !ranks.is_multiple_of(per_node) {
            return Err(format!(
                "--ranks {ranks}: use a multiple of {per_node} (ranks per node), at least 2"
            ));
        }
        let tp = if tp == 0 { per_node.min(ranks) } else { tp };
        if !ranks.is_multiple_of(tp) {
            return Err(format!("--tp {tp}: it must divide --ranks {ranks}"));
        }
        let groups = ranks / tp;
        let stages = match pp {
            0 if groups >= 8 && groups.is_multiple_of(4) => 4,
            0 => 1,
            p => p,
        };
        if !groups.is_multiple_of(stages) {
            return Err(format!(
                "--pp {stages}: it must divide the {groups} tensor-parallel groups"
            ));
        }
        Ok(Topology {
            per_node,
            nodes: ranks / per_node,
            tp,
            stages,
            replicas: groups / stages,
        })
    }

    pub fn ranks(&self) -> usize {
        self.nodes * self.per_node
    }

    pub fn node_of(&self, r: usize) -> usize {
        r / self.per_node
    }

    pub fn stage_of(&self, r: usize) -> usize {
        (r / self.tp) % self.stages
    }

    pub fn replica_of(&self, r: usize) -> usize {
        r / (self.tp * self.stages)
    }

    pub fn rank_at(&self, replica: usize, stage: usize, t: usize) -> usize {
        (replica * self.stages + stage) * self.tp + t
    }

    pub fn node_name(&self, n: usize) -> String {
        format!("node-{n:03}")
    }

    /// The ranks of a node.
    pub fn node_ranks(&self, n: usize) -> std::ops::Range<usize> {
        n * self.per_node..(n + 1) * self.per_node
    }

    /// Whether a tensor-parallel group spans nodes.
    fn tp_spans_nodes(&self) -> bool {
        self.tp > self.per_node || !self.per_node.is_multiple_of(self.tp)
    }
}

/// What a correct diagnosis of one fault names: one of these kinds, and exactly these ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub kinds: Vec<Kind>,
    pub ranks: Vec<i32>,
    /// Independent culprits: one finding naming them all, or one finding each (hung ranks
    /// that block the same instance are one cause, ranks that block different ones are not).
    pub split_ok: bool,
    /// It may or may not be found (a slow fault that acted only briefly before the job
    /// stopped): never missing, and a finding that meets it is not extra.
    pub optional: bool,
}

impl Expected {
    /// Whether a finding is this one (or, when it may be split, one of its parts).
    pub fn matches(&self, kind: Kind, ranks: &[i32]) -> bool {
        self.kinds.contains(&kind)
            && (self.ranks == ranks
                || (self.split_ok
                    && !ranks.is_empty()
                    && ranks.iter().all(|r| self.ranks.contains(r))))
    }

    /// "hang or dead-rank".
    pub fn kinds_phrase(&self) -> String {
        self.kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// The expected finding of a fault in a job of this shape.
pub fn expected(fault: &Fault, topo: &Topology) -> Result<Expected, String> {
    let check = |r: i32| {
        if (r as usize) < topo.ranks() {
            Ok(vec![r])
        } else {
            Err(format!(
                "fault {}: rank {r} is not in a job of {} ranks",
                fault.token(),
                topo.ranks()
            ))
        }
    };
    let one = |kind: Kind, r: i32| -> Result<Expected, String> {
        Ok(Expected {
            kinds: vec![kind],
            ranks: check(r)?,
            split_ok: false,
            optional: false,
        })
    };
    match fault {
        Fault::Straggler { rank } | Fault::Flaky { rank, .. } => one(Kind::SlowRank, *rank),
        Fault::SlowNode { node } => {
            let n = node_index(node, topo)?;
            Ok(Expected {
                kinds: vec![Kind::SlowRank],
                ranks: topo.node_ranks(n).map(|r| r as i32).collect(),
                split_ok: false,
                optional: false,
            })
        }
        Fault::Hang { rank, .. } => one(Kind::Hang, *rank),
        Fault::Mismatch { rank, .. } => one(Kind::Mismatch, *rank),
        Fault::Dead { rank, .. } | Fault::Teardown { rank, .. } => one(Kind::DeadRank, *rank),
        Fault::Freeze { rank, .. } => Ok(Expected {
            kinds: vec![Kind::Hang, Kind::DeadRank],
            ranks: check(*rank)?,
            split_ok: false,
            optional: false,
        }),
        Fault::Degraded { .. } => Ok(Expected {
            kinds: vec![Kind::DegradedCollective],
            ranks: vec![],
            split_ok: false,
            optional: false,
        }),
        Fault::Stall { .. } => Ok(Expected {
            kinds: vec![Kind::Hang],
            ranks: vec![],
            split_ok: false,
            optional: false,
        }),
    }
}

/// How findings compare with what the faults should give: every expectation must be met by a
/// finding, and every finding must meet an expectation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Expectations no finding met (indices into the expectations).
    pub missing: Vec<usize>,
    /// Findings no expectation explains: (kind, ranks).
    pub extra: Vec<(Kind, Vec<i32>)>,
}

impl Verdict {
    pub fn exact(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty()
    }
}

/// Judges findings `(kind, ranks)` against expectations. Each finding explains at most one
/// expectation. An expectation takes the finding that names exactly its ranks; when it may be
/// split and none does, it takes findings naming disjoint parts of it. Whatever is left over is
/// extra: a finding naming a hung pair alongside findings naming each of the two ("both forms at
/// once"), or the same finding twice, is an error.
pub fn judge(want: &[Expected], found: &[(Kind, Vec<i32>)]) -> Verdict {
    let mut used = vec![false; found.len()];
    let mut missing = Vec::new();
    // What must be found takes its findings first; what may be found, what is left.
    let mut order: Vec<usize> = (0..want.len()).collect();
    order.sort_by_key(|i| want[*i].optional);
    for i in order {
        let e = &want[i];
        let whole = (0..found.len())
            .find(|j| !used[*j] && e.kinds.contains(&found[*j].0) && found[*j].1 == e.ranks);
        if let Some(j) = whole {
            used[j] = true;
            continue;
        }
        let mut covered: Vec<i32> = Vec::new();
        if e.split_ok {
            for j in 0..found.len() {
                let (k, r) = &found[j];
                if !used[j] && e.matches(*k, r) && !r.iter().any(|x| covered.contains(x)) {
                    used[j] = true;
                    covered.extend(r);
                }
            }
        }
        covered.sort_unstable();
        // Parts meet it only when there are some (an expectation of no rank needs its finding).
        if !e.optional && (covered.is_empty() || covered != e.ranks) {
            missing.push(i);
        }
    }
    missing.sort_unstable();
    Verdict {
        missing,
        extra: found
            .iter()
            .zip(&used)
            .filter(|(_, u)| !**u)
            .map(|(f, _)| f.clone())
            .collect(),
    }
}

/// What faults `f` should give together: each its own finding, except hung ranks (one `hang`
/// naming them all when they block the same instances, else one each) and slow ranks (one
/// finding per slow node or rank, or one naming them all).
pub fn expected_all(faults: &[Fault], topo: &Topology) -> Result<Vec<Expected>, String> {
    let mut out = Vec::new();
    let mut hung: Vec<i32> = Vec::new();
    // Slow ranks (stragglers, slow nodes): one finding or several, naming exactly them.
    let mut slow: Vec<i32> = Vec::new();
    for f in faults {
        match f {
            Fault::Hang { rank, .. } => {
                expected(f, topo)?;
                hung.push(*rank);
            }
            Fault::Straggler { .. } | Fault::SlowNode { .. } => {
                slow.extend(expected(f, topo)?.ranks);
            }
            _ => out.push(expected(f, topo)?),
        }
    }
    slow.sort_unstable();
    slow.dedup();
    if !slow.is_empty() {
        out.push(Expected {
            kinds: vec![Kind::SlowRank],
            split_ok: true,
            optional: false,
            ranks: slow,
        });
    }
    if !hung.is_empty() {
        hung.sort_unstable();
        out.push(Expected {
            kinds: vec![Kind::Hang],
            split_ok: hung.len() > 1,
            optional: false,
            ranks: hung,
        });
    }
    Ok(out)
}

/// A node given as `node-007` or `7`.
fn node_index(node: &str, topo: &Topology) -> Result<usize, String> {
    let n = node
        .strip_prefix("node-")
        .unwrap_or(node)
        .parse::<usize>()
        .map_err(|_| {
            format!(
                "slow-node:{node}: nodes are named node-000 … node-{:03}",
                topo.nodes - 1
            )
        })?;
    if n >= topo.nodes {
        return Err(format!(
            "slow-node:{node}: the job has {} nodes (node-000 … node-{:03})",
            topo.nodes,
            topo.nodes - 1
        ));
    }
    Ok(n)
}

/// A rank's condition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RankState {
    Running,
    /// Stopped calling the library (a hang outside it) at this global time.
    Stopped(u64),
    /// Inside a call that cannot complete (local-clock `t_enter` in the call).
    Blocked(Call),
    /// Inside a call, its process stopped (no heartbeats, kernel state `T`).
    Frozen(Call),
    /// Killed at this global time.
    Dead(u64),
}

/// Something done to one collective instance.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Inject {
    /// This rank calls a broadcast instead.
    Odd(usize),
    /// Everyone enters; it never completes.
    Stall,
    /// Everyone enters, this rank last, and its process stops.
    Freeze(usize),
    /// Everyone enters, and this rank's process is killed inside.
    DieInside(usize),
}

/// Where in a step a rank stops or dies.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Before the step's first call.
    Start,
    /// Before the data-parallel all-reduce.
    BeforeDp,
    /// Before the world all-reduce (or inside it, for a death).
    BeforeWorld,
}

const WORLD: usize = 0;
const TP: usize = 1;
const DP: usize = 2;
const PP: usize = 3;

const TP_BYTES: u64 = 16 << 20;
const DP_BYTES: u64 = 64 << 20;
const PP_BYTES: u64 = 8 << 20;
const MS: f64 = 1e6;

/// The running simulation.
#[derive(Debug)]
pub struct Sim {
    pub spec: Spec,
    pub topo: Topology,
    rng: Rng,
    /// Per rank: global time (ns) at which it is free.
    t: Vec<u64>,
    pub state: Vec<RankState>,
    out: Vec<Vec<Record>>,
    rec_seq: Vec<u64>,
    /// Per rank, per communicator kind: collectives issued.
    seq: Vec<[u64; 4]>,
    p2p_seq: HashMap<(usize, usize), u64>,
    next_beat: Vec<u64>,
    /// Per node: its monotonic clock at global time 0.
    clock_off: Vec<u64>,
    /// Realtime clock at global time 0.
    pub epoch: u64,
    pub step: u64,
    /// Global time at which each step began (index: step).
    pub step_began: Vec<u64>,
    /// Global time at which the last rank stopped progressing.
    pub stuck_since: Option<u64>,
    /// Per rank: slow one step in this many from the onset on (1: every step), or never.
    slow: Vec<Option<u64>>,
    /// Per rank: its own persistent compute speed factor.
    speed: Vec<f64>,
    /// Per fault: where in its step it strikes.
    phases: Vec<Phase>,
    /// A freeze waiting for its rank's next collective.
    freeze_pending: Option<usize>,
    /// When the launcher kills every remaining rank (a teardown), global time.
    pub teardown_at: Option<u64>,
    /// Per fault: whether it struck (a rank already blocked behind another fault never stops,
    /// dies or freezes itself).
    pub struck: Vec<bool>,
    /// Per rank: a running rank blocked in a call it is a member of, while it was stopped.
    waited_on: Vec<bool>,
    sends: HashMap<(usize, usize, usize, bool), u64>,
    /// Comm ids per rank: world, tp, dp, pp.
    comm_ids: Vec<[u64; 4]>,
    /// Consistent sampling, as each node's agent applies it: rates per node, a sampler per rank.
    rates: Vec<Rates>,
    samplers: Vec<Sampler>,
    /// Calls left out so far.
    pub sampled_out: u64,
}

fn comm_id(kind: &str, a: usize, b: usize) -> u64 {
    Hasher::new()
        .str("commscope-sim")
        .str(kind)
        .word(a as u64)
        .word(b as u64)
        .finish()
}

impl Sim {
    /// A new job; `epoch` is the realtime clock (ns) at its global time 0.
    pub fn new(spec: Spec, epoch: u64) -> Result<Sim, String> {
        let topo = Topology::new(spec.ranks, spec.per_node, spec.tp, spec.pp)?;
        for f in &spec.faults {
            expected(f, &topo)?;
        }
        let n = topo.ranks();
        let mut rng = Rng::new(spec.seed);
        let clock_off = (0..topo.nodes)
            .map(|_| 1_000_000_000_000 + rng.below(1_000_000_000_000_000))
            .collect();
        let speed = (0..n)
            .map(|_| (1.0 + spec.skew * rng.normal()).max(0.5))
            .collect();
        let mut slow = vec![None; n];
        for f in &spec.faults {
            match f {
                Fault::Straggler { rank } => slow[*rank as usize] = Some(1),
                Fault::Flaky { rank, every } => slow[*rank as usize] = Some(*every),
                Fault::SlowNode { node } => {
                    for r in topo.node_ranks(node_index(node, &topo)?) {
                        slow[r] = Some(1);
                    }
                }
                _ => {}
            }
        }
        let phases = spec
            .faults
            .iter()
            .map(|_| match rng.below(3) {
                0 => Phase::Start,
                1 if topo.replicas >= 2 => Phase::BeforeDp,
                _ => Phase::BeforeWorld,
            })
            .collect();
        let comm_ids = (0..n)
            .map(|r| {
                [
                    comm_id("world", 0, 0),
                    comm_id("tp", r / topo.tp, 0),
                    comm_id("dp", topo.stage_of(r), r % topo.tp),
                    comm_id("pp", topo.replica_of(r), r % topo.tp),
                ]
            })
            .collect();
        let mut sim = Sim {
            topo,
            rng,
            t: vec![0; n],
            state: vec![RankState::Running; n],
            out: vec![Vec::new(); n],
            rec_seq: vec![0; n],
            seq: vec![[0; 4]; n],
            p2p_seq: HashMap::new(),
            next_beat: (0..n)
                .map(|r| (r as u64 * 7_919_000) % 1_000_000_000)
                .collect(),
            clock_off,
            epoch,
            step: 0,
            step_began: Vec::new(),
            stuck_since: None,
            slow,
            speed,
            phases,
            freeze_pending: None,
            teardown_at: None,
            struck: vec![false; spec.faults.len()],
            waited_on: vec![false; n],
            sends: HashMap::new(),
            comm_ids,
            rates: vec![Rates::default(); topo.nodes],
            samplers: (0..n).map(|_| Sampler::default()).collect(),
            sampled_out: 0,
            spec,
        };
        if sim.spec.sample_modulus > 1 {
            let ids: BTreeSet<u64> = sim.comm_ids.iter().flatten().copied().collect();
            for rates in &mut sim.rates {
                for id in &ids {
                    rates.set(*id, sim.spec.sample_modulus, 0);
                }
            }
        }
        sim.prologue();
        Ok(sim)
    }

    /// Each process's header.
    pub fn header(&self, r: usize) -> Header {
        let node = self.topo.node_of(r);
        Header {
            job: self.spec.job.clone(),
            node: self.topo.node_name(node),
            pid: self.pid(r),
            rank: r as i32,
            world_size: self.topo.ranks() as i32,
            start_time: 100 + r as u64,
            mono_anchor: self.clock_off[node],
            real_anchor: self.epoch,
            library: "commscope simulator".into(),
            flavour: "sim".into(),
            ..Default::default()
        }
    }

    /// Rank `r`'s process id.
    fn pid(&self, r: usize) -> u32 {
        1000 + (r % self.topo.per_node) as u32
    }

    /// An exit record of rank `r` at global time `g`.
    fn exit_record(&self, r: usize, g: u64, fl: u16, exit_status: i32, signal: i32) -> Record {
        Record::Process(Process {
            rec_seq: 0,
            event: ProcessEvent::Exit,
            flags: fl,
            t_mono: self.mono(r, g),
            t_real: self.epoch + g,
            pid: self.pid(r),
            exit_status,
            start_time: 100 + r as u64,
            rank: r as i32,
            world_size: self.topo.ranks() as i32,
            signal,
            step: 0,
        })
    }

    /// Rank `r` is killed by `signal` at global time `g` (its agent sees it).
    fn kill(&mut self, r: usize, g: u64, signal: i32) {
        if matches!(self.state[r], RankState::Dead(_)) {
            return;
        }
        self.beats_until(r, g);
        let p = self.exit_record(r, g, flags::OBSERVED, EXIT_STATUS_UNKNOWN, signal);
        self.push_raw(r, p);
        self.state[r] = RankState::Dead(g);
    }

    /// Rank `r`'s monotonic clock at global time `g`.
    pub fn mono(&self, r: usize, g: u64) -> u64 {
        self.clock_off[self.topo.node_of(r)] + g
    }

    /// Communicator sizes: world, tp, dp, pp.
    fn sizes(&self) -> [i32; 4] {
        [
            self.topo.ranks() as i32,
            self.topo.tp as i32,
            self.topo.replicas as i32,
            self.topo.stages as i32,
        ]
    }

    /// Rank of `r` in communicator kind `k`.
    fn comm_rank(&self, r: usize, k: usize) -> i32 {
        (match k {
            WORLD => r,
            TP => r % self.topo.tp,
            DP => self.topo.replica_of(r),
            _ => self.topo.stage_of(r),
        }) as i32
    }

    fn prologue(&mut self) {
        let sizes = self.sizes();
        for r in 0..self.topo.ranks() {
            // What the shim reads from sysfs: one 400 Gbit/s port per rank of the node.
            let rec = Record::Process(Process {
                rec_seq: 0,
                event: ProcessEvent::Network,
                flags: 0,
                t_mono: self.mono(r, 0),
                t_real: self.epoch,
                pid: self.pid(r),
                exit_status: EXIT_STATUS_UNKNOWN,
                start_time: 100 + r as u64,
                rank: r as i32,
                world_size: self.topo.ranks() as i32,
                signal: 0,
                step: PORT_MBPS * self.topo.per_node as u64,
            });
            self.push_raw(r, rec);
            for k in [WORLD, TP, DP, PP] {
                if sizes[k] < 2 && k != WORLD {
                    continue;
                }
                let mut c = Comm::new(
                    CommEvent::Created,
                    self.comm_ids[r][k],
                    if k == WORLD {
                        0
                    } else {
                        self.comm_ids[r][WORLD]
                    },
                    self.mono(r, 0),
                    r as i32,
                    self.comm_rank(r, k),
                    sizes[k],
                    0,
                );
                c.set_name(["world", "tensor-parallel", "data-parallel", "pipeline"][k].as_bytes());
                self.push(r, Record::Comm(c), 0);
            }
        }
    }

    /// Appends a record of rank `r` at global time `g`, with the heartbeats due before it.
    fn push(&mut self, r: usize, rec: Record, g: u64) {
        self.beats_until(r, g);
        self.push_raw(r, rec);
    }

    fn push_raw(&mut self, r: usize, mut rec: Record) {
        self.rec_seq[r] += 1;
        let s = self.rec_seq[r];
        rec.set_rec_seq(s);
        self.out[r].push(rec);
    }

    fn beats_until(&mut self, r: usize, g: u64) {
        if matches!(self.state[r], RankState::Dead(_) | RankState::Frozen(_)) {
            return;
        }
        while self.next_beat[r] <= g {
            let at = self.next_beat[r];
            let hb = Heartbeat {
                t_mono: self.mono(r, at),
                t_real: self.epoch + at,
                in_flight: u32::from(matches!(self.state[r], RankState::Blocked(_))),
                rank: r as i32,
                produced: self.rec_seq[r] + 1,
                ..Default::default()
            };
            self.push_raw(r, Record::Heartbeat(hb));
            self.next_beat[r] += 1_000_000_000;
        }
    }

    /// Time passes up to global time `g`: a teardown due kills the remaining ranks, and every
    /// live rank beats (stopped and blocked ranks keep beating, dead and frozen ones do not).
    pub fn beat_all(&mut self, g: u64) {
        if let Some(k) = self.teardown_at
            && g >= k
        {
            for r in 0..self.topo.ranks() {
                self.kill(r, k, 15);
            }
        }
        for r in 0..self.topo.ranks() {
            self.beats_until(r, g);
        }
    }

    /// Takes the records produced so far for rank `r`, sampled as its node's agent would: at
    /// the process's exit, the calls sampling still holds go out in their skips first.
    pub fn take(&mut self, r: usize) -> Vec<Record> {
        let recs = std::mem::take(&mut self.out[r]);
        self.sampled(r, recs)
    }

    /// Like [`Sim::take`], only the records rank `r` wrote by global time `g`: the first one
    /// later than that and all after it stay. A step is generated whole, up to a step ahead of
    /// the job's clock, and an agent never reads a record before its process wrote it (a
    /// collector puts a record that claims to come from its future at its arrival, which would
    /// reorder the job's calls).
    pub fn take_until(&mut self, r: usize, g: u64) -> Vec<Record> {
        let limit = self.mono(r, g);
        let due = self.out[r]
            .iter()
            .position(|x| record_mono(x).is_some_and(|t| t > limit))
            .unwrap_or(self.out[r].len());
        let recs: Vec<Record> = self.out[r].drain(..due).collect();
        self.sampled(r, recs)
    }

    /// `recs` of rank `r`, sampled as its node's agent would.
    fn sampled(&mut self, r: usize, recs: Vec<Record>) -> Vec<Record> {
        let rates = &self.rates[self.topo.node_of(r)];
        let sampler = &mut self.samplers[r];
        if recs.is_empty() || (rates.is_empty() && !sampler.has_open()) {
            return recs;
        }
        let exit = recs
            .iter()
            .position(|x| matches!(x, Record::Process(p) if p.event == ProcessEvent::Exit))
            .unwrap_or(recs.len());
        let encode = |rs: &[Record]| -> Vec<u8> { rs.iter().flat_map(|x| x.encode()).collect() };
        let mut out = Vec::with_capacity(recs.len() * RECORD_SIZE);
        let f = sampler.filter(rates, &encode(&recs[..exit]), &mut out);
        self.sampled_out += f.left_out;
        if exit < recs.len() {
            sampler.flush(&mut out);
            let f = sampler.filter(rates, &encode(&recs[exit..]), &mut out);
            self.sampled_out += f.left_out;
        }
        out.chunks_exact(RECORD_SIZE)
            .filter_map(|c| Record::decode(c.try_into().ok()?).ok())
            .collect()
    }

    /// A rate from the collector, as node `node`'s agent received it.
    pub fn set_rate(&mut self, node: usize, comm: u64, modulus: u32, from_seq: u64) {
        if let Some(r) = self.rates.get_mut(node) {
            r.set(comm, modulus, from_seq);
        }
    }

    /// Node `node`'s agent got the collector's whole list of rates `(comm, modulus, from_seq)`:
    /// communicators not in it keep everything from now on.
    pub fn replace_rates(&mut self, node: usize, list: &[(u64, u32, u64)]) {
        let Some(table) = self.rates.get_mut(node) else {
            return;
        };
        let gone: Vec<u64> = table
            .iter()
            .map(|(c, _)| c)
            .filter(|c| !list.iter().any(|l| l.0 == *c))
            .collect();
        for c in gone {
            table.set(c, 1, 0);
        }
        for &(c, k, from) in list {
            table.set(c, k, from);
        }
    }

    /// Every communicator id of the job.
    pub fn comm_ids(&self) -> BTreeSet<u64> {
        self.comm_ids.iter().flatten().copied().collect()
    }

    /// The call rank `r` is inside, if any.
    pub fn in_flight(&self, r: usize) -> Option<Call> {
        match self.state[r] {
            RankState::Blocked(c) | RankState::Frozen(c) => Some(c),
            _ => None,
        }
    }

    /// The process state its agent would read (`T` stopped, `S` otherwise), if it runs.
    pub fn proc_state(&self, r: usize) -> Option<&'static str> {
        match self.state[r] {
            RankState::Dead(_) => None,
            RankState::Frozen(_) => Some("T"),
            _ => Some("S"),
        }
    }

    /// Whether no rank can make progress any more.
    pub fn stuck(&self) -> bool {
        self.state.iter().all(|s| !matches!(s, RankState::Running))
    }

    /// Global time at which every running rank is done with what was simulated.
    pub fn now(&self) -> u64 {
        self.t.iter().copied().max().unwrap_or(0)
    }

    fn running(&self, r: usize) -> bool {
        self.state[r] == RankState::Running
    }

    fn compute(&mut self, r: usize, ms: f64) {
        if !self.running(r) {
            return;
        }
        let mut f = self.speed[r] * (1.0 + self.spec.jitter * self.rng.normal());
        let onset = self.spec.onset_step;
        if let Some(every) = self.slow[r]
            && self.step >= onset
            && (self.step - onset).is_multiple_of(every)
        {
            f *= self.spec.slow_factor;
        }
        let mut d = ms * MS * f.max(0.1);
        if self.rng.unit() < self.spec.spike_p {
            d += self.spec.spike_ms * MS * (0.5 + self.rng.unit());
        }
        self.t[r] += d as u64;
    }

    #[allow(clippy::too_many_arguments)]
    fn call_record(
        &self,
        r: usize,
        k: usize,
        op: Op,
        bytes: u64,
        peer: i32,
        t_enter: u64,
        t_exit: u64,
        seq: u64,
        op_seq: u64,
    ) -> Call {
        Call {
            op: op as u8,
            comm_id: self.comm_ids[r][k],
            seq,
            op_seq,
            bytes,
            count: bytes / 2,
            peer,
            tag: if op.is_p2p() { 7 } else { -1 },
            t_enter: self.mono(r, t_enter),
            t_exit: self.mono(r, t_exit),
            rank: r as i32,
            comm_rank: self.comm_rank(r, k),
            comm_size: self.sizes()[k],
            dtype: if op == Op::Barrier {
                dtype::NONE
            } else {
                dtype::BFLOAT16
            },
            clock: Clock::HostMono as u8,
            peer2: -1,
            tag2: -1,
            ..Default::default()
        }
    }

    /// A collective on communicator kind `k` over `members`, with what is done to it.
    fn collective(
        &mut self,
        members: &[usize],
        k: usize,
        bytes: u64,
        xfer_ns: f64,
        inject: Option<Inject>,
    ) {
        // A freeze strikes the frozen rank's next collective.
        let inject = match (inject, self.freeze_pending) {
            (None, Some(f)) if members.contains(&f) && self.running(f) => {
                self.freeze_pending = None;
                Some(Inject::Freeze(f))
            }
            _ => inject,
        };
        let complete = inject.is_none() && members.iter().all(|&m| self.running(m));
        if !complete && members.iter().any(|&m| self.running(m)) {
            for &m in members {
                if matches!(self.state[m], RankState::Stopped(_)) {
                    self.waited_on[m] = true;
                }
            }
        }
        let last_in = members.iter().map(|&m| self.t[m]).max().unwrap_or(0);
        let exit = last_in + xfer_ns as u64;
        let spread = self.spec.exit_spread_ns;
        let n = members.len().max(1) as u64;
        for (pos, &m) in members.iter().enumerate() {
            if !self.running(m) {
                continue;
            }
            let seq = self.seq[m][k];
            self.seq[m][k] += 1;
            let (o, peer) = if inject == Some(Inject::Odd(m)) {
                (Op::Broadcast, 0)
            } else {
                (Op::Allreduce, -1)
            };
            if complete {
                // Members leave in the algorithm's order, up to `spread` apart.
                let t_exit = exit + spread * pos as u64 / n + self.rng.below(spread / 8 + 1_000);
                let t_enter = self.t[m];
                let c = self.call_record(m, k, o, bytes, peer, t_enter, t_exit, seq, seq);
                self.push(m, Record::Call(c), t_exit);
                self.t[m] = t_exit;
                if self.spec.links {
                    self.ring_links(members, pos, k, bytes, seq, (last_in, exit));
                }
                continue;
            }
            let t_enter = match inject {
                // The frozen rank enters after every peer.
                Some(Inject::Freeze(f)) if f == m => last_in + 2_000_000,
                _ => self.t[m],
            };
            let c = self.call_record(m, k, o, bytes, peer, t_enter, 0, seq, seq);
            self.block(m, c, t_enter);
            match inject {
                Some(Inject::Freeze(f)) if f == m => {
                    // Stopped 300 ms into the call: its last records (an `enter`) got out.
                    self.beats_until(m, t_enter + 300_000_000);
                    self.state[m] = RankState::Frozen(c);
                }
                Some(Inject::DieInside(d)) if d == m => {
                    let at = t_enter + 200_000_000 + self.rng.below(500_000_000);
                    self.kill(m, at, 9);
                }
                _ => {}
            }
        }
    }

    /// The link records of member `pos`'s ring send to the next member when that one is on
    /// another node, as NCCL's profiler plugin writes them (one channel, step-timed): a send
    /// record at the sender, a receive record at the receiver.
    fn ring_links(
        &mut self,
        members: &[usize],
        pos: usize,
        k: usize,
        bytes: u64,
        seq: u64,
        (t0, t1): (u64, u64),
    ) {
        let n = members.len();
        let (src, dst) = (members[pos], members[(pos + 1) % n]);
        if n < 2 || self.topo.node_of(src) == self.topo.node_of(dst) || !self.running(dst) {
            return;
        }
        let xfer = bytes * 2 * (n as u64 - 1) / n as u64;
        let span = t1.saturating_sub(t0).max(1_000);
        for (at, peer, send) in [(src, dst, true), (dst, src, false)] {
            let l = Link {
                op: Op::Allreduce as u8,
                flags: if send { flags::LINK_SEND } else { 0 },
                comm_id: self.comm_ids[at][k],
                seq,
                op_seq: seq,
                bytes: xfer,
                steps: 8,
                channels: 1,
                peer: self.comm_rank(peer, k),
                t_start: self.mono(at, t0),
                t_end: self.mono(at, t1),
                rank: at as i32,
                comm_rank: self.comm_rank(at, k),
                net_ns: span * 4 / 5,
                gpu_wait_ns: span / 20,
                peer_wait_ns: 0,
                xfer_bytes: xfer,
                steps_done: 8,
                ..Default::default()
            };
            self.push(at, Record::Link(l), t1);
        }
    }

    /// Rank `m` enters `c` and never leaves: the shim's `enter` record after 100 ms.
    fn block(&mut self, m: usize, mut c: Call, t_enter: u64) {
        c.t_exit = 0;
        self.push(m, Record::Enter(c), t_enter + 100_000_000);
        self.state[m] = RankState::Blocked(c);
        self.t[m] = self.t[m].max(t_enter);
    }

    fn send(&mut self, src: usize, dst: usize, mb: usize, fwd: bool) {
        if !self.running(src) {
            return;
        }
        let key = (src, dst);
        let op_seq = *self.p2p_seq.entry(key).or_insert(0);
        self.p2p_seq.insert(key, op_seq + 1);
        let t0 = self.t[src];
        let t1 = t0 + 20_000 + self.rng.below(10_000);
        let peer = self.comm_rank(dst, PP);
        let seq = self.seq[src][PP];
        let c = self.call_record(src, PP, Op::Send, PP_BYTES, peer, t0, t1, seq, op_seq);
        self.push(src, Record::Call(c), t1);
        self.t[src] = t1;
        self.sends.insert((src, dst, mb, fwd), t0 + 5_000);
    }

    fn recv(&mut self, dst: usize, src: usize, mb: usize, fwd: bool) {
        if !self.running(dst) {
            return;
        }
        let key = (dst, src);
        let op_seq = *self.p2p_seq.entry(key).or_insert(0);
        let peer = self.comm_rank(src, PP);
        let seq = self.seq[dst][PP];
        let t0 = self.t[dst];
        match self.sends.remove(&(src, dst, mb, fwd)) {
            Some(avail) => {
                self.p2p_seq.insert(key, op_seq + 1);
                let xfer = PP_BYTES as f64 / 25e9 * 1e9;
                let t1 = t0.max(avail) + xfer as u64 + self.rng.below(10_000);
                let c = self.call_record(dst, PP, Op::Recv, PP_BYTES, peer, t0, t1, seq, op_seq);
                self.push(dst, Record::Call(c), t1);
                self.t[dst] = t1;
            }
            None => {
                let c = self.call_record(dst, PP, Op::Recv, PP_BYTES, peer, t0, 0, seq, op_seq);
                self.block(dst, c, t0);
            }
        }
    }

    fn xfer_ns(&self, op_bytes: u64, n: usize, busbw: f64, network: bool) -> f64 {
        let n = n as f64;
        let mut t = 2.0 * (n - 1.0) / n * op_bytes as f64 / busbw * 1e9 + 20_000.0;
        let onset = self.spec.onset_step;
        let degraded = self.spec.faults.iter().any(|f| match f {
            Fault::Degraded { .. } => self.step >= f.start(onset),
            _ => false,
        });
        if network && degraded {
            t *= self.spec.degrade_factor;
        }
        t
    }

    /// The faults that strike at `phase` of this step: ranks stop, die, or are marked.
    fn strike(&mut self, phase: Phase) -> Option<Inject> {
        let s = self.step;
        let onset = self.spec.onset_step;
        let mut inject = None;
        let faults = self.spec.faults.clone();
        for (i, f) in faults.iter().enumerate() {
            if f.start(onset) != s {
                continue;
            }
            let at_phase = self.phases[i] == phase;
            let r = f.rank().map_or(0, |r| r as usize);
            let struck = match f {
                Fault::Hang { .. }
                | Fault::Dead { .. }
                | Fault::Teardown { .. }
                | Fault::Mismatch { .. } => {
                    at_phase_or_world(f, at_phase, phase) && self.running(r)
                }
                Fault::Freeze { .. } => phase == Phase::Start && self.running(r),
                Fault::Stall { .. } => phase == Phase::BeforeWorld && self.stuck_free(),
                _ => false,
            };
            if struck {
                self.struck[i] = true;
            }
            match f {
                Fault::Hang { .. } if at_phase && self.running(r) => {
                    self.state[r] = RankState::Stopped(self.t[r]);
                }
                Fault::Dead { .. } if at_phase && self.running(r) => {
                    if phase == Phase::BeforeWorld {
                        inject = Some(Inject::DieInside(r));
                    } else {
                        let at = self.t[r];
                        self.kill(r, at, 9);
                    }
                }
                Fault::Teardown { .. } if at_phase && self.running(r) => {
                    let at = self.t[r];
                    self.kill(r, at, 9);
                    // The launcher notices and takes the job down.
                    self.teardown_at = Some(at + 500_000_000 + self.rng.below(1_000_000_000));
                }
                Fault::Freeze { .. } if phase == Phase::Start => self.freeze_pending = Some(r),
                Fault::Mismatch { rank, .. } if phase == Phase::BeforeWorld => {
                    inject = Some(Inject::Odd(*rank as usize));
                }
                Fault::Stall { .. } if phase == Phase::BeforeWorld => inject = Some(Inject::Stall),
                _ => {}
            }
        }
        inject
    }

    /// Whether every rank runs (a stall needs every member to enter).
    fn stuck_free(&self) -> bool {
        self.state.iter().all(|s| *s == RankState::Running)
    }

    /// How long a slow fault acted: steps from its start to the last step every rank
    /// completed, and the seconds those steps took; `None` for other faults.
    fn slow_acted(&self, f: &Fault) -> Option<(u64, f64)> {
        if !f.is_slow() {
            return None;
        }
        // Stopped during a step (a hang, a death): that step never completed.
        let done = if self.stuck() || self.teardown_at.is_some() {
            self.step.saturating_sub(1)
        } else {
            self.step
        };
        let start = f.start(self.spec.onset_step);
        let steps = done.saturating_sub(start);
        let at = |step: u64| {
            self.step_began
                .get(step as usize)
                .copied()
                .unwrap_or_else(|| self.now())
        };
        let secs = at(done).saturating_sub(at(start)) as f64 / 1e9;
        Some((steps, if steps == 0 { 0.0 } else { secs }))
    }

    /// Whether a slow fault acted long enough to be seen: `Some(true)` surely, `Some(false)`
    /// maybe (it may or may not be told from noise), `None` not; `Some(true)` for other
    /// faults. A slow fault needs [`SURE_SLOW_STEPS`] steps; a degradation also needs the
    /// degraded-collective detector's sustain time and [`DEGRADED_MARGIN_S`] more (a burst of
    /// contention is not a slow transport).
    fn seen(&self, f: &Fault) -> Option<bool> {
        let Some((steps, secs)) = self.slow_acted(f) else {
            return Some(true);
        };
        let sustain = commscope_analyzer::stream::Tuning::default().degraded_sustain_s;
        let (sure_s, min_s) = match f {
            Fault::Degraded { .. } => (sustain + DEGRADED_MARGIN_S, sustain),
            _ => (0.0, 0.0),
        };
        if steps < MIN_SLOW_STEPS || secs < min_s {
            None
        } else {
            Some(steps >= SURE_SLOW_STEPS && secs >= sure_s)
        }
    }

    /// Slow faults that acted, but only briefly: they may or may not be told from noise.
    pub fn borderline_faults(&self) -> Vec<Fault> {
        self.spec
            .faults
            .iter()
            .filter(|f| self.seen(f) == Some(false))
            .cloned()
            .collect()
    }

    /// The faults that took effect (those that did not are hidden behind another, or acted
    /// too briefly to be seen); borderline ones are not among them.
    pub fn effective_faults(&self) -> Vec<Fault> {
        self.spec
            .faults
            .iter()
            .zip(&self.struck)
            .filter(|(f, _)| self.seen(f) == Some(true))
            .filter(|(f, s)| match f {
                // A stopped rank nobody came to wait for hangs nothing.
                Fault::Hang { rank, .. } => **s && self.waited_on[*rank as usize],
                _ => {
                    **s || !matches!(
                        f,
                        Fault::Hang { .. }
                            | Fault::Dead { .. }
                            | Fault::Teardown { .. }
                            | Fault::Mismatch { .. }
                            | Fault::Freeze { .. }
                            | Fault::Stall { .. }
                    )
                }
            })
            .map(|(f, _)| f.clone())
            .collect()
    }

    /// Simulates one step (world seq = step number). Returns false when nothing can run.
    pub fn step(&mut self) -> bool {
        if self.stuck() {
            return false;
        }
        self.step_began.push(self.now());
        self.strike(Phase::Start);
        let topo = self.topo;
        let f = self.spec.compute_ms;
        // Tensor parallelism inside a node runs over NVLink; across nodes, over the network
        // (never faster than the network's ports).
        let tp_x = self.xfer_ns(
            TP_BYTES,
            topo.tp,
            if topo.tp_spans_nodes() { 40e9 } else { 150e9 },
            topo.tp_spans_nodes() || topo.replicas < 2,
        );
        let dp_x = self.xfer_ns(DP_BYTES, topo.replicas, 40e9, true);
        for (fwd, mul) in [(true, 1.0), (false, 2.0)] {
            for mb in 0..self.spec.micro {
                let stages: Vec<usize> = if fwd {
                    (0..topo.stages).collect()
                } else {
                    (0..topo.stages).rev().collect()
                };
                for &st in &stages {
                    let prev = if fwd {
                        st.checked_sub(1)
                    } else {
                        Some(st + 1).filter(|x| *x < topo.stages)
                    };
                    let next = if fwd {
                        Some(st + 1).filter(|x| *x < topo.stages)
                    } else {
                        st.checked_sub(1)
                    };
                    for rep in 0..topo.replicas {
                        let members: Vec<usize> =
                            (0..topo.tp).map(|t| topo.rank_at(rep, st, t)).collect();
                        for (t, &r) in members.iter().enumerate() {
                            if let Some(p) = prev {
                                self.recv(r, topo.rank_at(rep, p, t), mb, fwd);
                            }
                            self.compute(r, f * mul);
                        }
                        if members.len() >= 2 {
                            self.collective(&members, TP, TP_BYTES, tp_x, None);
                        }
                        if let Some(nx) = next {
                            for (t, &r) in members.iter().enumerate() {
                                self.send(r, topo.rank_at(rep, nx, t), mb, fwd);
                            }
                        }
                    }
                }
            }
        }
        self.strike(Phase::BeforeDp);
        if topo.replicas >= 2 {
            for st in 0..topo.stages {
                for t in 0..topo.tp {
                    let members: Vec<usize> = (0..topo.replicas)
                        .map(|rep| topo.rank_at(rep, st, t))
                        .collect();
                    self.collective(&members, DP, DP_BYTES, dp_x, None);
                }
            }
        }
        let all: Vec<usize> = (0..topo.ranks()).collect();
        let world_x = 20_000.0 + 5_000.0 * (topo.ranks() as f64).log2();
        for &r in &all {
            self.compute(r, 0.5);
        }
        let inject = self.strike(Phase::BeforeWorld);
        self.collective(&all, WORLD, 8, world_x, inject);
        self.step += 1;
        if self.stuck() && self.stuck_since.is_none() {
            // Blocked and stopped ranks' clocks stand where they stopped.
            self.stuck_since = Some(self.now());
        }
        true
    }

    /// Ends the job at global time `end`: heartbeats up to it; ranks still running finalize
    /// (a final heartbeat and the shim's exit record).
    pub fn finish(&mut self, end: u64) {
        self.beat_all(end);
        for r in 0..self.topo.ranks() {
            if self.running(r) {
                let at = end.max(self.t[r]);
                let hb = Heartbeat {
                    flags: flags::FINAL,
                    t_mono: self.mono(r, at),
                    t_real: self.epoch + at,
                    rank: r as i32,
                    produced: self.rec_seq[r] + 2,
                    ..Default::default()
                };
                self.push_raw(r, Record::Heartbeat(hb));
                // The shim's own exit record after finalizing.
                let p = self.exit_record(r, at, 0, 0, 0);
                self.push_raw(r, p);
            }
        }
    }
}

/// Runs the whole job in virtual time and returns each process's trace.
pub fn run_virtual(spec: Spec) -> Result<Vec<ProcessTrace>, String> {
    Ok(simulate(spec)?.0)
}

/// Each simulated node has one network port of this rate (Mbit/s) per rank.
pub const PORT_MBPS: u64 = 400_000;

/// A slow fault that acted in fewer steps than this before the job stopped (or ended) was
/// not there long enough to be seen: it is not expected.
pub const MIN_SLOW_STEPS: u64 = 4;
/// From this many steps on it is expected; in between it may or may not be found (slow-rank
/// weighs how steady its evidence is: a straggler's first few steps mix its late instances
/// with the ones its waiting peers pass on time).
pub const SURE_SLOW_STEPS: u64 = 6;
/// A degradation that held this much longer than the detector's sustain time is expected
/// (the window of instances, and the collector's evaluation once a second).
pub const DEGRADED_MARGIN_S: f64 = 2.0;

/// What a simulated job's faults did: those that took effect, and those that may or may not
/// be seen (a slow fault that acted only briefly).
#[derive(Clone, Debug, Default)]
pub struct Effect {
    pub effective: Vec<Fault>,
    pub borderline: Vec<Fault>,
    /// When each step began, on the records' realtime clock (index: step): a fault's onset.
    pub step_began_ns: Vec<u64>,
}

impl Effect {
    /// What findings the job should give.
    pub fn expected(&self, topo: &Topology) -> Result<Vec<Expected>, String> {
        let mut want = expected_all(&self.effective, topo)?;
        for mut e in expected_all(&self.borderline, topo)? {
            e.optional = true;
            want.push(e);
        }
        Ok(want)
    }

    /// Whether fault `f` was left unseen: neither effective nor borderline.
    pub fn hidden(&self, f: &Fault) -> bool {
        !self.effective.contains(f) && !self.borderline.contains(f)
    }
}

/// Runs the whole job in virtual time: each process's trace, and what its faults did.
pub fn simulate(spec: Spec) -> Result<(Vec<ProcessTrace>, Effect), String> {
    let mut sim = Sim::new(spec, 1_800_000_000_000_000_000)?;
    while sim.step < sim.spec.steps && sim.step() {}
    let tail = (sim.spec.tail_s * 1e9) as u64;
    let end = match (sim.teardown_at, sim.stuck_since) {
        // The launcher took the job down: its processes' records end there.
        (Some(k), _) => k,
        (None, Some(t)) => t + tail,
        (None, None) if sim.stuck() => sim.now() + tail,
        // Ranks blocked while others ran to the end (e.g. a hang after the last world
        // collective) still get the tail.
        (None, None) if sim.state.iter().any(|s| *s != RankState::Running) => sim.now() + tail,
        (None, None) => sim.now(),
    };
    sim.finish(end);
    let faults = Effect {
        effective: sim.effective_faults(),
        borderline: sim.borderline_faults(),
        step_began_ns: sim.step_began.iter().map(|g| sim.epoch + g).collect(),
    };
    let traces = (0..sim.topo.ranks())
        .map(|r| ProcessTrace {
            header: sim.header(r),
            records: sim.take(r),
            clock: None,
            cut_short: false,
        })
        .collect();
    Ok((traces, faults))
}

/// Whether a rank fault strikes now: at its phase (a mismatch always at the world call).
fn at_phase_or_world(f: &Fault, at_phase: bool, phase: Phase) -> bool {
    match f {
        Fault::Mismatch { .. } => phase == Phase::BeforeWorld,
        _ => at_phase,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hang_of(ranks: &[i32], split_ok: bool) -> Expected {
        Expected {
            kinds: vec![Kind::Hang],
            ranks: ranks.to_vec(),
            split_ok,
            optional: false,
        }
    }

    #[test]
    fn judge_counts_an_unexpected_finding_as_extra() {
        let want = [hang_of(&[3], false)];
        let v = judge(&want, &[(Kind::Hang, vec![3]), (Kind::SlowRank, vec![4])]);
        assert!(v.missing.is_empty());
        assert_eq!(v.extra, vec![(Kind::SlowRank, vec![4])]);
        assert!(!v.exact());
        // A partner named as well is extra too, not "close enough".
        let v = judge(&want, &[(Kind::Hang, vec![3, 4])]);
        assert_eq!(v.missing, vec![0]);
        assert_eq!(v.extra, vec![(Kind::Hang, vec![3, 4])]);
    }

    #[test]
    fn judge_takes_one_form_of_two_hung_ranks_never_both() {
        let want = [hang_of(&[2, 9], true)];
        assert!(judge(&want, &[(Kind::Hang, vec![2, 9])]).exact());
        assert!(judge(&want, &[(Kind::Hang, vec![9]), (Kind::Hang, vec![2])]).exact());
        // Both forms at once: the pair and one part.
        let v = judge(&want, &[(Kind::Hang, vec![2]), (Kind::Hang, vec![2, 9])]);
        assert!(v.missing.is_empty());
        assert_eq!(v.extra, vec![(Kind::Hang, vec![2])]);
        // The same finding twice.
        let v = judge(
            &want,
            &[
                (Kind::Hang, vec![2]),
                (Kind::Hang, vec![2]),
                (Kind::Hang, vec![9]),
            ],
        );
        assert_eq!(v.extra, vec![(Kind::Hang, vec![2])]);
        // One part alone misses the other.
        let v = judge(&want, &[(Kind::Hang, vec![2])]);
        assert_eq!(v.missing, vec![0]);
        assert!(v.extra.is_empty());
    }

    #[test]
    fn judge_misses_a_finding_of_no_rank_that_never_came() {
        // A stall or a degraded collective names no rank: nothing found is a miss.
        let want = [Expected {
            kinds: vec![Kind::DegradedCollective],
            ranks: vec![],
            split_ok: false,
            optional: false,
        }];
        assert_eq!(judge(&want, &[]).missing, vec![0]);
        assert_eq!(judge(&[hang_of(&[], true)], &[]).missing, vec![0]);
        assert!(judge(&want, &[(Kind::DegradedCollective, vec![])]).exact());
        let v = judge(&want, &[(Kind::Hang, vec![])]);
        assert_eq!((v.missing.len(), v.extra.len()), (1, 1));
    }

    #[test]
    fn judge_takes_an_optional_finding_either_way_but_only_it() {
        let maybe = Expected {
            kinds: vec![Kind::SlowRank],
            ranks: vec![5],
            split_ok: true,
            optional: true,
        };
        let want = [hang_of(&[3], false), maybe];
        assert!(judge(&want, &[(Kind::Hang, vec![3])]).exact());
        assert!(judge(&want, &[(Kind::Hang, vec![3]), (Kind::SlowRank, vec![5])]).exact());
        // Another rank is still extra, and the required one still missing.
        let v = judge(&want, &[(Kind::SlowRank, vec![6])]);
        assert_eq!(v.missing, vec![0]);
        assert_eq!(v.extra, vec![(Kind::SlowRank, vec![6])]);
    }

    #[test]
    fn judge_lets_one_finding_explain_one_fault_only() {
        // Two faults of the same kind and rank set cannot share one finding.
        let want = [
            Expected {
                kinds: vec![Kind::DeadRank],
                ranks: vec![1],
                split_ok: false,
                optional: false,
            },
            Expected {
                kinds: vec![Kind::Hang, Kind::DeadRank],
                ranks: vec![1],
                split_ok: false,
                optional: false,
            },
        ];
        let v = judge(&want, &[(Kind::DeadRank, vec![1])]);
        assert_eq!(v.missing, vec![1]);
        // Kind matters: a hang where a mismatch was expected is a miss and an extra.
        let v = judge(
            &[Expected {
                kinds: vec![Kind::Mismatch],
                ranks: vec![5],
                split_ok: false,
                optional: false,
            }],
            &[(Kind::Hang, vec![5])],
        );
        assert_eq!((v.missing.len(), v.extra.len()), (1, 1));
    }

    #[test]
    fn tokens_parse_and_print_back() {
        for t in [
            "straggler:3",
            "slow-node:node-002",
            "hang:5",
            "hang:5:12",
            "mismatch:1:4",
            "dead:7",
            "degraded",
            "degraded:0",
            "stall",
            "stall:9",
            "teardown:3:8",
            "freeze:2",
            "flaky:4:3",
        ] {
            assert_eq!(Fault::parse(t).expect(t).token(), t);
        }
        for bad in [
            "straggler",
            "hang:x",
            "hang:1:y",
            "wobble:3",
            "degraded:x",
            "straggler:-1",
            "flaky:3:1",
            "stall:1:2",
        ] {
            assert!(Fault::parse(bad).is_err(), "{bad}");
        }
        let topo = Topology::of(64, 8);
        assert!(expected(&Fault::Straggler { rank: 64 }, &topo).is_err());
        assert_eq!(
            expected(&Fault::SlowNode { node: "1".into() }, &topo)
                .expect("node")
                .ranks,
            (8..16).collect::<Vec<i32>>()
        );
    }

    #[test]
    fn records_are_taken_only_once_their_rank_wrote_them() {
        let spec = Spec {
            ranks: 16,
            compute_ms: 160.0,
            ..Default::default()
        };
        let mut sim = Sim::new(spec, 0).expect("sim");
        // One step is made whole, seconds ahead of a clock that stands at half of it.
        assert!(sim.step());
        let g = sim.now() / 2;
        sim.beat_all(g);
        for r in 0..16 {
            let limit = sim.mono(r, g);
            let now = sim.take_until(r, g);
            assert!(!now.is_empty(), "rank {r} wrote records by then");
            assert!(
                now.iter()
                    .all(|x| record_mono(x).is_none_or(|t| t <= limit)),
                "rank {r}: a record from after {limit}"
            );
            let later = sim.take(r);
            assert!(
                later
                    .first()
                    .and_then(record_mono)
                    .is_some_and(|t| t > limit),
                "rank {r}: the rest begins after the clock"
            );
            // Nothing lost, nothing twice, in order.
            let seqs: Vec<u64> = now.iter().chain(&later).map(Record::rec_seq).collect();
            assert_eq!(
                seqs,
                (1..=seqs.len() as u64).collect::<Vec<_>>(),
                "rank {r}"
            );
        }
    }

    #[test]
    fn sampled_calls_still_held_at_the_end_go_out_in_skips_before_the_exit() {
        // Every communicator sampled 1 in 4, records taken as an agent drains them; at the end
        // every rank's records through its final heartbeat are delivered or in a skip.
        let spec = Spec {
            ranks: 16,
            steps: 30,
            ..Default::default()
        };
        let mut sim = Sim::new(spec, 0).expect("sim");
        for n in 0..sim.topo.nodes {
            for c in sim.comm_ids() {
                sim.set_rate(n, c, 4, 0);
            }
        }
        let mut got: Vec<Vec<Record>> = vec![Vec::new(); 16];
        while sim.step < 30 && sim.step() {
            for (r, g) in got.iter_mut().enumerate() {
                g.extend(sim.take(r));
            }
        }
        let end = sim.now();
        sim.finish(end);
        for (r, g) in got.iter_mut().enumerate() {
            g.extend(sim.take(r));
        }
        assert!(sim.sampled_out > 0);
        for (r, recs) in got.iter().enumerate() {
            let last = recs
                .iter()
                .find_map(|x| match x {
                    Record::Heartbeat(h) if h.flags & flags::FINAL != 0 => Some(h.rec_seq),
                    _ => None,
                })
                .expect("final heartbeat");
            let mut sent: BTreeSet<u64> = recs.iter().map(|x| x.rec_seq()).collect();
            for x in recs {
                if let Record::Skip(k) = x
                    && let Some((lo, hi)) = k.sent_span()
                {
                    sent.extend(lo..=hi);
                }
            }
            let missing: Vec<u64> = (1..=last).filter(|s| !sent.contains(s)).collect();
            assert!(missing.is_empty(), "rank {r}: {missing:?}");
            assert!(matches!(recs.last(), Some(Record::Process(_))), "rank {r}");
        }
    }

    #[test]
    fn a_healthy_job_is_complete_and_consistent() {
        let spec = Spec {
            ranks: 64,
            steps: 5,
            ..Default::default()
        };
        let traces = run_virtual(spec).expect("sim");
        assert_eq!(traces.len(), 64);
        // Every collective instance has all its members, and the world seq is the step.
        let mut inst: HashMap<(u64, u64), usize> = HashMap::new();
        let mut sends = 0;
        let mut recvs = 0;
        for t in &traces {
            for r in &t.records {
                if let Record::Call(c) = r {
                    match c.op() {
                        Op::Send => sends += 1,
                        Op::Recv => recvs += 1,
                        _ => *inst.entry((c.comm_id, c.seq)).or_default() += 1,
                    }
                    assert!(c.t_exit >= c.t_enter);
                }
            }
            assert!(matches!(t.records.last(), Some(Record::Process(_))));
        }
        assert_eq!(sends, recvs);
        assert!(sends > 0);
        let world = comm_id("world", 0, 0);
        assert_eq!(inst.get(&(world, 4)), Some(&64));
        assert!(!inst.contains_key(&(world, 5)));
        assert!(inst.values().all(|&n| n == 64 || n == 8 || n == 2));
    }

    #[test]
    fn a_hung_rank_leaves_everyone_blocked() {
        let spec = Spec {
            ranks: 64,
            steps: 10,
            faults: vec![Fault::Hang {
                rank: 9,
                seq: Some(3),
            }],
            ..Default::default()
        };
        let mut sim = Sim::new(spec, 0).expect("sim");
        while sim.step() {}
        assert_eq!(sim.step, 4);
        assert!(matches!(sim.state[9], RankState::Stopped(_)));
        assert!(
            (0..64)
                .filter(|&r| r != 9)
                .all(|r| sim.in_flight(r).is_some())
        );
    }
}
