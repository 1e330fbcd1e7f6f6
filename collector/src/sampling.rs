//! Consistent sampling policy (ARCHITECTURE.md, "Consistent sampling"): every two seconds the
//! collector compares the calls jobs offer per second (kept and left out) with its budget and
//! sets a power-of-two modulus per communicator, so agents keep `hash(comm, seq) mod K == 0`.
//!
//! Rates are per second of the records' own time (how far the job's ranks' streams moved on,
//! on average, over at least [`MIN_WINDOW_S`]), not of arrival: a collector that falls behind
//! takes in fewer calls per second than the job makes, and measured by arrival it would never
//! find itself over budget.
//!
//! - One factor `g` for every job: the smallest power of two that brings the kept load under
//!   the budget. A communicator gets `min(g, cap)`, `cap` keeping at least four of its instances
//!   (near the memory bound two, at it one; point-to-point only: one message) per second — the detectors need evidence, and a slow
//!   communicator (a step's world all-reduce) is never thinned at all. Doubling stops where it
//!   no longer helps.
//! - `g` is raised at once when the kept load is 1.5 times the budget or more, else after two
//!   ticks over it; it is lowered (halved) only after the offered load stayed under half the
//!   budget for ten seconds.
//! - A new modulus applies from an instance a second or more ahead of the fastest member, so every
//!   agent has it before its ranks get there; a communicator without collectives (point-to-point
//!   only) switches at once.
//! - `--sample-modulus K` forces K on every communicator.
//! - **Behind**: while the running jobs' data arrives ever later ([`Lag`]: a job judged more
//!   than [`LAG_PRESSED_NS`] behind the wall clock and [`LAG_GROWTH_NS`] further behind than at
//!   any of the last [`CALM_TICKS`] ticks, or more than [`LAG_FAR_NS`] behind and not catching
//!   up), the
//!   budget is halved every tick, down to 1/[`MAX_LAG_DIVISOR`]; after [`CALM_TICKS`] ticks
//!   without growth it is doubled back. A collector (or agents) that cannot keep up with a job
//!   takes fewer of its calls rather than falling ever further behind. A lag that stays put is
//!   the delivery's own latency (agents send in intervals), not overload: it presses nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use commscope_wire::grpc::SampleRate;

use crate::state::State;

/// Rates per node: what each node's agent is sent.
pub type ByNode = HashMap<String, Vec<SampleRate>>;

/// The policy's memory between ticks.
#[derive(Debug, Default)]
pub struct Policy {
    /// The common factor now.
    pub factor: u32,
    over_ticks: u32,
    under_ticks: u32,
    /// Per (job, comm): calls counted and highest seq at the previous measurement.
    last: HashMap<(String, u64), (u64, u64)>,
    /// Per job: how far its streams had reached (mean, ns) at the previous measurement.
    reached: HashMap<String, f64>,
    /// Per (job, comm): offered calls/s and instances/s at the latest measurement.
    measured: HashMap<(String, u64), (f64, f64)>,
    /// Per (job, comm): the modulus set and the seq it applies from.
    set: HashMap<(String, u64), (u32, u64)>,
    /// Offered and kept load at the last tick (calls/s).
    pub offered: f64,
    pub kept: f64,
    /// Instances per second a collective communicator keeps at least (0: [`EVIDENCE_FLOOR`]);
    /// lower near the memory bound.
    pub min_instances: f64,
    /// How much harder it samples because the jobs' data arrives late.
    pub lag: Lag,
    /// The budget of the last tick (calls/s), after the memory bound's and the lag's divisors.
    pub budget: f64,
}

/// Kept instances per second a collective communicator is never thinned below, normally: the
/// detectors' evidence.
pub const EVIDENCE_FLOOR: f64 = 4.0;

/// Record time a measurement spans at least (s): agents deliver in bursts, up to 2 s apart.
pub const MIN_WINDOW_S: f64 = 2.0;

/// A running job judged more than this behind the wall clock, and growing, presses the budget
/// down (as far as a node may lag its job before its ranks go unjudged,
/// [`crate::contact::BEHIND_AFTER_NS`]: a simulated fleet of 8,192 nodes shipping every 8 s
/// lags that much by design, and pressing at 5 s sampled it for nothing, which delayed its
/// slow-rank verdicts by 15–20 s) …
pub const LAG_PRESSED_NS: u64 = 10_000_000_000;
/// … growing: this much further behind than at any of the last [`CALM_TICKS`] ticks (a lag
/// that only wavers sets no new high) …
pub const LAG_GROWTH_NS: u64 = 500_000_000;
/// … or this far behind, whatever the trend, as long as it is not shrinking.
pub const LAG_FAR_NS: u64 = 20_000_000_000;
/// Ticks without growth before the budget is given back (halving the divisor).
pub const CALM_TICKS: usize = 5;
/// The budget is divided by at most this for lag.
pub const MAX_LAG_DIVISOR: u32 = 64;

/// The budget's divisor for lag: how much harder the collector samples because the jobs' data
/// arrives later and later (its own ingest, or its agents, cannot keep up).
#[derive(Debug)]
pub struct Lag {
    pub divisor: u32,
    calm: usize,
    /// The lag at the last ticks, newest last.
    seen: std::collections::VecDeque<u64>,
}

impl Default for Lag {
    fn default() -> Self {
        Lag {
            divisor: 1,
            calm: 0,
            seen: std::collections::VecDeque::new(),
        }
    }
}

impl Lag {
    /// One sampling tick, given how far behind the wall clock the most delayed running job is
    /// judged (ns). Returns whether the divisor changed.
    pub fn tick(&mut self, behind_ns: u64) -> bool {
        let was = self.divisor;
        let last = self.seen.back().copied().unwrap_or(0);
        let high = self.seen.iter().copied().max().unwrap_or(0);
        let full = self.seen.len() >= CALM_TICKS;
        let growing = behind_ns > LAG_PRESSED_NS && behind_ns > high + LAG_GROWTH_NS;
        let shrinking = behind_ns.saturating_mul(10) < last.saturating_mul(9);
        let far = behind_ns > LAG_FAR_NS && !shrinking;
        if full {
            self.seen.pop_front();
        }
        self.seen.push_back(behind_ns);
        if growing || far {
            self.calm = 0;
            // What was cut a tick ago takes a while to show: not again while it drains.
            if !shrinking {
                self.divisor = (self.divisor * 2).min(MAX_LAG_DIVISOR);
            }
        } else {
            self.calm += 1;
            if self.calm >= CALM_TICKS && self.divisor > 1 {
                self.divisor /= 2;
                self.calm = 0;
            }
        }
        self.divisor != was
    }
}

/// Largest power of two ≤ x (at least 1).
fn pow2_floor(x: f64) -> u32 {
    if x < 2.0 {
        1
    } else {
        1 << (x.log2().floor() as u32).min(20)
    }
}

impl Policy {
    /// One tick over every shard of the live state (locked together: the budget is the whole
    /// collector's): the rates per node when they changed.
    pub fn tick<S: std::ops::DerefMut<Target = State>>(
        &mut self,
        states: &mut [S],
        budget: f64,
        forced: Option<u32>,
    ) -> Option<Arc<ByNode>> {
        if self.factor == 0 {
            self.factor = 1;
        }
        // Per communicator: offered calls/s, instances/s, highest seq.
        struct C {
            job: String,
            comm: u64,
            rate: f64,
            inst: f64,
            hi: u64,
            collective: bool,
        }
        let mut comms = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut jobs_seen = std::collections::HashSet::new();
        for (name, job) in states.iter().flat_map(|s| s.jobs.iter()) {
            if job.ended.is_some() {
                continue;
            }
            jobs_seen.insert(name.clone());
            // A new measurement once the job's records moved on far enough in their own time.
            let now = job.reorder.mean_reached();
            let window = match (now, self.reached.get(name)) {
                (Some(t), Some(&t0)) if (t - t0) / 1e9 >= MIN_WINDOW_S => Some((t - t0) / 1e9),
                (Some(_), None) => Some(0.0), // the first look: a baseline
                _ => None,
            };
            if let (Some(_), Some(t)) = (window, now) {
                self.reached.insert(name.clone(), t);
            }
            for (id, c) in &job.comms {
                let calls: u64 =
                    c.ops.values().map(|o| o.calls).sum::<u64>() + c.p2p_sends + c.p2p_recvs;
                let hi = c.progress.values().copied().max().unwrap_or(0);
                let key = (name.clone(), *id);
                seen.insert(key.clone());
                if let Some(dt_s) = window {
                    let before = self.last.insert(key.clone(), (calls, hi));
                    if let Some((c0, h0)) = before.filter(|_| dt_s > 0.0) {
                        // p2p counts both ends of a message; calls are what agents send.
                        self.measured.insert(
                            key.clone(),
                            (
                                calls.saturating_sub(c0) as f64 / dt_s,
                                hi.saturating_sub(h0) as f64 / dt_s,
                            ),
                        );
                    }
                }
                let (rate, inst) = self.measured.get(&key).copied().unwrap_or((0.0, 0.0));
                comms.push(C {
                    job: name.clone(),
                    comm: *id,
                    rate,
                    inst,
                    hi,
                    collective: c
                        .ops
                        .keys()
                        .any(|op| !commscope_wire::op::Op::from_code(*op).is_p2p()),
                });
            }
        }
        self.last.retain(|k, _| seen.contains(k));
        self.measured.retain(|k, _| seen.contains(k));
        self.reached.retain(|j, _| jobs_seen.contains(j));
        let floor = if self.min_instances > 0.0 {
            self.min_instances
        } else {
            EVIDENCE_FLOOR
        };
        let cap = |c: &C| {
            if !c.collective {
                // Point-to-point only: at least one message per second is kept.
                pow2_floor(c.rate)
            } else {
                // Detectors need evidence: at least `floor` kept instances per second.
                pow2_floor(c.inst / floor)
            }
        };
        let kept_at = |g: u32| -> f64 {
            comms
                .iter()
                .map(|c| c.rate / f64::from(g.min(cap(c))))
                .sum()
        };
        let offered: f64 = comms.iter().map(|c| c.rate).sum();
        self.offered = offered.max(0.0) + 0.0;
        let want = match forced {
            Some(k) => k.max(1),
            None => {
                // Double while it helps: past every communicator's cap it no longer does.
                let mut g = 1u32;
                while g < 1 << 16 && kept_at(g) > budget && kept_at(2 * g) < kept_at(g) {
                    g *= 2;
                }
                g
            }
        };
        if forced.is_some() {
            self.factor = want;
        } else if want > self.factor {
            self.under_ticks = 0;
            self.over_ticks += 1;
            if self.over_ticks >= 2 || kept_at(self.factor) >= 1.5 * budget {
                self.factor = want;
                self.over_ticks = 0;
            }
        } else {
            self.over_ticks = 0;
            if self.factor > 1 && offered < budget / 2.0 {
                self.under_ticks += 1;
                if self.under_ticks >= 5 {
                    self.factor /= 2;
                    self.under_ticks = 0;
                }
            } else {
                self.under_ticks = 0;
            }
        }
        let g = self.factor;
        self.kept = kept_at(g);
        let mut changed = false;
        for c in &comms {
            let k = if forced.is_some() { g } else { g.min(cap(c)) };
            let key = (c.job.clone(), c.comm);
            let cur = self.set.get(&key).map_or(1, |s| s.0);
            if k == cur {
                continue;
            }
            // A second (at least 4 instances) ahead of the fastest member.
            let from = if c.collective {
                c.hi + (c.inst.ceil() as u64).max(4)
            } else {
                0
            };
            self.set.insert(key, (k, from));
            changed = true;
        }
        let live: std::collections::HashSet<(String, u64)> =
            comms.iter().map(|c| (c.job.clone(), c.comm)).collect();
        let before = self.set.len();
        self.set.retain(|k, _| live.contains(k));
        changed |= self.set.len() != before;
        if !changed {
            return None;
        }
        // Each node gets the rates of the communicators its ranks belong to.
        let mut out: ByNode = HashMap::new();
        for (name, job) in states.iter().flat_map(|s| s.jobs.iter()) {
            let node_of: BTreeMap<i32, &str> = job
                .ranks
                .values()
                .map(|r| (r.rank, r.node.as_str()))
                .collect();
            for (id, c) in &job.comms {
                let Some(&(k, from)) = self.set.get(&(name.clone(), *id)) else {
                    continue;
                };
                let mut nodes: Vec<&str> = c
                    .progress
                    .keys()
                    .chain(c.members.values())
                    .filter_map(|r| node_of.get(r).copied())
                    .collect();
                nodes.sort_unstable();
                nodes.dedup();
                for n in nodes {
                    out.entry(n.to_owned()).or_default().push(SampleRate {
                        job: name.clone(),
                        comm_id: *id,
                        modulus: k,
                        from_seq: from,
                    });
                }
            }
        }
        for job in states.iter_mut().flat_map(|s| s.jobs.values_mut()) {
            job.sampled_comms = 0;
        }
        for ((name, _), (k, _)) in &self.set {
            if *k > 1
                && let Some(j) = states.iter_mut().find_map(|s| s.jobs.get_mut(name))
            {
                j.sampled_comms += 1;
            }
        }
        Some(Arc::new(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks' all-reduces at `per_s` instances per second of record time, from record
    /// second `from_s` to `to_s` (the job began 60 s before the collector's now).
    fn allreduces(st: &mut State, from_s: f64, to_s: f64, per_s: f64, seq0: u64) -> u64 {
        use commscope_wire::op::{Clock, Op};
        use commscope_wire::record::{Call, Record};
        let n = ((to_s - from_s) * per_s) as u64;
        for rank in 0..2 {
            let header = commscope_wire::cst::Header {
                job: "j".into(),
                node: "n".into(),
                pid: 100 + rank as u32,
                rank,
                world_size: 2,
                mono_anchor: 1_000_000_000,
                real_anchor: crate::state::now_ns() - 60_000_000_000,
                ..Default::default()
            };
            let records: Vec<Record> = (0..n)
                .map(|i| {
                    let t = 1_000_000_000 + ((from_s + i as f64 / per_s) * 1e9) as u64;
                    Record::Call(Call {
                        rank,
                        op: Op::Allreduce as u8,
                        clock: Clock::HostMono as u8,
                        comm_id: 7,
                        comm_size: 2,
                        seq: seq0 + i,
                        t_enter: t - 1_000,
                        t_exit: t,
                        ..Default::default()
                    })
                })
                .collect();
            st.apply(&header, None, &records);
        }
        seq0 + n
    }

    #[test]
    fn load_is_measured_per_second_of_the_records_own_time() {
        // The collector takes in 4 s of a job's records in no time at all (it was behind):
        // measured by arrival that is an enormous rate, by record time it is what the job made.
        let mut st = State::new(crate::state::Limits::default());
        let mut p = Policy::default();
        let seq = allreduces(&mut st, 0.0, 2.0, 1000.0, 0);
        assert!(
            p.tick(&mut [&mut st], 1e9, None).is_none(),
            "a baseline only"
        );
        let seq = allreduces(&mut st, 2.0, 6.0, 1000.0, seq);
        p.tick(&mut [&mut st], 1e9, None);
        // 2 ranks × 1,000 calls per second.
        assert!(
            (p.offered - 2000.0).abs() < 200.0,
            "offered {} calls/s",
            p.offered
        );
        // Under a budget of 500 calls/s the factor rises (at once: kept is 4× the budget), but
        // never past the cap that keeps 4 instances a second.
        allreduces(&mut st, 6.0, 9.0, 1000.0, seq);
        let rates = p.tick(&mut [&mut st], 500.0, None).expect("rates change");
        let r = &rates["n"][0];
        assert_eq!(r.comm_id, 7);
        assert_eq!(r.modulus, 4);
        assert!(r.from_seq > seq, "applies ahead of the fastest member");
    }

    #[test]
    fn near_the_memory_bound_fewer_instances_are_kept() {
        // 20 instances a second, a budget it cannot meet: normally thinned to 1 in 4 (5 kept a
        // second); with the floor at one instance a second (at the bound), to 1 in 16.
        for (floor, modulus) in [(0.0, 4), (2.0, 8), (1.0, 16)] {
            let mut st = State::new(crate::state::Limits::default());
            let mut p = Policy {
                min_instances: floor,
                ..Policy::default()
            };
            let seq = allreduces(&mut st, 0.0, 2.0, 20.0, 0);
            assert!(p.tick(&mut [&mut st], 1.0, None).is_none(), "a baseline");
            let seq = allreduces(&mut st, 2.0, 6.0, 20.0, seq);
            // Far over the budget: the factor rises at once.
            let rates = p.tick(&mut [&mut st], 1.0, None).expect("rates change");
            assert_eq!(rates["n"][0].modulus, modulus, "floor {floor}");
            allreduces(&mut st, 6.0, 9.0, 20.0, seq);
            assert!(p.tick(&mut [&mut st], 1.0, None).is_none(), "and stays");
        }
    }

    #[test]
    fn lag_presses_the_budget_while_it_grows_and_gives_it_back_when_it_stops() {
        let s = 1_000_000_000u64;
        let mut lag = Lag::default();
        // Current: nothing changes.
        assert!(!lag.tick(s));
        assert_eq!(lag.divisor, 1);
        // Behind and falling further behind: halved each tick.
        assert!(lag.tick(12 * s));
        assert!(lag.tick(14 * s));
        assert_eq!(lag.divisor, 4);
        // Shrinking (what was cut drains): held, and calm.
        assert!(!lag.tick(12 * s));
        assert_eq!(lag.divisor, 4);
        // Staying put at 13 s: calm; after five calm ticks the budget is given back one step at
        // a time.
        for _ in 0..3 {
            assert!(!lag.tick(13 * s));
        }
        assert!(lag.tick(13 * s));
        assert_eq!(lag.divisor, 2);
        // Growing again: pressed again.
        assert!(lag.tick(15 * s));
        assert_eq!(lag.divisor, 4);
        // Far behind and not catching up, however slowly it grows: pressed to the bound.
        let mut far = Lag::default();
        for _ in 0..20 {
            far.tick(25 * s);
        }
        assert_eq!(far.divisor, MAX_LAG_DIVISOR);
        // A lag under the threshold never presses, rising or not: the delivery's own latency
        // (a simulated fleet of 8,192 nodes ships every 8 s).
        let mut steady = Lag::default();
        for i in 0..20 {
            assert!(!steady.tick(i.min(9) * s));
        }
    }

    #[test]
    fn powers_of_two_round_down() {
        assert_eq!(pow2_floor(0.3), 1);
        assert_eq!(pow2_floor(1.0), 1);
        assert_eq!(pow2_floor(2.0), 2);
        assert_eq!(pow2_floor(7.9), 4);
        assert_eq!(pow2_floor(64.0), 64);
    }
}
