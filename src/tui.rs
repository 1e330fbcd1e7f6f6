//! `commscope tui`: on a collector (its Query service), or on traces replayed with a time
//! cursor. The replay hands the TUI what a collector would have served at the cursor: the traces
//! cut at that moment ([`commscope_analyzer::replay::until`]) and analyzed by the same detectors
//! `commscope analyze` runs, in the Query service's shapes.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use anyhow::{Result, bail};
use commscope_analyzer::view::RankView;
use commscope_analyzer::{Analysis, Thresholds};
use commscope_collector::query::{finding, health, link_rate};
use commscope_tui::source::{Cursor, Snapshot, Source};
use commscope_wire::grpc::{
    CommState, InFlightCall, JobDetail, JobSummary, RankDetail, RankState, RecentCall,
};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::Record;

use crate::traces;

/// Traces replayed at a time cursor.
#[derive(Debug)]
pub struct Replay {
    label: String,
    jobs: Vec<(String, Vec<ProcessTrace>)>,
    start_ns: u64,
    end_ns: u64,
    at_ns: u64,
    want: (Option<String>, Option<i32>),
    dirty: bool,
    th: Thresholds,
    /// Per job, its analysis at `at_ns` (cleared when the cursor moves).
    cache: HashMap<String, (Vec<ProcessTrace>, Analysis)>,
}

impl Replay {
    /// Loads the traces under `paths`; the cursor starts at their end.
    pub fn load(paths: &[PathBuf]) -> Result<Replay> {
        let loaded = traces::load(paths)?;
        let label = format!(
            "replay of {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Replay::new(
            label,
            loaded
                .jobs
                .into_values()
                .map(|j| (j.job, j.processes))
                .collect(),
        )
    }

    /// Replays jobs' traces; the cursor starts at their end.
    pub fn new(label: String, jobs: Vec<(String, Vec<ProcessTrace>)>) -> Result<Replay> {
        let spans: Vec<(u64, u64)> = jobs
            .iter()
            .filter_map(|(_, p)| commscope_analyzer::replay::time_span(p))
            .collect();
        let (Some(start), Some(end)) = (
            spans.iter().map(|s| s.0).min(),
            spans.iter().map(|s| s.1).max(),
        ) else {
            bail!("no timed records in {label}");
        };
        Ok(Replay {
            label,
            jobs,
            start_ns: start,
            end_ns: end,
            at_ns: end,
            want: (None, None),
            dirty: true,
            th: Thresholds::default(),
            cache: HashMap::new(),
        })
    }

    /// One step of the cursor: a hundredth of the trace, between 10 ms and 1 s.
    fn step_ns(&self) -> u64 {
        ((self.end_ns - self.start_ns) / 100).clamp(10_000_000, 1_000_000_000)
    }

    fn analysis(&mut self, job: &str) -> Option<&(Vec<ProcessTrace>, Analysis)> {
        if !self.cache.contains_key(job) {
            let procs = &self.jobs.iter().find(|(j, _)| j == job)?.1;
            let cut = commscope_analyzer::replay::until(procs, self.at_ns);
            // Before the end, what had not ended was still running then.
            let a = if self.at_ns < self.end_ns {
                commscope_analyzer::analysis_at(job, &cut, &self.th, self.at_ns)
            } else {
                commscope_analyzer::analysis(job, &cut, &self.th)
            };
            self.cache.insert(job.to_owned(), (cut, a));
        }
        self.cache.get(job)
    }

    fn snapshot(&mut self) -> Snapshot {
        let names: Vec<String> = self.jobs.iter().map(|(j, _)| j.clone()).collect();
        let mut snap = Snapshot {
            clock_s: self.at_ns as f64 / 1e9,
            ..Default::default()
        };
        for job in &names {
            if let Some((cut, a)) = self.analysis(job) {
                snap.jobs.push(summary(job, cut, a));
            }
        }
        let (want_job, want_rank) = self.want.clone();
        if let Some(job) = want_job
            && let Some((cut, a)) = self.analysis(&job)
        {
            snap.job = Some(detail(&job, cut, a));
            if let Some(r) = want_rank {
                snap.rank = rank_detail(cut, a, r);
            }
        }
        snap
    }
}

impl Source for Replay {
    fn want(&mut self, job: Option<&str>, rank: Option<i32>) {
        let want = (job.map(str::to_owned), rank);
        if want != self.want {
            self.want = want;
            self.dirty = true;
        }
    }

    fn latest(&mut self) -> Option<Snapshot> {
        if !self.dirty {
            return None;
        }
        self.dirty = false;
        Some(self.snapshot())
    }

    fn label(&self) -> String {
        self.label.clone()
    }

    fn cursor(&self) -> Option<Cursor> {
        Some(Cursor {
            at_s: self.at_ns.saturating_sub(self.start_ns) as f64 / 1e9,
            end_s: self.end_ns.saturating_sub(self.start_ns) as f64 / 1e9,
            step_s: self.step_ns() as f64 / 1e9,
        })
    }

    fn seek(&mut self, steps: f64) {
        let at = (self.at_ns as f64 + steps * self.step_ns() as f64)
            .clamp(self.start_ns as f64, self.end_ns as f64) as u64;
        if at != self.at_ns {
            self.at_ns = at;
            self.cache.clear();
            self.dirty = true;
        }
    }
}

fn summary(job: &str, cut: &[ProcessTrace], a: &Analysis) -> JobSummary {
    let v = &a.view;
    let nodes: std::collections::BTreeSet<String> =
        v.ranks.values().map(|r| r.node.clone()).collect();
    let running = v.ranks.values().any(|r| r.ended.is_none() && !r.finalized);
    JobSummary {
        job: job.to_owned(),
        state: if running { "running" } else { "ended" }.into(),
        ranks: v.ranks.len() as u32,
        world_size: cut
            .iter()
            .map(|p| p.header.world_size)
            .max()
            .unwrap_or(0)
            .max(0) as u32,
        nodes: nodes.into_iter().collect(),
        records: cut.iter().map(|p| p.records.len() as u64).sum(),
        first_seen_ns: 0,
        last_seen_ns: v.now_ns,
        in_flight: v.ranks.values().map(|r| r.in_flight.len() as u32).sum(),
        dropped: 0,
        flavour: String::new(),
        open_findings: a
            .findings
            .iter()
            .filter(|f| f.state == commscope_analyzer::finding::State::Open)
            .count() as u32,
        contact_note: String::new(),
    }
}

/// Records each rank wrote up to the cursor.
fn records_by_rank(cut: &[ProcessTrace]) -> HashMap<i32, u64> {
    let mut m = HashMap::new();
    for p in cut {
        *m.entry(p.header.rank).or_insert(0) += p.records.len() as u64;
    }
    m
}

fn rank_state(r: &RankView, records: u64) -> RankState {
    RankState {
        rank: r.rank,
        node: r.node.clone(),
        pid: r.pid,
        state: match (r.ended, r.finalized) {
            (Some(e), _) if e.signal.is_some() => "killed",
            (Some(_), _) => "exited",
            (None, true) => "finalized",
            (None, false) => "running",
        }
        .into(),
        exit_status: r.ended.and_then(|e| e.status),
        signal: r.ended.and_then(|e| e.signal),
        records,
        last_seen_ns: r.last_heard_ns,
        ..Default::default()
    }
}

fn in_flight(r: &RankView) -> impl Iterator<Item = InFlightCall> + '_ {
    r.in_flight.iter().map(move |c| InFlightCall {
        rank: r.rank,
        comm_id: c.comm,
        seq: c.seq,
        op: c.op.name().into(),
        age_ns: c.age_ns,
        bytes: c.bytes,
        peer: c.peer.unwrap_or(-1),
    })
}

fn detail(job: &str, cut: &[ProcessTrace], a: &Analysis) -> JobDetail {
    let v = &a.view;
    let records = records_by_rank(cut);
    let ranks = v
        .ranks
        .values()
        .map(|r| rank_state(r, records.get(&r.rank).copied().unwrap_or(0)))
        .collect();
    let comms = v
        .comms
        .iter()
        .map(|(id, c)| {
            let progress: BTreeMap<i32, u64> = c.progress.iter().map(|(r, p)| (*r, *p)).collect();
            CommState {
                comm_id: *id,
                name: String::new(),
                size: c.members.len() as u32,
                members: progress.keys().copied().collect(),
                progress: progress.values().copied().collect(),
                calls: 0,
                bytes: 0,
            }
        })
        .collect();
    let in_flight = v.ranks.values().flat_map(in_flight).collect();
    JobDetail {
        summary: Some(summary(job, cut, a)),
        ranks,
        comms,
        in_flight,
        findings: a.findings.iter().map(finding).collect(),
        health: a.health.iter().map(health).collect(),
        links: a.links.iter().map(link_rate).collect(),
        step_s: a.step.as_ref().map(|s| s.0),
        step_from: a.step.as_ref().map(|s| s.1.clone()).unwrap_or_default(),
    }
}

fn rank_detail(cut: &[ProcessTrace], a: &Analysis, rank: i32) -> Option<RankDetail> {
    let r = a.view.ranks.get(&rank)?;
    let records = cut
        .iter()
        .filter(|p| p.header.rank == rank)
        .map(|p| p.records.len() as u64)
        .sum();
    let mut recent: Vec<RecentCall> = cut
        .iter()
        .filter(|p| p.header.rank == rank)
        .flat_map(|p| {
            p.records.iter().filter_map(|r| match r {
                Record::Call(c) => Some(RecentCall {
                    comm_id: c.comm_id,
                    seq: c.seq,
                    op: c.op().name().into(),
                    bytes: c.bytes,
                    duration_ns: c.span_ns(),
                    end_ns: c.t_exit,
                    peer: c.peer,
                }),
                _ => None,
            })
        })
        .collect();
    let keep = recent
        .len()
        .saturating_sub(commscope_collector::state::RECENT_CALLS);
    recent.drain(..keep);
    Some(RankDetail {
        state: Some(rank_state(r, records)),
        recent,
        in_flight: in_flight(r).collect(),
        health: a.health.iter().find(|h| h.rank == rank).map(health),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_sim::{Fault, Spec};

    fn hung_job() -> Replay {
        let spec = Spec {
            job: "replayed".into(),
            ranks: 16,
            per_node: 8,
            steps: 30,
            faults: vec![Fault::parse("hang:6:20").expect("fault")],
            links: true,
            ..Default::default()
        };
        let traces = commscope_sim::run_virtual(spec).expect("simulated");
        Replay::new("test".into(), vec![("replayed".into(), traces)]).expect("replay")
    }

    #[test]
    fn the_cursor_shows_the_job_as_it_stood_then() {
        let mut r = hung_job();
        r.want(Some("replayed"), Some(6));
        let end = r.latest().expect("a first snapshot");
        assert!(r.latest().is_none(), "nothing new until the cursor moves");
        let d = end.job.expect("the job");
        let hangs: Vec<_> = d.findings.iter().filter(|f| f.kind == "hang").collect();
        assert_eq!(hangs.len(), 1, "{:#?}", d.findings);
        assert_eq!(hangs[0].ranks, [6]);
        assert_eq!(d.summary.as_ref().map(|s| s.ranks), Some(16));
        assert!(
            d.in_flight.len() >= 15,
            "the others wait: {:?}",
            d.in_flight.len()
        );
        let rank = end.rank.expect("rank 6");
        assert_eq!(rank.state.map(|s| s.rank), Some(6));
        assert!(!rank.recent.is_empty());

        // Back to the start: nothing hangs yet, nothing is in flight for long.
        let c = r.cursor().expect("a cursor");
        r.seek(-c.end_s / c.step_s - 1.0);
        assert_eq!(r.cursor().map(|c| c.at_s), Some(0.0));
        let start = r.latest().expect("a snapshot at the start");
        let d = start.job.expect("the job");
        assert!(
            d.findings.iter().all(|f| f.kind != "hang"),
            "{:#?}",
            d.findings
        );
        assert!(start.clock_s < end.clock_s);
        // Stepping forward a second at a time, the world communicator's progress only grows,
        // passes through steps short of the hang, and stops at it.
        let mut seen = Vec::new();
        for _ in 0..=((c.end_s / c.step_s).ceil() as usize) {
            r.seek(1.0);
            let Some(q) = r.latest() else { break };
            let d = q.job.expect("the job");
            let world = d
                .comms
                .iter()
                .max_by_key(|c| c.members.len())
                .expect("world");
            let progress = world.progress.iter().copied().min().unwrap_or(0);
            // Before the hang, nothing is wrong: a rank not yet heard from at the cursor
            // is running, not dead.
            if progress < 20 {
                assert!(d.findings.is_empty(), "at #{progress}: {:#?}", d.findings);
            }
            seen.push(progress);
        }
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        assert!(seen.iter().any(|p| *p > 0 && *p < 20), "{seen:?}");
        assert_eq!(seen.last(), Some(&20), "{seen:?}");
    }
}
