//! Detectors over a finished (or killed) job's trace: `hang` (with the wait chain followed across
//! communicators and point-to-point), `dead-rank` and `mismatch`. "Now" is each process's last
//! heartbeat; a process whose heartbeats stop while its peers' go on is dead.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::{Clock, Op, flags};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::{CommEvent, ProcessEvent, Record};
use serde_json::json;

use crate::finding::{Finding, HangCause, Kind, Tracker, Waited, dead_rank_finding, hang_finding};
use crate::stream::{Detectors, Shape, Tuning};

/// Thresholds (documented in docs/diagnosis.md).
#[derive(Clone, Debug)]
pub struct Thresholds {
    /// A call in flight at least this long (at its process's last heartbeat) is stuck.
    pub hang_floor_ns: u64,
    /// A process whose last heartbeat is this much older than its peers' latest is dead.
    pub dead_after_ns: u64,
    /// The instance detectors' thresholds.
    pub tuning: Tuning,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            hang_floor_ns: 5_000_000_000,
            dead_after_ns: 3_000_000_000,
            tuning: Tuning::default(),
        }
    }
}

/// How often the instance detectors are evaluated over a trace (data time).
const EVAL_EVERY_NS: u64 = 1_000_000_000;

/// A record's host time on the common (real-time) base.
fn real_time(p: &ProcessTrace, t: u64, clock: Clock) -> u64 {
    let h = &p.header;
    let t = match clock {
        Clock::HostReal => t,
        _ if h.real_anchor == 0 => t,
        _ => (t as i128 - h.mono_anchor as i128 + h.real_anchor as i128).max(0) as u64,
    };
    match p.clock {
        Some(c) => (t as i128 + c.offset_ns as i128).max(0) as u64,
        None => t,
    }
}

/// The slow-rank detector's view of each rank at the end of the trace, highest share first:
/// (rank, share of time others waited for it, decayed late instances, highest per-communicator
/// late ratio, blame in seconds).
pub fn slow_rank_view(
    processes: &[ProcessTrace],
    tuning: &Tuning,
) -> Vec<(i32, f64, f64, f64, f64)> {
    let mut det = Detectors::new("", tuning.clone());
    feed_in_time_order(processes, &mut det, |_, _| {});
    if std::env::var_os("COMMSCOPE_EXPLAIN_CADENCE").is_some() {
        for (c, o, n, a, b) in det.debug_cadence() {
            eprintln!(
                "cadence: comm {c:#x} op {o}: {n} instances from {a:.3} to {b:.3} s (period {:.3} s)",
                (b - a) / (n.max(2) - 1) as f64
            );
        }
    }
    det.debug_ranks()
}

/// Feeds a job's completed calls and step markers to `det` in time order (records of one
/// process keep their order); `tick(det, t)` runs before each record, with its time.
fn feed_in_time_order(
    processes: &[ProcessTrace],
    det: &mut Detectors,
    mut tick: impl FnMut(&mut Detectors, u64),
) {
    let mut order: Vec<(u64, u32, u32)> = Vec::new();
    for (pi, p) in processes.iter().enumerate() {
        det.rank_node(p.header.rank, &p.header.node);
        for (ri, r) in p.records.iter().enumerate() {
            let t = match r {
                Record::Call(c) => real_time(p, c.span().1, c.clock()),
                Record::Skip(k) => real_time(p, k.t_last, Clock::HostMono),
                Record::Process(x) if x.event == ProcessEvent::Step => {
                    real_time(p, x.t_mono, Clock::HostMono)
                }
                Record::Comm(c) if c.event == CommEvent::Failed => {
                    real_time(p, c.t, Clock::HostMono)
                }
                Record::Link(l) => real_time(p, l.t_end, Clock::HostMono),
                _ => continue,
            };
            order.push((t, pi as u32, ri as u32));
        }
    }
    order.sort_unstable();
    for (t, pi, ri) in order {
        tick(det, t);
        match &processes[pi as usize].records[ri as usize] {
            Record::Call(c) => det.call(c, t),
            Record::Skip(k) => det.skip(k, t),
            Record::Process(x) => det.step_marker(x.rank, x.step, t),
            Record::Comm(c) => det.comm_failed(c, t),
            Record::Link(l) => det.link(l, t),
            _ => {}
        }
    }
}

/// Feeds every completed call of the job to the instance detectors in time order, evaluating
/// them every second of trace time; calls never completed join the mismatch check at the end.
fn instance_findings(
    job: &str,
    processes: &[ProcessTrace],
    unfinished: Vec<(i32, u64, u64, Shape)>,
    end_ns: u64,
    tuning: &Tuning,
) -> Vec<Finding> {
    let mut det = Detectors::new(job, tuning.clone());
    let mut tracker = Tracker::default();
    let mut next: Option<u64> = None;
    feed_in_time_order(processes, &mut det, |det, t| {
        let n = next.get_or_insert(t + EVAL_EVERY_NS);
        while t >= *n {
            det.advance(*n);
            tracker.update(det.findings(), *n);
            *n += EVAL_EVERY_NS;
        }
    });
    det.advance(end_ns.max(next.map_or(0, |n| n.saturating_sub(EVAL_EVERY_NS))));
    det.in_flight_shapes(unfinished);
    tracker.update(det.findings(), end_ns);
    tracker.all()
}

/// A call entered and never completed.
#[derive(Clone, Debug)]
struct Stuck {
    comm: u64,
    seq: u64,
    op: Op,
    bytes: u64,
    /// Peer's rank in the communicator (p2p), or -1.
    peer: i32,
    tag: i32,
    age_ns: u64,
    /// When it entered, realtime ns (0: not known).
    enter_real: u64,
}

#[derive(Debug, Default)]
struct Proc {
    rank: i32,
    node: String,
    pid: u32,
    last_beat_real: u64,
    finalized: bool,
    /// Exit seen by the agent: (status, signal), and when (realtime ns).
    exit: Option<(i32, i32)>,
    exit_at: Option<u64>,
    /// comm → collectives completed (highest completed seq + 1).
    progress: HashMap<u64, u64>,
    stuck: Vec<Stuck>,
}

/// Follows a wait chain: from the ranks `origin` waits for, through every rank that itself waits
/// for others (`waits_for`), to the ranks that wait for nobody — the root culprits. When the chain
/// closes into a cycle (a rank blocked in a receive from a peer that waits in a collective for
/// it), nobody waits for nobody: the roots are then the ranks of the chain that `deviant` picks
/// (blocked in point-to-point while the others are in collectives), or the whole chain.
pub fn root_culprits(
    origin: i32,
    first: Vec<i32>,
    waits_for: impl Fn(i32) -> Vec<i32>,
    deviant: impl Fn(i32) -> bool,
) -> BTreeSet<i32> {
    let mut seen = BTreeSet::from([origin]);
    let mut frontier = first;
    let mut root = BTreeSet::new();
    while let Some(r) = frontier.pop() {
        if !seen.insert(r) {
            continue;
        }
        let next = waits_for(r);
        if next.is_empty() {
            root.insert(r);
        } else {
            frontier.extend(next);
        }
    }
    if root.is_empty() {
        let picked: BTreeSet<i32> = seen.iter().copied().filter(|r| deviant(*r)).collect();
        if picked.is_empty() {
            seen.remove(&origin);
            return seen;
        }
        return picked;
    }
    root
}

/// Runs every batch detector over one job.
pub fn analyze(job: &str, processes: &[ProcessTrace], th: &Thresholds) -> Vec<Finding> {
    // Per process, and communicator membership (comm → comm rank → global rank).
    let mut procs: Vec<Proc> = Vec::new();
    let mut members: HashMap<u64, BTreeMap<i32, i32>> = HashMap::new();
    // comm → longest completed blocking call: the hang threshold adapts to it.
    let mut longest: HashMap<u64, u64> = HashMap::new();
    for p in processes {
        let mut pr = Proc {
            rank: p.header.rank,
            node: p.header.node.clone(),
            pid: p.header.pid,
            ..Default::default()
        };
        let mut last_mono = 0u64;
        // realtime − monotonic of the process's latest own heartbeat.
        let mut real_minus_mono: Option<i128> = None;
        let mut enters: BTreeMap<(u64, u64, bool), (commscope_wire::record::Call, bool)> =
            BTreeMap::new();
        for r in &p.records {
            match r {
                Record::Comm(c) if c.event == CommEvent::Created => {
                    members
                        .entry(c.comm_id)
                        .or_default()
                        .insert(c.comm_rank, c.rank);
                }
                Record::Heartbeat(h) => {
                    last_mono = last_mono.max(h.t_mono);
                    if h.flags & flags::AGENT_BEAT == 0 {
                        pr.last_beat_real = pr.last_beat_real.max(h.t_real);
                        if h.t_real > 0 && h.t_mono > 0 {
                            real_minus_mono = Some(i128::from(h.t_real) - i128::from(h.t_mono));
                        }
                    }
                    if h.flags & flags::FINAL != 0 {
                        pr.finalized = true;
                    }
                }
                Record::Process(x) if x.event == ProcessEvent::Exit => {
                    if x.flags & flags::OBSERVED != 0 {
                        pr.exit = Some((x.exit_status, x.signal));
                        pr.exit_at = Some(x.t_real);
                    } else {
                        pr.finalized = true;
                    }
                }
                Record::Enter(c) => {
                    let p2p = c.op().is_p2p();
                    let key = (c.comm_id, if p2p { c.op_seq } else { c.seq }, p2p);
                    enters.insert(key, (*c, false));
                }
                Record::Call(c) => {
                    if c.flags & (flags::NONBLOCKING | flags::PERSISTENT) == 0 {
                        let l = longest.entry(c.comm_id).or_insert(0);
                        *l = (*l).max(c.duration_ns());
                    }
                    let p2p = c.op().is_p2p();
                    let key = (c.comm_id, if p2p { c.op_seq } else { c.seq }, p2p);
                    if let Some(e) = enters.get_mut(&key) {
                        e.1 = true;
                    }
                    if !p2p {
                        let e = pr.progress.entry(c.comm_id).or_insert(0);
                        *e = (*e).max(c.seq + 1);
                    }
                }
                // Calls left out by sampling completed too.
                Record::Skip(k) if !k.op().is_p2p() => {
                    let e = pr.progress.entry(k.comm_id).or_insert(0);
                    *e = (*e).max(k.last_seq + 1);
                }
                _ => {}
            }
        }
        for ((comm, seq, _), (c, done)) in enters {
            if done {
                continue;
            }
            pr.stuck.push(Stuck {
                comm,
                seq,
                op: c.op(),
                bytes: c.bytes,
                peer: c.peer,
                tag: c.tag,
                age_ns: last_mono.saturating_sub(c.t_enter),
                enter_real: real_minus_mono
                    .map_or(0, |d| (i128::from(c.t_enter) + d).max(0) as u64),
            });
        }
        procs.push(pr);
    }
    procs.sort_by_key(|p| p.rank);
    let by_rank: HashMap<i32, usize> = procs.iter().enumerate().map(|(i, p)| (p.rank, i)).collect();
    let latest_beat = procs.iter().map(|p| p.last_beat_real).max().unwrap_or(0);

    // Dead: killed by a signal or exited with an error before finalizing, or silent while peers
    // went on.
    let dead: BTreeSet<i32> = procs
        .iter()
        .filter(|p| !p.finalized)
        .filter(|p| {
            matches!(p.exit, Some((st, sig)) if sig != 0 || (st != 0 && st != commscope_wire::record::EXIT_STATUS_UNKNOWN))
                || (p.last_beat_real > 0
                    && latest_beat.saturating_sub(p.last_beat_real) >= th.dead_after_ns)
        })
        .map(|p| p.rank)
        .collect();

    // Among ranks that ended without finalizing, the first to end (within 50 ms) is the root when
    // the others went on after it; a launcher tearing down the rest is not a death each, and a
    // job taken down as a whole singles nobody out. Ranks whose heartbeats stopped (no exit
    // seen) are each their own root.
    const WINDOW: u64 = 50_000_000;
    let first = dead.iter().filter_map(|r| procs[by_rank[r]].exit_at).min();
    // A job that was already hung (ranks waiting in a call for the hang floor) when its first
    // process was killed was taken down because it hung: the hang is the finding, not the kills.
    let hung_before = first.is_some_and(|f| {
        procs.iter().any(|p| {
            p.stuck
                .iter()
                .any(|s| s.enter_real > 0 && s.enter_real + th.hang_floor_ns <= f)
        })
    });
    let dead: BTreeSet<i32> = dead
        .iter()
        .copied()
        .filter(|r| {
            let q = &procs[by_rank[r]];
            match (q.exit_at, first) {
                (Some(t), Some(f)) => {
                    !hung_before
                        && t <= f + WINDOW
                        && procs.iter().any(|o| {
                            o.rank != *r
                                && (o.finalized || o.exit_at.is_none_or(|x| x > f + WINDOW))
                        })
                }
                _ => true,
            }
        })
        .collect();
    let mut findings = Vec::new();

    // Stuck instances and who each waits for.
    let waits_for = |p: &Proc, s: &Stuck| -> Vec<i32> {
        if s.op.is_p2p() {
            // The peer that never posted the match.
            return members
                .get(&s.comm)
                .and_then(|m| m.get(&s.peer))
                .copied()
                .into_iter()
                .collect();
        }
        let Some(m) = members.get(&s.comm) else {
            return vec![];
        };
        m.values()
            .copied()
            .filter(|r| *r != p.rank)
            .filter(|r| {
                by_rank.get(r).is_some_and(|&i| {
                    let q = &procs[i];
                    let entered = q
                        .stuck
                        .iter()
                        .any(|x| x.comm == s.comm && x.seq == s.seq && !x.op.is_p2p());
                    let done = q.progress.get(&s.comm).copied().unwrap_or(0) > s.seq;
                    !entered && !done
                })
            })
            .collect()
    };
    // Root culprits of a rank: follow the chain through ranks that are themselves stuck.
    let mut roots: BTreeMap<Vec<i32>, Vec<(i32, Stuck)>> = BTreeMap::new();
    for p in &procs {
        let threshold = |comm: u64| {
            th.hang_floor_ns
                .max(2 * longest.get(&comm).copied().unwrap_or(0))
        };
        for s in p.stuck.iter().filter(|s| s.age_ns >= threshold(s.comm)) {
            let root = root_culprits(
                p.rank,
                waits_for(p, s),
                |r| match by_rank.get(&r) {
                    // A dead rank waits for nobody: it is a root.
                    Some(&i) if !dead.contains(&r) => {
                        let q = &procs[i];
                        q.stuck.iter().flat_map(|x| waits_for(q, x)).collect()
                    }
                    _ => vec![],
                },
                |r| {
                    by_rank
                        .get(&r)
                        .is_some_and(|&i| procs[i].stuck.iter().any(|x| x.op.is_p2p()))
                },
            );
            if !root.is_empty() {
                roots
                    .entry(root.into_iter().collect())
                    .or_default()
                    .push((p.rank, s.clone()));
            }
        }
    }
    for (culprits, victims) in roots {
        let oldest = victims
            .iter()
            .max_by_key(|(_, s)| s.age_ns)
            .map(|(_, s)| s.clone())
            .expect("at least one victim");
        let victim_ranks: BTreeSet<i32> = victims
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| !culprits.contains(r))
            .collect();
        let nodes: BTreeSet<String> = culprits
            .iter()
            .filter_map(|r| by_rank.get(r).map(|&i| procs[i].node.clone()))
            .collect();
        let states: Vec<serde_json::Value> = culprits
            .iter()
            .map(|r| match by_rank.get(r) {
                Some(&i) => {
                    let q = &procs[i];
                    json!({
                        "rank": r, "node": q.node, "pid": q.pid,
                        "in_library": !q.stuck.is_empty(),
                        "finalized": q.finalized,
                        "exit": q.exit.map(|(st, sig)| json!({"status": st, "signal": sig})),
                        "progress_on_comm": q.progress.get(&oldest.comm).copied().unwrap_or(0),
                    })
                }
                None => json!({"rank": r, "traced": false}),
            })
            .collect();
        let stuck_list: Vec<serde_json::Value> = victims
            .iter()
            .map(|(r, s)| {
                json!({"rank": r, "comm": format_comm_id(s.comm), "seq": s.seq, "op": s.op.name(),
                       "bytes": s.bytes, "in_flight_s": s.age_ns as f64 / 1e9})
            })
            .collect();
        let endings = culprits
            .iter()
            .filter_map(|r| by_rank.get(r))
            .map(|&i| match procs[i].exit {
                Some((_, sig)) if sig != 0 => format!("signal {sig}"),
                Some((st, _)) if st != commscope_wire::record::EXIT_STATUS_UNKNOWN => {
                    format!("exit status {st}")
                }
                _ => "its heartbeats stopped".into(),
            })
            .collect();
        findings.push(hang_finding(HangCause {
            job,
            all_dead: culprits.iter().all(|r| dead.contains(r)),
            in_library: culprits
                .iter()
                .any(|r| by_rank.get(r).is_some_and(|&i| !procs[i].stuck.is_empty())),
            confidence: if culprits.iter().all(|r| by_rank.contains_key(r)) {
                0.95
            } else {
                0.7
            },
            culprits,
            nodes: nodes.into_iter().collect(),
            victims: victim_ranks.iter().copied().collect(),
            waited: Waited {
                comm: oldest.comm,
                seq: (!oldest.op.is_p2p()).then_some(oldest.seq),
                op: oldest.op.name(),
                bytes: oldest.bytes,
                tag: oldest.tag,
                age_s: oldest.age_ns as f64 / 1e9,
            },
            endings,
            live: false,
            state_note: String::new(),
            opened_at: latest_beat,
            evidence: json!({
                "victims": victim_ranks.into_iter().collect::<Vec<_>>(),
                "stuck": stuck_list,
                "culprits": states,
            }),
        }));
    }

    // Dead ranks nobody waits for (yet) still are findings.
    let reported: BTreeSet<i32> = findings
        .iter()
        .filter(|f| f.kind == Kind::DeadRank)
        .flat_map(|f| f.ranks.clone())
        .collect();
    for r in dead.iter().filter(|r| !reported.contains(r)) {
        let q = &procs[by_rank[r]];
        let how = match q.exit {
            Some((_, sig)) if sig != 0 => format!("was killed by signal {sig}"),
            Some((st, _)) if st != commscope_wire::record::EXIT_STATUS_UNKNOWN => {
                format!("exited with status {st} without finalizing")
            }
            _ => format!(
                "stopped sending heartbeats {:.1} s before its peers",
                latest_beat.saturating_sub(q.last_beat_real) as f64 / 1e9
            ),
        };
        findings.push(dead_rank_finding(
            job,
            *r,
            &q.node,
            q.pid,
            &how,
            q.last_beat_real,
            !q.stuck.is_empty(),
            json!({"pid": q.pid, "last_heartbeat_ns": q.last_beat_real, "ended_at_ns": q.exit_at}),
        ));
    }

    // Instance detectors: slow-rank, degraded-collective, mismatch, comm-error.
    let unfinished: Vec<(i32, u64, u64, Shape)> = procs
        .iter()
        .flat_map(|p| {
            p.stuck.iter().filter(|x| !x.op.is_p2p()).map(move |x| {
                (
                    p.rank,
                    x.comm,
                    x.seq,
                    Detectors::in_flight_shape(x.op, x.bytes),
                )
            })
        })
        .collect();
    let end = procs.iter().map(|p| p.last_beat_real).max().unwrap_or(0);
    findings.extend(instance_findings(
        job, processes, unfinished, end, &th.tuning,
    ));
    findings.sort_by(|a, b| (a.kind, &a.ranks, &a.comm).cmp(&(b.kind, &b.ranks, &b.comm)));
    findings
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::cst::Header;
    use commscope_wire::record::{Call, Comm, Heartbeat};

    const WORLD: u64 = 0xabc;
    const S: u64 = 1_000_000_000;

    fn proc(rank: i32, records: Vec<Record>) -> ProcessTrace {
        let mut all = vec![Record::Comm(Comm::new(
            CommEvent::Created,
            WORLD,
            0,
            0,
            rank,
            rank,
            4,
            0,
        ))];
        all.extend(records);
        ProcessTrace {
            header: Header {
                job: "j".into(),
                node: format!("n{}", rank / 2),
                pid: 100 + rank as u32,
                rank,
                world_size: 4,
                ..Default::default()
            },
            records: all,
            clock: None,
        }
    }

    fn call(rank: i32, seq: u64, op: Op) -> Record {
        Record::Call(Call {
            op: op as u8,
            comm_id: WORLD,
            seq,
            bytes: 8,
            peer: if op.is_rooted() { 0 } else { -1 },
            rank,
            comm_rank: rank,
            comm_size: 4,
            t_enter: seq * S,
            t_exit: seq * S + 1000,
            ..Default::default()
        })
    }

    fn enter(rank: i32, seq: u64, at: u64) -> Record {
        Record::Enter(Call {
            op: Op::Allreduce as u8,
            comm_id: WORLD,
            seq,
            bytes: 8,
            peer: -1,
            rank,
            comm_rank: rank,
            t_enter: at,
            ..Default::default()
        })
    }

    fn beat(at: u64) -> Record {
        Record::Heartbeat(Heartbeat {
            t_mono: at,
            t_real: at,
            ..Default::default()
        })
    }

    #[test]
    fn a_rank_calling_another_collective_is_a_mismatch_not_a_hang() {
        let procs: Vec<ProcessTrace> = (0..4)
            .map(|r| {
                let mut recs: Vec<Record> = (0..3).map(|s| call(r, s, Op::Allreduce)).collect();
                if r == 1 {
                    recs.push(call(r, 3, Op::Broadcast));
                } else {
                    recs.push(enter(r, 3, 3 * S));
                }
                recs.push(beat(20 * S));
                proc(r, recs)
            })
            .collect();
        let f = analyze("j", &procs, &Thresholds::default());
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::Mismatch);
        assert_eq!(f[0].ranks, [1]);
        assert_eq!(f[0].seq, Some(3));
        assert!(
            f[0].summary.contains("rank 1 called broadcast"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn peers_waiting_for_a_silent_rank_give_one_dead_rank_finding() {
        let procs: Vec<ProcessTrace> = (0..4)
            .map(|r| {
                let mut recs: Vec<Record> = (0..5).map(|s| call(r, s, Op::Allreduce)).collect();
                if r == 2 {
                    recs.push(beat(5 * S)); // then nothing
                } else {
                    recs.push(enter(r, 5, 5 * S));
                    recs.push(beat(20 * S));
                }
                proc(r, recs)
            })
            .collect();
        let f = analyze("j", &procs, &Thresholds::default());
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::DeadRank);
        assert_eq!(f[0].ranks, [2]);
        assert_eq!(f[0].nodes, ["n1"]);
        assert_eq!(f[0].evidence["victims"], serde_json::json!([0, 1, 3]));
        // Below the floor nothing is stuck yet, and a rank that merely lags is not dead.
        let quiet = Thresholds {
            hang_floor_ns: 60 * S,
            dead_after_ns: 60 * S,
            ..Default::default()
        };
        assert!(analyze("j", &procs, &quiet).is_empty());
    }
}
