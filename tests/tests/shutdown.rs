//! Bounded shutdown: a collector told to stop while a node's network is down. Its graceful
//! shutdown used to wait for that node's agent connection, which cannot drain over the dead
//! path, for minutes; now it cuts it after `--shutdown-timeout` (10 s) and keeps what it had
//! acknowledged.

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
