//! mpi4py programs (PyPI's wheel, which loads the MPI library privately with `RTLD_LOCAL`)
//! under the shim, on Open MPI and MPICH: they run exactly as without it, and the trace holds
//! exactly the calls they wrote down — buffer and object collectives, `Split`/`Dup`,
//! nonblocking collectives, point-to-point with wildcards (object receives through matched
//! probes). One run goes through a node agent and a collector.

use std::time::Duration;

use commscope_cli::traces::JobTrace;
use commscope_tests::coverage::{Expected, calls_by_name, read_expected};
use commscope_tests::python::{self, mpi4py_env, require_mpi4py, script};
use commscope_tests::services::{Services, run_with_agent};
use commscope_tests::{Flavour, assert_ok, load_job, run_plain, run_traced, summary_json};
use commscope_wire::op::{Op, flags};
use commscope_wire::record::Record;

const RANKS: u32 = 4;

fn env_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The checks every mpi4py trace must pass beyond the exact calls: each wildcard receive names
/// its real source, every message pairs up, every communicator has an agreed id.
fn check_trace(trace: &JobTrace, expected: &Expected) {
    assert_eq!(
        trace.processes.len(),
        RANKS as usize,
        "one process per rank"
    );
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    assert_eq!(calls_by_name(trace), expected.calls);
    for p in &trace.processes {
        let rank = p.header.rank;
        let left = (rank + RANKS as i32 - 1) % RANKS as i32;
        let mut wildcard = 0;
        for r in &p.records {
            let Record::Call(c) = r else { continue };
            assert_eq!(c.status, 0, "rank {rank}: {c:?}");
            assert_eq!(c.flags & flags::LOCAL_COMM_ID, 0, "rank {rank}: {c:?}");
            if c.op() == Op::Recv && c.flags & flags::ANY_SOURCE != 0 {
                assert_eq!(c.peer, left, "rank {rank}: {c:?}");
                wildcard += 1;
            }
        }
        assert!(
            wildcard >= 2,
            "rank {rank}: buffer and object wildcard receives"
        );
    }
}

fn exact_run(flavour: Flavour) {
    require_mpi4py();
    let tmp = tempfile::tempdir().expect("tempdir");
    let expect_dir = tmp.path().join("expect");
    std::fs::create_dir_all(&expect_dir).expect("mkdir");
    let env = mpi4py_env(flavour);
    let cmd = python::launch(
        flavour,
        RANKS,
        &script("mpi4py_calls.py"),
        &[expect_dir.to_str().expect("utf-8")],
    );
    let plain = run_plain(&cmd, &env_refs(&env));
    assert_ok(&plain, "the mpi4py program without the shim");
    let trace_dir = tmp.path().join("trace");
    let job = format!("mpi4py-{}", flavour.name());
    let traced = run_traced(&trace_dir, &job, &cmd, &env_refs(&env));
    assert_ok(&traced, "the mpi4py program under commscope run");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&traced.stdout)
    );
    let trace = load_job(&trace_dir.join(&job));
    check_trace(&trace, &read_expected(&expect_dir, RANKS as i32));
    let (s, _) = summary_json(&[&trace_dir]);
    assert_eq!(s["p2p"]["unmatched"], 0, "{}", s["p2p"]);
}

#[test]
fn an_mpi4py_program_on_open_mpi_is_recorded_exactly() {
    exact_run(Flavour::OpenMpi);
}

#[test]
fn an_mpi4py_program_on_mpich_is_recorded_exactly() {
    exact_run(Flavour::Mpich);
}

#[test]
fn an_mpi4py_job_is_recorded_through_an_agent_and_a_collector() {
    require_mpi4py();
    let flavour = Flavour::OpenMpi;
    let svc = Services::start("node-py", &[], &[]);
    let expect_dir = svc.dir.path().join("expect");
    std::fs::create_dir_all(&expect_dir).expect("mkdir");
    let env = mpi4py_env(flavour);
    let job = "mpi4py-live";
    let out = run_with_agent(
        &svc.socket,
        job,
        &python::launch(
            flavour,
            RANKS,
            &script("mpi4py_calls.py"),
            &[expect_dir.to_str().expect("utf-8"), "3"],
        ),
        &env_refs(&env),
    );
    assert_ok(&out, "the mpi4py job");
    let api = svc.wait_job_ended(job, Duration::from_secs(60));
    svc.wait_segments(job, Duration::from_secs(30));
    assert_eq!(api["ranks"], RANKS);
    let trace = load_job(&svc.trace_dir().join(job));
    check_trace(&trace, &read_expected(&expect_dir, RANKS as i32));
    for p in &trace.processes {
        assert_eq!(p.header.node, svc.node, "attributed to the agent's node");
    }
}
