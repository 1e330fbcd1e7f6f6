//! The gRPC query service (`commscope.v1.Query`): what the TUI shows, on `--listen`.

use std::sync::Arc;
use std::time::Duration;

use commscope_analyzer::detectors::slow_rank::RankHealth;
use commscope_wire::grpc::query_server::Query;
use commscope_wire::grpc::{
    self as pb, ApiRequest, ApiResponse, CommState, GetJobRequest, GetRankRequest, InFlightCall,
    JobDetail, JobList, JobSummary, ListJobsRequest, RankDetail, RankState, RecentCall,
    WatchRequest,
};
use commscope_wire::op::Op;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::Shared;
use crate::state::JobState;

/// The service.
#[derive(Debug, Clone)]
pub struct QueryService {
    pub(crate) shared: Arc<Shared>,
}

fn summary(j: &JobState) -> JobSummary {
    JobSummary {
        job: j.job.clone(),
        state: j.state_name().into(),
        ranks: j.rank_count() as u32,
        world_size: j.world_size.max(0) as u32,
        nodes: j.nodes(),
        records: j.records,
        first_seen_ns: j.first_seen_ns,
        last_seen_ns: j.last_seen_ns,
        in_flight: j.in_flight().len() as u32,
        dropped: j.dropped(),
        flavour: j.flavour.clone(),
        open_findings: 0,
        contact_note: String::new(),
    }
}

/// The summary of a job known from disk only.
fn stored_summary(l: &crate::http::JobLine) -> JobSummary {
    JobSummary {
        job: l.job.clone(),
        state: l.state.clone(),
        ranks: l.ranks as u32,
        world_size: l.world_size.max(0) as u32,
        nodes: l.nodes.clone(),
        records: l.records,
        first_seen_ns: l.first_seen_ns,
        last_seen_ns: l.last_seen_ns,
        in_flight: l.in_flight as u32,
        dropped: l.dropped,
        flavour: l.flavour.clone(),
        open_findings: 0,
        contact_note: String::new(),
    }
}

fn rank_state(r: &crate::state::RankInfo) -> RankState {
    RankState {
        rank: r.rank,
        node: r.node.clone(),
        pid: r.pid,
        state: r.status.name().into(),
        exit_status: r.exit_status,
        signal: r.signal,
        records: r.records,
        calls: r.calls,
        last_seen_ns: r.last_seen_ns,
        dropped: r.dropped(),
        clock_offset_ns: r.clock.map(|c| c.offset_ns),
        clock_error_ns: r.clock.map(|c| c.error_ns).unwrap_or(0),
        pod: r.pod.clone(),
    }
}

fn in_flight_call(c: &crate::state::InFlightCall) -> InFlightCall {
    InFlightCall {
        rank: c.rank,
        comm_id: c.comm_id,
        seq: c.seq,
        op: c.op.clone(),
        age_ns: (c.for_s * 1e9) as u64,
        bytes: c.bytes,
        peer: c.peer,
    }
}

/// A rank's health in its proto shape.
pub fn health(h: &RankHealth) -> pb::RankHealth {
    pb::RankHealth {
        rank: h.rank,
        share: h.share,
        recent_share: h.recent_share,
        late_ratio: h.late_ratio,
        slow: h.slow,
    }
}

/// A node pair's link totals in their proto shape.
pub fn link_rate(p: &commscope_analyzer::links::NodePair) -> pb::LinkRate {
    pb::LinkRate {
        src: p.src.clone(),
        dst: p.dst.clone(),
        bytes: p.bytes,
        network_s: p.net_ns as f64 / 1e9,
        gpu_wait_s: p.gpu_wait_ns as f64 / 1e9,
    }
}

/// A finding in its proto shape.
pub fn finding(f: &commscope_analyzer::Finding) -> pb::Finding {
    let name = |v: serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    pb::Finding {
        id: f.id.clone(),
        kind: f.kind.name().into(),
        class: name(serde_json::to_value(f.class).unwrap_or_default()),
        state: name(serde_json::to_value(f.state).unwrap_or_default()),
        job: f.job.clone(),
        comm: f.comm.clone(),
        seq: f.seq,
        ranks: f.ranks.clone(),
        nodes: f.nodes.clone(),
        link_src: f.link.as_ref().map(|l| l.src.clone()).unwrap_or_default(),
        link_dst: f.link.as_ref().map(|l| l.dst.clone()).unwrap_or_default(),
        opened_at: f.opened_at,
        resolved_at: f.resolved_at,
        confidence: f.confidence,
        summary: f.summary.clone(),
        evidence_json: f.evidence.to_string(),
        link_src_nic: f.link.as_ref().and_then(|l| l.src_nic.clone()),
        link_src_port: f.link.as_ref().and_then(|l| l.src_port),
    }
}

/// Adds a job's findings (live and stored) and their open count to its detail; takes the
/// state lock, so never call it while holding it.
fn with_findings(shared: &crate::Shared, d: &mut JobDetail) {
    let Some(job) = d.summary.as_ref().map(|s| s.job.clone()) else {
        return;
    };
    d.findings = crate::http::all_findings(shared, Some(&job))
        .iter()
        .map(finding)
        .collect();
    let open = d.findings.iter().filter(|f| f.state == "open").count() as u32;
    let note = shared
        .findings
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .job_standing(&job)
        .filter(|s| s.behind())
        .map(|s| s.phrase())
        .unwrap_or_default();
    if let Some(s) = d.summary.as_mut() {
        s.open_findings = open;
        s.contact_note = note;
    }
}

/// The proto detail of a job (its findings are the caller's to add: [`with_findings`]).
pub fn detail(j: &JobState) -> JobDetail {
    let mut ranks: Vec<RankState> = j.ranks.values().map(rank_state).collect();
    ranks.sort_by_key(|r| (r.rank, r.pid));
    let mut comms: Vec<CommState> = j
        .comms
        .iter()
        .map(|(id, c)| CommState {
            comm_id: *id,
            name: c.name.clone(),
            size: c.size.max(0) as u32,
            members: c.progress.keys().copied().collect(),
            progress: c.progress.values().copied().collect(),
            calls: c.ops.values().map(|s| s.calls).sum(),
            bytes: c.ops.values().map(|s| s.bytes).sum(),
        })
        .collect();
    comms.sort_by_key(|c| (std::cmp::Reverse(c.size), c.comm_id));
    let in_flight = j.in_flight().iter().map(in_flight_call).collect();
    let links = j.detectors.node_pairs().iter().map(link_rate).collect();
    let step = j.detectors.step();
    JobDetail {
        summary: Some(summary(j)),
        ranks,
        comms,
        in_flight,
        findings: Vec::new(),
        health: j.detectors.health().iter().map(health).collect(),
        links,
        step_s: step.as_ref().map(|s| s.0),
        step_from: step.map(|s| s.1).unwrap_or_default(),
    }
}

#[tonic::async_trait]
impl Query for QueryService {
    async fn list_jobs(
        &self,
        request: Request<ListJobsRequest>,
    ) -> Result<Response<JobList>, Status> {
        let fan_out = !crate::peers::is_local(&request) && !self.shared.peers.is_empty();
        let all = request.into_inner().include_ended;
        let mut jobs: Vec<JobSummary> = self
            .shared
            .state
            .iter()
            .flat_map(|st| st.jobs.values().map(summary).collect::<Vec<_>>())
            .collect();
        if all {
            let live: std::collections::HashSet<String> =
                jobs.iter().map(|j| j.job.clone()).collect();
            jobs.extend(
                self.shared
                    .history
                    .jobs(&|j| live.contains(j))
                    .iter()
                    .map(stored_summary),
            );
        } else {
            jobs.retain(|j| j.state == "running");
        }
        let open: std::collections::HashMap<String, u32> = {
            let e = self
                .shared
                .findings
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let mut m = std::collections::HashMap::new();
            for f in e.tracker.open.values() {
                *m.entry(f.job.clone()).or_insert(0) += 1;
            }
            m
        };
        for j in &mut jobs {
            j.open_findings = open.get(&j.job).copied().unwrap_or(0);
        }
        if fan_out {
            let mut known: std::collections::HashSet<String> =
                jobs.iter().map(|j| j.job.clone()).collect();
            for j in self.shared.peers.list_jobs(all).await {
                if known.insert(j.job.clone()) {
                    jobs.push(j);
                }
            }
        }
        jobs.sort_by(|a, b| a.job.cmp(&b.job));
        Ok(Response::new(JobList { jobs }))
    }

    async fn get_job(
        &self,
        request: Request<GetJobRequest>,
    ) -> Result<Response<JobDetail>, Status> {
        let fan_out = !crate::peers::is_local(&request) && !self.shared.peers.is_empty();
        let name = request.into_inner().job;
        let live = {
            let st = self.shared.state.of(&name);
            st.jobs.get(&name).map(detail)
        };
        // Not in this replica's memory: the replica that holds it live answers; one that
        // only knows it from disk answers when this one does not know it at all.
        let mut elsewhere = None;
        if live.is_none() && fan_out {
            elsewhere = self.shared.peers.get_job(&name).await;
            if let Some(d) =
                elsewhere.take_if(|d| d.summary.as_ref().is_some_and(|s| s.state == "running"))
            {
                return Ok(Response::new(d));
            }
        }
        match live.or_else(|| {
            self.shared.history.job(&name).map(|l| JobDetail {
                summary: Some(stored_summary(&l)),
                ..Default::default()
            })
        }) {
            Some(mut d) => {
                d.findings = crate::http::all_findings(&self.shared, Some(&name))
                    .iter()
                    .map(finding)
                    .collect();
                if let Some(s) = d.summary.as_mut() {
                    s.open_findings =
                        d.findings.iter().filter(|f| f.state == "open").count() as u32;
                }
                Ok(Response::new(d))
            }
            None => elsewhere.map(Response::new).ok_or_else(|| {
                Status::not_found(format!(
                    "no job {name:?} is known to this collector, in memory or on disk"
                ))
            }),
        }
    }

    async fn get_rank(
        &self,
        request: Request<GetRankRequest>,
    ) -> Result<Response<RankDetail>, Status> {
        let fan_out = !crate::peers::is_local(&request) && !self.shared.peers.is_empty();
        let req = request.into_inner();
        let here = self.shared.state.of(&req.job).jobs.contains_key(&req.job);
        if !here
            && fan_out
            && let Some(d) = self.shared.peers.get_rank(&req).await
        {
            return Ok(Response::new(d));
        }
        let st = self.shared.state.of(&req.job);
        let Some(j) = st.jobs.get(&req.job) else {
            return Err(Status::not_found(format!(
                "no job {:?} is in this collector's memory",
                req.job
            )));
        };
        // Several processes of one rank (a restart): the latest.
        let Some(r) = j
            .ranks
            .values()
            .filter(|r| r.rank == req.rank)
            .max_by_key(|r| r.last_seen_ns)
        else {
            return Err(Status::not_found(format!(
                "job {:?} has no rank {}",
                req.job, req.rank
            )));
        };
        let recent = r
            .recent
            .iter()
            .map(|c| RecentCall {
                comm_id: c.comm_id,
                seq: c.seq,
                op: Op::from_code(c.op).name().into(),
                bytes: c.bytes,
                duration_ns: c.duration_ns,
                end_ns: c.end_ns,
                peer: c.peer,
            })
            .collect();
        let health = j
            .detectors
            .health()
            .iter()
            .find(|h| h.rank == req.rank)
            .map(health);
        Ok(Response::new(RankDetail {
            state: Some(rank_state(r)),
            recent,
            in_flight: r.live_in_flight().iter().map(in_flight_call).collect(),
            health,
        }))
    }

    type WatchStream = ReceiverStream<Result<JobDetail, Status>>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let fan_out = !crate::peers::is_local(&request) && !self.shared.peers.is_empty();
        let req = request.into_inner();
        // One job another replica holds: its own watch, passed through.
        if fan_out
            && !req.job.is_empty()
            && !self.shared.state.of(&req.job).jobs.contains_key(&req.job)
            && let Some(url) = self.shared.peers.holder(&req.job).await
        {
            let mut upstream = self
                .shared
                .peers
                .watch(&url, req.clone())
                .await
                .map_err(Status::unavailable)?;
            let (tx, rx) = mpsc::channel(16);
            tokio::spawn(async move {
                loop {
                    let m = match upstream.message().await {
                        Ok(Some(d)) => Ok(d),
                        Ok(None) => return,
                        Err(e) => Err(e),
                    };
                    let end = m.is_err();
                    if tx.send(m).await.is_err() || end {
                        return;
                    }
                }
            });
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        let interval = Duration::from_millis(match req.interval_ms {
            0 => 1000,
            ms => u64::from(ms).max(100),
        });
        let (tx, rx) = mpsc::channel(16);
        // Every job: the other replicas' jobs too, from their own watches.
        if fan_out && req.job.is_empty() {
            for url in self.shared.peers.urls() {
                tokio::spawn(relay_peer(
                    self.shared.clone(),
                    url.clone(),
                    req.clone(),
                    tx.clone(),
                ));
            }
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            // Last sent (records, in-flight count, state) per job: send on change only.
            let mut last: std::collections::HashMap<String, (u64, usize, &'static str, u64)> =
                Default::default();
            loop {
                let updates: Vec<JobDetail> = {
                    let shards: Vec<_> = shared.state.iter().collect();
                    shards
                        .iter()
                        .flat_map(|st| st.jobs.values())
                        .filter(|j| req.job.is_empty() || j.job == req.job)
                        .filter_map(|j| {
                            let key = (
                                j.records,
                                j.in_flight().len(),
                                j.state_name(),
                                j.last_seen_ns,
                            );
                            if last.get(&j.job) == Some(&key) {
                                return None;
                            }
                            last.insert(j.job.clone(), key);
                            Some(detail(j))
                        })
                        .collect()
                };
                for mut u in updates {
                    with_findings(&shared, &mut u);
                    if tx.send(Ok(u)).await.is_err() {
                        return;
                    }
                }
                tokio::time::sleep(interval).await;
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn api(&self, request: Request<ApiRequest>) -> Result<Response<ApiResponse>, Status> {
        // Answered from this replica's jobs only, whoever asks.
        let path = request.into_inner().path;
        let (status, body) = crate::http::answer_local(self.shared.clone(), &path).await;
        Ok(Response::new(ApiResponse {
            status: u32::from(status),
            body,
        }))
    }
}

/// Another replica's watch of every job, relayed into `tx` until the client goes: its updates
/// of jobs this replica does not hold (a replica listed among its own peers relays nothing
/// twice). A replica that is away, or whose stream ends, is asked again every few seconds; the
/// client's watch goes on meanwhile with the others.
async fn relay_peer(
    shared: Arc<Shared>,
    url: String,
    req: WatchRequest,
    tx: mpsc::Sender<Result<JobDetail, Status>>,
) {
    const RETRY: Duration = Duration::from_secs(3);
    while !tx.is_closed() {
        match shared.peers.watch(&url, req.clone()).await {
            Ok(mut upstream) => loop {
                let m = tokio::select! {
                    m = upstream.message() => m,
                    () = tx.closed() => return,
                };
                let Ok(Some(d)) = m else { break };
                let job = d
                    .summary
                    .as_ref()
                    .map(|s| s.job.as_str())
                    .unwrap_or_default();
                if shared.state.of(job).jobs.contains_key(job) {
                    continue;
                }
                if tx.send(Ok(d)).await.is_err() {
                    return;
                }
            },
            Err(why) => shared.peers.failed(&url, &why),
        }
        tokio::select! {
            () = tokio::time::sleep(RETRY) => {}
            () = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use commscope_analyzer::finding::{Class, Finding, Kind, Link, State};

    #[test]
    fn a_findings_link_keeps_its_nic_and_port_in_the_proto() {
        let mut f = Finding {
            id: "x".into(),
            kind: Kind::LinkError,
            class: Class::CommunicationSlow,
            state: State::Open,
            job: "j".into(),
            comm: None,
            seq: None,
            ranks: vec![],
            nodes: vec!["n1".into()],
            link: Some(Link {
                src: "n1".into(),
                dst: "n2".into(),
                src_nic: Some("mlx5_0".into()),
                src_port: Some(1),
            }),
            opened_at: 1,
            resolved_at: None,
            confidence: 0.9,
            summary: "s".into(),
            evidence: serde_json::json!({}),
        };
        let p = super::finding(&f);
        assert_eq!((p.link_src.as_str(), p.link_dst.as_str()), ("n1", "n2"));
        assert_eq!(
            (p.link_src_nic.as_deref(), p.link_src_port),
            (Some("mlx5_0"), Some(1))
        );
        f.link = None;
        let p = super::finding(&f);
        assert_eq!((p.link_src.as_str(), p.link_src_nic), ("", None));
    }
}
