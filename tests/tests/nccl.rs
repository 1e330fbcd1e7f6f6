//! NCCL interception end to end.
//!
//! Most tests run `nccl_job` (tests/doubles) against the clearly named test doubles of the CUDA
//! driver API and of NCCL: several processes whose collectives complete asynchronously, in stream
//! order, once every member launched them — so GPU timing, groups, graph capture, a collective
//! whose end event never fires and asynchronous errors can be checked without a GPU. The last
//! test uses the real `libnccl.so.2` from PyPI.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use std::time::{Duration, Instant};

use commscope_tests::nccl::{
    build_against_real_nccl, build_library_against_real_nccl, build_mpi_job, doubles, rccl_doubles,
};
use commscope_tests::services::{Services, run_with_agent};
use commscope_tests::{
    Flavour, analyze_json, assert_ok, launch, load_job, run_traced, shim, summary_json,
};
use commscope_wire::hash::format_comm_id;
use commscope_wire::nccl_hash::{self, Version};
use commscope_wire::op::{Op, flags, lib};
use commscope_wire::record::{Call, Comm, CommEvent, Link, Record};

/// How far apart four ranks' ends of one collective may map onto the host clock: two anchors'
/// errors (a host-clock bracket of a few µs; the plugin: its smallest `now − globaltimer`,
/// tens of µs under load; measured 58–69 ns and 2–40 µs), not the
/// scheduling of the double's stream workers (the virtual GPU clock takes those out).
const GPU_END_SPREAD_NS: u64 = 200_000;

/// Runs `nccl_job RANKS MODE ARGS…` under `commscope run`; returns the unique id it printed.
fn run_job(
    dir: &Path,
    job: &str,
    ranks: u32,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, String) {
    let d = doubles();
    let mut cmd: Vec<OsString> = vec![d.join("nccl_job").into(), ranks.to_string().into()];
    cmd.extend(args.iter().map(OsString::from));
    let o = run_traced(dir, job, &cmd, env);
    assert_ok(&o, "nccl_job");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("unique id: "))
        .unwrap_or_default()
        .to_owned();
    (id, out)
}

fn unhex(s: &str) -> [u8; 128] {
    let mut id = [0u8; 128];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex id");
    }
    id
}

/// Per rank: its calls and comm records.
fn by_rank(dir: &Path) -> BTreeMap<i32, (Vec<Call>, Vec<Comm>, bool)> {
    let job = load_job(dir);
    let mut out = BTreeMap::new();
    for p in &job.processes {
        let e: &mut (Vec<Call>, Vec<Comm>, bool) = out.entry(p.header.rank).or_default();
        for r in &p.records {
            match r {
                Record::Call(c) => e.0.push(*c),
                Record::Comm(c) => e.1.push(*c),
                Record::Heartbeat(h) if h.flags & flags::FINAL != 0 => e.2 = true,
                _ => {}
            }
        }
        e.0.sort_by_key(|c| (c.comm_id, c.seq, c.op, c.t_enter));
    }
    out
}

fn created(comms: &[Comm]) -> Vec<&Comm> {
    comms
        .iter()
        .filter(|c| c.event == CommEvent::Created)
        .collect()
}

fn check_ids(version: i32, ranks: u32) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let job = format!("nccl-ids-{version}");
    let v = version.to_string();
    let (id, out) = run_job(
        tmp.path(),
        &job,
        ranks,
        &["basic"],
        &[("TESTDOUBLE_NCCL_VERSION", &v)],
    );
    assert_eq!(
        out.matches("capture violations: 0").count(),
        ranks as usize,
        "{out}"
    );
    let id = unhex(&id);
    let ver = Version(version);
    let world = nccl_hash::init_comm_hash(ver, &id);
    let recs = by_rank(&tmp.path().join(&job));
    assert_eq!(recs.len(), ranks as usize);
    for (rank, (_, comms, _)) in &recs {
        let c = created(comms);
        assert_eq!(c.len(), 2, "world and one half: {c:?}");
        assert_eq!(
            c[0].comm_id, world,
            "rank {rank}: the world communicator's id is its commHash"
        );
        assert_eq!(c[0].flags & flags::LOCAL_COMM_ID, 0);
        let color = rank % 2;
        assert_eq!(
            c[1].comm_id,
            nccl_hash::split_comm_hash(ver, world, 1, color),
            "rank {rank}: a split's id comes from the parent's hash, its split counter and the color"
        );
        assert_eq!(c[1].parent, world);
        assert_eq!((c[1].comm_rank, c[1].size), (rank / 2, ranks as i32 / 2));
    }
}

#[test]
fn nccl_calls_are_recorded_once_with_gpu_times_groups_and_capture() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (id, out) = run_job(tmp.path(), "nccl-basic", 4, &["basic"], &[]);
    assert_eq!(
        out.matches("capture violations: 0").count(),
        4,
        "no event was ever recorded on a capturing stream: {out}"
    );
    let world = nccl_hash::init_comm_hash(Version(23203), &unhex(&id));
    let recs = by_rank(&tmp.path().join("nccl-basic"));
    assert_eq!(
        recs.keys().copied().collect::<Vec<_>>(),
        vec![0, 1, 2, 3],
        "RANK from the launcher's environment"
    );
    let mut world_ends: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (rank, (calls, comms, clean)) in &recs {
        assert!(
            clean,
            "rank {rank}: reaching exit() is a clean end for an NCCL process"
        );
        let c = created(comms);
        assert!(
            c.iter()
                .all(|c| c.flags & flags::NCCL_COMM != 0 && c.device == 0),
            "{c:?}"
        );
        assert_eq!(c[0].comm_id, world);
        let on_world: Vec<&Call> = calls.iter().filter(|c| c.comm_id == world).collect();
        let count = |op: Op| on_world.iter().filter(|c| c.op() == op).count();
        // ncclBcast is implemented by NCCL calling ncclBroadcast: still one record.
        for (op, n) in [
            // 12 + a group of 2 + 1 captured into a graph + 3 launches of that graph.
            (Op::Allreduce, 18),
            (Op::Broadcast, 1),
            (Op::Reduce, 1),
            (Op::Allgather, 1),
            (Op::Reducescatter, 1),
            (Op::Alltoall, 1),
            (Op::Send, 1),
            (Op::Recv, 1),
        ] {
            assert_eq!(
                count(op),
                n,
                "rank {rank}: {} calls of {}",
                count(op),
                op.name()
            );
        }
        let colls: Vec<u64> = on_world
            .iter()
            .filter(|c| !c.op().is_p2p())
            .map(|c| c.seq)
            .collect();
        assert_eq!(
            colls,
            (0..23).collect::<Vec<u64>>(),
            "rank {rank}: seq counts every collective, graph launches included"
        );
        for c in calls {
            assert_eq!(c.lib, lib::NCCL);
            assert_eq!(c.status, 0);
            let expect = if c.comm_id == world { *rank } else { rank / 2 };
            assert_eq!(c.comm_rank, expect, "rank {rank}: {c:?}");
            if c.flags & flags::GRAPH_CAPTURED != 0 {
                assert_eq!(
                    c.has_gpu_time(),
                    c.graph_replay(),
                    "a captured call has no GPU interval, a graph launch has the graph's: {c:?}"
                );
                continue;
            }
            assert!(c.has_gpu_time(), "rank {rank}: no GPU time: {c:?}");
            let d = c.gpu_end - c.gpu_start;
            assert!(d > 0 && d < 1_000_000_000, "GPU duration {d} ns: {c:?}");
            // The GPU runs the work after the host enqueued it (anchor error allowed).
            assert!(
                c.gpu_start + 200_000 >= c.t_enter,
                "GPU start before enqueue: {c:?}"
            );
        }
        let captured: Vec<&&Call> = on_world
            .iter()
            .filter(|c| c.flags & flags::GRAPH_CAPTURED != 0 && !c.graph_replay())
            .collect();
        assert_eq!(captured.len(), 1);
        assert_eq!((captured[0].op(), captured[0].count), (Op::Allreduce, 256));
        // Each launch of the graph: the captured all-reduce again, the next seq, NCCL's op_seq
        // of the capture, the graph's GPU interval.
        let replays: Vec<&&Call> = on_world.iter().filter(|c| c.graph_replay()).collect();
        assert_eq!(
            replays
                .iter()
                .map(|c| (c.seq, c.op(), c.count, c.op_seq))
                .collect::<Vec<_>>(),
            (1..=3)
                .map(|k| (captured[0].seq + k, Op::Allreduce, 256, captured[0].op_seq))
                .collect::<Vec<_>>(),
            "rank {rank}"
        );
        for c in &replays {
            world_ends.entry(c.seq).or_default().push(c.gpu_end);
        }
        // The two all-reduces of one group share the group's interval; so do the send and receive.
        let g: Vec<&&Call> = on_world
            .iter()
            .filter(|c| c.seq == 17 || c.seq == 18)
            .collect();
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].gpu_start, g[0].gpu_end),
            (g[1].gpu_start, g[1].gpu_end)
        );
        let p2p: Vec<&&Call> = on_world.iter().filter(|c| c.op().is_p2p()).collect();
        assert_eq!(
            (p2p[0].gpu_start, p2p[0].gpu_end),
            (p2p[1].gpu_start, p2p[1].gpu_end)
        );
        assert_eq!(
            p2p.iter().find(|c| c.op() == Op::Send).map(|c| c.peer),
            Some((rank + 1) % 4)
        );
        // nccl-tests sizes: per-rank part × ranks for the gathering ops.
        let bytes = |op: Op| on_world.iter().find(|c| c.op() == op).map(|c| c.bytes);
        assert_eq!(bytes(Op::Allgather), Some(1000 * 4 * 4));
        assert_eq!(bytes(Op::Reducescatter), Some(1000 * 4 * 4));
        assert_eq!(bytes(Op::Broadcast), Some(4000));
        for c in on_world.iter().filter(|c| c.seq < 12) {
            world_ends.entry(c.seq).or_default().push(c.gpu_end);
        }
    }
    // Bandwidth per op in the summary (nccl-tests factors over GPU time).
    let (v, _) = summary_json(&[&tmp.path().join("nccl-basic")]);
    let world_s = v["comms"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["comm_id"] == format!("{world:#x}")))
        .expect("the world communicator in the summary");
    let (alg, bus) = (
        world_s["algbw_gbps"]["allreduce"].as_f64().expect("algbw"),
        world_s["busbw_gbps"]["allreduce"].as_f64().expect("busbw"),
    );
    assert!(
        alg > 0.0 && (bus / alg - 1.5).abs() < 1e-9,
        "all-reduce on 4 ranks: busbw = 1.5 × algbw ({alg}, {bus})"
    );
    // One all-reduce ends at the same moment everywhere. The CUDA double's virtual GPU clock
    // stamps each rank's end event with the collective's common end, so what is left is each
    // process's mapping of its GPU clock onto the host's: its anchor, bracketed by two host
    // clock reads (tens of µs, the best of four tries) and float milliseconds (sub-µs).
    for (seq, ends) in &world_ends {
        assert_eq!(ends.len(), 4);
        let spread = ends.iter().max().unwrap_or(&0) - ends.iter().min().unwrap_or(&0);
        assert!(
            spread < GPU_END_SPREAD_NS,
            "all-reduce #{seq}: ends spread over {spread} ns"
        );
    }
}

#[test]
fn communicator_ids_follow_the_loaded_nccls_commhash_algorithm() {
    check_ids(23203, 4);
    // 2.24–2.25: legacy DJB2a with the split counter in the string; 2.18–2.23: without it.
    check_ids(22503, 2);
    check_ids(22304, 2);
}

#[test]
fn a_straggler_on_the_gpu_is_named_from_gpu_times() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_job(tmp.path(), "nccl-slow", 4, &["slow", "1", "40"], &[]);
    let v = analyze_json(&tmp.path().join("nccl-slow"));
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "{v:#}");
    assert_eq!(f[0]["kind"], "slow-rank");
    assert_eq!(f[0]["ranks"], serde_json::json!([1]));
    // Rank 1 computes 30 ms where the others compute 2: they wait 28 ms for it at every
    // all-reduce, which only the GPU intervals show (the host enqueues everything at once).
    let e = &f[0]["evidence"];
    let late = e["late_instances_total"].as_f64().expect("late instances");
    let blame = e["blame_total_s"].as_f64().expect("blame");
    assert!(
        late >= 35.0,
        "late at {late} of the 39 judged all-reduces: {v:#}"
    );
    let per = blame / late * 1e3;
    assert!(
        (24.0..=30.0).contains(&per),
        "{per:.1} ms blamed per late all-reduce: {v:#}"
    );
}

/// Runs `DOUBLES/nccl_job 4 MODE RANK` (a mode where RANK stops and the others hang) under
/// `commscope run` for 8 s, then kills what is left of it; returns the job's trace directory.
fn run_hanging_job(
    doubles: &Path,
    tmp: &Path,
    job: &str,
    mode: &str,
    rank: i32,
) -> std::path::PathBuf {
    let job_bin = doubles.join("nccl_job");
    let rank = rank.to_string();
    let cmd: Vec<OsString> = ["timeout", "-s", "KILL", "8"]
        .iter()
        .map(OsString::from)
        .chain([
            job_bin.clone().into_os_string(),
            "4".into(),
            mode.into(),
            rank.as_str().into(),
        ])
        .collect();
    let _ = run_traced(tmp, job, &cmd, &[]);
    // Only this test's processes (other tests run nccl_job at the same time).
    let _ = Command::new("pkill")
        .args([
            "-9",
            "-f",
            &format!("{} 4 {mode} {rank}", job_bin.display()),
        ])
        .status();
    tmp.join(job)
}

#[test]
fn a_collective_whose_end_event_never_fires_names_the_rank_that_never_launched_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = run_hanging_job(&doubles(), tmp.path(), "nccl-hang", "hang", 2);
    // The three others show all-reduce #10 in flight (its end event never fired).
    let job = load_job(&dir);
    for p in &job.processes {
        let stuck = p.records.iter().any(|r| {
            matches!(r, Record::Enter(c)
                    if c.seq == 10 && c.op() == Op::Allreduce && c.lib == lib::NCCL)
        });
        assert_eq!(stuck, p.header.rank != 2, "rank {}", p.header.rank);
    }
    let v = analyze_json(&dir);
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "one root cause, one finding: {v:#}");
    assert_eq!(f[0]["kind"], "hang");
    assert_eq!(f[0]["ranks"], serde_json::json!([2]));
    assert_eq!(f[0]["seq"], 10);
    assert_eq!(f[0]["evidence"]["victims"], serde_json::json!([0, 1, 3]));
    let s = f[0]["summary"].as_str().expect("summary");
    assert!(
        s.starts_with("rank 2 on ") && s.contains("never entered allreduce #10"),
        "{s}"
    );
}

#[test]
fn a_graph_launch_whose_collective_never_completes_names_the_rank_that_never_launched_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = run_hanging_job(&doubles(), tmp.path(), "nccl-graph-hang", "graphhang", 1);
    // seq 0 is the capture, 1..=5 the launches every rank completed, 6 the one rank 1 never made.
    let job = load_job(&dir);
    for p in &job.processes {
        let replays: Vec<u64> = p
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Call(c) if c.graph_replay() => Some(c.seq),
                _ => None,
            })
            .collect();
        assert_eq!(replays, vec![1, 2, 3, 4, 5], "rank {}", p.header.rank);
        let stuck = p.records.iter().any(|r| {
            matches!(r, Record::Enter(c) if c.seq == 6 && c.op() == Op::Allreduce && c.lib == lib::NCCL)
        });
        assert_eq!(stuck, p.header.rank != 1, "rank {}", p.header.rank);
    }
    let v = analyze_json(&dir);
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "one root cause, one finding: {v:#}");
    assert_eq!(f[0]["kind"], "hang");
    assert_eq!(f[0]["ranks"], serde_json::json!([1]));
    assert_eq!(f[0]["seq"], 6);
    assert_eq!(f[0]["evidence"]["victims"], serde_json::json!([0, 2, 3]));
}

#[test]
fn rccl_calls_are_gpu_timed_through_hip_and_a_stuck_one_is_a_hang() {
    // The doubles as AMD's stack: librccl.so on libamdhip64.so (no libcuda.so.1 anywhere).
    let d = rccl_doubles();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cmd: Vec<OsString> = vec![
        d.join("nccl_job").into(),
        "4".into(),
        "slow".into(),
        "1".into(),
        "40".into(),
    ];
    let o = run_traced(tmp.path(), "rccl-slow", &cmd, &[]);
    assert_ok(&o, "nccl_job on the RCCL doubles");
    let dir = tmp.path().join("rccl-slow");
    for (rank, (calls, comms, _)) in by_rank(&dir) {
        assert_eq!(calls.len(), 40, "rank {rank}");
        assert!(
            created(&comms)
                .iter()
                .all(|c| c.flags & flags::NCCL_COMM != 0)
        );
        for c in &calls {
            assert_eq!(c.lib, lib::RCCL, "rank {rank}: {c:?}");
            assert!(c.has_gpu_time(), "rank {rank}: HIP events time it: {c:?}");
        }
    }
    // From GPU times alone, as with NCCL: rank 1 computes 30 ms where the others compute 2.
    let v = analyze_json(&dir);
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "{v:#}");
    assert_eq!(f[0]["kind"], "slow-rank");
    assert_eq!(f[0]["ranks"], serde_json::json!([1]));

    // A collective whose end event never fires stays in flight: a hang naming the rank.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = run_hanging_job(&d, tmp.path(), "rccl-hang", "hang", 3);
    let v = analyze_json(&dir);
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "{v:#}");
    assert_eq!(f[0]["kind"], "hang");
    assert_eq!(f[0]["ranks"], serde_json::json!([3]));
    assert_eq!(f[0]["seq"], 10);
    let s = f[0]["summary"].as_str().unwrap_or_default();
    assert!(s.contains("RCCL") || s.contains("allreduce"), "{s}");
}

#[test]
fn asynchronous_nccl_errors_become_comm_error_findings() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_job(
        tmp.path(),
        "nccl-async",
        4,
        &["async"],
        &[("TESTDOUBLE_NCCL_ASYNC_ERROR", "1:3")],
    );
    let v = analyze_json(&tmp.path().join("nccl-async"));
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "{v:#}");
    assert_eq!(f[0]["kind"], "comm-error");
    assert_eq!(f[0]["ranks"], serde_json::json!([1]));
    assert_eq!(f[0]["evidence"]["source"], "async");
    assert_eq!(f[0]["evidence"]["status"], 6);
    let s = f[0]["summary"].as_str().expect("summary");
    assert!(s.contains("asynchronous error 6, ncclRemoteError"), "{s}");
}

#[test]
fn init_all_takes_the_id_nccl_drew() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_job(tmp.path(), "nccl-initall", 3, &["initall"], &[]);
    let recs = by_rank(&tmp.path().join("nccl-initall"));
    let (calls, comms, _) = recs.get(&0).expect("one process, rank 0");
    let c = created(comms);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(
        c.iter()
            .all(|x| x.comm_id == c[0].comm_id && x.flags & flags::LOCAL_COMM_ID == 0)
    );
    let mut ranks: Vec<i32> = c.iter().map(|x| x.comm_rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, vec![0, 1, 2]);
    assert_eq!(calls.len(), 9);
    assert!(calls.iter().all(|c| c.has_gpu_time() && c.comm_size == 3));
    // Each device's calls are counted on its own rank of the communicator.
    for r in 0..3 {
        let seqs: Vec<u64> = calls
            .iter()
            .filter(|c| c.comm_rank == r)
            .map(|c| c.seq)
            .collect();
        assert_eq!(seqs, vec![0, 1, 2], "comm rank {r}");
    }
}

#[test]
fn real_nccl_passes_through_and_its_failed_init_is_a_comm_error() {
    let prog = build_against_real_nccl("nccl_real");
    let plain = Command::new(&prog).output().expect("run nccl_real");
    let tmp = tempfile::tempdir().expect("tempdir");
    let traced = run_traced(
        tmp.path(),
        "nccl-real",
        &[prog.clone().into_os_string()],
        &[],
    );
    check_real_nccl(&plain, &traced, &tmp.path().join("nccl-real"));
}

#[test]
fn real_nccl_loaded_privately_through_ctypes_is_unchanged_and_recorded() {
    // A library linked against libnccl.so.2, loaded by Python with RTLD_LOCAL: NCCL is then
    // invisible to the global scope, as in a framework's extension module.
    let lib = build_library_against_real_nccl("nccl_real");
    let py = commscope_tests::python::interpreter();
    let script = commscope_tests::python::script("nccl_ctypes.py");
    let cmd: Vec<OsString> = vec![py.into(), script.into(), lib.into()];
    let plain = Command::new(&cmd[0])
        .args(&cmd[1..])
        .output()
        .expect("run python");
    let tmp = tempfile::tempdir().expect("tempdir");
    let traced = run_traced(tmp.path(), "nccl-ctypes", &cmd, &[]);
    let out = String::from_utf8_lossy(&traced.stdout);
    assert!(out.contains("nccl_real_run: 0"), "{out}");
    check_real_nccl(&plain, &traced, &tmp.path().join("nccl-ctypes"));
}

/// The real NCCL's answers are the same with and without the shim (version, unique id, error
/// strings, last error, the failed init), and the failed init is one `comm-error` finding.
fn check_real_nccl(plain: &std::process::Output, traced: &std::process::Output, trace: &Path) {
    assert_ok(plain, "the real NCCL without the shim");
    assert_ok(traced, "the real NCCL under commscope run");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&traced.stdout)
    );
    let out = String::from_utf8_lossy(&plain.stdout);
    assert!(out.contains("ncclGetVersion: rc=0 version=23203"), "{out}");
    assert!(out.contains("ncclGetUniqueId: rc=0 filled=1"), "{out}");
    assert!(
        out.contains("ncclCommInitRank: rc=1 comm=null"),
        "no GPU here, so the init fails with ncclUnhandledCudaError: {out}"
    );
    let err = String::from_utf8_lossy(&traced.stderr);
    assert!(
        !err.contains("symbol lookup error") && !err.contains(" has no "),
        "the shim could not find NCCL: {err}"
    );
    let id = err
        .lines()
        .find_map(|l| l.strip_prefix("unique id: "))
        .expect("the unique id on stderr");
    let hash = nccl_hash::init_comm_hash(Version(23203), &unhex(id));
    let v = analyze_json(trace);
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "{v:#}");
    assert_eq!(f[0]["kind"], "comm-error");
    assert_eq!(f[0]["comm"], format!("{hash:#x}"));
    assert_eq!(f[0]["evidence"]["source"], "init");
    let s = f[0]["summary"].as_str().expect("summary");
    assert!(
        s.starts_with("rank 0 on ")
            && s.contains("could not create NCCL communicator")
            && s.contains("CUDA driver version is insufficient"),
        "{s}"
    );
}

#[test]
fn a_program_calling_nccl_through_its_own_dlopen_handle_is_recorded_by_the_profiler_plugin() {
    let d = doubles();
    let cmd: Vec<OsString> = vec![
        d.join("nccl_dlsym_job").into(),
        d.join("libnccl.so.2").into(),
        "3".into(),
        "6".into(),
    ];
    // The preload alone cannot see calls made through dlsym on NCCL's own handle.
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = run_traced(tmp.path(), "nccl-dlsym", &cmd, &[]);
    assert_ok(&o, "nccl_dlsym_job under the preload");
    assert!(
        !tmp.path().join("nccl-dlsym").exists(),
        "the preload saw calls it cannot see"
    );
    // NCCL's profiler plugin sees them.
    let tmp = tempfile::tempdir().expect("tempdir");
    let plugin = shim();
    let o = run_traced(
        tmp.path(),
        "nccl-dlsym",
        &cmd,
        &[("NCCL_PROFILER_PLUGIN", plugin.to_str().expect("utf-8"))],
    );
    assert_ok(&o, "nccl_dlsym_job with the profiler plugin");
    let out = String::from_utf8_lossy(&o.stdout);
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("unique id: "))
        .expect("unique id");
    let world = nccl_hash::init_comm_hash(Version(23203), &unhex(id));
    let recs = by_rank(&tmp.path().join("nccl-dlsym"));
    assert_eq!(recs.len(), 3, "one trace per rank");
    for (rank, (calls, comms, _)) in &recs {
        assert!(
            created(comms).iter().any(|c| c.comm_id == world),
            "rank {rank}: the communicator under NCCL's commHash"
        );
        let ar: Vec<u64> = calls
            .iter()
            .filter(|c| c.comm_id == world && c.op() == Op::Allreduce)
            .map(|c| c.op_seq)
            .collect();
        assert_eq!(ar, (0..6).collect::<Vec<u64>>(), "rank {rank}");
        assert!(
            calls.iter().all(|c| c.has_gpu_time() && c.bytes == 4 << 20),
            "rank {rank}: {calls:?}"
        );
    }
}

#[test]
fn a_live_nccl_job_reports_bandwidth_and_its_async_error_through_agent_and_collector() {
    let svc = Services::start("node-n", &[], &[]);
    let job_bin = doubles().join("nccl_job");
    let cmd: Vec<OsString> = vec![job_bin.into(), "4".into(), "async".into()];
    let o = run_with_agent(
        &svc.socket,
        "live-nccl",
        &cmd,
        &[("TESTDOUBLE_NCCL_ASYNC_ERROR", "2:3")],
    );
    assert_ok(&o, "nccl_job under the agent");
    let t = Instant::now();
    let finding = loop {
        let (_, body) = svc.get("/api/v1/findings?job=live-nccl");
        let v: serde_json::Value = serde_json::from_str(&body).expect("findings JSON");
        if let Some(f) = v["findings"].as_array().and_then(|a| a.first()).cloned() {
            break f;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no finding: {body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(finding["kind"], "comm-error", "{finding}");
    assert_eq!(finding["ranks"], serde_json::json!([2]));
    assert_eq!(finding["nodes"], serde_json::json!(["node-n"]));
    let (_, m) = svc.get("/metrics");
    let line = m
        .lines()
        .find(|l| {
            l.starts_with("commscope_collective_busbw_bytes_per_second{job_id=\"live-nccl\"")
                && l.contains("op=\"allreduce\"")
        })
        .unwrap_or_else(|| panic!("no bus bandwidth series: {m}"));
    let bw: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("value");
    // 4 KiB all-reduces over 4 ranks: 2·3/4 of 4096 bytes per GPU interval (tens of µs to ms).
    assert!(bw > 1e5 && bw < 1e12, "{line}");
    assert!(
        m.contains("commscope_collective_bus_bytes_total{job_id=\"live-nccl\""),
        "{m}"
    );
}

#[test]
fn a_live_job_with_a_slow_link_gets_one_slow_link_finding_from_the_collector() {
    let svc = Services::start("node-n", &[], &[]);
    let cmd: Vec<OsString> = vec![
        doubles().join("nccl_job").into(),
        "4".into(),
        "ring".into(),
        "40".into(),
        "4194304".into(),
    ];
    let plugin = shim();
    let o = run_with_agent(
        &svc.socket,
        "live-link",
        &cmd,
        &[
            ("NCCL_PROFILER_PLUGIN", plugin.to_str().expect("utf-8")),
            ("TESTDOUBLE_NCCL_SLOW_LINK", "1:2:8"),
        ],
    );
    assert_ok(&o, "nccl_job under the agent");
    let t = Instant::now();
    let findings = loop {
        let (_, body) = svc.get("/api/v1/findings?job=live-link");
        let v: serde_json::Value = serde_json::from_str(&body).expect("findings JSON");
        let f = v["findings"].as_array().cloned().unwrap_or_default();
        if !f.is_empty() {
            break f;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no finding: {body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let f = &findings[0];
    assert_eq!(f["kind"], "slow-link", "{f}");
    assert_eq!(f["ranks"], serde_json::json!([1, 2]));
    assert_eq!(f["nodes"], serde_json::json!(["node-n"]));
    assert_eq!(
        f["link"],
        serde_json::json!({"src": "node-n", "dst": "node-n"})
    );
    // The link metrics: 40 all-reduces × 4 senders × 32 MiB moved, and their network time.
    let (_, m) = svc.get("/metrics");
    let value = |name: &str| -> f64 {
        let prefix = format!("{name}{{job_id=\"live-link\",src=\"node-n\",dst=\"node-n\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} series: {m}"))
    };
    assert_eq!(value("commscope_link_bytes_total"), (160u64 << 25) as f64);
    let net = value("commscope_link_network_seconds_total");
    let wait = value("commscope_link_gpu_wait_seconds_total");
    assert!(
        net > 0.0 && wait > 0.0,
        "network {net} s, GPU wait {wait} s"
    );
}

/// Calls per (rank, comm, op) of a job directory.
fn counts(dir: &Path) -> BTreeMap<(i32, u64, u8), usize> {
    let mut out = BTreeMap::new();
    for (rank, (calls, _, _)) in by_rank(dir) {
        for c in calls {
            *out.entry((rank, c.comm_id, c.op)).or_default() += 1;
        }
    }
    out
}

#[test]
fn the_profiler_plugin_alone_records_calls_with_kernel_times() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = doubles();
    // No preload: NCCL (the double) loads libcommscope.so as its profiler plugin.
    let o = Command::new(d.join("nccl_job"))
        .args(["4", "basic"])
        .env("NCCL_PROFILER_PLUGIN", shim())
        .env("COMMSCOPE_TRACE_DIR", tmp.path())
        .env("COMMSCOPE_JOB_ID", "nccl-plugin")
        .env_remove("LD_PRELOAD")
        .env_remove("COMMSCOPE_AGENT_SOCKET")
        .output()
        .expect("run nccl_job");
    assert_ok(&o, "nccl_job with the profiler plugin");
    let out = String::from_utf8_lossy(&o.stdout);
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("unique id: "))
        .expect("unique id");
    let world = nccl_hash::init_comm_hash(Version(23203), &unhex(id));
    let dir = tmp.path().join("nccl-plugin");
    let recs = by_rank(&dir);
    assert_eq!(recs.len(), 4);
    let mut ends: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (rank, (calls, comms, _)) in &recs {
        let made = created(comms);
        assert!(
            made.iter().any(|c| c.comm_id == world),
            "rank {rank}: the plugin's commId is NCCL's commHash"
        );
        assert!(
            made.iter().any(
                |c| c.comm_id == nccl_hash::split_comm_hash(Version(23203), world, 1, rank % 2)
            ),
            "rank {rank}: the split's commHash: {made:?}"
        );
        let on_world: Vec<&Call> = calls.iter().filter(|c| c.comm_id == world).collect();
        let n = |op: Op| on_world.iter().filter(|c| c.op() == op).count();
        assert_eq!(
            (n(Op::Allreduce), n(Op::Broadcast), n(Op::Send), n(Op::Recv)),
            (15, 1, 1, 1),
            "rank {rank}"
        );
        let ar: Vec<u64> = on_world
            .iter()
            .filter(|c| c.op() == Op::Allreduce)
            .map(|c| c.op_seq)
            .collect();
        assert_eq!(
            ar,
            (0..15).collect::<Vec<u64>>(),
            "op_seq is NCCL's seqNumber"
        );
        for c in &on_world {
            assert!(c.has_gpu_time(), "rank {rank}: kernel timing: {c:?}");
            assert!(
                c.gpu_start + 1_000_000 >= c.t_enter,
                "rank {rank}: kernel before enqueue: {c:?}"
            );
            if c.seq < 12 {
                ends.entry(c.seq).or_default().push(c.gpu_end);
            }
        }
    }
    for (seq, e) in &ends {
        let spread = e.iter().max().unwrap_or(&0) - e.iter().min().unwrap_or(&0);
        assert!(
            e.len() == 4 && spread < GPU_END_SPREAD_NS,
            "all-reduce #{seq}: {e:?}"
        );
    }
}

/// Per rank: its link records.
fn links_by_rank(dir: &Path) -> BTreeMap<i32, Vec<Link>> {
    let job = load_job(dir);
    let mut out: BTreeMap<i32, Vec<Link>> = BTreeMap::new();
    for p in &job.processes {
        for r in &p.records {
            if let Record::Link(l) = r {
                out.entry(p.header.rank).or_default().push(*l);
            }
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs a 4-rank ring of 30 all-reduces of 16 MiB with libcommscope.so as NCCL's profiler
/// plugin (and the preload too with `preload`); returns the job's trace directory and the world
/// communicator's id.
fn ring_job(
    tmp: &Path,
    job: &str,
    preload: bool,
    env: &[(&str, &str)],
) -> (std::path::PathBuf, u64) {
    let d = doubles();
    let mut cmd = Command::new(d.join("nccl_job"));
    cmd.args(["4", "ring", "30", "4194304"])
        .env("NCCL_PROFILER_PLUGIN", shim())
        .env("COMMSCOPE_TRACE_DIR", tmp)
        .env("COMMSCOPE_JOB_ID", job)
        .env_remove("COMMSCOPE_AGENT_SOCKET")
        .envs(env.iter().copied());
    if preload {
        cmd.env("LD_PRELOAD", shim());
    } else {
        cmd.env_remove("LD_PRELOAD");
    }
    let o = cmd.output().expect("run nccl_job");
    assert_ok(&o, "nccl_job ring");
    let out = String::from_utf8_lossy(&o.stdout);
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("unique id: "))
        .expect("unique id");
    (
        tmp.join(job),
        nccl_hash::init_comm_hash(Version(23203), &unhex(id)),
    )
}

/// The link view: each world all-reduce gives every rank one send link to the next rank and one
/// receive link from the previous one, joined to the call by `op_seq`, each with the proxy's
/// four steps timed and their bytes.
fn check_link_view(dir: &Path, world: u64) -> BTreeMap<i32, Vec<Link>> {
    // The double moves an all-reduce's 2 × 16 MiB of ring traffic.
    const BYTES: u64 = 32 << 20;
    let calls = by_rank(dir);
    let links = links_by_rank(dir);
    assert_eq!(links.len(), 4, "every rank has links");
    for (rank, ls) in &links {
        let seqs: Vec<u64> = calls[rank]
            .0
            .iter()
            .filter(|c| c.comm_id == world && c.op() == Op::Allreduce)
            .map(|c| c.op_seq)
            .collect();
        assert_eq!(seqs, (0..30).collect::<Vec<u64>>(), "rank {rank}");
        for (send, peer) in [(true, (rank + 1) % 4), (false, (rank + 3) % 4)] {
            let mut got: Vec<u64> = ls
                .iter()
                .filter(|l| (l.flags & flags::LINK_SEND != 0) == send)
                .map(|l| {
                    assert_eq!(
                        (l.comm_id, l.peer, l.op),
                        (world, peer, Op::Allreduce as u8)
                    );
                    assert_eq!(
                        (l.steps, l.steps_done, l.xfer_bytes),
                        (4, 4, BYTES),
                        "rank {rank}: {l:?}"
                    );
                    assert!(l.net_ns > 0 && l.t_end > l.t_start, "rank {rank}: {l:?}");
                    l.op_seq
                })
                .collect();
            got.sort_unstable();
            assert_eq!(
                got, seqs,
                "rank {rank}, send {send}: one link per all-reduce"
            );
        }
    }
    links
}

#[test]
fn the_plugin_times_each_links_proxy_steps_and_names_a_slow_link() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Plugin alone; from the 6th all-reduce on, the link from rank 2 to rank 3 is 8 times
    // slower (so the communicator's bandwidth drops too: the degraded collective is the link's).
    let (dir, world) = ring_job(
        tmp.path(),
        "nccl-slow-link",
        false,
        &[("TESTDOUBLE_NCCL_SLOW_LINK", "2:3:8:5")],
    );
    let links = check_link_view(&dir, world);
    let sends = |rank: i32| -> Vec<&Link> {
        links[&rank]
            .iter()
            .filter(|l| l.flags & flags::LINK_SEND != 0)
            .collect()
    };
    let rate = |rank: i32| median(sends(rank).iter().filter_map(|l| l.net_rate()).collect());
    let gpu_wait = |rank: i32| median(sends(rank).iter().map(|l| l.gpu_wait_ns as f64).collect());
    let others = median(vec![rate(0), rate(1), rate(3)]);
    assert!(
        rate(2) < 0.3 * others,
        "rank 2's sends move {:.2} GB/s on the network, the others {:.2}",
        rate(2) / 1e9,
        others / 1e9
    );
    // The others' extra time is spent waiting for their GPU, not on the network.
    for r in [0, 1, 3] {
        assert!(
            gpu_wait(r) > 4.0 * gpu_wait(2).max(1.0),
            "rank {r} waits {:.0} µs for its GPU per send, rank 2 {:.0} µs",
            gpu_wait(r) / 1e3,
            gpu_wait(2) / 1e3
        );
    }
    let v = analyze_json(&dir);
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "one finding, the link: {v:#}");
    assert_eq!(f[0]["kind"], "slow-link");
    assert_eq!(f[0]["ranks"], serde_json::json!([2, 3]));
    assert_eq!(f[0]["comm"], format_comm_id(world).as_str());
    let summary = f[0]["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("rank 2 → rank 3"), "{summary}");
    let ratio = f[0]["evidence"]["links"][0]["ratio"]
        .as_f64()
        .unwrap_or(1.0);
    assert!(ratio < 0.3, "{v:#}");

    let (s, o) = summary_json(&[&dir]);
    assert_ok(&o, "trace summary");
    let ls = s["links"].as_array().expect("links in the summary");
    assert_eq!(ls.len(), 8, "4 ranks × (send, recv): {s:#}");
    assert!(
        ls.iter()
            .all(|l| l["net_gbps"].as_f64().unwrap_or(0.0) > 0.0),
        "{s:#}"
    );

    // The same ring with every link healthy, the preload on too: links, and no finding.
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, world) = ring_job(tmp.path(), "nccl-ring", true, &[]);
    let links = check_link_view(&dir, world);
    let rates: Vec<f64> = links
        .values()
        .flatten()
        .filter(|l| l.flags & flags::LINK_SEND != 0)
        .filter_map(|l| l.net_rate())
        .collect();
    assert_eq!(rates.len(), 120);
    let v = analyze_json(&dir);
    assert_eq!(v["findings"], serde_json::json!([]), "{v:#}");
}

#[test]
fn with_both_the_preload_and_the_plugin_every_call_is_recorded_once() {
    let (a, b) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    run_job(a.path(), "nccl-once", 4, &["basic"], &[]);
    let plugin = shim();
    let plugin = plugin.to_str().expect("utf-8");
    run_job(
        b.path(),
        "nccl-once",
        4,
        &["basic"],
        &[("NCCL_PROFILER_PLUGIN", plugin)],
    );
    let (only, both) = (
        counts(&a.path().join("nccl-once")),
        counts(&b.path().join("nccl-once")),
    );
    // Each run draws its own unique id: compare (rank, op, calls), sorted, not communicator ids.
    let world_ops = |m: &BTreeMap<(i32, u64, u8), usize>| {
        let mut v: Vec<(i32, u8, usize)> = m.iter().map(|(k, n)| (k.0, k.2, *n)).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(
        world_ops(&only),
        world_ops(&both),
        "the same calls, once each"
    );
    assert_eq!(only.values().sum::<usize>(), both.values().sum::<usize>());
}

#[test]
fn an_mpi_job_using_nccl_records_both_libraries_under_one_identity() {
    let prog = build_mpi_job(Flavour::OpenMpi);
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = run_traced(
        tmp.path(),
        "mpi-nccl",
        &launch(Flavour::OpenMpi, 2, &prog, &[]),
        &[],
    );
    assert_ok(&o, "MPI + NCCL job");
    let recs = by_rank(&tmp.path().join("mpi-nccl"));
    assert_eq!(
        recs.keys().copied().collect::<Vec<_>>(),
        vec![0, 1],
        "ranks from MPI"
    );
    for (rank, (calls, comms, clean)) in &recs {
        assert!(clean, "rank {rank}: MPI_Finalize");
        let by = |l: u8, op: Op| calls.iter().filter(|c| c.lib == l && c.op() == op).count();
        assert_eq!(by(lib::MPI, Op::Allreduce), 3, "rank {rank}");
        assert_eq!(
            by(lib::MPI, Op::Broadcast),
            1,
            "rank {rank}: the unique id's broadcast"
        );
        assert_eq!(by(lib::NCCL, Op::Allreduce), 5, "rank {rank}");
        assert!(
            calls
                .iter()
                .filter(|c| c.lib == lib::NCCL)
                .all(|c| c.has_gpu_time() && c.rank == *rank)
        );
        assert!(
            created(comms)
                .iter()
                .any(|c| c.flags & flags::NCCL_COMM != 0 && c.comm_rank == *rank)
        );
    }
}
