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
    Call, Comm, CommEvent, EXIT_STATUS_UNKNOWN, Heartbeat, Process, ProcessEvent, RECORD_SIZE,
    Record,
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
    /// The rank stops calling (computes forever) at world seq `seq`.
    Hang { rank: i32, seq: Option<u64> },
    /// The rank calls a broadcast where the others call the world all-reduce `seq`.
    Mismatch { rank: i32, seq: Option<u64> },
    /// The rank's process is killed (signal 9) at world seq `seq`.
    Dead { rank: i32, seq: Option<u64> },
    /// Inter-node transfers slow down from the onset step on.
    Degraded,
}

impl Fault {
    /// Parses `straggler:R`, `slow-node:NODE`, `hang:R[:SEQ]`, `mismatch:R[:SEQ]`,
    /// `dead:R[:SEQ]`, `degraded`.
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
        let seq = || -> Result<Option<u64>, String> {
            match parts.get(2) {
                None => Ok(None),
                Some(x) => x
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| format!("fault {s:?}: {x:?} is not a sequence number")),
            }
        };
        let max_parts = match parts[0] {
            "degraded" => 1,
            "straggler" | "slow-node" => 2,
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
                seq: seq()?,
            },
            "mismatch" => Fault::Mismatch {
                rank: rank(1)?,
                seq: seq()?,
            },
            "dead" => Fault::Dead {
                rank: rank(1)?,
                seq: seq()?,
            },
            "degraded" => Fault::Degraded,
            other => {
                return Err(format!(
                    "unknown fault {other:?}: use straggler:R, slow-node:NODE, hang:R[:SEQ], mismatch:R[:SEQ], dead:R[:SEQ] or degraded"
                ));
            }
        })
    }

    /// The token again.
    pub fn token(&self) -> String {
        let seq = |s: &Option<u64>| s.map(|s| format!(":{s}")).unwrap_or_default();
        match self {
            Fault::Straggler { rank } => format!("straggler:{rank}"),
            Fault::SlowNode { node } => format!("slow-node:{node}"),
            Fault::Hang { rank, seq: s } => format!("hang:{rank}{}", seq(s)),
            Fault::Mismatch { rank, seq: s } => format!("mismatch:{rank}{}", seq(s)),
            Fault::Dead { rank, seq: s } => format!("dead:{rank}{}", seq(s)),
            Fault::Degraded => "degraded".into(),
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
        }
    }
}

/// How ranks are laid out: rank = ((replica × stages) + stage) × per_node + tp.
#[derive(Clone, Copy, Debug)]
pub struct Topology {
    pub per_node: usize,
    pub nodes: usize,
    /// Pipeline stages.
    pub stages: usize,
    /// Data-parallel replicas.
    pub replicas: usize,
}

impl Topology {
    pub fn of(ranks: usize, per_node: usize) -> Topology {
        let per_node = per_node.max(1);
        let nodes = ranks.div_ceil(per_node).max(1);
        let stages = if nodes >= 8 && nodes.is_multiple_of(4) {
            4
        } else {
            1
        };
        Topology {
            per_node,
            nodes,
            stages,
            replicas: nodes / stages,
        }
    }

    pub fn ranks(&self) -> usize {
        self.nodes * self.per_node
    }

    pub fn node_of(&self, r: usize) -> usize {
        r / self.per_node
    }

    pub fn stage_of(&self, r: usize) -> usize {
        self.node_of(r) % self.stages
    }

    pub fn replica_of(&self, r: usize) -> usize {
        self.node_of(r) / self.stages
    }

    pub fn rank_at(&self, replica: usize, stage: usize, tp: usize) -> usize {
        (replica * self.stages + stage) * self.per_node + tp
    }

    pub fn node_name(&self, n: usize) -> String {
        format!("node-{n:03}")
    }

    /// The ranks of a node.
    pub fn node_ranks(&self, n: usize) -> std::ops::Range<usize> {
        n * self.per_node..(n + 1) * self.per_node
    }
}

/// What a correct diagnosis of one fault names: the kind and exactly these ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub kind: Kind,
    pub ranks: Vec<i32>,
}

/// The expected finding of a fault in a job of `ranks` ranks.
pub fn expected(fault: &Fault, ranks: usize, per_node: usize) -> Result<Expected, String> {
    let topo = Topology::of(ranks, per_node);
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
    Ok(match fault {
        Fault::Straggler { rank } => Expected {
            kind: Kind::SlowRank,
            ranks: check(*rank)?,
        },
        Fault::SlowNode { node } => {
            let n = node_index(node, &topo)?;
            Expected {
                kind: Kind::SlowRank,
                ranks: topo.node_ranks(n).map(|r| r as i32).collect(),
            }
        }
        Fault::Hang { rank, .. } => Expected {
            kind: Kind::Hang,
            ranks: check(*rank)?,
        },
        Fault::Mismatch { rank, .. } => Expected {
            kind: Kind::Mismatch,
            ranks: check(*rank)?,
        },
        Fault::Dead { rank, .. } => Expected {
            kind: Kind::DeadRank,
            ranks: check(*rank)?,
        },
        Fault::Degraded => Expected {
            kind: Kind::DegradedCollective,
            ranks: vec![],
        },
    })
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
    /// Killed at this global time.
    Dead(u64),
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
    /// Global time at which the last rank stopped progressing.
    pub stuck_since: Option<u64>,
    slow: Vec<bool>,
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
        if spec.ranks < 2 || !spec.ranks.is_multiple_of(spec.per_node.max(1)) {
            return Err(format!(
                "--ranks {}: use a multiple of {} (ranks per node), at least 2",
                spec.ranks, spec.per_node
            ));
        }
        let topo = Topology::of(spec.ranks, spec.per_node);
        for f in &spec.faults {
            expected(f, spec.ranks, spec.per_node)?;
        }
        let n = topo.ranks();
        let mut rng = Rng::new(spec.seed);
        let clock_off = (0..topo.nodes)
            .map(|_| 1_000_000_000_000 + rng.below(1_000_000_000_000_000))
            .collect();
        let mut slow = vec![false; n];
        for f in &spec.faults {
            match f {
                Fault::Straggler { rank } => slow[*rank as usize] = true,
                Fault::SlowNode { node } => {
                    for r in topo.node_ranks(node_index(node, &topo)?) {
                        slow[r] = true;
                    }
                }
                _ => {}
            }
        }
        let comm_ids = (0..n)
            .map(|r| {
                [
                    comm_id("world", 0, 0),
                    comm_id("tp", topo.node_of(r), 0),
                    comm_id("dp", topo.stage_of(r), r % topo.per_node),
                    comm_id("pp", topo.replica_of(r), r % topo.per_node),
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
            next_beat: vec![0; n],
            clock_off,
            epoch,
            step: 0,
            stuck_since: None,
            slow,
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

    /// Rank `r`'s process id (8 processes per node).
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

    /// Rank `r`'s monotonic clock at global time `g`.
    pub fn mono(&self, r: usize, g: u64) -> u64 {
        self.clock_off[self.topo.node_of(r)] + g
    }

    /// Communicator sizes: world, tp, dp, pp.
    fn sizes(&self) -> [i32; 4] {
        [
            self.topo.ranks() as i32,
            self.topo.per_node as i32,
            self.topo.replicas as i32,
            self.topo.stages as i32,
        ]
    }

    /// Rank of `r` in communicator kind `k`.
    fn comm_rank(&self, r: usize, k: usize) -> i32 {
        (match k {
            WORLD => r,
            TP => r % self.topo.per_node,
            DP => self.topo.replica_of(r),
            _ => self.topo.stage_of(r),
        }) as i32
    }

    fn prologue(&mut self) {
        let sizes = self.sizes();
        for r in 0..self.topo.ranks() {
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
        if matches!(self.state[r], RankState::Dead(_)) {
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

    /// Heartbeats of every live rank up to global time `g` (a real-time driver calls this as
    /// time passes; stopped and blocked ranks keep beating, dead ones do not).
    pub fn beat_all(&mut self, g: u64) {
        for r in 0..self.topo.ranks() {
            self.beats_until(r, g);
        }
    }

    /// Takes the records produced so far for rank `r`, sampled as its node's agent would.
    pub fn take(&mut self, r: usize) -> Vec<Record> {
        let recs = std::mem::take(&mut self.out[r]);
        let rates = &self.rates[self.topo.node_of(r)];
        if rates.is_empty() || recs.is_empty() {
            return recs;
        }
        let raw: Vec<u8> = recs.iter().flat_map(|x| x.encode()).collect();
        let mut out = Vec::with_capacity(raw.len());
        let f = self.samplers[r].filter(rates, &raw, &mut out);
        self.sampled_out += f.left_out;
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

    /// The call rank `r` is blocked in, if any.
    pub fn in_flight(&self, r: usize) -> Option<Call> {
        match self.state[r] {
            RankState::Blocked(c) => Some(c),
            _ => None,
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
        let mut f = 1.0 + self.spec.jitter * self.rng.normal();
        if self.slow[r] && self.step >= self.spec.onset_step {
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

    /// A collective on communicator kind `k` over `members`; `odd` = a rank that calls
    /// another op instead (mismatch).
    fn collective(
        &mut self,
        members: &[usize],
        k: usize,
        bytes: u64,
        xfer_ns: f64,
        odd: Option<usize>,
    ) {
        let op = Op::Allreduce;
        let complete = odd.is_none() && members.iter().all(|&m| self.running(m));
        let exit = members.iter().map(|&m| self.t[m]).max().unwrap_or(0) + xfer_ns as u64;
        for &m in members {
            if !self.running(m) {
                continue;
            }
            let seq = self.seq[m][k];
            self.seq[m][k] += 1;
            let (o, peer) = if Some(m) == odd {
                (Op::Broadcast, 0)
            } else {
                (op, -1)
            };
            let t_enter = self.t[m];
            if complete {
                let t_exit = exit + self.rng.below(20_000);
                let c = self.call_record(m, k, o, bytes, peer, t_enter, t_exit, seq, seq);
                self.push(m, Record::Call(c), t_exit);
                self.t[m] = t_exit;
            } else {
                self.block(
                    m,
                    self.call_record(m, k, o, bytes, peer, t_enter, 0, seq, seq),
                    t_enter,
                );
            }
        }
    }

    /// Rank `m` enters `c` and never leaves: the shim's `enter` record after 100 ms.
    fn block(&mut self, m: usize, mut c: Call, t_enter: u64) {
        c.t_exit = 0;
        self.push(m, Record::Enter(c), t_enter + 100_000_000);
        self.state[m] = RankState::Blocked(c);
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
        if network
            && self.step >= self.spec.onset_step
            && self.spec.faults.contains(&Fault::Degraded)
        {
            t *= self.spec.degrade_factor;
        }
        t
    }

    /// Simulates one step (world seq = step number). Returns false when nothing can run.
    pub fn step(&mut self) -> bool {
        if self.stuck() {
            return false;
        }
        let s = self.step;
        let onset = self.spec.onset_step;
        let faults = self.spec.faults.clone();
        let mut odd = None;
        for f in &faults {
            match f {
                Fault::Hang { rank, seq } if seq.unwrap_or(onset) == s => {
                    let r = *rank as usize;
                    if self.running(r) {
                        self.state[r] = RankState::Stopped(self.t[r]);
                    }
                }
                Fault::Dead { rank, seq } if seq.unwrap_or(onset) == s => {
                    let r = *rank as usize;
                    if self.running(r) {
                        let at = self.t[r];
                        // The agent saw it killed.
                        let p = self.exit_record(r, at, flags::OBSERVED, EXIT_STATUS_UNKNOWN, 9);
                        self.push(r, p, at);
                        self.state[r] = RankState::Dead(at);
                    }
                }
                Fault::Mismatch { rank, seq } if seq.unwrap_or(onset) == s => {
                    odd = Some(*rank as usize);
                }
                _ => {}
            }
        }
        let topo = self.topo;
        let f = self.spec.compute_ms;
        let tp_x = self.xfer_ns(TP_BYTES, topo.per_node, 150e9, topo.replicas < 2);
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
                        let members: Vec<usize> = (0..topo.per_node)
                            .map(|tp| topo.rank_at(rep, st, tp))
                            .collect();
                        for (tp, &r) in members.iter().enumerate() {
                            if let Some(p) = prev {
                                self.recv(r, topo.rank_at(rep, p, tp), mb, fwd);
                            }
                            self.compute(r, f * mul);
                        }
                        self.collective(&members, TP, TP_BYTES, tp_x, None);
                        if let Some(nx) = next {
                            for (tp, &r) in members.iter().enumerate() {
                                self.send(r, topo.rank_at(rep, nx, tp), mb, fwd);
                            }
                        }
                    }
                }
            }
        }
        if topo.replicas >= 2 {
            for st in 0..topo.stages {
                for tp in 0..topo.per_node {
                    let members: Vec<usize> = (0..topo.replicas)
                        .map(|rep| topo.rank_at(rep, st, tp))
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
        self.collective(&all, WORLD, 8, world_x, odd);
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
        for r in 0..self.topo.ranks() {
            self.beats_until(r, end);
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
    let mut sim = Sim::new(spec, 1_800_000_000_000_000_000)?;
    while sim.step < sim.spec.steps && sim.step() {}
    let end = match sim.stuck_since {
        Some(t) => t + (sim.spec.tail_s * 1e9) as u64,
        None if sim.stuck() => sim.now() + (sim.spec.tail_s * 1e9) as u64,
        // Ranks blocked while others ran to the end (e.g. a hang after the last world
        // collective) still get the tail.
        None if sim.state.iter().any(|s| *s != RankState::Running) => {
            sim.now() + (sim.spec.tail_s * 1e9) as u64
        }
        None => sim.now(),
    };
    sim.finish(end);
    Ok((0..sim.topo.ranks())
        .map(|r| ProcessTrace {
            header: sim.header(r),
            records: sim.take(r),
            clock: None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            assert_eq!(Fault::parse(t).expect(t).token(), t);
        }
        for bad in [
            "straggler",
            "hang:x",
            "hang:1:y",
            "wobble:3",
            "degraded:1",
            "straggler:-1",
        ] {
            assert!(Fault::parse(bad).is_err(), "{bad}");
        }
        assert!(expected(&Fault::Straggler { rank: 64 }, 64, 8).is_err());
        assert_eq!(
            expected(&Fault::SlowNode { node: "1".into() }, 64, 8)
                .expect("node")
                .ranks,
            (8..16).collect::<Vec<i32>>()
        );
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
