//! Legal but unusual MPI usage (`tests/c/fidelity/`): every program gives the same output and
//! exit status with and without the shim, on Open MPI and MPICH, and the trace holds exactly the
//! calls it wrote down — `MPI_IN_PLACE`, `MPI_BOTTOM`, zero counts, derived datatypes,
//! intercommunicators and their collectives, `MPI_Comm_create_group`, persistent and
//! neighbourhood collectives, `MPI_THREAD_MULTIPLE`, `MPI_ERRORS_RETURN` and `MPI_Abort`.

use std::path::Path;
use std::process::Output;

use commscope_tests::coverage::{calls_by_name, read_expected};
use commscope_tests::{Flavour, build, launch, load_job, run_plain, run_traced, summary_json};
use commscope_wire::op::{Op, flags};
use commscope_wire::record::{ProcessEvent, Record};

const RANKS: u32 = 4;

/// Runs `fidelity/<name>` with and without the shim; asserts the same stdout and exit status.
fn run_both(flavour: Flavour, name: &str, tmp: &Path) -> (Output, Output) {
    let prog = build(flavour, &format!("fidelity/{name}"));
    let (plain_dir, traced_dir) = (tmp.join("expect-plain"), tmp.join("expect"));
    std::fs::create_dir_all(&plain_dir).expect("mkdir");
    std::fs::create_dir_all(&traced_dir).expect("mkdir");
    let cmd = launch(flavour, RANKS, &prog, &[plain_dir.to_str().expect("utf-8")]);
    let plain = run_plain(&cmd, &[]);
    let traced = run_traced(
        &tmp.join("trace"),
        name,
        &launch(
            flavour,
            RANKS,
            &prog,
            &[traced_dir.to_str().expect("utf-8")],
        ),
        &[],
    );
    let show = |o: &Output| {
        format!(
            "{}\n--- stdout\n{}\n--- stderr\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert_eq!(
        plain.status.code(),
        traced.status.code(),
        "{name} on {}: exit status changed under the shim\nwithout: {}\nwith: {}",
        flavour.name(),
        show(&plain),
        show(&traced)
    );
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&traced.stdout),
        "{name} on {}: output changed under the shim\nwithout: {}\nwith: {}",
        flavour.name(),
        show(&plain),
        show(&traced)
    );
    assert!(
        !traced.stdout.is_empty(),
        "{name} printed nothing: {}",
        show(&traced)
    );
    (plain, traced)
}

/// A program that ends normally: unchanged, and recorded exactly.
fn check(flavour: Flavour, name: &str) -> commscope_cli::traces::JobTrace {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (plain, _) = run_both(flavour, name, tmp.path());
    assert!(
        plain.status.success(),
        "{name} failed on {}",
        flavour.name()
    );
    let trace = load_job(&tmp.path().join("trace").join(name));
    assert_eq!(trace.processes.len(), RANKS as usize);
    let expected = read_expected(&tmp.path().join("expect"), RANKS as i32);
    assert_eq!(
        calls_by_name(&trace),
        expected.calls,
        "{name} on {}: the trace is not what the program did",
        flavour.name()
    );
    let (s, _) = summary_json(&[&tmp.path().join("trace")]);
    assert_eq!(s["p2p"]["unmatched"], 0, "{name}: {}", s["p2p"]);
    trace
}

fn calls(trace: &commscope_cli::traces::JobTrace) -> Vec<(i32, commscope_wire::record::Call)> {
    trace
        .processes
        .iter()
        .flat_map(|p| {
            p.records.iter().filter_map(move |r| match r {
                Record::Call(c) => Some((p.header.rank, *c)),
                _ => None,
            })
        })
        .collect()
}

macro_rules! both {
    ($($test:ident => $body:expr;)*) => {
        $(
            #[test]
            fn $test() {
                let f: fn(Flavour) = $body;
                f(Flavour::OpenMpi);
                f(Flavour::Mpich);
            }
        )*
    };
}

both! {
    in_place_collectives_are_unchanged_and_recorded => |f| {
        let t = check(f, "in_place");
        let in_place = calls(&t).iter().filter(|(_, c)| c.flags & flags::IN_PLACE != 0).count();
        // Rank 0 passes MPI_IN_PLACE to all nine collectives, the others to the six that are
        // not rooted.
        assert_eq!(in_place, 9 + 6 * (RANKS as usize - 1), "{}", f.name());
    };
    derived_datatypes_mpi_bottom_and_zero_counts_are_unchanged_and_recorded => |f| {
        check(f, "datatypes");
    };
    intercommunicators_and_create_group_are_unchanged_and_recorded => |f| {
        let t = check(f, "intercomm");
        let inter = calls(&t).iter().filter(|(_, c)| c.flags & flags::INTERCOMM != 0).count();
        assert_eq!(inter, 4 * RANKS as usize, "{}: four intercommunicator collectives per rank", f.name());
    };
    neighbourhood_and_persistent_collectives_are_unchanged_and_recorded => |f| {
        let t = check(f, "topology");
        let persistent: Vec<_> = calls(&t)
            .into_iter()
            .filter(|(_, c)| c.flags & flags::PERSISTENT != 0)
            .collect();
        assert_eq!(persistent.len(), 6 * RANKS as usize, "{}", f.name());
        // Each start is its own instance: the members agree on seq.
        for (rank, c) in &persistent {
            let same = persistent.iter().filter(|(_, d)| d.comm_id == c.comm_id && d.seq == c.seq).count();
            assert_eq!(same, RANKS as usize, "rank {rank}: {c:?}");
        }
        assert!(calls(&t).iter().any(|(_, c)| c.op() == Op::NeighborAlltoallw));
    };
    collectives_from_several_threads_are_unchanged_and_recorded => |f| {
        check(f, "threads");
    };
    errors_returned_to_the_program_are_unchanged_and_recorded_with_their_code => |f| {
        let t = check(f, "errors");
        for p in &t.processes {
            let failed: Vec<_> = p.records.iter().filter_map(|r| match r {
                Record::Call(c) if c.status != 0 => Some(c.op()),
                _ => None,
            }).collect();
            assert_eq!(failed, [Op::Send, Op::Broadcast, Op::Allreduce], "rank {}", p.header.rank);
        }
    };
    mpi_abort_keeps_its_exit_status_and_is_recorded => |f| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (plain, _) = run_both(f, "abort", tmp.path());
        assert_eq!(plain.status.code(), Some(7), "{}", f.name());
        let trace = load_job(&tmp.path().join("trace").join("abort"));
        let aborted = trace
            .processes
            .iter()
            .find(|p| p.header.rank == 1)
            .expect("rank 1's trace");
        let ops: Vec<Op> = aborted.records.iter().filter_map(|r| match r {
            Record::Call(c) => Some(c.op()),
            _ => None,
        }).collect();
        assert_eq!(ops, [Op::Allreduce], "{}", f.name());
        let exit = aborted.records.iter().find_map(|r| match r {
            Record::Process(p) if p.event == ProcessEvent::Exit => Some(p.exit_status),
            _ => None,
        });
        assert_eq!(exit, Some(7), "{}: rank 1 records MPI_Abort's code", f.name());
    };
}
