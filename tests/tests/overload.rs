//! The collector at its memory bound, through a real agent and real 8-rank MPI jobs. Its
//! resident memory is read from a file here (the collector's test double,
//! `COMMSCOPE_TEST_RSS_FILE`), so the test drives its states; everything else is real.
//!
//! Full: record batches are refused with a retry delay, the agent holds them and sends them
//! again, and once memory is back under the bound every record arrives, with no finding made
//! of the hold-up. Pressed: a real fault is still named, and its finding says the collector was
//! overloaded.

use std::path::Path;
use std::time::{Duration, Instant};

use commscope_tests::services::{Services, metric, run_with_agent, show_findings};
use commscope_tests::{Flavour, build, launch, wait};

const LIMIT: u64 = 1 << 30;

fn set_rss(file: &Path, bytes: u64) {
    std::fs::write(file, bytes.to_string()).expect("write the resident-memory file");
}

fn collector_state(svc: &Services) -> serde_json::Value {
    let (code, body) = svc.get("/api/v1/collector");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("collector status JSON")
}

fn wait_state(svc: &Services, want: &str) -> serde_json::Value {
    wait(
        &format!("the collector's memory state {want}"),
        Duration::from_secs(5),
        || {
            let s = collector_state(svc);
            (s["memory"]["state"] == want).then_some(s)
        },
    )
}

#[test]
fn at_its_memory_bound_the_collector_holds_agents_back_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rss = dir.path().join("rss");
    set_rss(&rss, 0);
    // SAFETY: the only test of this binary, before any thread of its own starts; the collector
    // started next inherits it.
    unsafe { std::env::set_var("COMMSCOPE_TEST_RSS_FILE", &rss) };
    let svc = Services::start("node-ovl", &["--memory-limit", "1G"], &[]);
    let s = wait_state(&svc, "normal");
    assert_eq!(s["memory"]["memory_limit_bytes"], LIMIT);

    // Full: a healthy job runs while every record batch is refused for now.
    set_rss(&rss, LIMIT);
    let full = wait_state(&svc, "full");
    assert!(
        full["memory"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("at its memory bound")),
        "{full}"
    );
    let program = build(Flavour::OpenMpi, "train");
    let job = "overload-full";
    let cmd = launch(
        Flavour::OpenMpi,
        8,
        &program,
        &["healthy", "0", "0", "1500"],
    );
    let out = std::thread::scope(|sc| {
        let runner = sc.spawn(|| run_with_agent(&svc.socket, job, &cmd, &[]));
        wait(
            "the agent to be asked to send batches again",
            Duration::from_secs(30),
            || {
                (metric(svc.agent_http, "commscope_agent_batches_retried_total") >= 3.0)
                    .then_some(())
            },
        );
        assert!(
            metric(
                svc.http,
                "commscope_collector_refused_total{reason=\"memory\"}"
            ) >= 3.0
        );
        assert_eq!(metric(svc.http, "commscope_collector_overload"), 2.0);
        // Held back for a while, then relieved.
        std::thread::sleep(Duration::from_secs(3));
        set_rss(&rss, 0);
        runner.join().expect("runner")
    });
    assert!(out.status.success(), "{out:?}");
    let relieved = wait_state(&svc, "normal");
    assert!(
        relieved["memory"]["refused_batches"].as_u64() >= Some(3)
            && relieved["memory"]["refused_records"].as_u64()
                >= relieved["memory"]["refused_batches"].as_u64(),
        "{relieved}"
    );
    svc.wait_job_ended(job, Duration::from_secs(60));
    // Every record read from the rings was acknowledged; none refused for good.
    let read = metric(svc.agent_http, "commscope_agent_records_read_total");
    wait(
        "every record read to be acknowledged",
        Duration::from_secs(30),
        || (metric(svc.agent_http, "commscope_agent_records_acked_total") >= read).then_some(()),
    );
    assert!(read > 8.0 * 3000.0, "{read} records read");
    assert_eq!(
        metric(svc.agent_http, "commscope_agent_records_refused_total"),
        0.0
    );
    let j = svc.job(job).expect("the job");
    assert!(
        j["records"].as_f64() >= Some(read),
        "the collector has {} records of the {read} read",
        j["records"]
    );
    // The hold-up is no finding.
    std::thread::sleep(Duration::from_secs(2));
    let found = svc.every_finding(job);
    assert!(found.is_empty(), "{}", show_findings(&found));

    // Pressed: nothing is refused, a real fault is named, and its finding says the collector
    // was near its bound.
    set_rss(&rss, LIMIT * 85 / 100);
    wait_state(&svc, "pressed");
    let job = "overload-pressed";
    let cmd = launch(Flavour::OpenMpi, 8, &program, &["exit", "4", "20", "400"]);
    let t = Instant::now();
    let _ = run_with_agent(&svc.socket, job, &cmd, &[]);
    svc.wait_job_ended(job, Duration::from_secs(60));
    let found = wait("the dead rank's finding", Duration::from_secs(20), || {
        let f = svc.every_finding(job);
        (!f.is_empty()).then_some(f)
    });
    assert_eq!(found.len(), 1, "{}", show_findings(&found));
    assert_eq!(found[0]["kind"], "dead-rank", "{}", show_findings(&found));
    assert_eq!(found[0]["ranks"], serde_json::json!([4]));
    assert_eq!(
        found[0]["evidence"]["overload"]["state"], "pressed",
        "{:#}",
        found[0]
    );
    eprintln!(
        "pressed: {} named {:.1} s after the job started; full: {read} records held back and all delivered",
        found[0]["summary"],
        t.elapsed().as_secs_f64()
    );
}
