//! The wait graph: whom a call in flight waits for, and the root of a chain of waits.
//!
//! A collective waits for the members that have neither entered nor completed it; when every
//! member is inside, it waits for the members whose process is known to be gone or stopped,
//! and otherwise for the library itself (a stall). GPU-stream work (NCCL) that another member
//! already completed waits for nobody: the instance went through, and only this rank's GPU has
//! not finished its part. A point-to-point call waits for its peer,
//! unless the peer is inside the matching call (then the two are matched and only slow, or the
//! transport stalls). The chain is followed through ranks that are themselves blocked; it ends
//! at a rank that waits for nobody (outside the library, or already explained by a death, a
//! frozen process or a mismatch) or at a stalled instance.

use std::collections::{BTreeSet, HashSet};

use crate::view::{InFlight, JobView};

/// What a chain of waits ends at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Root {
    /// A rank.
    Rank(i32),
    /// An instance every member entered and none completes: `(comm, seq)`.
    Stall(u64, u64),
}

/// The wait graph of a job, with the ranks whose cause is already known (dead, frozen,
/// mismatched): they wait for nobody.
#[derive(Debug)]
pub struct Waits<'a> {
    pub view: &'a JobView,
    pub explained: &'a BTreeSet<i32>,
}

impl Waits<'_> {
    /// Whom `call` of `rank` waits for.
    pub fn blockers(&self, rank: i32, call: &InFlight) -> Vec<Root> {
        let v = self.view;
        if call.op.is_p2p() {
            let Some(peer) = call.peer else {
                return vec![];
            };
            if self.explained.contains(&peer) {
                return vec![Root::Rank(peer)];
            }
            let matched = v.ranks.get(&peer).is_some_and(|p| {
                p.in_flight
                    .iter()
                    .any(|x| x.comm == call.comm && x.op.is_p2p() && x.peer == Some(rank))
            });
            return if matched {
                vec![]
            } else {
                vec![Root::Rank(peer)]
            };
        }
        let members = v.members(call.comm);
        let missing: Vec<Root> = members
            .iter()
            .copied()
            .filter(|m| *m != rank)
            .filter(|m| !v.inside(call.comm, *m, call.seq) && !v.done(call.comm, *m, call.seq))
            .map(Root::Rank)
            .collect();
        if !missing.is_empty() {
            return missing;
        }
        // Seen from the host only: every member issued it, and nothing is known of its
        // completion (a stall and a quiet job look the same): only a member already explained
        // (gone, stopped) is waited for.
        if call.issued_only {
            return members
                .iter()
                .copied()
                .filter(|m| self.explained.contains(m))
                .map(Root::Rank)
                .collect();
        }
        // Stream work another member completed: the instance went through, and what is left is
        // this rank's own GPU finishing its part. It waits for nobody.
        if call.stream
            && members
                .iter()
                .any(|m| *m != rank && v.done(call.comm, *m, call.seq))
        {
            return vec![];
        }
        // A member that completed the instance and then ended is not waited for: the instance
        // went through on its side (a launcher's teardown often finds ranks still leaving a
        // barrier the first to die had left). A member that called something else (mismatched)
        // is waited for whether or not its own call completed.
        let left_after = |m: i32| {
            v.done(call.comm, m, call.seq) && v.ranks.get(&m).is_some_and(|p| p.ended.is_some())
        };
        let gone: Vec<Root> = members
            .iter()
            .copied()
            .filter(|m| self.explained.contains(m) && !left_after(*m))
            .map(Root::Rank)
            .collect();
        if !gone.is_empty() {
            return gone;
        }
        if members.len() < 2 {
            return vec![];
        }
        // Stream work queued behind older stream work still in flight on a member: it waits
        // for that work, which has its own blockers.
        if call.stream
            && members.iter().any(|m| {
                v.ranks.get(m).is_some_and(|r| {
                    r.in_flight
                        .iter()
                        .any(|x| x.stream && x.entered_ns < call.entered_ns && x != call)
                })
            })
        {
            return vec![];
        }
        vec![Root::Stall(call.comm, call.seq)]
    }

    /// Whom `rank` waits for, over all its calls in flight.
    fn rank_blockers(&self, rank: i32) -> Option<Vec<Root>> {
        if self.explained.contains(&rank) {
            return None;
        }
        let r = self.view.ranks.get(&rank)?;
        if r.in_flight.is_empty() {
            return None;
        }
        Some(
            r.in_flight
                .iter()
                .flat_map(|c| self.blockers(rank, c))
                .collect(),
        )
    }

    /// The roots behind `call` of `origin`: follows ranks that are themselves blocked. When the
    /// chain closes into a cycle (a rank blocked in a receive from a peer that waits in a
    /// collective for it), the roots are the ranks of the cycle blocked in point-to-point while
    /// the others are in collectives, or else the whole cycle.
    ///
    /// A rank whose records a damaged trace cut short ([`crate::view::RankView::data_lost`])
    /// is unknown from there on: whether it entered is not known. The chain does not go
    /// through it, and it is a root only when the chain leads nowhere else — a cycle of known
    /// ranks waiting on each other is a deadlock whatever the unknown rank did.
    pub fn roots(&self, origin: i32, call: &InFlight) -> BTreeSet<Root> {
        let mut seen: HashSet<i32> = HashSet::from([origin]);
        let mut chain: BTreeSet<i32> = BTreeSet::new();
        let mut frontier = self.blockers(origin, call);
        let mut roots = BTreeSet::new();
        let mut unknown = BTreeSet::new();
        while let Some(node) = frontier.pop() {
            let Root::Rank(r) = node else {
                roots.insert(node);
                continue;
            };
            if !seen.insert(r) {
                continue;
            }
            if self.unknown(r) {
                unknown.insert(node);
                continue;
            }
            chain.insert(r);
            match self.rank_blockers(r) {
                Some(next) if !next.is_empty() => frontier.extend(next),
                // Blocked in calls that wait for nobody (matched point-to-point, any-source):
                // it is still where the chain ends.
                _ => {
                    roots.insert(node);
                }
            }
        }
        if !roots.is_empty() || chain.is_empty() {
            return if roots.is_empty() { unknown } else { roots };
        }
        let cycle = self.waiting_on_each_other(chain.iter().copied().chain([origin]).collect());
        if cycle.is_empty() {
            return unknown;
        }
        let p2p: BTreeSet<Root> = cycle
            .iter()
            .copied()
            .filter(|r| {
                self.view
                    .ranks
                    .get(r)
                    .is_some_and(|x| x.in_flight.iter().any(|c| c.op.is_p2p()))
            })
            .map(Root::Rank)
            .collect();
        if !p2p.is_empty() {
            return p2p;
        }
        // A cycle has two ranks at least: the others than the origin.
        cycle
            .into_iter()
            .filter(|r| *r != origin)
            .map(Root::Rank)
            .collect()
    }

    /// Its records end in damage: what it did from there on is unknown.
    fn unknown(&self, rank: i32) -> bool {
        !self.explained.contains(&rank) && self.view.ranks.get(&rank).is_some_and(|r| r.data_lost)
    }

    /// Of `ranks`, those that wait on each other: what is left after taking away, again and
    /// again, every rank that waits for none of those left (it waits only for unknown ranks,
    /// or for ranks already taken away).
    fn waiting_on_each_other(&self, mut ranks: BTreeSet<i32>) -> BTreeSet<i32> {
        let waits_for: Vec<(i32, Vec<i32>)> = ranks
            .iter()
            .map(|r| {
                let next = self
                    .rank_blockers(*r)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|b| match b {
                        Root::Rank(b) if ranks.contains(&b) && b != *r => Some(b),
                        _ => None,
                    })
                    .collect();
                (*r, next)
            })
            .collect();
        loop {
            let free: Vec<i32> = waits_for
                .iter()
                .filter(|(r, next)| ranks.contains(r) && !next.iter().any(|b| ranks.contains(b)))
                .map(|(r, _)| *r)
                .collect();
            if free.is_empty() {
                return ranks;
            }
            for r in free {
                ranks.remove(&r);
            }
        }
    }
}
