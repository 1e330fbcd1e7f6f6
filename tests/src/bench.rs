//! Helpers of the benchmark binaries (`scripts/bench.sh collector`, `scripts/bench.sh scale`):
//! collector processes, synthetic record batches, and replaying them as agents would.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::services::{free_port, http_get};
use commscope_wire::grpc::ingest_client::IngestClient;
use commscope_wire::grpc::ingest_request::Payload;
use commscope_wire::grpc::{AgentHello, IngestRequest, ProcessId};
use commscope_wire::op::{Op, dtype};
use commscope_wire::record::{Call, Record};

/// The value after `name` on the command line, or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn release_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("exe");
    let dir = exe.parent().expect("dir").to_path_buf();
    let dir = if dir.ends_with("deps") {
        dir.parent().expect("up").to_path_buf()
    } else {
        dir
    };
    dir.join("commscope")
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}

pub fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0)
        * 1024
}

/// A `commscope collector` process (release build) in a temporary directory.
#[derive(Debug)]
pub struct Collector {
    pub child: Child,
    pub grpc: String,
    pub http: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a collector with `extra` flags; returns once it is ready.
pub fn start_collector(extra: &[&str]) -> Collector {
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()))
            .expect("tempdir");
    let (g, h) = (free_port(), free_port());
    let child = Command::new(release_bin())
        .arg("collector")
        .arg("--listen")
        .arg(format!("127.0.0.1:{g}"))
        .arg("--http")
        .arg(format!("127.0.0.1:{h}"))
        .arg("--trace-dir")
        .arg(dir.path())
        .arg("--max-agent-rate")
        .arg("1000000000")
        .arg("--max-message-bytes")
        .arg("67108864")
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .expect("start the collector (cargo build --release first)");
    let http = std::net::SocketAddr::from(([127, 0, 0, 1], h));
    let t = Instant::now();
    while http_get(http, "/readyz").0 != 200 {
        assert!(t.elapsed() < Duration::from_secs(20), "collector not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    Collector {
        child,
        grpc: format!("http://127.0.0.1:{g}"),
        http,
        _dir: dir,
    }
}

pub fn process(job: &str, node: &str, pid: u32, rank: i32, world: i32) -> ProcessId {
    ProcessId {
        job: job.into(),
        node: node.into(),
        pid,
        start_time: 1000 + u64::from(pid),
        rank,
        world_size: world,
        flavour: "openmpi".into(),
        mono_anchor_ns: 1,
        real_anchor_ns: 1_700_000_000_000_000_000,
        library: String::new(),
        attribution: None,
    }
}

/// `n` call records of a rank, from `first` on: all-reduces on one communicator with realistic
/// timestamps.
pub fn calls(rank: i32, first: u64, n: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n as usize * 128);
    for i in 0..n {
        let seq = first + i;
        let t = 1_000_000_000 + seq * 25_000;
        out.extend_from_slice(
            &Record::Call(Call {
                rec_seq: seq,
                op: Op::Allreduce as u8,
                comm_id: 0x3f1a_2b3c_4d5e_6f70,
                seq,
                op_seq: seq,
                bytes: 1 << 20,
                count: 1 << 18,
                peer: -1,
                tag: -1,
                t_enter: t,
                t_exit: t + 20_000 + (seq * 7919) % 3000,
                rank,
                comm_rank: rank,
                comm_size: 8,
                dtype: dtype::FLOAT,
                clock: 1,
                peer2: -1,
                tag2: -1,
                ..Default::default()
            })
            .encode(),
        );
    }
    out
}

/// Replays pre-encoded batches, one stream per `(collector URL, batches)`, each stream its own
/// node; returns (records, seconds).
pub async fn replay(streams: Vec<(String, Vec<IngestRequest>)>) -> (u64, f64) {
    let mut handles = Vec::new();
    let start = Instant::now();
    for (s, (url, reqs)) in streams.into_iter().enumerate() {
        handles.push(tokio::spawn(async move {
            let mut client = IngestClient::connect(url)
                .await
                .expect("connect")
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20);
            let (tx, rx) = tokio::sync::mpsc::channel::<IngestRequest>(64);
            tx.send(IngestRequest {
                batch_id: 0,
                agent_send_ns: 1,
                payload: Some(Payload::Hello(AgentHello {
                    node: format!("bench-{s}"),
                    agent_version: "bench".into(),
                    layout_version: 1,
                })),
            })
            .await
            .expect("hello");
            let n = reqs.len();
            let records: u64 = reqs
                .iter()
                .map(|r| match &r.payload {
                    Some(Payload::Records(b)) => (b.records.len() / 128) as u64,
                    _ => 0,
                })
                .sum();
            let mut acks = client
                .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .expect("stream")
                .into_inner();
            // The sender is bounded by the channel (64 in flight), like an agent's window.
            let sender = tokio::spawn(async move {
                for r in reqs {
                    if tx.send(r).await.is_err() {
                        break;
                    }
                }
            });
            let mut got = 0;
            while got <= n {
                match acks.message().await {
                    Ok(Some(a)) => {
                        assert!(a.error.is_empty(), "refused: {}", a.error);
                        got += 1;
                    }
                    _ => break,
                }
            }
            let _ = sender.await;
            records
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.expect("stream task");
    }
    (total, start.elapsed().as_secs_f64())
}
