//! The live findings engine: every second it builds each job's view from the live state, runs
//! the analyzer's detectors over it — the same ones `commscope analyze` runs over a trace — and
//! opens, updates and resolves findings (one log line per open and resolve).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use commscope_analyzer::detectors::{Liveness, liveness};
use commscope_analyzer::finding::{Finding, Kind, Tracker};
use commscope_analyzer::view::{
    CommView, Ending, InFlight, JobView, LostContact, ProcessState, RankView,
};
use commscope_wire::op::Op;
use serde_json::json;

use crate::shards::Shards;
use crate::state::{JobState, RankInfo, RankStatus, State, now_ns};

/// Findings kept after they resolved, at most.
const RESOLVED_KEPT: usize = 1000;

pub use commscope_analyzer::finding::Change;

/// Open and recently resolved findings.
#[derive(Debug)]
pub struct Engine {
    pub tracker: Tracker,
    /// The liveness detectors' thresholds (the hang floor among them).
    pub liveness: Liveness,
    /// Per shard, per job: the liveness findings of the last evaluation (kept while ranks are
    /// ending, when a rank that only followed could look like the first to die).
    last: Vec<Mutex<HashMap<String, Vec<Finding>>>>,
}

impl Engine {
    pub fn new(floor: Duration) -> Engine {
        Engine {
            tracker: Tracker {
                keep_resolved: RESOLVED_KEPT,
                ..Default::default()
            },
            liveness: Liveness {
                hang_floor_ns: floor.as_nanos() as u64,
                ..Default::default()
            },
            last: Vec::new(),
        }
    }

    /// Re-evaluates every job, the shards in parallel; returns what opened and what resolved.
    /// `lost`: nodes whose agent is out of contact now.
    pub fn tick(&mut self, shards: &Shards, lost: &BTreeMap<String, LostContact>) -> Vec<Change> {
        let t = now_ns();
        self.last.resize_with(shards.len(), Default::default);
        let (liveness, last) = (&self.liveness, &self.last);
        let found = shards.par_map(|i, state| {
            let mut last = last[i].lock().unwrap_or_else(|p| p.into_inner());
            evaluate(state, liveness, &mut last, t, lost)
        });
        self.tracker
            .update(found.into_iter().flatten().collect(), t)
    }
}

/// Every job of one shard: what the detectors find now.
fn evaluate(
    state: &mut State,
    liveness_cfg: &Liveness,
    last: &mut HashMap<String, Vec<Finding>>,
    t: u64,
    lost: &BTreeMap<String, LostContact>,
) -> Vec<Finding> {
    let mut now = Vec::new();
    last.retain(|j, _| state.jobs.contains_key(j));
    for job in state.jobs.values_mut() {
        let (mut mismatches, rest): (Vec<Finding>, Vec<Finding>) = job
            .instance_findings(t)
            .into_iter()
            .partition(|f| f.kind == Kind::Mismatch);
        let found = if job.in_flux() {
            last.get(&job.job).cloned().unwrap_or_default()
        } else {
            let v = view(job, t, lost);
            let f = liveness(&v, liveness_cfg, &mut mismatches);
            last.insert(job.job.clone(), f.clone());
            f
        };
        let mut job_now = found;
        job_now.extend(mismatches);
        job_now.extend(rest);
        commscope_analyzer::link_errors::fold_into_hangs(&mut job_now);
        attach_attribution(job, &mut job_now);
        now.extend(job_now);
    }
    now
}

/// `evidence.attribution` on a job's findings, when its agents attributed it: the job's
/// namespace, owner and scheduler ids, and the pod of each rank the finding names.
fn attach_attribution(job: &JobState, found: &mut [Finding]) {
    let any_pod = job.ranks.values().any(|r| !r.pod.is_empty());
    if job.attribution.is_empty() && !any_pod {
        return;
    }
    for f in found {
        let mut a = serde_json::to_value(&job.attribution).unwrap_or_else(|_| json!({}));
        let pods: BTreeMap<String, &str> = f
            .ranks
            .iter()
            .filter_map(|rank| {
                job.ranks
                    .values()
                    .filter(|r| r.rank == *rank && !r.pod.is_empty())
                    .max_by_key(|r| r.last_heard_ns)
                    .map(|r| (rank.to_string(), r.pod.as_str()))
            })
            .collect();
        if !pods.is_empty() {
            a["pods"] = json!(pods);
        }
        f.evidence["attribution"] = a;
    }
}

/// The job as the detectors see it now.
pub fn view(job: &JobState, now: u64, lost: &BTreeMap<String, LostContact>) -> JobView {
    let mut comms: HashMap<u64, CommView> = HashMap::with_capacity(job.comms.len());
    for (id, c) in &job.comms {
        comms.insert(
            *id,
            CommView {
                name: c.name.clone(),
                members: c.members.clone(),
                progress: c.progress.clone(),
                longest_ns: (c.max_duration_s * 1e9) as u64,
            },
        );
    }
    // NCCL and RCCL calls are queued on a GPU stream.
    let stream = matches!(job.flavour.as_str(), "nccl" | "rccl");
    let mut ranks = std::collections::BTreeMap::new();
    for r in job.ranks.values() {
        // Several processes of one rank (a restart): the latest stands.
        if ranks
            .get(&r.rank)
            .is_some_and(|old: &RankView| old.last_heard_ns > r.last_heard_ns)
        {
            continue;
        }
        ranks.insert(r.rank, rank_view(r, &comms, now, stream));
    }
    let lost = lost
        .iter()
        .filter(|(node, _)| ranks.values().any(|r: &RankView| &r.node == *node))
        .map(|(n, l)| (n.clone(), l.clone()))
        .collect();
    JobView {
        job: job.job.clone(),
        live: true,
        now_ns: now,
        ranks,
        comms,
        lost,
        dead_links: job.detectors.dead_links(now),
    }
}

fn rank_view(r: &RankInfo, comms: &HashMap<u64, CommView>, now: u64, stream_lib: bool) -> RankView {
    // Ended once its agent saw it go; how, preferably as the process recorded it itself.
    let seen = matches!(r.status, RankStatus::Killed | RankStatus::Exited).then(|| Ending {
        at_ns: r.ended_at_ns.unwrap_or(now),
        observed: true,
        status: r.exit_status,
        signal: r.signal,
        ..Default::default()
    });
    let ended = match (seen, r.own_end) {
        (Some(s), Some(own)) => Some(own.merged(s)),
        (s, _) => s,
    };
    let to_real = |t_mono: u64| -> u64 {
        if r.mono_anchor == 0 || r.real_anchor == 0 || t_mono == 0 {
            return 0;
        }
        let offset = r.clock.map_or(0, |c| c.offset_ns);
        (i128::from(r.real_anchor) + i128::from(t_mono) - i128::from(r.mono_anchor)
            + i128::from(offset))
        .max(0) as u64
    };
    // Ages grow from the snapshot while the process runs; an ended one's stop at its end.
    let since = match (ended, r.snapshot_at) {
        (None, Some(t)) => t.elapsed().as_nanos() as u64,
        (Some(e), _) => match to_real(r.snapshot_mono) {
            0 => 0,
            snap => e.at_ns.saturating_sub(snap).min(60_000_000_000),
        },
        _ => 0,
    };
    let in_flight = r
        .in_flight
        .iter()
        .filter_map(|c| {
            let op = Op::from_name(&c.op).filter(|o| *o != Op::None)?;
            let issued_only = c.issued_only;
            // A snapshot older than the records: the collective completed since. (A
            // collective seen only as issued has its record already: it stays.)
            let done = !issued_only
                && comms
                    .get(&c.comm_id)
                    .and_then(|m| m.progress.get(&r.rank))
                    .is_some_and(|p| *p > c.seq);
            if !op.is_p2p() && done {
                return None;
            }
            let peer = (op.is_p2p() && c.peer >= 0)
                .then(|| comms.get(&c.comm_id)?.members.get(&c.peer).copied())
                .flatten();
            Some(InFlight {
                comm: c.comm_id,
                seq: c.seq,
                op,
                bytes: c.bytes,
                peer,
                tag: c.tag,
                entered_ns: to_real(c.t_enter),
                age_ns: (c.for_s * 1e9) as u64 + since,
                stream: stream_lib || issued_only,
                issued_only,
                posted: c.posted,
                shape: c.shape(op),
            })
        })
        .collect();
    RankView {
        rank: r.rank,
        node: r.node.clone(),
        pid: r.pid,
        finalized: r.finalized,
        ended,
        last_heard_ns: r.last_heard_ns,
        in_flight,
        busy_unseen: false,
        data_lost: false,
        observed_age_ns: ended
            .is_none()
            .then(|| r.snapshot_at.map(|t| t.elapsed().as_nanos() as u64))
            .flatten(),
        process: r.proc.as_ref().map(|p| ProcessState {
            state: p.state.clone(),
            wchan: p.wchan.clone(),
            cpu_advancing: r
                .cpu_advanced_at
                .is_some_and(|t| t.elapsed() < Duration::from_secs(2)),
        }),
        evidence: json!({
            "state": r.status.name(),
            "process": r.proc_evidence(),
            "stacks": r.stacks,
        }),
        // (Traces carry none of these.)
    }
}
