//! How a rank's end is told: 8-rank jobs shaped like training (`tests/c/train.c`,
//! `tests/py/train.py`) on Open MPI and MPICH, in which one rank ends — exits without
//! finalizing, segfaults, is SIGKILLed, calls `MPI_Abort`, raises an uncaught Python exception
//! — or gets the job stuck (a broadcast from another root, a receive cycle, a rank spinning in
//! its own code), early (before the shim's first flush) or late. Each job runs once under
//! `commscope run --trace-dir` (its trace keeper on) through a real agent and collector, and
//! must give exactly one finding, of the right kind, naming exactly the right rank and saying
//! how it ended — live (every finding the collector ever opened for the job) and from the
//! shim's `.cst` files. Then the shim's signal handlers change nothing else: exit status, core
//! dump and an application's own handler are what they are without it.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use commscope_tests::python::{self, mpi4py_env, require_mpi4py, script};
use commscope_tests::services::Services;
use commscope_tests::{Flavour, analyze_json, build, commscope, launch};
use commscope_wire::op::flags;
use commscope_wire::record::{ProcessEvent, Record};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A program and what it does.
#[derive(Clone, Copy)]
enum Program {
    /// `tests/c/train.c`.
    C,
    /// `tests/py/train.py`, optionally under `python -m mpi4py`.
    Python { m_mpi4py: bool },
}

struct Case {
    flavour: Flavour,
    program: Program,
    mode: &'static str,
    rank: i32,
    step: u32,
    /// The one finding: kind, ranks, and what its sentence must say.
    kind: &'static str,
    ranks: &'static [i32],
    says: &'static str,
    /// The job does not end by itself: the test kills it once the live finding is open.
    hangs: bool,
}

use commscope_tests::services::show_findings as show;

/// The launch command and extra environment of a case.
fn command(c: &Case) -> (Vec<OsString>, Vec<(String, String)>) {
    let args = [c.mode.to_owned(), c.rank.to_string(), c.step.to_string()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match c.program {
        Program::C => (
            launch(c.flavour, 8, &build(c.flavour, "train"), &args),
            vec![],
        ),
        Program::Python { m_mpi4py } => {
            require_mpi4py();
            let mut cmd = launch(c.flavour, 8, &python::interpreter(), &[]);
            if m_mpi4py {
                cmd.extend(["-m".into(), "mpi4py".into()]);
            }
            cmd.push(script("train.py").into());
            cmd.extend(args.iter().map(OsString::from));
            (cmd, mpi4py_env(c.flavour))
        }
    }
}

/// `commscope run --agent-socket S --trace-dir D --job-id J -- CMD…`.
fn run(svc: &Services, trace_dir: &Path, job: &str, c: &Case) -> Output {
    let (cmd, env) = command(c);
    let mut r = commscope();
    r.arg("run")
        .arg("--agent-socket")
        .arg(&svc.socket)
        .arg("--trace-dir")
        .arg(trace_dir)
        .arg("--job-id")
        .arg(job)
        .arg("--")
        .args(&cmd)
        .envs(env);
    r.output().expect("run commscope")
}

fn check(what: &str, found: &[serde_json::Value], c: &Case, context: &str) {
    assert_eq!(
        found.len(),
        1,
        "{what}: exactly one finding expected\n{}\n{context}",
        show(found)
    );
    let f = &found[0];
    assert_eq!(f["kind"], c.kind, "{what}: {f:#}\n{context}");
    assert_eq!(
        f["ranks"],
        serde_json::json!(c.ranks),
        "{what}: {f:#}\n{context}"
    );
    let summary = f["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(c.says),
        "{what}: the sentence must say {:?}: {summary}\n{context}",
        c.says
    );
}

fn run_case(c: Case) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lang = match c.program {
        Program::C => "c",
        Program::Python { m_mpi4py: false } => "py",
        Program::Python { m_mpi4py: true } => "pym",
    };
    let job = format!("end-{lang}-{}-{}-{}", c.mode, c.flavour.name(), c.step);
    let svc = Services::start("node-end", &[], &[]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let cst = tmp.path().join("cst");
    let started = Instant::now();
    let out = std::thread::scope(|s| {
        let runner = s.spawn(|| run(&svc, &cst, &job, &c));
        if c.hangs {
            // Stuck for good: wait for the live finding, then take the job down as an operator
            // would (every rank at once).
            let t = Instant::now();
            while svc.findings(&job, "open").is_empty() {
                assert!(
                    t.elapsed() < Duration::from_secs(90),
                    "no live finding for the stuck job {job} within 90 s\n--- collector\n{}",
                    svc.collector.as_ref().map(|x| x.log()).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            std::thread::sleep(Duration::from_secs(1));
            let (cmd, _) = command(&c);
            let target = cmd
                .iter()
                .rev()
                .find(|a| {
                    let a = a.to_string_lossy();
                    a.ends_with("train") || a.ends_with("train.py")
                })
                .expect("the program")
                .to_string_lossy()
                .into_owned();
            let _ = Command::new("pkill").args(["-9", "-f", &target]).status();
        }
        runner.join().expect("runner")
    });
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    svc.wait_job_ended(&job, Duration::from_secs(60));
    // The live engine evaluates every second, and waits a second after the last exit arrived
    // before it judges the endings: wait for its verdict, then three more rounds, so that a
    // second (wrong) finding would show too.
    let t = Instant::now();
    while svc.every_finding(&job).is_empty() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    let live = svc.every_finding(&job);
    let context = format!(
        "--- {job}: {:?} after {:.1} s\n{}",
        out.status,
        started.elapsed().as_secs_f64(),
        stderr.lines().rev().take(15).collect::<Vec<_>>().join("\n")
    );
    let tail = |s: Option<&commscope_tests::services::Service>| {
        let log = s.map(|x| x.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    let live_context = format!(
        "{context}\n--- job\n{}\n--- collector\n{}\n--- agent\n{}",
        svc.job(&job).unwrap_or_default(),
        tail(svc.collector.as_ref()),
        tail(svc.agent.as_ref())
    );
    check("live", &live, &c, &live_context);
    let v = analyze_json(&cst.join(&job));
    let found = v["findings"].as_array().cloned().unwrap_or_default();
    let explain = format!(
        "{context}\n--- analyze\n{}",
        v["explain"].as_str().unwrap_or_default()
    );
    check(".cst files", &found, &c, &explain);
    eprintln!(
        "{job}: live and .cst: {} {}: {}",
        c.kind,
        serde_json::json!(c.ranks),
        found[0]["summary"]
    );
}

fn c_case(
    flavour: Flavour,
    mode: &'static str,
    rank: i32,
    step: u32,
    kind: &'static str,
    ranks: &'static [i32],
    says: &'static str,
) -> Case {
    Case {
        flavour,
        program: Program::C,
        mode,
        rank,
        step,
        kind,
        ranks,
        says,
        hangs: false,
    }
}

// ----- exit without MPI_Finalize ------------------------------------------------------------

#[test]
fn open_mpi_exit_without_finalize_early_is_the_dead_rank() {
    run_case(c_case(
        Flavour::OpenMpi,
        "exit",
        4,
        20,
        "dead-rank",
        &[4],
        "exited with status 3 without finalizing",
    ));
}

#[test]
fn open_mpi_exit_without_finalize_late_is_the_dead_rank() {
    run_case(c_case(
        Flavour::OpenMpi,
        "exit",
        4,
        150,
        "dead-rank",
        &[4],
        "exited with status 3 without finalizing",
    ));
}

#[test]
fn mpich_exit_without_finalize_early_is_the_dead_rank() {
    run_case(c_case(
        Flavour::Mpich,
        "exit",
        4,
        20,
        "dead-rank",
        &[4],
        "exited with status 3 without finalizing",
    ));
}

#[test]
fn mpich_return_from_main_late_is_the_dead_rank() {
    run_case(c_case(
        Flavour::Mpich,
        "return",
        4,
        150,
        "dead-rank",
        &[4],
        "exited with status 3 without finalizing",
    ));
}

// ----- a segfault ----------------------------------------------------------------------------

#[test]
fn open_mpi_segfault_early_is_the_dead_rank() {
    run_case(c_case(
        Flavour::OpenMpi,
        "segv",
        6,
        20,
        "dead-rank",
        &[6],
        "crashed on signal 11 (SIGSEGV)",
    ));
}

#[test]
fn open_mpi_segfault_late_is_the_dead_rank() {
    run_case(c_case(
        Flavour::OpenMpi,
        "segv",
        6,
        150,
        "dead-rank",
        &[6],
        "crashed on signal 11 (SIGSEGV)",
    ));
}

#[test]
fn mpich_segfault_early_is_the_dead_rank() {
    run_case(c_case(
        Flavour::Mpich,
        "segv",
        6,
        20,
        "dead-rank",
        &[6],
        "crashed on signal 11 (SIGSEGV)",
    ));
}

#[test]
fn mpich_segfault_late_is_the_dead_rank() {
    run_case(c_case(
        Flavour::Mpich,
        "segv",
        6,
        150,
        "dead-rank",
        &[6],
        "crashed on signal 11 (SIGSEGV)",
    ));
}

// ----- SIGKILL (the OOM killer) ------------------------------------------------------------------

#[test]
fn open_mpi_sigkill_in_the_first_milliseconds_is_the_dead_rank() {
    run_case(c_case(
        Flavour::OpenMpi,
        "kill",
        2,
        40,
        "dead-rank",
        &[2],
        "killed by signal 9 (SIGKILL), sent by itself",
    ));
}

#[test]
fn mpich_sigkill_in_the_first_milliseconds_is_the_dead_rank() {
    run_case(c_case(
        Flavour::Mpich,
        "kill",
        2,
        40,
        "dead-rank",
        &[2],
        "killed by signal 9 (SIGKILL), sent by itself",
    ));
}

#[test]
fn mpich_sigkill_late_is_the_dead_rank() {
    run_case(c_case(
        Flavour::Mpich,
        "kill",
        2,
        150,
        "dead-rank",
        &[2],
        "killed by signal 9 (SIGKILL), sent by itself",
    ));
}

#[test]
fn open_mpi_sigkill_late_is_the_dead_rank() {
    run_case(c_case(
        Flavour::OpenMpi,
        "kill",
        2,
        150,
        "dead-rank",
        &[2],
        "killed by signal 9 (SIGKILL), sent by itself",
    ));
}

// ----- MPI_Abort -------------------------------------------------------------------------------

#[test]
fn open_mpi_abort_is_the_dead_rank_with_its_code() {
    run_case(c_case(
        Flavour::OpenMpi,
        "abort",
        4,
        20,
        "dead-rank",
        &[4],
        "called MPI_Abort with error code 7",
    ));
}

#[test]
fn mpich_abort_is_the_dead_rank_with_its_code() {
    run_case(c_case(
        Flavour::Mpich,
        "abort",
        4,
        150,
        "dead-rank",
        &[4],
        "called MPI_Abort with error code 7",
    ));
}

// ----- jobs that get stuck -----------------------------------------------------------------------

#[test]
fn open_mpi_broadcast_from_another_root_is_a_mismatch_while_every_rank_blocks() {
    run_case(Case {
        hangs: true,
        ..c_case(
            Flavour::OpenMpi,
            "root",
            3,
            20,
            "mismatch",
            &[3],
            "rooted at 1",
        )
    });
}

#[test]
fn mpich_broadcast_from_another_root_is_a_mismatch() {
    // MPICH completes the broadcasts (and the job); the completed calls disagree.
    run_case(c_case(
        Flavour::Mpich,
        "root",
        3,
        20,
        "mismatch",
        &[3],
        "rooted at 1",
    ));
}

#[test]
fn open_mpi_receive_cycle_is_one_hang_naming_both_ranks() {
    run_case(Case {
        hangs: true,
        ..c_case(
            Flavour::OpenMpi,
            "cycle",
            2,
            20,
            "hang",
            &[2, 5],
            "recv from rank",
        )
    });
}

#[test]
fn mpich_rank_spinning_in_its_own_code_is_a_hang() {
    run_case(Case {
        hangs: true,
        ..c_case(
            Flavour::Mpich,
            "spin",
            3,
            150,
            "hang",
            &[3],
            "outside the communication library",
        )
    });
}

#[test]
fn open_mpi_broadcast_from_another_root_late_is_a_mismatch_while_every_rank_blocks() {
    run_case(Case {
        hangs: true,
        ..c_case(
            Flavour::OpenMpi,
            "root",
            3,
            150,
            "mismatch",
            &[3],
            "rooted at 1",
        )
    });
}

#[test]
fn mpich_broadcast_from_another_root_late_is_a_mismatch() {
    run_case(c_case(
        Flavour::Mpich,
        "root",
        3,
        150,
        "mismatch",
        &[3],
        "rooted at 1",
    ));
}

#[test]
fn open_mpi_receive_cycle_late_is_one_hang_naming_both_ranks() {
    run_case(Case {
        hangs: true,
        ..c_case(
            Flavour::OpenMpi,
            "cycle",
            2,
            150,
            "hang",
            &[2, 5],
            "recv from rank",
        )
    });
}

#[test]
fn open_mpi_rank_spinning_in_its_own_code_early_is_a_hang() {
    run_case(Case {
        hangs: true,
        ..c_case(
            Flavour::OpenMpi,
            "spin",
            3,
            20,
            "hang",
            &[3],
            "outside the communication library",
        )
    });
}

// ----- Python ------------------------------------------------------------------------------------

/// A case of `tests/py/train.py`, under `python -m mpi4py` when `m_mpi4py`.
fn py_case(m_mpi4py: bool, hangs: bool, c: Case) -> Case {
    Case {
        program: Program::Python { m_mpi4py },
        hangs,
        ..c
    }
}

#[test]
fn open_mpi_python_exception_under_m_mpi4py_is_the_dead_rank_that_aborted() {
    run_case(py_case(
        true,
        false,
        c_case(
            Flavour::OpenMpi,
            "exception",
            3,
            20,
            "dead-rank",
            &[3],
            "called MPI_Abort with error code 1",
        ),
    ));
}

#[test]
fn mpich_python_exception_under_m_mpi4py_is_the_dead_rank_that_aborted() {
    run_case(py_case(
        true,
        false,
        c_case(
            Flavour::Mpich,
            "exception",
            3,
            150,
            "dead-rank",
            &[3],
            "called MPI_Abort with error code 1",
        ),
    ));
}

#[test]
fn open_mpi_python_exception_without_m_mpi4py_is_a_hang_on_the_rank_that_finalized() {
    // Without `-m mpi4py` nothing aborts: the interpreter exits, mpi4py finalizes MPI there,
    // and the other ranks wait for it forever.
    run_case(py_case(
        false,
        true,
        c_case(
            Flavour::OpenMpi,
            "exception",
            3,
            150,
            "hang",
            &[3],
            "called MPI_Finalize instead",
        ),
    ));
}

#[test]
fn mpich_python_exception_without_m_mpi4py_is_a_hang_on_the_rank_that_finalized() {
    run_case(py_case(
        false,
        true,
        c_case(
            Flavour::Mpich,
            "exception",
            3,
            20,
            "hang",
            &[3],
            "called MPI_Finalize instead",
        ),
    ));
}

#[test]
fn mpich_python_receive_cycle_is_one_hang_naming_both_ranks() {
    run_case(py_case(
        false,
        true,
        c_case(
            Flavour::Mpich,
            "cycle",
            2,
            20,
            "hang",
            &[2, 5],
            "recv from rank",
        ),
    ));
}

// ----- the shim changes nothing else ------------------------------------------------------------

/// Runs one rank of `train MODE 0 5 10` alone (a singleton MPI job) in `dir`, with core dumps
/// on, with or without the shim: its wait status and standard error.
fn alone(
    flavour: Flavour,
    mode: &str,
    dir: &Path,
    shim: bool,
) -> (std::process::ExitStatus, String) {
    use std::os::unix::process::CommandExt;
    let prog = build(flavour, "train");
    let mut c = Command::new(&prog);
    c.args([mode, "0", "5", "10"])
        .current_dir(dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("LD_PRELOAD")
        .env_remove("COMMSCOPE_AGENT_SOCKET");
    if shim {
        c.env("LD_PRELOAD", commscope_tests::shim())
            .env("COMMSCOPE_TRACE_DIR", dir.join("traces"));
    }
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            if libc::setrlimit(libc::RLIMIT_CORE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = c.output().expect("run the program");
    (o.status, String::from_utf8_lossy(&o.stderr).into_owned())
}

/// What each mode's process does, with and without the shim: (exit code, signal, core dumped,
/// "own handler" printed) must be the same.
fn same_without_the_shim(flavour: Flavour) {
    use std::os::unix::process::ExitStatusExt;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    for mode in ["exit", "segv", "segvh", "abort", "healthy"] {
        let mut seen = Vec::new();
        for shim in [false, true] {
            let dir = tempfile::tempdir().expect("tempdir");
            let (st, err) = alone(flavour, mode, dir.path(), shim);
            let core = st.core_dumped();
            seen.push((st.code(), st.signal(), core, err.contains("own handler")));
            if shim {
                // And the shim recorded the end, as it was.
                let trace = commscope_tests::load_job(&dir.path().join("traces"));
                let exits: Vec<(u16, i32, i32)> = trace.processes[0]
                    .records
                    .iter()
                    .filter_map(|r| match r {
                        Record::Process(p) if p.event == ProcessEvent::Exit => {
                            Some((p.flags, p.exit_status, p.signal))
                        }
                        _ => None,
                    })
                    .collect();
                let unknown = commscope_wire::record::EXIT_STATUS_UNKNOWN;
                let end = match mode {
                    "exit" => (flags::UNFINALIZED, 3, 0),
                    // The shim's handler comes first (it was installed after the program's
                    // own, at MPI_Init), then hands the fault on.
                    "segv" | "segvh" => (flags::UNFINALIZED, unknown, 11),
                    "abort" => (flags::UNFINALIZED | flags::ABORTED, 7, 0),
                    _ => (0, unknown, 0),
                };
                assert_eq!(exits, [end], "{} {mode}: the exit records", flavour.name());
            }
        }
        assert_eq!(
            seen[0],
            seen[1],
            "{} {mode}: (code, signal, core dumped, own handler ran) without and with the shim",
            flavour.name()
        );
        let expected = match mode {
            "exit" => (Some(3), None, false, false),
            "segv" => (None, Some(11), true, false),
            "segvh" => (Some(42), None, false, true),
            "abort" => (Some(7), None, false, false),
            _ => (Some(0), None, false, false),
        };
        assert_eq!(seen[1], expected, "{} {mode}", flavour.name());
    }
}

#[test]
fn open_mpi_exit_status_core_dump_and_own_handler_are_as_without_the_shim() {
    same_without_the_shim(Flavour::OpenMpi);
}

#[test]
fn mpich_exit_status_core_dump_and_own_handler_are_as_without_the_shim() {
    same_without_the_shim(Flavour::Mpich);
}
