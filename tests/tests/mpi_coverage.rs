//! Real 8-rank Open MPI and MPICH jobs under the shim: the trace holds exactly the calls each
//! rank made (per communicator, per op, with bytes), communicator ids agree across members and
//! differ between communicators, `seq` lines up, roots are right and point-to-point pairs up.

use std::collections::BTreeMap;

use commscope_tests::coverage::{self, read_expected};
use commscope_tests::{Flavour, assert_ok, build, launch, load_job, run_traced, summary_json};
use commscope_wire::op::{Op, flags};
use commscope_wire::record::Record;

fn check(flavour: Flavour) {
    let prog = build(flavour, "coverage");
    let tmp = tempfile::tempdir().expect("tempdir");
    let expect_dir = tmp.path().join("expect");
    let trace_dir = tmp.path().join("trace");
    std::fs::create_dir_all(&expect_dir).expect("mkdir");
    let job = format!("coverage-{}", flavour.name());
    let out = run_traced(
        &trace_dir,
        &job,
        &launch(flavour, 8, &prog, &[expect_dir.to_str().expect("utf-8")]),
        &[],
    );
    assert_ok(&out, "coverage job");
    let trace = load_job(&trace_dir.join(&job));
    assert_eq!(trace.job, job);
    coverage::verify(flavour, &trace, &trace_dir, &expect_dir);
}

#[test]
fn open_mpi_trace_holds_exactly_the_calls_made() {
    check(Flavour::OpenMpi);
}

#[test]
fn mpich_trace_holds_exactly_the_calls_made() {
    check(Flavour::Mpich);
}

#[test]
fn mpich_large_count_calls_are_recorded_under_the_same_names() {
    let prog = build(Flavour::Mpich, "large_count");
    let tmp = tempfile::tempdir().expect("tempdir");
    let expect_dir = tmp.path().join("expect");
    std::fs::create_dir_all(&expect_dir).expect("mkdir");
    let trace_dir = tmp.path().join("trace");
    let out = run_traced(
        &trace_dir,
        "large-count",
        &launch(
            Flavour::Mpich,
            4,
            &prog,
            &[expect_dir.to_str().expect("utf-8")],
        ),
        &[],
    );
    assert_ok(&out, "large-count job");
    let expected = read_expected(&expect_dir, 4);
    let trace = load_job(&trace_dir.join("large-count"));
    let mut actual: BTreeMap<(i32, String, String), (u64, u64)> = BTreeMap::new();
    let mut wildcard_halves = 0;
    for p in &trace.processes {
        for r in &p.records {
            if let Record::Call(c) = r {
                // The wildcard receive half of the tag-8 `MPI_Isendrecv` stays unresolved, and
                // says so; every other one names its source and sequence.
                if c.op() == Op::Sendrecv && c.tag == 8 {
                    assert_eq!((c.peer2, c.tag2), (-3, 8), "{c:?}");
                    assert_ne!(c.flags & flags::P2P_SEQ_UNKNOWN, 0, "{c:?}");
                    wildcard_halves += 1;
                } else if c.op() == Op::Sendrecv {
                    assert!(c.peer2 >= 0, "{c:?}");
                    assert_eq!(c.flags & flags::P2P_SEQ_UNKNOWN, 0, "{c:?}");
                }
                let v = actual
                    .entry((
                        p.header.rank,
                        "MPI_COMM_WORLD".to_owned(),
                        c.op().name().to_owned(),
                    ))
                    .or_default();
                v.0 += 1;
                v.1 += c.bytes;
            }
        }
    }
    assert_eq!(actual, expected.calls);
    assert_eq!(wildcard_halves, 4);
    // Each rank's tag-8 send is then the only message left without its receive.
    let (s, _) = summary_json(&[&trace_dir]);
    assert_eq!(s["p2p"]["unmatched"], 4, "{}", s["p2p"]);
}
