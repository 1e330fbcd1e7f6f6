//! `dead-rank`: a process that ended without finalizing — exited without `MPI_Finalize`,
//! called `MPI_Abort`, crashed on a fatal signal, was killed, or (in a trace without exit
//! records) whose heartbeats stopped.
//!
//! Measures how each rank ended and when, and what the ranks still running were blocked in.
//! Fires for the rank that ended *first*: when launchers (`mpirun`, `torchrun`, `srun`) take
//! the rest of a job down after one rank dies, the ranks killed after it are consequences, not
//! findings. In order:
//! - a rank that ended *of its own doing* (an exit status, `MPI_Abort`, a fault; recorded by the
//!   process as it ended, so its time is when it began to end) comes before ranks taken down
//!   from outside (SIGTERM, SIGKILL) or merely gone silent around it — unless one of those
//!   ended clearly before it — provided its end mattered: others waited for it, or were taken
//!   down after it. A rank blocked waiting for a rank that ended earlier is never a root;
//! - otherwise by record order — the rank the others were blocked waiting for, which never
//!   entered their call;
//! - otherwise by time: the kernel's exit times as the agent reports them (5 ms apart at least:
//!   a launcher takes milliseconds to react, a node's crash kills its processes within
//!   microseconds of each other), or, from heartbeats alone (one a second), a lead of a second
//!   and a half.
//!
//! A job that was already hung when its first process ended was taken down because it hung:
//! the hang is the finding. A job taken down as a whole, with nothing to single a rank out,
//! gives no finding.

use std::collections::{BTreeMap, BTreeSet};

use super::Liveness;
use super::waits::{Root, Waits};
use crate::view::{Ending, InFlight, JobView, Sender};

/// Exit times seen by an observer that knows no more than when it noticed (an agent or trace
/// keeper without the kernel's exit events: its thread woke some time after the exit) closer
/// than this are one event.
const OBSERVED_WINDOW_NS: u64 = 5_000_000;
/// Exit times the kernel stamped (they come with the exit status or signal), or that the
/// process recorded as it began to end, closer than this are one event. A launcher reacts
/// within a fraction of a millisecond on its own node (Hydra killed the rest 0.4 ms after the
/// first death), while the kernel orders a killed process with many threads at most tens of
/// microseconds late (23 µs measured under Hydra).
const PRECISE_WINDOW_NS: u64 = 250_000;
/// Endings inferred from silence (heartbeats come once a second, at any phase) closer than
/// this are one event.
const INFERRED_WINDOW_NS: u64 = 1_500_000_000;
/// A launcher takes a job down within this of its first death: waits that short, ended by the
/// teardown, are record-order evidence even between endings inferred from silence.
const TEARDOWN_NS: u64 = 3_000_000_000;
/// Ranks that end within this after a rank ended of its own doing were taken down after it.
const TAKEN_DOWN_NS: u64 = 5_000_000_000;

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

/// How a rank ended, for its finding's sentence ("exited with status 3 without finalizing",
/// "was killed by signal 9 (SIGKILL)"); `several`: said of several ranks ("were killed").
pub fn ending_phrase(e: &Ending, several: bool) -> String {
    let was = if several { "were" } else { "was" };
    match (e.aborted, e.signal, e.status) {
        (true, _, Some(code)) => format!("called MPI_Abort with error code {code}"),
        (true, _, None) => "called MPI_Abort".into(),
        (_, Some(sig), _) if e.by_itself() => {
            format!("crashed on signal {sig}{}", signal_label(sig))
        }
        (_, Some(sig), _) => format!(
            "{was} killed by signal {sig}{}{}",
            signal_label(sig),
            sender_phrase(e.sent_by, sig)
        ),
        (_, None, Some(st)) => format!("exited with status {st} without finalizing"),
        _ if e.recorded => "exited without finalizing".into(),
        _ if e.observed => "ended without finalizing (its exit status was not seen)".into(),
        _ => "stopped (its heartbeats ended without a clean shutdown)".into(),
    }
}

/// ", sent by the kernel (the OOM killer)" and the like; "" when the sender is unknown.
fn sender_phrase(by: Option<Sender>, sig: i32) -> String {
    match by {
        None => String::new(),
        Some(Sender::Kernel) if sig == 9 => ", sent by the kernel (the OOM killer)".into(),
        Some(Sender::Kernel) => ", sent by the kernel (a terminal's interrupt or hangup)".into(),
        Some(Sender::Itself) => ", sent by itself".into(),
        Some(Sender::Launcher(p)) => format!(", sent by its launcher (pid {p})"),
        Some(Sender::Other(p)) => format!(", sent by pid {p}"),
    }
}

/// What to look at next, for a rank that ended so, on `node`.
pub fn ending_advice(e: &Ending, rank: i32, node: &str) -> String {
    let node = if node.is_empty() { "its node" } else { node };
    match (e.aborted, e.signal, e.sent_by) {
        (false, Some(_), Some(Sender::Itself)) => {
            return format!(
                "look at rank {rank}'s output and code (or a library it loads) for why it killed itself"
            );
        }
        (false, Some(sig), Some(Sender::Other(p))) => {
            return format!(
                "find out what process {p} on {node} was (an operator's kill, a watchdog, the scheduler) and why it sent signal {sig}"
            );
        }
        _ => {}
    }
    match (e.aborted, e.signal, e.status) {
        (true, ..) => format!(
            "look at rank {rank}'s output for the error the program reported before it called MPI_Abort"
        ),
        (_, Some(6), _) => format!(
            "look at rank {rank}'s output for the failed assertion or abort message, and at its core dump"
        ),
        (_, Some(9), _) if e.sent_by == Some(Sender::Kernel) => format!(
            "look at {node}'s kernel log for the OOM killer (`dmesg | grep -i 'killed process'`) and at rank {rank}'s memory use"
        ),
        (_, Some(9), _) => format!(
            "look at {node}'s kernel log for the OOM killer (`dmesg | grep -i 'killed process'`) or at whoever killed it"
        ),
        (_, Some(_), _) if e.by_itself() => format!(
            "look at rank {rank}'s core dump or stack trace, and at {node}'s kernel log (`dmesg`) for the faulting address"
        ),
        (_, Some(sig), _) => {
            format!("look at what sent it signal {sig} ({node}'s logs, the scheduler's)")
        }
        (_, None, Some(_)) => {
            format!("look at rank {rank}'s output (stderr) for the error that made it exit")
        }
        _ => format!(
            "look at {node}'s logs and kernel messages (OOM killer, segfault) for why it ended"
        ),
    }
}

/// " (SIGKILL)" for signal 9, and so on ("" for signals without a common name here).
pub fn signal_label(sig: i32) -> &'static str {
    match sig {
        1 => " (SIGHUP)",
        2 => " (SIGINT)",
        3 => " (SIGQUIT)",
        4 => " (SIGILL)",
        6 => " (SIGABRT)",
        7 => " (SIGBUS)",
        8 => " (SIGFPE)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV)",
        13 => " (SIGPIPE)",
        15 => " (SIGTERM)",
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
                // Seen to exit with status 0, and nothing recorded otherwise, in a job without
                // MPI: a process with no finalize to call (NCCL alone, traced without the
                // preload) ending normally.
                return (view.mpi || !e.clean_exit()).then_some((r.rank, e));
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
    let own = by_own_end(view, &d.ended);
    if !own.is_empty() {
        d.how_found = if own
            .iter()
            .all(|r| d.ended.get(r).is_some_and(Ending::by_itself))
        {
            "it ended on its own, and the others were blocked waiting for it or taken down after it"
        } else {
            "it was killed from outside the job's teardown (not by its launcher), and the others were blocked waiting for it or taken down after it"
        };
        d.roots = own;
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
    // Others going on is no evidence by itself: a rank none of whose peers waited for it (and
    // whose end took nobody down) is not a culprit.
    let alive = alive && blocked_on(view, &early);
    if few && (alive || apart) {
        d.roots = early;
        d.how_found = "it ended first";
    }
    d
}

/// The ranks that ended of their own doing first (see the module documentation), or none.
fn by_own_end(view: &JobView, ended: &BTreeMap<i32, Ending>) -> BTreeSet<i32> {
    let none = BTreeSet::new();
    // Blocked waiting for a rank that ended before them: consequences, whatever their end.
    let blocked = |c: &InFlight| !c.posted;
    let waiting: BTreeSet<i32> = waits_on_ended(view, ended, blocked)
        .iter()
        .map(|(w, _)| *w)
        .collect();
    let own: BTreeMap<i32, &Ending> = ended
        .iter()
        .filter(|(r, e)| {
            (e.by_itself() || struck(e, ended, view.ranks.len())) && !waiting.contains(r)
        })
        .map(|(r, e)| (*r, e))
        .collect();
    let Some(t0) = own.values().map(|e| e.at_ns).min() else {
        return none;
    };
    // Another end clearly before it (a rank killed first, or silent long before): its own end
    // may be a consequence; the other rules decide.
    let before = ended
        .iter()
        .filter(|(r, _)| !own.contains_key(r) && !waiting.contains(r))
        .any(|(_, e)| e.at_ns + window(e) <= t0);
    if before {
        return none;
    }
    let roots: BTreeSet<i32> = own
        .iter()
        .filter(|(_, e)| e.at_ns <= t0 + PRECISE_WINDOW_NS)
        .map(|(r, _)| *r)
        .collect();
    if 2 * roots.len() > view.ranks.len().max(2) {
        return none;
    }
    // Its end mattered: the others waited for it, or ended after it (taken down).
    let waited_for = waits_on_ended(view, ended, blocked)
        .iter()
        .any(|(_, x)| roots.contains(x))
        || blocked_on(view, &roots);
    let taken_down = ended
        .iter()
        .any(|(r, e)| !roots.contains(r) && e.at_ns <= t0 + TAKEN_DOWN_NS);
    if waited_for || taken_down {
        roots
    } else {
        none
    }
}

/// Killed from outside the job's teardown: by the kernel (the OOM killer), by itself, or by a
/// process other than its launcher that killed few of the job's ranks (an operator's `kill`, a
/// watchdog) — a cause, where the ranks its launcher killed after it are casualties. A sender
/// that killed most of the job (`pkill`, a scheduler, a terminal's Ctrl-C) took the job down as
/// a whole.
fn struck(e: &Ending, ended: &BTreeMap<i32, Ending>, ranks: usize) -> bool {
    match e.sent_by {
        None | Some(Sender::Launcher(_)) => false,
        Some(Sender::Itself) => true,
        Some(by) => {
            let same = ended.values().filter(|x| x.sent_by == Some(by)).count();
            2 * same <= ranks.max(2)
        }
    }
}

/// Whether a rank still running is blocked in a call one of `roots` never entered.
fn blocked_on(view: &JobView, roots: &BTreeSet<i32>) -> bool {
    let none = BTreeSet::new();
    let waits = Waits {
        view,
        explained: &none,
    };
    view.ranks
        .values()
        .filter(|r| r.ended.is_none() && !r.finalized && !roots.contains(&r.rank))
        .any(|r| {
            r.in_flight.iter().filter(|c| !c.posted).any(|c| {
                waits
                    .roots(r.rank, c)
                    .iter()
                    .any(|x| matches!(x, Root::Rank(x) if roots.contains(x)))
            })
        })
}

/// (waiter, waited for): a rank blocked in a call (one `counts`) that a rank which ended
/// before it never entered.
fn waits_on_ended(
    view: &JobView,
    ended: &BTreeMap<i32, Ending>,
    counts: impl Fn(&InFlight) -> bool,
) -> Vec<(i32, i32)> {
    let none = BTreeSet::new();
    let waits = Waits {
        view,
        explained: &none,
    };
    let mut out = Vec::new();
    for r in view.ranks.values() {
        let until = ended.get(&r.rank).map_or(view.now_ns, |e| e.at_ns);
        for c in r.in_flight.iter().filter(|c| counts(c)) {
            // A short wait ended by the teardown: the rank it waited for stopped first if its
            // records end before the waiter's (the waiter's `enter` proves it was alive).
            let torn_down = ended.contains_key(&r.rank) && c.age_ns <= TEARDOWN_NS;
            for root in waits.roots(r.rank, c) {
                if let Root::Rank(x) = root
                    && x != r.rank
                    && let Some(e) = ended.get(&x)
                    // Inside some call we have no record of: not shown to be elsewhere.
                    && !view.ranks.get(&x).is_some_and(|p| p.busy_unseen)
                    && (ended_before(e, until)
                        || (torn_down && e.at_ns + OBSERVED_WINDOW_NS <= until))
                {
                    out.push((r.rank, x));
                }
            }
        }
    }
    out
}

/// Among ranks that ended, those the others were blocked waiting for when they ended: ranks
/// that never entered a call the others sat in for a while (at least 100 ms, and longer than any
/// call completed on the communicator), and that ended clearly before the rank waiting.
fn by_record_order(view: &JobView, ended: &BTreeMap<i32, Ending>) -> BTreeSet<i32> {
    let long_enough = |c: &InFlight| {
        let longest = view.comms.get(&c.comm).map_or(0, |x| x.longest_ns);
        c.age_ns >= (100_000_000u64).max(longest)
    };
    let mut roots: BTreeSet<i32> = waits_on_ended(view, ended, long_enough)
        .into_iter()
        .map(|(_, x)| x)
        .collect();
    // A rank waited for that itself ended clearly after another one waited for was taken down
    // in the teardown the first started (ranks of another communicator wait for it as well).
    let first = roots
        .iter()
        .filter_map(|r| ended.get(r))
        .filter(|e| e.observed)
        .map(|e| e.at_ns)
        .min();
    if let Some(first) = first {
        roots.retain(|r| {
            ended
                .get(r)
                .is_some_and(|e| !e.observed || e.at_ns <= first + window(e))
        });
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
    if e.recorded || (e.observed && (e.status.is_some() || e.signal.is_some())) {
        PRECISE_WINDOW_NS
    } else if e.observed {
        OBSERVED_WINDOW_NS
    } else {
        INFERRED_WINDOW_NS
    }
}
