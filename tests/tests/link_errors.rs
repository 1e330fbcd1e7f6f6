//! `link-error` from the node agent's NIC counters, end to end: an MPI job runs under a real
//! agent and collector while the agent reads a sysfs tree modelled on an mlx5 port
//! (`COMMSCOPE_SYSFS_ROOT`). The port's error and congestion counters jump and it goes down:
//! one `link-error` naming the node, the NIC and the port — live, and from the collector's
//! trace; the congestion counters make no finding of their own.

use std::path::Path;
use std::time::{Duration, Instant};

use commscope_tests::services::{Services, run_with_agent};
use commscope_tests::{Flavour, analyze_json, build, launch, wait};

/// An mlx5 port: its PMA error counters and state.
fn port(root: &Path, symbol_error: u64, link_downed: u64, state: &str) {
    let p = root.join("class/infiniband/mlx5_0/ports/1");
    std::fs::create_dir_all(p.join("counters")).expect("mkdir");
    for (f, v) in [
        ("symbol_error", symbol_error),
        ("link_downed", link_downed),
        ("port_xmit_data", 1000),
    ] {
        std::fs::write(p.join("counters").join(f), format!("{v}\n")).expect("write counter");
    }
    // A congestion counter that climbs with the errors: corroboration for a slow link, never a
    // finding of its own.
    std::fs::create_dir_all(p.join("hw_counters")).expect("mkdir");
    std::fs::write(
        p.join("hw_counters/np_cnp_sent"),
        format!("{}\n", symbol_error * 100),
    )
    .expect("write counter");
    std::fs::write(p.join("state"), format!("{state}\n")).expect("write state");
    std::fs::write(p.join("rate"), "200 Gb/sec (4X HDR)\n").expect("write rate");
}

#[test]
fn a_nic_port_that_fails_during_a_job_is_one_link_error_naming_it() {
    let sysfs = tempfile::tempdir().expect("tempdir");
    port(sysfs.path(), 3, 0, "4: ACTIVE");
    let root = sysfs.path().to_str().expect("utf-8");
    let svc =
        Services::start_with_agent_env("node-nic", &[], &[], &[("COMMSCOPE_SYSFS_ROOT", root)]);
    let prog = build(Flavour::OpenMpi, "steady");
    let job = "nic-link-error";
    let cmd = launch(Flavour::OpenMpi, 4, &prog, &["24", "2000"]);
    let socket = svc.socket.clone();
    let runner = std::thread::spawn(move || run_with_agent(&socket, job, &cmd, &[]));
    wait("the job's ranks", Duration::from_secs(60), || {
        svc.job(job)
            .filter(|j| j["ranks"].as_u64() == Some(4))
            .map(|_| ())
    });
    // Past one NIC read (every 5 s) with the port healthy: nothing.
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        svc.findings(job, "").is_empty(),
        "a finding before the fault: {:#?}",
        svc.findings(job, "")
    );

    port(sysfs.path(), 10, 1, "1: DOWN");
    let failed = Instant::now();
    let f = wait("a live link-error", Duration::from_secs(30), || {
        svc.findings(job, "open")
            .into_iter()
            .find(|f| f["kind"] == "link-error")
    });
    eprintln!(
        "nic: named {:.1} s after the port failed: {}",
        failed.elapsed().as_secs_f64(),
        f["summary"]
    );
    let out = runner.join().expect("runner");
    assert!(out.status.success(), "the job: {out:?}");
    svc.wait_job_ended(job, Duration::from_secs(60));
    let all = svc.findings(job, "");
    assert_eq!(all.len(), 1, "open or resolved: {all:#?}");
    let g = &all[0];
    assert_eq!(g["kind"], "link-error", "{g:#}");
    assert_eq!(g["ranks"], serde_json::json!([]), "{g:#}");
    assert_eq!(g["nodes"], serde_json::json!(["node-nic"]), "{g:#}");
    assert_eq!(
        g["link"],
        serde_json::json!({"src": "node-nic", "dst": "node-nic", "src_nic": "mlx5_0", "src_port": 1}),
        "{g:#}"
    );
    assert_eq!(
        g["evidence"]["events"],
        serde_json::json!({"symbol_error": 7, "link_downed": 1, "port down": 1}),
        "{g:#}"
    );
    let s = g["summary"].as_str().unwrap_or_default();
    assert!(
        s.starts_with("mlx5_0 port 1 on node-nic is down since"),
        "{s}"
    );

    // The collector's trace says the same.
    svc.wait_segments(job, Duration::from_secs(30));
    let v = analyze_json(&svc.trace_dir().join(job));
    let found = v["findings"].as_array().cloned().unwrap_or_default();
    assert_eq!(found.len(), 1, "analyze: {found:#?}\n{}", v["explain"]);
    assert_eq!(found[0]["kind"], "link-error", "{:#}", found[0]);
    assert_eq!(found[0]["link"], g["link"], "{:#}", found[0]);
    assert_eq!(found[0]["evidence"]["events"], g["evidence"]["events"]);
}
