//! The detectors over one view of a job ([`crate::view::JobView`]), which the collector's live
//! state and the replay of a trace both produce.
//!
//! - [`dead_rank`]: the first process to end without finalizing.
//! - [`hang`]: instances that make no progress, traced to their root: ranks that never entered
//!   (hang), a process that stopped (frozen: hang), every member inside (a stall:
//!   communication-hang with no rank), or a death or mismatch that explains them.
//! - [`comm_error`]: errors the communication library reported.
//! - [`degraded`]: collectives slower than their own best or their peers', no rank late.
//! - [`slow_rank`]: ranks (or a node's) the others keep waiting for, from their own extra compute.
//! - [`mismatch`]: members of an instance that called different things (its instance data
//!   comes from the instance detectors in [`crate::stream`]).
//! - [`waits`]: the wait graph both use.
//! - [`dead_link`]: the transport's dead links behind a stall.
//!
//! [`liveness`] runs them together, so one root cause gives one finding: the hangs a death, a
//! frozen process or a mismatch causes are that finding's evidence.

pub mod comm_error;
pub mod dead_link;
pub mod dead_rank;
pub mod degraded;
pub mod hang;
pub mod mismatch;
pub mod slow_rank;
pub mod waits;

use crate::finding::Finding;
use crate::view::JobView;

/// Thresholds of the liveness detectors (documented in docs/diagnosis.md).
#[derive(Clone, Debug)]
pub struct Liveness {
    /// A call in flight at least this long (and twice its communicator's longest completed
    /// call) is stuck.
    pub hang_floor_ns: u64,
    /// A process silent this long while its peers go on is dead (trace) or frozen (live).
    pub dead_after_ns: u64,
    /// Live: a process its agent has not reported on for this long is out of sight (its agent
    /// is silent: the node's network may have failed; the collector learns within its
    /// keepalive timeout). Until then it is neither blamed nor cleared.
    pub unseen_after_ns: u64,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            hang_floor_ns: 5_000_000_000,
            dead_after_ns: 3_000_000_000,
            unseen_after_ns: 2_500_000_000,
        }
    }
}

/// The liveness findings of a job (dead-rank, hang), given the mismatch findings the instance
/// detectors made of it: a hang a mismatch explains goes into that mismatch's evidence.
pub fn liveness(view: &JobView, th: &Liveness, mismatches: &mut [Finding]) -> Vec<Finding> {
    // A mismatch found: the job hung then, and kills after it are its consequences.
    let hung_at = mismatches.iter().map(|m| hung_since(view, m)).min();
    let deaths = dead_rank::deaths(view, th, hung_at);
    hang::findings(view, th, &deaths, mismatches)
}

/// When a mismatch hung its job: when it was found, or earlier, when the members still inside
/// its instance had all entered it. (A trace's mismatch is often found only from the calls in
/// flight at its end; a member whose records stop while inside that instance was stuck there,
/// not the first to die.)
fn hung_since(view: &JobView, m: &Finding) -> u64 {
    let key = m
        .comm
        .as_deref()
        .and_then(commscope_wire::hash::parse_comm_id)
        .zip(m.seq);
    let entered = view
        .ranks
        .values()
        .flat_map(|r| &r.in_flight)
        .filter(|c| Some((c.comm, c.seq)) == key && !c.op.is_p2p() && c.entered_ns > 0)
        .map(|c| c.entered_ns)
        .max();
    entered.map_or(m.opened_at, |t| t.min(m.opened_at))
}

#[cfg(test)]
mod tests;
