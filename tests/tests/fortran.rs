//! Fortran programs under the shim: `use mpi` on Open MPI (whose Fortran layer calls the C
//! `PMPI_*` functions directly, so only the Fortran wrappers can see it) and on MPICH (whose
//! Fortran layer calls the C `MPI_*` functions: recorded there, never twice), and `use mpi_f08`
//! on Open MPI. Each program writes down every call it makes; the trace must hold exactly those.

use commscope_tests::coverage::{calls_by_name, read_expected};
use commscope_tests::{
    Flavour, assert_ok, build_fortran, launch, load_job, run_plain, run_traced, summary_json,
};
use commscope_wire::op::{Op, dtype, flags};
use commscope_wire::record::Record;

const RANKS: u32 = 4;

/// Runs a Fortran program traced; returns the trace dir (inside `tmp`) and the job's trace.
fn run(
    flavour: Flavour,
    name: &str,
    tmp: &std::path::Path,
) -> (
    commscope_cli::traces::JobTrace,
    commscope_tests::coverage::Expected,
) {
    let prog = build_fortran(flavour, name);
    let expect_dir = tmp.join("expect");
    std::fs::create_dir_all(&expect_dir).expect("mkdir");
    let trace_dir = tmp.join("trace");
    let job = format!("fortran-{name}-{}", flavour.name());
    let cmd = launch(
        flavour,
        RANKS,
        &prog,
        &[expect_dir.to_str().expect("utf-8")],
    );
    let plain = run_plain(&cmd, &[]);
    assert_ok(&plain, "the Fortran program without the shim");
    let out = run_traced(&trace_dir, &job, &cmd, &[]);
    assert_ok(&out, "the Fortran program under commscope run");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&out.stdout),
        "the program's output changed under the shim"
    );
    let (s, _) = summary_json(&[&trace_dir]);
    assert_eq!(s["p2p"]["unmatched"], 0, "{}", s["p2p"]);
    let trace = load_job(&trace_dir.join(&job));
    assert_eq!(
        trace.processes.len(),
        RANKS as usize,
        "one process per rank"
    );
    (trace, read_expected(&expect_dir, RANKS as i32))
}

/// `use mpi`: the exact calls, plus what each carries (in place, nonblocking, the wildcard
/// receive's source, Fortran's double precision as a double).
fn check_use_mpi(flavour: Flavour) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (trace, expected) = run(flavour, "basic", tmp.path());
    assert_eq!(calls_by_name(&trace), expected.calls);
    for p in &trace.processes {
        let rank = p.header.rank;
        let calls: Vec<_> = p
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Call(c) => Some(c),
                _ => None,
            })
            .collect();
        let allreduces: Vec<_> = calls.iter().filter(|c| c.op() == Op::Allreduce).collect();
        assert_eq!(allreduces.len(), 4, "rank {rank}");
        assert!(
            allreduces
                .iter()
                .all(|c| c.dtype == dtype::DOUBLE && c.count == 16)
        );
        let in_place = allreduces
            .iter()
            .filter(|c| c.flags & flags::IN_PLACE != 0)
            .count();
        assert_eq!(in_place, 1, "rank {rank}: one MPI_IN_PLACE all-reduce");
        let nonblocking = allreduces
            .iter()
            .filter(|c| c.flags & flags::NONBLOCKING != 0)
            .count();
        assert_eq!(nonblocking, 1, "rank {rank}: one MPI_IALLREDUCE");
        let recv = calls
            .iter()
            .find(|c| c.op() == Op::Recv)
            .expect("the wildcard receive");
        assert_ne!(recv.flags & flags::ANY_SOURCE, 0);
        assert_eq!(
            recv.peer,
            (rank + RANKS as i32 - 1) % RANKS as i32,
            "rank {rank}: the wildcard receive's source comes from its status"
        );
        assert!(
            calls.iter().all(|c| c.status == 0),
            "rank {rank}: {calls:?}"
        );
    }
}

#[test]
fn a_fortran_program_on_open_mpi_is_recorded_exactly() {
    check_use_mpi(Flavour::OpenMpi);
}

#[test]
fn a_fortran_program_on_mpich_is_recorded_exactly_once() {
    check_use_mpi(Flavour::Mpich);
}

#[test]
fn a_fortran_2008_program_on_open_mpi_is_recorded_exactly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (trace, expected) = run(Flavour::OpenMpi, "f08", tmp.path());
    assert_eq!(calls_by_name(&trace), expected.calls);
    for p in &trace.processes {
        let persistent = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Call(c) if c.flags & flags::PERSISTENT != 0))
            .count();
        assert_eq!(
            persistent, 4,
            "rank {}: two starts of a send and a receive",
            p.header.rank
        );
    }
}

/// Every wrapped Fortran entry point, called from `use mpi`: the trace holds exactly the calls.
fn check_every_entry_point(flavour: Flavour) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (trace, expected) = run(flavour, "coverage", tmp.path());
    assert_eq!(calls_by_name(&trace), expected.calls, "{}", flavour.name());
    for p in &trace.processes {
        let rank = p.header.rank;
        let mut persistent = 0;
        for r in &p.records {
            let Record::Call(c) = r else { continue };
            assert_eq!(c.status, 0, "rank {rank}: {c:?}");
            assert_eq!(c.flags & flags::LOCAL_COMM_ID, 0, "rank {rank}: {c:?}");
            persistent += usize::from(c.flags & flags::PERSISTENT != 0);
        }
        // Even ranks start 3 persistent sends twice and a ready send once; odd ranks a receive
        // six times.
        assert_eq!(persistent, if rank % 2 == 0 { 7 } else { 6 }, "rank {rank}");
    }
}

#[test]
fn every_fortran_entry_point_on_open_mpi_is_recorded_exactly() {
    check_every_entry_point(Flavour::OpenMpi);
}

#[test]
fn every_fortran_entry_point_on_mpich_is_recorded_exactly_once() {
    check_every_entry_point(Flavour::Mpich);
}
