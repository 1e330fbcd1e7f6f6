//! `commscope run`: starts a command with the shim preloaded into every rank.
//!
//! The identity and delivery settings travel as `COMMSCOPE_*` variables. Launchers that do not
//! hand their environment to remote ranks get them explicitly: Open MPI's `mpirun` with `-x`,
//! MPICH's Hydra `mpiexec` with `-genv`. Slurm's `srun` and `torchrun` pass the environment on by
//! default. Signals sent to `commscope run` are forwarded to the command, and its exit status is
//! returned (128 + N when the command died of signal N).
//!
//! With `--trace-dir`, `run` also keeps the rings of the ranks on its node
//! ([`commscope_agent::keeper`]): a rank killed with SIGKILL still gets its last records and
//! what it was inside into its trace file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// How to reach every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's `mpirun`/`mpiexec`/`orterun`/`prterun`: `-x NAME=VALUE`.
    OpenMpi,
    /// MPICH's Hydra `mpiexec`/`mpirun`: `-genv NAME VALUE`.
    Hydra,
    /// Anything else (a plain program, `srun`, `torchrun`, …): the environment is inherited.
    Inherit,
}

/// What `commscope run` sets up.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub shim: PathBuf,
    pub job_id: String,
    pub trace_dir: Option<PathBuf>,
    pub agent_socket: Option<PathBuf>,
    /// Extra `COMMSCOPE_*` variables (e.g. `COMMSCOPE_DISABLE`).
    pub extra_env: Vec<(String, String)>,
    pub command: Vec<OsString>,
}

/// Finds `libcommscope.so`: `--shim`, then `COMMSCOPE_SHIM`, then beside this executable, then
/// `../lib/commscope/` relative to it (an installed layout).
pub fn find_shim(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned()));
        }
        bail!("the shim library {} does not exist", p.display());
    }
    if let Some(p) = std::env::var_os("COMMSCOPE_SHIM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("COMMSCOPE_SHIM names {}, which does not exist", p.display());
    }
    let exe = std::env::current_exe().context("failed to locate the commscope executable")?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let candidates = [
        dir.join("libcommscope.so"),
        // `cargo test` runs binaries from target/debug/deps.
        dir.join("../libcommscope.so"),
        dir.join("../lib/commscope/libcommscope.so"),
    ];
    for c in &candidates {
        if c.is_file() {
            return Ok(std::fs::canonicalize(c).unwrap_or_else(|_| c.clone()));
        }
    }
    bail!(
        "cannot find libcommscope.so beside {} (build it with `cargo build -p commscope-shim`, or pass --shim PATH)",
        exe.display()
    )
}

/// Recognises the launcher from the command's first word (following symbolic links, since
/// Debian installs `mpirun` as an alternative pointing at `mpirun.openmpi` or `mpirun.mpich`).
pub fn detect_launcher(program: &Path) -> Launcher {
    let resolved = which(program).and_then(|p| std::fs::canonicalize(p).ok());
    let names: Vec<String> = [Some(program.to_path_buf()), resolved]
        .into_iter()
        .flatten()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let is = |pred: &dyn Fn(&str) -> bool| names.iter().any(|n| pred(n));
    if !is(&|n| {
        n.starts_with("mpirun")
            || n.starts_with("mpiexec")
            || n == "orterun"
            || n == "prterun"
            || n == "oshrun"
            || n.starts_with("hydra")
    }) {
        return Launcher::Inherit;
    }
    if is(&|n| n.contains("openmpi") || n == "orterun" || n == "prterun") {
        return Launcher::OpenMpi;
    }
    if is(&|n| n.contains("mpich") || n.contains("hydra")) {
        return Launcher::Hydra;
    }
    // Ask the launcher itself.
    let out = Command::new(program).arg("--version").output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).to_lowercase()
                + &String::from_utf8_lossy(&o.stderr).to_lowercase();
            if text.contains("open mpi") || text.contains("open-rte") {
                Launcher::OpenMpi
            } else if text.contains("hydra") || text.contains("mpich") {
                Launcher::Hydra
            } else {
                Launcher::Inherit
            }
        }
        Err(_) => Launcher::Inherit,
    }
}

fn which(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return Some(program.to_owned());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

impl RunSpec {
    /// The variables every rank needs.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut preload = self.shim.display().to_string();
        if let Ok(existing) = std::env::var("LD_PRELOAD")
            && !existing.trim().is_empty()
            && !existing.split([':', ' ']).any(|p| p == preload)
        {
            preload = format!("{preload}:{existing}");
        }
        let mut v = vec![
            ("LD_PRELOAD".to_owned(), preload),
            ("COMMSCOPE_JOB_ID".to_owned(), self.job_id.clone()),
        ];
        if let Some(d) = &self.trace_dir {
            v.push(("COMMSCOPE_TRACE_DIR".to_owned(), d.display().to_string()));
        }
        if let Some(s) = &self.agent_socket {
            v.push(("COMMSCOPE_AGENT_SOCKET".to_owned(), s.display().to_string()));
        }
        v.extend(self.extra_env.iter().cloned());
        v
    }

    /// The command to start, with launcher flags inserted after the launcher's name.
    pub fn command(&self) -> Result<Command> {
        let Some((program, args)) = self.command.split_first() else {
            bail!("no command given after `--`")
        };
        let launcher = detect_launcher(Path::new(program));
        let mut cmd = Command::new(program);
        let env = self.env();
        match launcher {
            Launcher::OpenMpi => {
                let exports: Vec<String> = env
                    .iter()
                    .flat_map(|(k, v)| ["-x".to_owned(), format!("{k}={v}")])
                    .collect();
                cmd.args(&exports);
                // The launcher itself needs no preload, but its local ranks read the rest too.
                for (k, v) in env.iter().filter(|(k, _)| k != "LD_PRELOAD") {
                    cmd.env(k, v);
                }
                // `-x` reaches only the app context it belongs to: in an MPMD launch
                // (`-np 2 a : -np 2 b`) every context after a `:` needs its own.
                for a in args {
                    cmd.arg(a);
                    if a == ":" {
                        cmd.args(&exports);
                    }
                }
                return Ok(cmd);
            }
            Launcher::Hydra => {
                for (k, v) in &env {
                    cmd.arg("-genv").arg(k).arg(v);
                }
                for (k, v) in env.iter().filter(|(k, _)| k != "LD_PRELOAD") {
                    cmd.env(k, v);
                }
            }
            Launcher::Inherit => {
                for (k, v) in &env {
                    cmd.env(k, v);
                }
            }
        }
        cmd.args(args);
        Ok(cmd)
    }
}

/// A job id for a run: `run-<utc time>-<pid>`.
pub fn new_job_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "run-{y:04}{m:02}{d:02}-{:02}{:02}{:02}-{}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        std::process::id()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Runs the command to completion, forwarding signals; returns the exit code to use.
pub fn run(spec: &RunSpec) -> Result<i32> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
    use std::os::unix::process::ExitStatusExt;

    let mut spec = spec.clone();
    let mut keeper = None;
    if let Some(d) = &spec.trace_dir {
        std::fs::create_dir_all(d)
            .with_context(|| format!("failed to create the trace directory {}", d.display()))?;
        match commscope_agent::keeper::Keeper::start(d) {
            Ok(k) => {
                spec.extra_env.push((
                    "COMMSCOPE_KEEPER_SOCKET".to_owned(),
                    k.socket().display().to_string(),
                ));
                keeper = Some(k);
            }
            Err(e) => eprintln!(
                "commscope run: {e}; a rank killed with SIGKILL will lose its last records"
            ),
        }
    }
    let mut cmd = spec.command()?;
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2])
            .context("failed to install signal handlers")?;
    let handle = signals.handle();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("failed to start {}", spec.command[0].to_string_lossy()))?;
    let pid = child.id() as libc::pid_t;
    let forwarder = std::thread::spawn(move || {
        for sig in signals.forever() {
            // SAFETY: sending a signal to our own child process.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, sig)
            };
        }
    });
    let status = child.wait().context("failed to wait for the command")?;
    handle.close();
    let _ = forwarder.join();
    if let Some(k) = keeper {
        // The ranks are gone with their launcher; their trace files are completed in moments.
        let report = k.finish(std::time::Duration::from_secs(5));
        for e in &report.errors {
            eprintln!("commscope run: {e}");
        }
        if report.completed > 0 {
            eprintln!(
                "commscope run: wrote the last {} records of {} rank{} that ended before writing them out (killed)",
                report.records,
                report.completed,
                if report.completed == 1 { "" } else { "s" },
            );
        }
    }
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_carry_the_date() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_789), (2026, 12, 2));
        assert!(new_job_id().starts_with("run-"));
    }

    #[test]
    fn plain_programs_inherit_the_environment() {
        assert_eq!(detect_launcher(Path::new("/bin/true")), Launcher::Inherit);
        assert_eq!(detect_launcher(Path::new("torchrun")), Launcher::Inherit);
        assert_eq!(
            detect_launcher(Path::new("mpirun.openmpi")),
            Launcher::OpenMpi
        );
        assert_eq!(detect_launcher(Path::new("mpiexec.hydra")), Launcher::Hydra);
    }

    #[test]
    fn open_mpi_gets_dash_x_and_hydra_gets_genv() {
        let spec = |prog: &str| RunSpec {
            shim: "/x/libcommscope.so".into(),
            job_id: "j1".into(),
            trace_dir: Some("/t".into()),
            agent_socket: None,
            extra_env: vec![],
            command: vec![prog.into(), "-np".into(), "2".into(), "./a.out".into()],
        };
        let args = |c: &Command| {
            c.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        let c = spec("mpirun.openmpi").command().expect("command");
        let a = args(&c);
        assert!(
            a.windows(2)
                .any(|w| w[0] == "-x" && w[1] == "COMMSCOPE_JOB_ID=j1"),
            "{a:?}"
        );
        assert!(
            a.windows(2)
                .any(|w| w[0] == "-x" && w[1].starts_with("LD_PRELOAD=/x/libcommscope.so")),
            "{a:?}"
        );
        assert_eq!(&a[a.len() - 3..], ["-np", "2", "./a.out"]);
        // MPMD: each app context gets the exports.
        let mut mpmd = spec("mpirun");
        mpmd.command
            .extend([":".into(), "-np".into(), "1".into(), "./b.out".into()]);
        let a = args(&mpmd.command().expect("command"));
        let colon = a.iter().position(|x| x == ":").expect("separator");
        assert_eq!(
            a.iter().filter(|x| x.starts_with("LD_PRELOAD=")).count(),
            2,
            "{a:?}"
        );
        assert_eq!(a[colon + 1], "-x", "{a:?}");
        assert_eq!(&a[a.len() - 3..], ["-np", "1", "./b.out"]);
        let c = spec("mpiexec.hydra").command().expect("command");
        let a = args(&c);
        assert!(
            a.windows(3)
                .any(|w| w[0] == "-genv" && w[1] == "COMMSCOPE_TRACE_DIR" && w[2] == "/t"),
            "{a:?}"
        );
    }
}
