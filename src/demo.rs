//! `commscope demo`: the diagnosis demo. With MPI installed, a real 8-rank job (the bundled
//! `examples/mpi/diagnosis.c`) runs under the shim through a node agent and a collector started
//! inside the command; one rank becomes a straggler for a while, later another stops calling
//! collectives; each finding is printed as it opens and resolves, then `analyze` reads the stored
//! trace. Without MPI the same story runs on the simulator. `--capture` runs the bundled 4-rank
//! example and prints what the collector captured instead.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

use crate::cli::DemoArgs;
use crate::{run, summary, traces};

/// The bundled example program (`--capture`).
pub const DEMO_SOURCE: &str = include_str!("../examples/mpi/demo.c");
/// The bundled diagnosis program.
pub const DIAGNOSIS_SOURCE: &str = include_str!("../examples/mpi/diagnosis.c");

/// An MPI installation: its compiler and its launcher with the flags this machine needs.
#[derive(Clone, Debug)]
pub struct Mpi {
    pub name: &'static str,
    pub cc: PathBuf,
    pub launcher: PathBuf,
    pub launcher_args: Vec<String>,
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Mpi {
    /// Debian's Open MPI (`mpicc.openmpi`, `mpirun.openmpi`), if installed.
    pub fn openmpi() -> Option<Mpi> {
        Some(Mpi {
            name: "Open MPI",
            cc: on_path("mpicc.openmpi")?,
            launcher: on_path("mpirun.openmpi")?,
            // Root is refused without these; more ranks than cores needs oversubscription; with
            // few cores, busy-polling ranks starve each other.
            launcher_args: [
                "--allow-run-as-root",
                "--oversubscribe",
                "--mca",
                "mpi_yield_when_idle",
                "1",
                "--mca",
                "btl",
                "self,vader,tcp",
            ]
            .map(String::from)
            .to_vec(),
        })
    }

    /// Debian's MPICH (`mpicc.mpich`, `mpiexec.mpich`), if installed.
    pub fn mpich() -> Option<Mpi> {
        Some(Mpi {
            name: "MPICH",
            cc: on_path("mpicc.mpich")?,
            launcher: on_path("mpiexec.mpich")?,
            launcher_args: vec![],
        })
    }

    /// The first MPI found.
    pub fn any() -> Option<Mpi> {
        Mpi::openmpi().or_else(Mpi::mpich)
    }

    /// Compiles a C source file.
    pub fn compile(&self, src: &Path, out: &Path) -> Result<()> {
        let o = Command::new(&self.cc)
            .arg("-O2")
            .arg("-o")
            .arg(out)
            .arg(src)
            .output()
            .with_context(|| format!("failed to run {}", self.cc.display()))?;
        if !o.status.success() {
            bail!(
                "{} failed to compile {}:\n{}",
                self.cc.display(),
                src.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(())
    }

    /// Writes a bundled program's source into `dir` and compiles it; the executable.
    pub fn build_bundled(&self, dir: &Path, name: &str, source: &str) -> Result<PathBuf> {
        let src = dir.join(format!("{name}.c"));
        std::fs::write(&src, source)
            .with_context(|| format!("failed to write {}", src.display()))?;
        let exe = dir.join(name);
        self.compile(&src, &exe)?;
        Ok(exe)
    }

    /// The launch command line for `ranks` copies of `program`.
    pub fn launch(&self, ranks: u32, program: &Path) -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = vec![self.launcher.clone().into()];
        v.extend(self.launcher_args.iter().map(Into::into));
        v.push("-np".into());
        v.push(ranks.to_string().into());
        v.push(program.into());
        v
    }
}

/// `commscope demo`.
pub fn run(a: &DemoArgs) -> Result<ExitCode> {
    if a.capture {
        return capture(a);
    }
    match Mpi::any() {
        Some(mpi) => diagnose_mpi(a, &mpi),
        None => {
            println!(
                "commscope demo: no MPI installation found (run scripts/setup.sh for the real thing); telling the same story with the simulator\n"
            );
            crate::simulate::run(&crate::cli::SimulateArgs {
                collector: None,
                collector_http: None,
                auth_token_file: None,
                tls: Default::default(),
                ranks: 256,
                ranks_per_node: 8,
                tp: None,
                pp: None,
                slowdown: 1.5,
                degradation: 4.0,
                format: crate::cli::Format::Text,
                fault: vec!["straggler:37".into(), "hang:200:110".into()],
                duration: 40.0,
                seed: 1,
                job_id: Some(run::new_job_id()),
                onset_step: 20,
                links: false,
                compute_ms: 10.0,
                virtual_time: false,
                steps: 0,
                check: false,
                sample_modulus: None,
                sample_budget: None,
                memory_limit: None,
            })
        }
    }
}

/// The capture demo: a collector and an agent inside this process (loopback, a private socket),
/// the bundled MPI job registered with the agent, then what the collector captured.
fn capture(a: &DemoArgs) -> Result<ExitCode> {
    let Some(mpi) = Mpi::any() else {
        bail!(
            "the demo needs an MPI installation (mpicc and mpirun): run `scripts/setup.sh`, or `apt-get install openmpi-bin libopenmpi-dev`"
        )
    };
    let dir = WorkDir::new(a.trace_dir.is_none())?;
    let work = dir.path.as_path();
    let exe = mpi.build_bundled(work, "demo", DEMO_SOURCE)?;
    let trace_dir = a.trace_dir.clone().unwrap_or_else(|| work.join("traces"));
    let Local {
        rt,
        collector,
        agent,
        agent_config: ac,
    } = Local::start(work, &trace_dir)?;

    let spec = run::RunSpec {
        shim: run::find_shim(None)?,
        job_id: run::new_job_id(),
        trace_dir: None,
        agent_socket: Some(ac.socket.clone()),
        extra_env: vec![],
        command: mpi.launch(a.ranks.unwrap_or(4), &exe),
    };
    println!(
        "commscope demo: {} ranks of a training-step loop under {}, traced by the commscope shim\n\
         through a node agent and a collector running inside this command\n",
        a.ranks.unwrap_or(4),
        mpi.name
    );
    let code = run::run(&spec)?;
    if code != 0 {
        bail!("the demo job exited with status {code}");
    }

    // The job has ended for the collector once every rank's exit has arrived.
    let shared = collector.shared.clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let detail = loop {
        let d = shared
            .state
            .of(&spec.job_id)
            .jobs
            .get(&spec.job_id)
            .filter(|j| j.ended.is_some())
            .map(commscope_collector::http::job_detail);
        if let Some(d) = d {
            break d;
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the collector did not see job {} end within 30 s",
                spec.job_id
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    rt.block_on(agent.stop());
    rt.block_on(collector.stop());

    // Finalized, then exited without an error status (unknown where the kernel's
    // process-events connector is not available to the agent).
    let clean = detail
        .processes
        .iter()
        .filter(|p| p.finalized && p.state == "exited" && p.exit_status.unwrap_or(0) == 0)
        .count();
    let worst_clock = detail
        .processes
        .iter()
        .filter_map(|p| p.clock_error_ns)
        .max()
        .unwrap_or(0);
    println!(
        "\nthe collector received job {}: {} ranks on {}, {} records, {} dropped; {clean} of {} ranks finalized and exited cleanly; clocks aligned within {:.2} ms",
        detail.line.job,
        detail.line.ranks,
        detail.line.nodes.join(", "),
        detail.line.records,
        detail.line.dropped,
        detail.processes.len(),
        worst_clock as f64 / 1e6
    );
    let job_dir = trace_dir.join(&spec.job_id);
    let loaded = traces::load(std::slice::from_ref(&job_dir))?;
    println!("and stored it under {}:\n", job_dir.display());
    for job in loaded.jobs.values() {
        print!("{}", summary::render_text(&summary::summarize(job)?));
    }
    println!(
        "\nnext: `commscope trace summary {} --format json`; run it on a cluster with `commscope up` (or an agent per node and one collector)",
        job_dir.display()
    );
    if a.trace_dir.is_none() {
        println!("(the trace is in a temporary directory; pass --trace-dir DIR to keep it)");
    }
    Ok(ExitCode::SUCCESS)
}

/// The demo's scratch directory: its program, the agent's socket and spool, and the trace when
/// no `--trace-dir` is given. Removed when the demo ends — unless it holds the trace the demo
/// points the user to.
struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl WorkDir {
    /// A fresh one, kept after the demo when `holds_trace`.
    fn new(holds_trace: bool) -> Result<WorkDir> {
        let path = std::env::temp_dir().join(format!("commscope-demo-{}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("failed to create {}", path.display()))?;
        Ok(WorkDir {
            path,
            keep: holds_trace,
        })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A collector and an agent inside this process (loopback, a private socket under `work`).
struct Local {
    rt: tokio::runtime::Runtime,
    collector: commscope_collector::Running,
    agent: commscope_agent::Running,
    agent_config: commscope_agent::Config,
}

impl Local {
    fn start(work: &Path, trace_dir: &Path) -> Result<Local> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let mut cc = commscope_collector::Config::new(trace_dir);
        cc.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        cc.http = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let collector = rt.block_on(commscope_collector::start(cc))?;
        let mut ac = commscope_agent::Config::new(crate::config::default_node());
        ac.collectors = vec![format!("http://{}", collector.listen)];
        ac.socket = work.join("agent.sock");
        ac.spool_dir = work.join("spool");
        ac.http = None;
        let agent = rt.block_on(commscope_agent::start(ac.clone()))?;
        Ok(Local {
            rt,
            collector,
            agent,
            agent_config: ac,
        })
    }
}

use crate::simulate::job_findings;

/// The MPI diagnosis story: a straggler, then a hang, found live and again from the trace.
fn diagnose_mpi(a: &DemoArgs, mpi: &Mpi) -> Result<ExitCode> {
    use commscope_analyzer::finding::State;
    use std::time::{Duration, Instant};
    let ranks = a.ranks.unwrap_or(8).max(4);
    let (straggler, hang) = (5 % ranks, 2 % ranks);
    let dir = WorkDir::new(a.trace_dir.is_none())?;
    let work = dir.path.as_path();
    let exe = mpi.build_bundled(work, "diagnosis", DIAGNOSIS_SOURCE)?;
    let trace_dir = a.trace_dir.clone().unwrap_or_else(|| work.join("traces"));
    let Local {
        rt,
        collector,
        agent,
        agent_config: ac,
    } = Local::start(work, &trace_dir)?;
    let (slow_from, slow_until, hang_at) = (3.0, 13.0, 30.0);
    let mut command = mpi.launch(ranks, &exe);
    for x in [straggler, hang] {
        command.push(x.to_string().into());
    }
    for x in [slow_from, slow_until, hang_at] {
        command.push(format!("{x}").into());
    }
    let spec = run::RunSpec {
        shim: run::find_shim(None)?,
        job_id: run::new_job_id(),
        trace_dir: None,
        agent_socket: Some(ac.socket.clone()),
        extra_env: vec![],
        command,
    };
    println!(
        "commscope demo: {ranks} ranks of a training-step loop under {}, traced by the commscope shim through a\n\
         node agent and a collector running inside this command. Rank {straggler} computes 4x as much from\n\
         {slow_from:.0} s to {slow_until:.0} s; at {hang_at:.0} s rank {hang} stops calling collectives. The collector's findings, as they happen:\n",
        mpi.name
    );
    let job_spec = spec.clone();
    let job = std::thread::spawn(move || run::run(&job_spec));
    let shared = collector.shared.clone();
    let start = Instant::now();
    // Per finding: open or not, and the summary last printed.
    let mut seen: std::collections::BTreeMap<String, (bool, String)> = Default::default();
    let mut hang_seen: Option<Instant> = None;
    let mut killed = false;
    let deadline = Duration::from_secs(120);
    loop {
        for f in job_findings(&shared, &spec.job_id) {
            let open = f.state == State::Open;
            if seen.get(&f.id).is_some_and(|s| s.0 == open) {
                continue;
            }
            let printed = seen
                .insert(f.id.clone(), (open, f.summary.clone()))
                .map(|s| s.1);
            let t = start.elapsed().as_secs_f64();
            if open {
                println!("[{t:5.1} s] OPEN      {}: {}", f.kind.name(), f.summary);
                if f.kind == commscope_analyzer::Kind::Hang {
                    hang_seen.get_or_insert_with(Instant::now);
                }
            } else if printed.as_ref() != Some(&f.summary) {
                // Its figures at its peak, which the trace's analysis reports too.
                println!("[{t:5.1} s] RESOLVED  {}: {}", f.kind.name(), f.summary);
            } else {
                println!(
                    "[{t:5.1} s] RESOLVED  {} of {}",
                    f.kind.name(),
                    commscope_analyzer::finding::ranks_phrase(&f.ranks)
                );
            }
        }
        if !killed
            && (hang_seen.is_some_and(|t| t.elapsed() >= Duration::from_secs(3))
                || start.elapsed() > deadline)
        {
            killed = true;
            println!(
                "[{:5.1} s] (the demo kills the hung job, as its operator would)",
                start.elapsed().as_secs_f64()
            );
            let _ = std::process::Command::new("pkill")
                .arg("-9")
                .arg("-f")
                .arg(&exe)
                .status();
        }
        let ended = shared
            .state
            .of(&spec.job_id)
            .jobs
            .get(&spec.job_id)
            .is_some_and(|j| j.ended.is_some());
        let open_left = job_findings(&shared, &spec.job_id)
            .iter()
            .any(|f| f.state == State::Open && f.kind == commscope_analyzer::Kind::Hang);
        if killed && job.is_finished() && ended && !open_left {
            break;
        }
        if start.elapsed() > deadline + Duration::from_secs(30) {
            bail!("the demo job did not end");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = job.join();
    rt.block_on(agent.stop());
    rt.block_on(collector.stop());
    let job_dir = trace_dir.join(&spec.job_id);
    let loaded = traces::load(std::slice::from_ref(&job_dir))?;
    println!(
        "\n`commscope analyze {}` on the stored trace:",
        job_dir.display()
    );
    for j in loaded.jobs.values() {
        for f in commscope_analyzer::analyze(&j.job, &j.processes, &Default::default()) {
            println!(
                "  {} ({}): {}",
                f.kind.name(),
                match f.state {
                    State::Open => "open at the end",
                    State::Resolved => "resolved",
                },
                f.summary
            );
        }
    }
    let found: Vec<&str> = seen.keys().map(String::as_str).collect();
    if found.is_empty() {
        println!("(no findings: the machine may be too loaded for the straggler to stand out)");
    }
    if a.trace_dir.is_none() {
        println!("(the trace is in a temporary directory; pass --trace-dir DIR to keep it)");
    }
    Ok(ExitCode::SUCCESS)
}
