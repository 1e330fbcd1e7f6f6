//! Benchmarks of the agent and the collector (a separate command, never part of the tests):
//!
//! 1. Collector ingest: a `commscope collector` process (release build, dedup and durable
//!    trace writing on, as in production) receives pre-encoded record batches replayed by this
//!    process over `--streams` gRPC streams, each acknowledged only once durable. Reports
//!    records/s and collector CPU-seconds per million records.
//! 2. Collector memory per 1,000 ranks of job state: a job of `--ranks` ranks (each with its
//!    comm records and a few calls) is ingested; the collector's RSS growth is reported.
//! 3. Agent CPU per 10,000 records/s: a real process under the shim (`tests/c/rate.c`) calls
//!    `MPI_Allreduce` on `MPI_COMM_SELF` at a fixed rate; the agent's CPU time is measured.
//!
//! Run: `scripts/bench.sh collector [--records N] [--batch B] [--streams S] [--ranks R]`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use commscope_tests::bench::{
    calls, cpu_seconds, process, release_bin, replay, rss_bytes, start_collector,
};
use commscope_tests::services::http_get;
use commscope_tests::{Flavour, build};
use commscope_wire::grpc::ingest_request::Payload;
use commscope_wire::grpc::{IngestRequest, RecordBatch};
use commscope_wire::record::{Comm, CommEvent, Record};

use commscope_tests::bench::arg;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let records = arg("--records", 4_000_000);
    let batch = arg("--batch", 4096);
    let streams = arg("--streams", 4);
    let ranks = arg("--ranks", 4096);
    println!(
        "commscope agent/collector benchmark ({} cores)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );

    // 1. Ingest throughput.
    {
        let c = start_collector(&[]);
        let per_stream = records / streams;
        let procs_per_stream = 8u64;
        let mut all = Vec::new();
        let mut id = 1u64;
        for s in 0..streams {
            let mut reqs = Vec::new();
            let per_proc = per_stream / procs_per_stream;
            // Interleave the stream's processes, as an agent does.
            let mut next = vec![1u64; procs_per_stream as usize];
            let mut left = per_proc * procs_per_stream;
            while left > 0 {
                for p in 0..procs_per_stream {
                    let n = batch.min(per_proc + 1 - next[p as usize]);
                    if n == 0 {
                        continue;
                    }
                    let rank = (s * procs_per_stream + p) as i32;
                    reqs.push(IngestRequest {
                        batch_id: id,
                        agent_send_ns: 1,
                        payload: Some(Payload::Records(RecordBatch {
                            process: Some(process(
                                "bench",
                                &format!("bench-{s}"),
                                10_000 + rank as u32,
                                rank,
                                (streams * procs_per_stream) as i32,
                            )),
                            first_rec_seq: next[p as usize],
                            record_size: 128,
                            records: calls(rank, next[p as usize], n),
                            ..Default::default()
                        })),
                    });
                    id += 1;
                    next[p as usize] += n;
                    left -= n;
                }
            }
            all.push(reqs);
        }
        let pid = c.child.id();
        let cpu0 = cpu_seconds(pid);
        let (n, secs) = rt.block_on(replay(
            all.into_iter().map(|r| (c.grpc.clone(), r)).collect(),
        ));
        let cpu = cpu_seconds(pid) - cpu0;
        let (_, m) = http_get(c.http, "/metrics");
        let stored: f64 = m
            .lines()
            .find(|l| l.starts_with("commscope_collector_records_total{result=\"stored\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0);
        println!(
            "collector ingest: {n} records of 128 B in batches of {batch} over {streams} streams, acknowledged durable (write-ahead log synced): {:.0} records/s; collector CPU {:.2} s = {:.2} CPU-s per million records; stored {stored}",
            n as f64 / secs,
            cpu,
            cpu / (n as f64 / 1e6)
        );
        // Then the Parquet segments: a clean stop writes every log out.
        let t = Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waiting for our own child with valid out-pointers.
        unsafe { libc::wait4(pid as i32, &mut status, 0, &mut ru) };
        let total = ru.ru_utime.tv_sec as f64
            + ru.ru_utime.tv_usec as f64 / 1e6
            + ru.ru_stime.tv_sec as f64
            + ru.ru_stime.tv_usec as f64 / 1e6;
        println!(
            "  + Parquet segments of those records: written in {:.2} s; whole collector CPU including them {:.2} CPU-s per million records",
            t.elapsed().as_secs_f64(),
            total / (n as f64 / 1e6)
        );
    }

    // 2. Memory per 1,000 ranks.
    {
        let c = start_collector(&[]);
        let pid = c.child.id();
        std::thread::sleep(Duration::from_millis(300));
        let base = rss_bytes(pid);
        let mut reqs = Vec::new();
        for r in 0..ranks as i32 {
            let mut recs = Vec::new();
            for (k, (id, size)) in [
                (0x1000u64, ranks as i32),
                (0x2000 + (r / 8) as u64, 8),
                (0x3000 + (r % 8) as u64, (ranks / 8) as i32),
            ]
            .into_iter()
            .enumerate()
            {
                let mut cm = Comm::new(CommEvent::Created, id, 0x1000, 1, r, r % size, size, 0);
                cm.rec_seq = k as u64 + 1;
                cm.set_name(b"TENSOR_MODEL_PARALLEL_GROUP");
                recs.extend_from_slice(&Record::Comm(cm).encode());
            }
            let mut c3 = calls(r, 4, 16);
            recs.append(&mut c3);
            reqs.push(IngestRequest {
                batch_id: r as u64 + 1,
                agent_send_ns: 1,
                payload: Some(Payload::Records(RecordBatch {
                    process: Some(process(
                        "mem",
                        &format!("node-{}", r / 8),
                        r as u32 + 1,
                        r,
                        ranks as i32,
                    )),
                    first_rec_seq: 1,
                    record_size: 128,
                    records: recs,
                    ..Default::default()
                })),
            });
        }
        let (n, _) = rt.block_on(replay(vec![(c.grpc.clone(), reqs)]));
        std::thread::sleep(Duration::from_millis(500));
        let grown = rss_bytes(pid).saturating_sub(base);
        println!(
            "collector memory: {ranks} ranks ({n} records, 3 communicators each) grew the RSS by {:.1} MiB = {:.2} MiB per 1,000 ranks",
            grown as f64 / (1 << 20) as f64,
            grown as f64 / (1 << 20) as f64 / (ranks as f64 / 1000.0)
        );
    }

    // 3. Agent CPU per 10,000 records/s.
    {
        let c = start_collector(&[]);
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("agent.sock");
        let mut agent = Command::new(release_bin())
            .arg("agent")
            .arg("--collector")
            .arg(&c.grpc)
            .arg("--socket")
            .arg(&socket)
            .arg("--spool-dir")
            .arg(dir.path().join("spool"))
            .arg("--http")
            .arg("off")
            .stderr(Stdio::null())
            .spawn()
            .expect("agent");
        let t = Instant::now();
        while !socket.exists() {
            assert!(t.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(20));
        }
        let prog = build(Flavour::OpenMpi, "rate");
        let rate = 10_000u64;
        let secs = 10u64;
        let cpu0 = cpu_seconds(agent.id());
        let out = Command::new(release_bin())
            .arg("run")
            .arg("--agent-socket")
            .arg(&socket)
            .arg("--job-id")
            .arg("agent-bench")
            .arg("--")
            .args(commscope_tests::launch(
                Flavour::OpenMpi,
                1,
                &prog,
                &[&rate.to_string(), &secs.to_string()],
            ))
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .output()
            .expect("rate job");
        std::thread::sleep(Duration::from_secs(1));
        let cpu = cpu_seconds(agent.id()) - cpu0;
        let made = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        println!(
            "agent: one process at {rate} calls/s for {secs} s ({made}): agent CPU {:.3} s = {:.2} % of a core per 10,000 records/s",
            cpu,
            cpu / secs as f64 * 100.0 * (10_000.0 / rate as f64)
        );
        let _ = agent.kill();
        let _ = agent.wait();
    }
}
