//! Scale-out benchmark (a separate command, never part of the tests): collector CPU-seconds per
//! million records with one job and with eight, on one collector and on two (each job routed
//! to its replica by rendezvous hashing, as agents do), and the shards' effect inside one.
//!
//! The same synthetic load each time: `--records` call records from 32 ranks on 4 nodes (8
//! per node), batches of `--batch`; with eight jobs each job has 4 ranks. A node's stream per
//! replica carries its ranks' batches. Reported per case:
//! - ingest: records/s acknowledged durable, and collector CPU per million records while
//!   ingesting (all replicas together);
//! - total: CPU per million including the Parquet segments, written at a clean stop;
//! - spread: the busiest thread's share of the collector's CPU (lower: the work runs on more
//!   threads, so more cores can take it; on two cores the wall clock cannot show it).
//!
//! Run: `scripts/bench.sh scale [--records N] [--batch B]`.

use std::time::Instant;

use commscope_tests::bench::{
    Collector, arg, calls, cpu_seconds, process, replay, start_collector,
};
use commscope_wire::grpc::ingest_request::Payload;
use commscope_wire::grpc::{IngestRequest, RecordBatch};

const NODES: u64 = 4;
const PER_NODE: u64 = 8;

/// Per-thread CPU seconds of a process: (thread name, seconds).
fn threads(pid: u32) -> Vec<(String, f64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    dir.flatten()
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(") ")?;
            let name = head.split_once(" (")?.1.to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            Some((name, (ticks(11) + ticks(12)) / hz))
        })
        .collect()
}

/// Stops a collector cleanly (its logs become segments) and returns its whole CPU time.
fn stop(c: &Collector) -> f64 {
    let pid = c.child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child with valid out-pointers.
    unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    ru.ru_utime.tv_sec as f64
        + ru.ru_utime.tv_usec as f64 / 1e6
        + ru.ru_stime.tv_sec as f64
        + ru.ru_stime.tv_usec as f64 / 1e6
}

/// The streams of the load: per (node, replica), the batches of that node's ranks whose job
/// the replica owns, interleaved as an agent sends them.
fn load(records: u64, batch: u64, jobs: u64, urls: &[String]) -> Vec<(String, Vec<IngestRequest>)> {
    let ranks = NODES * PER_NODE;
    let per_job = ranks / jobs;
    let per_rank = records / ranks;
    let job_of = |rank: u64| format!("scale-{}", rank / per_job);
    let mut out = Vec::new();
    let mut id = 1u64;
    for node in 0..NODES {
        let mut streams: Vec<Vec<IngestRequest>> = vec![Vec::new(); urls.len()];
        let mut next = vec![1u64; PER_NODE as usize];
        loop {
            let mut any = false;
            for p in 0..PER_NODE {
                let n = batch.min(per_rank + 1 - next[p as usize]);
                if n == 0 {
                    continue;
                }
                any = true;
                let rank = node * PER_NODE + p;
                let job = job_of(rank);
                let replica = commscope_wire::route::replica_of(&job, urls).unwrap_or(0);
                streams[replica].push(IngestRequest {
                    batch_id: id,
                    agent_send_ns: 1,
                    payload: Some(Payload::Records(RecordBatch {
                        process: Some(process(
                            &job,
                            &format!("node-{node}"),
                            10_000 + rank as u32,
                            (rank % per_job) as i32,
                            per_job as i32,
                        )),
                        first_rec_seq: next[p as usize],
                        record_size: 128,
                        records: calls((rank % per_job) as i32, next[p as usize], n),
                        ..Default::default()
                    })),
                });
                id += 1;
                next[p as usize] += n;
            }
            if !any {
                break;
            }
        }
        for (r, reqs) in streams.into_iter().enumerate() {
            if !reqs.is_empty() {
                out.push((urls[r].clone(), reqs));
            }
        }
    }
    out
}

fn case(
    rt: &tokio::runtime::Runtime,
    records: u64,
    batch: u64,
    jobs: u64,
    replicas: usize,
    shards: Option<u32>,
) {
    let shards_arg = shards.map(|s| s.to_string());
    let extra: Vec<&str> = match &shards_arg {
        Some(s) => vec!["--shards", s.as_str()],
        None => vec![],
    };
    let cs: Vec<Collector> = (0..replicas).map(|_| start_collector(&extra)).collect();
    let urls: Vec<String> = cs.iter().map(|c| c.grpc.clone()).collect();
    let streams = load(records, batch, jobs, &urls);
    let per_replica: Vec<u64> = urls
        .iter()
        .map(|u| {
            streams
                .iter()
                .filter(|(s, _)| s == u)
                .flat_map(|(_, r)| r)
                .map(|r| match &r.payload {
                    Some(Payload::Records(b)) => (b.records.len() / 128) as u64,
                    _ => 0,
                })
                .sum()
        })
        .collect();
    let cpu0: Vec<f64> = cs.iter().map(|c| cpu_seconds(c.child.id())).collect();
    let (n, secs) = rt.block_on(replay(streams));
    let ingest_cpu: f64 = cs
        .iter()
        .zip(&cpu0)
        .map(|(c, c0)| cpu_seconds(c.child.id()) - c0)
        .sum();
    // Where the ingest CPU went: the busiest thread's share, and the write-ahead log writer's.
    let all: Vec<(String, f64)> = cs.iter().flat_map(|c| threads(c.child.id())).collect();
    let sum: f64 = all.iter().map(|t| t.1).sum();
    let busiest = all.iter().map(|t| t.1).fold(0.0, f64::max);
    let writer: f64 = all
        .iter()
        .filter(|t| t.0 == "store-writer")
        .map(|t| t.1)
        .sum();
    let share = |x: f64| if sum > 0.0 { x / sum * 100.0 } else { 0.0 };
    // The clean stop writes every log out as segments, in parallel over the segment threads.
    let t = Instant::now();
    let total: f64 = std::thread::scope(|sc| {
        let hs: Vec<_> = cs.iter().map(|c| sc.spawn(move || stop(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    });
    let segments_s = t.elapsed().as_secs_f64();
    let m = n as f64 / 1e6;
    println!(
        "{jobs} job{} on {replicas} collector{} (shards: {}; records per replica {:?}):\n  ingest {:.0} records/s at {:.2} CPU-s per million (busiest thread {:.0} %, log writer {:.0} % of it)\n  segments written in {segments_s:.1} s; everything {:.2} CPU-s per million",
        if jobs == 1 { "" } else { "s" },
        if replicas == 1 { "" } else { "s" },
        shards.map_or_else(|| "one per CPU".to_owned(), |s| s.to_string()),
        per_replica,
        n as f64 / secs,
        ingest_cpu / m,
        share(busiest),
        share(writer),
        total / m,
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let records = arg("--records", 4_000_000);
    let batch = arg("--batch", 4096);
    println!(
        "commscope scale-out benchmark ({} cores, {records} records of 128 B, batches of {batch}, 32 ranks on 4 nodes)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    case(&rt, records, batch, 1, 1, Some(1));
    case(&rt, records, batch, 8, 1, Some(1));
    case(&rt, records, batch, 1, 1, None);
    case(&rt, records, batch, 8, 1, None);
    case(&rt, records, batch, 1, 2, None);
    case(&rt, records, batch, 8, 2, None);
}
