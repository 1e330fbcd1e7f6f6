//! The collector's shared token and per-agent bounds (docs/security.md), with real processes:
//! an agent without the token is refused and both sides say so; with it, the job is recorded;
//! the HTTP API, `/metrics` and the Query service refuse requests without it while the health
//! checks stay open; one agent is held to its jobs and ranks.

use std::time::Duration;

use commscope_tests::services::{Services, http_get_with, run_with_agent};
use commscope_tests::{Flavour, assert_ok, build, launch, wait};
use commscope_wire::grpc::ListJobsRequest;
use commscope_wire::grpc::query_client::QueryClient;

const TOKEN: &str = "9f2c-commscope-test-token";

fn token_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let f = dir.join(name);
    std::fs::write(&f, format!("{text}\n")).expect("token file");
    f.to_str().expect("utf-8").to_owned()
}

/// `GET path` with the right token, the wrong one, and none: their statuses and bodies.
fn get(svc: &Services, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    http_get_with(svc.http, path, &headers)
}

/// `ListJobs` on the collector's Query service with `token` (None: without one).
fn list_jobs(svc: &Services, token: Option<&str>) -> Result<usize, tonic::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", svc.grpc))
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let t = token.map(|t| commscope_wire::auth::Token::new(t).expect("token"));
        let mut c = QueryClient::with_interceptor(ch, commscope_wire::auth::Token::interceptor(t));
        c.list_jobs(ListJobsRequest {
            include_ended: true,
        })
        .await
        .map(|r| r.into_inner().jobs.len())
    })
}

#[test]
fn without_the_token_an_agent_and_every_api_are_refused_and_with_it_a_job_is_recorded() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let good = token_file(tmp.path(), "good", TOKEN);
    let wrong = token_file(tmp.path(), "wrong", "not-the-collectors-token!");
    let prog = build(Flavour::Mpich, "basic");

    // An agent with the wrong token: refused, and both logs say so.
    let mut svc = Services::start(
        "node-sec",
        &["--auth-token-file", &good],
        &["--auth-token-file", &wrong, "--no-ebpf"],
    );
    let agent_log = wait("the agent's refusal", Duration::from_secs(20), || {
        let log = svc.agent.as_ref()?.log();
        log.contains(
            "the collector refused this agent's credentials: the token is not this collector's",
        )
        .then_some(log)
    });
    assert_eq!(
        agent_log
            .matches("refused this agent's credentials")
            .count(),
        1,
        "logged once, not at every retry: {agent_log}"
    );
    let collector = svc.collector.as_ref().expect("collector");
    collector.wait_log(
        "refused an agent stream from 127.0.0.1:",
        Duration::from_secs(10),
    );
    assert!(
        collector
            .log()
            .contains("the token is not this collector's"),
        "{}",
        collector.log()
    );
    let out = run_with_agent(
        &svc.socket,
        "refused-job",
        &launch(Flavour::Mpich, 2, &prog, &["50"]),
        &[],
    );
    assert_ok(
        &out,
        "a job under an agent the collector refuses still runs",
    );

    // The APIs: nothing without the token, the health checks open.
    for path in [
        "/api/v1/jobs",
        "/api/v1/findings",
        "/metrics",
        "/api/v1/jobs/refused-job",
    ] {
        let (code, body) = get(&svc, path, None);
        assert_eq!(code, 401, "{path}: {body}");
        assert!(body.contains("requires a token"), "{path}: {body}");
        assert_eq!(
            get(&svc, path, Some("not-the-collectors-token!")).0,
            401,
            "{path}"
        );
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(get(&svc, path, None).0, 200, "{path}");
    }
    let (code, jobs) = get(&svc, "/api/v1/jobs", Some(TOKEN));
    assert_eq!(code, 200, "{jobs}");
    assert!(
        !jobs.contains("refused-job"),
        "nothing of the refused agent is stored: {jobs}"
    );
    let e = list_jobs(&svc, None).expect_err("no token");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("--auth-token-file"), "{e:?}");
    let e = list_jobs(&svc, Some("not-the-collectors-token!")).expect_err("wrong token");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert_eq!(list_jobs(&svc, Some(TOKEN)).expect("the right token"), 0);

    // The same agent with the right token: the next job is recorded.
    svc.agent().stop();
    svc.agent_args = vec!["--auth-token-file".into(), good.clone(), "--no-ebpf".into()];
    svc.start_agent();
    let out = run_with_agent(
        &svc.socket,
        "admitted-job",
        &launch(Flavour::Mpich, 2, &prog, &["50"]),
        &[],
    );
    assert_ok(&out, "admitted job");
    let job = wait("the admitted job's end", Duration::from_secs(60), || {
        let (code, body) = get(&svc, "/api/v1/jobs/admitted-job", Some(TOKEN));
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200 && v["state"] == "ended").then_some(v)
    });
    assert_eq!(job["ranks"], 2, "{job}");
    assert!(job["records"].as_u64().unwrap_or(0) > 100, "{job}");
    // What the refused agent kept (its spool, and what it still held when it stopped) arrives
    // once it is admitted: nothing was lost.
    let kept = wait(
        "the refused job's spooled records",
        Duration::from_secs(60),
        || {
            let (code, body) = get(&svc, "/api/v1/jobs/refused-job", Some(TOKEN));
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            (code == 200 && v["state"] == "ended").then_some(v)
        },
    );
    assert_eq!(kept["ranks"], 2, "{kept}");
    assert!(kept["records"].as_u64().unwrap_or(0) > 100, "{kept}");
    let (_, m) = get(&svc, "/metrics", Some(TOKEN));
    let refused = m
        .lines()
        .find(|l| l.starts_with("commscope_collector_refused_total{reason=\"auth\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    // The stream, the unauthenticated API requests and queries above: 1 + 8 + 2 at least.
    assert!(refused >= 11.0, "{refused}\n{m}");
}

#[test]
fn one_agent_is_held_to_its_jobs_and_ranks_and_counts_what_was_refused() {
    let svc = Services::start(
        "node-bounds",
        &["--max-jobs-per-agent", "2", "--max-ranks-per-agent", "3"],
        &["--no-ebpf"],
    );
    let prog = build(Flavour::Mpich, "basic");
    let run = |job: &str, ranks: u32| {
        let out = run_with_agent(
            &svc.socket,
            job,
            &launch(Flavour::Mpich, ranks, &prog, &["50"]),
            &[],
        );
        assert_ok(&out, job);
    };
    // Two ranks; then a job whose second rank is one process too many (the collector knows
    // one of its two ranks: it never sees it end); then a third job.
    run("bound-a", 2);
    assert_eq!(
        svc.wait_job_ended("bound-a", Duration::from_secs(60))["ranks"],
        2
    );
    run("bound-b", 2);
    let b = wait("bound-b's admitted rank", Duration::from_secs(30), || {
        let j = svc.job("bound-b")?;
        (j["processes"]
            .as_array()?
            .iter()
            .any(|p| p["state"] != "running"))
        .then_some(j)
    });
    assert_eq!(b["ranks"], 1, "{b}");
    let out = run_with_agent(
        &svc.socket,
        "bound-c",
        &launch(Flavour::Mpich, 1, &prog, &["50"]),
        &[],
    );
    assert_ok(&out, "a job over the bound still runs");
    let (_, m) = wait("the refusals counted", Duration::from_secs(30), || {
        let (code, m) = svc.get("/metrics");
        (m.contains("commscope_collector_refused_total{reason=\"agent-jobs\"}")
            && m.contains("commscope_collector_refused_total{reason=\"agent-ranks\"}"))
        .then_some((code, m))
    });
    assert!(!m.contains("job_id=\"bound-c\""), "{m}");
    let (_, jobs) = svc.get("/api/v1/jobs");
    assert!(!jobs.contains("bound-c"), "{jobs}");
    // The agent counts the refused records as dropped, with their reason.
    let agent = svc.agent.as_ref().expect("agent");
    let (_, am) = commscope_tests::services::http_get(svc.agent_http, "/metrics");
    let refused = am
        .lines()
        .find(|l| l.starts_with("commscope_agent_records_refused_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(refused > 0.0, "{am}\n{}", agent.log());
    assert!(
        agent
            .log()
            .contains("most one agent may (--max-jobs-per-agent); job bound-c is refused"),
        "{}",
        agent.log()
    );
}

/// Whatever a collector takes from an agent is held to the agent's bounds: an in-flight snapshot
/// or a stack probe of a job over `--max-jobs-per-agent` is refused like its records (a snapshot
/// of such a job once slipped through and made it known).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_probes_of_a_job_over_the_bound_are_refused_like_its_records() {
    use commscope_wire::grpc::ingest_request::Payload;
    use commscope_wire::grpc::{
        AgentHello, InFlightSnapshot, IngestRequest, ProcessId, ProcessProbe, RecordBatch,
    };
    use commscope_wire::record::{Call, RECORD_SIZE, Record};
    let svc = Services::start("node-snap", &["--max-jobs-per-agent", "1"], &["--no-ebpf"]);
    let process = |job: &str| ProcessId {
        job: job.into(),
        node: "intruder".into(),
        pid: 4242,
        start_time: 7,
        rank: 0,
        world_size: 1,
        ..Default::default()
    };
    let msg = |batch_id: u64, payload: Payload| IngestRequest {
        batch_id,
        agent_send_ns: 1,
        payload: Some(payload),
    };
    let snapshot = |job: &str| {
        Payload::InFlight(InFlightSnapshot {
            process: Some(process(job)),
            t_mono_ns: 1,
            ..Default::default()
        })
    };
    let messages = vec![
        msg(
            1,
            Payload::Hello(AgentHello {
                node: "intruder".into(),
                agent_version: "test".into(),
                layout_version: commscope_wire::record::RECORD_LAYOUT_VERSION,
            }),
        ),
        msg(
            2,
            Payload::Records(RecordBatch {
                process: Some(process("snap-admitted")),
                record_size: RECORD_SIZE as u32,
                records: Record::Call(Call {
                    rec_seq: 1,
                    seq: 1,
                    ..Default::default()
                })
                .encode()
                .to_vec(),
                ..Default::default()
            }),
        ),
        msg(3, snapshot("snap-over")),
        msg(
            4,
            Payload::Probe(ProcessProbe {
                process: Some(process("snap-probed")),
                native_stack: "#0 main".into(),
                ..Default::default()
            }),
        ),
    ];
    let by_id: std::collections::HashMap<u64, _> =
        commscope_tests::services::ingest_stream(svc.grpc, messages)
            .await
            .into_iter()
            .map(|a| (a.batch_id, a))
            .collect();
    assert!(by_id[&2].durable && by_id[&2].error.is_empty(), "{by_id:?}");
    for id in [3, 4] {
        let a = &by_id[&id];
        assert!(!a.durable, "{a:?}");
        assert_eq!(a.retry_after_ms, 0, "a final refusal: {a:?}");
        assert!(a.error.contains("--max-jobs-per-agent"), "{a:?}");
    }
    let (_, jobs) = svc.get("/api/v1/jobs");
    assert!(jobs.contains("snap-admitted"), "{jobs}");
    assert!(
        !jobs.contains("snap-over") && !jobs.contains("snap-probed"),
        "{jobs}"
    );
    let (_, m) = svc.get("/metrics");
    let refused = m
        .lines()
        .find(|l| l.starts_with("commscope_collector_refused_total{reason=\"agent-jobs\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert_eq!(refused, 2.0, "{m}");
}
