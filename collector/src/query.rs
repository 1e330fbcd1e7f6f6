//! The gRPC query service (`commscope.v1.Query`): what the TUI shows, on `--listen`.

use std::sync::Arc;
use std::time::Duration;

use commscope_wire::grpc::query_server::Query;
use commscope_wire::grpc::{
    CommState, GetJobRequest, InFlightCall, JobDetail, JobList, JobSummary, ListJobsRequest,
    RankState, WatchRequest,
};
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
    }
}

/// The proto detail of a job.
pub fn detail(j: &JobState) -> JobDetail {
    let mut ranks: Vec<RankState> = j
        .ranks
        .values()
        .map(|r| RankState {
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
        })
        .collect();
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
    let in_flight = j
        .in_flight()
        .into_iter()
        .map(|c| InFlightCall {
            rank: c.rank,
            comm_id: c.comm_id,
            seq: c.seq,
            op: c.op,
            age_ns: (c.for_s * 1e9) as u64,
            bytes: c.bytes,
            peer: c.peer,
        })
        .collect();
    JobDetail {
        summary: Some(summary(j)),
        ranks,
        comms,
        in_flight,
    }
}

#[tonic::async_trait]
impl Query for QueryService {
    async fn list_jobs(
        &self,
        request: Request<ListJobsRequest>,
    ) -> Result<Response<JobList>, Status> {
        let all = request.into_inner().include_ended;
        let live: std::collections::HashMap<String, JobSummary> = {
            let st = self.shared.lock_state();
            st.jobs
                .values()
                .map(|j| (j.job.clone(), summary(j)))
                .collect()
        };
        let mut jobs: Vec<JobSummary> = crate::http::all_jobs(&self.shared)
            .into_iter()
            .map(|l| match live.get(&l.job) {
                Some(s) => s.clone(),
                None => stored_summary(&l),
            })
            .filter(|s| all || s.state == "running")
            .collect();
        jobs.sort_by(|a, b| a.job.cmp(&b.job));
        Ok(Response::new(JobList { jobs }))
    }

    async fn get_job(
        &self,
        request: Request<GetJobRequest>,
    ) -> Result<Response<JobDetail>, Status> {
        let name = request.into_inner().job;
        let live = {
            let st = self.shared.lock_state();
            st.jobs.get(&name).map(detail)
        };
        match live.or_else(|| {
            self.shared.history.job(&name).map(|l| JobDetail {
                summary: Some(stored_summary(&l)),
                ..Default::default()
            })
        }) {
            Some(d) => Ok(Response::new(d)),
            None => Err(Status::not_found(format!(
                "no job {name:?} is known to this collector, in memory or on disk"
            ))),
        }
    }

    type WatchStream = ReceiverStream<Result<JobDetail, Status>>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let req = request.into_inner();
        let interval = Duration::from_millis(match req.interval_ms {
            0 => 1000,
            ms => u64::from(ms).max(100),
        });
        let (tx, rx) = mpsc::channel(16);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            // Last sent (records, in-flight count, state) per job: send on change only.
            let mut last: std::collections::HashMap<String, (u64, usize, &'static str, u64)> =
                Default::default();
            loop {
                let updates: Vec<JobDetail> = {
                    let st = shared.lock_state();
                    st.jobs
                        .values()
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
                for u in updates {
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
}
