//! Helpers for commscope's end-to-end tests: building the C programs in `tests/c/` with each
//! installed MPI, running them under `commscope run`, and reading back what was recorded.
//!
//! The tests use the binaries of the same build (`target/<profile>/commscope` and
//! `libcommscope.so`), which `cargo build` at the workspace root produces; each test fails with a
//! clear message when they are missing.

pub mod bench;
pub mod coverage;
pub mod nccl;
pub mod prometheus;
pub mod python;
pub mod services;
pub mod testbed;
pub mod transport;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use commscope_cli::demo::Mpi;
use commscope_cli::traces::{self, JobTrace};

/// The MPI implementations the tests run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    OpenMpi,
    Mpich,
}

impl Flavour {
    /// A short name for paths and messages.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::OpenMpi => "openmpi",
            Flavour::Mpich => "mpich",
        }
    }

    /// The installation; panics with a message saying how to install it when missing (the
    /// README's test command installs both).
    pub fn mpi(self) -> Mpi {
        let m = match self {
            Flavour::OpenMpi => Mpi::openmpi(),
            Flavour::Mpich => Mpi::mpich(),
        };
        m.unwrap_or_else(|| panic!("{} is not installed: run scripts/setup.sh", self.name()))
    }
}

/// The directory holding this build's binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/<test> -> target/debug
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The `commscope` binary.
pub fn commscope_bin() -> PathBuf {
    let p = bin_dir().join("commscope");
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build` at the workspace root first",
        p.display()
    );
    let shim = bin_dir().join("libcommscope.so");
    assert!(
        shim.is_file(),
        "{} is missing: run `cargo build` at the workspace root first",
        shim.display()
    );
    p
}

/// The shim library.
pub fn shim() -> PathBuf {
    commscope_bin();
    bin_dir().join("libcommscope.so")
}

/// A `commscope` command with the environment MPI launchers need here.
pub fn commscope() -> Command {
    let mut c = Command::new(commscope_bin());
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    // Tests choose their own trace directory and socket.
    c.env_remove("COMMSCOPE_TRACE_DIR")
        .env_remove("COMMSCOPE_AGENT_SOCKET")
        .env_remove("COMMSCOPE_JOB_ID");
    c
}

/// The source directory of the test programs.
pub fn c_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("c")
}

/// Compiles `tests/c/<name>.c` (`name` may name a subdirectory: `fidelity/errors`) with a
/// flavour's `mpicc` (cached per flavour under the target directory, rebuilt when the source or
/// a header beside it is newer).
pub fn build(flavour: Flavour, name: &str) -> PathBuf {
    let src = c_dir().join(format!("{name}.c"));
    cached(flavour, &name.replace('/', "-"), &src, |tmp| {
        flavour
            .mpi()
            .compile(&src, tmp)
            .unwrap_or_else(|e| panic!("{e:#}"))
    })
}

/// Compiles `tests/fortran/<name>.f90` with a flavour's `mpifort` (cached like [`build`]).
pub fn build_fortran(flavour: Flavour, name: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fortran")
        .join(format!("{name}.f90"));
    let compiler = match flavour {
        Flavour::OpenMpi => "mpifort.openmpi",
        Flavour::Mpich => "mpifort.mpich",
    };
    cached(flavour, &format!("{name}-f90"), &src, |tmp| {
        let mut c = Command::new(compiler);
        c.arg("-O1").arg("-o").arg(tmp).arg(&src);
        // MPICH's `use mpi` declares buffers without "ignore type": gfortran needs this.
        if flavour == Flavour::Mpich {
            c.arg("-fallow-argument-mismatch").arg("-w");
        }
        // Module files go next to the binary, not into the source tree.
        c.current_dir(tmp.parent().expect("build dir"));
        let o = c
            .output()
            .unwrap_or_else(|e| panic!("run {compiler}: {e} (scripts/setup.sh installs it)"));
        assert!(
            o.status.success(),
            "{compiler} failed to compile {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    })
}

/// `target/debug/c-programs/<flavour>/<out_name>`, rebuilt by `compile(tmp)` when `src` is newer.
fn cached(flavour: Flavour, out_name: &str, src: &Path, compile: impl FnOnce(&Path)) -> PathBuf {
    let out_dir = bin_dir().join("c-programs").join(flavour.name());
    std::fs::create_dir_all(&out_dir).expect("create build dir");
    let out = out_dir.join(out_name);
    let newest_input = std::fs::read_dir(src.parent().expect("source dir"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p == src || p.extension().is_some_and(|x| x == "h"))
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max();
    let fresh = match (
        newest_input,
        std::fs::metadata(&out).and_then(|m| m.modified()),
    ) {
        (Some(s), Ok(o)) => o >= s,
        _ => false,
    };
    if !fresh {
        // Compile to a unique name and rename, so parallel tests never see half a binary.
        let tmp = out_dir.join(format!("{out_name}.{}.tmp", std::process::id()));
        compile(&tmp);
        std::fs::rename(&tmp, &out).expect("rename program");
    }
    out
}

/// The launch command for `ranks` copies of a program with arguments.
pub fn launch(flavour: Flavour, ranks: u32, program: &Path, args: &[&str]) -> Vec<OsString> {
    let mut v = flavour.mpi().launch(ranks, program);
    v.extend(args.iter().map(OsString::from));
    v
}

/// Runs a launch command without commscope (nothing preloaded), with extra environment: what
/// a program does on its own, to compare with its run under the shim.
pub fn run_plain(cmd: &[OsString], extra_env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("LD_PRELOAD");
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.output().expect("run without the shim")
}

/// Runs `commscope run --trace-dir DIR --job-id JOB -- CMD…` and returns its output.
pub fn run_traced(
    trace_dir: &Path,
    job: &str,
    cmd: &[OsString],
    extra_env: &[(&str, &str)],
) -> Output {
    let mut c = commscope();
    c.arg("run")
        .arg("--trace-dir")
        .arg(trace_dir)
        .arg("--job-id")
        .arg(job)
        .arg("--")
        .args(cmd);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.output().expect("run commscope")
}

/// Asserts a command succeeded, showing its output otherwise.
pub fn assert_ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed with {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Loads the one job under a directory.
pub fn load_job(dir: &Path) -> JobTrace {
    let mut loaded = traces::load(&[dir.to_path_buf()])
        .unwrap_or_else(|e| panic!("load {}: {e:#}", dir.display()));
    assert!(
        loaded.warnings.is_empty(),
        "unreadable traces: {:?}",
        loaded.warnings
    );
    assert_eq!(
        loaded.jobs.len(),
        1,
        "expected one job under {}",
        dir.display()
    );
    loaded.jobs.pop_first().expect("one job").1
}

/// Runs `commscope trace summary --format json` and parses it.
pub fn summary_json(paths: &[&Path]) -> (serde_json::Value, Output) {
    let o = commscope()
        .arg("trace")
        .arg("summary")
        .args(paths)
        .arg("--format")
        .arg("json")
        .output()
        .expect("summary");
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (v, o)
}

/// Several "nodes" on one machine: network namespaces on a bridge, each with its own host name
/// (a UTS namespace entered on every launch), reachable by name through `/etc/hosts`, and an rsh
/// agent script that Open MPI uses to start its daemons inside them. Everything is removed on
/// drop, also when a test fails.
#[derive(Debug)]
pub struct Nodes {
    pub names: Vec<String>,
    pub subnet: String,
    /// This machine's address on the nodes' network (the launcher's side).
    pub gateway: String,
    pub rsh: PathBuf,
    bridge: String,
    _dir: tempfile::TempDir,
}

impl Nodes {
    /// Creates `n` nodes named `cs<tag>-0`, `cs<tag>-1`, … (after removing what test runs that
    /// were killed left behind).
    pub fn new(n: usize) -> Nodes {
        Nodes::remove_stale();
        let tag = std::process::id();
        let net = 64 + (std::process::id() % 128);
        let bridge = format!("csbr{tag}");
        let dir = tempfile::tempdir().expect("tempdir");
        let rsh = dir.path().join("nsrsh");
        std::fs::write(
            &rsh,
            // Hydra calls its launcher like ssh (`-x HOST CMD`), Open MPI as `HOST CMD`.
            "#!/bin/sh\n[ \"$1\" = -x ] && shift\nhost=$1; shift\nexec ip netns exec \"$host\" unshare --uts /bin/sh -c \"hostname $host; $*\"\n",
        )
        .expect("write rsh agent");
        std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let mut nodes = Nodes {
            names: (0..n).map(|i| format!("cs{tag}-{i}")).collect(),
            subnet: format!("10.77.{net}.0/24"),
            gateway: format!("10.77.{net}.254"),
            rsh,
            bridge: bridge.clone(),
            _dir: dir,
        };
        let ip = |args: &str| ip(&args.split_whitespace().collect::<Vec<_>>());
        ip(&format!("link add {bridge} type bridge"));
        ip(&format!("addr add 10.77.{net}.254/24 dev {bridge}"));
        ip(&format!("link set {bridge} up"));
        let mut hosts = String::new();
        for (i, name) in nodes.names.clone().iter().enumerate() {
            ip(&format!("netns add {name}"));
            ip(&format!(
                "link add v{name} type veth peer name eth0 netns {name}"
            ));
            ip(&format!("link set v{name} master {bridge} up"));
            ip(&format!(
                "-n {name} addr add 10.77.{net}.{}/24 dev eth0",
                i + 1
            ));
            ip(&format!("-n {name} link set eth0 up"));
            ip(&format!("-n {name} link set lo up"));
            hosts += &format!("10.77.{net}.{} {name} # commscope-test\n", i + 1);
        }
        let mut h = std::fs::OpenOptions::new()
            .append(true)
            .open("/etc/hosts")
            .expect("open /etc/hosts");
        std::io::Write::write_all(&mut h, hosts.as_bytes()).expect("append /etc/hosts");
        nodes.subnet = format!("10.77.{net}.0/24");
        nodes
    }

    /// Open MPI launcher arguments that place `per_node` ranks on each node.
    pub fn openmpi_args(&self, per_node: u32) -> Vec<String> {
        let hosts: Vec<String> = self
            .names
            .iter()
            .map(|n| format!("{n}:{per_node}"))
            .collect();
        [
            "--allow-run-as-root",
            "--mca",
            "plm_rsh_agent",
            self.rsh.to_str().unwrap_or_default(),
            "--mca",
            "btl",
            "tcp,self",
            "--mca",
            "btl_tcp_if_include",
            &self.subnet,
            "--mca",
            "oob_tcp_if_include",
            &self.subnet,
            "--mca",
            "mpi_yield_when_idle",
            "1",
            "--host",
            &hosts.join(","),
        ]
        .map(String::from)
        .to_vec()
    }
}

impl Nodes {
    /// MPICH (Hydra) launcher arguments that place `per_node` ranks on each node.
    pub fn hydra_args(&self, per_node: u32) -> Vec<String> {
        let hosts: Vec<String> = self
            .names
            .iter()
            .map(|n| format!("{n}:{per_node}"))
            .collect();
        vec![
            "-launcher".into(),
            "ssh".into(),
            "-launcher-exec".into(),
            self.rsh.display().to_string(),
            "-localhost".into(),
            self.gateway.clone(),
            "-hosts".into(),
            hosts.join(","),
        ]
    }
}

impl Nodes {
    /// Removes namespaces, bridges and host entries of earlier test processes that no longer run.
    fn remove_stale() {
        let alive = |tag: &str| {
            tag.parse::<u32>()
                .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists())
        };
        let out = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        for line in out.unwrap_or_default().lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if let Some(tag) = tag_of(name)
                && !alive(tag)
            {
                let _ = Command::new("ip").args(["netns", "del", name]).output();
                let _ = Command::new("ip")
                    .args(["link", "del", &format!("csbr{tag}")])
                    .output();
            }
        }
        // Host ends of veth pairs whose namespace could not go (a process was still in it).
        let links = Command::new("ip")
            .args(["-br", "link", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        for line in links.unwrap_or_default().lines() {
            let name = line.split(['@', ' ']).next().unwrap_or("");
            if let Some(tag) = name.strip_prefix('v').and_then(tag_of)
                && !alive(tag)
            {
                let _ = Command::new("ip").args(["link", "del", name]).output();
            }
        }
        remove_host_lines(|host| tag_of(host).is_some_and(|t| !alive(t)));
        remove_session_dirs(|host| tag_of(host).is_some_and(|t| !alive(t)));
    }
}

/// The pid tag of a node name (`cs<pid>-<i>`).
fn tag_of(name: &str) -> Option<&str> {
    name.strip_prefix("cs").and_then(|r| r.split('-').next())
}

/// Runs `ip ARGS…` (as root) and asserts it succeeded.
pub fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Removes the fixture's `/etc/hosts` lines whose host name `gone` selects.
fn remove_host_lines(gone: impl Fn(&str) -> bool) {
    let Ok(hosts) = std::fs::read_to_string("/etc/hosts") else {
        return;
    };
    let kept: String = hosts
        .lines()
        .filter(|l| {
            !(l.ends_with("# commscope-test") && l.split_whitespace().nth(1).is_some_and(&gone))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let _ = std::fs::write("/etc/hosts", kept);
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for name in &self.names {
            // The veth pair goes with its host end at once; with the namespace only once the
            // last process in it is gone.
            let _ = Command::new("ip")
                .args(["link", "del", &format!("v{name}")])
                .output();
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        remove_host_lines(|host| self.names.iter().any(|n| n == host));
        remove_session_dirs(|host| self.names.iter().any(|n| n == host));
    }
}

/// Removes the session directories (`ompi.HOST.UID` in the temporary directory) that Open MPI's
/// daemons left for the hosts `gone` selects: a job killed by its test leaves them, shared-memory
/// segments included, and on the nodes of this fixture nothing else would ever remove them.
fn remove_session_dirs(gone: impl Fn(&str) -> bool) {
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let host = name
            .to_str()
            .and_then(|n| n.strip_prefix("ompi."))
            .and_then(|n| n.rsplit_once('.'))
            .map(|(host, _uid)| host);
        if host.is_some_and(&gone) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// `commscope analyze DIR --format json`, parsed (the command must succeed).
pub fn analyze_json(dir: &Path) -> serde_json::Value {
    let o = commscope()
        .arg("analyze")
        .arg(dir)
        .arg("--format")
        .arg("json")
        .env("COMMSCOPE_EXPLAIN", "1")
        .output()
        .expect("analyze");
    assert_ok(&o, "commscope analyze");
    let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("findings JSON");
    // What the detectors saw, for a failing test to show.
    v["explain"] = String::from_utf8_lossy(&o.stderr).into_owned().into();
    v
}

/// Polls `f` every 100 ms until it returns a value; panics naming `what` after `timeout`.
pub fn wait<T>(what: &str, timeout: std::time::Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Whether this runs as root (loading eBPF programs needs it); says so when it does not.
pub fn root() -> bool {
    // SAFETY: a plain getter.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        eprintln!("skipped: loading eBPF programs needs root");
    }
    euid == 0
}
