//! `hang`: calls in flight that make no progress, each traced to its root cause.
//!
//! Measures how long every call has been in flight. A call is stuck once that passes the hang
//! floor and twice its communicator's longest completed call. Its wait chain
//! ([`super::waits`]) names the root, and the finding is the root's:
//! - ranks that never entered (alive, elsewhere): one `hang` naming them — one finding when
//!   they block the same instance, however many communicators wait behind them;
//! - a frozen process (stopped, or silent with its CPU time still while its agent sees it):
//!   `hang` naming it alone, never its waiting partners;
//! - every member inside and every process alive: a stall, `hang` of class
//!   `communication-hang` with no rank, naming the communicator and instance, and the link
//!   when the transport shows one dead among the members' nodes ([`super::dead_link`]);
//! - a rank that died first ([`super::dead_rank`]): one `dead-rank` finding, with what the
//!   others are blocked in as its evidence (also when nobody waits for it yet);
//! - a mismatch: the mismatch finding, with the hang as its evidence;
//! - ranks on a node whose agent is out of contact (live): one `communication-hang` with no
//!   rank and its link naming that node — their silence is lost contact, never their fault.

use std::collections::{BTreeMap, BTreeSet};

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::Op;
use serde_json::{Value, json};

use super::Liveness;
use super::dead_rank::{Deaths, ending_phrase};
use super::waits::{Root, Waits};
use crate::finding::{
    Class, Finding, HangCause, Kind, Link, State, Waited, finding_id, hang_finding, ranks_phrase,
};
use crate::stream::fmt_bytes;
use crate::view::{InFlight, JobView, LostContact, RankView, Sender};

/// A stuck call and the rank waiting in it.
#[derive(Clone, Debug)]
struct Victim<'a> {
    rank: i32,
    call: &'a InFlight,
    /// Its direct blockers.
    direct: Vec<Root>,
}

/// Processes that stopped while their peers go on: live, silent past `dead_after` and stopped
/// (by a signal or a debugger) or with their CPU time standing still; in a trace, silent that long
/// before the others went quiet, though not the first to end (e.g. a job killed as a whole
/// later).
pub fn frozen(view: &JobView, th: &Liveness, deaths: &Deaths) -> BTreeSet<i32> {
    if !view.live {
        return view
            .ranks
            .values()
            .filter(|r| {
                !r.finalized
                    && !r.data_lost
                    && r.last_heard_ns > 0
                    && !deaths.roots.contains(&r.rank)
                    // Fell silent after its job had hung on a mismatch: taken down with it.
                    && deaths.hung_at.is_none_or(|t| r.last_heard_ns < t)
            })
            .filter(|r| {
                let others = view
                    .ranks
                    .values()
                    .filter(|o| o.rank != r.rank)
                    .map(|o| o.last_heard_ns)
                    .max()
                    .unwrap_or(0);
                others.saturating_sub(r.last_heard_ns) >= th.dead_after_ns
            })
            .map(|r| r.rank)
            .collect();
    }
    view.ranks
        .values()
        .filter(|r| r.ended.is_none() && !r.finalized && !deaths.ended.contains_key(&r.rank))
        // Out of contact, or its agent silent: its last state is stale, and its silence says
        // nothing about it.
        .filter(|r| {
            !view.lost.contains_key(&r.node)
                && !view.behind.contains(&r.node)
                && !r.behind
                && r.observed_age_ns.is_none_or(|a| a < th.unseen_after_ns)
        })
        .filter(|r| {
            let silent = r.last_heard_ns > 0
                && view.now_ns.saturating_sub(r.last_heard_ns) >= th.dead_after_ns;
            // Silent for `dead_after` at least (a debugger's short stop is not a finding),
            // and stopped, or its CPU time standing still, or its state unknown.
            silent
                && r.process
                    .as_ref()
                    .is_none_or(|p| p.stopped() || !p.cpu_advancing)
        })
        .map(|r| r.rank)
        .collect()
}

/// The stuck calls' threshold on a communicator.
fn threshold(view: &JobView, th: &Liveness, comm: u64) -> u64 {
    let longest = view.comms.get(&comm).map_or(0, |c| c.longest_ns);
    th.hang_floor_ns.max(2 * longest)
}

/// Runs the hang detector, folding in the deaths and mismatches that explain hangs.
pub fn findings(
    view: &JobView,
    th: &Liveness,
    deaths: &Deaths,
    mismatches: &mut [Finding],
) -> Vec<Finding> {
    let frozen = frozen(view, th, deaths);
    let mut mismatched: BTreeMap<i32, usize> = BTreeMap::new();
    for (i, m) in mismatches.iter().enumerate() {
        for r in &m.ranks {
            mismatched.insert(*r, i);
        }
    }
    let mut explained: BTreeSet<i32> = deaths.roots.clone();
    explained.extend(&frozen);
    // Ranks out of sight wait for nobody we can see; what waits on them is lost contact.
    let out_of_sight = view.out_of_sight();
    explained.extend(&out_of_sight);
    // Ranks whose agent went silent: nothing is said about them, or about what waits on
    // them, until contact resumes or the collector declares the node lost.
    explained.extend(view.unseen(th.unseen_after_ns));
    explained.extend(mismatched.keys());
    let waits = Waits {
        view,
        explained: &explained,
    };

    // Every stuck call of a rank that is not itself a root, with the roots it leads to.
    let mut by_root: BTreeMap<Root, Vec<Victim>> = BTreeMap::new();
    let mut sets: Vec<BTreeSet<i32>> = Vec::new();
    // Live, a process that ended waits no more (its job is being taken down); a trace keeps
    // what every process waited in when it ended.
    let waiting = view
        .ranks
        .values()
        .filter(|r| !explained.contains(&r.rank) && (!view.live || r.ended.is_none()));
    for r in waiting {
        for call in &r.in_flight {
            if call.age_ns < threshold(view, th, call.comm) {
                continue;
            }
            let roots = waits.roots(r.rank, call);
            let v = Victim {
                rank: r.rank,
                call,
                direct: waits.blockers(r.rank, call),
            };
            let plain: BTreeSet<i32> = roots
                .iter()
                .filter_map(|x| match x {
                    Root::Rank(x) if !explained.contains(x) => Some(*x),
                    _ => None,
                })
                .collect();
            if !plain.is_empty() {
                sets.push(plain);
            }
            for root in roots {
                by_root.entry(root).or_default().push(v.clone());
            }
        }
    }

    let mut out = Vec::new();
    // Deaths: one finding for the ranks that ended first, waited for or not. Its victims are
    // every call waiting on it, however young (a launcher may end them within a second).
    if !deaths.roots.is_empty() {
        let dead: BTreeSet<Root> = deaths.roots.iter().map(|r| Root::Rank(*r)).collect();
        let victims: Vec<Victim> = view
            .ranks
            .values()
            .filter(|r| !explained.contains(&r.rank))
            .flat_map(|r| {
                let waits = &waits;
                let dead = &dead;
                r.in_flight.iter().filter_map(move |call| {
                    let roots = waits.roots(r.rank, call);
                    roots.iter().any(|x| dead.contains(x)).then(|| Victim {
                        rank: r.rank,
                        call,
                        direct: waits.blockers(r.rank, call),
                    })
                })
            })
            .collect();
        out.push(dead_finding(view, deaths, &victims));
    }
    for r in &frozen {
        let victims = by_root.get(&Root::Rank(*r)).cloned().unwrap_or_default();
        out.push(frozen_finding(view, &view.ranks[r], &victims));
    }
    // A node not yet back since the collector started is unknown, not lost: nothing is said
    // of it (what waits on it is held with it).
    // (Grouped once: thousands of nodes out of contact, each scanning every rank out of sight,
    // held the job's state for minutes.)
    let mut sight_by_node: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
    for r in &out_of_sight {
        sight_by_node.entry(view.node(*r)).or_default().insert(*r);
    }
    for (node, lost) in view.lost.iter().filter(|(_, l)| !l.awaited) {
        let Some(ranks) = sight_by_node.get(node.as_str()) else {
            continue;
        };
        let victims: Vec<Victim> = ranks
            .iter()
            .flat_map(|r| by_root.get(&Root::Rank(*r)).cloned().unwrap_or_default())
            .collect();
        if !victims.is_empty() {
            out.push(lost_finding(view, node, lost, ranks, &victims));
        }
    }
    for group in stall_groups(view, &by_root) {
        out.push(stall_finding(view, &group, &by_root));
    }
    for (r, i) in &mismatched {
        if let Some(v) = by_root.get(&Root::Rank(*r)) {
            explain(&mut mismatches[*i], v);
        }
    }
    for culprits in merge(sets) {
        let victims: Vec<Victim> = culprits
            .iter()
            .flat_map(|r| by_root.get(&Root::Rank(*r)).cloned().unwrap_or_default())
            .collect();
        out.push(plain_finding(view, &culprits, &victims));
    }
    out
}

/// Stalled instances that share a node are one cause (the transport between those nodes):
/// each group is one finding, however many communicators it stops.
fn stall_groups(view: &JobView, by_root: &BTreeMap<Root, Vec<Victim>>) -> Vec<Vec<(u64, u64)>> {
    let stalls: Vec<(u64, u64)> = by_root
        .keys()
        .filter_map(|r| match r {
            Root::Stall(comm, seq) => Some((*comm, *seq)),
            Root::Rank(_) => None,
        })
        .collect();
    let key = |&(comm, seq): &(u64, u64)| -> BTreeSet<String> {
        let members: BTreeSet<i32> = view.members(comm).into_iter().collect();
        let nodes: BTreeSet<String> = nodes_of(view, &members).into_iter().collect();
        if nodes.is_empty() {
            // Nodes unknown: the instance is a cause of its own.
            BTreeSet::from([format!("{comm:x}#{seq}")])
        } else {
            nodes
        }
    };
    merge(stalls.iter().map(key).collect())
        .into_iter()
        .map(|nodes| {
            stalls
                .iter()
                .copied()
                .filter(|s| !key(s).is_disjoint(&nodes))
                .collect()
        })
        .collect()
}

/// Merges overlapping sets: ranks that block the same calls are one cause, and so are stalls
/// on the same nodes.
fn merge<T: Ord>(mut sets: Vec<BTreeSet<T>>) -> Vec<BTreeSet<T>> {
    let mut out: Vec<BTreeSet<T>> = Vec::new();
    while let Some(mut s) = sets.pop() {
        loop {
            let (joined, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut out)
                .into_iter()
                .partition(|o| !o.is_disjoint(&s));
            out = rest;
            if joined.is_empty() {
                break;
            }
            for j in joined {
                s.extend(j);
            }
        }
        out.push(s);
    }
    out.sort();
    out
}

/// The call a finding names: of those waiting directly on its roots, the one that waits on the
/// most of them, entered first (the same in a live view and a trace); else the one waiting
/// longest.
/// Live, calls entered within this of the first are taken as entered together.
const TOGETHER_NS: u64 = 50_000_000;

fn anchor<'a>(view: &JobView, victims: &[Victim<'a>], roots: &[Root]) -> Option<&'a InFlight> {
    // The call that waits on the most of the roots directly, entered first. Live, calls
    // entered within 50 ms of the first are ordered by communicator and instance instead:
    // there entry times move by microseconds as each rank's clock alignment is refined, and
    // the finding's id (which names the call) must not flip between two calls entered
    // together (a receive cycle holding up two communicators). A trace's times stay put.
    let covered = |v: &Victim| roots.iter().filter(|r| v.direct.contains(r)).count();
    let most = victims.iter().map(covered).max().unwrap_or(0);
    if most == 0 {
        return victims.iter().max_by_key(|v| v.call.age_ns).map(|v| v.call);
    }
    let best = victims.iter().filter(|v| covered(v) == most);
    if !view.live {
        return best
            .min_by_key(|v| (v.call.entered_ns, v.call.comm, v.call.seq, v.rank))
            .map(|v| v.call);
    }
    let first = best.clone().map(|v| v.call.entered_ns).min().unwrap_or(0);
    best.filter(|v| v.call.entered_ns <= first + TOGETHER_NS)
        .min_by_key(|v| (v.call.comm, v.call.seq, v.rank))
        .map(|v| v.call)
}

fn victim_ranks(victims: &[Victim], not: &BTreeSet<i32>) -> Vec<i32> {
    let s: BTreeSet<i32> = victims
        .iter()
        .map(|v| v.rank)
        .filter(|r| !not.contains(r))
        .collect();
    s.into_iter().collect()
}

fn stuck_evidence(victims: &[Victim]) -> Value {
    let mut seen = BTreeSet::new();
    Value::Array(
        victims
            .iter()
            .filter(|v| seen.insert((v.rank, v.call.comm, v.call.seq, v.call.op as u8)))
            .take(64)
            .map(|v| {
                json!({"rank": v.rank, "comm": format_comm_id(v.call.comm), "seq": v.call.seq,
                       "op": v.call.op.name(), "bytes": v.call.bytes,
                       "in_flight_s": v.call.age_ns as f64 / 1e9})
            })
            .collect(),
    )
}

/// "allreduce #12 (1.0 MiB) on communicator 0x…", "recv from rank 1 (tag 8) on communicator
/// 0x…".
fn call_phrase(view: &JobView, c: &InFlight) -> String {
    if let Some(dir) = c.op.peer_word() {
        let peer = c
            .peer
            .map_or_else(|| "any rank".to_owned(), |p| format!("rank {p}"));
        let tag = if c.tag >= 0 {
            format!(" (tag {})", c.tag)
        } else {
            String::new()
        };
        format!(
            "{} {dir} {peer}{tag} on communicator {}",
            c.op.name(),
            view.comm_label(c.comm)
        )
    } else {
        format!(
            "{} #{} ({}) on communicator {}",
            c.op.name(),
            c.seq,
            fmt_bytes(c.bytes),
            view.comm_label(c.comm)
        )
    }
}

fn nodes_of(view: &JobView, ranks: &BTreeSet<i32>) -> Vec<String> {
    let s: BTreeSet<String> = ranks
        .iter()
        .map(|r| view.node(*r).to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    s.into_iter().collect()
}

fn others(n: usize) -> String {
    format!("{n} other {}", if n == 1 { "rank" } else { "ranks" })
}

fn dead_finding(view: &JobView, deaths: &Deaths, victims: &[Victim]) -> Finding {
    let roots = &deaths.roots;
    let ranks: Vec<i32> = roots.iter().copied().collect();
    let nodes = nodes_of(view, roots);
    let first = roots
        .iter()
        .filter_map(|r| deaths.ended.get(r).map(|e| (r, e)))
        .min_by_key(|(_, e)| e.at_ns);
    let several = ranks.len() > 1;
    let how = first.map_or_else(String::new, |(_, e)| ending_phrase(e, several));
    let who = match (ranks.as_slice(), view.ranks.get(&ranks[0])) {
        ([r], Some(p)) if !p.node.is_empty() => format!("rank {r} on {} (pid {})", p.node, p.pid),
        _ if nodes.is_empty() => ranks_phrase(&ranks),
        _ => format!("{} on {}", ranks_phrase(&ranks), nodes.join(", ")),
    };
    let waiting = victim_ranks(victims, roots);
    let after: Vec<i32> = deaths
        .ended
        .keys()
        .copied()
        .filter(|r| !roots.contains(r))
        .collect();
    let call = anchor(
        view,
        victims,
        &roots.iter().map(|r| Root::Rank(*r)).collect::<Vec<_>>(),
    );
    let mut summary = format!("{who} {how}");
    // What the culprit itself was inside when it ended (a crash in the library).
    if let [r] = ranks.as_slice()
        && let Some(c) = view.ranks.get(r).and_then(|p| p.in_flight.first())
    {
        summary += &format!(" inside {}", call_phrase(view, c));
    }
    let they = if waiting.len() == 1 { "it" } else { "they" };
    if let Some(c) = call {
        // The calls they were blocked in: one, or the longest-waited one and how many more.
        let calls: BTreeSet<(u64, u64, bool)> = victims
            .iter()
            .filter(|v| !roots.contains(&v.rank))
            .map(|v| (v.call.comm, v.call.seq, v.call.op.is_p2p()))
            .collect();
        let more = match calls.len() {
            0 | 1 => String::new(),
            2 => " and one other call".into(),
            n => format!(" and {} other calls", n - 1),
        };
        summary += &format!(
            "; {} {} blocked waiting for {} in {}{more}",
            others(waiting.len()),
            match (view.live && after.is_empty(), waiting.len() == 1) {
                (true, true) => "is",
                (true, false) => "are",
                (false, true) => "was",
                (false, false) => "were",
            },
            if several { "them" } else { "it" },
            call_phrase(view, c),
        );
    }
    if !after.is_empty() {
        // How long the teardown took, from the endings whose time is known (a silent rank's
        // records stop before its end, by up to a flush period).
        let last = after
            .iter()
            .filter_map(|r| deaths.ended.get(r))
            .filter(|e| e.observed)
            .map(|e| e.at_ns)
            .max();
        let within =
            last.map(|last| last.saturating_sub(first.map_or(last, |(_, e)| e.at_ns)) as f64 / 1e9);
        let all_waiting = !waiting.is_empty() && after.iter().all(|r| waiting.contains(r));
        let whom = if all_waiting {
            they.to_owned()
        } else if after.len() <= 4 {
            ranks_phrase(&after)
        } else {
            format!("the {} other ranks", after.len())
        };
        let were = if whom == "it" || (after.len() == 1 && !all_waiting) {
            "was"
        } else {
            "were"
        };
        // How the launcher ended them, when it was one signal for all.
        let signals: BTreeSet<Option<i32>> = after
            .iter()
            .filter_map(|r| deaths.ended.get(r))
            .map(|e| e.signal)
            .collect();
        // Sent by their launcher, as far as seen: every one whose sender is known.
        let launcher = after
            .iter()
            .filter_map(|r| deaths.ended.get(r))
            .all(|e| matches!(e.sent_by, Some(Sender::Launcher(_))));
        let by = match signals.iter().next() {
            Some(Some(sig)) if signals.len() == 1 => format!(
                ", by {}signal {sig}{}",
                if launcher { "their launcher's " } else { "" },
                super::dead_rank::signal_label(*sig)
            ),
            _ => String::new(),
        };
        let when = match within {
            Some(w) if w < 1.0 => format!("within {:.0} ms", w * 1e3),
            Some(w) => format!("within {w:.1} s"),
            // Killed without writing a last record (as a launcher's SIGKILL does).
            None => "their records stop there".into(),
        };
        let joiner = if call.is_some() { "; " } else { ", and " };
        let after_whom = if several { "them" } else { "it" };
        summary += &format!("{joiner}{whom} {were} taken down after {after_whom} ({when}{by})");
    }
    let node = view.node(ranks[0]).to_owned();
    let advice = first.map_or_else(String::new, |(r, e)| {
        super::dead_rank::ending_advice(e, *r, &node)
    });
    summary += &format!(
        " — {} the first to stop: {advice}, then restart the job from its last checkpoint",
        if several { "they are" } else { "it is" },
    );
    let in_call = roots
        .iter()
        .any(|r| view.ranks.get(r).is_some_and(|p| !p.in_flight.is_empty()));
    Finding {
        id: finding_id(Kind::DeadRank, &view.job, None, &ranks, None),
        kind: Kind::DeadRank,
        class: if in_call {
            Class::CommunicationHang
        } else {
            Class::NonCommunicationHang
        },
        state: State::Open,
        job: view.job.clone(),
        comm: call.map(|c| format_comm_id(c.comm)),
        seq: call.filter(|c| !c.op.is_p2p()).map(|c| c.seq),
        ranks,
        nodes,
        link: None,
        opened_at: first.map_or(view.now_ns, |(_, e)| e.at_ns),
        resolved_at: None,
        confidence: if deaths.how_found.starts_with("the others") {
            0.95
        } else {
            0.85
        },
        summary,
        evidence: json!({
            "found_by": deaths.how_found,
            "victims": waiting,
            "stuck": stuck_evidence(victims),
            "ended": roots.iter().map(|r| rank_evidence(view, *r, deaths)).collect::<Vec<_>>(),
            "ended_after_it": after,
        }),
    }
}

fn rank_evidence(view: &JobView, r: i32, deaths: &Deaths) -> Value {
    match view.ranks.get(&r) {
        None => json!({"rank": r, "traced": false}),
        Some(p) => with_evidence(
            json!({
                "rank": r, "node": p.node, "pid": p.pid,
                "ended_at_ns": deaths.ended.get(&r).map(|e| e.at_ns),
                "exit": deaths.ended.get(&r).map(|e| json!({"how": ending_phrase(e, false), "status": e.status, "signal": e.signal, "aborted": e.aborted, "recorded_by_the_process": e.recorded, "observed": e.observed, "sent_by": e.sent_by.map(|b| b.evidence())})),
                "last_heard_ns": p.last_heard_ns,
                "in_flight": p.in_flight.iter().map(|c| json!({"comm": format_comm_id(c.comm), "seq": c.seq, "op": c.op.name()})).collect::<Vec<_>>(),
            }),
            &p.evidence,
        ),
    }
}

fn frozen_finding(view: &JobView, p: &RankView, victims: &[Victim]) -> Finding {
    let roots = BTreeSet::from([p.rank]);
    let waiting = victim_ranks(victims, &roots);
    let silent_s = view.now_ns.saturating_sub(p.last_heard_ns) as f64 / 1e9;
    let state = match &p.process {
        Some(s) if s.stopped() => format!("is stopped (process state {})", s.state),
        Some(s) if s.state == "D" => format!(
            "is in uninterruptible wait{} with its CPU time standing still",
            if s.wchan.is_empty() {
                String::new()
            } else {
                format!(" in {}", s.wchan)
            }
        ),
        Some(_) => "is alive but has not run its own code since".into(),
        None => "has gone silent".into(),
    };
    let call = p.in_flight.iter().min_by_key(|c| c.entered_ns);
    let inside = call.map_or(String::new(), |c| {
        format!(" inside {}", call_phrase(view, c))
    });
    let wait = anchor(view, victims, &[Root::Rank(p.rank)]);
    let summary = format!(
        "rank {} on {} (pid {}) {state}{inside}; its heartbeats stopped {silent_s:.1} s ago{} — {}",
        p.rank,
        p.node,
        p.pid,
        if waiting.is_empty() {
            String::new()
        } else {
            format!(" and {} wait for it", others(waiting.len()))
        },
        match &p.process {
            Some(s) if s.stopped() => format!(
                "resume it (kill -CONT {}) or find what stopped it (a debugger, a job-control signal)",
                p.pid
            ),
            Some(s) if s.state == "D" => {
                "a driver or file-system call is not returning: check the node's kernel log (dmesg) and the GPU driver".into()
            }
            _ => "take its stacks (py-spy dump, gdb) to see where it is stuck".into(),
        }
    );
    // What it is stopped inside names the finding (the same live and in a trace, whoever
    // already waits long enough to count); else what waits on it.
    let anchor_call = call.or(wait);
    Finding {
        id: finding_id(Kind::Hang, &view.job, None, &[p.rank], None),
        kind: Kind::Hang,
        class: Class::NonCommunicationHang,
        state: State::Open,
        job: view.job.clone(),
        comm: anchor_call.map(|c| format_comm_id(c.comm)),
        seq: anchor_call.filter(|c| !c.op.is_p2p()).map(|c| c.seq),
        ranks: vec![p.rank],
        nodes: vec![p.node.clone()],
        link: None,
        opened_at: p.last_heard_ns,
        resolved_at: None,
        confidence: if p.process.as_ref().is_some_and(|s| s.stopped()) {
            0.95
        } else {
            0.8
        },
        summary,
        evidence: json!({
            "frozen": with_evidence(json!({"rank": p.rank, "node": p.node, "pid": p.pid,
                       "silent_s": silent_s}), &p.evidence),
            "victims": waiting,
            "stuck": stuck_evidence(victims),
        }),
    }
}

/// One stalled instance: the call that entered it first, its members, and who is still inside.
struct Stalled<'a> {
    comm: u64,
    seq: u64,
    call: Option<&'a InFlight>,
    members: Vec<i32>,
    inside: Vec<i32>,
}

impl Stalled<'_> {
    fn phrase(&self, view: &JobView) -> String {
        let what = self.call.map_or_else(
            || format!("instance #{}", self.seq),
            |c| format!("{} #{} ({})", c.op.name(), self.seq, fmt_bytes(c.bytes)),
        );
        let age = self.call.map_or(0.0, |c| c.age_ns as f64 / 1e9);
        let still = if self.inside.len() == self.members.len() {
            "none has completed it".to_owned()
        } else if self.inside.len() <= 8 {
            format!(
                "{} {} still inside it",
                ranks_phrase(&self.inside),
                if self.inside.len() == 1 { "is" } else { "are" }
            )
        } else {
            format!("{} of them are still inside it", self.inside.len())
        };
        format!(
            "all {} members of communicator {} entered {what} {age:.1} s ago and {still}",
            self.members.len(),
            view.comm_label(self.comm),
        )
    }
}

/// One finding for stalled instances that share nodes, anchored on the lowest (seq, comm).
fn stall_finding(
    view: &JobView,
    group: &[(u64, u64)],
    by_root: &BTreeMap<Root, Vec<Victim>>,
) -> Finding {
    let mut stalled: Vec<Stalled> = group
        .iter()
        .map(|&(comm, seq)| {
            let victims = by_root
                .get(&Root::Stall(comm, seq))
                .map_or(&[][..], Vec::as_slice);
            let members = view.members(comm);
            Stalled {
                comm,
                seq,
                call: victims
                    .iter()
                    .filter(|v| v.call.comm == comm && v.call.seq == seq)
                    .min_by_key(|v| v.call.entered_ns)
                    .or_else(|| victims.first())
                    .map(|v| v.call),
                inside: members
                    .iter()
                    .copied()
                    .filter(|m| view.inside(comm, *m, seq))
                    .collect(),
                members,
            }
        })
        .collect();
    // The anchor (and so the finding's id) must not depend on which member's entry time
    // happens to be known at this tick: instances entered within microseconds of each other
    // swap places from one tick to the next. The lowest sequence number is the one that
    // stalled first in its communicator; ties go to the communicator id.
    stalled.sort_by_key(|s| (s.seq, s.comm));
    let first = &stalled[0];
    let opened_at = stalled
        .iter()
        .filter_map(|s| s.call.map(|c| c.entered_ns))
        .min()
        .unwrap_or(view.now_ns);
    let victims: Vec<Victim> = group
        .iter()
        .flat_map(|&(c, s)| by_root.get(&Root::Stall(c, s)).cloned().unwrap_or_default())
        .collect();
    let members: BTreeSet<i32> = stalled.iter().flat_map(|s| s.members.clone()).collect();
    let nodes = nodes_of(view, &members);
    let inside_any: BTreeSet<i32> = stalled.iter().flat_map(|s| s.inside.clone()).collect();
    let behind = victim_ranks(&victims, &inside_any);
    let what = if stalled.len() == 1 {
        first.phrase(view)
    } else {
        format!(
            "{} collectives make no progress: {}",
            stalled.len(),
            stalled
                .iter()
                .map(|s| s.phrase(view))
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    let behind_phrase = if behind.is_empty() {
        String::new()
    } else {
        format!(
            "; {} wait{} behind it",
            others(behind.len()),
            if behind.len() == 1 { "s" } else { "" }
        )
    };
    // A dead link among the members' nodes is the stall's cause: it names the link.
    let dead = super::dead_link::dead_path(view, &nodes);
    let summary = match &dead {
        Some(d) => format!(
            "{what}, while every process is alive{behind_phrase} — {}: {}",
            d.measured, d.advice
        ),
        None => format!(
            "{what}, while every process is alive{behind_phrase} — the transport or the library is stuck, not a rank: check the network between {} (link errors, NIC counters, NCCL_DEBUG=INFO)",
            match nodes.len() {
                0 => "its members".to_owned(),
                1 => format!("the ranks on {}", nodes[0]),
                _ => format!("nodes {}", nodes.join(", ")),
            }
        ),
    };
    Finding {
        id: finding_id(
            Kind::Hang,
            &view.job,
            Some(first.comm),
            &[],
            Some(first.seq),
        ),
        kind: Kind::Hang,
        class: Class::CommunicationHang,
        state: State::Open,
        job: view.job.clone(),
        comm: Some(format_comm_id(first.comm)),
        seq: Some(first.seq),
        ranks: vec![],
        nodes: dead.as_ref().map_or_else(Vec::new, |d| d.common.clone()),
        link: dead.as_ref().map(|d| d.link.clone()),
        opened_at,
        resolved_at: None,
        confidence: if dead.is_some() { 0.9 } else { 0.8 },
        summary,
        evidence: json!({
            "transport": dead.as_ref().map(|d| d.evidence.clone()),
            "members": members,
            "nodes": nodes,
            "instances": stalled.iter().map(|s| json!({
                "comm": format_comm_id(s.comm),
                "seq": s.seq,
                "op": s.call.map(|c| c.op.name()),
                "members": s.members,
                "inside": s.inside,
            })).collect::<Vec<_>>(),
            "victims": behind,
            "stuck": stuck_evidence(&victims),
        }),
    }
}

/// Ranks wait for ranks on a node whose agent is out of contact: that node's network (or the
/// node) failed. One `communication-hang` with no rank, its link naming the node.
fn lost_finding(
    view: &JobView,
    node: &str,
    lost: &LostContact,
    ranks: &BTreeSet<i32>,
    victims: &[Victim],
) -> Finding {
    let anchor = victims
        .iter()
        .min_by_key(|v| (v.call.entered_ns, v.rank))
        .map(|v| v.call);
    let waiting: BTreeSet<i32> = victims.iter().map(|v| v.rank).collect();
    let waiting_nodes = nodes_of(view, &waiting);
    let out: Vec<i32> = ranks.iter().copied().collect();
    let ago = match view.now_ns.saturating_sub(lost.since_ns) as f64 / 1e9 {
        a if a < 1.0 => "just now".to_owned(),
        a => format!("{a:.0} s ago"),
    };
    let what = anchor.map_or_else(|| "their calls".to_owned(), |c| call_phrase(view, c));
    Finding {
        id: finding_id(
            Kind::Hang,
            &view.job,
            anchor.map(|c| c.comm),
            &[],
            anchor.map(|c| c.seq),
        ),
        kind: Kind::Hang,
        class: Class::CommunicationHang,
        state: State::Open,
        job: view.job.clone(),
        comm: anchor.map(|c| format_comm_id(c.comm)),
        seq: anchor.and_then(|c| (!c.op.is_p2p()).then_some(c.seq)),
        ranks: vec![],
        nodes: vec![node.to_owned()],
        link: Some(Link {
            src: node.to_owned(),
            dst: waiting_nodes.first().cloned().unwrap_or_default(),
            ..Default::default()
        }),
        opened_at: anchor.map_or(view.now_ns, |c| c.entered_ns.max(lost.since_ns)),
        resolved_at: None,
        confidence: 0.7,
        summary: format!(
            "Contact with node {node} was lost {ago} ({}) while {} on {} wait{} in {what} for {} on it: node {node}'s network (or the node itself) failed, and its ranks are out of sight, not to blame — check node {node}'s link (ip link, NIC counters, its switch port) and whether the node is up",
            lost.why,
            ranks_phrase(&waiting.iter().copied().collect::<Vec<_>>()),
            match waiting_nodes.len() {
                1 => format!("node {}", waiting_nodes[0]),
                _ => format!("nodes {}", waiting_nodes.join(", ")),
            },
            if waiting.len() == 1 { "s" } else { "" },
            ranks_phrase(&out),
        ),
        evidence: json!({
            "lost_contact": {"node": node, "since": lost.since_ns, "why": lost.why},
            "out_of_sight": out,
            "waiting": waiting,
            "waiting_nodes": waiting_nodes,
            "stuck": stuck_evidence(victims),
        }),
    }
}

/// Adds the hangs a mismatch causes to its evidence.
fn explain(m: &mut Finding, victims: &[Victim]) {
    let not: BTreeSet<i32> = m.ranks.iter().copied().collect();
    if let Value::Object(o) = &mut m.evidence {
        o.insert("victims".into(), json!(victim_ranks(victims, &not)));
        o.insert("stuck".into(), stuck_evidence(victims));
    }
}

fn plain_finding(view: &JobView, culprits: &BTreeSet<i32>, victims: &[Victim]) -> Finding {
    let roots: Vec<Root> = culprits.iter().map(|r| Root::Rank(*r)).collect();
    let call = anchor(view, victims, &roots).expect("a stuck call leads to every culprit");
    // What a rank only issued (seen from the host) does not put it inside the library.
    let in_library = culprits
        .iter()
        .any(|r| view.ranks.get(r).is_some_and(|p| !inside_of(p).is_empty()));
    let state_note = culprits
        .iter()
        .filter_map(|r| view.ranks.get(r))
        .filter_map(|p| {
            let s = p.process.as_ref()?;
            Some(format!(
                "{} process is {}{}, its CPU time {}",
                if culprits.len() == 1 {
                    "its".to_owned()
                } else {
                    format!("rank {}'s", p.rank)
                },
                state_name(&s.state),
                if s.wchan.is_empty() {
                    String::new()
                } else {
                    format!(" in {}", s.wchan)
                },
                if s.cpu_advancing {
                    "advancing"
                } else {
                    "not advancing"
                }
            ))
        })
        .collect::<Vec<_>>()
        .join("; ");
    let waiting = victim_ranks(victims, culprits);
    let gpu_note = gpu_note(view, culprits);
    let inside_note = inside_note(view, culprits, &waiting);
    // Shut down while the others wait: its program left the loop they are still in.
    let finalize_note = if culprits.iter().all(|r| {
        view.ranks
            .get(r)
            .is_some_and(|p| p.finalized && p.ended.is_none())
    }) {
        format!(
            "{} called MPI_Finalize instead: the program ended early there (an uncaught exception, an early return); look at {} output for why",
            if culprits.len() == 1 { "it" } else { "they" },
            if culprits.len() == 1 {
                format!("rank {}'s", culprits.iter().next().copied().unwrap_or(-1))
            } else {
                "their".to_owned()
            }
        )
    } else {
        String::new()
    };
    let (cut_note, unknown_note) = cut_short_notes(view, culprits, victims);
    let cut = !cut_note.is_empty();
    hang_finding(HangCause {
        job: &view.job,
        culprits: culprits.iter().copied().collect(),
        nodes: nodes_of(view, culprits),
        victims: waiting.clone(),
        waited: Waited {
            comm: call.comm,
            comm_name: view
                .comms
                .get(&call.comm)
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            seq: (!call.op.is_p2p()).then_some(call.seq),
            op: call.op.name(),
            bytes: call.bytes,
            tag: call.tag,
            age_s: victims.iter().map(|v| v.call.age_ns).max().unwrap_or(0) as f64 / 1e9,
        },
        in_library,
        live: view.live,
        state_note,
        gpu_note,
        inside_note,
        finalize_note,
        cut_note,
        unknown_note,
        host_view: !victims.is_empty() && victims.iter().all(|v| v.call.issued_only),
        opened_at: call.entered_ns.max(1),
        confidence: if cut {
            0.5
        } else if culprits.iter().all(|r| view.ranks.contains_key(r)) {
            0.95
        } else {
            0.7
        },
        evidence: json!({
            "victims": waiting,
            "front": front(view, culprits, victims),
            "stuck": stuck_evidence(victims),
            "culprits": culprits.iter().map(|r| match view.ranks.get(r) {
                Some(p) => with_evidence(json!({"rank": r, "node": p.node, "pid": p.pid,
                                  "in_library": !p.in_flight.is_empty(),
                                  "records_cut_short": p.data_lost,
                                  "inside": inside_calls(p),
                                  "progress_on_comm": view.comms.get(&call.comm).and_then(|c| c.progress.get(r))}), &p.evidence),
                None => json!({"rank": r, "traced": false}),
            }).collect::<Vec<_>>(),
        }),
    })
}

/// What a damaged trace leaves unknown: where the culprits' records end, when a damaged trace
/// cut them short (whether they entered is then unknown), and the other ranks the stuck calls
/// wait on whose records end alike. Both empty when every record is whole.
fn cut_short_notes(
    view: &JobView,
    culprits: &BTreeSet<i32>,
    victims: &[Victim],
) -> (String, String) {
    let last = view
        .ranks
        .values()
        .filter(|r| !r.data_lost)
        .map(|r| r.last_heard_ns)
        .max()
        .unwrap_or(0);
    let earlier = |r: &RankView| last.saturating_sub(r.last_heard_ns) as f64 / 1e9;
    let cut: Vec<&RankView> = culprits
        .iter()
        .filter_map(|r| view.ranks.get(r))
        .filter(|p| p.data_lost)
        .collect();
    let cut_note = match cut.as_slice() {
        [] => String::new(),
        [p] => format!(
            "{} records end {:.1} s before the others', where its trace is damaged, so what it did from there on is unknown: look at its logs and at what is left of its trace",
            if culprits.len() == 1 {
                "its".to_owned()
            } else {
                format!("rank {}'s", p.rank)
            },
            earlier(p)
        ),
        _ => format!(
            "the records of {} end early, where their traces are damaged, so what they did from there on is unknown: look at their logs and at what is left of their traces",
            ranks_phrase(&cut.iter().map(|p| p.rank).collect::<Vec<_>>())
        ),
    };
    let unknown: BTreeSet<i32> = victims
        .iter()
        .flat_map(|v| &v.direct)
        .filter_map(|b| match b {
            Root::Rank(r) if !culprits.contains(r) => view.ranks.get(r),
            _ => None,
        })
        .filter(|p| p.data_lost)
        .map(|p| p.rank)
        .collect();
    let unknown_note = match unknown.iter().collect::<Vec<_>>().as_slice() {
        [] => String::new(),
        [r] => format!(
            "rank {r}'s records end {:.1} s earlier, where its trace is damaged, so whether it took part is unknown",
            earlier(&view.ranks[*r])
        ),
        _ => format!(
            "the records of {} end early, where their traces are damaged, so whether they took part is unknown",
            ranks_phrase(&unknown.iter().copied().collect::<Vec<_>>())
        ),
    };
    (cut_note, unknown_note)
}

/// A culprit's own calls in flight, oldest first (what it is blocked inside): the calls it
/// only issued (seen from the host) are not.
fn inside_of(p: &RankView) -> Vec<&InFlight> {
    let mut calls: Vec<&InFlight> = p.in_flight.iter().filter(|c| !c.issued_only).collect();
    calls.sort_by_key(|c| (c.entered_ns, c.comm, c.seq));
    calls
}

fn inside_calls(p: &RankView) -> Value {
    Value::Array(
        inside_of(p)
            .iter()
            .map(|c| {
                json!({"op": c.op.name(), "comm": format_comm_id(c.comm), "seq": c.seq,
                       "peer": c.peer, "tag": c.tag, "bytes": c.bytes, "posted": c.posted,
                       "in_flight_s": c.age_ns as f64 / 1e9})
            })
            .collect(),
    )
}

/// Where a culprit inside the library is blocked, and whether a peer of its point-to-point
/// calls waits for it in turn (the two wait on each other): "" when no culprit is inside.
fn inside_note(view: &JobView, culprits: &BTreeSet<i32>, waiting: &[i32]) -> String {
    let Some((rank, calls)) = culprits
        .iter()
        .filter_map(|r| view.ranks.get(r))
        .map(|p| (p.rank, inside_of(p)))
        .find(|(_, calls)| !calls.is_empty())
    else {
        return String::new();
    };
    let listed = |calls: &[&InFlight]| {
        let shown: Vec<String> = calls.iter().take(3).map(|c| call_phrase(view, c)).collect();
        format!(
            "{}{}",
            shown.join(" and "),
            if calls.len() > 3 {
                format!(" and {} more calls", calls.len() - 3)
            } else {
                String::new()
            }
        )
    };
    let (posted, blocking): (Vec<&InFlight>, Vec<&InFlight>) =
        calls.iter().copied().partition(|c| c.posted);
    let age = |calls: &[&InFlight]| calls.iter().map(|c| c.age_ns).max().unwrap_or(0) as f64 / 1e9;
    let who = if culprits.len() == 1 {
        "it".to_owned()
    } else {
        format!("rank {rank}")
    };
    let mut note = if blocking.is_empty() {
        format!(
            "{who} posted {} and has not seen {} complete for up to {:.1} s",
            listed(&posted),
            if posted.len() == 1 { "it" } else { "them" },
            age(&posted)
        )
    } else {
        format!(
            "{who} is blocked inside {} for up to {:.1} s{}",
            listed(&blocking),
            age(&blocking),
            if posted.is_empty() {
                String::new()
            } else {
                format!(", with {} posted and not complete", listed(&posted))
            }
        )
    };
    // A peer it waits on that waits for it: a cycle, usually a source or tag that does not
    // match what the peer sends (or an order of sends and receives that cannot complete). The
    // call it blocks in comes first, then what it posted, receives before sends (a send
    // completes once the library has taken the data, often unseen while the rank waits for
    // its receive in `MPI_Waitall`; a receive needs the peer's message), the latest first.
    let posted_order = posted
        .iter()
        .rev()
        .filter(|c| c.op != Op::Send)
        .chain(posted.iter().rev().filter(|c| c.op == Op::Send));
    if let Some(c) = blocking
        .iter()
        .rev()
        .chain(posted_order)
        .find(|c| c.op.is_p2p() && c.peer.is_some_and(|p| waiting.contains(&p)))
    {
        let peer = c.peer.unwrap_or(-1);
        let (ends, does) = if c.op == Op::Send {
            ("destination", "receives")
        } else {
            ("source", "sends")
        };
        note.push_str(&format!(
            "; rank {peer} waits for it in turn, so the two wait on each other: check that {}'s {ends} and tag against what rank {peer} {does}",
            c.op.name(),
        ));
    } else {
        note.push_str(": look at those calls' peers");
    }
    note
}

/// The hang front: per communicator, the first instance its members wait in for the culprits,
/// and which culprits never entered it.
fn front(view: &JobView, culprits: &BTreeSet<i32>, victims: &[Victim]) -> Value {
    let blocks = |v: &Victim| -> Vec<i32> {
        v.direct
            .iter()
            .filter_map(|d| match d {
                Root::Rank(r) if culprits.contains(r) => Some(*r),
                _ => None,
            })
            .collect()
    };
    let mut first: BTreeMap<u64, &Victim> = BTreeMap::new();
    for v in victims.iter().filter(|v| !blocks(v).is_empty()) {
        let e = first.entry(v.call.comm).or_insert(v);
        if (v.call.seq, v.call.entered_ns) < (e.call.seq, e.call.entered_ns) {
            *e = v;
        }
    }
    Value::Array(
        first
            .values()
            .map(|v| {
                let c = v.call;
                let waiting: BTreeSet<i32> = victims
                    .iter()
                    .filter(|w| w.call.comm == c.comm && w.call.seq == c.seq)
                    .map(|w| w.rank)
                    .collect();
                json!({
                    "comm": format_comm_id(c.comm),
                    "name": view.comms.get(&c.comm).map_or("", |x| x.name.as_str()),
                    "seq": c.seq,
                    "op": c.op.name(),
                    "bytes": c.bytes,
                    "missing": blocks(v),
                    "waiting": waiting,
                })
            })
            .collect(),
    )
}

/// The oldest GPU-stream call of `rank` still in flight that another member of its
/// communicator completed: that rank's GPU stopped finishing its work.
fn unfinished_on_gpu(view: &JobView, rank: i32) -> Option<&InFlight> {
    view.ranks
        .get(&rank)?
        .in_flight
        .iter()
        .filter(|c| c.stream && !c.op.is_p2p() && !c.issued_only)
        .filter(|c| {
            view.members(c.comm)
                .iter()
                .any(|m| *m != rank && view.done(c.comm, *m, c.seq))
        })
        .min_by_key(|c| (c.entered_ns, c.comm, c.seq))
}

/// What to say when culprits hold GPU work their peers completed, naming the other ranks in
/// that state too (they are evidence, not culprits: their peers did not wait on them).
fn gpu_note(view: &JobView, culprits: &BTreeSet<i32>) -> String {
    let stuck: Vec<(i32, &InFlight)> = culprits
        .iter()
        .filter_map(|r| unfinished_on_gpu(view, *r).map(|c| (*r, c)))
        .collect();
    let Some((_, c)) = stuck.first() else {
        return String::new();
    };
    let done: Vec<i32> = view
        .members(c.comm)
        .into_iter()
        .filter(|m| view.done(c.comm, *m, c.seq))
        .collect();
    let also: Vec<i32> = view
        .ranks
        .keys()
        .copied()
        .filter(|r| !culprits.contains(r) && unfinished_on_gpu(view, *r).is_some())
        .collect();
    format!(
        "{} GPU had not finished {}, which {} completed{}: check {} (Xid errors in the kernel log, nvidia-smi) and what its host thread was doing",
        if stuck.len() == 1 && culprits.len() == 1 {
            "its".to_owned()
        } else {
            format!(
                "{}'s",
                ranks_phrase(&stuck.iter().map(|s| s.0).collect::<Vec<_>>())
            )
        },
        call_phrase(view, c),
        ranks_phrase(&done),
        if also.is_empty() {
            String::new()
        } else {
            format!(
                "; {} {} GPU work {} peers completed too",
                ranks_phrase(&also),
                if also.len() == 1 { "holds" } else { "hold" },
                if also.len() == 1 { "its" } else { "their" }
            )
        },
        if stuck.len() == 1 {
            "that GPU"
        } else {
            "those GPUs"
        }
    )
}

/// `base` with a rank's own evidence (process state, stacks) merged in.
fn with_evidence(mut base: Value, extra: &Value) -> Value {
    if let (Value::Object(b), Value::Object(e)) = (&mut base, extra) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

/// "S" → "sleeping".
pub fn state_name(s: &str) -> &'static str {
    match s {
        "R" => "running",
        "S" => "sleeping",
        "D" => "in uninterruptible wait",
        "T" | "t" => "stopped",
        "Z" => "a zombie",
        "X" => "dead",
        "I" => "idle",
        _ => "in an unknown state",
    }
}
