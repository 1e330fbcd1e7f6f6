//! The agent and the collector as real processes with real MPI jobs: what the collector stores
//! and serves is exactly what the job did, attributed to the right node, job and ranks.

use std::time::Duration;

use commscope_tests::services::{Services, run_with_agent};
use commscope_tests::{Flavour, assert_ok, build, coverage, launch, load_job};

fn coverage_through_the_collector(flavour: Flavour) {
    let prog = build(flavour, "coverage");
    let mut svc = Services::start(&format!("node-{}", flavour.name()), &[], &[]);
    let expect_dir = svc.dir.path().join("expect");
    std::fs::create_dir_all(&expect_dir).expect("mkdir");
    let job = format!("collected-{}", flavour.name());
    let out = run_with_agent(
        &svc.socket,
        &job,
        &launch(flavour, 8, &prog, &[expect_dir.to_str().expect("utf-8")]),
        &[],
    );
    assert_ok(&out, "coverage job");
    let api = svc.wait_job_ended(&job, Duration::from_secs(60));
    svc.wait_segments(&job, Duration::from_secs(30));

    // The stored trace: exactly what every rank did.
    let trace = load_job(&svc.trace_dir().join(&job));
    assert_eq!(trace.job, job);
    coverage::verify(flavour, &trace, &svc.trace_dir(), &expect_dir);
    for p in &trace.processes {
        assert_eq!(p.header.node, svc.node, "attributed to the agent's node");
        let clock = p.clock.expect("records carry the node's clock alignment");
        assert!(
            clock.error_ns < 50_000_000,
            "loopback clock error {} ns",
            clock.error_ns
        );
    }

    // The API says the same.
    assert_eq!(api["ranks"], 8);
    assert_eq!(api["world_size"], 8);
    assert_eq!(api["nodes"], serde_json::json!([svc.node]));
    assert_eq!(api["records"], trace.records() as u64);
    let processes = api["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 8);
    for (i, p) in processes.iter().enumerate() {
        assert_eq!(p["rank"], i as u64);
        assert_eq!(p["state"], "exited", "{p}");
        assert_eq!(p["finalized"], true, "{p}");
        if svc.exit_statuses_known() {
            assert_eq!(p["exit_status"], 0, "{p}");
        }
        assert_eq!(
            p["dropped"],
            0,
            "{p}\njob stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let world = api["comms"]
        .as_array()
        .expect("comms")
        .iter()
        .find(|c| c["name"] == "MPI_COMM_WORLD")
        .expect("world in the API")
        .clone();
    assert_eq!(world["size"], 8);
    assert_eq!(world["ops"]["allreduce"], 8 * 5);
    assert_eq!(api["in_flight"].as_array().map(Vec::len), Some(0));
    svc.collector().stop();
}

#[test]
fn open_mpi_job_through_agent_and_collector_is_stored_exactly() {
    coverage_through_the_collector(Flavour::OpenMpi);
}

#[test]
fn mpich_job_through_agent_and_collector_is_stored_exactly() {
    coverage_through_the_collector(Flavour::Mpich);
}

#[test]
fn the_demo_runs_through_an_agent_and_a_collector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let child = commscope_tests::commscope()
        .arg("demo")
        .arg("--capture")
        .arg("--trace-dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("demo");
    let scratch = std::env::temp_dir().join(format!("commscope-demo-{}", child.id()));
    let out = child.wait_with_output().expect("demo");
    assert_ok(&out, "commscope demo");
    // With the trace elsewhere, its scratch directory (program, socket, spool) is gone.
    assert!(!scratch.exists(), "{} left behind", scratch.display());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("4 ranks on") && text.contains("4 of 4 ranks finalized and exited cleanly"),
        "{text}"
    );
    assert!(text.contains("80 matched, 0 unmatched"), "{text}");
    let job = std::fs::read_dir(dir.path())
        .expect("trace dir")
        .flatten()
        .find(|e| e.path().is_dir())
        .expect("a job directory");
    let trace = load_job(&job.path());
    assert_eq!(trace.processes.len(), 4);
}

#[test]
fn up_serves_a_collector_and_an_agent_until_terminated() {
    use commscope_tests::services::{Service, addr_after, http_get};
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("agent.sock");
    let mut cmd = commscope_tests::commscope();
    cmd.arg("up")
        .arg("--dir")
        .arg(dir.path())
        .arg("--socket")
        .arg(&socket)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--http")
        .arg("127.0.0.1:0")
        .arg("--agent-http")
        .arg("127.0.0.1:0");
    let mut up = Service::spawn(cmd, "up");
    up.wait_log("Ctrl-C stops", Duration::from_secs(30));
    let log = up.log();
    let http = addr_after(&log, "(HTTP http://").expect("the collector's HTTP address");
    let agent = addr_after(&log, "(metrics http://").expect("the agent's HTTP address");
    let t = std::time::Instant::now();
    while http_get(http, "/readyz").0 != 200 || !socket.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "up did not get ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let prog = build(Flavour::OpenMpi, "basic");
    let out = run_with_agent(
        &socket,
        "up-job",
        &launch(Flavour::OpenMpi, 2, &prog, &["10"]),
        &[],
    );
    assert_ok(&out, "job");
    let t = std::time::Instant::now();
    loop {
        let (_, body) = http_get(http, "/api/v1/jobs/up-job");
        if body.contains("\"state\":\"ended\"") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "job not ended: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        http_get(agent, "/metrics")
            .1
            .contains("commscope_agent_records_acked_total")
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(up.child.id() as i32, libc::SIGTERM) };
    let st = up.child.wait().expect("wait");
    assert!(st.success(), "{st}");
    assert!(!socket.exists(), "the socket is removed on exit");
    let trace = load_job(&dir.path().join("traces").join("up-job"));
    assert_eq!(trace.processes.len(), 2);
}

/// `--log-format json` writes one JSON object per line, and `COMMSCOPE_LOG` filters by target
/// and level: the collector's lines at info, the agent's only from warn up.
#[test]
fn logs_are_json_lines_filtered_by_commscope_log() {
    use commscope_tests::services::Service;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = commscope_tests::commscope();
    cmd.env("COMMSCOPE_LOG", "warn,commscope_collector=info")
        .args(["--log-format", "json", "up", "--dir"])
        .arg(dir.path())
        .arg("--socket")
        .arg(dir.path().join("agent.sock"))
        .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(["--agent-http", "127.0.0.1:0"]);
    let mut up = Service::spawn(cmd, "up");
    up.wait_log("connected from", Duration::from_secs(30));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(up.child.id() as i32, libc::SIGTERM) };
    let st = up.child.wait().expect("wait");
    assert!(st.success(), "{st}:\n{}", up.log());
    let log = up.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let targets: Vec<&str> = lines
        .iter()
        .map(|l| l["target"].as_str().expect("target"))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "INFO"
            && l["target"] == "commscope_collector"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("listening: gRPC on 127.0.0.1:"))),
        "{log}"
    );
    assert!(
        !targets.iter().any(|t| t.starts_with("commscope_agent")),
        "the agent's info lines are filtered out: {log}"
    );
    assert!(
        lines.iter().all(|l| l["timestamp"].as_str().is_some()),
        "{log}"
    );
}

#[test]
fn an_agent_without_a_collector_writes_the_traces_itself() {
    // Local mode: `commscope agent --trace-dir DIR` runs a collector in its own process.
    use commscope_tests::services::Service;
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = dir.path().join("traces");
    let socket = dir.path().join("agent.sock");
    let mut c = commscope_tests::commscope();
    c.arg("agent")
        .arg("--trace-dir")
        .arg(&traces)
        .arg("--socket")
        .arg(&socket)
        .arg("--node")
        .arg("local-node")
        .arg("--http")
        .arg("off")
        .arg("--spool-dir")
        .arg(dir.path().join("spool"))
        .arg("--no-ebpf");
    let mut agent = Service::spawn(c, "agent");
    agent.wait_log("registrations on", Duration::from_secs(30));
    assert!(
        agent
            .log()
            .contains("local mode: a collector in this process writes"),
        "{}",
        agent.log()
    );
    let prog = build(Flavour::OpenMpi, "basic");
    let cmd = launch(Flavour::OpenMpi, 2, &prog, &["10"]);
    let out = run_with_agent(&socket, "local-mode", &cmd, &[]);
    assert_ok(&out, "the job");
    // Everything acknowledged is written out when the agent stops.
    std::thread::sleep(Duration::from_secs(2));
    agent.stop();
    let trace = load_job(&traces.join("local-mode"));
    let mut ranks: Vec<i32> = trace.processes.iter().map(|p| p.header.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1], "{}", agent.log());
}
