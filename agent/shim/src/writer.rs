//! The background thread: heartbeats, `enter` records for calls that stay in flight, the local
//! trace file, and the agent registration.
//!
//! It wakes every `COMMSCOPE_FLUSH_MS` (default 200 ms), so a trace file is never more than
//! that behind, and a process killed while stuck in a call leaves `enter` records naming it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use commscope_wire::cst;
use commscope_wire::record::Record;
use commscope_wire::shm::{Consumer, Counter};

use crate::state::Shim;
use crate::util::{self, now_mono};

/// Calls in flight longer than this get an `enter` record.
const ENTER_AFTER_NS: u64 = 100_000_000;
/// Heartbeat period.
const BEAT_NS: u64 = 1_000_000_000;
/// Records per trace-file block at most.
const BLOCK_RECORDS: usize = 512;

/// The local trace file.
#[derive(Debug)]
pub struct LocalTrace {
    writer: cst::Writer<File>,
    path: PathBuf,
    block: cst::Block,
}

impl LocalTrace {
    fn open(shim: &Shim, dir: &std::path::Path) -> std::io::Result<LocalTrace> {
        let header = cst::Header {
            version: cst::FORMAT_VERSION,
            job: shim.job.clone(),
            node: shim.node.clone(),
            pid: shim.pid,
            rank: shim.rank,
            world_size: shim.world_size,
            start_time: shim.start_time,
            mono_anchor: shim.mono_anchor,
            real_anchor: shim.real_anchor,
            library: shim.library.clone(),
            flavour: shim.abi.flavour.name().to_owned(),
            writer_version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let job_dir = dir.join(&shim.job);
        std::fs::create_dir_all(&job_dir)?;
        let path = job_dir.join(header.file_name());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(LocalTrace {
            writer: cst::Writer::new(file, &header)?,
            path,
            block: cst::Block::with_capacity(BLOCK_RECORDS),
        })
    }
}

/// The background thread's kernel thread id (0 until it runs).
static BACKGROUND_TID: AtomicU32 = AtomicU32::new(0);

/// Opens the trace file (if asked for) and starts the background thread.
pub fn start(shim: &'static Shim) {
    if let Some(dir) = &shim.config.trace_dir {
        match LocalTrace::open(shim, dir) {
            Ok(t) => {
                shim.shm.attach_consumer(Consumer::Local);
                *shim.local.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
            }
            Err(e) => util::warn(format_args!(
                "cannot write trace files under {}: {e}; continuing without them",
                dir.display()
            )),
        }
    }
    let spawned = std::thread::Builder::new()
        .name("commscope".into())
        .stack_size(256 << 10)
        .spawn(move || run(shim));
    match spawned {
        Ok(h) => {
            let _ = shim.background_thread.set(h.thread().clone());
            *shim.background.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
        }
        Err(e) => util::warn(format_args!(
            "cannot start the background thread: {e}; trace files are written at exit only"
        )),
    }
}

/// Stops the background thread and writes out whatever is left.
pub fn stop(shim: &Shim) {
    shim.stop.store(true, Ordering::Release);
    let handle = shim
        .background
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(h) = handle {
        h.thread().unpark();
        let _ = h.join();
    }
    drain_local(shim);
}

struct Loop {
    clock: crate::clock::Calibrator,
    last_beat: u64,
    /// Per in-flight slot, the (comm, seq, t_enter) already reported with an `enter` record.
    reported: Vec<(u64, u64, u64)>,
    agent: crate::agent::Link,
    keeper: crate::agent::KeeperLink,
}

fn run(shim: &'static Shim) {
    // SAFETY: gettid has no preconditions.
    BACKGROUND_TID.store(unsafe { libc::gettid() } as u32, Ordering::Release);
    // Stay out of the application's way without starving: nice 19 (a weight of 15 against a
    // normal thread's 1024) rarely preempts a rank on wake-up and takes about 1.5 % of a core
    // from a thread it shares one with, far more than the few microseconds a tick needs. The
    // idle class (weight 3) was starved for up to 3.2 s by ranks spinning in MPI (MPICH, 8 on
    // 2 cores), so heartbeats, `enter` records and the trace file fell seconds behind: a
    // trace then showed live ranks as silent. Linux keeps nice values per thread.
    // SAFETY: lowering this thread's own priority; gettid cannot fail.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    let mut l = Loop {
        clock: crate::clock::Calibrator::new(),
        last_beat: 0,
        reported: vec![(0, 0, 0); shim.shm.geometry().in_flight_slots as usize],
        agent: crate::agent::Link::new(),
        keeper: Default::default(),
    };
    let period = Duration::from_millis(shim.config.flush_ms);
    // A tick that found the ring filling up comes back sooner: at the full period a ring of
    // 64 Ki records holds only ~320 k calls a second.
    let busy = shim.shm.geometry().ring_capacity / 8;
    while !shim.stop.load(Ordering::Acquire) {
        let drained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tick(shim, &mut l)))
            .unwrap_or(0);
        let wait = if drained >= busy {
            period.min(Duration::from_millis(2))
        } else {
            period
        };
        std::thread::park_timeout(wait);
    }
    // Shutting down without ever having reached the agent (it was slow, or the job short): one
    // last attempt, so the agent still gets the ring and drains what is left in it.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.agent.last_chance(shim)));
    // The exit path hands the ring over through it ([`crate::agent::hand_over`]).
    *shim.exit_link.lock().unwrap_or_else(|p| p.into_inner()) = Some(l.agent);
}

/// One round of the background work; returns how many records it moved to the trace file.
fn tick(shim: &Shim, l: &mut Loop) -> u64 {
    l.clock.tick();
    let now = now_mono();
    if now.saturating_sub(l.last_beat) >= BEAT_NS {
        shim.push_heartbeat(now, false);
        l.last_beat = now;
    }
    report_stuck_calls(shim, l, now);
    let drained = drain_local(shim);
    l.agent.poll(shim);
    if shim.local.lock().is_ok_and(|t| t.is_some()) {
        l.keeper.poll(shim);
    }
    drained
}

/// Writes an `enter` record for every call in flight longer than [`ENTER_AFTER_NS`] that has
/// not been reported yet.
fn report_stuck_calls(shim: &Shim, l: &mut Loop, now: u64) {
    for (idx, e) in shim.shm.in_flight() {
        if now.saturating_sub(e.t_enter) < ENTER_AFTER_NS {
            continue;
        }
        let key = (e.comm_id, e.seq, e.t_enter);
        let Some(seen) = l.reported.get_mut(idx) else {
            continue;
        };
        if *seen == key {
            continue;
        }
        *seen = key;
        // The slot has no room for the library: work waiting for its GPU, or any call of a
        // process without MPI, is NCCL's (or RCCL's).
        let lib = if e.status == commscope_wire::shm::in_flight_status::ON_GPU || !shim.mpi {
            crate::nccl::library_code()
        } else {
            commscope_wire::op::lib::MPI
        };
        shim.push(&Record::Enter(e.enter_record(shim.rank, lib)));
    }
}

/// Records per block written from a signal handler (a stack buffer of about 2 KiB).
const SIGNAL_BLOCK_RECORDS: usize = 16;
/// How long a signal handler waits for the background thread to write the last records.
const SIGNAL_WAIT_NS: u64 = 300_000_000;

/// From a signal handler, before the process ends: moves what the ring holds into the trace
/// file. Async-signal-safe: when the trace file is free (the lock taken without waiting), the
/// records are written here as raw blocks from a stack buffer with `write(2)`; when the
/// background thread is writing it, it is woken and given up to 300 ms to write them. Never
/// allocates, never blocks on a lock.
pub fn flush_from_signal(shim: &Shim) {
    let target = shim.shm.head();
    match shim.local.try_lock() {
        Ok(mut guard) => {
            if let Some(t) = guard.as_mut() {
                write_raw(shim, t.writer.get_mut().as_raw_fd(), target);
            }
            return;
        }
        Err(std::sync::TryLockError::Poisoned(p)) => {
            if let Some(t) = p.into_inner().as_mut() {
                write_raw(shim, t.writer.get_mut().as_raw_fd(), target);
            }
            return;
        }
        Err(std::sync::TryLockError::WouldBlock) => {}
    }
    // The background thread holds the file. Wake it (it parks between rounds) unless it is
    // this very thread, and wait until its cursor passes the last record.
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    if BACKGROUND_TID.load(Ordering::Acquire) == me {
        return;
    }
    if let Some(h) = shim.background_thread.get() {
        h.unpark();
    }
    let deadline = now_mono() + SIGNAL_WAIT_NS;
    while shim.shm.is_attached(Consumer::Local)
        && shim.shm.cursor(Consumer::Local) < target
        && now_mono() < deadline
    {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        // SAFETY: sleeping 1 ms; nanosleep is async-signal-safe.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

/// Writes the ring from the local cursor to `target` into `fd` as raw blocks and moves the
/// cursor (the caller holds the trace file's lock).
fn write_raw(shim: &Shim, fd: i32, target: u64) {
    let mut buf =
        [0u8; cst::BLOCK_HEADER + SIGNAL_BLOCK_RECORDS * commscope_wire::record::RECORD_SIZE];
    let mut from = shim.shm.cursor(Consumer::Local);
    while from < target {
        let mut n = 0usize;
        let body = &mut buf[cst::BLOCK_HEADER..];
        let end = shim.shm.read_from(from, SIGNAL_BLOCK_RECORDS, |r| {
            let at = n * r.len();
            body[at..at + r.len()].copy_from_slice(r);
            n += 1;
        });
        if n == 0 {
            break;
        }
        let len = n * commscope_wire::record::RECORD_SIZE;
        let header =
            cst::raw_block_header(&buf[cst::BLOCK_HEADER..cst::BLOCK_HEADER + len], n as u32);
        buf[..cst::BLOCK_HEADER].copy_from_slice(&header);
        let total = cst::BLOCK_HEADER + len;
        let mut done = 0usize;
        while done < total {
            // SAFETY: writing initialized bytes of our buffer to the trace file's descriptor.
            let w = unsafe { libc::write(fd, buf[done..total].as_ptr().cast(), total - done) };
            if w <= 0 {
                // SAFETY: reading this thread's errno.
                if w < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
                    continue;
                }
                shim.shm.count(Counter::TraceWriteErrors, 1);
                return;
            }
            done += w as usize;
        }
        shim.shm.advance(Consumer::Local, end);
        from = end;
    }
}

/// Moves published records from the ring into the trace file; returns how many.
pub fn drain_local(shim: &Shim) -> u64 {
    let mut moved = 0u64;
    while let Some(records) = drain_block(shim) {
        moved += records as u64;
        if records < BLOCK_RECORDS {
            break;
        }
    }
    moved
}

/// Moves one block of records (at most [`BLOCK_RECORDS`]) into the trace file; `None` when
/// there is no trace file or nothing to move.
fn drain_block(shim: &Shim) -> Option<usize> {
    let mut guard = shim.local.lock().unwrap_or_else(|p| p.into_inner());
    let t = guard.as_mut()?;
    let from = shim.shm.cursor(Consumer::Local);
    let end = shim.shm.read_from(from, BLOCK_RECORDS, |r| t.block.push(r));
    let records = t.block.len();
    if records == 0 {
        if end != from {
            shim.shm.advance(Consumer::Local, end);
        }
        return None;
    }
    if let Err(e) = t.writer.write_block(&mut t.block) {
        shim.shm.count(Counter::TraceWriteErrors, 1);
        util::warn(format_args!(
            "failed to write {}: {e}; local tracing stopped ({records} records not written)",
            t.path.display(),
        ));
        shim.shm.advance(Consumer::Local, end);
        shim.shm.detach_consumer(Consumer::Local);
        *guard = None;
        return None;
    }
    shim.shm.advance(Consumer::Local, end);
    Some(records)
}
