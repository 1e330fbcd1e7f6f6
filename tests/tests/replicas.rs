//! Two collector replicas and one agent, as real processes (docs/deploy.md, "Several
//! collectors"): the agent routes each job to one replica by rendezvous hashing of its id, and
//! a query to either replica answers for both. While one replica is down, jobs routed to the
//! other still flow (nothing waits behind the absent one), the absent one's jobs wait in the
//! spool and arrive, once and whole, when it is back; the replica that answers says which one
//! it could not ask.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use commscope_tests::services::{
    Service, addr_after, free_port, http_get, job_at, raw_records, run_with_agent,
};
use commscope_tests::{Flavour, assert_ok, build, commscope, launch, wait};
use commscope_wire::grpc::query_client::QueryClient;
use commscope_wire::grpc::{ListJobsRequest, WatchRequest};

struct Replica {
    url: String,
    grpc: SocketAddr,
    http: SocketAddr,
    dir: PathBuf,
    peers: String,
    svc: Option<Service>,
}

impl Replica {
    fn new(root: &Path, name: &str) -> Replica {
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        Replica {
            url: format!("http://{grpc}"),
            grpc,
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir: root.join(name),
            peers: String::new(),
            svc: None,
        }
    }

    fn start(&mut self) {
        let mut c: Command = commscope();
        c.arg("collector")
            .arg("--listen")
            .arg(self.grpc.to_string())
            .arg("--http")
            .arg(self.http.to_string())
            .arg("--trace-dir")
            .arg(&self.dir)
            .arg("--peers")
            .arg(&self.peers);
        let svc = Service::spawn(c, "collector");
        svc.wait_log("listening:", Duration::from_secs(30));
        self.http = addr_after(&svc.log(), "HTTP on ").expect("HTTP address");
        self.svc = Some(svc);
    }

    fn jobs(&self) -> serde_json::Value {
        let (st, body) = http_get(self.http, "/api/v1/jobs");
        assert_eq!(st, 200, "{body}");
        serde_json::from_str(&body).expect("JSON")
    }

    fn log(&self) -> String {
        self.svc.as_ref().map(Service::log).unwrap_or_default()
    }
}

fn names(list: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = list["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["job"].as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

/// The first job id of the form `replicas-N` that the list routes to replica `want`.
fn job_for(urls: &[&str], want: usize, skip: &[String]) -> String {
    (0..1000)
        .map(|i| format!("replicas-{i}"))
        .find(|j| !skip.contains(j) && commscope_wire::route::replica_of(j, urls) == Some(want))
        .expect("a job id for each replica")
}

/// Runs `f` with a query client of the replica at `addr`, on a runtime of its own.
fn with_query<T, F, Fut>(addr: SocketAddr, f: F) -> T
where
    F: FnOnce(QueryClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let c = QueryClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        f(c).await
    })
}

fn list_jobs_grpc(addr: SocketAddr) -> Vec<String> {
    with_query(addr, |mut c| async move {
        let mut v: Vec<String> = c
            .list_jobs(ListJobsRequest {
                include_ended: true,
            })
            .await
            .expect("ListJobs")
            .into_inner()
            .jobs
            .into_iter()
            .map(|j| j.job)
            .collect();
        v.sort();
        v
    })
}

/// A watch of every job on the replica at `addr` for `secs`: how many updates came per job.
fn watch_all(addr: SocketAddr, secs: u64) -> std::collections::BTreeMap<String, usize> {
    with_query(addr, |mut c| async move {
        let mut s = c
            .watch(WatchRequest {
                job: String::new(),
                interval_ms: 100,
            })
            .await
            .expect("Watch")
            .into_inner();
        let mut seen = std::collections::BTreeMap::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(secs);
        while let Ok(Ok(Some(d))) = tokio::time::timeout_at(until, s.message()).await {
            let job = d.summary.map(|j| j.job).unwrap_or_default();
            *seen.entry(job).or_insert(0) += 1;
        }
        seen
    })
}

/// Every record of every rank of `job` is in `dir` exactly once (ranks 0 and 1 of `basic`).
fn whole_once(dir: &Path, job: &str) {
    let raw = raw_records(&dir.join(job));
    let ranks: Vec<_> = raw
        .iter()
        .filter(|(_, (_, recs))| {
            recs.iter()
                .any(|r| matches!(r, commscope_wire::record::Record::Call(_)))
        })
        .collect();
    assert_eq!(ranks.len(), 2, "job {job}: two ranks' calls expected");
    for (proc, (seqs, _)) in &raw {
        let twice: Vec<_> = seqs.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "job {job} {proc:?}: stored twice {twice:?}"
        );
        let (lo, hi) = (
            *seqs.keys().next().expect("records"),
            *seqs.keys().last().expect("records"),
        );
        assert_eq!(
            seqs.len() as u64,
            hi - lo + 1,
            "job {job} {proc:?}: records missing between {lo} and {hi}"
        );
    }
}

#[test]
fn jobs_are_spread_over_two_replicas_and_either_answers_for_both() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut a = Replica::new(tmp.path(), "a");
    let mut b = Replica::new(tmp.path(), "b");
    // Each lists both, itself included (the StatefulSet way: the same list everywhere).
    let list = format!("{},{}", a.url, b.url);
    a.peers.clone_from(&list);
    b.peers.clone_from(&list);
    a.start();
    b.start();
    let socket = tmp.path().join("agent.sock");
    let mut ac = commscope();
    ac.arg("agent")
        .arg("--collector")
        .arg(&list)
        .arg("--socket")
        .arg(&socket)
        .arg("--node")
        .arg("node-r")
        .arg("--http")
        .arg("127.0.0.1:0")
        .arg("--spool-dir")
        .arg(tmp.path().join("spool"))
        .arg("--spool-after")
        .arg("500ms");
    let agent = Service::spawn(ac, "agent");
    agent.wait_log("registrations on", Duration::from_secs(30));

    let urls = [a.url.as_str(), b.url.as_str()];
    let job_a = job_for(&urls, 0, &[]);
    let job_b = job_for(&urls, 1, &[]);
    let prog = build(Flavour::Mpich, "basic");
    let cmd = launch(Flavour::Mpich, 2, &prog, &["50"]);
    for job in [&job_a, &job_b] {
        assert_ok(&run_with_agent(&socket, job, &cmd, &[]), job);
    }
    let ended = |r: &Replica, job: &str| job_at(r.http, job).filter(|j| j["state"] == "ended");
    wait(
        "both jobs ended, each on its replica",
        Duration::from_secs(60),
        || (ended(&a, &job_a).is_some() && ended(&b, &job_b).is_some()).then_some(()),
    );
    // Each job's records went to its replica only.
    assert!(
        a.dir.join(&job_a).is_dir() && !b.dir.join(&job_a).exists(),
        "{job_a} on a only"
    );
    assert!(
        b.dir.join(&job_b).is_dir() && !a.dir.join(&job_b).exists(),
        "{job_b} on b only"
    );

    // Either replica answers for both: the list (HTTP and the query service) and each job.
    let both = {
        let mut v = vec![job_a.clone(), job_b.clone()];
        v.sort();
        v
    };
    for r in [&a, &b] {
        let list = r.jobs();
        assert_eq!(names(&list), both, "{}: {list}", r.url);
        assert_eq!(list["unreachable"], serde_json::json!([]), "{list}");
        assert_eq!(list_jobs_grpc(r.grpc), both, "{} query service", r.url);
    }
    let from_a = job_at(a.http, &job_b).expect("a answers for b's job");
    let from_b = job_at(b.http, &job_b).expect("b's own job");
    assert_eq!(
        from_a["records"], from_b["records"],
        "the same job, whoever is asked"
    );
    assert_eq!(from_a["ranks"], from_b["ranks"]);
    assert_eq!(http_get(a.http, "/api/v1/jobs/no-such-job").0, 404);
    // A watch of every job, on either replica, follows both, each once (nothing changes now:
    // one update per job, none relayed twice through a replica's own entry in its peers).
    for r in [&a, &b] {
        let seen = watch_all(r.grpc, 3);
        let expect: std::collections::BTreeMap<String, usize> =
            both.iter().map(|j| (j.clone(), 1)).collect();
        assert_eq!(seen, expect, "{} watch of every job", r.url);
    }

    // Replica b goes away: a still answers, for its own jobs, and says whom it could not ask.
    if let Some(s) = b.svc.as_mut() {
        s.kill9();
    }
    let list = a.jobs();
    assert_eq!(names(&list), vec![job_a.clone()], "{list}");
    let gone = list["unreachable"].as_array().expect("unreachable");
    assert_eq!(gone.len(), 1, "{list}");
    assert_eq!(gone[0]["replica"], b.url.as_str());

    // Meanwhile a job for a flows at once; one for b waits in the spool.
    let job_a2 = job_for(&urls, 0, std::slice::from_ref(&job_a));
    let job_b2 = job_for(&urls, 1, std::slice::from_ref(&job_b));
    assert_ok(&run_with_agent(&socket, &job_b2, &cmd, &[]), &job_b2);
    assert_ok(&run_with_agent(&socket, &job_a2, &cmd, &[]), &job_a2);
    wait(
        "the job for a ended while b is down",
        Duration::from_secs(30),
        || ended(&a, &job_a2),
    );
    assert!(!a.dir.join(&job_b2).exists(), "b's job must not go to a");
    let agent_http = addr_after(&agent.log(), "metrics on ").expect("agent HTTP");
    wait("b's job in the spool", Duration::from_secs(30), || {
        let (_, m) = http_get(agent_http, "/metrics");
        m.lines()
            .find(|l| l.starts_with("commscope_agent_records_spooled_total"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| *v > 0.0)
    });

    // b is back: its job arrives from the spool, whole and once.
    b.http = SocketAddr::from(([127, 0, 0, 1], 0));
    b.start();
    wait(
        "b's job arrived after b came back",
        Duration::from_secs(60),
        || ended(&b, &job_b2),
    );
    for (r, job) in [(&a, &job_a), (&b, &job_b), (&a, &job_a2), (&b, &job_b2)] {
        whole_once(&r.dir, job);
    }
    let list = a.jobs();
    assert_eq!(
        names(&list).len(),
        4,
        "{list}\n--- a\n{}\n--- b\n{}",
        a.log(),
        b.log()
    );
}
