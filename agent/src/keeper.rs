//! The trace keeper of `commscope run --trace-dir`: it holds every local rank's ring while the
//! rank runs, and completes the rank's trace file when the process ends without having written
//! it out.
//!
//! A rank writes its `.cst` file every 200 ms, and at once when it ends by itself (exit, abort,
//! a fatal signal, SIGTERM). A rank killed with SIGKILL (the OOM killer; Hydra taking a job
//! down) writes nothing more: its last records, and what it was inside, would be lost with it,
//! and with them the order in which the job's ranks stopped. The keeper closes that gap without
//! an agent: each rank registers with it as with an agent (the same handshake, its memfd
//! attached; `COMMSCOPE_KEEPER_SOCKET`), and the keeper, which reads nothing while the rank
//! runs, waits for the process to end (pidfd). Then it appends to the rank's file the records
//! the file lacks (from the last `rec_seq` of its last intact block to the ring's head) and the
//! closing records an agent would send ([`crate::closing`]): the final counters, the calls in
//! flight, and the exit as the kernel reported it (status or signal where the process-events
//! connector is available, its time always).
//!
//! The file is appended to only after its writer is gone, so nothing else writes it then; a
//! block the writer's death cut in half is cut off first, and its records are written again
//! from the ring. A rank that ended cleanly (it finalized and wrote everything) is left alone.
//! Ranks on other nodes cannot reach the keeper: there, run an agent.

use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use commscope_wire::cst;
use commscope_wire::record::RawRecord;
use commscope_wire::shm::{Consumer, state};

use crate::closing::{Seen, Who, closing_records};
use crate::exits::ExitWatcher;
use crate::registration::Registered;

/// Records per appended block (as the shim writes them).
const BLOCK_RECORDS: usize = 512;

/// Why a trace file could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be set up.
    #[error("failed to set up the trace keeper's socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The trace file could not be read.
    #[error(transparent)]
    Read(#[from] cst::Error),
    /// The trace file belongs to another process (same name, another start).
    #[error("{path} belongs to another process (start time {found}, expected {expected})")]
    Foreign {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    /// Appending failed.
    #[error("failed to append to {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the keeper did, for `commscope run` to report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Processes that registered.
    pub registered: u64,
    /// Trace files that lacked records of the ring when their process ended, and how many
    /// were appended (besides the closing records every unclean end gets).
    pub completed: u64,
    pub records: u64,
    /// Problems, one line each.
    pub errors: Vec<String>,
}

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    registered: AtomicU64,
    completed: AtomicU64,
    records: AtomicU64,
    errors: Mutex<Vec<String>>,
    /// Processes registered and not yet done with, and the condition `finish` waits on.
    open: Mutex<u64>,
    done: Condvar,
}

/// A running keeper; its socket lives in a private directory removed on drop.
#[derive(Debug)]
pub struct Keeper {
    dir: PathBuf,
    socket: PathBuf,
    shared: Arc<Shared>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Listens for ranks of a job whose trace files go under `trace_dir`.
    pub fn start(trace_dir: &Path) -> Result<Keeper, Error> {
        let dir = std::env::temp_dir().join(format!(
            "commscope-run-{}-{}",
            std::process::id(),
            crate::daemon::now_mono()
        ));
        let socket = dir.join("keeper.sock");
        let fail = |source| Error::Socket {
            path: socket.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(fail)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
        let listener = UnixListener::bind(&socket).map_err(fail)?;
        let shared = Arc::new(Shared::default());
        let (watcher, _) = ExitWatcher::start();
        let sh = shared.clone();
        let trace_dir = trace_dir.to_path_buf();
        let accept = std::thread::Builder::new()
            .name("trace-keeper".into())
            .spawn(move || accept_loop(listener, trace_dir, watcher, sh))
            .map_err(fail)?;
        Ok(Keeper {
            dir,
            socket,
            shared,
            accept: Some(accept),
        })
    }

    /// The socket ranks register at (`COMMSCOPE_KEEPER_SOCKET`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// After the job: waits, at most `wait`, until every registered process has ended and its
    /// trace is complete, then stops listening.
    pub fn finish(mut self, wait: Duration) -> Report {
        let deadline = Instant::now() + wait;
        let mut open = self.shared.open.lock().unwrap_or_else(|p| p.into_inner());
        while *open > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            open = self
                .shared
                .done
                .wait_timeout(open, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(open);
        self.stop();
        Report {
            registered: self.shared.registered.load(Ordering::Acquire),
            completed: self.shared.completed.load(Ordering::Acquire),
            records: self.shared.records.load(Ordering::Acquire),
            errors: self
                .shared
                .errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = UnixStream::connect(&self.socket);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn accept_loop(listener: UnixListener, trace_dir: PathBuf, watcher: ExitWatcher, sh: Arc<Shared>) {
    for stream in listener.incoming() {
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(stream) = stream else {
            continue;
        };
        let (dir, w, s) = (trace_dir.clone(), watcher.clone(), sh.clone());
        *sh.open.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let spawned = std::thread::Builder::new()
            .name("trace-keeper-rank".into())
            .spawn(move || {
                keep(stream, &dir, &w, &s);
                let mut open = s.open.lock().unwrap_or_else(|p| p.into_inner());
                *open -= 1;
                s.done.notify_all();
            });
        if spawned.is_err() {
            *sh.open.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        }
    }
}

/// One rank: accept its registration, wait for its end, complete its file.
fn keep(stream: UnixStream, trace_dir: &Path, watcher: &ExitWatcher, sh: &Shared) {
    let reg = match crate::registration::handle(stream) {
        Ok(r) => r,
        Err(e) => {
            note(sh, format!("a rank's registration was refused: {e}"));
            return;
        }
    };
    sh.registered.fetch_add(1, Ordering::AcqRel);
    let pid = reg.request.pid;
    watcher.watch(pid);
    let fd = match crate::exits::pidfd(pid) {
        Ok(fd) => fd,
        Err(e) => {
            note(sh, format!("cannot watch pid {pid}: {e}"));
            return;
        }
    };
    // Wait for the exit; a stopping keeper gives up after the job (finish's bound).
    loop {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid descriptor.
        let n = unsafe { libc::poll(&mut p, 1, 200) };
        if n > 0 {
            break;
        }
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
    }
    let mut seen = Seen {
        ending: None,
        t_real: crate::daemon::now_real(),
        t_mono: crate::daemon::now_mono(),
    };
    if let Some((ending, at)) = watcher.ending_blocking(pid, Duration::from_millis(200)) {
        seen.ending = Some(ending);
        // The kernel's time of the exit, not when this thread ran.
        if at > 0 && at <= seen.t_mono {
            seen.t_real -= seen.t_mono - at;
            seen.t_mono = at;
        }
    }
    match complete(trace_dir, &reg, seen) {
        Ok(0) => {}
        Ok(n) => {
            sh.completed.fetch_add(1, Ordering::AcqRel);
            sh.records.fetch_add(n, Ordering::AcqRel);
        }
        Err(e) => note(sh, e.to_string()),
    }
}

fn note(sh: &Shared, line: String) {
    sh.errors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(line);
}

/// The trace file of a registered process.
pub fn trace_file(trace_dir: &Path, reg: &Registered) -> PathBuf {
    let r = &reg.request;
    let header = cst::Header {
        node: r.node.clone(),
        pid: r.pid,
        rank: r.rank,
        ..Default::default()
    };
    trace_dir.join(&r.job).join(header.file_name())
}

/// Appends what a process that ended did not write to its trace file, then the closing records;
/// returns how many of the ring's records the file lacked (0 also when it shut down cleanly,
/// or has no file).
pub fn complete(trace_dir: &Path, reg: &Registered, seen: Seen) -> Result<u64, Error> {
    let shm = reg.region.shm();
    if shm.state() == state::FINALIZED && shm.cursor(Consumer::Local) >= shm.head() {
        return Ok(0);
    }
    let path = trace_file(trace_dir, reg);
    if !path.exists() {
        return Ok(0);
    }
    let tail = cst::tail(&path)?;
    if tail.header.start_time != reg.request.start_time {
        return Err(Error::Foreign {
            path,
            found: tail.header.start_time,
            expected: reg.request.start_time,
        });
    }
    let mut raws: Vec<RawRecord> = Vec::new();
    let mut from = tail.last_rec_seq;
    let head = shm.head();
    while from < head {
        let next = shm.read_from(from, BLOCK_RECORDS, |r| raws.push(*r));
        if next == from {
            break;
        }
        from = next;
    }
    let recovered = raws.len() as u64;
    let r = &reg.request;
    let who = Who {
        pid: r.pid,
        start_time: r.start_time,
        rank: r.rank,
        world_size: r.world_size,
    };
    let now = (crate::daemon::now_real(), crate::daemon::now_mono());
    raws.extend(
        closing_records(shm, who, seen, now)
            .iter()
            .map(|c| c.encode()),
    );
    let write = |source| Error::Write {
        path: path.clone(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(write)?;
    f.set_len(tail.intact_len).map_err(write)?;
    f.seek(SeekFrom::Start(tail.intact_len)).map_err(write)?;
    for chunk in raws.chunks(BLOCK_RECORDS) {
        f.write_all(&cst::encode_block(chunk)).map_err(write)?;
    }
    f.flush().map_err(write)?;
    Ok(recovered)
}
