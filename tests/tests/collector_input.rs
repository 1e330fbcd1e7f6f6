//! Bad input at the agent and the collector: garbage and malformed or oversized messages on the
//! gRPC port, protocol violations, shims of another layout version, an agent over its rate
//! limit, a full spool disk. Each gets a clear error; nothing crashes; nothing already accepted
//! is lost.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use commscope_tests::services::{
    Services, http_get, ingest_stream, metric, raw_records, run_with_agent,
};
use commscope_tests::{Flavour, assert_ok, build, launch};
use commscope_wire::grpc::ingest_client::IngestClient;
use commscope_wire::grpc::ingest_request::Payload;
use commscope_wire::grpc::{AgentHello, IngestRequest, ProcessId, RecordBatch};
use commscope_wire::op::Op;
use commscope_wire::record::Record;
use commscope_wire::registration::{Reply, Request, Status};
use tonic::codegen::http::uri::PathAndQuery;

/// Sends raw bytes as gRPC messages (no protobuf encoding).
#[derive(Clone, Copy, Debug, Default)]
struct Raw;
#[derive(Debug)]
struct RawEnc;
#[derive(Debug)]
struct RawDec;
impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEnc;
    type Decoder = RawDec;
    fn encoder(&mut self) -> RawEnc {
        RawEnc
    }
    fn decoder(&mut self) -> RawDec {
        RawDec
    }
}
impl tonic::codec::Encoder for RawEnc {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}
impl tonic::codec::Decoder for RawDec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

async fn raw_stream(url: &str, messages: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let resp = grpc
        .streaming(
            tonic::Request::new(tokio_stream::iter(messages)),
            PathAndQuery::from_static("/commscope.v1.Ingest/Stream"),
            Raw,
        )
        .await?;
    let mut s = resp.into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.message().await? {
        out.push(m);
    }
    Ok(out)
}

fn hello(layout: u32) -> IngestRequest {
    IngestRequest {
        batch_id: 1,
        agent_send_ns: 1,
        payload: Some(Payload::Hello(AgentHello {
            node: "tester".into(),
            agent_version: "test".into(),
            layout_version: layout,
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_refuses_garbage_and_malformed_messages_and_keeps_serving() {
    let svc = Services::start("node-bad", &["--max-message-bytes", "1048576"], &[]);
    let url = format!("http://{}", svc.grpc);

    // Plain garbage on the port: the connection is dropped.
    let mut s = std::net::TcpStream::connect(svc.grpc).expect("connect");
    s.write_all(b"\x00\xffGET / HTTP/1.0\r\n\r\nthis is not HTTP/2 at all \x13\x37")
        .expect("write");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);

    // Bytes that are not a protobuf message, in a well-formed gRPC stream.
    let before = metric(svc.http, "commscope_collector_bad_messages_total");
    let _ = raw_stream(&url, vec![vec![0xff; 64]]).await;
    // An oversized message (2 MiB, limit 1 MiB).
    let mut big = hello(1);
    big.payload = Some(Payload::Records(RecordBatch {
        process: Some(ProcessId {
            job: "j".into(),
            node: "n".into(),
            ..Default::default()
        }),
        record_size: 128,
        records: vec![0; 2 << 20],
        ..Default::default()
    }));
    let mut client = IngestClient::connect(url.clone()).await.expect("connect");
    let r = client.stream(tokio_stream::iter(vec![hello(1), big])).await;
    if let Ok(resp) = r {
        let mut acks = resp.into_inner();
        while let Ok(Some(_)) = acks.message().await {}
    }
    let t = Instant::now();
    while metric(svc.http, "commscope_collector_bad_messages_total") < before + 2.0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "bad messages counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Protocol violations get clear statuses.
    let err = client
        .stream(tokio_stream::iter(vec![IngestRequest {
            batch_id: 1,
            agent_send_ns: 1,
            payload: Some(Payload::Records(RecordBatch::default())),
        }]))
        .await;
    let status = match err {
        Ok(resp) => resp.into_inner().message().await.expect_err("refused"),
        Err(s) => s,
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status}");
    assert!(status.message().contains("first message"), "{status}");

    let newer = client.stream(tokio_stream::iter(vec![hello(2)])).await;
    let status = match newer {
        Ok(resp) => resp.into_inner().message().await.expect_err("refused"),
        Err(s) => s,
    };
    assert!(status.message().contains("layout version 2"), "{status}");

    // Records that are not whole records: refused for good, with a reason.
    let bad = IngestRequest {
        batch_id: 2,
        agent_send_ns: 1,
        payload: Some(Payload::Records(RecordBatch {
            process: Some(ProcessId {
                job: "j".into(),
                node: "n".into(),
                ..Default::default()
            }),
            record_size: 128,
            records: vec![1; 200],
            ..Default::default()
        })),
    };
    let mut acks = client
        .stream(tokio_stream::iter(vec![hello(1), bad]))
        .await
        .expect("stream")
        .into_inner();
    let a1 = acks.message().await.expect("ack").expect("hello ack");
    assert!(a1.durable && a1.error.is_empty());
    let a2 = acks.message().await.expect("ack").expect("batch ack");
    assert!(!a2.durable);
    assert_eq!(a2.retry_after_ms, 0, "a final refusal");
    assert!(a2.error.contains("not whole records"), "{}", a2.error);

    // Still healthy, and a real job still goes through completely.
    assert_eq!(http_get(svc.http, "/healthz").0, 200);
    let basic = build(Flavour::OpenMpi, "basic");
    let out = run_with_agent(
        &svc.socket,
        "after-garbage",
        &launch(Flavour::OpenMpi, 2, &basic, &["20"]),
        &[],
    );
    assert_ok(&out, "job");
    let j = svc.wait_job_ended("after-garbage", Duration::from_secs(60));
    assert_eq!(j["comms"][0]["ops"]["allreduce"], 40);
    let refused = metric(svc.http, "commscope_collector_refused_total");
    assert!(refused >= 3.0, "refusals counted: {refused}");
}

#[test]
fn shims_of_another_layout_version_are_refused_clearly() {
    let mut svc = Services::start("node-ver", &[], &[]);
    // The one before this version's, and the one after.
    let current = commscope_wire::shm::LAYOUT_VERSION as u16;
    for layout in [current - 1, current + 1] {
        let s = std::os::unix::net::UnixStream::connect(&svc.socket).expect("connect");
        let req = Request {
            version: 1,
            layout_version: layout,
            pid: std::process::id(),
            rank: 0,
            world_size: 1,
            start_time: 0,
            shm_size: 0,
            job: "old".into(),
            node: "n".into(),
            flavour: "mpich".into(),
        };
        (&s).write_all(&req.encode()).expect("write");
        let mut reply = [0u8; commscope_wire::registration::REPLY_SIZE];
        (&s).read_exact(&mut reply).expect("reply");
        assert_eq!(
            Reply::decode(&reply).map(|r| r.status),
            Ok(Status::UnsupportedVersion)
        );
    }
    let agent = svc.agent();
    agent.wait_log(&format!("layout {}", current + 1), Duration::from_secs(5));
    let log = agent.log();
    assert!(
        log.contains("different commscope versions"),
        "the agent says what to do: {log}"
    );
    assert_eq!(
        metric(
            svc.agent_http,
            "commscope_agent_registrations_refused_total"
        ),
        2.0
    );
    assert_eq!(http_get(svc.agent_http, "/healthz").0, 200);
}

/// Per process: no record twice, gaps only where counted; returns (stored allreduce calls,
/// dropped) per process.
fn stored_calls(svc: &Services, job: &str, api: &serde_json::Value) -> Vec<(u64, u64)> {
    let raw = raw_records(&svc.trace_dir().join(job));
    let mut out = Vec::new();
    for ((_, pid, _), (seqs, recs)) in &raw {
        assert!(seqs.values().all(|n| *n == 1), "pid {pid}: a record twice");
        let dropped = api["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == *pid)
            .and_then(|p| p["dropped"].as_u64())
            .expect("process");
        let max = *seqs.keys().next_back().expect("records");
        assert!(
            max - seqs.len() as u64 <= dropped,
            "pid {pid}: uncounted gap"
        );
        let calls = recs
            .iter()
            .filter(|r| matches!(r, Record::Call(c) if c.op() == Op::Allreduce))
            .count() as u64;
        out.push((calls, dropped));
    }
    out
}

#[test]
fn an_agent_over_its_rate_limit_is_slowed_down_and_loses_nothing() {
    let svc = Services::start("node-rate", &["--max-agent-rate", "2000"], &[]);
    let basic = build(Flavour::Mpich, "basic");
    let out = run_with_agent(
        &svc.socket,
        "rate-job",
        &launch(Flavour::Mpich, 2, &basic, &["3000"]),
        &[],
    );
    assert_ok(&out, "job");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("cannot register"), "{err}");
    let api = svc.wait_job_ended("rate-job", Duration::from_secs(90));
    svc.wait_segments("rate-job", Duration::from_secs(30));
    assert!(
        metric(
            svc.http,
            "commscope_collector_refused_total{reason=\"rate-limit\"}"
        ) > 0.0,
        "the limit was hit: {}",
        http_get(svc.http, "/metrics").1
    );
    assert!(metric(svc.agent_http, "commscope_agent_batches_retried_total") > 0.0);
    for (calls, dropped) in stored_calls(&svc, "rate-job", &api) {
        assert_eq!((calls, dropped), (3000, 0));
    }
}

struct Unmount(std::path::PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_spool_disk_stops_draining_and_every_record_is_stored_or_counted() {
    let mut svc = Services::start("node-full", &[], &["--spool-after", "500ms"]);
    // The agent again, with its spool on a 256 KiB file system.
    svc.agent().kill9();
    let spool = svc.spool_dir();
    std::fs::create_dir_all(&spool).expect("mkdir");
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&spool)
        .status()
        .expect("mount");
    assert!(
        st.success(),
        "mounting a small tmpfs for the spool (needs root)"
    );
    let _unmount = Unmount(spool.clone());
    svc.start_agent();
    svc.collector().kill9();

    let basic = build(Flavour::OpenMpi, "basic");
    let out = run_with_agent(
        &svc.socket,
        "full-spool",
        &launch(Flavour::OpenMpi, 4, &basic, &["3000"]),
        &[("COMMSCOPE_RING_RECORDS", "1024")],
    );
    assert_ok(&out, "the job runs on, unaffected");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("3000 all-reduces").count(), 4, "{text}");
    svc.agent()
        .wait_log("No space left on device", Duration::from_secs(20));

    svc.start_collector();
    let api = svc.wait_job_ended("full-spool", Duration::from_secs(90));
    svc.wait_segments("full-spool", Duration::from_secs(30));
    let per = stored_calls(&svc, "full-spool", &api);
    assert_eq!(per.len(), 4);
    let mut lost = 0;
    for (calls, dropped) in per {
        assert!(calls <= 3000);
        assert!(
            calls + dropped >= 3000,
            "{calls} all-reduces stored, {dropped} records counted as dropped, 3000 made"
        );
        lost += dropped;
    }
    assert!(lost > 0, "the full spool did cost records (counted)");
    assert_eq!(metric(svc.agent_http, "commscope_agent_spool_batches"), 0.0);
}

/// A record batch of `n` calls of process `pid` of `job` (its records `from..from + n`).
fn call_batch(batch_id: u64, job: &str, pid: u32, from: u64, n: u64) -> IngestRequest {
    use commscope_wire::record::Call;
    let calls = (from..from + n).map(|s| {
        Record::Call(Call {
            rec_seq: s,
            seq: s,
            ..Default::default()
        })
    });
    batch_of(batch_id, job, pid, calls.collect())
}

/// A record batch of `records` of process `pid` (rank 0 of 1) of `job`.
fn batch_of(batch_id: u64, job: &str, pid: u32, records: Vec<Record>) -> IngestRequest {
    IngestRequest {
        batch_id,
        agent_send_ns: 1,
        payload: Some(Payload::Records(RecordBatch {
            process: Some(ProcessId {
                job: job.into(),
                node: "tester".into(),
                pid,
                start_time: 1,
                rank: 0,
                world_size: 1,
                flavour: "mpich".into(),
                ..Default::default()
            }),
            record_size: commscope_wire::record::RECORD_SIZE as u32,
            records: records.iter().flat_map(|r| r.encode()).collect(),
            ..Default::default()
        })),
    }
}

/// Sends `msgs` on one stream and reads every answer: the batch ids answered durable.
async fn send_all(svc: &Services, msgs: Vec<IngestRequest>) -> Vec<u64> {
    ingest_stream(svc.grpc, msgs)
        .await
        .into_iter()
        .filter(|a| a.durable && a.batch_id > 1)
        .map(|a| a.batch_id)
        .collect()
}

fn hello_from(node: &str) -> IngestRequest {
    let mut h = hello(commscope_wire::record::RECORD_LAYOUT_VERSION);
    if let Some(Payload::Hello(x)) = &mut h.payload {
        x.node = node.into();
    }
    h
}

/// The collector's ingest budget (`--ingest-budget-bytes`, here 256 KiB) bounds the records read
/// and not yet stored: agents sending more at once wait for it and lose nothing, and an agent
/// that reads none of its acknowledgements holds none of it, because a batch returns its share
/// once stored and applied, not once answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_ingest_budget_slows_agents_down_and_one_that_reads_no_answers_holds_none() {
    let svc = Services::start(
        "node-budget",
        &["--ingest-budget-bytes", "256KiB"],
        &["--no-ebpf"],
    );
    let url = format!("http://{}", svc.grpc);

    // The deaf agent: 40,000 one-record batches (more answers than the stream's queue and an
    // HTTP/2 window hold), its answers never read.
    let deaf = 40_000u64;
    let mut msgs = vec![hello_from("deaf")];
    msgs.extend((1..=deaf).map(|i| call_batch(i + 1, "budget-deaf", 7, i, 1)));
    let mut deaf_client = IngestClient::connect(url).await.expect("connect");
    let _unread = deaf_client
        .stream(tokio_stream::iter(msgs))
        .await
        .expect("stream");

    // Four agents at once, 20 batches of 1,000 records (125 KiB) each: two batches fill the
    // budget.
    let (batches, per) = (20u64, 1000u64);
    let mut agents = Vec::new();
    for a in 0..4u32 {
        let grpc = svc.grpc;
        agents.push(tokio::spawn(async move {
            let mut msgs = vec![hello_from(&format!("busy-{a}"))];
            msgs.extend(
                (0..batches).map(|b| call_batch(b + 2, "budget-busy", 100 + a, b * per + 1, per)),
            );
            let mut durable = 0;
            for a in ingest_stream(grpc, msgs).await {
                assert!(a.error.is_empty(), "{a:?}");
                durable += u64::from(a.durable && a.batch_id > 1);
            }
            durable
        }));
    }
    for a in agents {
        let durable = tokio::time::timeout(Duration::from_secs(120), a)
            .await
            .expect("the busy agents were answered")
            .expect("agent task");
        assert_eq!(durable, batches);
    }
    let records = |job: &str| {
        svc.job(job)
            .and_then(|j| j["records"].as_u64())
            .unwrap_or(0)
    };
    assert_eq!(records("budget-busy"), 4 * batches * per);
    // The deaf agent's batches are all stored and applied although it reads no answer.
    let t = Instant::now();
    while records("budget-deaf") < deaf {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the deaf agent's records applied: {} of {deaf}",
            records("budget-deaf")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(records("budget-deaf"), deaf);
    assert!(
        metric(svc.http, "commscope_collector_ingest_budget_waits_total") > 0.0,
        "the busy agents waited for the budget"
    );
    assert_eq!(
        metric(svc.http, "commscope_collector_ingest_budget_held_bytes"),
        0.0,
        "all of the budget returned"
    );
}

/// Records of a job that ended, sent late (from an agent's spool) to a collector restarted since:
/// the job's exit is stored already and will not come again, so the job must stay ended rather
/// than come back as running with a silent rank (the soak once saw such a job never end and
/// reported as hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_records_of_a_job_that_ended_before_a_restart_do_not_bring_it_back() {
    use commscope_wire::op::flags;
    use commscope_wire::record::{EXIT_STATUS_UNKNOWN, Process, ProcessEvent};
    let mut svc = Services::start("node-late", &[], &["--no-ebpf"]);
    let exit = Record::Process(Process {
        rec_seq: 10,
        event: ProcessEvent::Exit,
        flags: flags::OBSERVED,
        t_mono: 0,
        t_real: 0,
        pid: 9,
        exit_status: EXIT_STATUS_UNKNOWN,
        start_time: 1,
        rank: 0,
        world_size: 1,
        signal: 0,
        step: 0,
    });
    // Records 1-3 and the exit (10); 4-9 are held back, as an agent's spool would.
    let acked = send_all(
        &svc,
        vec![
            hello_from("late"),
            call_batch(2, "late-job", 9, 1, 3),
            batch_of(3, "late-job", 9, vec![exit]),
        ],
    )
    .await;
    assert_eq!(acked, vec![2, 3]);
    let state = |svc: &Services| {
        svc.job("late-job")
            .map(|j| j["state"].as_str().unwrap_or_default().to_owned())
    };
    let t = Instant::now();
    while state(&svc).as_deref() != Some("ended") {
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", state(&svc));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    svc.collector().stop();
    svc.start_collector();
    let acked = send_all(
        &svc,
        vec![hello_from("late"), call_batch(2, "late-job", 9, 4, 6)],
    )
    .await;
    assert_eq!(acked, vec![2]);
    let job = svc.job("late-job").expect("the job");
    assert_eq!(job["state"], "ended", "{job:#}");
    assert_eq!(job["records"], 6, "the late records applied: {job:#}");
    let log = svc.collector.as_ref().expect("collector").log();
    assert!(
        log.contains("records of job late-job came after it ended"),
        "{log}"
    );
    assert!(svc.findings("late-job", "open").is_empty());
}

/// One process's batch of `n` calls from `from` (the payload of [`call_batch`]).
fn records_of(job: &str, pid: u32, from: u64, n: u64) -> RecordBatch {
    match call_batch(0, job, pid, from, n).payload {
        Some(Payload::Records(b)) => b,
        other => panic!("call_batch made {other:?}"),
    }
}

/// A node's processes' records in one message (`node_records`): offered in the hello's answer,
/// each batch stored and applied as a message of its own would be, one durable answer for all;
/// a malformed batch among them refuses the whole message finally, saying which, and a message
/// without batches is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_records_in_one_message_are_stored_and_answered_once() {
    use commscope_wire::grpc::NodeRecords;
    let svc = Services::start("node-together", &[], &["--no-ebpf"]);
    let job = "together";
    let mut broken = records_of(job, 10, 1, 10);
    broken.records.truncate(broken.records.len() - 3);
    let node = |id: u64, batches: Vec<RecordBatch>| IngestRequest {
        batch_id: id,
        agent_send_ns: 1,
        payload: Some(Payload::NodeRecords(NodeRecords { batches })),
    };
    let mut hello = hello_from("together-node");
    hello.batch_id = 1;
    let acks = ingest_stream(
        svc.grpc,
        vec![
            hello,
            node(
                2,
                vec![records_of(job, 7, 1, 100), records_of(job, 8, 1, 50)],
            ),
            node(3, vec![records_of(job, 9, 1, 10), broken]),
            node(4, vec![]),
        ],
    )
    .await;
    let by_id = |id: u64| {
        acks.iter()
            .find(|a| a.batch_id == id)
            .unwrap_or_else(|| panic!("no answer to {id}: {acks:?}"))
    };
    assert!(
        by_id(1).node_records,
        "the hello's answer offers node records"
    );
    let stored = by_id(2);
    assert!(stored.durable && stored.error.is_empty(), "{stored:?}");
    let refused = by_id(3);
    assert!(
        !refused.durable && refused.retry_after_ms == 0,
        "{refused:?}"
    );
    assert!(
        refused.error.starts_with("batch 1 of the node's records: ")
            && refused.error.contains("not whole records"),
        "{}",
        refused.error
    );
    let empty = by_id(4);
    assert!(
        !empty.durable && empty.error.contains("without any batch"),
        "{empty:?}"
    );
    // Both processes of the stored message are in the live state, none of the refused one.
    let records = || {
        svc.job(job)
            .and_then(|j| j["records"].as_u64())
            .unwrap_or(0)
    };
    let t = Instant::now();
    while records() < 150 && t.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(records(), 150);
    let pids: Vec<(u64, u64)> = svc
        .job(job)
        .and_then(|j| j["processes"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| Some((p["pid"].as_u64()?, p["records"].as_u64()?)))
        .collect();
    assert_eq!(pids, vec![(7, 100), (8, 50)]);
}
