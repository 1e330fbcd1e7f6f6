//! NCCL's profiler plugin interface, versions 4 to 7, exported by `libcommscope.so` itself:
//! `NCCL_PROFILER_PLUGIN=/path/to/libcommscope.so` makes NCCL load it (with or without
//! `LD_PRELOAD`). NCCL picks the newest `ncclProfiler_vN` the library exports.
//!
//! The plugin asks for `Coll`, `P2p` and `KernelCh` events. A `Coll`/`P2p` event starts when NCCL
//! enqueues the operation and stops once it is enqueued; its `KernelCh` children carry the GPU's
//! `globaltimer` at each channel's start and stop. An operation is complete when it stopped and
//! every channel it announced (`nChannels`) reported its stop; the kernel interval is the earliest
//! channel start to the latest channel stop, mapped onto host `CLOCK_MONOTONIC` with the tightest
//! offset seen (`now − globaltimer` at the moment NCCL tells us, which can only overestimate it).
//!
//! - **Plugin only** (NCCL linked statically, or no preload): every completed operation becomes a
//!   `call` record on the communicator's `commHash` (NCCL passes it to `init`), `op_seq` =
//!   NCCL's per-function `seqNumber`, `seq` counted here per communicator; while the kernel runs
//!   the operation is in the in-flight table, so a hang is as visible as with the wrappers.
//! - **With the preload too** the wrappers already record every call, with CUDA-event timing: the
//!   plugin then writes nothing for that communicator (no double counting).
//!
//! The link view: each `ProxyOp` (one channel's sends to, or receives from, one peer) is folded
//! per (peer, direction) into a `link` record joined to its operation by `op_seq`. Its
//! `ProxyStep` children — one network transfer each — say where the time went: a send step
//! waits for the kernel to fill its buffer (`SendGPUWait`), may wait for the receiver's buffer
//! (`SendPeerWait`), then is on the network (`SendWait`) until the network completes it; a
//! receive step is posted (`RecvWait`), its data arrives (`RecvFlushWait`/`RecvGPUWait`), then it
//! waits for the kernel to drain it. Per channel the network intervals are united (steps
//! overlap: up to eight are in flight), so `xfer_bytes / net_ns` is the rate a channel moved
//! data while it had data on the network — the measure a slow link shows up in, while the
//! ranks around it only wait longer for their GPUs.
//!
//! Events come from a fixed pool (a full pool hands NCCL a null handle, which it then passes back
//! and which is ignored); a generation number guards against a late child of a finished operation.

#![allow(non_upper_case_globals)]

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering};

use commscope_wire::op::{Clock, Op, dtype};
use commscope_wire::record::Call;
use commscope_wire::shm::in_flight_status;

use crate::state::{self, Shim, Slot};
use crate::tables::Dir;
use crate::util::now_mono;

/// Event type bits (`nccl_profiler.h`).
mod ev {
    pub const COLL: u64 = 1 << 1;
    pub const P2P: u64 = 1 << 2;
    pub const PROXY_OP: u64 = 1 << 3;
    pub const PROXY_STEP: u64 = 1 << 4;
    pub const KERNEL_CH: u64 = 1 << 6;
}

/// Event states (`ncclProfilerEventState_t`).
mod st {
    use std::ffi::c_int;
    pub const SEND_GPU_WAIT: c_int = 8;
    pub const SEND_WAIT: c_int = 9;
    pub const RECV_WAIT: c_int = 10;
    pub const RECV_FLUSH_WAIT: c_int = 11;
    pub const RECV_GPU_WAIT: c_int = 12;
    pub const SEND_PEER_WAIT: c_int = 20;
    pub const KERNEL_CH_STOP: c_int = 22;
}
/// What the plugin asks NCCL for (`ProxyStep` unless `COMMSCOPE_PROFILER_STEPS=0`).
const MASK: c_int = (ev::COLL | ev::P2P | ev::PROXY_OP | ev::KERNEL_CH) as c_int;

fn event_mask() -> c_int {
    static STEPS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *STEPS.get_or_init(|| crate::util::env_flag("COMMSCOPE_PROFILER_STEPS", true)) {
        MASK | ev::PROXY_STEP as c_int
    } else {
        MASK
    }
}
/// Links (peer, direction) one operation keeps apart; more are left out (counted nowhere: an
/// all-to-all over hundreds of peers is summarized by its call record).
const LINKS_MAX: usize = 8;

const SUCCESS: c_int = 0;

// ----- the exported tables -----------------------------------------------------------------------

type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    *const c_void,
) -> c_int;
type InitV4 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    *const c_void,
) -> c_int;
type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *const u8) -> c_int;
type StopFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type StateFn = unsafe extern "C" fn(*mut c_void, c_int, *const u8) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `ncclProfiler_v5_t` (the same table for v6 and v7).
#[repr(C)]
#[derive(Debug)]
pub struct TableV5 {
    name: *const c_char,
    init: InitV5,
    start_event: StartFn,
    stop_event: StopFn,
    record_event_state: StateFn,
    finalize: FinalizeFn,
}

/// `ncclProfiler_v4_t`: `init` takes its arguments in another order.
#[repr(C)]
#[derive(Debug)]
pub struct TableV4 {
    name: *const c_char,
    init: InitV4,
    start_event: StartFn,
    stop_event: StopFn,
    record_event_state: StateFn,
    finalize: FinalizeFn,
}

// SAFETY: immutable tables of a string constant and function pointers.
unsafe impl Sync for TableV5 {}
// SAFETY: as above.
unsafe impl Sync for TableV4 {}

const NAME: *const c_char = c"commscope".as_ptr();

/// The v5 table; v6 and v7 are the same table (their descriptors only append fields).
const TABLE_V5: TableV5 = TableV5 {
    name: NAME,
    init: init_v5,
    start_event: start_v5,
    stop_event,
    record_event_state: record_state,
    finalize,
};

#[unsafe(no_mangle)]
pub static ncclProfiler_v7: TableV5 = TABLE_V5;
#[unsafe(no_mangle)]
pub static ncclProfiler_v6: TableV5 = TABLE_V5;
#[unsafe(no_mangle)]
pub static ncclProfiler_v5: TableV5 = TABLE_V5;
#[unsafe(no_mangle)]
pub static ncclProfiler_v4: TableV4 = TableV4 {
    name: NAME,
    init: init_v4,
    start_event: start_v4,
    stop_event,
    record_event_state: record_state,
    finalize,
};

// ----- per-communicator context ------------------------------------------------------------------

/// One communicator as the plugin sees it.
#[derive(Debug)]
struct Ctx {
    comm_id: u64,
    rank: i32,
    nranks: i32,
    /// Collectives seen (the next one's `seq`).
    seq: AtomicU64,
    /// Whether the preload's wrappers record this communicator: 0 not yet known, 1 yes, 2 no.
    wrapped: AtomicU8,
}

impl Ctx {
    /// True when the wrappers record this communicator's calls already.
    fn wrapped(&self, shim: &Shim) -> bool {
        match self.wrapped.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                // Asked at the first operation: by then a wrapper has recorded the communicator
                // (it does so when NCCL's init, and with it this plugin's, returned).
                let w = shim.nccl.is_wrapped(self.comm_id);
                if self
                    .wrapped
                    .compare_exchange(
                        0,
                        if w { 1 } else { 2 },
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
                    && !w
                {
                    // Recorded by this plugin alone: its `comm` record too.
                    let mut c = commscope_wire::record::Comm::new(
                        commscope_wire::record::CommEvent::Created,
                        self.comm_id,
                        0,
                        now_mono(),
                        shim.rank,
                        self.rank,
                        self.nranks,
                        0,
                    );
                    c.flags = commscope_wire::op::flags::NCCL_COMM;
                    shim.push(&commscope_wire::record::Record::Comm(c));
                }
                w
            }
        }
    }
}

/// Host-mono minus GPU globaltimer, the smallest seen (`i64::MAX`: none yet).
static GPU_OFFSET: AtomicI64 = AtomicI64::new(i64::MAX);

fn observe_gpu_time(ptimer: u64) {
    if ptimer == 0 {
        return;
    }
    let off = now_mono() as i64 - ptimer as i64;
    GPU_OFFSET.fetch_min(off, Ordering::Relaxed);
}

fn gpu_to_host(ptimer: u64) -> u64 {
    let off = GPU_OFFSET.load(Ordering::Relaxed);
    if ptimer == 0 || off == i64::MAX {
        return 0;
    }
    (i128::from(ptimer) + i128::from(off)).max(1) as u64
}

unsafe extern "C" fn init_v5(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    _name: *const c_char,
    _nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    _log: *const c_void,
) -> c_int {
    // SAFETY: NCCL's out-pointers.
    unsafe { init(ctx, mask, comm_id, nranks, rank) }
}

unsafe extern "C" fn init_v4(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    _name: *const c_char,
    comm_id: u64,
    _nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    _log: *const c_void,
) -> c_int {
    // SAFETY: NCCL's out-pointers.
    unsafe { init(ctx, mask, comm_id, nranks, rank) }
}

/// # Safety
/// `ctx` and `mask` are NCCL's valid out-pointers (or null).
unsafe fn init(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    comm_id: u64,
    nranks: c_int,
    rank: c_int,
) -> c_int {
    let r = std::panic::catch_unwind(|| {
        if state::life() == state::life::DORMANT {
            state::activate_nccl(rank, nranks, comm_id);
        }
        let on = state::life() == state::life::ACTIVE;
        let c = Box::new(Ctx {
            comm_id,
            rank,
            nranks,
            seq: AtomicU64::new(0),
            wrapped: AtomicU8::new(0),
        });
        if let Some(s) = state::shim() {
            crate::nccl::start_poller(s);
        }
        (Box::into_raw(c), on)
    });
    let (c, on) = match r {
        Ok(x) => x,
        Err(_) => (std::ptr::null_mut(), false),
    };
    if !ctx.is_null() {
        // SAFETY: NCCL's out-pointer.
        unsafe { *ctx = c.cast() };
    }
    if !mask.is_null() {
        // SAFETY: NCCL's event mask; a disabled recorder asks for nothing.
        unsafe { *mask = if on && !c.is_null() { event_mask() } else { 0 } };
    }
    SUCCESS
}

/// The context is left allocated: events still outstanding point to it, and a context is a
/// few words per communicator.
unsafe extern "C" fn finalize(_ctx: *mut c_void) -> c_int {
    SUCCESS
}

// ----- the event pool ----------------------------------------------------------------------------

const POOL: usize = 16384;

mod kind {
    pub const FREE: u8 = 0;
    pub const OP: u8 = 1;
    pub const CHANNEL: u8 = 2;
    pub const PROXY: u8 = 3;
    pub const STEP: u8 = 4;
}

/// What an operation's proxy moved over one link: (peer, send?) → interval, bytes, steps,
/// channels, and from the steps where the time went.
#[derive(Clone, Copy, Debug, Default)]
struct LinkAgg {
    peer: i32,
    send: bool,
    t_start: u64,
    t_end: u64,
    bytes: u64,
    steps: u32,
    channels: u8,
    net_ns: u64,
    gpu_wait_ns: u64,
    peer_wait_ns: u64,
    xfer_bytes: u64,
    steps_done: u32,
    /// Ends of the united network and GPU-wait intervals so far (one proxy operation's steps
    /// complete in order).
    net_until: u64,
    gpu_until: u64,
}

impl LinkAgg {
    /// Adds `[a, b]` to a union whose intervals so far end at `until`.
    fn unite(total: &mut u64, until: &mut u64, a: u64, b: u64) {
        if a == 0 || b <= a || b <= *until {
            return;
        }
        *total += b - a.max(*until);
        *until = b;
    }

    /// Folds one completed step.
    fn step(&mut self, s: &StepT, stop: u64) {
        self.steps_done += 1;
        self.xfer_bytes += s.bytes;
        if self.send {
            let ready = if s.peer_wait != 0 { s.peer_wait } else { s.net };
            if ready != 0 {
                Self::unite(
                    &mut self.gpu_wait_ns,
                    &mut self.gpu_until,
                    s.gpu_wait,
                    ready,
                );
            }
            if s.peer_wait != 0 && s.net > s.peer_wait {
                self.peer_wait_ns += s.net - s.peer_wait;
            }
            Self::unite(&mut self.net_ns, &mut self.net_until, s.net, stop);
        } else {
            let arrived = if s.flush != 0 { s.flush } else { s.gpu_wait };
            if arrived != 0 {
                Self::unite(&mut self.net_ns, &mut self.net_until, s.net, arrived);
            }
            Self::unite(&mut self.gpu_wait_ns, &mut self.gpu_until, s.gpu_wait, stop);
        }
    }

    /// Folds another channel's proxy operation on the same link.
    fn fold(&mut self, l: &LinkAgg) {
        self.t_start = self.t_start.min(l.t_start);
        self.t_end = self.t_end.max(l.t_end);
        self.bytes += l.bytes;
        self.steps += l.steps;
        self.channels = self.channels.saturating_add(1);
        self.net_ns += l.net_ns;
        self.gpu_wait_ns += l.gpu_wait_ns;
        self.peer_wait_ns += l.peer_wait_ns;
        self.xfer_bytes += l.xfer_bytes;
        self.steps_done += l.steps_done;
    }
}

/// One proxy step's timeline (host-mono; 0 = not reached). `gpu_wait`: a send began waiting
/// for the kernel's data, or a receive's data is waiting for the kernel; `peer_wait`: a send's
/// data was ready; `net`: on the network (a send posted, a receive posted); `flush`: a receive's
/// data arrived and is being flushed.
#[derive(Clone, Copy, Debug, Default)]
struct StepT {
    gpu_wait: u64,
    peer_wait: u64,
    net: u64,
    flush: u64,
    bytes: u64,
}

/// One event: an operation (`Coll`/`P2p`) or one of its kernel channels.
#[derive(Debug)]
struct Ev {
    kind: AtomicU8,
    generation: AtomicU32,
    // operation
    ctx: AtomicU64,
    call: std::sync::Mutex<Call>,
    slot: AtomicU64,
    channels: AtomicU32,
    channels_stopped: AtomicU32,
    stopped: AtomicBool,
    finished: AtomicBool,
    k_start: AtomicU64,
    k_end: AtomicU64,
    stopped_at: AtomicU64,
    /// Whether the operation becomes a call record (not when the wrappers record its
    /// communicator: then only its links are written).
    emit_call: AtomicBool,
    proxies_open: AtomicU32,
    links: std::sync::Mutex<Vec<LinkAgg>>,
    // channel and proxy operation
    parent: AtomicU64,
    parent_gen: AtomicU32,
    // proxy operation
    proxy: std::sync::Mutex<LinkAgg>,
    // proxy step
    step: std::sync::Mutex<StepT>,
}

impl Ev {
    fn new() -> Ev {
        Ev {
            kind: AtomicU8::new(kind::FREE),
            generation: AtomicU32::new(0),
            ctx: AtomicU64::new(0),
            call: std::sync::Mutex::new(Call::default()),
            slot: AtomicU64::new(u64::MAX),
            channels: AtomicU32::new(0),
            channels_stopped: AtomicU32::new(0),
            stopped: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            k_start: AtomicU64::new(u64::MAX),
            k_end: AtomicU64::new(0),
            stopped_at: AtomicU64::new(0),
            emit_call: AtomicBool::new(false),
            proxies_open: AtomicU32::new(0),
            links: std::sync::Mutex::new(Vec::new()),
            parent: AtomicU64::new(0),
            parent_gen: AtomicU32::new(0),
            proxy: std::sync::Mutex::new(LinkAgg::default()),
            step: std::sync::Mutex::new(StepT::default()),
        }
    }
}

static EVENTS: std::sync::OnceLock<Box<[Ev]>> = std::sync::OnceLock::new();

thread_local! {
    static HINT: Cell<usize> = const { Cell::new(0) };
}

fn pool() -> &'static [Ev] {
    EVENTS.get_or_init(|| (0..POOL).map(|_| Ev::new()).collect())
}

/// Claims a free event for `k`.
fn claim(k: u8) -> Option<&'static Ev> {
    let p = pool();
    let start = HINT.with(Cell::get);
    for i in 0..p.len() {
        let idx = (start + i) % p.len();
        let e = &p[idx];
        if e.kind.load(Ordering::Relaxed) == kind::FREE
            && e.kind
                .compare_exchange(kind::FREE, k, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            HINT.with(|h| h.set(idx + 1));
            e.generation.fetch_add(1, Ordering::AcqRel);
            return Some(e);
        }
    }
    None
}

fn release(e: &Ev) {
    e.kind.store(kind::FREE, Ordering::Release);
}

/// The event behind a handle NCCL passes back (null when it got none).
fn event(h: *mut c_void) -> Option<&'static Ev> {
    let p = pool();
    let base = p.as_ptr() as usize;
    let a = h as usize;
    let size = std::mem::size_of::<Ev>();
    if a < base || a >= base + std::mem::size_of_val(p) || !(a - base).is_multiple_of(size) {
        return None;
    }
    p.get((a - base) / size)
}

// ----- descriptors -------------------------------------------------------------------------------

/// Reads a field of a descriptor at a fixed offset.
///
/// # Safety
/// `d` points to a descriptor at least `at + size_of::<T>()` bytes long.
unsafe fn rd<T: Copy>(d: *const u8, at: usize) -> T {
    // SAFETY: per the contract; descriptors are NCCL's own structs, read unaligned-safe.
    unsafe { std::ptr::read_unaligned(d.add(at) as *const T) }
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        return b"";
    }
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(p) }.to_bytes()
}

fn op_of(func: &[u8]) -> Op {
    match func {
        b"AllReduce" => Op::Allreduce,
        b"Broadcast" => Op::Broadcast,
        b"Reduce" => Op::Reduce,
        b"AllGather" => Op::Allgather,
        b"AllGatherV" => Op::Allgatherv,
        b"ReduceScatter" => Op::Reducescatter,
        b"AlltoAll" | b"AllToAll" => Op::Alltoall,
        b"Gather" => Op::Gather,
        b"Scatter" => Op::Scatter,
        b"Send" => Op::Send,
        b"Recv" => Op::Recv,
        _ => Op::None,
    }
}

fn dtype_of(name: &[u8]) -> (u64, u16) {
    match name {
        b"ncclInt8" | b"ncclChar" => (1, dtype::INT8),
        b"ncclUint8" => (1, dtype::UINT8),
        b"ncclInt32" | b"ncclInt" => (4, dtype::INT32),
        b"ncclUint32" => (4, dtype::UINT32),
        b"ncclInt64" => (8, dtype::INT64),
        b"ncclUint64" => (8, dtype::UINT64),
        b"ncclFloat16" | b"ncclHalf" => (2, dtype::FLOAT16),
        b"ncclFloat32" | b"ncclFloat" => (4, dtype::FLOAT),
        b"ncclFloat64" | b"ncclDouble" => (8, dtype::DOUBLE),
        b"ncclBfloat16" => (2, dtype::BFLOAT16),
        b"ncclFloat8e4m3" => (1, dtype::FLOAT8_E4M3),
        b"ncclFloat8e5m2" => (1, dtype::FLOAT8_E5M2),
        _ => (0, dtype::DERIVED),
    }
}

// Offsets shared by v4–v7 (the union starts at 24; later versions only append fields).
const PARENT: usize = 8;
const U: usize = 24;

unsafe extern "C" fn start_v5(ctx: *mut c_void, h: *mut *mut c_void, d: *const u8) -> c_int {
    let t = if d.is_null() {
        0
    } else {
        // SAFETY: NCCL's descriptor, whose header starts with a u64 type in v5 and later.
        unsafe { rd::<u64>(d, 0) }
    };
    // SAFETY: NCCL's arguments.
    unsafe { start(ctx, h, d, t) }
}

unsafe extern "C" fn start_v4(ctx: *mut c_void, h: *mut *mut c_void, d: *const u8) -> c_int {
    let t = if d.is_null() {
        0
    } else {
        // SAFETY: NCCL's descriptor, whose type is a u8 in v4.
        u64::from(unsafe { rd::<u8>(d, 0) })
    };
    // SAFETY: NCCL's arguments.
    unsafe { start(ctx, h, d, t) }
}

/// # Safety
/// NCCL's `startEvent` arguments; `t` is the descriptor's event type.
unsafe fn start(ctx: *mut c_void, h: *mut *mut c_void, d: *const u8, t: u64) -> c_int {
    let r = std::panic::catch_unwind(|| {
        if d.is_null() || ctx.is_null() || state::life() != state::life::ACTIVE {
            return std::ptr::null_mut();
        }
        // SAFETY: the context this plugin's init returned.
        let c = unsafe { &*(ctx as *const Ctx) };
        match t {
            // SAFETY: a descriptor of that type.
            ev::COLL | ev::P2P => unsafe { start_op(c, d, t == ev::P2P) },
            // SAFETY: as above.
            ev::KERNEL_CH => unsafe { start_channel(d) },
            // SAFETY: as above.
            ev::PROXY_OP => unsafe { start_proxy(d) },
            // SAFETY: as above.
            ev::PROXY_STEP => unsafe { start_step(d) },
            _ => std::ptr::null_mut(),
        }
    });
    if !h.is_null() {
        // SAFETY: NCCL's out-pointer.
        unsafe { *h = r.unwrap_or(std::ptr::null_mut()) };
    }
    SUCCESS
}

/// # Safety
/// `d` is a `Coll` (or, with `p2p`, a `P2p`) descriptor.
unsafe fn start_op(c: &Ctx, d: *const u8, p2p: bool) -> *mut c_void {
    let Some(shim) = state::shim() else {
        return std::ptr::null_mut();
    };
    // The wrappers record this communicator's calls: keep the operation for its links only.
    let emit_call = !c.wrapped(shim);
    let t = now_mono();
    // SAFETY: field offsets of `coll` / `p2p` (profiler_v4.h … v7).
    let (op, count, dt, peer, op_seq, channels) = unsafe {
        if p2p {
            let func = text(rd::<*const c_char>(d, U));
            let dt = text(rd::<*const c_char>(d, U + 16));
            (
                op_of(func),
                rd::<usize>(d, U + 24),
                dt,
                rd::<c_int>(d, U + 32),
                None,
                rd::<u8>(d, U + 36),
            )
        } else {
            let func = text(rd::<*const c_char>(d, U + 8));
            let dt = text(rd::<*const c_char>(d, U + 48));
            (
                op_of(func),
                rd::<usize>(d, U + 32),
                dt,
                rd::<c_int>(d, U + 40),
                Some(rd::<u64>(d, U)),
                rd::<u8>(d, U + 56),
            )
        }
    };
    if op == Op::None {
        return std::ptr::null_mut();
    }
    let (size, code) = dtype_of(dt);
    let n = c.nranks.max(1) as u64;
    let per_rank_times_n = matches!(
        op,
        Op::Allgather | Op::Reducescatter | Op::Alltoall | Op::Gather | Op::Scatter
    );
    let count = count as u64;
    let mut call = Call {
        op: op as u8,
        peer: if matches!(
            op,
            Op::Broadcast | Op::Reduce | Op::Gather | Op::Scatter | Op::Send | Op::Recv
        ) {
            peer
        } else {
            -1
        },
        tag: if p2p { 0 } else { -1 },
        bytes: count * size * if per_rank_times_n { n } else { 1 },
        count: count * if per_rank_times_n { n } else { 1 },
        dtype: code,
        rank: shim.rank,
        comm_id: c.comm_id,
        comm_rank: c.rank,
        comm_size: c.nranks,
        clock: Clock::HostMono as u8,
        lib: crate::nccl::library_code(),
        peer2: -1,
        tag2: -1,
        t_enter: t,
        ..Default::default()
    };
    if p2p {
        call.seq = c.seq.load(Ordering::Relaxed);
        if emit_call {
            let dir = if op == Op::Send { Dir::Send } else { Dir::Recv };
            shim.assign_p2p_seq(&mut call, dir);
        }
    } else {
        call.seq = c.seq.fetch_add(1, Ordering::Relaxed);
        call.op_seq = op_seq.unwrap_or(0);
    }
    if !emit_call {
        // The wrappers' own `seq` for it is not known here.
        call.seq = 0;
    }
    let Some(e) = claim(kind::OP) else {
        return std::ptr::null_mut();
    };
    let slot = if emit_call {
        shim.claim_in(&call, in_flight_status::ON_GPU, true)
    } else {
        Slot::None
    };
    *e.call.lock().unwrap_or_else(|p| p.into_inner()) = call;
    e.ctx.store(c as *const Ctx as u64, Ordering::Relaxed);
    e.slot.store(
        match slot {
            Slot::Owned(s) | Slot::Home(s) => s as u64,
            Slot::None => u64::MAX,
        },
        Ordering::Relaxed,
    );
    e.channels.store(u32::from(channels), Ordering::Relaxed);
    e.channels_stopped.store(0, Ordering::Relaxed);
    e.stopped.store(false, Ordering::Relaxed);
    e.finished.store(false, Ordering::Relaxed);
    e.k_start.store(u64::MAX, Ordering::Relaxed);
    e.k_end.store(0, Ordering::Relaxed);
    e.emit_call.store(emit_call, Ordering::Relaxed);
    e.proxies_open.store(0, Ordering::Relaxed);
    e.links.lock().unwrap_or_else(|p| p.into_inner()).clear();
    e.stopped_at.store(0, Ordering::Release);
    e as *const Ev as *mut c_void
}

/// # Safety
/// `d` is a `ProxyOp` descriptor.
unsafe fn start_proxy(d: *const u8) -> *mut c_void {
    // SAFETY: header and `proxyOp` offsets (v4 … v7): pid 24, channelId 28, peer 32, nSteps 36,
    // chunkSize 40, isSend 44.
    let (parent, pid, peer, steps, chunk, send) = unsafe {
        (
            rd::<*mut c_void>(d, PARENT),
            rd::<i32>(d, U),
            rd::<c_int>(d, U + 8),
            rd::<c_int>(d, U + 12),
            rd::<c_int>(d, U + 16),
            rd::<c_int>(d, U + 20),
        )
    };
    // PXN: a proxy operation run for another process has that process's parent object.
    if pid != std::process::id() as i32 {
        return std::ptr::null_mut();
    }
    let Some(p) = event(parent).filter(|p| p.kind.load(Ordering::Acquire) == kind::OP) else {
        return std::ptr::null_mut();
    };
    child(kind::PROXY, p, |e| {
        p.proxies_open.fetch_add(1, Ordering::AcqRel);
        *e.proxy.lock().unwrap_or_else(|x| x.into_inner()) = LinkAgg {
            peer,
            send: send != 0,
            t_start: now_mono(),
            t_end: 0,
            bytes: steps.max(0) as u64 * chunk.max(0) as u64,
            steps: steps.max(0) as u32,
            channels: 1,
            ..LinkAgg::default()
        };
    })
}

/// # Safety
/// `d` is a `ProxyStep` descriptor.
unsafe fn start_step(d: *const u8) -> *mut c_void {
    // SAFETY: header offsets (v4 … v7): parentObj at 8 (the step's proxy operation).
    let parent = unsafe { rd::<*mut c_void>(d, PARENT) };
    // Steps of a proxy operation left out (PXN, or a full pool) are left out too.
    let Some(p) = event(parent).filter(|p| p.kind.load(Ordering::Acquire) == kind::PROXY) else {
        return std::ptr::null_mut();
    };
    child(kind::STEP, p, |e| {
        *e.step.lock().unwrap_or_else(|x| x.into_inner()) = StepT::default();
    })
}

/// Claims an event of kind `k` under parent `p` (`init` fills its own fields first); null when
/// the pool is full.
fn child(k: u8, p: &'static Ev, init: impl FnOnce(&Ev)) -> *mut c_void {
    let Some(e) = claim(k) else {
        return std::ptr::null_mut();
    };
    init(e);
    e.parent.store(p as *const Ev as u64, Ordering::Relaxed);
    e.parent_gen
        .store(p.generation.load(Ordering::Acquire), Ordering::Release);
    e as *const Ev as *mut c_void
}

/// # Safety
/// `d` is a `KernelCh` descriptor.
unsafe fn start_channel(d: *const u8) -> *mut c_void {
    // SAFETY: header and `kernelCh` offsets (v4 … v7): parentObj at 8, pTimer at 32.
    let (parent, ptimer) = unsafe { (rd::<*mut c_void>(d, PARENT), rd::<u64>(d, U + 8)) };
    let Some(p) = event(parent).filter(|p| p.kind.load(Ordering::Acquire) == kind::OP) else {
        return std::ptr::null_mut();
    };
    observe_gpu_time(ptimer);
    if ptimer != 0 {
        p.k_start.fetch_min(ptimer, Ordering::Relaxed);
    }
    child(kind::CHANNEL, p, |_| {})
}

unsafe extern "C" fn record_state(h: *mut c_void, state: c_int, args: *const u8) -> c_int {
    let _ = std::panic::catch_unwind(|| {
        let Some(e) = event(h) else { return };
        match e.kind.load(Ordering::Acquire) {
            kind::CHANNEL if state == st::KERNEL_CH_STOP && !args.is_null() => {
                // SAFETY: `kernelCh.pTimer` is the union's first field in v4 … v7 state
                // arguments.
                let ptimer = unsafe { rd::<u64>(args, 0) };
                observe_gpu_time(ptimer);
                if let Some(p) = parent_of(e, kind::OP) {
                    p.k_end.fetch_max(ptimer, Ordering::Relaxed);
                }
            }
            kind::STEP => {
                let t = now_mono();
                let size = if args.is_null() {
                    0
                } else {
                    // SAFETY: `proxyStep.transSize` (a size_t) is the union's first field.
                    unsafe { rd::<usize>(args, 0) as u64 }
                };
                let mut s = e.step.lock().unwrap_or_else(|x| x.into_inner());
                let first = |f: &mut u64| {
                    if *f == 0 {
                        *f = t;
                    }
                };
                match state {
                    st::SEND_GPU_WAIT => first(&mut s.gpu_wait),
                    st::SEND_PEER_WAIT => first(&mut s.peer_wait),
                    st::SEND_WAIT => {
                        first(&mut s.net);
                        s.bytes = size;
                    }
                    st::RECV_WAIT => first(&mut s.net),
                    st::RECV_FLUSH_WAIT => {
                        first(&mut s.flush);
                        s.bytes = size;
                    }
                    st::RECV_GPU_WAIT => {
                        first(&mut s.gpu_wait);
                        if s.bytes == 0 {
                            s.bytes = size;
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    });
    SUCCESS
}

/// The live parent of `e`, of kind `k` (none when it was finished and reused since).
fn parent_of(e: &Ev, k: u8) -> Option<&'static Ev> {
    let p = event(e.parent.load(Ordering::Relaxed) as *mut c_void)?;
    (p.generation.load(Ordering::Acquire) == e.parent_gen.load(Ordering::Acquire)
        && p.kind.load(Ordering::Acquire) == k)
        .then_some(p)
}

unsafe extern "C" fn stop_event(h: *mut c_void) -> c_int {
    let _ = std::panic::catch_unwind(|| {
        let Some(e) = event(h) else { return };
        match e.kind.load(Ordering::Acquire) {
            kind::OP => {
                e.stopped_at.store(now_mono(), Ordering::Relaxed);
                e.stopped.store(true, Ordering::Release);
                maybe_finish(e);
            }
            kind::CHANNEL => {
                let p = parent_of(e, kind::OP);
                release(e);
                if let Some(p) = p {
                    p.channels_stopped.fetch_add(1, Ordering::AcqRel);
                    maybe_finish(p);
                }
            }
            kind::PROXY => {
                let mut l = *e.proxy.lock().unwrap_or_else(|x| x.into_inner());
                l.t_end = now_mono();
                let p = parent_of(e, kind::OP);
                release(e);
                if let Some(p) = p {
                    {
                        let mut links = p.links.lock().unwrap_or_else(|x| x.into_inner());
                        if let Some(a) = links
                            .iter_mut()
                            .find(|a| a.peer == l.peer && a.send == l.send)
                        {
                            a.fold(&l);
                        } else if links.len() < LINKS_MAX {
                            links.push(l);
                        }
                    }
                    p.proxies_open.fetch_sub(1, Ordering::AcqRel);
                    maybe_finish(p);
                }
            }
            kind::STEP => {
                let t = now_mono();
                let s = *e.step.lock().unwrap_or_else(|x| x.into_inner());
                let p = parent_of(e, kind::PROXY);
                release(e);
                if let Some(p) = p {
                    p.proxy
                        .lock()
                        .unwrap_or_else(|x| x.into_inner())
                        .step(&s, t);
                }
            }
            _ => {}
        }
    });
    SUCCESS
}

/// Writes an operation once it stopped and every channel it announced stopped too.
fn maybe_finish(e: &'static Ev) {
    if !e.stopped.load(Ordering::Acquire)
        || e.channels_stopped.load(Ordering::Acquire) < e.channels.load(Ordering::Relaxed)
        || e.proxies_open.load(Ordering::Acquire) > 0
    {
        return;
    }
    finish(e);
}

fn finish(e: &'static Ev) {
    if e.finished.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(shim) = state::shim() else { return };
    let mut call = *e.call.lock().unwrap_or_else(|p| p.into_inner());
    call.t_exit = e.stopped_at.load(Ordering::Relaxed).max(call.t_enter);
    let (a, b) = (
        e.k_start.load(Ordering::Relaxed),
        e.k_end.load(Ordering::Relaxed),
    );
    if a != u64::MAX && b >= a && b != 0 {
        call.gpu_start = gpu_to_host(a);
        call.gpu_end = gpu_to_host(b);
    }
    let slot = e.slot.load(Ordering::Relaxed);
    let emit_call = e.emit_call.load(Ordering::Relaxed);
    let links = std::mem::take(&mut *e.links.lock().unwrap_or_else(|x| x.into_inner()));
    release(e);
    if state::life() == state::life::ACTIVE {
        if slot != u64::MAX {
            shim.unclaim(Slot::Owned(slot as usize));
        }
        if emit_call {
            let mut raw = [0u8; commscope_wire::record::RECORD_SIZE];
            commscope_wire::record::encode_call(
                &mut raw,
                commscope_wire::record::kind::CALL,
                &call,
            );
            shim.shm.push(&raw);
        }
        for l in links {
            shim.push(&commscope_wire::record::Record::Link(
                commscope_wire::record::Link {
                    rec_seq: 0,
                    op: call.op,
                    flags: if l.send {
                        commscope_wire::op::flags::LINK_SEND
                    } else {
                        0
                    },
                    comm_id: call.comm_id,
                    seq: call.seq,
                    op_seq: call.op_seq,
                    bytes: l.bytes,
                    steps: l.steps,
                    channels: l.channels,
                    peer: l.peer,
                    t_start: l.t_start,
                    t_end: l.t_end,
                    rank: call.rank,
                    comm_rank: call.comm_rank,
                    net_ns: l.net_ns,
                    gpu_wait_ns: l.gpu_wait_ns,
                    peer_wait_ns: l.peer_wait_ns,
                    xfer_bytes: l.xfer_bytes,
                    steps_done: l.steps_done,
                },
            ));
        }
    }
}

/// Operations NCCL stopped long ago without any kernel channel reporting (none was launched,
/// or the library does not send channel events): written with host times. Called by the GPU
/// poller.
pub fn sweep(now: u64) {
    let Some(p) = EVENTS.get() else { return };
    for e in p.iter() {
        if e.kind.load(Ordering::Acquire) != kind::OP || !e.stopped.load(Ordering::Acquire) {
            continue;
        }
        let at = e.stopped_at.load(Ordering::Relaxed);
        // A kernel that started and never stopped is a hang: it stays in flight.
        if at != 0
            && now.saturating_sub(at) > 5_000_000_000
            && e.k_start.load(Ordering::Relaxed) == u64::MAX
        {
            finish(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_step(gpu_wait: u64, ready: u64, net: u64) -> StepT {
        StepT {
            gpu_wait,
            peer_wait: ready,
            net,
            flush: 0,
            bytes: 100,
        }
    }

    #[test]
    fn overlapping_send_steps_count_network_time_once() {
        let mut l = LinkAgg {
            send: true,
            ..LinkAgg::default()
        };
        // Four steps posted together at 10; data ready at 20, 30, 40, 50; each on the network
        // from 1 after ready for 25 (so up to three overlap); completed in order.
        for k in 0..4u64 {
            let ready = 20 + 10 * k;
            l.step(&send_step(10, ready, ready + 1), ready + 26);
        }
        assert_eq!(l.steps_done, 4);
        assert_eq!(l.xfer_bytes, 400);
        // Network: [21, 46] ∪ [31, 56] ∪ [41, 66] ∪ [51, 76] = [21, 76].
        assert_eq!(l.net_ns, 55);
        // GPU wait: [10, 20] ∪ … ∪ [10, 50] = [10, 50].
        assert_eq!(l.gpu_wait_ns, 40);
        // 1 between ready and posted, per step.
        assert_eq!(l.peer_wait_ns, 4);
    }

    #[test]
    fn receive_steps_split_network_and_gpu_waits_and_gaps_are_not_counted() {
        let mut l = LinkAgg::default();
        // Posted at 0, data at 10 (no flush), drained by 12; the next posted at 50, flushed at
        // 70, handed to the GPU at 75, drained at 80.
        l.step(
            &StepT {
                net: 1,
                gpu_wait: 10,
                bytes: 7,
                ..StepT::default()
            },
            12,
        );
        l.step(
            &StepT {
                net: 50,
                flush: 70,
                gpu_wait: 75,
                bytes: 9,
                ..StepT::default()
            },
            80,
        );
        assert_eq!((l.net_ns, l.gpu_wait_ns, l.xfer_bytes), (9 + 20, 2 + 5, 16));
        // A step with no state recorded moves no time.
        l.step(&StepT::default(), 90);
        assert_eq!((l.net_ns, l.gpu_wait_ns, l.steps_done), (29, 7, 3));
    }
}
