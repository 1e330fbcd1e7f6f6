//! Nothing lost: the collector or the agent killed with SIGKILL in the middle of a real 8-rank
//! job and restarted; when the job ends, the collector's trace holds every record exactly once
//! (or, for the agent, counted as dropped with a reason), and the job's results are unchanged.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use commscope_tests::services::{Services, metric, raw_records, run_with_agent};
use commscope_tests::{Flavour, assert_ok, build, launch};
use commscope_wire::op::{Op, flags};
use commscope_wire::record::Record;

/// The tests here run one at a time: each freezes, kills or starves a component on purpose,
/// and two at once on two cores turn one test's timing into the other's load.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the steady job in the background; returns its handle.
fn start_job(
    svc: &Services,
    flavour: Flavour,
    job: &str,
    seconds: &str,
) -> std::thread::JoinHandle<std::process::Output> {
    let prog = build(flavour, "steady");
    let cmd = launch(flavour, 8, &prog, &[seconds, "1000"]);
    let socket = svc.socket.clone();
    let job = job.to_owned();
    std::thread::spawn(move || run_with_agent(&socket, &job, &cmd, &[]))
}

/// Waits until the collector holds at least `n` records of the job.
fn wait_records(svc: &Services, job: &str, n: u64) {
    let t = Instant::now();
    loop {
        if let Some(j) = svc.job(job)
            && j["records"].as_u64().unwrap_or(0) >= n
        {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "job {job} never reached {n} records"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The job's output: every rank ran the same number of steps, with correct results.
fn steps_of(out: &std::process::Output) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    let mut steps = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("rank ")) {
        assert!(line.ends_with("checksum ok"), "wrong result: {line}");
        let n: u64 = line
            .split_whitespace()
            .nth(2)
            .and_then(|s| s.parse().ok())
            .expect("steps");
        steps.push(n);
    }
    assert_eq!(steps.len(), 8, "{text}");
    assert!(steps.iter().all(|s| *s == steps[0]), "{steps:?}");
    steps[0]
}

/// Checks the stored trace: per process, each rec_seq once; gaps only where the process
/// counted records as lost; every step's calls present. Returns the records stored.
fn check_exactly_once(svc: &Services, job: &str, steps: u64, api: &serde_json::Value) -> u64 {
    let raw = raw_records(&svc.trace_dir().join(job));
    assert_eq!(raw.len(), 8, "one process per rank: {:?}", raw.keys());
    let mut total = 0u64;
    for ((node, pid, _), (seqs, recs)) in &raw {
        assert_eq!(node, &svc.node);
        let dups: Vec<_> = seqs.iter().filter(|(_, n)| **n > 1).collect();
        assert!(dups.is_empty(), "pid {pid}: records stored twice: {dups:?}");
        let max = *seqs.keys().next_back().expect("records");
        // Records lost on the way (a ring overrun) are counted for the process.
        let counted = api["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == *pid)
            .and_then(|p| p["dropped"].as_u64())
            .expect("the process in the API");
        let gaps = max - seqs.len() as u64;
        assert!(
            gaps <= counted,
            "pid {pid}: {gaps} records missing from 1..={max}, {counted} counted as dropped"
        );
        let mut per_op: BTreeMap<&str, u64> = BTreeMap::new();
        for r in recs {
            if let Record::Call(c) = r {
                *per_op.entry(c.op().name()).or_default() += 1;
            }
        }
        assert_eq!(per_op.get(Op::Allreduce.name()), Some(&steps), "pid {pid}");
        assert_eq!(per_op.get(Op::Sendrecv.name()), Some(&steps), "pid {pid}");
        let exit = recs.iter().any(|r| {
            matches!(r, Record::Process(p) if p.flags & flags::OBSERVED != 0
                && (p.exit_status == 0 || !svc.exit_statuses_known()))
        });
        assert!(
            exit,
            "pid {pid}: the agent's exit record; process records: {:?}",
            recs.iter()
                .filter(|r| matches!(r, Record::Process(_)))
                .collect::<Vec<_>>()
        );
        total += seqs.len() as u64;
    }
    total
}

#[test]
fn collector_killed_and_restarted_20s_later_loses_nothing() {
    let _one = one_at_a_time();
    let mut svc = Services::start("node-k1", &[], &["--spool-after", "1s"]);
    let job = "collector-killed";
    let handle = start_job(&svc, Flavour::OpenMpi, job, "35");
    wait_records(&svc, job, 2000);
    svc.collector().kill9();
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(20));
    // Meanwhile the agent spooled what the rings produced.
    let spooled = metric(svc.agent_http, "commscope_agent_records_spooled_total");
    assert!(
        spooled > 1000.0,
        "records spooled while the collector was down: {spooled}"
    );
    svc.start_collector();
    eprintln!("collector down for {:.1} s", down.elapsed().as_secs_f64());
    let out = handle.join().expect("job thread");
    assert_ok(&out, "steady job");
    let steps = steps_of(&out);
    let api = svc.wait_job_ended(job, Duration::from_secs(60));
    svc.wait_segments(job, Duration::from_secs(30));
    let stored = check_exactly_once(&svc, job, steps, &api);
    // After its restart the collector rebuilt its marks and state from disk, so its view of the
    // job covers everything too.
    assert_eq!(api["records"], stored, "API records vs trace");
    assert_eq!(metric(svc.agent_http, "commscope_agent_spool_batches"), 0.0);
    let log = svc.collector().log();
    assert!(log.contains("pending log entries recovered"), "{log}");
}

#[test]
fn agent_killed_and_restarted_loses_nothing() {
    let _one = one_at_a_time();
    let mut svc = Services::start("node-k2", &[], &[]);
    let job = "agent-killed";
    let handle = start_job(&svc, Flavour::Mpich, job, "20");
    wait_records(&svc, job, 2000);
    svc.agent().kill9();
    std::thread::sleep(Duration::from_secs(2));
    svc.start_agent();
    // Every rank registers again with the new agent.
    svc.agent
        .as_ref()
        .expect("agent")
        .wait_log("registered rank 7", Duration::from_secs(20));
    let out = handle.join().expect("job thread");
    assert_ok(&out, "steady job");
    let steps = steps_of(&out);
    let api = svc.wait_job_ended(job, Duration::from_secs(60));
    svc.wait_segments(job, Duration::from_secs(30));
    let stored = check_exactly_once(&svc, job, steps, &api);
    assert_eq!(api["records"], stored);
    for p in api["processes"].as_array().expect("processes") {
        assert_eq!(p["state"], "exited", "{p}");
    }
}

#[test]
fn agent_killed_right_after_the_job_ended_loses_nothing() {
    let _one = one_at_a_time();
    // The collector is frozen while the job runs and ends: nothing of it is acknowledged when
    // the agent is killed. The processes are gone, and their rings with the agent's mappings;
    // what the agent copied into its spool as the processes ended is all that is left, and the
    // next agent delivers it.
    let mut svc = Services::start("node-k3", &[], &[]);
    let job = "agent-killed-after-exit";
    let collector = svc.collector().child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(collector, libc::SIGSTOP) };
    let handle = start_job(&svc, Flavour::Mpich, job, "1");
    let out = handle.join().expect("job thread");
    // Once the agent has handled every exit (it logs each, then copies what the collector,
    // still asleep, has not acknowledged): well within the collector's keepalive timeout, so
    // the agent has not begun spooling on its own. (Before it handles an exit, a process that
    // is gone is held by nothing but the agent's mapping: docs/reliability.md.)
    for rank in 0..8 {
        svc.agent.as_ref().expect("agent").wait_log(
            &format!("rank {rank} of job {job} (pid"),
            Duration::from_secs(30),
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    svc.agent().kill9();
    // SAFETY: as above.
    unsafe { libc::kill(collector, libc::SIGCONT) };
    assert_ok(&out, "steady job");
    let steps = steps_of(&out);
    svc.start_agent();
    let api = svc.wait_job_ended(job, Duration::from_secs(60));
    svc.wait_segments(job, Duration::from_secs(30));
    let stored = check_exactly_once(&svc, job, steps, &api);
    assert_eq!(api["records"], stored);
    // The final accounts came from the spool: every process's last heartbeat by the agent.
    let raw = raw_records(&svc.trace_dir().join(job));
    for ((_, pid, _), (seqs, recs)) in &raw {
        let last = recs.iter().find_map(|r| match r {
            Record::Heartbeat(h) if h.flags & flags::AGENT_BEAT != 0 => Some(h.produced),
            _ => None,
        });
        let produced = last.unwrap_or_else(|| panic!("pid {pid}: no final account"));
        let kept = seqs.keys().filter(|s| **s <= produced).count() as u64;
        assert_eq!(kept, produced, "pid {pid}: every record it made");
    }
}

#[test]
fn a_job_that_ends_while_its_agent_restarts_loses_nothing() {
    let _one = one_at_a_time();
    // The agent is killed while the job runs and is back only after the job's last records
    // were written: each process waits at exit (COMMSCOPE_EXIT_WAIT_MS; 20 s here, so that a
    // slow agent start on a loaded machine cannot outlast it) for an agent to take its ring,
    // registers with the new one, and leaves at once; nothing is lost.
    let mut svc = Services::start("node-k4", &[], &[]);
    let job = "ended-while-agent-restarts";
    let prog = build(Flavour::Mpich, "steady");
    let cmd = launch(Flavour::Mpich, 8, &prog, &["2", "1000"]);
    let socket = svc.socket.clone();
    let handle = std::thread::spawn(move || {
        run_with_agent(&socket, job, &cmd, &[("COMMSCOPE_EXIT_WAIT_MS", "20000")])
    });
    for rank in 0..8 {
        svc.agent
            .as_ref()
            .expect("agent")
            .wait_log(&format!("registered rank {rank} "), Duration::from_secs(30));
    }
    svc.agent().kill9();
    // The job's two seconds run out meanwhile: its ranks finalize with no agent there.
    std::thread::sleep(Duration::from_millis(2600));
    let t = Instant::now();
    svc.start_agent();
    let out = handle.join().expect("job thread");
    assert_ok(&out, "steady job");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the ranks left once the new agent had their rings ({:?})",
        t.elapsed()
    );
    let steps = steps_of(&out);
    let api = svc.wait_job_ended(job, Duration::from_secs(60));
    svc.wait_segments(job, Duration::from_secs(30));
    let stored = check_exactly_once(&svc, job, steps, &api);
    assert_eq!(api["records"], stored);
}

#[test]
fn a_simulated_job_streams_through_a_collector_restart_and_loses_nothing() {
    // The simulator's nodes stream as agents do: a collector killed under them is reconnected
    // to once it is back, and what it had not acknowledged is sent again.
    let _one = one_at_a_time();
    let mut svc = Services::start("node-simr", &[], &[]);
    let job = "sim-restart";
    let mut sim = commscope_tests::commscope()
        .args(["simulate", "--collector"])
        .arg(format!("http://{}", svc.grpc))
        .args(["--ranks", "32", "--duration", "14", "--job-id", job])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("simulate");
    let (stdout, stderr) = (sim.stdout.take(), sim.stderr.take());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout.expect("stdout"), &mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr.expect("stderr"), &mut s);
        s
    });
    wait_records(&svc, job, 500);
    // Frozen first, so that batches sent meanwhile are never acknowledged, then killed.
    let pid = svc.collector().child.id() as i32;
    // SAFETY: signalling the collector this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(1500));
    svc.collector().kill9();
    std::thread::sleep(Duration::from_secs(2));
    svc.start_collector();
    let status = sim.wait().expect("simulate");
    let (out, err) = (
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    );
    assert!(status.success(), "{out}\n{err}");
    let summary = out
        .lines()
        .find(|l| l.starts_with("sent "))
        .unwrap_or_else(|| panic!("no summary:\n{out}\n{err}"));
    assert!(
        summary.contains(", 0 refused, ")
            && summary.contains(", 0 never acknowledged, 0 dropped unsent;")
            && !summary.contains("; 0 streams reopened")
            && !summary.contains(", 0 batches sent again"),
        "{summary}\n{err}"
    );
    eprintln!("{summary}");

    // Every record of every simulated rank is stored exactly once: its final heartbeat says how
    // many it made.
    svc.wait_job_ended(job, Duration::from_secs(60));
    svc.wait_segments(job, Duration::from_secs(30));
    let raw = raw_records(&svc.trace_dir().join(job));
    assert_eq!(raw.len(), 32, "one process per rank: {:?}", raw.keys());
    for ((node, pid, _), (seqs, recs)) in &raw {
        let produced = recs
            .iter()
            .find_map(|r| match r {
                Record::Heartbeat(h) if h.flags & flags::FINAL != 0 => Some(h.produced),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{node} pid {pid}: no final heartbeat"));
        let missing: Vec<u64> = (1..=produced).filter(|s| !seqs.contains_key(s)).collect();
        let twice: Vec<u64> = seqs
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(s, _)| *s)
            .collect();
        assert!(
            missing.is_empty() && twice.is_empty() && seqs.len() as u64 == produced,
            "{node} pid {pid}: of 1..={produced}, missing {missing:?}, stored twice {twice:?}"
        );
    }
}
