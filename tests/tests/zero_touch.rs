//! Zero-touch recording: an NCCL job started without the preload (no `commscope run`, no
//! `LD_PRELOAD`), recorded by the node agent from its uprobes on the NCCL API.
//!
//! The job is `nccl_job` against the NCCL test double (without a GPU the real library runs no
//! collective); the agent probes the double's exported functions exactly as it probes the real
//! `libnccl.so.2` (`transport.rs` resolves every target in the real file).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use commscope_tests::nccl::{build_library_against_real_nccl, doubles, real_nccl_dir};
use commscope_tests::services::{Services, http_get};
use commscope_tests::{analyze_json, assert_ok, load_job, root};
use commscope_wire::nccl_hash::{self, Version};
use commscope_wire::op::{Op, lib};
use commscope_wire::record::{CommEvent, ProcessEvent, Record};

fn unhex(s: &str) -> [u8; 128] {
    let mut id = [0u8; 128];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex id");
    }
    id
}

/// A collector and an agent of node `node` that probes `lib` from its start.
fn probing(node: &str, lib: &std::path::Path) -> Services {
    let svc = Services::start_with_agent_env(
        node,
        &[],
        &[],
        &[(
            "COMMSCOPE_EBPF_LIBRARIES",
            lib.to_str().expect("utf-8 path"),
        )],
    );
    svc.agent
        .as_ref()
        .expect("agent running")
        .wait_log("probes on", Duration::from_secs(60));
    svc
}

/// `name{…what="W"…} value` from a Prometheus text page.
fn metric(page: &str, name: &str, what: &str) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(name) && l.contains(&format!("what=\"{what}\"")))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn an_nccl_job_without_the_preload_is_recorded_by_the_agent_from_uprobes() {
    if !root() {
        return;
    }
    let d = doubles();
    let lib_path = d.join("libnccl.so.2");
    let svc = probing("node-zt", &lib_path);

    // Nothing commscope's: no preload, no `commscope run`. (The socket says which agent serves
    // the job, as the default path does on a real node, where one agent runs.)
    let o = Command::new(d.join("nccl_job"))
        .args(["4", "basic"])
        .env_remove("LD_PRELOAD")
        .env("COMMSCOPE_AGENT_SOCKET", &svc.socket)
        .output()
        .expect("run nccl_job");
    assert_ok(&o, "nccl_job");
    let out = String::from_utf8_lossy(&o.stdout);
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("unique id: "))
        .expect("the job prints its unique id");
    // The double says it is NCCL 2.32.3: the hash of 2.26 and later.
    let world = nccl_hash::init_comm_hash(Version(23203), &unhex(id));
    // No launcher id: the job is named after the world communicator, as the preload names it.
    let job = format!("nccl-{world:016x}");
    let api = svc.wait_job_ended(&job, Duration::from_secs(60));
    svc.wait_segments(&job, Duration::from_secs(30));
    let trace = load_job(&svc.trace_dir().join(&job));

    let mut ranks: Vec<i32> = trace.processes.iter().map(|p| p.header.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2, 3], "{api}");
    for p in &trace.processes {
        let rank = p.header.rank;
        assert_eq!(p.header.world_size, 4);
        let mut calls = Vec::new();
        let mut comms = Vec::new();
        let mut started = false;
        let mut exited = false;
        for r in &p.records {
            match r {
                Record::Call(c) => calls.push(*c),
                Record::Comm(c) => comms.push((c.event, c.comm_id, c.comm_rank, c.size)),
                Record::Process(x) if x.event == ProcessEvent::Start => started = true,
                Record::Process(x) if x.event == ProcessEvent::Exit => exited = true,
                _ => {}
            }
        }
        assert!(started && exited, "rank {rank}: start and exit");
        // The world communicator, created and destroyed; the split's halves are not probed.
        assert_eq!(
            comms,
            [
                (CommEvent::Created, world, rank, 4),
                (CommEvent::Freed, world, rank, 4)
            ],
            "rank {rank}"
        );
        let (next, prev) = ((rank + 1) % 4, (rank + 3) % 4);
        let mut want: Vec<(Op, u64, u64, i32)> =
            (0..12).map(|_| (Op::Allreduce, 0, 1 << 20, -1)).collect();
        want.extend([
            // ncclBcast: once, though the double implements it by calling ncclBroadcast.
            (Op::Broadcast, 0, 4000, 0),
            // The root is argument 5, the communicator argument 6 (on the stack).
            (Op::Reduce, 0, 4000, 1),
            (Op::Allgather, 0, 16000, -1),
            (Op::Reducescatter, 0, 16000, -1),
            (Op::Alltoall, 0, 16000, -1),
            (Op::Allreduce, 0, 16384, -1),
            (Op::Allreduce, 0, 32768, -1),
            (Op::Send, 19, 8192, next),
            (Op::Recv, 19, 8192, prev),
            // The all-reduce captured into a CUDA graph: its enqueue, once.
            (Op::Allreduce, 0, 1024, -1),
        ]);
        // Collectives are numbered in order; point-to-point calls carry the count before them.
        let mut seq = 0;
        for w in want.iter_mut() {
            if !w.0.is_p2p() {
                w.1 = seq;
                seq += 1;
            }
        }
        calls.sort_by_key(|c| (c.t_enter, c.op));
        let got: Vec<(Op, u64, u64, i32)> = calls
            .iter()
            .map(|c| (c.op(), c.seq, c.bytes, c.peer))
            .collect();
        assert_eq!(got, want, "rank {rank}");
        for c in &calls {
            assert!(c.host_only() && !c.timed(), "rank {rank}: {c:?}");
            assert_eq!(
                (c.rank, c.comm_id, c.comm_rank, c.comm_size),
                (rank, world, rank, 4)
            );
            assert_eq!((c.lib, c.status), (lib::NCCL, 0));
            assert!(c.t_exit >= c.t_enter && c.t_enter > 0);
        }
    }

    // Counted, never timed: no finding from host timings, live or from the trace.
    let live = svc.findings(&job, "all");
    assert!(live.is_empty(), "{live:#?}");
    let post = analyze_json(&svc.trace_dir().join(&job));
    assert_eq!(post["findings"], serde_json::json!([]), "{post:#}");

    // The agent's counts are published with its next transport read (once a second).
    let t = std::time::Instant::now();
    let page = loop {
        let (_, page) = http_get(svc.agent_http, "/metrics");
        if metric(&page, "commscope_agent_zero_touch_total", "processes") == Some(4.0)
            || t.elapsed() > Duration::from_secs(5)
        {
            break page;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let m = |what| metric(&page, "commscope_agent_zero_touch_total", what);
    assert_eq!(m("processes"), Some(4.0), "{page}");
    assert_eq!(m("comms"), Some(4.0));
    assert_eq!(m("calls"), Some(88.0));
    // Each rank's all-reduce on its half of the split (a communicator it never saw created).
    assert_eq!(m("unknown_comm"), Some(4.0));
    assert_eq!(m("ring_full"), Some(0.0));
}

#[test]
fn a_job_with_the_preload_is_recorded_once_by_the_preload_not_the_probes() {
    if !root() {
        return;
    }
    let d = doubles();
    let lib_path = d.join("libnccl.so.2");
    let svc = probing("node-zt2", &lib_path);
    let o = commscope_tests::services::run_with_agent(
        &svc.socket,
        "zt-preloaded",
        &[
            d.join("nccl_job").into(),
            "2".into(),
            "ring".into(),
            "5".into(),
            "1024".into(),
        ],
        &[],
    );
    assert_ok(&o, "nccl_job under commscope run");
    svc.wait_job_ended("zt-preloaded", Duration::from_secs(60));
    svc.wait_segments("zt-preloaded", Duration::from_secs(30));
    let trace = load_job(&svc.trace_dir().join("zt-preloaded"));
    assert_eq!(trace.processes.len(), 2);
    for p in &trace.processes {
        let calls: Vec<_> = p
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Call(c) => Some(*c),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 5);
        assert!(calls.iter().all(|c| !c.host_only()), "{calls:?}");
    }
    let (_, page) = http_get(svc.agent_http, "/metrics");
    let m = |what| metric(&page, "commscope_agent_zero_touch_total", what);
    assert_eq!(m("processes"), Some(0.0), "{page}");
    assert_eq!(m("calls"), Some(0.0));
    assert_eq!(m("unknown_comm"), Some(0.0));
}

#[test]
fn a_rank_that_stops_issuing_collectives_is_named_from_the_host_view_alone() {
    if !root() {
        return;
    }
    let d = doubles();
    let lib_path = d.join("libnccl.so.2");
    let svc = probing("node-zt3", &lib_path);
    // 10 all-reduces, then rank 1 sleeps while the others issue #10 and wait on their stream.
    // A Slurm step's environment names the job.
    let mut job_proc = Command::new(d.join("nccl_job"))
        .args(["4", "hang", "1"])
        .env_remove("LD_PRELOAD")
        .env("COMMSCOPE_AGENT_SOCKET", &svc.socket)
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_STEP_ID", "0")
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start nccl_job");
    let job = "slurm-4242.0";
    let t = Instant::now();
    let open = loop {
        let f = svc.findings(job, "open");
        if !f.is_empty() || t.elapsed() > Duration::from_secs(40) {
            break f;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let named_after = t.elapsed();
    // The whole group: the launcher and its ranks.
    // SAFETY: signalling the process group this test started.
    unsafe { libc::kill(-(job_proc.id() as i32), libc::SIGKILL) };
    let _ = job_proc.wait();
    assert_eq!(open.len(), 1, "one root cause, one finding: {open:#?}");
    let f = &open[0];
    assert_eq!(f["kind"], "hang");
    assert_eq!(f["ranks"], serde_json::json!([1]));
    assert_eq!(f["seq"], 10);
    assert_eq!(f["evidence"]["victims"], serde_json::json!([0, 2, 3]));
    let s = f["summary"].as_str().expect("summary");
    assert!(
        s.starts_with("rank 1 on node-zt3 has not entered allreduce #10")
            && s.contains("seen from the host"),
        "{s}"
    );
    eprintln!("named after {named_after:?}: {s}");

    // After the kill, the trace says the same: the agent wrote what each rank had issued last.
    svc.wait_job_ended(job, Duration::from_secs(60));
    svc.wait_segments(job, Duration::from_secs(30));
    let trace = load_job(&svc.trace_dir().join(job));
    assert_eq!(trace.processes.len(), 4);
    for p in &trace.processes {
        let enters: Vec<(u64, bool)> = p
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Enter(c) => Some((c.seq, c.host_only())),
                _ => None,
            })
            .collect();
        let last = if p.header.rank == 1 { 9 } else { 10 };
        assert_eq!(
            enters,
            [(last, true)],
            "rank {}: what it had issued last",
            p.header.rank
        );
    }
    let v = analyze_json(&svc.trace_dir().join(job));
    let post = v["findings"].as_array().expect("findings");
    assert_eq!(post.len(), 1, "{v:#}");
    assert_eq!(post[0]["ranks"], serde_json::json!([1]), "{v:#}");
    assert_eq!(post[0]["kind"], "hang");
    assert_eq!(post[0]["seq"], 10);
    assert_eq!(post[0]["evidence"]["victims"], serde_json::json!([0, 2, 3]));
}

#[test]
fn the_real_nccl_loaded_privately_by_python_is_recorded_without_the_preload() {
    if !root() {
        return;
    }
    // The real libnccl.so.2 (PyPI), probed by the agent; a library calling it, opened by Python
    // with RTLD_LOCAL as a framework's extension module is. Without a GPU its init fails: the
    // probes must still read the unique id from the stack and the rank from the registers.
    let real = real_nccl_dir().join("libnccl.so.2");
    let lib = build_library_against_real_nccl("nccl_real");
    let svc = probing("node-zt4", &real);
    let o = Command::new(commscope_tests::python::interpreter())
        .arg(commscope_tests::python::script("nccl_ctypes.py"))
        .arg(&lib)
        .env_remove("LD_PRELOAD")
        .env("COMMSCOPE_AGENT_SOCKET", &svc.socket)
        .output()
        .expect("run python");
    assert_ok(&o, "python with the real NCCL");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("ncclCommInitRank: rc=1 comm=null"), "{out}");
    let err = String::from_utf8_lossy(&o.stderr);
    let id = err
        .lines()
        .find_map(|l| l.strip_prefix("unique id: "))
        .expect("the unique id on stderr");
    // The library says it is 2.32.3.
    let hash = nccl_hash::init_comm_hash(Version(23203), &unhex(id));
    let job = format!("nccl-{hash:016x}");
    svc.wait_job_ended(&job, Duration::from_secs(60));
    svc.wait_segments(&job, Duration::from_secs(30));
    let trace = load_job(&svc.trace_dir().join(&job));
    assert_eq!(trace.processes.len(), 1);
    let p = &trace.processes[0];
    assert_eq!((p.header.rank, p.header.world_size), (0, 1));
    let failed: Vec<(u64, i32, i32, i32)> = p
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Comm(c) if c.event == CommEvent::Failed => {
                Some((c.comm_id, c.status, c.comm_rank, c.size))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        failed,
        [(hash, 1, 0, 1)],
        "ncclUnhandledCudaError on rank 0 of 1"
    );
    let v = analyze_json(&svc.trace_dir().join(&job));
    let f = v["findings"].as_array().expect("findings");
    assert_eq!(f.len(), 1, "{v:#}");
    assert_eq!(f[0]["kind"], "comm-error");
    assert_eq!(f[0]["comm"], format!("{hash:#x}"));
    eprintln!("real NCCL, zero-touch: {}", f[0]["summary"]);
}
