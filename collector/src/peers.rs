//! The other replicas (`collector --peers URL,…`): agents route each job to one replica
//! ([`commscope_wire::route`]), and a query to any replica answers for every job by asking the
//! others through their query service. A request between replicas carries
//! [`LOCAL`]` = 1`: the replica answers from its own jobs and asks no one further, so
//! requests never loop (a replica listed among its own peers only answers twice, and the
//! merge keeps one).
//!
//! A replica that does not answer within [`TIMEOUT`] is left out of the answer, which says so
//! (`unreachable` in the JSON API; a warning in the log, once a minute per replica).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use commscope_wire::grpc::query_client::QueryClient;
use commscope_wire::grpc::{
    ApiRequest, GetJobRequest, GetRankRequest, JobDetail, JobSummary, ListJobsRequest, RankDetail,
    WatchRequest,
};
use tonic::transport::Channel;

/// The metadata key that marks a request between replicas.
pub const LOCAL: &str = "x-commscope-local";

/// How long a replica has to answer.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Whether a gRPC request came from another replica (answer from this one's jobs only).
pub fn is_local<T>(req: &tonic::Request<T>) -> bool {
    req.metadata().get(LOCAL).is_some()
}

/// The other replicas.
#[derive(Debug)]
pub struct Peers {
    urls: Vec<String>,
    token: Option<commscope_wire::auth::Token>,
    tls: commscope_wire::tls::TlsFiles,
    channels: Mutex<HashMap<String, Channel>>,
    /// Per replica: when its failure was last logged.
    logged: Mutex<HashMap<String, Instant>>,
}

impl Peers {
    pub fn new(
        urls: Vec<String>,
        token: Option<commscope_wire::auth::Token>,
        tls: commscope_wire::tls::TlsFiles,
    ) -> Peers {
        Peers {
            urls,
            token,
            tls,
            channels: Mutex::default(),
            logged: Mutex::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    fn client(&self, url: &str) -> Result<QueryClient<Channel>, String> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(url) {
            return Ok(QueryClient::new(c.clone()).max_decoding_message_size(64 << 20));
        }
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(|e| format!("bad peer address {url}: {e}"))?
            .connect_timeout(Duration::from_secs(2));
        let endpoint = self.tls.endpoint(endpoint, url)?;
        let channel = endpoint.connect_lazy();
        channels.insert(url.to_owned(), channel.clone());
        Ok(QueryClient::new(channel).max_decoding_message_size(64 << 20))
    }

    /// A request to another replica: marked local, with the token.
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut()
            .insert(LOCAL, tonic::metadata::MetadataValue::from_static("1"));
        if let Some(t) = &self.token
            && let Ok(v) = tonic::metadata::MetadataValue::try_from(t.header_value())
        {
            r.metadata_mut().insert("authorization", v);
        }
        r
    }

    /// Logs that the replica at `url` did not answer (once a minute per replica).
    pub fn failed(&self, url: &str, why: &str) {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let due = logged
            .get(url)
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
        if due {
            logged.insert(url.to_owned(), Instant::now());
            tracing::warn!(
                "the replica at {url} did not answer ({why}); answers leave its jobs out until it does"
            );
        }
    }

    /// Asks every replica at once; per replica its answer or why there is none.
    async fn each<T, F, Fut>(&self, ask: F) -> Vec<(String, Result<T, String>)>
    where
        F: Fn(QueryClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let asks = self.urls.iter().map(|url| {
            let client = self.client(url);
            let ask = &ask;
            async move {
                let r = match client {
                    Ok(c) => match tokio::time::timeout(TIMEOUT, ask(c)).await {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(s)) => Err(s),
                        Err(_) => Err(tonic::Status::deadline_exceeded("no answer in time")),
                    },
                    Err(e) => Err(tonic::Status::invalid_argument(e)),
                };
                (url.clone(), r)
            }
        });
        let answers = futures::future::join_all(asks).await;
        answers
            .into_iter()
            .map(|(url, r)| {
                let r = r.map_err(|s| {
                    if s.code() == tonic::Code::NotFound {
                        s.message().to_owned()
                    } else {
                        let why = s.message().to_owned();
                        self.failed(&url, &why);
                        why
                    }
                });
                (url, r)
            })
            .collect()
    }

    /// Every replica's JSON API answer to `path` (from its own jobs).
    pub async fn api(&self, path: &str) -> Vec<(String, Result<serde_json::Value, String>)> {
        self.each(|mut c| {
            let req = self.request(ApiRequest {
                path: path.to_owned(),
            });
            async move {
                let r = c.api(req).await?.into_inner();
                if r.status != 200 {
                    return Err(tonic::Status::not_found(format!(
                        "HTTP status {}",
                        r.status
                    )));
                }
                serde_json::from_slice(&r.body)
                    .map_err(|e| tonic::Status::internal(format!("not JSON: {e}")))
            }
        })
        .await
    }

    /// Every replica's jobs.
    pub async fn list_jobs(&self, include_ended: bool) -> Vec<JobSummary> {
        self.each(|mut c| {
            let req = self.request(ListJobsRequest { include_ended });
            async move { Ok(c.list_jobs(req).await?.into_inner().jobs) }
        })
        .await
        .into_iter()
        .filter_map(|(_, r)| r.ok())
        .flatten()
        .collect()
    }

    /// The job from the first replica that knows it.
    pub async fn get_job(&self, job: &str) -> Option<JobDetail> {
        self.each(|mut c| {
            let req = self.request(GetJobRequest {
                job: job.to_owned(),
            });
            async move { Ok(c.get_job(req).await?.into_inner()) }
        })
        .await
        .into_iter()
        .find_map(|(_, r)| r.ok())
    }

    /// A rank from the first replica that holds its job.
    pub async fn get_rank(&self, req: &GetRankRequest) -> Option<RankDetail> {
        self.each(|mut c| {
            let req = self.request(req.clone());
            async move { Ok(c.get_rank(req).await?.into_inner()) }
        })
        .await
        .into_iter()
        .find_map(|(_, r)| r.ok())
    }

    /// The replica that holds `job` in memory (its URL), when one does.
    pub async fn holder(&self, job: &str) -> Option<String> {
        self.each(|mut c| {
            let req = self.request(ListJobsRequest {
                include_ended: false,
            });
            let job = job.to_owned();
            async move {
                let jobs = c.list_jobs(req).await?.into_inner().jobs;
                Ok(jobs.iter().any(|j| j.job == job))
            }
        })
        .await
        .into_iter()
        .find(|(_, r)| matches!(r, Ok(true)))
        .map(|(url, _)| url)
    }

    /// Watches `job` (every job: empty) on the replica at `url`, from its own jobs.
    pub async fn watch(
        &self,
        url: &str,
        req: WatchRequest,
    ) -> Result<tonic::Streaming<JobDetail>, String> {
        let mut c = self.client(url)?;
        let req = self.request(req);
        c.watch(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| s.message().to_owned())
    }
}
