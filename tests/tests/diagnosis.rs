//! The real fault suite: 8-rank MPI jobs (`tests/c/faults.c`) with one injected fault each, run
//! under the shim through a real agent and collector, the shim also writing its own trace files.
//! Each must give exactly one finding, of the right kind, naming exactly the right ranks and
//! node — live (`/api/v1/findings`), from the collector's stored trace and from the shim's
//! `.cst` files (`commscope analyze`); a healthy run gives none. The jobs run one at a time
//! (they share the two cores).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use commscope_tests::services::{Services, run_with_agent_traced};
use commscope_tests::{Flavour, analyze_json, assert_ok, build, ip, launch, summary_json, wait};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn analyze(dir: &Path) -> Vec<serde_json::Value> {
    let v = analyze_json(dir);
    let found = v["findings"].as_array().cloned().unwrap_or_default();
    if found.len() != 1 {
        eprintln!(
            "analyze {}:\n{}",
            dir.display(),
            v["explain"].as_str().unwrap_or_default()
        );
    }
    found
}

use commscope_tests::services::show_findings as show;

/// Waits for an open live finding of `kind`. On a timeout the failure shows what the collector
/// had instead — its findings, open and resolved, the job with its ranks, and its log — so that
/// a rare miss can be told from its output alone.
fn wait_live(svc: &Services, job: &str, kind: &str, timeout: Duration) -> serde_json::Value {
    let t = Instant::now();
    loop {
        if let Some(f) = svc
            .findings(job, "open")
            .into_iter()
            .find(|f| f["kind"] == kind)
        {
            return f;
        }
        if t.elapsed() >= timeout {
            let log = svc.collector.as_ref().map(|c| c.log()).unwrap_or_default();
            panic!(
                "no live {kind} finding for {job} within {timeout:?}\n--- open\n{}\n--- resolved\n{}\n--- job\n{:#}\n--- collector log (last 60 lines)\n{}",
                show(&svc.findings(job, "open")),
                show(&svc.findings(job, "resolved")),
                svc.job(job).unwrap_or_default(),
                log.lines()
                    .rev()
                    .take(60)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Once the job has ended: what the live engine had for it (open or resolved), and what
/// `analyze` says of the collector's stored trace and of the shim's `.cst` files.
struct Verdicts {
    live: Vec<serde_json::Value>,
    collector_trace: Vec<serde_json::Value>,
    cst: Vec<serde_json::Value>,
}

fn verdicts_after_the_end(svc: &Services, job: &str, cst_dir: &Path) -> Verdicts {
    svc.wait_job_ended(job, Duration::from_secs(60));
    let live = svc
        .findings(job, "open")
        .into_iter()
        .chain(svc.findings(job, "resolved"))
        .collect();
    svc.wait_segments(job, Duration::from_secs(60));
    Verdicts {
        live,
        collector_trace: analyze(&svc.trace_dir().join(job)),
        cst: analyze(&cst_dir.join(job)),
    }
}

/// A cgroup with a CPU limit (v2 `cpu.max` or v1 `cpu.cfs_quota_us`), removed on drop.
struct Throttle(PathBuf);

impl Throttle {
    fn new(name: &str, percent: u32) -> Option<Throttle> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        if v2.exists() {
            let d = Path::new("/sys/fs/cgroup").join(name);
            std::fs::create_dir_all(&d).ok()?;
            std::fs::write(d.join("cpu.max"), format!("{} 100000", percent * 1000)).ok()?;
            return Some(Throttle(d));
        }
        let d = Path::new("/sys/fs/cgroup/cpu").join(name);
        std::fs::create_dir_all(&d).ok()?;
        std::fs::write(d.join("cpu.cfs_period_us"), "100000").ok()?;
        std::fs::write(d.join("cpu.cfs_quota_us"), (percent * 1000).to_string()).ok()?;
        Some(Throttle(d))
    }

    fn add(&self, pid: u32) -> bool {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).is_ok()
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        // Move anything left back to the root, then remove the group.
        let root = self.0.parent().map(|p| p.join("cgroup.procs"));
        if let (Ok(procs), Some(root)) =
            (std::fs::read_to_string(self.0.join("cgroup.procs")), root)
        {
            for p in procs.lines() {
                let _ = std::fs::write(&root, p);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

struct Case {
    mode: &'static str,
    rank: i32,
    /// Expected (kind, class) — None: no finding at all.
    expect: Option<(&'static str, &'static str)>,
    /// The job does not end by itself.
    hangs: bool,
    steps: u32,
    /// Compute per step (multiply-adds).
    iters: u32,
    /// The collector forces consistent sampling at this modulus.
    sample: Option<u32>,
    /// Another kind a trace may give instead (a frozen process reads as dead from a trace).
    trace_alt: Option<&'static str>,
}

impl Case {
    fn kind_is_slow(&self) -> bool {
        matches!(self.expect, Some(("slow-rank", _)))
    }
}

fn run_case(flavour: Flavour, c: Case) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let node = format!("node-{}", c.mode);
    let modulus = c.sample.map(|k| k.to_string());
    let collector_args: Vec<&str> = match &modulus {
        Some(k) => vec!["--sample-modulus", k.as_str()],
        None => vec![],
    };
    let svc = Services::start(&node, &collector_args, &[]);
    let prog = build(flavour, "faults");
    let job = format!(
        "diag-{}-{}{}",
        c.mode,
        flavour.name(),
        if c.sample.is_some() { "-sampled" } else { "" }
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let pidfile = tmp.path().join("pid");
    let throttle = (c.mode == "throttle").then(|| {
        Throttle::new(&format!("commscope-test-{}", std::process::id()), 5)
            .expect("a CPU cgroup (run the tests as root)")
    });
    let socket = svc.socket.clone();
    let cmd = launch(
        flavour,
        8,
        &prog,
        &[
            c.mode,
            &c.rank.to_string(),
            &c.steps.to_string(),
            "60",
            &c.iters.to_string(),
        ],
    );
    let j = job.clone();
    let pf = pidfile.to_string_lossy().into_owned();
    let cst_dir = tmp.path().join("cst");
    let cst = cst_dir.to_string_lossy().into_owned();
    let runner = std::thread::spawn(move || {
        run_with_agent_traced(
            &socket,
            Some(Path::new(&cst)),
            &j,
            &cmd,
            &[("FAULTS_PIDFILE", pf.as_str())],
        )
    });
    if let Some(t) = &throttle {
        let pid: u32 = wait("the rank's pid", Duration::from_secs(60), || {
            std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok()
        });
        assert!(t.add(pid), "cannot move {pid} into the cgroup");
    }
    let began = Instant::now();
    let live = match c.expect {
        Some((kind, _)) => {
            let f = wait_live(&svc, &job, kind, Duration::from_secs(90));
            let latency = began.elapsed();
            if c.kind_is_slow() {
                // The program marks its steps: the impact is per real step.
                assert_eq!(f["evidence"]["step_from"], "commscope_step", "{f:#}");
            }
            if c.mode == "stop" {
                let f = &f;
                // The agent takes its stacks on the collector's request: it sleeps in sleep().
                let t = Instant::now();
                let stacks = loop {
                    let s = svc
                        .findings(&job, "open")
                        .into_iter()
                        .find(|g| g["id"] == f["id"])
                        .map(|g| g["evidence"]["culprits"][0]["stacks"].clone())
                        .filter(|s| !s.is_null());
                    if let Some(s) = s {
                        break s;
                    }
                    assert!(
                        t.elapsed() < Duration::from_secs(60),
                        "no stacks of the culprit within 60 s\n--- collector\n{}\n--- agent\n{}",
                        svc.collector.as_ref().map(|c| c.log()).unwrap_or_default(),
                        svc.agent.as_ref().map(|c| c.log()).unwrap_or_default()
                    );
                    std::thread::sleep(Duration::from_millis(200));
                };
                let native = stacks["native"].as_str().unwrap_or_default();
                assert!(
                    native.contains("sleep") && native.contains("main"),
                    "{stacks:#}"
                );
            }
            Some((f, latency))
        }
        None => None,
    };
    if c.hangs {
        // Let the live state settle a moment, then take the job down like an operator would.
        std::thread::sleep(Duration::from_secs(1));
        let _ = Command::new("pkill")
            .args(["-9", "-f", prog.to_str().expect("utf-8")])
            .status();
    }
    let out = runner.join().expect("runner");
    if c.expect.is_none() {
        assert_ok(&out, "healthy job");
    }
    drop(throttle);
    let Verdicts {
        live: all_live,
        collector_trace: batch,
        cst: from_cst,
    } = verdicts_after_the_end(&svc, &job, &cst_dir);
    if let Some(k) = c.sample {
        // Calls were left out and every one is accounted for: kept records plus skips make
        // exactly the calls the program made (300 world all-reduces, 75 on `half`, per rank).
        let (sum, out) = summary_json(&[&svc.trace_dir().join(&job)]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let sampled_out = sum["sampled_out"].as_u64().unwrap_or(0);
        let made = 8 * (c.steps as u64 + c.steps as u64 / 4);
        assert!(
            sampled_out > made / (2 * u64::from(k)),
            "sampled out {sampled_out} of {made}: {sum:#}"
        );
        let allreduces: u64 = sum["comms"]
            .as_array()
            .expect("comms")
            .iter()
            .filter_map(|cm| cm["ops"]["allreduce"].as_u64())
            .sum();
        assert_eq!(allreduces, made, "{sum:#}");
        eprintln!(
            "{} sampled 1 in {k}: {sampled_out} of {made} all-reduces left out, all counted",
            c.mode
        );
    }
    match c.expect {
        None => {
            assert!(all_live.is_empty(), "healthy, live:\n{}", show(&all_live));
            assert!(batch.is_empty(), "healthy, analyze:\n{}", show(&batch));
            assert!(
                from_cst.is_empty(),
                "healthy, analyze .cst:\n{}",
                show(&from_cst)
            );
        }
        Some((kind, class)) => {
            let (f, latency) = live.expect("live finding");
            eprintln!(
                "{} ({}): live {kind} named {:.1} s after the job started: {}",
                c.mode,
                flavour.name(),
                latency.as_secs_f64(),
                f["summary"]
            );
            assert_eq!(f["ranks"], serde_json::json!([c.rank]), "{f:#}");
            if c.mode == "stop" {
                // The culprit sleeps outside the library: its agent says so.
                let p = &f["evidence"]["culprits"][0]["process"];
                assert_eq!(p["state"], "S", "{f:#}");
                assert_eq!(p["cpu_advancing"], false, "{f:#}");
                assert!(
                    f["summary"]
                        .as_str()
                        .is_some_and(|s| s.contains("its process is sleeping")),
                    "{f:#}"
                );
            }
            assert_eq!(f["nodes"], serde_json::json!([node]), "{f:#}");
            assert_eq!(f["class"], class, "{f:#}");
            assert!(
                all_live
                    .iter()
                    .all(|g| g["ranks"] == serde_json::json!([c.rank])),
                "only the culprit is named live:\n{}",
                show(&all_live)
            );
            // From each trace: exactly one finding, of the kind (or the trace's alternative),
            // naming exactly the culprit.
            for (what, found) in [("collector's trace", &batch), (".cst files", &from_cst)] {
                assert_eq!(found.len(), 1, "analyze {what}:\n{}", show(found));
                let g = &found[0];
                assert!(
                    g["kind"] == kind || c.trace_alt.is_some_and(|k| g["kind"] == k),
                    "analyze {what}:\n{}",
                    show(found)
                );
                assert_eq!(g["ranks"], serde_json::json!([c.rank]), "{what}: {g:#}");
                // Live and trace name the same communicator and instance.
                if g["kind"] == f["kind"] && (kind == "hang" || kind == "mismatch") {
                    assert_eq!(
                        (&g["comm"], &g["seq"]),
                        (&f["comm"], &f["seq"]),
                        "{what}: {g:#}\nlive: {f:#}"
                    );
                }
                // The agent names the node; the shim's own files carry the host name.
                if what == ".cst files" {
                    assert_eq!(g["nodes"].as_array().map(Vec::len), Some(1), "{g:#}");
                } else {
                    assert_eq!(g["nodes"], serde_json::json!([node]), "{what}: {g:#}");
                }
            }
        }
    }
}

#[test]
fn healthy_job_gives_no_finding() {
    run_case(
        Flavour::OpenMpi,
        Case {
            mode: "healthy",
            rank: 3,
            expect: None,
            hangs: false,
            steps: 300,
            iters: 400_000,
            sample: None,
            trace_alt: None,
        },
    );
}

#[test]
fn extra_compute_is_a_slow_rank() {
    run_case(
        Flavour::OpenMpi,
        Case {
            mode: "compute",
            rank: 5,
            expect: Some(("slow-rank", "non-communication-slow")),
            hangs: false,
            steps: 300,
            iters: 400_000,
            sample: None,
            trace_alt: None,
        },
    );
}

#[test]
fn extra_compute_is_a_slow_rank_under_consistent_sampling() {
    // The collector keeps 1 instance in 4: the agent sends skips for the rest and the rank's
    // own compute with each kept collective; the verdict is the same, live and from the trace.
    run_case(
        Flavour::OpenMpi,
        Case {
            mode: "compute",
            rank: 5,
            expect: Some(("slow-rank", "non-communication-slow")),
            hangs: false,
            // Long enough that sampling (set at the collector's first ticks) covers most of it.
            steps: 900,
            iters: 400_000,
            sample: Some(4),
            trace_alt: None,
        },
    );
}

#[test]
fn a_cpu_throttled_rank_is_a_slow_rank() {
    run_case(
        Flavour::OpenMpi,
        Case {
            mode: "throttle",
            rank: 2,
            expect: Some(("slow-rank", "non-communication-slow")),
            hangs: false,
            // Compute-heavy steps: the CPU limit then shows as longer compute.
            steps: 150,
            iters: 4_000_000,
            sample: None,
            trace_alt: None,
        },
    );
}

#[test]
fn a_rank_that_stops_calling_is_a_hang() {
    run_case(
        Flavour::Mpich,
        Case {
            mode: "stop",
            rank: 6,
            expect: Some(("hang", "non-communication-hang")),
            hangs: true,
            steps: 100_000,
            iters: 400_000,
            sample: None,
            trace_alt: None,
        },
    );
}

#[test]
fn bcast_against_allreduce_is_a_mismatch() {
    run_case(
        Flavour::OpenMpi,
        Case {
            mode: "bcast",
            rank: 4,
            expect: Some(("mismatch", "communication-hang")),
            hangs: true,
            steps: 100_000,
            iters: 400_000,
            sample: None,
            trace_alt: None,
        },
    );
}

#[test]
fn an_unmatched_recv_is_a_hang_in_the_library() {
    run_case(
        Flavour::Mpich,
        Case {
            mode: "recv",
            rank: 1,
            expect: Some(("hang", "communication-hang")),
            hangs: true,
            steps: 100_000,
            iters: 400_000,
            sample: None,
            trace_alt: None,
        },
    );
}

#[test]
fn a_killed_rank_is_a_dead_rank() {
    run_case(
        Flavour::OpenMpi,
        Case {
            mode: "kill",
            rank: 7,
            expect: Some(("dead-rank", "non-communication-hang")),
            hangs: false,
            steps: 100_000,
            iters: 400_000,
            sample: None,
            trace_alt: None,
        },
    );
}

#[test]
fn a_killed_rank_is_a_dead_rank_under_mpich() {
    // Hydra takes the job down when a rank dies: one dead-rank, live and from both traces.
    run_case(
        Flavour::Mpich,
        Case {
            mode: "kill",
            rank: 3,
            expect: Some(("dead-rank", "non-communication-hang")),
            hangs: false,
            steps: 100_000,
            iters: 400_000,
            sample: None,
            trace_alt: None,
        },
    );
}

#[test]
fn a_process_stopped_inside_a_collective_is_named_alone() {
    for flavour in [Flavour::OpenMpi, Flavour::Mpich] {
        run_case(
            flavour,
            Case {
                mode: "freeze",
                rank: 5,
                expect: Some(("hang", "non-communication-hang")),
                hangs: true,
                steps: 100_000,
                iters: 400_000,
                sample: None,
                trace_alt: Some("dead-rank"),
            },
        );
    }
}

#[test]
fn a_pair_that_disagrees_names_the_rank_that_diverged() {
    // Tensor-parallel pairs: rank 6 calls a broadcast where its partner (7) and every other
    // pair call an all-reduce. The pair has no majority; its sibling pairs break the tie.
    for flavour in [Flavour::OpenMpi, Flavour::Mpich] {
        run_case(
            flavour,
            Case {
                mode: "pairbcast",
                rank: 6,
                expect: Some(("mismatch", "communication-hang")),
                hangs: true,
                steps: 100_000,
                iters: 400_000,
                sample: None,
                trace_alt: None,
            },
        );
    }
}

/// A network namespace of its own with only a loopback, removed on drop.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Netns(name)
    }

    /// Runs `tc ARGS…` inside it.
    fn tc(&self, args: &[&str]) {
        ip(&[&["netns", "exec", &self.0, "tc"], args].concat());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn a_transport_that_stops_delivering_is_a_stall_with_no_rank() {
    // Eight ranks talking over TCP on the loopback of a network namespace of their own. Once
    // the job runs, a queue of length zero on that loopback drops every packet: every rank is
    // inside a collective, alive and polling, and nothing completes. No rank is at fault; the
    // finding names the communicator and the instance, with no rank.
    for flavour in [Flavour::OpenMpi, Flavour::Mpich] {
        stall(flavour);
    }
}

fn stall(flavour: Flavour) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let node = "node-stall";
    let svc = Services::start(node, &[], &[]);
    let ns = Netns::new(format!("csstall{}", std::process::id()));
    let prog = build(flavour, "faults");
    let job = format!("diag-stall-{}", flavour.name());
    let tmp = tempfile::tempdir().expect("tempdir");
    let cst_dir = tmp.path().join("cst");
    // TCP only (no shared memory between the ranks), on the namespace's loopback.
    let mut cmd = launch(
        flavour,
        8,
        &prog,
        &["healthy", "0", "1000000", "1000000", "400000"],
    );
    let mut env: Vec<(&str, &str)> = vec![];
    match flavour {
        Flavour::OpenMpi => {
            for a in cmd.iter_mut() {
                if a == "self,vader,tcp" {
                    *a = "self,tcp".into();
                }
            }
            let extra = [
                "--mca",
                "btl_tcp_if_include",
                "lo",
                "--mca",
                "oob_tcp_if_include",
                "lo",
            ];
            for (i, a) in extra.iter().enumerate() {
                cmd.insert(1 + i, (*a).into());
            }
        }
        // MPICH over UCX: no shared-memory path between local ranks, UCX's TCP on lo.
        Flavour::Mpich => {
            env = vec![
                ("MPIR_CVAR_NOLOCAL", "1"),
                ("UCX_TLS", "tcp"),
                ("UCX_NET_DEVICES", "lo"),
            ];
        }
    }
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns.0])
        .arg(commscope_tests::commscope_bin())
        .arg("run")
        .arg("--agent-socket")
        .arg(&svc.socket)
        .arg("--job-id")
        .arg(&job)
        .arg("--")
        .args(&cmd)
        .env("COMMSCOPE_TRACE_DIR", &cst_dir)
        .envs(env);
    let runner = std::thread::spawn(move || c.output().expect("run commscope in the namespace"));
    // Healthy for a few seconds first: the live view learns how long a call takes.
    wait("the job's first records", Duration::from_secs(60), || {
        svc.job(&job)
            .filter(|j| j["ranks"].as_u64() == Some(8))
            .map(|_| ())
    });
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        svc.findings(&job, "open").is_empty(),
        "a finding before the stall: {:#?}",
        svc.findings(&job, "open")
    );
    ns.tc(&["qdisc", "add", "dev", "lo", "root", "pfifo", "limit", "0"]);
    let began = Instant::now();
    let f = wait("a live stall finding", Duration::from_secs(60), || {
        svc.findings(&job, "open")
            .into_iter()
            .find(|f| f["kind"] == "hang")
    });
    eprintln!(
        "stall ({}): live hang named {:.1} s after the transport stopped: {}",
        flavour.name(),
        began.elapsed().as_secs_f64(),
        f["summary"]
    );
    std::thread::sleep(Duration::from_secs(2));
    let live_open = svc.findings(&job, "open");
    let _ = Command::new("pkill")
        .args(["-9", "-f", prog.to_str().expect("utf-8")])
        .status();
    let _ = runner.join().expect("runner");
    drop(ns);
    let Verdicts {
        live: all_live,
        collector_trace: batch,
        cst: from_cst,
    } = verdicts_after_the_end(&svc, &job, &cst_dir);
    assert_eq!(live_open.len(), 1, "live:\n{}", show(&live_open));
    assert_eq!(
        all_live.len(),
        1,
        "live, open or resolved:\n{}",
        show(&all_live)
    );
    let stall = |f: &serde_json::Value| {
        f["kind"] == "hang"
            && f["class"] == "communication-hang"
            && f["ranks"] == serde_json::json!([])
            && f["comm"].is_string()
            && f["seq"].is_u64()
    };
    assert!(stall(&f), "live: {f:#}");
    for (what, found) in [("collector's trace", &batch), (".cst files", &from_cst)] {
        assert_eq!(found.len(), 1, "analyze {what}:\n{}", show(found));
        let g = &found[0];
        assert!(stall(g), "analyze {what}: {g:#}");
        // Live and trace name the same instance.
        assert_eq!(
            (&g["comm"], &g["seq"]),
            (&f["comm"], &f["seq"]),
            "analyze {what}: {g:#}\nlive: {f:#}"
        );
    }
}
