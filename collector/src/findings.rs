//! The live findings engine: every second it looks at the live state and opens, updates and
//! resolves findings (one log line per open and resolve). Today: `hang` (collectives; root
//! culprits along the wait chain across communicators) and `dead-rank` (killed, or exited without
//! finalizing). Detectors over traces are in `commscope_analyzer::batch`; the kinds and shapes
//! are the same.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use std::time::Duration;

use commscope_analyzer::batch::root_culprits;
use commscope_analyzer::finding::{
    Finding, HangCause, Kind, Tracker, Waited, dead_rank_finding, finding_id, hang_finding,
};
use commscope_wire::hash::parse_comm_id;
use commscope_wire::op::Op;
use serde_json::json;

use crate::state::{JobState, RankStatus, State, now_ns};

/// Findings kept after they resolved, at most.
const RESOLVED_KEPT: usize = 1000;

pub use commscope_analyzer::finding::Change;

/// (job, kind, root ranks).
type AnchorKey = (String, Kind, Vec<i32>);

/// Open and recently resolved findings.
#[derive(Debug)]
pub struct Engine {
    pub tracker: Tracker,
    /// The hang floor.
    pub floor: Duration,
    /// Per job: the hang and dead-rank findings of the last evaluation (kept while ranks are
    /// ending, when a rank that only followed could look like the first to die).
    last: HashMap<String, Vec<Finding>>,
    /// Per (job, kind, root ranks): the communicator and instance a hang was first found in.
    /// Later evaluations may see the victims' oldest call elsewhere (ages tie across
    /// communicators); the finding keeps its first `comm`/`seq`, hence its id.
    anchors: HashMap<AnchorKey, (Option<String>, Option<u64>)>,
}

impl Engine {
    pub fn new(floor: Duration) -> Engine {
        Engine {
            tracker: Tracker {
                keep_resolved: RESOLVED_KEPT,
                ..Default::default()
            },
            floor,
            last: HashMap::new(),
            anchors: HashMap::new(),
        }
    }

    /// Re-evaluates every job; returns what opened and what resolved.
    pub fn tick(&mut self, state: &mut State) -> Vec<Change> {
        let mut now = Vec::new();
        let t = now_ns();
        self.last.retain(|j, _| state.jobs.contains_key(j));
        self.anchors.retain(|k, _| state.jobs.contains_key(&k.0));
        for job in state.jobs.values_mut() {
            let hangs = if job.in_flux() {
                self.last.get(&job.job).cloned().unwrap_or_default()
            } else {
                let mut h = detect(job, self.floor);
                for f in h
                    .iter_mut()
                    .filter(|f| f.comm.is_some() && f.kind == Kind::Hang)
                {
                    let key = (f.job.clone(), f.kind, f.ranks.clone());
                    let (comm, seq) = self
                        .anchors
                        .entry(key)
                        .or_insert_with(|| (f.comm.clone(), f.seq))
                        .clone();
                    if (&comm, seq) != (&f.comm, f.seq) {
                        let c = comm.as_deref().and_then(parse_comm_id);
                        f.id = finding_id(f.kind, &f.job, c, &f.ranks, seq);
                        f.comm = comm;
                        f.seq = seq;
                    }
                }
                self.last.insert(job.job.clone(), h.clone());
                h
            };
            now.extend(hangs);
            now.extend(job.instance_findings(t));
        }
        self.tracker.update(now, t)
    }
}

struct Waiting {
    comm: u64,
    seq: u64,
    op: Op,
    bytes: u64,
    /// Point-to-point: the peer's global rank (None: unknown, e.g. a wildcard receive).
    peer: Option<i32>,
    age_s: f64,
}

/// Findings of one job now.
fn detect(job: &JobState, floor: Duration) -> Vec<Finding> {
    let ranks: HashMap<i32, &crate::state::RankInfo> =
        job.ranks.values().map(|r| (r.rank, r)).collect();
    let dead: BTreeSet<i32> = job
        .ranks
        .values()
        .filter(|r| {
            !r.finalized
                && (r.status == RankStatus::Killed
                    || (r.status == RankStatus::Exited && r.exit_status.unwrap_or(0) != 0)
                    || (r.status == RankStatus::Exited && job.ended.is_none()))
        })
        .map(|r| r.rank)
        .collect();
    // The first to die while others went on are roots; ranks taken down after them are not.
    let dead_roots: BTreeSet<i32> = first_deaths(job, &dead).into_iter().map(|d| d.0).collect();
    // Calls in flight now, with their current age.
    let mut stuck: HashMap<i32, Vec<Waiting>> = HashMap::new();
    for r in job.ranks.values() {
        if r.status != RankStatus::Running {
            continue;
        }
        let since = r.snapshot_at.map_or(0.0, |t| t.elapsed().as_secs_f64());
        for c in &r.in_flight {
            let op = Op::from_name(&c.op).unwrap_or(Op::None);
            if op == Op::None {
                continue;
            }
            let peer = if op.is_p2p() {
                job.comms
                    .get(&c.comm_id)
                    .and_then(|m| m.members.get(&c.peer))
                    .copied()
            } else {
                None
            };
            stuck.entry(r.rank).or_default().push(Waiting {
                comm: c.comm_id,
                seq: c.seq,
                op,
                bytes: c.bytes,
                peer,
                age_s: c.for_s + since,
            });
        }
    }
    // The hang threshold of a communicator: the floor, or twice its longest completed call.
    let threshold = |comm: u64| -> f64 {
        let longest = job.comms.get(&comm).map_or(0.0, |c| c.max_duration_s);
        floor.as_secs_f64().max(2.0 * longest)
    };
    let waits_for = |rank: i32, w: &Waiting| -> Vec<i32> {
        if w.op.is_p2p() {
            // The peer, unless it is itself in a point-to-point call with us on this
            // communicator (then the two are matched and only slow).
            let Some(peer) = w.peer else { return vec![] };
            let matched = stuck.get(&peer).is_some_and(|v| {
                v.iter()
                    .any(|x| x.comm == w.comm && x.op.is_p2p() && x.peer == Some(rank))
            });
            return if matched { vec![] } else { vec![peer] };
        }
        let Some(comm) = job.comms.get(&w.comm) else {
            return vec![];
        };
        comm.progress
            .iter()
            .filter(|(m, done)| {
                **m != rank
                    && **done <= w.seq
                    && !stuck.get(m).is_some_and(|v| {
                        v.iter()
                            .any(|x| x.comm == w.comm && x.seq == w.seq && !x.op.is_p2p())
                    })
            })
            .map(|(m, _)| *m)
            .collect()
    };
    let mut roots: BTreeMap<Vec<i32>, Vec<(i32, &Waiting)>> = BTreeMap::new();
    for (rank, ws) in &stuck {
        for w in ws.iter().filter(|w| w.age_s >= threshold(w.comm)) {
            let root = root_culprits(
                *rank,
                waits_for(*rank, w),
                |r| {
                    if dead_roots.contains(&r) {
                        vec![]
                    } else {
                        stuck
                            .get(&r)
                            .map(|v| v.iter().flat_map(|x| waits_for(r, x)).collect())
                            .unwrap_or_default()
                    }
                },
                |r| {
                    stuck
                        .get(&r)
                        .is_some_and(|v| v.iter().any(|x| x.op.is_p2p()))
                },
            );
            if !root.is_empty() {
                roots
                    .entry(root.into_iter().collect())
                    .or_default()
                    .push((*rank, w));
            }
        }
    }
    let mut out = Vec::new();
    for (culprits, victims) in roots {
        let (_, oldest) = *victims
            .iter()
            .max_by(|a, b| a.1.age_s.total_cmp(&b.1.age_s))
            .expect("a victim");
        let victim_ranks: BTreeSet<i32> = victims
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| !culprits.contains(r))
            .collect();
        let nodes: Vec<String> = culprits
            .iter()
            .filter_map(|r| ranks.get(r).map(|i| i.node.clone()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let endings = culprits
            .iter()
            .filter_map(|r| ranks.get(r))
            .map(|i| match (i.signal, i.exit_status) {
                (Some(sig), _) => format!("signal {sig}"),
                (None, Some(st)) => format!("exit status {st}"),
                _ => "status unknown".into(),
            })
            .collect();
        let evidence = json!({
            "victims": &victim_ranks,
            "stuck_for_s": oldest.age_s,
            "culprits": culprits.iter().map(|r| json!({
                "rank": r,
                "state": ranks.get(r).map(|i| i.status.name()),
                "process": ranks.get(r).map(|i| i.proc_evidence()),
                "stacks": ranks.get(r).and_then(|i| i.stacks.clone()),
                "in_library": stuck.contains_key(r),
                "progress_on_comm": job.comms.get(&oldest.comm).and_then(|c| c.progress.get(r)),
            })).collect::<Vec<_>>(),
        });
        let state_note = culprits
            .iter()
            .filter_map(|r| ranks.get(r))
            .filter_map(|i| {
                let p = i.proc.as_ref()?;
                let advancing = i
                    .cpu_advanced_at
                    .is_some_and(|t| t.elapsed() < Duration::from_secs(2));
                Some(format!(
                    "{} process is {}{}, its CPU time {}",
                    if culprits.len() == 1 {
                        "its".to_owned()
                    } else {
                        format!("rank {}'s", i.rank)
                    },
                    crate::state::state_name(&p.state),
                    if p.wchan.is_empty() {
                        String::new()
                    } else {
                        format!(" in {}", p.wchan)
                    },
                    if advancing {
                        "advancing"
                    } else {
                        "not advancing"
                    }
                ))
            })
            .collect::<Vec<_>>()
            .join("; ");
        out.push(hang_finding(HangCause {
            job: &job.job,
            all_dead: culprits.iter().all(|r| dead_roots.contains(r)),
            in_library: culprits.iter().any(|r| stuck.contains_key(r)),
            culprits,
            nodes,
            victims: victim_ranks.into_iter().collect(),
            waited: Waited {
                comm: oldest.comm,
                seq: (!oldest.op.is_p2p()).then_some(oldest.seq),
                op: oldest.op.name(),
                bytes: oldest.bytes,
                tag: -1,
                age_s: oldest.age_s,
            },
            endings,
            live: true,
            state_note,
            opened_at: now_ns(),
            confidence: 0.9,
            evidence,
        }));
    }
    // Dead ranks nobody waits for (yet, or any more: a launcher takes the rest of the job down
    // when one rank dies). The root is the first to die, when the others went on after it.
    let reported: BTreeSet<i32> = out
        .iter()
        .filter(|f| f.kind == Kind::DeadRank)
        .flat_map(|f| f.ranks.clone())
        .collect();
    let now = now_ns();
    for (r, first) in first_deaths(job, &dead) {
        if reported.contains(&r) || now.saturating_sub(first) < 1_000_000_000 {
            continue;
        }
        let Some(i) = ranks.get(&r) else { continue };
        let how = match (i.signal, i.exit_status) {
            (Some(sig), _) => format!("was killed by signal {sig}"),
            (None, Some(st)) => format!("exited with status {st} without finalizing"),
            _ => "exited without finalizing".into(),
        };
        let after: Vec<i32> = job
            .ranks
            .values()
            .filter(|x| x.rank != r && dead.contains(&x.rank))
            .map(|x| x.rank)
            .collect();
        out.push(dead_rank_finding(
            &job.job,
            r,
            &i.node,
            i.pid,
            &format!("{how} while the other ranks ran"),
            i.ended_at_ns.unwrap_or(now),
            i.died_in_call,
            json!({"pid": i.pid, "ended_at_ns": i.ended_at_ns, "died_in_call": i.died_in_call,
                   "ended_after_it": after}),
        ));
    }
    out
}

/// Ranks that died first — within 50 ms of the first death — while other ranks went on (still
/// run, finalized, or ended later): (rank, time of the first death). When every rank ended within
/// those 50 ms the job was taken down as a whole and nobody is singled out.
fn first_deaths(job: &JobState, dead: &BTreeSet<i32>) -> Vec<(i32, u64)> {
    const WINDOW: u64 = 50_000_000;
    let deaths: Vec<(i32, u64)> = job
        .ranks
        .values()
        .filter(|r| dead.contains(&r.rank))
        .filter_map(|r| Some((r.rank, r.ended_at_ns?)))
        .collect();
    let Some(first) = deaths.iter().map(|d| d.1).min() else {
        return vec![];
    };
    let early: BTreeSet<i32> = deaths
        .iter()
        .filter(|d| d.1 <= first + WINDOW)
        .map(|d| d.0)
        .collect();
    let went_on = job.ranks.values().any(|r| {
        !early.contains(&r.rank)
            && (r.status == RankStatus::Running
                || r.finalized
                || r.ended_at_ns.is_none_or(|t| t > first + WINDOW))
    });
    if !went_on {
        return vec![];
    }
    early.into_iter().map(|r| (r, first)).collect()
}
