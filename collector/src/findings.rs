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

use crate::contact::Contact;
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
    /// How each running job stood with its nodes at the last evaluation.
    standing: BTreeMap<String, JobStanding>,
    /// While the collector is over its memory bound: what it says of that, put on the findings
    /// of each evaluation (`evidence.overload`).
    pub overload: Option<serde_json::Value>,
}

/// How a running job stands with the nodes its ranks run on.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct JobStanding {
    /// The time its liveness is judged at (realtime ns): its nodes' data, never ahead of it.
    pub as_of_ns: u64,
    /// How far that is behind the wall clock (ns).
    pub behind_ns: u64,
    /// Nodes whose stream is open but whose data lags the others: their ranks are not judged.
    pub nodes_behind: Vec<String>,
    /// Nodes with no agent stream open: their ranks are out of sight.
    pub out_of_contact: Vec<String>,
}

impl JobStanding {
    /// Something of the job cannot be seen now: findings naming it are held open.
    pub fn partial(&self) -> bool {
        !self.nodes_behind.is_empty() || !self.out_of_contact.is_empty()
    }

    /// Its verdicts wait for data: behind by more than [`BEHIND_NS`], or nodes left out.
    pub fn behind(&self) -> bool {
        self.behind_ns > BEHIND_NS || self.partial()
    }

    /// One line for the log, the API and the TUI.
    pub fn phrase(&self) -> String {
        let mut parts = Vec::new();
        if self.behind_ns > BEHIND_NS {
            parts.push(format!(
                "judged {:.1} s behind the wall clock (its data arrives late: the collector or its agents are behind)",
                self.behind_ns as f64 / 1e9
            ));
        }
        if !self.out_of_contact.is_empty() {
            parts.push(format!(
                "{} out of contact (no agent stream)",
                nodes_phrase(&self.out_of_contact)
            ));
        }
        if !self.nodes_behind.is_empty() {
            parts.push(format!(
                "{} behind the others (their ranks are not judged until they catch up)",
                nodes_phrase(&self.nodes_behind)
            ));
        }
        if parts.is_empty() {
            "current".into()
        } else {
            parts.join("; ")
        }
    }
}

/// A running rank whose own data (records, snapshots) ends more than this before the time its
/// job is judged at is behind: its data is still on its way, and it is not judged. (Records
/// come at least with each heartbeat, once a second.)
const RANK_BEHIND_NS: u64 = 3_000_000_000;

/// A job judged more than this behind the wall clock is reported behind.
pub const BEHIND_NS: u64 = 5_000_000_000;

fn nodes_phrase(nodes: &[String]) -> String {
    const SHOWN: usize = 4;
    let shown = nodes
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    match nodes.len() {
        1 => format!("node {shown}"),
        n if n <= SHOWN => format!("nodes {shown}"),
        n => format!("{n} nodes ({shown}, …)"),
    }
}

/// What the collector can see of its running jobs now.
#[derive(Clone, Debug, Default)]
pub struct Standing {
    /// Per job judged behind: by how much (ns).
    pub behind_ns: BTreeMap<String, u64>,
    /// Nodes of running jobs out of contact.
    pub out_of_contact: std::collections::BTreeSet<String>,
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
            standing: BTreeMap::new(),
            overload: None,
        }
    }

    /// Findings a previous run left for jobs it still holds: the open ones stay open (held
    /// until the nodes they name are back and current, then judged again), the resolved ones
    /// stay in the job's list.
    pub fn restore(&mut self, found: Vec<Finding>) {
        for f in found {
            match f.state {
                commscope_analyzer::finding::State::Open => {
                    self.tracker.open.insert(f.id.clone(), f);
                }
                commscope_analyzer::finding::State::Resolved => self.tracker.resolved.push(f),
            }
        }
    }

    /// How a job stood at the last evaluation.
    pub fn most_behind_ns(&self) -> u64 {
        self.standing
            .values()
            .map(|s| s.behind_ns)
            .max()
            .unwrap_or(0)
    }

    /// How a running job stands (None: ended, or not evaluated yet).
    pub fn job_standing(&self, job: &str) -> Option<&JobStanding> {
        self.standing.get(job)
    }

    /// What the collector could see of its running jobs at the last evaluation.
    pub fn standing(&self) -> Standing {
        Standing {
            behind_ns: self
                .standing
                .iter()
                .filter(|(_, s)| s.behind())
                .map(|(j, s)| (j.clone(), s.behind_ns))
                .collect(),
            out_of_contact: self
                .standing
                .values()
                .flat_map(|s| s.out_of_contact.iter().cloned())
                .collect(),
        }
    }

    /// Re-evaluates every job, the shards in parallel; returns what opened and what resolved.
    /// `contact`: what the collector can see of each node now.
    pub fn tick(&mut self, shards: &Shards, contact: &Contact) -> Vec<Change> {
        let t = now_ns();
        self.last.resize_with(shards.len(), Default::default);
        let lost = contact.lost(t);
        let (liveness, last) = (&self.liveness, &self.last);
        let found = shards.par_map(|i, state| {
            let mut last = last[i].lock().unwrap_or_else(|p| p.into_inner());
            evaluate(state, liveness, &mut last, t, contact, &lost)
        });
        let mut now = Vec::new();
        let mut standing = BTreeMap::new();
        for (f, s) in found {
            now.extend(f);
            standing.extend(s);
        }
        for (job, s) in &standing {
            let was = self.standing.get(job);
            if was.is_none_or(|w| w.behind() != s.behind() || w.partial() != s.partial()) {
                if s.behind() {
                    tracing::warn!("job {job}: {}", s.phrase());
                } else if was.is_some() {
                    tracing::info!("job {job}: caught up; its nodes are current again");
                }
            }
        }
        self.standing = standing;
        self.hold_unseen(&mut now);
        self.mark_behind(&mut now);
        if let Some(o) = &self.overload {
            // Made while the collector was over its memory bound: sampled harder, data held
            // back — diagnosis may be coarser or later, never different.
            for f in now.iter_mut() {
                f.evidence["overload"] = o.clone();
            }
        }
        self.tracker.update(now, t)
    }

    /// Findings of a job judged behind say so in their evidence (`contact`): made from data
    /// that arrives late — diagnosis may be slower then, never different.
    fn mark_behind(&self, now: &mut [Finding]) {
        for f in now
            .iter_mut()
            .filter(|f| f.evidence.get("contact").is_none())
        {
            if let Some(s) = self.standing.get(&f.job).filter(|s| s.behind()) {
                f.evidence["contact"] = json!({
                    "held": false,
                    "behind_s": s.behind_ns as f64 / 1e9,
                    "out_of_contact": s.out_of_contact,
                    "behind": s.nodes_behind,
                    "note": s.phrase(),
                });
            }
        }
    }

    /// Open findings the detectors no longer make, of jobs part of which cannot be seen now:
    /// kept open, marked as held (their evidence's `contact`), never resolved by what is
    /// missing.
    fn hold_unseen(&self, now: &mut Vec<Finding>) {
        let made: std::collections::HashSet<String> = now.iter().map(|f| f.id.clone()).collect();
        for (id, f) in &self.tracker.open {
            if made.contains(id) {
                continue;
            }
            let Some(s) = self.standing.get(&f.job).filter(|s| s.partial()) else {
                continue;
            };
            now.push(held(f, s));
        }
    }
}

/// A finding held open while part of its job cannot be seen.
fn held(f: &Finding, s: &JobStanding) -> Finding {
    let mut g = f.clone();
    let base = f.evidence["contact"]["summary"]
        .as_str()
        .map_or_else(|| f.summary.clone(), str::to_owned);
    let mut why = Vec::new();
    if !s.out_of_contact.is_empty() {
        why.push(format!(
            "{} out of contact",
            nodes_phrase(&s.out_of_contact)
        ));
    }
    if !s.nodes_behind.is_empty() {
        why.push(format!("{} behind", nodes_phrase(&s.nodes_behind)));
    }
    g.summary = format!(
        "{base} [held open: {}; it is judged again once they are back and current]",
        why.join(", ")
    );
    g.evidence["contact"] = json!({
        "held": true,
        "out_of_contact": s.out_of_contact,
        "behind": s.nodes_behind,
        "summary": base,
    });
    g
}

/// Every job of one shard: what the detectors find now, and how each job stands with its
/// nodes.
fn evaluate(
    state: &mut State,
    liveness_cfg: &Liveness,
    last: &mut HashMap<String, Vec<Finding>>,
    t: u64,
    contact: &Contact,
    lost: &BTreeMap<String, LostContact>,
) -> (Vec<Finding>, Vec<(String, JobStanding)>) {
    let mut now = Vec::new();
    let mut standing = Vec::new();
    last.retain(|j, _| state.jobs.contains_key(j));
    for job in state.jobs.values_mut() {
        let (mut mismatches, rest): (Vec<Finding>, Vec<Finding>) = job
            .instance_findings(t)
            .into_iter()
            .partition(|f| f.kind == Kind::Mismatch);
        let running: std::collections::BTreeSet<&str> = job
            .ranks
            .values()
            .filter(|r| r.status == RankStatus::Running && !r.finalized)
            .map(|r| r.node.as_str())
            .collect();
        let clock = contact.job_clock(running.iter().copied(), t);
        if job.ended.is_none() {
            standing.push((
                job.job.clone(),
                JobStanding {
                    as_of_ns: clock.as_of_ns,
                    behind_ns: t.saturating_sub(clock.as_of_ns),
                    nodes_behind: clock.behind.clone(),
                    out_of_contact: running
                        .iter()
                        .filter(|n| lost.contains_key(**n))
                        .map(|n| (*n).to_owned())
                        .collect(),
                },
            ));
        }
        let found = if job.in_flux() {
            last.get(&job.job).cloned().unwrap_or_default()
        } else {
            let v = view(job, clock.as_of_ns, lost, &clock.behind);
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
    (now, standing)
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

/// The job as the detectors see it at `now` (its nodes' data, never the wall clock ahead of
/// it), with the nodes out of contact and those `behind`.
pub fn view(
    job: &JobState,
    now: u64,
    lost: &BTreeMap<String, LostContact>,
    behind: &[String],
) -> JobView {
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
    // (The job's nodes once: thousands of nodes out of contact, each looked for among every
    // rank, held the job's state for seconds.)
    let nodes: std::collections::HashSet<&str> =
        ranks.values().map(|r: &RankView| r.node.as_str()).collect();
    let lost = lost
        .iter()
        .filter(|(node, _)| nodes.contains(node.as_str()))
        .map(|(n, l)| (n.clone(), l.clone()))
        .collect();
    JobView {
        job: job.job.clone(),
        live: true,
        mpi: !stream,
        now_ns: now,
        ranks,
        comms,
        lost,
        behind: behind.iter().cloned().collect(),
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
        sent_by: r.sent_by,
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
    // Ages grow from the snapshot to the time the job is judged at while the process runs
    // (a snapshot newer than that counts back to it); an ended one's stop at its end.
    let since: i128 = match (ended, r.snapshot_at) {
        (None, Some(t)) => match r.snapshot_real {
            0 => t.elapsed().as_nanos() as i128,
            snap => i128::from(now) - i128::from(snap),
        },
        (Some(e), _) => match to_real(r.snapshot_mono) {
            0 => 0,
            snap => i128::from(e.at_ns.saturating_sub(snap).min(60_000_000_000)),
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
                age_ns: ((c.for_s * 1e9) as i128 + since).max(0) as u64,
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
        behind: ended.is_none()
            && !r.finalized
            && r.last_heard_ns.max(r.snapshot_real) > 0
            && r.last_heard_ns.max(r.snapshot_real) + RANK_BEHIND_NS < now,
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
