//! The live source: a thread with its own runtime polls the collector's Query service once a
//! second (the job list, the job the views show, the rank they show) and keeps the newest
//! snapshot for the UI, which never waits on the network.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use commscope_wire::grpc::query_client::QueryClient;
use commscope_wire::grpc::{GetJobRequest, GetRankRequest, ListJobsRequest};
use tonic::transport::{Channel, Endpoint};

use crate::source::{Snapshot, Source};

/// How often the collector is asked.
pub const POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Shared {
    want: (Option<String>, Option<i32>),
    /// Bumped when `want` changes: the poller asks again at once.
    want_gen: u64,
    latest: Option<Snapshot>,
    stop: bool,
}

/// A collector's Query service.
#[derive(Debug)]
pub struct Live {
    url: String,
    shared: Arc<(Mutex<Shared>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Live {
    /// Starts polling `url` (the collector's `--listen` address, `http://host:port`).
    pub fn connect(
        url: &str,
        token: Option<commscope_wire::auth::Token>,
        tls: commscope_wire::tls::TlsFiles,
    ) -> Result<Live> {
        let url = if url.contains("://") {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        let endpoint = Endpoint::from_shared(url.clone())
            .with_context(|| format!("--collector {url}: not a URL"))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5));
        let endpoint = tls.endpoint(endpoint, &url).map_err(anyhow::Error::msg)?;
        let shared = Arc::new((Mutex::new(Shared::default()), std::sync::Condvar::new()));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("commscope-tui-poll".into())
            .spawn(move || poll_loop(endpoint, token, s))
            .context("cannot start the polling thread")?;
        Ok(Live {
            url,
            shared,
            thread: Some(thread),
        })
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        {
            let mut g = self.shared.0.lock().unwrap_or_else(|p| p.into_inner());
            g.stop = true;
        }
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Source for Live {
    fn want(&mut self, job: Option<&str>, rank: Option<i32>) {
        let want = (job.map(str::to_owned), rank);
        let mut g = self.shared.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.want != want {
            g.want = want;
            g.want_gen += 1;
            drop(g);
            self.shared.1.notify_all();
        }
    }

    fn latest(&mut self) -> Option<Snapshot> {
        self.shared
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .latest
            .take()
    }

    fn label(&self) -> String {
        format!("collector {}", self.url)
    }
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The Query client, with the collector's token on every request.
type Client = QueryClient<
    tonic::service::interceptor::InterceptedService<
        Channel,
        Box<
            dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>
                + Send
                + Sync,
        >,
    >,
>;

fn poll_loop(
    endpoint: Endpoint,
    token: Option<commscope_wire::auth::Token>,
    shared: Arc<(Mutex<Shared>, std::sync::Condvar)>,
) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let mut client: Option<Client> = None;
    loop {
        let (want, generation) = {
            let g = shared.0.lock().unwrap_or_else(|p| p.into_inner());
            if g.stop {
                return;
            }
            (g.want.clone(), g.want_gen)
        };
        let snap = rt.block_on(fetch(&endpoint, &token, &mut client, &want));
        let (lock, cv) = &*shared;
        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
        g.latest = Some(snap);
        // Sleep until the next poll, a new want, or the end.
        let deadline = std::time::Instant::now() + POLL;
        while !g.stop && g.want_gen == generation {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            g = cv
                .wait_timeout(g, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

async fn fetch(
    endpoint: &Endpoint,
    token: &Option<commscope_wire::auth::Token>,
    client: &mut Option<Client>,
    want: &(Option<String>, Option<i32>),
) -> Snapshot {
    let mut snap = Snapshot {
        clock_s: now_s(),
        ..Default::default()
    };
    if client.is_none() {
        match endpoint.connect().await {
            Ok(ch) => {
                let add = commscope_wire::auth::Token::interceptor(token.clone());
                *client = Some(QueryClient::with_interceptor(ch, Box::new(add)));
            }
            Err(e) => {
                snap.error = Some(format!(
                    "collector {} unreachable: {e}; retrying every second",
                    endpoint.uri()
                ));
                return snap;
            }
        }
    }
    let Some(c) = client.as_mut() else {
        return snap;
    };
    match c
        .list_jobs(ListJobsRequest {
            include_ended: true,
        })
        .await
    {
        Ok(r) => snap.jobs = r.into_inner().jobs,
        Err(e) => {
            snap.error = Some(format!("listing jobs: {}", e.message()));
            *client = None;
            return snap;
        }
    }
    if let Some(job) = &want.0 {
        match c.get_job(GetJobRequest { job: job.clone() }).await {
            Ok(r) => snap.job = Some(r.into_inner()),
            Err(e) => snap.error = Some(format!("job {job}: {}", e.message())),
        }
        if let Some(rank) = want.1 {
            match c
                .get_rank(GetRankRequest {
                    job: job.clone(),
                    rank,
                })
                .await
            {
                Ok(r) => snap.rank = Some(r.into_inner()),
                Err(e) => snap.error = Some(format!("rank {rank}: {}", e.message())),
            }
        }
    }
    snap
}
