//! How the process ends, recorded before it is gone.
//!
//! - `MPI_Finalize` (and, for a process without MPI, `exit(0)`): a clean end.
//! - `exit(n)` or a return from `main` without `MPI_Finalize`: an `on_exit` handler (it gets the
//!   status, where `atexit` would not) records "exited with status n without finalizing".
//! - `MPI_Abort(comm, code)`: recorded with its code by the wrapper before the library aborts.
//! - A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT), and SIGTERM where nothing else
//!   handles it (a launcher taking the job down): a handler chained in front of whatever was
//!   installed before it records the signal, then puts the previous disposition back and lets the
//!   signal take its course — a fault re-executes and faults again, a signal sent to the process
//!   is raised again — so core dumps, the application's or the MPI library's own handlers and the
//!   exit status stay what they were without commscope. The handler only reads the shared
//!   memory, pushes fixed-size records and makes async-signal-safe system calls: it never
//!   allocates and never waits on a lock, so a crash inside `malloc` cannot hang it.
//!
//! Each unclean end also writes an `enter` record for every call then in flight (what the
//! process was inside), and the records reach the trace file before the process is gone. The
//! node agent needs nothing more: it holds the ring's memory and reads the rest after the exit.
//! SIGKILL cannot be caught: the agent's exit watch sees it (ARCHITECTURE.md).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use commscope_wire::op::{flags, lib};
use commscope_wire::record::{EXIT_STATUS_UNKNOWN, Record};
use commscope_wire::shm::in_flight_status;

use crate::state::{Shim, life};
use crate::util::{now_mono, now_real};

/// How the process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// `MPI_Finalize`, or a process without MPI reaching `exit(0)`.
    Clean,
    /// `exit(status)` (or a return from `main`) without finalizing.
    Exited(i32),
    /// `MPI_Abort` with this error code.
    Aborted(i32),
    /// A fatal signal.
    Signaled(i32),
}

impl End {
    /// The exit record's (flags, exit status, signal).
    pub fn fields(self) -> (u16, i32, i32) {
        match self {
            End::Clean => (0, EXIT_STATUS_UNKNOWN, 0),
            End::Exited(st) => (flags::UNFINALIZED, st, 0),
            End::Aborted(code) => (flags::UNFINALIZED | flags::ABORTED, code, 0),
            End::Signaled(sig) => (flags::UNFINALIZED, EXIT_STATUS_UNKNOWN, sig),
        }
    }
}

/// Writes an `enter` record for every call in flight now (allocation-free).
pub fn record_in_flight(shim: &Shim) {
    let slots = shim.shm.geometry().in_flight_slots as usize;
    for idx in 0..slots {
        let Some(e) = shim.shm.in_flight_read(idx) else {
            continue;
        };
        let library = if e.status == in_flight_status::ON_GPU || !shim.mpi {
            crate::nccl::library_code()
        } else {
            lib::MPI
        };
        shim.push(&Record::Enter(e.enter_record(shim.rank, library)));
    }
}

/// The signals whose end is recorded. SIGTERM only where its disposition is the default
/// (termination): a process that handles it itself may well go on.
const FATAL: [c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
];
const SIGNALS: usize = FATAL.len() + 1;

/// The dispositions in place before ours, by index into [`FATAL`] then SIGTERM.
struct Previous([UnsafeCell<libc::sigaction>; SIGNALS]);

// SAFETY: each entry is written once, by `install`, before the handler that reads it is
// installed; only read afterwards.
unsafe impl Sync for Previous {}

static PREVIOUS: Previous = Previous(
    // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
    unsafe { std::mem::zeroed() },
);
/// Which entries of [`PREVIOUS`] hold a disposition we replaced (bit per index).
static INSTALLED: AtomicU32 = AtomicU32::new(0);
/// Set by the first fatal signal: only the first one is recorded.
static FIRED: AtomicBool = AtomicBool::new(false);

fn index_of(sig: c_int) -> Option<usize> {
    if sig == libc::SIGTERM {
        return Some(FATAL.len());
    }
    FATAL.iter().position(|&s| s == sig)
}

/// Installs the exit and signal handlers (once, at activation).
pub fn install() {
    install_on_exit();
    let mut mask = 0u32;
    for (i, &sig) in FATAL.iter().chain([libc::SIGTERM].iter()).enumerate() {
        // SAFETY: an all-zero sigaction is a valid out-value.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying the current disposition into a valid out-pointer.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        // Leave SIGTERM alone unless it would simply terminate the process.
        if sig == libc::SIGTERM && old.sa_sigaction != libc::SIG_DFL {
            continue;
        }
        // An ignored fault signal stays ignored (the kernel forces the default anyway).
        if old.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: activation runs once; entry `i` is read only by handler `i`, installed below.
        unsafe { *PREVIOUS.0[i].get() = old };
        // SAFETY: a zeroed sigaction with our handler, SA_SIGINFO and SA_ONSTACK (use the
        // thread's alternate stack where the application set one up: a stack overflow).
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: initializing the mask of our own sigaction.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: a valid sigaction; our handler is async-signal-safe.
        if unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) } == 0 {
            mask |= 1 << i;
        }
    }
    INSTALLED.store(mask, Ordering::Release);
}

/// Registers [`at_exit`] with glibc's `on_exit`, which passes the exit status; `atexit` (no
/// status) where the C library has no `on_exit`.
fn install_on_exit() {
    type OnExit = unsafe extern "C" fn(extern "C" fn(c_int, *mut c_void), *mut c_void) -> c_int;
    // SAFETY: looking up a symbol by its NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"on_exit".as_ptr()) };
    if p.is_null() {
        // SAFETY: registering a plain extern "C" function without arguments.
        unsafe { libc::atexit(at_exit_unknown) };
        return;
    }
    // SAFETY: glibc's `int on_exit(void (*)(int, void *), void *)`.
    let on_exit: OnExit = unsafe { std::mem::transmute(p) };
    // SAFETY: registering our handler with a null argument it never reads.
    unsafe { on_exit(at_exit, std::ptr::null_mut()) };
}

extern "C" fn at_exit(status: c_int, _arg: *mut c_void) {
    exiting(Some(status));
}

extern "C" fn at_exit_unknown() {
    exiting(None);
}

/// The process is exiting (`exit`, or a return from `main`) with `status` if known.
fn exiting(status: Option<c_int>) {
    if crate::state::life() != life::ACTIVE {
        return;
    }
    // A process without MPI has nothing to finalize: exiting with 0 is its clean end. An MPI
    // process that reaches exit without MPI_Finalize did not shut down.
    let mpi = crate::state::shim().is_none_or(|s| s.mpi);
    let end = match status {
        Some(0) if !mpi => End::Clean,
        Some(st) => End::Exited(st),
        None if !mpi => End::Clean,
        None => End::Exited(EXIT_STATUS_UNKNOWN),
    };
    let _ = std::panic::catch_unwind(|| crate::state::shutdown(end));
}

/// The chained handler. Records the first fatal signal, then hands the signal on.
extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: errno is thread-local; saved and restored around our system calls.
    let errno = unsafe { *libc::__errno_location() };
    let Some(i) = index_of(sig) else {
        return;
    };
    if INSTALLED.load(Ordering::Acquire) & (1 << i) == 0 {
        return;
    }
    // SAFETY: `PREVIOUS[i]` was filled before this handler was installed.
    let prev = unsafe { &*PREVIOUS.0[i].get() };
    // Still the installed handler, or called by one installed after it that chains on?
    // SAFETY: an all-zero sigaction is a valid out-value.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: querying the current disposition into a valid out-pointer.
    let installed = unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) } == 0
        && now.sa_sigaction == on_signal as *const () as usize;
    if installed {
        // Put the previous disposition back first: a fault while recording then ends the
        // process the way it would have ended anyway.
        // SAFETY: reinstalling a disposition the process had.
        unsafe { libc::sigaction(sig, prev, std::ptr::null_mut()) };
    }
    if !FIRED.swap(true, Ordering::AcqRel)
        && crate::state::life() == life::ACTIVE
        && let Some(shim) = crate::state::shim()
    {
        record_signal(shim, sig);
    }
    if installed {
        // A fault (the kernel's, si_code > 0) happens again when the instruction re-executes,
        // now under the previous disposition; a signal sent to the process (kill, raise,
        // abort) must be raised again: it stays pending while this handler runs and arrives as
        // it returns.
        // SAFETY: `info` is the kernel's siginfo for this delivery.
        let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
        if sent || sig == libc::SIGABRT || sig == libc::SIGTERM {
            // SAFETY: raising a signal at the calling thread.
            unsafe { libc::raise(sig) };
        }
    } else {
        // A handler installed after this one called it as "the previous one": do what the
        // disposition this one replaced would have done.
        chain_to(sig, prev, info, ctx);
    }
    // SAFETY: restoring the interrupted code's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// Acts as `prev` would have for a signal delivered to it: calls its handler, or, for the
/// default action, reinstates it and lets the signal take effect.
fn chain_to(sig: c_int, prev: &libc::sigaction, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    match prev.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // SAFETY: an all-zero sigaction is SIG_DFL.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: installing the default disposition, then raising the signal at this
            // thread (it arrives once the handlers return).
            unsafe {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
                libc::raise(sig);
            }
        }
        f if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the application's three-argument handler, as it was installed.
            let h: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(f) };
            h(sig, info, ctx);
        }
        f => {
            // SAFETY: the application's one-argument handler, as it was installed.
            let h: extern "C" fn(c_int) = unsafe { std::mem::transmute(f) };
            h(sig);
        }
    }
}

/// Records a fatal signal: the calls in flight, a heartbeat, the exit record; then writes them
/// to the trace file (see [`crate::writer::flush_from_signal`]).
fn record_signal(shim: &Shim, sig: c_int) {
    record_in_flight(shim);
    let now = now_mono();
    shim.push_heartbeat(now, false);
    let (fl, status, signal) = End::Signaled(sig).fields();
    shim.push(&shim.exit_record(now, now_real(), fl, status, signal));
    crate::writer::flush_from_signal(shim);
}
