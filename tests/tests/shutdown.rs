//! Bounded shutdown: a collector told to stop while a node's network is down. Its graceful
//! shutdown used to wait for that node's agent connection, which cannot drain over the dead
//! path, for minutes; now it cuts it after `--shutdown-timeout` (10 s) and keeps what it had
//! acknowledged. And an agent told to stop while its collector is frozen, and `commscope up`
//! told to stop while it is still starting.

use std::time::{Duration, Instant};

use commscope_tests::testbed::Testbed;
use commscope_tests::{Flavour, build, load_job, wait};

#[test]
fn a_collector_stops_promptly_while_a_nodes_link_is_down() {
    let mut bed = Testbed::new(2, &["--no-ebpf"]);
    let prog = std::fs::canonicalize(build(Flavour::OpenMpi, "steady")).expect("program");
    let job = "shutdown-link-down";
    let p = prog.to_str().expect("utf-8");
    let mut runner = bed
        .job_command(job, 2, 4, &[p, "600", "20000"])
        .spawn()
        .expect("job");
    wait("the job's ranks", Duration::from_secs(60), || {
        bed.job(job)
            .filter(|j| j["ranks"].as_u64() == Some(4))
            .map(|_| ())
    });
    std::thread::sleep(Duration::from_secs(3));
    bed.link(1, false);
    std::thread::sleep(Duration::from_secs(2));
    let pid = bed.collector.child.id() as i32;
    let t = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut exited = false;
    while t.elapsed() < Duration::from_secs(120) {
        if let Ok(Some(_)) = bed.collector.child.try_wait() {
            exited = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    bed.link(1, true);
    bed.kill_jobs();
    let _ = runner.kill();
    let _ = runner.wait();
    eprintln!("collector stopped: {exited} after {took:?}");
    assert!(
        exited && took < Duration::from_secs(15),
        "took {took:?}: {}",
        bed.collector.log()
    );
    assert!(
        bed.collector.log().contains("cut them"),
        "{}",
        bed.collector.log()
    );
    // What it had acknowledged is in the trace: every rank, with its calls.
    let trace = load_job(&bed.dir.path().join("traces").join(job));
    let mut ranks: Vec<i32> = trace.processes.iter().map(|p| p.header.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2, 3]);
    for p in &trace.processes {
        assert!(
            p.records.len() > 10,
            "rank {}: {} records",
            p.header.rank,
            p.records.len()
        );
    }
}

/// The agent's side: told to stop while its collector is frozen (SIGSTOP: the stream is open,
/// nothing is acknowledged), it stops within its `--shutdown-timeout` and keeps what it read —
/// the records of a job whose processes already ended, whose rings leave with it — in the
/// spool; the next agent delivers the job whole.
#[test]
fn an_agent_stops_promptly_with_its_collector_frozen_and_loses_nothing() {
    use commscope_tests::services::{Services, run_with_agent};
    let mut svc = Services::start("node-stop", &[], &["--no-ebpf", "--shutdown-timeout", "3s"]);
    let prog = build(Flavour::Mpich, "basic");
    let collector = svc.collector.as_ref().expect("collector").child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(collector, libc::SIGSTOP) };
    let out = run_with_agent(
        &svc.socket,
        "frozen",
        &commscope_tests::launch(Flavour::Mpich, 2, &prog, &["50"]),
        &[],
    );
    commscope_tests::assert_ok(&out, "job");
    // Both ranks' exits seen, so their rings are read to the end, and their unacknowledged
    // batches copied into the spool (their rings leave with this agent).
    wait("both ranks' exits", Duration::from_secs(10), || {
        let log = svc.agent.as_ref().expect("agent").log();
        (log.matches(") exited with status").count() >= 2).then_some(())
    });
    wait(
        "the ended ranks' copies in the spool",
        Duration::from_secs(10),
        || {
            let n = std::fs::read_dir(svc.spool_dir()).map_or(0, Iterator::count);
            (n > 0).then_some(())
        },
    );
    let t = Instant::now();
    svc.agent().stop();
    let took = t.elapsed();
    let log = svc.agent.as_ref().expect("agent").log();
    // SAFETY: as above.
    unsafe { libc::kill(collector, libc::SIGCONT) };
    assert!(took < Duration::from_secs(6), "took {took:?}: {log}");
    assert!(
        log.contains("kept in the spool for the next agent"),
        "{log}"
    );
    let spooled = std::fs::read_dir(svc.spool_dir())
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(spooled > 0, "{log}");

    svc.start_agent();
    let job = svc.wait_job_ended("frozen", Duration::from_secs(60));
    assert_eq!(job["ranks"], 2, "{job}");
    let records = job["records"].as_u64().unwrap_or(0);
    assert!(records > 100, "{job}");
    for p in job["processes"].as_array().expect("processes") {
        assert_eq!(p["finalized"], true, "{p}");
    }
}

/// A SIGTERM that comes while `commscope up` starts (its collector listening, its agent not yet
/// up) stops it cleanly once started: the signals are caught before anything starts. (They were
/// caught only once both were up, so a signal in between killed the process; a test that stopped
/// `up` right after it connected failed that way under load.)
#[test]
fn up_stopped_while_it_starts_exits_cleanly() {
    use std::io::BufRead;
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = commscope_tests::commscope()
            .args(["up", "--dir"])
            .arg(dir.path())
            .arg("--socket")
            .arg(dir.path().join("agent.sock"))
            .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(["--agent-http", "127.0.0.1:0"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("commscope up");
        let err = child.stderr.take().expect("stderr");
        let mut log = String::new();
        let mut lines = std::io::BufReader::new(err).lines();
        for line in lines.by_ref() {
            let line = line.expect("log line");
            log += &line;
            log.push('\n');
            if line.contains("listening:") {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                break;
            }
        }
        log.extend(lines.map_while(Result::ok).map(|l| l + "\n"));
        let st = child.wait().expect("wait");
        assert!(st.success(), "{st}:\n{log}");
        assert!(
            !dir.path().join("agent.sock").exists(),
            "the agent's socket is removed:\n{log}"
        );
    }
}
