//! `dead-rank`: a process that ended without finalizing — killed by a signal, exited with an
//! error, or (in a trace without exit records) whose heartbeats stopped.
//!
//! Measures how each rank ended and when, and what the ranks still running were blocked in.
//! Fires for the rank that ended *first*: when launchers (`mpirun`, `torchrun`, `srun`) take
//! the rest of a job down after one rank dies, the ranks killed after it are consequences, not
//! findings. The first is told by record order — the rank the others were blocked waiting for,
//! which never entered their call — and otherwise by time: the kernel's exit times as the agent
//! reports them (5 ms apart at least: a launcher takes milliseconds to react, a node's crash
//! kills its processes within microseconds of each other), or, from heartbeats alone (one a
//! second), a lead of a second and a half. A job that was already
//! hung when its first process ended was taken down because it hung: the hang is the finding.
//! A job taken down as a whole, with nothing to single a rank out, gives no finding.

use std::collections::{BTreeMap, BTreeSet};

use super::Liveness;
use super::waits::{Root, Waits};
use crate::view::{Ending, JobView};

/// Exit times (the kernel's, seen by agents) closer than this are one event.
const OBSERVED_WINDOW_NS: u64 = 5_000_000;
/// Endings inferred from silence (heartbeats come once a second, at any phase) closer than
/// this are one event.
const INFERRED_WINDOW_NS: u64 = 1_500_000_000;
/// A launcher takes a job down within this of its first death: waits that short, ended by the
/// teardown, are record-order evidence even between endings inferred from silence.
const TEARDOWN_NS: u64 = 3_000_000_000;

/// Which ranks ended abnormally, and which of them are root causes.
#[derive(Debug, Default)]
pub struct Deaths {
    /// Ended without finalizing.
    pub ended: BTreeMap<i32, Ending>,
    /// The first to end, the root causes (empty when nothing singles a rank out).
    pub roots: BTreeSet<i32>,
    /// How the roots were told from the ranks that ended after them.
    pub how_found: &'static str,
    /// When the job is known to have hung already (a mismatch found), if it is: a trace's
    /// silences after that are the hung job's teardown, not findings of their own.
    pub hung_at: Option<u64>,
}

/// How a rank ended, for its finding's sentence.
pub fn ending_phrase(e: &Ending) -> String {
    match (e.signal, e.status) {
        (Some(sig), _) => format!("was killed by signal {sig}{}", signal_name(sig)),
        (None, Some(st)) if e.observed => format!("exited with status {st} without finalizing"),
        _ if e.observed => "exited without finalizing".into(),
        _ => "stopped (its heartbeats ended without a clean shutdown)".into(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        6 => " (SIGABRT)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV)",
        15 => " (SIGTERM)",
        7 => " (SIGBUS)",
        _ => "",
    }
}

/// The ranks that ended abnormally: an ending without finalizing; from a trace also silence —
/// every unfinished process of a trace ended when it was last heard from (unless its records
/// were lost to damage: [`crate::view::RankView::data_lost`]). (Live, its agent
/// says when a process ends; a silent one that still exists is frozen, not dead.)
pub fn ended(view: &JobView) -> BTreeMap<i32, Ending> {
    view.ranks
        .values()
        .filter(|r| !r.finalized && !r.data_lost)
        .filter_map(|r| {
            if let Some(e) = r.ended {
                return Some((r.rank, e));
            }
            (r.last_heard_ns > 0 && !view.live).then_some((
                r.rank,
                Ending {
                    at_ns: r.last_heard_ns,
                    ..Default::default()
                },
            ))
        })
        .collect()
}

/// Finds the root deaths of a job.
/// `hung_at`: when the job is known to have hung already (a mismatch found), if it is.
pub fn deaths(view: &JobView, th: &Liveness, hung_at: Option<u64>) -> Deaths {
    let ended = ended(view);
    let mut d = Deaths {
        ended,
        hung_at,
        ..Default::default()
    };
    let Some(first) = d.ended.values().map(|e| e.at_ns).min() else {
        return d;
    };
    // Hung before anyone died: calls waiting for the hang floor when the first process ended.
    let hung_before = view.ranks.values().any(|r| {
        r.in_flight
            .iter()
            .any(|c| c.entered_ns > 0 && c.entered_ns + th.hang_floor_ns <= first)
    });
    // Or stuck as a whole: every rank inside a call for a second at least (nobody elsewhere to
    // die first), or a mismatch already found — the kills that follow take a hung job down.
    let all_inside = view.ranks.values().all(|r| {
        r.in_flight
            .iter()
            .any(|c| c.entered_ns > 0 && c.entered_ns + 1_000_000_000 <= first)
    });
    // (Stuck as a whole only counts when the whole job then ended within seconds.)
    let taken_down = view.ranks.values().all(|r| {
        d.ended
            .get(&r.rank)
            .is_some_and(|e| e.at_ns <= first + TEARDOWN_NS)
    });
    if hung_before || (all_inside && taken_down) || hung_at.is_some_and(|t| t <= first) {
        return d;
    }
    let by_order = by_record_order(view, &d.ended);
    // Several ranks none of whose endings was seen, each missing from the others' calls: the
    // shim's files ended before telling which went first — no finding rather than a guess.
    let ambiguous = by_order.len() > 1
        && by_order
            .iter()
            .all(|r| d.ended.get(r).is_some_and(|e| !e.observed));
    if ambiguous {
        return d;
    }
    if !by_order.is_empty() {
        d.roots = by_order;
        d.how_found = "the others were blocked waiting for it";
        return d;
    }
    let window = d
        .ended
        .values()
        .map(window)
        .max()
        .unwrap_or(OBSERVED_WINDOW_NS);
    let early: BTreeSet<i32> = d
        .ended
        .iter()
        .filter(|(_, e)| e.at_ns <= first + window)
        .map(|(r, _)| *r)
        .collect();
    // Others went on: some still run or shut down cleanly, or the rest ended clearly later,
    // and close together compared with how far after the first (a launcher's teardown, not a
    // job killed one process after another, as `pkill` does).
    let alive = view
        .ranks
        .values()
        .any(|r| !early.contains(&r.rank) && (r.finalized || !d.ended.contains_key(&r.rank)));
    let mut rest: Vec<u64> = d
        .ended
        .iter()
        .filter(|(r, _)| !early.contains(r))
        .map(|(_, e)| e.at_ns)
        .collect();
    rest.sort_unstable();
    let early_end = early
        .iter()
        .filter_map(|r| d.ended.get(r))
        .map(|e| e.at_ns)
        .max()
        .unwrap_or(first);
    // A clear gap after the first endings: wider than the window, than their own spread, and
    // than the usual spacing of the endings after it (a launcher kills the rest at once; `pkill`
    // one process after another, as evenly spaced from the first as from each other).
    let mut spacing: Vec<u64> = rest.windows(2).map(|w| w[1] - w[0]).collect();
    spacing.sort_unstable();
    // The lower quartile: kills come in bursts (per node, per proxy) with pauses between.
    let usual = spacing.get(spacing.len() / 4).copied().unwrap_or(0);
    let apart = rest.first().is_some_and(|&next| {
        let gap = next - early_end;
        gap >= window && gap >= 4 * usual && gap >= 2 * (early_end - first)
    });
    // The first to end are a few, not most of the job (that is a job taken down as a whole).
    let few = 2 * early.len() <= view.ranks.len().max(2);
    if few && (alive || apart) {
        d.roots = early;
        d.how_found = "it ended first";
    }
    d
}

/// Among ranks that ended, those the others were blocked waiting for when they ended: ranks
/// that never entered a call the others sat in for a while (at least 100 ms, and longer than any
/// call completed on the communicator), and that ended clearly before the rank waiting.
fn by_record_order(view: &JobView, ended: &BTreeMap<i32, Ending>) -> BTreeSet<i32> {
    let none = BTreeSet::new();
    let waits = Waits {
        view,
        explained: &none,
    };
    let mut roots = BTreeSet::new();
    for r in view.ranks.values() {
        let until = ended.get(&r.rank).map_or(view.now_ns, |e| e.at_ns);
        for c in &r.in_flight {
            let longest = view.comms.get(&c.comm).map_or(0, |x| x.longest_ns);
            if c.age_ns < (100_000_000u64).max(longest) {
                continue;
            }
            // A short wait ended by the teardown: the rank it waited for stopped first if its
            // records end before the waiter's (the waiter's `enter` proves it was alive).
            let torn_down = ended.contains_key(&r.rank) && c.age_ns <= TEARDOWN_NS;
            for root in waits.roots(r.rank, c) {
                if let Root::Rank(x) = root
                    && let Some(e) = ended.get(&x)
                    // Inside some call we have no record of: not shown to be elsewhere.
                    && !view.ranks.get(&x).is_some_and(|p| p.busy_unseen)
                    && (ended_before(e, until)
                        || (torn_down && e.at_ns + OBSERVED_WINDOW_NS <= until))
                {
                    roots.insert(x);
                }
            }
        }
    }
    roots
}

/// A rank others waited for, and that never joined them, is the first to end unless it ended
/// clearly after them: the kernel's exit times can put a process whose threads take a moment
/// to go a little behind the ones a launcher killed in reaction (a millisecond), while silence is
/// known only to a heartbeat period (then it must have gone quiet that much earlier).
fn ended_before(e: &Ending, until: u64) -> bool {
    if e.observed {
        e.at_ns < until + 1_000_000
    } else {
        e.at_ns + INFERRED_WINDOW_NS <= until
    }
}

/// Endings closer than this are one event.
fn window(e: &Ending) -> u64 {
    if e.observed {
        OBSERVED_WINDOW_NS
    } else {
        INFERRED_WINDOW_NS
    }
}
