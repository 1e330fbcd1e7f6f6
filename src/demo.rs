//! `commscope demo`: builds the bundled MPI example, runs it under the shim on this machine and
//! prints what was captured.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

use crate::cli::DemoArgs;
use crate::{run, summary, traces};

/// The bundled example program.
pub const DEMO_SOURCE: &str = include_str!("../examples/mpi/demo.c");

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

/// Runs the demo.
pub fn run(a: &DemoArgs) -> Result<ExitCode> {
    let Some(mpi) = Mpi::any() else {
        bail!(
            "the demo needs an MPI installation (mpicc and mpirun): run `scripts/setup.sh`, or `apt-get install openmpi-bin libopenmpi-dev`"
        )
    };
    let work = tempfile_dir()?;
    let src = work.join("demo.c");
    std::fs::write(&src, DEMO_SOURCE)
        .with_context(|| format!("failed to write {}", src.display()))?;
    let exe = work.join("demo");
    mpi.compile(&src, &exe)?;
    let trace_dir = a.trace_dir.clone().unwrap_or_else(|| work.join("traces"));
    let spec = run::RunSpec {
        shim: run::find_shim(None)?,
        job_id: run::new_job_id(),
        trace_dir: Some(trace_dir.clone()),
        agent_socket: None,
        extra_env: vec![],
        command: mpi.launch(a.ranks, &exe),
    };
    println!(
        "commscope demo: {} ranks of a training-step loop under {} with the commscope shim\n",
        a.ranks, mpi.name
    );
    let code = run::run(&spec)?;
    if code != 0 {
        bail!("the demo job exited with status {code}");
    }
    let job_dir = trace_dir.join(&spec.job_id);
    let loaded = traces::load(std::slice::from_ref(&job_dir))?;
    println!("\ncaptured under {}:\n", job_dir.display());
    for job in loaded.jobs.values() {
        print!("{}", summary::render_text(&summary::summarize(job)));
    }
    println!(
        "\nnext: `commscope trace summary {} --format json`, or `commscope trace merge {} -o job.parquet`",
        job_dir.display(),
        job_dir.display()
    );
    if a.trace_dir.is_none() {
        println!("(the trace is in a temporary directory; pass --trace-dir DIR to keep it)");
    }
    Ok(ExitCode::SUCCESS)
}

fn tempfile_dir() -> Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("commscope-demo-{}", std::process::id()));
    std::fs::create_dir_all(&base)
        .with_context(|| format!("failed to create {}", base.display()))?;
    Ok(base)
}
