//! Consistent sampling policy (ARCHITECTURE.md, "Consistent sampling"): every two seconds the
//! collector compares the calls jobs offer per second (kept and left out) with its budget and
//! sets a power-of-two modulus per communicator, so agents keep `hash(comm, seq) mod K == 0`.
//!
//! - One factor `g` for every job: the smallest power of two that brings the kept load under
//!   the budget. A communicator gets `min(g, cap)`, `cap` keeping at least four of its instances
//!   (point-to-point only: one message) per second — the detectors need evidence, and a slow
//!   communicator (a step's world all-reduce) is never thinned at all. Doubling stops where it
//!   no longer helps.
//! - `g` is raised after two ticks over the budget, and lowered (halved) only after the offered
//!   load stayed under half the budget for ten seconds.
//! - A new modulus applies from an instance a second or more ahead of the fastest member, so every
//!   agent has it before its ranks get there; a communicator without collectives (point-to-point
//!   only) switches at once.
//! - `--sample-modulus K` forces K on every communicator.

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
    /// Per (job, comm): calls counted and highest seq at the previous tick.
    last: HashMap<(String, u64), (u64, u64)>,
    /// Per (job, comm): the modulus set and the seq it applies from.
    set: HashMap<(String, u64), (u32, u64)>,
    /// Offered and kept load at the last tick (calls/s).
    pub offered: f64,
    pub kept: f64,
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
    /// One tick, `dt_s` after the previous one: the rates per node when they changed.
    pub fn tick(
        &mut self,
        st: &mut State,
        budget: f64,
        forced: Option<u32>,
        dt_s: f64,
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
        for (name, job) in &st.jobs {
            if job.ended.is_some() {
                continue;
            }
            for (id, c) in &job.comms {
                let calls: u64 =
                    c.ops.values().map(|o| o.calls).sum::<u64>() + c.p2p_sends + c.p2p_recvs;
                let hi = c.progress.values().copied().max().unwrap_or(0);
                let key = (name.clone(), *id);
                let (c0, h0) = self.last.get(&key).copied().unwrap_or((calls, hi));
                self.last.insert(key.clone(), (calls, hi));
                seen.insert(key);
                // p2p counts both ends of a message; calls are what agents send.
                let rate = calls.saturating_sub(c0) as f64 / dt_s.max(0.1);
                let inst = hi.saturating_sub(h0) as f64 / dt_s.max(0.1);
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
        let cap = |c: &C| {
            if !c.collective {
                // Point-to-point only: at least one message per second is kept.
                pow2_floor(c.rate)
            } else {
                // Detectors need evidence: at least 4 kept instances per second.
                pow2_floor(c.inst / 4.0)
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
            if self.over_ticks >= 2 {
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
        for (name, job) in &st.jobs {
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
        for job in st.jobs.values_mut() {
            job.sampled_comms = 0;
        }
        for ((name, _), (k, _)) in &self.set {
            if *k > 1
                && let Some(j) = st.jobs.get_mut(name)
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

    #[test]
    fn powers_of_two_round_down() {
        assert_eq!(pow2_floor(0.3), 1);
        assert_eq!(pow2_floor(1.0), 1);
        assert_eq!(pow2_floor(2.0), 2);
        assert_eq!(pow2_floor(7.9), 4);
        assert_eq!(pow2_floor(64.0), 64);
    }
}
