//! What the collector serves while jobs run: jobs kept apart, a process that dies inside a
//! collective, the JSON API, the gRPC query service, and real Prometheus scraping both services.

use std::process::Command;
use std::time::{Duration, Instant};

use commscope_tests::prometheus::Prometheus;
use commscope_tests::services::{Services, http_get, metric, run_with_agent};
use commscope_tests::{Flavour, assert_ok, build, launch, load_job, wait};
use commscope_wire::grpc::query_client::QueryClient;
use commscope_wire::grpc::{GetJobRequest, ListJobsRequest, WatchRequest};
use commscope_wire::op::Op;
use commscope_wire::record::Record;

/// Whether exactly three ranks of the `hang` program sit in flight, all in the world all-reduce at
/// seq 10 (the one its hanging rank never enters).
fn in_hung_allreduce(job: &serde_json::Value) -> bool {
    let Some(infl) = job["in_flight"].as_array() else {
        return false;
    };
    infl.len() == 3
        && infl
            .iter()
            .all(|c| c["op"] == "allreduce" && c["seq"] == 10)
}

#[test]
fn concurrent_jobs_are_kept_apart_and_a_rank_killed_mid_collective_is_reported() {
    let svc = Services::start("node-c", &[], &[]);
    let steady = build(Flavour::OpenMpi, "steady");
    let hang = build(Flavour::OpenMpi, "hang");
    let socket = svc.socket.clone();
    let a_cmd = launch(Flavour::OpenMpi, 4, &steady, &["4", "2000"]);
    let a = std::thread::spawn(move || run_with_agent(&socket, "job-a", &a_cmd, &[]));
    let socket = svc.socket.clone();
    let b_cmd = launch(Flavour::OpenMpi, 4, &hang, &["2"]);
    let b = std::thread::spawn(move || run_with_agent(&socket, "job-b", &b_cmd, &[]));

    // Job b: ranks 0, 1, 3 wait in an all-reduce for rank 2, which sleeps; then rank 2 dies.
    // A rank that starts late holds the others in an earlier all-reduce for a moment: wait for the
    // 11th world all-reduce (seq 10), the one rank 2 never enters.
    let stuck = wait("job-b's ranks in flight", Duration::from_secs(60), || {
        let j = svc.job("job-b")?;
        in_hung_allreduce(&j).then(|| j.clone())
    });
    let ranks: Vec<u64> = stuck["in_flight"]
        .as_array()
        .expect("in flight")
        .iter()
        .map(|c| {
            assert_eq!(c["op"], "allreduce", "{c}");
            c["rank"].as_u64().expect("rank")
        })
        .collect();
    assert_eq!(ranks, [0, 1, 3]);
    let victim = stuck["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["rank"] == 2)
        .and_then(|p| p["pid"].as_u64())
        .expect("rank 2's pid") as i32;
    // SAFETY: signalling a process of the test's own job.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let dead = wait("rank 2 reported killed", Duration::from_secs(20), || {
        let j = svc.job("job-b")?;
        let p = j["processes"]
            .as_array()?
            .iter()
            .find(|p| p["rank"] == 2)?
            .clone();
        (p["state"] == "killed" || p["state"] == "exited").then_some(p)
    });
    if svc.exit_statuses_known() {
        assert_eq!(dead["state"], "killed", "{dead}");
        assert_eq!(dead["signal"], 9, "{dead}");
    }
    assert_eq!(dead["finalized"], false);
    let (_, jobs) = svc.get("/api/v1/jobs?state=running");
    assert!(jobs.contains("\"job-b\""), "{jobs}");

    // Job a ran beside it, complete and on its own.
    let out_a = a.join().expect("job a");
    assert_ok(&out_a, "job a");
    let steps: u64 = String::from_utf8_lossy(&out_a.stdout)
        .lines()
        .find_map(|l| l.split_whitespace().nth(2)?.parse().ok())
        .expect("steps");
    let ja = svc.wait_job_ended("job-a", Duration::from_secs(60));
    assert_eq!(ja["ranks"], 4);
    let world = &ja["comms"].as_array().expect("comms")[0];
    assert_eq!(world["ops"]["allreduce"], 4 * steps, "{world}");
    assert_eq!(world["ops"]["sendrecv"], 4 * steps, "{world}");
    svc.wait_segments("job-a", Duration::from_secs(30));
    let trace_a = load_job(&svc.trace_dir().join("job-a"));
    assert_eq!(trace_a.processes.len(), 4);
    for p in &trace_a.processes {
        assert_eq!(p.header.job, "job-a");
        let n = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Call(c) if c.op() == Op::Allreduce))
            .count() as u64;
        assert_eq!(n, steps);
    }

    // End job b: the launcher goes down with its ranks.
    let _ = Command::new("pkill")
        .args(["-9", "-f", hang.to_str().expect("utf-8")])
        .status();
    let _ = b.join();
    let jb = svc.wait_job_ended("job-b", Duration::from_secs(60));
    assert_eq!(jb["ranks"], 4);
    let trace_b = load_job(&svc.trace_dir().join("job-b"));
    assert!(trace_b.processes.iter().all(|p| p.header.job == "job-b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_service_lists_details_and_streams_jobs() {
    let svc = Services::start("node-q", &[], &[]);
    let basic = build(Flavour::Mpich, "basic");
    let socket = svc.socket.clone();
    let cmd = launch(Flavour::Mpich, 4, &basic, &["50"]);
    let mut client = QueryClient::connect(format!("http://{}", svc.grpc))
        .await
        .expect("connect");
    let mut watch = client
        .watch(WatchRequest {
            job: "q-job".into(),
            interval_ms: 100,
        })
        .await
        .expect("watch")
        .into_inner();
    let out = tokio::task::spawn_blocking(move || run_with_agent(&socket, "q-job", &cmd, &[]))
        .await
        .expect("job");
    assert_ok(&out, "job");
    // The stream shows the job until it ended.
    let mut last = None;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        let Ok(Some(d)) = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("an update within 10 s")
        else {
            break;
        };
        let ended = d.summary.as_ref().is_some_and(|s| s.state == "ended");
        last = Some(d);
        if ended {
            break;
        }
    }
    let last = last.expect("updates");
    let s = last.summary.as_ref().expect("summary");
    assert_eq!(s.state, "ended");
    assert_eq!(s.ranks, 4);
    assert_eq!(last.ranks.len(), 4);
    assert!(
        last.ranks
            .iter()
            .all(|r| r.state == "exited" && r.node == "node-q")
    );
    let world = last
        .comms
        .iter()
        .find(|c| c.name == "MPI_COMM_WORLD")
        .expect("world");
    assert_eq!(world.members, [0, 1, 2, 3]);
    assert_eq!(world.progress, [50, 50, 50, 50], "50 all-reduces each");

    let list = client
        .list_jobs(ListJobsRequest {
            include_ended: true,
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(list.jobs.len(), 1);
    assert_eq!(list.jobs[0].job, "q-job");
    let running = client
        .list_jobs(ListJobsRequest {
            include_ended: false,
        })
        .await
        .expect("list")
        .into_inner();
    assert!(running.jobs.is_empty());
    let d = client
        .get_job(GetJobRequest {
            job: "q-job".into(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(d.summary.expect("summary").records, s.records);
    let missing = client
        .get_job(GetJobRequest {
            job: "no-such-job".into(),
        })
        .await
        .expect_err("unknown job");
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

/// Runs the `basic` program (Open MPI, `ranks` ranks, `iters` all-reduces each) through the
/// services' agent as `job`; the job's detail once the collector has it ended.
fn run_basic(svc: &Services, job: &str, ranks: u32, iters: &str) -> serde_json::Value {
    let basic = build(Flavour::OpenMpi, "basic");
    let out = run_with_agent(
        &svc.socket,
        job,
        &launch(Flavour::OpenMpi, ranks, &basic, &[iters]),
        &[],
    );
    assert_ok(&out, "job");
    svc.wait_job_ended(job, Duration::from_secs(60))
}

/// Real Prometheus (the Debian package), started on loopback, scrapes the collector and the
/// agent; the stored series agree with what the job did.
#[test]
fn prometheus_scrapes_the_collector_and_the_agent() {
    let svc = Services::start("node-p", &[], &[]);
    let prom = Prometheus::start(
        &svc.dir.path().join("prometheus"),
        svc.http,
        svc.agent_http,
        &[],
    );

    let api = run_basic(&svc, "prom-job", 4, "100");
    let records = api["records"].as_u64().expect("records");
    let query = |q: &str| prom.sum(q);
    // Wait until Prometheus has scraped the final values.
    wait(
        "Prometheus to store the job's series",
        Duration::from_secs(60),
        || {
            (query("commscope_job_records_total{job_id=\"prom-job\"}")? == records as f64)
                .then_some(())
        },
    );
    assert_eq!(
        query("commscope_collective_calls_total{job_id=\"prom-job\",op=\"allreduce\"}"),
        Some(400.0),
        "4 ranks x 100 all-reduces"
    );
    assert_eq!(query("commscope_job_ranks{job_id=\"prom-job\"}"), Some(4.0));
    let acked = wait(
        "the agent's acknowledged records",
        Duration::from_secs(30),
        || {
            let v = query("commscope_agent_records_acked_total{node=\"node-p\"}")?;
            (v == records as f64).then_some(v)
        },
    );
    assert_eq!(acked, records as f64);
    assert_eq!(
        query("commscope_agent_collector_connected{node=\"node-p\"}"),
        Some(1.0)
    );
    // The node's clock alignment comes with every batch: the agent has it from the hello's answer.
    let err = wait("the node's clock error", Duration::from_secs(30), || {
        query("commscope_node_clock_error_seconds{node=\"node-p\"}")
    });
    assert!(err > 0.0 && err < 0.05, "clock error on loopback: {err} s");
    let hist = query(
        "sum(commscope_collective_duration_seconds_count{job_id=\"prom-job\",op=\"allreduce\"})",
    );
    assert_eq!(hist, Some(400.0));
}

/// The agent knows its clock against the collector's from the hello's answer, before it sends
/// any record: a short job whose records all go in the stream's first batches (sent together,
/// before any acknowledgement) still carries the node's alignment.
#[test]
fn the_nodes_clock_is_known_from_the_hello_and_a_short_job_carries_it() {
    let svc = Services::start("node-c", &[], &[]);
    let (_, body) = wait(
        "the agent's clock estimate, with no record sent",
        Duration::from_secs(10),
        || {
            let (code, body) = http_get(svc.agent_http, "/metrics");
            (code == 200 && body.contains("commscope_agent_clock_error_seconds{"))
                .then_some((code, body))
        },
    );
    assert_eq!(
        metric(svc.agent_http, "commscope_agent_batches_sent_total"),
        0.0,
        "{body}"
    );
    let err = metric(svc.agent_http, "commscope_agent_clock_error_seconds");
    assert!(err > 0.0 && err < 0.05, "clock error on loopback: {err} s");
    let j = run_basic(&svc, "short-job", 2, "1");
    let procs = j["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 2, "{j:#}");
    for p in procs {
        let err = p["clock_error_ns"].as_u64();
        assert!(
            err.is_some_and(|e| e < 50_000_000),
            "rank {} without the node's clock (error {err:?} ns): {p:#}",
            p["rank"]
        );
    }
}

#[test]
fn a_live_hang_is_found_within_ten_seconds_and_resolves_when_the_job_ends() {
    let svc = Services::start("node-h", &[], &[]);
    let hang = build(Flavour::Mpich, "hang");
    let socket = svc.socket.clone();
    let cmd = launch(Flavour::Mpich, 4, &hang, &["2"]);
    let job = std::thread::spawn(move || run_with_agent(&socket, "live-hang", &cmd, &[]));
    // The hang begins when the three others are in the all-reduce.
    wait("three ranks in flight", Duration::from_secs(60), || {
        let j = svc.job("live-hang")?;
        in_hung_allreduce(&j).then_some(())
    });
    let began = Instant::now();
    let finding = wait("the hang finding", Duration::from_secs(20), || {
        let (_, body) = svc.get("/api/v1/findings?job=live-hang&state=open");
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["findings"].as_array()?.first().cloned()
    });
    let latency = began.elapsed();
    assert!(
        latency <= Duration::from_secs(10),
        "named after {latency:?}"
    );
    assert_eq!(finding["kind"], "hang", "{finding}");
    assert_eq!(finding["ranks"], serde_json::json!([2]));
    assert_eq!(finding["class"], "non-communication-hang");
    // A victim is a rank that has waited past the hang floor: on a loaded machine one that
    // entered a moment after the first crosses it an evaluation (a second) later.
    let id = finding["id"].as_str().expect("id").to_owned();
    let finding = wait("every victim named", Duration::from_secs(5), || {
        let (_, body) = svc.get("/api/v1/findings?job=live-hang&state=open");
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["findings"]
            .as_array()?
            .iter()
            .find(|f| {
                f["id"] == id.as_str()
                    && f["evidence"]["victims"]
                        .as_array()
                        .is_some_and(|v| v.len() == 3)
            })
            .cloned()
    });
    assert_eq!(finding["evidence"]["victims"], serde_json::json!([0, 1, 3]));
    let summary = finding["summary"].as_str().expect("summary");
    assert!(
        summary.starts_with("rank 2 on node-h has not entered allreduce #10"),
        "{summary}"
    );
    let (_, m) = svc.get("/metrics");
    assert!(
        m.contains("commscope_findings_open{job_id=\"live-hang\",kind=\"hang\"} 1"),
        "{m}"
    );
    let _ = Command::new("pkill")
        .args(["-9", "-f", hang.to_str().expect("utf-8")])
        .status();
    let _ = job.join();
    wait("the hang resolved", Duration::from_secs(30), || {
        let (_, body) = svc.get("/api/v1/findings?job=live-hang&state=resolved");
        body.contains(finding["id"].as_str()?).then_some(())
    });
    // The log line follows the state change the API shows (moments later).
    let collector = svc.collector.as_ref().expect("collector");
    collector.wait_log("resolved: live-hang hang of rank 2", Duration::from_secs(5));
    let log = collector.log();
    assert!(log.contains("opened: live-hang hang: rank 2"), "{log}");
}

/// Whether the collector's `agent_connected` gauge of `node` reads `v`.
fn agent_connected(s: &Services, node: &str, v: u8) -> bool {
    let (_, body) = s.get("/metrics");
    body.lines()
        .any(|l| l == format!("commscope_collector_agent_connected{{node=\"{node}\"}} {v}"))
}

/// An agent that closes its stream with no job running on its node (a node drained, a fleet
/// done) leaves nobody out of contact: the collector says so in a line of information, with no
/// warning that ranks are out of contact.
#[test]
fn an_agent_leaving_with_no_running_job_is_no_warning() {
    let mut s = Services::start("node-bye", &[], &[]);
    let connected = |s: &Services, v: u8| agent_connected(s, "node-bye", v);
    wait("the agent's stream", Duration::from_secs(20), || {
        connected(&s, 1).then_some(())
    });
    s.agent().stop();
    let collector = s.collector.as_ref().expect("collector");
    collector.wait_log(
        "INFO commscope collector: no stream from node node-bye's agent any more (its stream ended); no running rank of a job is on it",
        Duration::from_secs(10),
    );
    assert!(connected(&s, 0), "{}", collector.log());
    let log = collector.log();
    assert!(!log.contains("WARN"), "{log}");
    assert!(!log.contains("out of contact"), "{log}");
}

/// An agent that stops answering (its process stopped: to the collector, the same as its node
/// cut off) is noticed by the collector's keepalive pings within seconds: the node's
/// `agent_connected` gauge drops to 0 and the log says which node was lost. Resumed, the agent
/// connects again.
#[test]
fn a_silent_agent_is_lost_contact_within_seconds() {
    let mut s = Services::start("node-lost", &[], &[]);
    let gauge = |s: &Services, v: u8| agent_connected(s, "node-lost", v);
    wait("the agent's stream", Duration::from_secs(20), || {
        gauge(&s, 1).then_some(())
    });
    let pid = s.agent().child.id() as i32;
    // SAFETY: signals to our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = Instant::now();
    wait("the collector to notice", Duration::from_secs(30), || {
        gauge(&s, 0).then_some(())
    });
    let noticed = stopped.elapsed();
    // Pings every 5 s, an answer awaited 10 s.
    assert!(noticed < Duration::from_secs(20), "{noticed:?}");
    // Said with the next findings tick (about a second): no job runs there, so information.
    s.collector().wait_log(
        "no stream from node node-lost's agent any more",
        Duration::from_secs(5),
    );
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    wait("the agent to reconnect", Duration::from_secs(30), || {
        gauge(&s, 1).then_some(())
    });
}
