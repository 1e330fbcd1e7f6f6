//! No false alarm from operations: simulated jobs streamed to a real collector (its own
//! process) that is killed (`kill -9`) and restarted, and whose agents go away. A real hang
//! stays named throughout — held open, marked out of contact, while its agents are away — and
//! no finding ever names another rank: not when the agents leave, not after the restart (when
//! the logs bring back ranks whose last records predate the outage), not while the agents
//! reconnect and catch up.

use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use commscope_tests::services::Services;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `commscope simulate` streaming to the services' collector, its output read as it comes.
struct Sim {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

impl Sim {
    fn start(svc: &Services, job: &str, args: &[&str]) -> Sim {
        let mut child = commscope_tests::commscope()
            .args(["simulate", "--collector"])
            .arg(format!("http://{}", svc.grpc))
            .arg("--collector-http")
            .arg(svc.http.to_string())
            .args(["--job-id", job])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("simulate");
        let (mut o, mut e) = (
            child.stdout.take().expect("stdout"),
            child.stderr.take().expect("stderr"),
        );
        Sim {
            child,
            out: std::thread::spawn(move || {
                let mut s = String::new();
                let _ = o.read_to_string(&mut s);
                s
            }),
            err: std::thread::spawn(move || {
                let mut s = String::new();
                let _ = e.read_to_string(&mut s);
                s
            }),
        }
    }

    fn finish(mut self) -> String {
        let status = self.child.wait().expect("simulate");
        let out = self.out.join().expect("stdout");
        let err = self.err.join().expect("stderr");
        assert!(status.success(), "simulate failed\n{out}\n{err}");
        format!("{out}\n{err}")
    }
}

fn all(svc: &Services, job: &str) -> Vec<serde_json::Value> {
    svc.every_finding(job)
}

use commscope_tests::services::show_findings as show;

/// Waits until `job` has a finding, at most `timeout`.
fn wait_finding(svc: &Services, job: &str, timeout: Duration) {
    let t = Instant::now();
    while all(svc, job).is_empty() {
        assert!(
            t.elapsed() < timeout,
            "no finding for {job} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Exactly one finding: the hang of rank 99, open.
fn only_the_hang(svc: &Services, job: &str, when: &str) -> serde_json::Value {
    let found = all(svc, job);
    assert_eq!(
        found.len(),
        1,
        "{when}: exactly one finding\n{}",
        show(&found)
    );
    let f = &found[0];
    assert_eq!(f["kind"], "hang", "{when}: {f:#}");
    assert_eq!(f["ranks"], serde_json::json!([99]), "{when}: {f:#}");
    assert_eq!(
        f["state"], "open",
        "{when}: the hang is never resolved: {f:#}"
    );
    f.clone()
}

/// The collector's log lines of streams that ended with an error: none, when the simulated
/// agents leave as real ones do, closing their streams.
fn stream_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains("no stream from")
                && !l.contains("(its stream ended)")
                && !l.contains("their streams ended)")
        })
        .collect()
}

#[test]
fn a_hang_stays_named_when_its_agents_leave_and_through_a_collector_restart() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut svc = Services::start("node-ops", &[], &[]);
    let job = "ops-hang";
    let sim = Sim::start(
        &svc,
        job,
        &["--ranks", "256", "--fault", "hang:99", "--duration", "14"],
    );
    let out = sim.finish();
    assert!(
        out.contains("OPEN     hang [99]"),
        "simulate prints the finding as it opens:\n{out}"
    );
    // The simulated agents are gone: the hang is held open, out of contact, and nothing else
    // is said of the job.
    std::thread::sleep(Duration::from_secs(3));
    let f = only_the_hang(&svc, job, "after the agents left");
    let log = svc.collector().log();
    assert_eq!(stream_errors(&log), Vec::<&str>::new());
    assert!(log.contains("(its stream ended)"), "{log}");
    assert_eq!(f["evidence"]["contact"]["held"], true, "{f:#}");
    assert!(
        f["evidence"]["contact"]["out_of_contact"]
            .as_array()
            .is_some_and(|n| n.len() == 32),
        "every node out of contact: {f:#}"
    );
    let id = f["id"].clone();
    let (_, jobline) = svc.get(&format!("/api/v1/jobs/{job}"));
    let jobline: serde_json::Value = serde_json::from_str(&jobline).expect("job json");
    assert_eq!(jobline["contact"]["behind"], true, "{jobline:#}");
    assert!(
        jobline["contact"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("out of contact")),
        "{jobline:#}"
    );

    // The collector dies and comes back: the logs bring the job back, its ranks' last records
    // long past. Still exactly the hang, open, held.
    svc.collector().kill9();
    std::thread::sleep(Duration::from_secs(1));
    svc.start_collector();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_secs(1));
        let f = only_the_hang(&svc, job, "after the restart");
        assert_eq!(f["id"], id, "the same finding: {f:#}");
        assert_eq!(f["evidence"]["contact"]["held"], true, "{f:#}");
    }
    let log = svc.collector().log();
    assert!(
        log.contains("1 open finding(s) held until their agents reconnect"),
        "{log}"
    );
    let (_, metrics) = svc.get("/metrics");
    assert!(
        metrics.contains("commscope_collector_nodes_out_of_contact 32"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("contact") || l.contains("behind"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_collector_restarted_under_a_running_job_raises_no_false_finding() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut svc = Services::start("node-ops", &[], &[]);
    let job = "ops-restart";
    let sim = Sim::start(
        &svc,
        job,
        &[
            "--ranks",
            "1024",
            "--fault",
            "straggler:517",
            "--duration",
            "40",
            "--compute-ms",
            "20",
        ],
    );
    // The straggler named first, then the collector killed under the running job, down 4 s.
    wait_finding(&svc, job, Duration::from_secs(30));
    svc.collector().kill9();
    std::thread::sleep(Duration::from_secs(4));
    svc.start_collector();
    let out = sim.finish();
    std::thread::sleep(Duration::from_secs(2));
    let found = all(&svc, job);
    assert!(
        found
            .iter()
            .all(|f| f["kind"] == "slow-rank" && f["ranks"] == serde_json::json!([517])),
        "only the straggler is ever named\n{}\n--- simulate\n{out}",
        show(&found)
    );
    assert!(!found.is_empty(), "the straggler is named\n{out}");
    // Its 128 streams to the restarted collector end as the run does, each closed.
    assert_eq!(stream_errors(&svc.collector().log()), Vec::<&str>::new());
    assert!(
        !out.contains("EXTRA"),
        "simulate saw no other finding:\n{out}"
    );
}
