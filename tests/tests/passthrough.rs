//! The shim never changes what the application sees: programs that never call MPI, runs with
//! `COMMSCOPE_DISABLE=1`, garbage settings and an unwritable trace directory all behave exactly as
//! without it; `commscope run` returns the command's exit status and forwards signals; whatever
//! the shim cannot record it counts.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};

use commscope_tests::{
    Flavour, assert_ok, build, commscope, launch, load_job, run_plain, run_traced, shim,
    summary_json,
};
use commscope_wire::record::Record;

fn sorted_lines(o: &Output) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

#[test]
fn a_program_that_never_calls_mpi_is_unchanged() {
    let script = "echo hello; echo to-stderr >&2; exit 7";
    let plain = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("sh");
    let tmp = tempfile::tempdir().expect("tempdir");
    let traced = run_traced(
        tmp.path(),
        "no-mpi",
        &["sh".into(), "-c".into(), script.into()],
        &[],
    );
    assert_eq!(traced.status.code(), Some(7));
    assert_eq!(traced.stdout, plain.stdout);
    assert_eq!(traced.stderr, plain.stderr);
    // Dormant: no MPI_Init, so no trace at all.
    assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 0);
}

#[test]
fn a_call_no_library_defines_ends_the_process_as_the_loader_would() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = commscope_tests::c_dir().join("undefined_call.c");
    let (lib, prog) = (
        tmp.path().join("libundefined.so"),
        tmp.path().join("undefined_call"),
    );
    for (args, out) in [
        (&["-shared", "-fPIC", "-DLIBRARY"][..], &lib),
        (&["-ldl"][..], &prog),
    ] {
        let o = Command::new("cc")
            .arg("-o")
            .arg(out)
            .arg(&src)
            .args(args)
            .output()
            .expect("run cc");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let plain = Command::new(&prog).arg(&lib).output().expect("run");
    let traced = run_traced(
        tmp.path(),
        "undefined",
        &[prog.clone().into_os_string(), lib.clone().into_os_string()],
        &[],
    );
    for (o, what) in [(&plain, "without"), (&traced, "with")] {
        assert_eq!(o.status.code(), Some(127), "{what} the shim: {o:?}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "calling\n");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("symbol lookup error")
                && err.contains("undefined symbol: ncclGetUniqueId"),
            "{what} the shim: {err}"
        );
    }
}

/// Programs test for optional MPI functions with weak references, as mpi4py does: under the shim
/// they must find exactly what the loaded MPI defines.
fn optional_functions_look_the_same(flavour: Flavour) {
    let prog = build(flavour, "weak_symbols");
    let cmd = launch(flavour, 1, &prog, &[]);
    let plain = run_plain(&cmd, &[]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let traced = run_traced(tmp.path(), "weak", &cmd, &[]);
    assert!(
        plain.status.success() && traced.status.success(),
        "{plain:?} {traced:?}"
    );
    let out = String::from_utf8_lossy(&plain.stdout);
    assert_eq!(out.lines().count(), 8, "{out}");
    assert_eq!(out, String::from_utf8_lossy(&traced.stdout));
}

#[test]
fn optional_functions_look_the_same_to_an_open_mpi_program() {
    optional_functions_look_the_same(Flavour::OpenMpi);
}

#[test]
fn optional_functions_look_the_same_to_an_mpich_program() {
    optional_functions_look_the_same(Flavour::Mpich);
}

#[test]
fn exit_status_and_signals_pass_through() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let killed = run_traced(
        tmp.path(),
        "sig",
        &["sh".into(), "-c".into(), "kill -TERM $$".into()],
        &[],
    );
    assert_eq!(
        killed.status.code(),
        Some(128 + libc::SIGTERM),
        "death by signal becomes 128+N"
    );

    // A TERM sent to `commscope run` reaches the command, which exits on its own terms.
    let mut child = commscope()
        .arg("run")
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg("trap 'echo got-term; exit 5' TERM; echo ready; while :; do sleep 0.05; done")
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().expect("stdout");
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut out, &mut first).expect("ready line");
    assert_eq!(&first, b"ready\n");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("rest");
    assert_eq!(status.code(), Some(5));
    assert!(rest.contains("got-term"), "{rest}");
}

fn same_as_without_shim(flavour: Flavour) {
    let prog = build(flavour, "basic");
    let cmd = launch(flavour, 4, &prog, &["50", "0"]);
    let plain = run_plain(&cmd, &[]);
    assert_ok(&plain, "plain run");
    let tmp = tempfile::tempdir().expect("tempdir");

    // Disabled: pure pass-through, nothing written.
    let mut c = commscope();
    c.arg("run")
        .arg("--disable")
        .arg("--trace-dir")
        .arg(tmp.path())
        .arg("--job-id")
        .arg("off")
        .arg("--")
        .args(&cmd);
    let disabled = c.output().expect("run");
    assert_eq!(disabled.status.code(), plain.status.code());
    assert_eq!(sorted_lines(&disabled), sorted_lines(&plain));
    assert!(
        !tmp.path().join("off").exists(),
        "disabled shim wrote a trace"
    );

    // Enabled, with garbage in every setting: same output, settings reported, trace written.
    let garbage = [
        ("COMMSCOPE_RING_RECORDS", "lots"),
        ("COMMSCOPE_FLUSH_MS", "-5"),
        ("COMMSCOPE_IN_FLIGHT_SLOTS", "0"),
        ("COMMSCOPE_DISABLE", "maybe"),
    ];
    let mut c = commscope();
    c.arg("run")
        .arg("--trace-dir")
        .arg(tmp.path())
        .arg("--job-id")
        .arg("garbage")
        .arg("--")
        .args(&cmd);
    for (k, v) in garbage {
        c.env(k, v);
    }
    // Open MPI hands only named variables to ranks.
    let mut c2 = c;
    if flavour == Flavour::OpenMpi {
        c2 = commscope();
        let mut args = vec![cmd[0].clone()];
        for (k, v) in garbage {
            args.push("-x".into());
            args.push(format!("{k}={v}").into());
        }
        args.extend(cmd[1..].iter().cloned());
        c2.arg("run")
            .arg("--trace-dir")
            .arg(tmp.path())
            .arg("--job-id")
            .arg("garbage")
            .arg("--")
            .args(&args);
    }
    let noisy = c2.output().expect("run");
    assert_eq!(noisy.status.code(), plain.status.code());
    assert_eq!(sorted_lines(&noisy), sorted_lines(&plain));
    let err = String::from_utf8_lossy(&noisy.stderr);
    for (k, _) in garbage {
        assert!(
            err.contains(&format!("ignoring {k}")),
            "no word about {k}: {err}"
        );
    }
    let job = load_job(&tmp.path().join("garbage"));
    let calls: usize = job
        .processes
        .iter()
        .map(|p| {
            p.records
                .iter()
                .filter(|r| matches!(r, Record::Call(_)))
                .count()
        })
        .sum();
    assert_eq!(calls, 4 * 50);

    // An unwritable trace directory: the job is unaffected and says so once per rank.
    let bad = "/proc/commscope-cannot-write-here";
    let mut env_cmd = vec![cmd[0].clone()];
    let preload = shim().display().to_string();
    match flavour {
        Flavour::OpenMpi => {
            for kv in [
                format!("LD_PRELOAD={preload}"),
                format!("COMMSCOPE_TRACE_DIR={bad}"),
            ] {
                env_cmd.push("-x".into());
                env_cmd.push(kv.into());
            }
        }
        Flavour::Mpich => {
            for (k, v) in [
                ("LD_PRELOAD", preload.as_str()),
                ("COMMSCOPE_TRACE_DIR", bad),
            ] {
                env_cmd.extend(["-genv".into(), k.into(), v.into()]);
            }
        }
    }
    env_cmd.extend(cmd[1..].iter().cloned());
    let unwritable = run_plain(&env_cmd, &[]);
    assert_eq!(unwritable.status.code(), plain.status.code());
    assert_eq!(sorted_lines(&unwritable), sorted_lines(&plain));
    let err = String::from_utf8_lossy(&unwritable.stderr);
    assert_eq!(
        err.matches("cannot write trace files under /proc/commscope-cannot-write-here")
            .count(),
        4,
        "{err}"
    );

    // `commscope run` itself refuses an unusable directory before starting anything.
    let refused = run_traced(std::path::Path::new(bad), "x", &cmd, &[]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("failed to create the trace directory")
    );
}

#[test]
fn open_mpi_runs_are_unchanged_by_the_shim() {
    same_as_without_shim(Flavour::OpenMpi);
}

#[test]
fn mpich_runs_are_unchanged_by_the_shim() {
    same_as_without_shim(Flavour::Mpich);
}

#[test]
fn a_full_ring_drops_and_counts_never_blocks() {
    let prog = build(Flavour::Mpich, "basic");
    let tmp = tempfile::tempdir().expect("tempdir");
    let calls_made = 20_000u64;
    let out = run_traced(
        tmp.path(),
        "tiny-ring",
        &launch(Flavour::Mpich, 2, &prog, &[&calls_made.to_string()]),
        &[
            ("COMMSCOPE_RING_RECORDS", "64"),
            ("COMMSCOPE_FLUSH_MS", "1000"),
        ],
    );
    assert_ok(&out, "tiny-ring job");
    let job = load_job(&tmp.path().join("tiny-ring"));
    for p in &job.processes {
        let calls = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Call(_)))
            .count() as u64;
        let last = p
            .records
            .iter()
            .rev()
            .find_map(|r| {
                if let Record::Heartbeat(h) = r {
                    Some(*h)
                } else {
                    None
                }
            })
            .expect("a final heartbeat");
        assert!(
            last.dropped_ring_full > 0,
            "a 64-record ring must overflow at {calls_made} calls"
        );
        assert!(
            calls + last.dropped_ring_full >= calls_made,
            "rank {}: {calls} recorded + {} dropped < {calls_made} made",
            p.header.rank,
            last.dropped_ring_full
        );
        // Everything produced before the final heartbeat reached the file.
        let max_seq = p.records.iter().map(Record::rec_seq).max().unwrap_or(0);
        assert!(
            max_seq >= last.produced && p.records.len() as u64 >= last.produced,
            "rank {}: records lost silently",
            p.header.rank
        );
    }
    let (s, _) = summary_json(&[tmp.path()]);
    assert!(s["dropped"]["ring_full"].as_u64().unwrap_or(0) > 0, "{s}");
}

#[test]
fn a_forked_child_never_writes_to_the_parents_trace() {
    let prog = build(Flavour::Mpich, "forker");
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = run_traced(
        tmp.path(),
        "fork",
        &launch(Flavour::Mpich, 2, &prog, &[]),
        &[],
    );
    assert_ok(&out, "forking job");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("parent done, child status 0")
            .count(),
        2
    );
    let job = load_job(&tmp.path().join("fork"));
    assert_eq!(job.processes.len(), 2, "only the ranks write trace files");
    for p in &job.processes {
        let calls = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Call(_)))
            .count();
        assert_eq!(calls, 15, "rank {}", p.header.rank);
        let exits = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Process(x) if x.event == commscope_wire::record::ProcessEvent::Exit))
            .count();
        assert_eq!(exits, 1, "the child's exit is not recorded as the rank's");
        let mut seqs: Vec<u64> = p.records.iter().map(Record::rec_seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), p.records.len(), "rec_seq is unique");
    }
}

#[test]
fn an_agent_that_never_answers_does_not_hold_the_trace_back() {
    let prog = build(Flavour::OpenMpi, "basic");
    let tmp = tempfile::tempdir().expect("tempdir");
    let calls = 40_000u64;
    let mut c = commscope();
    c.arg("run")
        .arg("--trace-dir")
        .arg(tmp.path())
        .arg("--job-id")
        .arg("no-agent")
        .arg("--agent-socket")
        .arg(tmp.path().join("nobody-listens.sock"))
        .arg("--")
        .args(launch(Flavour::OpenMpi, 2, &prog, &[&calls.to_string()]));
    // A ring far smaller than the job's records: only a drained ring avoids drops.
    c.env("COMMSCOPE_RING_RECORDS", "16384")
        .env("COMMSCOPE_FLUSH_MS", "10");
    let out = c.output().expect("run");
    assert_ok(&out, "job with an absent agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot register with the agent at"), "{err}");
    let job = load_job(&tmp.path().join("no-agent"));
    for p in &job.processes {
        let recorded = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Call(_)))
            .count() as u64;
        assert_eq!(
            recorded, calls,
            "rank {}: every call is in the trace",
            p.header.rank
        );
    }
}
