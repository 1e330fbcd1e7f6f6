//! Job history: jobs on disk stay listed with their findings after `--job-linger` released them
//! from memory, and after the collector was killed with SIGKILL and restarted.

use std::process::Command;
use std::time::Duration;

use commscope_tests::services::{Services, run_with_agent};
use commscope_tests::{Flavour, assert_ok, build, launch, wait};

fn json(svc: &Services, path: &str) -> serde_json::Value {
    let (status, body) = svc.get(path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

fn ended_jobs(svc: &Services) -> Vec<String> {
    json(svc, "/api/v1/jobs?state=ended")["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["job"].as_str().expect("name").to_owned())
        .collect()
}

/// What a client would compare before and after: the job's line without its clock fields, and
/// its findings.
fn record_of(svc: &Services, job: &str) -> (serde_json::Value, serde_json::Value) {
    let d = json(svc, &format!("/api/v1/jobs/{job}"));
    let line = serde_json::json!({
        "job": d["job"], "state": d["state"], "ranks": d["ranks"], "nodes": d["nodes"],
        "records": d["records"], "flavour": d["flavour"],
    });
    (line, d["findings"].clone())
}

#[test]
fn jobs_and_findings_outlive_release_and_a_collector_killed_with_sigkill() {
    let mut svc = Services::start("node-hist", &["--job-linger", "1s"], &[]);

    // A clean job, and a job that hangs (rank 2 never enters the all-reduce) and is killed.
    let basic = build(Flavour::Mpich, "basic");
    let out = run_with_agent(
        &svc.socket,
        "hist-clean",
        &launch(Flavour::Mpich, 4, &basic, &["50"]),
        &[],
    );
    assert_ok(&out, "clean job");
    let hang = build(Flavour::Mpich, "hang");
    let socket = svc.socket.clone();
    let cmd = launch(Flavour::Mpich, 4, &hang, &["2"]);
    let job = std::thread::spawn(move || run_with_agent(&socket, "hist-hang", &cmd, &[]));
    let hang_id = wait("the hang finding", Duration::from_secs(60), || {
        let v = json(&svc, "/api/v1/findings?job=hist-hang&state=open");
        v["findings"][0]["id"].as_str().map(str::to_owned)
    });
    let _ = Command::new("pkill")
        .args(["-9", "-f", hang.to_str().expect("utf-8")])
        .status();
    let _ = job.join();

    // Both end, are released from memory after a second, and are still listed.
    wait("both jobs released", Duration::from_secs(60), || {
        let log = svc.collector().log();
        (log.contains("job hist-clean released") && log.contains("job hist-hang released"))
            .then_some(())
    });
    assert_eq!(
        ended_jobs(&svc),
        ["hist-clean", "hist-hang"],
        "{}",
        svc.collector().log()
    );
    let before_clean = record_of(&svc, "hist-clean");
    let before_hang = record_of(&svc, "hist-hang");
    assert_eq!(before_clean.0["ranks"], 4);
    assert_eq!(
        before_clean.1,
        serde_json::json!([]),
        "a clean job has no finding"
    );
    let findings = before_hang.1.as_array().expect("findings");
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(findings[0]["id"], hang_id.as_str());
    assert_eq!(findings[0]["kind"], "hang");
    assert_eq!(findings[0]["state"], "resolved", "the job ended");
    assert_eq!(findings[0]["ranks"], serde_json::json!([2]));
    let summary = findings[0]["summary"].as_str().expect("summary");
    assert!(
        summary.starts_with("rank 2 on node-hist has not entered allreduce"),
        "{summary}"
    );

    // SIGKILL, restart: the same jobs, the same findings.
    svc.collector().kill9();
    svc.start_collector();
    assert_eq!(ended_jobs(&svc), ["hist-clean", "hist-hang"]);
    assert_eq!(record_of(&svc, "hist-clean"), before_clean);
    assert_eq!(record_of(&svc, "hist-hang"), before_hang);
    let all = json(&svc, "/api/v1/findings?state=resolved");
    assert_eq!(all["findings"].as_array().map(Vec::len), Some(1), "{all}");
    let open = json(&svc, "/api/v1/findings?state=open");
    assert_eq!(open["findings"], serde_json::json!([]), "{open}");
    let d = json(&svc, "/api/v1/jobs/hist-hang");
    let trace = std::path::PathBuf::from(d["trace"].as_str().expect("trace dir"));
    assert!(
        std::fs::read_dir(&trace)
            .expect("trace dir")
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "parquet")),
        "the job's segments are where the API says"
    );
    let (status, _) = svc.get("/api/v1/jobs/no-such-job");
    assert_eq!(status, 404);
}
