//! NCCL (and RCCL) interception: the `nccl*` entry points, forwarded to their `pnccl*` twins
//! (or, where a build has none, to the next `nccl*` definition), each user call recorded once.
//!
//! Per collective: the communicator's entry (its id is NCCL's own `commHash`, computed from the
//! `ncclUniqueId` at init, from the parent's hash, split counter and color for splits — see
//! `commscope_wire::nccl_hash`), `seq`/`op_seq`, an in-flight slot, and, when a CUDA driver is
//! present, a pair of CUDA events recorded on the call's stream around the real call. The call
//! record is written by the GPU poller once the end event fired, with the GPU interval mapped
//! onto host `CLOCK_MONOTONIC`; until then the in-flight table shows the call as on the GPU, so
//! a collective whose kernel never finishes (a peer never launched it) stays visible.
//!
//! Between `ncclGroupStart` and the outermost `ncclGroupEnd` calls are only queued by NCCL: their
//! records wait in a per-thread list and the events go around the group end, one pair per stream,
//! shared by the group's operations on that stream. A stream being captured into a CUDA graph
//! gets no events (the call is flagged `GRAPH_CAPTURED`), so a capture is never broken.
//!
//! NCCL calls some of its own exports (`ncclBcast` → `ncclBroadcast`, `ncclGetUniqueId` from
//! `ncclCommInitAll`): the re-entrancy guard lets those through unrecorded, so one user call
//! gives exactly one record. Return codes, results and ordering are the library's, always.
//!
//! The exported functions have NCCL's C signatures and contracts (`nccl.h`): their safety
//! requirements are NCCL's.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::cell::{Cell, RefCell, UnsafeCell};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use commscope_wire::nccl_hash::{self, Version};
use commscope_wire::op::{Clock, Op, dtype, flags, lib};
use commscope_wire::record::{
    Call, Comm as CommRec, CommEvent, RECORD_SIZE, Record, encode_call, kind,
};
use commscope_wire::shm::in_flight_status;

use crate::cuda::{self, Handle};
use crate::state::{self, Guard, Shim, Slot, active, enter_hook, in_hook, shielded};
use crate::tables::{CommEntry, CommInfo, CommTable, Dir, comm_flags};
use crate::util::{self, now_mono};

/// `ncclComm_t`, `cudaStream_t`: pointers, kept as machine words.
type NComm = usize;
type Stream = usize;
type CP = *const c_void;
type P = *mut c_void;

/// `ncclResult_t` values the shim looks at.
pub mod result {
    pub const SUCCESS: i32 = 0;
    pub const INTERNAL_ERROR: i32 = 3;
    pub const IN_PROGRESS: i32 = 7;
}

/// `NCCL_SPLIT_NOCOLOR`.
const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_API_MAGIC`, the first word of an initialized `ncclConfig_t` after its size.
const CONFIG_MAGIC: u32 = 0xcafe_beef;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

// ----- the real functions --------------------------------------------------------------------

/// A real NCCL function, declared by its `pncclX` twin.
type Real = crate::resolve::Real;

/// The public name of a twin (`pncclX` → `ncclX`).
fn plain(twin: &'static CStr) -> &'static CStr {
    CStr::from_bytes_with_nul(&twin.to_bytes_with_nul()[1..]).unwrap_or(twin)
}

/// Resolves `pncclX`, else the real `ncclX`, wherever the library was loaded (in the global
/// scope or privately, as a dependency of an `RTLD_LOCAL` object): never this library's wrapper.
fn resolve(twin: &'static CStr) -> *mut c_void {
    let p = crate::resolve::next(twin);
    if !p.is_null() {
        return p;
    }
    crate::resolve::next(plain(twin))
}

/// Declares the real NCCL functions: `forward` ones carry an application's call (a function no
/// loaded library has ends the process as the dynamic loader would), `own` ones are the shim's
/// own queries (missing: `ncclInternalError`, and the shim records less).
macro_rules! real {
    (forward { $(fn $name:ident = $twin:literal ($($arg:ident: $ty:ty),* $(,)?);)* }
     own { $(fn $oname:ident = $otwin:literal ($($oarg:ident: $oty:ty),* $(,)?);)* }) => {
        $(
            #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) -> c_int {
                static REAL: Real = Real::with($twin, resolve);
                let p = match REAL.get() {
                    0 => crate::resolve::undefined(plain($twin)),
                    p => p,
                };
                // SAFETY: `p` is the NCCL library's function of this name, whose C signature is
                // the one declared here (handles and enums as machine words / ints).
                let f: unsafe extern "C" fn($($ty),*) -> c_int = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller passes the application's own arguments through.
                unsafe { f($($arg),*) }
            }
        )*
        $(
            #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
            #[inline]
            pub unsafe fn $oname($($oarg: $oty),*) -> c_int {
                static REAL: Real = Real::with($otwin, resolve);
                let p = REAL.get();
                if p == 0 {
                    return result::INTERNAL_ERROR;
                }
                // SAFETY: `p` is the NCCL library's function of this name, whose C signature is
                // the one declared here.
                let f: unsafe extern "C" fn($($oty),*) -> c_int = unsafe { std::mem::transmute(p) };
                // SAFETY: the shim's own, valid arguments.
                unsafe { f($($oarg),*) }
            }
        )*
    };
}

/// The real NCCL functions.
pub mod real {
    use super::*;
    real! {
        forward {
        fn get_unique_id = c"pncclGetUniqueId" (id: *mut UniqueId);
        fn comm_init_rank = c"pncclCommInitRank" (comm: *mut NComm, n: c_int, id: UniqueId, rank: c_int);
        fn comm_init_rank_config = c"pncclCommInitRankConfig" (comm: *mut NComm, n: c_int, id: UniqueId, rank: c_int, config: P);
        fn comm_init_rank_scalable = c"pncclCommInitRankScalable" (comm: *mut NComm, n: c_int, rank: c_int, nid: c_int, ids: *mut UniqueId, config: P);
        fn comm_init_all = c"pncclCommInitAll" (comms: *mut NComm, ndev: c_int, devlist: *const c_int);
        fn comm_split = c"pncclCommSplit" (comm: NComm, color: c_int, key: c_int, newcomm: *mut NComm, config: P);
        fn comm_shrink = c"pncclCommShrink" (comm: NComm, exclude: *mut c_int, n: c_int, newcomm: *mut NComm, config: P, flags: c_int);
        fn comm_finalize = c"pncclCommFinalize" (comm: NComm);
        fn comm_destroy = c"pncclCommDestroy" (comm: NComm);
        fn comm_abort = c"pncclCommAbort" (comm: NComm);
        fn comm_get_async_error = c"pncclCommGetAsyncError" (comm: NComm, err: *mut c_int);
        fn group_start = c"pncclGroupStart" ();
        fn group_end = c"pncclGroupEnd" ();
        fn all_reduce = c"pncclAllReduce" (s: CP, r: P, n: usize, dt: c_int, op: c_int, comm: NComm, stream: Stream);
        fn broadcast = c"pncclBroadcast" (s: CP, r: P, n: usize, dt: c_int, root: c_int, comm: NComm, stream: Stream);
        fn bcast = c"pncclBcast" (b: P, n: usize, dt: c_int, root: c_int, comm: NComm, stream: Stream);
        fn reduce = c"pncclReduce" (s: CP, r: P, n: usize, dt: c_int, op: c_int, root: c_int, comm: NComm, stream: Stream);
        fn all_gather = c"pncclAllGather" (s: CP, r: P, n: usize, dt: c_int, comm: NComm, stream: Stream);
        fn reduce_scatter = c"pncclReduceScatter" (s: CP, r: P, n: usize, dt: c_int, op: c_int, comm: NComm, stream: Stream);
        fn all_to_all = c"pncclAlltoAll" (s: CP, r: P, n: usize, dt: c_int, comm: NComm, stream: Stream);
        fn gather = c"pncclGather" (s: CP, r: P, n: usize, dt: c_int, root: c_int, comm: NComm, stream: Stream);
        fn scatter = c"pncclScatter" (s: CP, r: P, n: usize, dt: c_int, root: c_int, comm: NComm, stream: Stream);
        fn send = c"pncclSend" (s: CP, n: usize, dt: c_int, peer: c_int, comm: NComm, stream: Stream);
        fn recv = c"pncclRecv" (r: P, n: usize, dt: c_int, peer: c_int, comm: NComm, stream: Stream);
        fn all_reduce_config = c"pncclAllReduceConfig" (s: CP, r: P, n: usize, dt: c_int, op: c_int, comm: NComm, stream: Stream, cfg: CP);
        fn broadcast_config = c"pncclBroadcastConfig" (s: CP, r: P, n: usize, dt: c_int, root: c_int, comm: NComm, stream: Stream, cfg: CP);
        fn reduce_config = c"pncclReduceConfig" (s: CP, r: P, n: usize, dt: c_int, op: c_int, root: c_int, comm: NComm, stream: Stream, cfg: CP);
        fn all_gather_config = c"pncclAllGatherConfig" (s: CP, r: P, n: usize, dt: c_int, comm: NComm, stream: Stream, cfg: CP);
        fn reduce_scatter_config = c"pncclReduceScatterConfig" (s: CP, r: P, n: usize, dt: c_int, op: c_int, comm: NComm, stream: Stream, cfg: CP);
        fn all_to_all_config = c"pncclAlltoAllConfig" (s: CP, r: P, n: usize, dt: c_int, comm: NComm, stream: Stream, cfg: CP);
        fn gather_config = c"pncclGatherConfig" (s: CP, r: P, n: usize, dt: c_int, root: c_int, comm: NComm, stream: Stream, cfg: CP);
        fn scatter_config = c"pncclScatterConfig" (s: CP, r: P, n: usize, dt: c_int, root: c_int, comm: NComm, stream: Stream, cfg: CP);
        }
        own {
        fn get_version = c"pncclGetVersion" (v: *mut c_int);
        fn comm_user_rank = c"pncclCommUserRank" (comm: NComm, rank: *mut c_int);
        fn comm_count = c"pncclCommCount" (comm: NComm, count: *mut c_int);
        fn comm_cu_device = c"pncclCommCuDevice" (comm: NComm, dev: *mut c_int);
        fn poll_async_error = c"pncclCommGetAsyncError" (comm: NComm, err: *mut c_int);
        }
    }
}

/// `ncclGetLastError(comm)`: the library's text for its last error (empty when none).
fn last_error(comm: NComm) -> Vec<u8> {
    static REAL: Real = Real::with(c"pncclGetLastError", resolve);
    let p = REAL.get();
    if p == 0 {
        return Vec::new();
    }
    // SAFETY: NCCL's `const char* ncclGetLastError(ncclComm_t)`.
    let f: unsafe extern "C" fn(NComm) -> *const c_char = unsafe { std::mem::transmute(p) };
    // SAFETY: a communicator handle or NULL, as the API allows.
    let s = unsafe { f(comm) };
    if s.is_null() {
        return Vec::new();
    }
    // SAFETY: NCCL's NUL-terminated message.
    let mut m = unsafe { CStr::from_ptr(s) }.to_bytes().to_vec();
    // A record carries 64 bytes of it: mark a cut.
    let max = commscope_wire::record::COMM_NAME_MAX;
    if m.len() > max {
        m.truncate(max - 3);
        while !m.is_empty() && std::str::from_utf8(&m).is_err() {
            m.pop();
        }
        m.extend_from_slice(b"...");
    }
    m
}

// ----- library facts -----------------------------------------------------------------------------

static VERSION: AtomicI32 = AtomicI32::new(0);
static LIB: AtomicU8 = AtomicU8::new(u8::MAX);

/// `ncclGetVersion` of the loaded library (0 when it fails), asked once.
pub fn version() -> i32 {
    let v = VERSION.load(Ordering::Relaxed);
    if v != 0 {
        return v;
    }
    let mut v: c_int = 0;
    // SAFETY: a valid out-pointer.
    if unsafe { real::get_version(&mut v) } != result::SUCCESS {
        return 0;
    }
    VERSION.store(v, Ordering::Relaxed);
    v
}

/// Whether the loaded library is RCCL (same API, AMD GPUs): from the file that defines it.
pub fn library_code() -> u8 {
    let l = LIB.load(Ordering::Relaxed);
    if l != u8::MAX {
        return l;
    }
    static PROBE: Real = Real::with(c"pncclAllReduce", resolve);
    let p = PROBE.get();
    let mut code = lib::NCCL;
    if p != 0 {
        // SAFETY: an all-zero Dl_info is a valid out-parameter.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `p` is a code address; dladdr only reads the loader's tables.
        if unsafe { libc::dladdr(p as *const c_void, &mut info) } != 0 && !info.dli_fname.is_null()
        {
            // SAFETY: the loader's NUL-terminated path.
            let f = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
            if f.contains("rccl") {
                code = lib::RCCL;
            }
        }
    }
    LIB.store(code, Ordering::Relaxed);
    code
}

/// The library as a trace header names it, e.g. `NCCL 2.32.3`.
pub fn library_string() -> String {
    let v = version();
    let name = if library_code() == lib::RCCL {
        "RCCL"
    } else {
        "NCCL"
    };
    if v >= 10000 {
        format!("{name} {}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    } else if v > 0 {
        format!("{name} {}.{}.{}", v / 1000, v / 100 % 10, v % 100)
    } else {
        name.to_owned()
    }
}

/// (element size, commscope datatype code) of an `ncclDataType_t`.
pub fn dtype_info(dt: c_int) -> (u64, u16) {
    match dt {
        0 => (1, dtype::INT8),
        1 => (1, dtype::UINT8),
        2 => (4, dtype::INT32),
        3 => (4, dtype::UINT32),
        4 => (8, dtype::INT64),
        5 => (8, dtype::UINT64),
        6 => (2, dtype::FLOAT16),
        7 => (4, dtype::FLOAT),
        8 => (8, dtype::DOUBLE),
        9 => (2, dtype::BFLOAT16),
        10 => (1, dtype::FLOAT8_E4M3),
        11 => (1, dtype::FLOAT8_E5M2),
        _ => (0, dtype::DERIVED),
    }
}

// ----- process-wide NCCL state -------------------------------------------------------------------

/// Work handed to the GPU poller: owned by whoever holds in-flight slot `i` (the wrapper that
/// claimed it, then — once `ready` — the poller, which frees the slot when done).
#[derive(Debug, Default)]
struct PendingData {
    ctx: Handle,
    /// Start and end events, created in `ctx` on first use and kept for reuse.
    ev: [Handle; 2],
    calls: Vec<Call>,
}

#[derive(Debug, Default)]
pub struct PendingSlot {
    ready: AtomicBool,
    data: UnsafeCell<PendingData>,
}

// SAFETY: `data` is accessed only by the holder of the matching in-flight slot (see above);
// `ready` (release/acquire) hands it from the wrapper to the poller.
unsafe impl Sync for PendingSlot {}

/// A live communicator, for asynchronous-error polling and split counting.
#[derive(Debug)]
struct Live {
    handle: NComm,
    id: u64,
    rank: i32,
    size: i32,
    reported: bool,
}

/// What the shim keeps for NCCL.
#[derive(Debug)]
pub struct NcclState {
    pub comms: CommTable,
    pending: Box<[PendingSlot]>,
    live: Mutex<Vec<Live>>,
    /// Ids of the communicators the wrappers recorded (the profiler plugin leaves those alone).
    wrapped: Mutex<std::collections::HashSet<u64>>,
    poller_started: AtomicBool,
    poller_done: AtomicBool,
    /// Pending records (the poller's view), for tests and the final drain.
    pub busy: AtomicUsize,
}

impl NcclState {
    /// Whether the wrappers record the communicator with this id.
    pub fn is_wrapped(&self, id: u64) -> bool {
        self.wrapped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }

    pub fn new(slots: usize) -> NcclState {
        NcclState {
            comms: CommTable::new(4096),
            pending: (0..slots).map(|_| PendingSlot::default()).collect(),
            live: Mutex::new(Vec::new()),
            wrapped: Mutex::new(std::collections::HashSet::new()),
            poller_started: AtomicBool::new(false),
            poller_done: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
        }
    }
}

thread_local! {
    /// `ncclGroupStart` nesting depth on this thread.
    static GROUP_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Operations issued inside the current group, waiting for the outermost `ncclGroupEnd`.
    static GROUP: RefCell<Vec<Member>> = const { RefCell::new(Vec::new()) };
    /// Set while `ncclCommInitAll` runs: the unique id NCCL draws for it lands here.
    static INIT_ALL_ID: Cell<Option<UniqueId>> = const { Cell::new(None) };
    static CAPTURING_INIT_ALL: Cell<bool> = const { Cell::new(false) };
    /// The last stream seen and its context.
    static STREAM_CTX: Cell<(Stream, Handle)> = const { Cell::new((usize::MAX, 0)) };
}

#[derive(Clone, Copy, Debug)]
struct Member {
    call: Call,
    stream: Stream,
    comm: NComm,
}

// ----- identity and activation -------------------------------------------------------------------

fn hash_version() -> Version {
    Version(version())
}

/// Activates recording for an NCCL-only process (no MPI): rank and size from the launcher's
/// environment, else from the first communicator; the job id from the environment, else from
/// that communicator's `commHash` (which every rank shares).
fn ensure_active(rank: i32, size: i32, first_comm: u64) {
    if state::life() == state::life::DORMANT {
        state::activate_nccl(rank, size, first_comm);
    }
}

/// Reads `ncclConfig_t.commName` (NCCL 2.27 and later) when the struct is initialized and new
/// enough to have it.
///
/// # Safety
/// `config` is null or the application's `ncclConfig_t`.
unsafe fn config_name(config: CP) -> Option<Vec<u8>> {
    if config.is_null() {
        return None;
    }
    let b = config as *const u8;
    // SAFETY: every ncclConfig_t starts with size (size_t), magic and version (unsigned).
    let (size, magic, ver) = unsafe {
        (
            std::ptr::read_unaligned(b as *const usize),
            std::ptr::read_unaligned(b.add(8) as *const u32),
            std::ptr::read_unaligned(b.add(12) as *const u32),
        )
    };
    if magic != CONFIG_MAGIC || ver < 22700 || size < 56 {
        return None;
    }
    // SAFETY: `commName` is the `const char*` at offset 48 from 2.27 on (size checked above).
    let p = unsafe { std::ptr::read_unaligned(b.add(48) as *const *const c_char) };
    if p.is_null() || p as usize == usize::MAX {
        return None;
    }
    // SAFETY: the application's NUL-terminated name.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes().to_vec())
}

impl Shim {
    /// Enters a new NCCL communicator and writes its `comm` record.
    #[allow(clippy::too_many_arguments)]
    fn nccl_created(
        &self,
        handle: NComm,
        id: u64,
        parent: u64,
        rank: i32,
        size: i32,
        local_id: bool,
        name: Option<&[u8]>,
        device: i32,
    ) {
        let flags = if local_id { comm_flags::LOCAL_ID } else { 0 };
        let info = CommInfo {
            id,
            size,
            rank,
            remote_size: 0,
            flags,
        };
        let Some(e) = self.nccl.comms.insert(handle as u64, info) else {
            self.shm
                .count(commscope_wire::shm::Counter::DroppedComms, 1);
            return;
        };
        self.nccl_comm_record(CommEvent::Created, e, parent, name, device, 0);
        {
            let mut w = self.nccl.wrapped.lock().unwrap_or_else(|p| p.into_inner());
            if w.len() < 1 << 16 {
                w.insert(id);
            }
        }
        {
            let mut live = self.nccl.live.lock().unwrap_or_else(|p| p.into_inner());
            live.retain(|l| l.handle != handle);
            live.push(Live {
                handle,
                id,
                rank,
                size,
                reported: false,
            });
        }
        crate::nccl::start_poller(self);
    }

    fn nccl_comm_record(
        &self,
        event: CommEvent,
        e: &CommEntry,
        parent: u64,
        name: Option<&[u8]>,
        device: i32,
        status: i32,
    ) {
        let mut c = self.comm_of(event, e, parent);
        c.flags |= flags::NCCL_COMM;
        c.device = device;
        c.status = status;
        if let Some(n) = name {
            c.set_name(n);
        }
        self.push(&Record::Comm(c));
    }

    /// A communicator that could not be created: a `comm` record with event `failed`, whose
    /// name field carries NCCL's own message (`ncclGetLastError`).
    fn nccl_init_failed(&self, id: u64, parent: u64, rank: i32, size: i32, status: i32) {
        let mut c = CommRec::new(
            CommEvent::Failed,
            id,
            parent,
            now_mono(),
            self.rank,
            rank,
            size,
            0,
        );
        c.flags = flags::NCCL_COMM;
        c.status = status;
        c.device = current_device();
        c.set_name(&last_error(0));
        self.push(&Record::Comm(c));
    }

    /// An asynchronous error on a live communicator, reported once.
    fn nccl_async_error(&self, handle: NComm, err: i32) {
        let mut live = self.nccl.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = live.iter_mut().find(|l| l.handle == handle && !l.reported) {
            l.reported = true;
            let mut c = CommRec::new(
                CommEvent::Failed,
                l.id,
                0,
                now_mono(),
                self.rank,
                l.rank,
                l.size,
                0,
            );
            c.flags = flags::NCCL_COMM | flags::COMM_ASYNC_ERROR;
            c.status = err;
            drop(live);
            c.set_name(&last_error(handle));
            self.push(&Record::Comm(c));
        }
    }

    /// The entry of a communicator handle; one created before recording started gets a
    /// process-local id, flagged as such.
    #[inline]
    fn nccl_comm(&self, h: NComm) -> Option<&CommEntry> {
        if let Some(e) = self.nccl.comms.get(h as u64) {
            return Some(e);
        }
        self.adopt_nccl_comm(h)
    }

    #[cold]
    fn adopt_nccl_comm(&self, h: NComm) -> Option<&CommEntry> {
        if h == 0 {
            return None;
        }
        let (mut rank, mut size, mut dev) = (-1, 0, -1);
        // SAFETY: valid out-pointers; `h` is a communicator the application passed.
        unsafe {
            real::comm_user_rank(h, &mut rank);
            real::comm_count(h, &mut size);
            real::comm_cu_device(h, &mut dev);
        }
        let id = local_id(self, h);
        self.nccl_created(h, id, 0, rank, size, true, None, dev);
        self.nccl.comms.get(h as u64)
    }

    /// Claims an in-flight slot of its own for a call (never the thread's home slot: NCCL work
    /// outlives the call).
    #[inline]
    fn claim_owned(&self, call: &Call, status: u8) -> Slot {
        self.claim_in(call, status, true)
    }

    /// Writes a call record as it stands.
    #[inline]
    fn push_call(&self, call: &Call) {
        let mut raw = [0u8; RECORD_SIZE];
        encode_call(&mut raw, kind::CALL, call);
        self.shm.push(&raw);
    }
}

fn local_id(shim: &Shim, h: NComm) -> u64 {
    shim.local_comm_id(h as u64)
}

fn current_device() -> i32 {
    cuda::get().map_or(-1, |c| c.current_device())
}

fn comm_device(h: NComm) -> i32 {
    let mut d: c_int = -1;
    // SAFETY: a valid out-pointer; `h` is an initialized communicator.
    if unsafe { real::comm_cu_device(h, &mut d) } != result::SUCCESS {
        return current_device();
    }
    d
}

// ----- recording a call --------------------------------------------------------------------------

/// A call being recorded.
struct Rec {
    shim: &'static Shim,
    _guard: Guard,
    call: Call,
    comm: NComm,
    stream: Stream,
    slot: Slot,
    /// The pending slot whose start event was recorded.
    gpu: Option<usize>,
    grouped: bool,
}

/// Whether NCCL's `count` for `op` is the per-rank part, so that `bytes` is `count × size × n`
/// (nccl-tests' sizes, `docs/trace-format.md`); else `count × size`.
pub fn count_is_per_rank(op: Op) -> bool {
    matches!(
        op,
        Op::Allgather | Op::Reducescatter | Op::Alltoall | Op::Gather | Op::Scatter
    )
}

#[inline]
#[allow(clippy::too_many_arguments)]
fn begin(
    comm: NComm,
    op: Op,
    count: usize,
    dt: c_int,
    peer: i32,
    stream: Stream,
    p2p: Option<Dir>,
) -> Option<Rec> {
    let (shim, guard) = active()?;
    shielded(shim, || {
        let e = shim.nccl_comm(comm);
        let (esize, code) = dtype_info(dt);
        let n = e.map_or(0, |e| e.size.load(Ordering::Relaxed)).max(0) as u64;
        let count = count as u64;
        let per_rank = count_is_per_rank(op);
        let bytes = if per_rank {
            count * esize * n
        } else {
            count * esize
        };
        let mut call = Call {
            op: op as u8,
            peer,
            tag: -1,
            bytes,
            count: if per_rank { count * n } else { count },
            dtype: code,
            rank: shim.rank,
            clock: Clock::HostMono as u8,
            lib: library_code(),
            peer2: -1,
            tag2: -1,
            t_enter: now_mono(),
            ..Default::default()
        };
        if let Some(e) = e {
            call.comm_id = e.id.load(Ordering::Relaxed);
            call.comm_rank = e.rank.load(Ordering::Relaxed);
            call.comm_size = e.size.load(Ordering::Relaxed);
            if e.flags.load(Ordering::Relaxed) & comm_flags::LOCAL_ID != 0 {
                call.flags |= flags::LOCAL_COMM_ID;
            }
            call.seq = e.seq.load(Ordering::Relaxed);
            if p2p.is_none() {
                // NCCL requires one order of collectives per communicator on every rank, so
                // no two threads issue them concurrently: a plain load and store suffice.
                e.seq.store(call.seq + 1, Ordering::Relaxed);
                let per_op = &e.op_seq[op as usize];
                call.op_seq = per_op.load(Ordering::Relaxed);
                per_op.store(call.op_seq + 1, Ordering::Relaxed);
            }
        }
        if let Some(dir) = p2p {
            call.tag = 0;
            shim.assign_p2p_seq(&mut call, dir);
        }
        let grouped = GROUP_DEPTH.with(Cell::get) > 0;
        if grouped {
            return (call, Slot::None, None, true);
        }
        let cu = cuda::get();
        if let Some(cu) = cu
            && cu.capturing(stream)
        {
            call.flags |= flags::GRAPH_CAPTURED;
        }
        let slot = shim.claim_owned(&call, in_flight_status::IN_CALL);
        let mut gpu = None;
        if let (Some(cu), Slot::Owned(s)) = (cu, slot)
            && call.flags & flags::GRAPH_CAPTURED == 0
        {
            gpu = start_events(shim, cu, s, stream);
        }
        (call, slot, gpu, false)
    })
    .map(|(call, slot, gpu, grouped)| Rec {
        shim,
        _guard: guard,
        call,
        comm,
        stream,
        slot,
        gpu,
        grouped,
    })
}

/// The context of a stream, cached per thread.
#[inline]
fn ctx_of(cu: &cuda::Cuda, stream: Stream) -> Option<Handle> {
    let (s, c) = STREAM_CTX.with(Cell::get);
    if s == stream && c != 0 && !cuda::is_default_stream(stream) {
        return Some(c);
    }
    let c = cu.stream_ctx(stream)?;
    STREAM_CTX.with(|x| x.set((stream, c)));
    Some(c)
}

/// Makes sure pending slot `s` has events in the stream's context and records the start event.
#[inline]
fn start_events(shim: &Shim, cu: &cuda::Cuda, s: usize, stream: Stream) -> Option<usize> {
    let ctx = ctx_of(cu, stream)?;
    let slot = shim.nccl.pending.get(s)?;
    // SAFETY: in-flight slot `s` is held by this thread, so its pending data is ours.
    let d = unsafe { &mut *slot.data.get() };
    if d.ctx != ctx || d.ev[0] == 0 || d.ev[1] == 0 {
        renew_events(cu, d, ctx)?;
    }
    if !cu.record(d.ev[0], stream) {
        // A stale context cache (a stream handle reused in another context), or events of a
        // context that was destroyed and whose address came back: forget both, so the next call
        // on this slot creates fresh events (the old handles are leaked, never reused).
        STREAM_CTX.with(|x| x.set((usize::MAX, 0)));
        d.ctx = 0;
        d.ev = [0, 0];
        return None;
    }
    Some(s)
}

#[cold]
fn renew_events(cu: &cuda::Cuda, d: &mut PendingData, ctx: Handle) -> Option<()> {
    let old = (d.ctx, d.ev);
    let made = cu.in_ctx(ctx, || {
        if old.0 != 0 {
            let _ = cu.in_ctx(old.0, || {
                for e in old.1.into_iter().filter(|&e| e != 0) {
                    cu.destroy_event(e);
                }
            });
        }
        Some([cu.create_event()?, cu.create_event()?])
    })??;
    d.ctx = ctx;
    d.ev = made;
    Some(())
}

/// Finishes recording a call after the real function returned `rc`.
#[inline]
fn end(mut r: Rec, rc: c_int) -> c_int {
    let shim = r.shim;
    let _ = shielded(shim, || {
        r.call.t_exit = now_mono();
        // `ncclInProgress` from a nonblocking communicator is not a failure; the work is
        // launched later, so events recorded now would not bracket it.
        r.call.status = if rc == result::IN_PROGRESS { 0 } else { rc };
        if r.grouped {
            GROUP.with(|g| {
                g.borrow_mut().push(Member {
                    call: r.call,
                    stream: r.stream,
                    comm: r.comm,
                })
            });
            return;
        }
        if r.call.flags & flags::GRAPH_CAPTURED != 0 && rc == result::SUCCESS {
            crate::graphs::captured(r.stream, r.comm, &r.call);
        }
        hand_over(
            shim,
            r.gpu.filter(|_| rc == result::SUCCESS),
            r.slot,
            r.stream,
            std::slice::from_ref(&r.call),
        );
    });
    rc
}

/// After the real call: hands `calls` to the poller with pending slot `gpu` (its start event
/// recorded; `None` when there is none or the launch failed), else frees in-flight `slot` and
/// writes them with host times.
fn hand_over(shim: &Shim, gpu: Option<usize>, slot: Slot, stream: Stream, calls: &[Call]) {
    if let Some(s) = gpu
        && submit(shim, s, stream, calls)
    {
        return;
    }
    shim.unclaim(slot);
    for c in calls {
        shim.push_call(c);
    }
}

/// Records the end event and hands pending slot `s` (holding `calls`) to the poller. False
/// when the event could not be recorded (the caller then writes the records itself).
fn submit(shim: &Shim, s: usize, stream: Stream, calls: &[Call]) -> bool {
    let Some(cu) = cuda::get() else { return false };
    let Some(slot) = shim.nccl.pending.get(s) else {
        return false;
    };
    // SAFETY: in-flight slot `s` is held by this thread until `ready` is set below.
    let d = unsafe { &mut *slot.data.get() };
    if !cu.record(d.ev[1], stream) {
        return false;
    }
    d.calls.clear();
    d.calls.extend_from_slice(calls);
    if let Some(first) = calls.first()
        && let Some(mut e) = shim.shm.in_flight_read(s)
    {
        e.status = in_flight_status::ON_GPU;
        e.seq = first.seq;
        shim.shm.in_flight_write(s, &e);
    }
    shim.nccl.busy.fetch_add(1, Ordering::Relaxed);
    slot.ready.store(true, Ordering::Release);
    start_poller(shim);
    true
}

/// Records one launch of a CUDA graph on `stream` whose capture held `calls` (`launch` makes the
/// real launch): like a group, one event pair around the launch and one record per captured call
/// at its end, each with a new `seq` (the communicator's next) and flagged
/// `GRAPH_CAPTURED | GRAPH_REPLAY`. `op_seq` stays the capture's: NCCL's own per-function
/// counter does not move at a replay. A launch that fails, or is itself being captured, gives no
/// records.
pub fn replay(
    calls: &[crate::graphs::Captured],
    stream: Stream,
    launch: impl FnOnce() -> c_int,
) -> c_int {
    let Some((shim, guard)) = active() else {
        return launch();
    };
    let cu = cuda::get();
    if calls.is_empty() || cu.is_some_and(|c| c.capturing(stream)) {
        drop(guard);
        return launch();
    }
    let mut recs: Vec<Call> = Vec::with_capacity(calls.len());
    let mut slot = Slot::None;
    let mut gpu = None;
    let prepared = shielded(shim, || {
        let t = now_mono();
        for (h, tmpl) in calls {
            let mut c = *tmpl;
            c.flags |= flags::GRAPH_CAPTURED | flags::GRAPH_REPLAY;
            (c.t_enter, c.t_exit, c.status, c.gpu_start, c.gpu_end) = (t, 0, 0, 0, 0);
            let op = c.op();
            if op.is_p2p() {
                let dir = if op == Op::Send { Dir::Send } else { Dir::Recv };
                shim.assign_p2p_seq(&mut c, dir);
            } else if let Some(e) = shim.nccl.comms.get(*h as u64) {
                // A handle destroyed since the capture is not looked at (not adopted).
                c.seq = e.seq.load(Ordering::Relaxed);
                e.seq.store(c.seq + 1, Ordering::Relaxed);
            }
            recs.push(c);
        }
        slot = shim.claim_owned(&recs[0], in_flight_status::IN_CALL);
        if let (Some(cu), Slot::Owned(s)) = (cu, slot) {
            gpu = start_events(shim, cu, s, stream);
        }
    })
    .is_some();
    let rc = launch();
    if !prepared {
        return rc;
    }
    let _ = shielded(shim, || {
        let t = now_mono();
        for c in recs.iter_mut() {
            c.t_exit = t;
        }
        if rc != 0 {
            // Nothing ran; the seq numbers taken are a gap, as for a failed collective.
            shim.unclaim(slot);
            return;
        }
        hand_over(shim, gpu, slot, stream, &recs);
    });
    drop(guard);
    rc
}

// ----- the GPU poller ----------------------------------------------------------------------------

/// Starts the poller thread once.
pub fn start_poller(shim: &Shim) {
    if shim.nccl.poller_started.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(shim) = state::shim() else { return };
    let spawned = std::thread::Builder::new()
        .name("commscope-gpu".into())
        .spawn(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| poller(shim)));
            shim.nccl.poller_done.store(true, Ordering::Release);
        });
    if spawned.is_err() {
        shim.nccl.poller_done.store(true, Ordering::Release);
        util::warn(format_args!(
            "cannot start the GPU poller thread; NCCL calls are recorded without GPU times"
        ));
    }
}

/// Per-context mapping of GPU event time onto host `CLOCK_MONOTONIC`.
#[derive(Debug)]
struct Anchor {
    stream: Handle,
    event: Handle,
    /// Host-mono time of the anchor event; 0 until one was taken.
    host_ns: u64,
    taken_at: u64,
}

/// Re-anchor this often (`cuEventElapsedTime` is a float of milliseconds: keeping the distance
/// to the anchor short keeps it precise to well under a microsecond).
const ANCHOR_EVERY_NS: u64 = 2_000_000_000;
/// An anchor bracketed this tightly is taken at once; else the best of a few tries.
const ANCHOR_GOOD_NS: u64 = 20_000;
const ANCHOR_TRIES: usize = 4;

fn poller(shim: &'static Shim) {
    let busy_wait = Duration::from_micros(util::env_u64("COMMSCOPE_GPU_POLL_US", 500, 50, 100_000));
    let idle_wait = Duration::from_millis(5);
    let mut anchors: Vec<(Handle, Anchor)> = Vec::new();
    let mut current_ctx: Handle = 0;
    let mut last_async = 0u64;
    loop {
        let stopping = shim.stop.load(Ordering::Acquire) || state::life() != state::life::ACTIVE;
        let mut waiting = false;
        if let Some(cu) = cuda::get().filter(|_| shim.nccl.busy.load(Ordering::Relaxed) > 0) {
            for (i, slot) in shim.nccl.pending.iter().enumerate() {
                if !slot.ready.load(Ordering::Acquire) {
                    continue;
                }
                if !complete(shim, cu, i, slot, &mut anchors, &mut current_ctx) {
                    waiting = true;
                }
            }
        }
        let now = now_mono();
        if now.saturating_sub(last_async) >= 1_000_000_000 || stopping {
            last_async = now;
            poll_async_errors(shim);
            crate::profiler::sweep(now);
        }
        if stopping {
            return;
        }
        std::thread::sleep(if waiting { busy_wait } else { idle_wait });
    }
}

/// Completes pending slot `i` if its end event fired (or failed). False while it is pending.
fn complete(
    shim: &Shim,
    cu: &cuda::Cuda,
    i: usize,
    slot: &PendingSlot,
    anchors: &mut Vec<(Handle, Anchor)>,
    current_ctx: &mut Handle,
) -> bool {
    // SAFETY: `ready` was set with release ordering by the holder, who no longer touches it.
    let d = unsafe { &mut *slot.data.get() };
    if *current_ctx != d.ctx {
        if !cu.enter_poller_ctx(d.ctx) {
            return false;
        }
        *current_ctx = d.ctx;
    }
    let times = match cu.query(d.ev[1]) {
        Some(false) => return false,
        Some(true) => gpu_times(cu, d, anchors),
        // The work failed or the context is gone: the records keep their host times.
        None => None,
    };
    for c in d.calls.iter_mut() {
        if let Some((a, b)) = times {
            c.gpu_start = a;
            c.gpu_end = b;
        }
        shim.push_call(c);
    }
    d.calls.clear();
    slot.ready.store(false, Ordering::Release);
    shim.nccl.busy.fetch_sub(1, Ordering::Relaxed);
    shim.shm.in_flight_release(i);
    true
}

/// (start, end) of a completed event pair on the host-mono clock.
fn gpu_times(
    cu: &cuda::Cuda,
    d: &PendingData,
    anchors: &mut Vec<(Handle, Anchor)>,
) -> Option<(u64, u64)> {
    let now = now_mono();
    let pos = match anchors.iter().position(|(c, _)| *c == d.ctx) {
        Some(p) => p,
        None => {
            let stream = cu.create_stream()?;
            let event = cu.create_event()?;
            anchors.push((
                d.ctx,
                Anchor {
                    stream,
                    event,
                    host_ns: 0,
                    taken_at: 0,
                },
            ));
            anchors.len() - 1
        }
    };
    let a = &mut anchors[pos].1;
    if a.host_ns == 0 || now.saturating_sub(a.taken_at) >= ANCHOR_EVERY_NS {
        // The tightest of a few brackets: a preempted poller would widen one.
        let mut best: Option<(u64, u64)> = None;
        for _ in 0..ANCHOR_TRIES {
            if let Some((t, err)) = cu.anchor(a.event, a.stream)
                && best.is_none_or(|b| err < b.1)
            {
                best = Some((t, err));
            }
            if best.is_some_and(|b| b.1 <= ANCHOR_GOOD_NS) {
                break;
            }
        }
        let (t, _) = best?;
        a.host_ns = t;
        a.taken_at = now;
    }
    let to_start = cu.elapsed_ms(a.event, d.ev[0])?;
    let dur = cu.elapsed_ms(d.ev[0], d.ev[1])?.max(0.0);
    let start = a.host_ns as i128 + (f64::from(to_start) * 1e6) as i128;
    let start = start.max(1) as u64;
    Some((start, start + (f64::from(dur) * 1e6) as u64))
}

fn poll_async_errors(shim: &Shim) {
    let mut found = Vec::new();
    {
        // Held across the queries: a communicator is taken off this list (under the lock)
        // before the application's destroy or abort reaches NCCL.
        let live = shim.nccl.live.lock().unwrap_or_else(|p| p.into_inner());
        for l in live.iter().filter(|l| !l.reported) {
            let mut err: c_int = 0;
            // SAFETY: a live communicator (see above); a valid out-pointer.
            let rc = unsafe { real::poll_async_error(l.handle, &mut err) };
            if rc == result::SUCCESS && err != result::SUCCESS && err != result::IN_PROGRESS {
                found.push((l.handle, err));
            }
        }
    }
    for (h, err) in found {
        shim.nccl_async_error(h, err);
    }
}

/// Stops the poller at shutdown, letting it write what completed; waits at most `wait`.
pub fn stop(shim: &Shim, wait: Duration) {
    if !shim.nccl.poller_started.load(Ordering::Acquire) {
        return;
    }
    let deadline = std::time::Instant::now() + wait;
    while !shim.nccl.poller_done.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ----- wrappers: communicators -------------------------------------------------------------------

/// Records a communicator made from a unique id (InitRank, InitRankConfig, InitRankScalable).
///
/// # Safety
/// `comm` and `config` are the application's arguments after the real call returned `rc`.
unsafe fn after_init(
    comm: *mut NComm,
    nranks: c_int,
    rank: c_int,
    id: &UniqueId,
    config: CP,
    rc: c_int,
) {
    let hash = nccl_hash::init_comm_hash(hash_version(), &id.internal);
    ensure_active(rank, nranks, hash);
    let Some((shim, _g)) = active() else { return };
    // SAFETY: per the contract.
    let name = unsafe { config_name(config) };
    shielded(shim, || {
        // SAFETY: `comm` is the application's out-pointer, written by NCCL on success.
        let h = if comm.is_null() { 0 } else { unsafe { *comm } };
        if (rc == result::SUCCESS || rc == result::IN_PROGRESS) && h != 0 {
            let dev = if rc == result::SUCCESS && GROUP_DEPTH.with(Cell::get) == 0 {
                comm_device(h)
            } else {
                current_device()
            };
            shim.nccl_created(h, hash, 0, rank, nranks, false, name.as_deref(), dev);
        } else {
            shim.nccl_init_failed(hash, 0, rank, nranks, rc);
        }
    });
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NComm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> c_int {
    let Some(hook) = enter_hook() else {
        // SAFETY: pass-through of the caller's arguments.
        return unsafe { real::comm_init_rank(comm, nranks, id, rank) };
    };
    // SAFETY: pass-through of the application's arguments.
    let rc = unsafe { real::comm_init_rank(comm, nranks, id, rank) };
    drop(hook);
    // SAFETY: the arguments after the real call.
    unsafe { after_init(comm, nranks, rank, &id, std::ptr::null(), rc) };
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut NComm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: P,
) -> c_int {
    let Some(hook) = enter_hook() else {
        // SAFETY: pass-through.
        return unsafe { real::comm_init_rank_config(comm, nranks, id, rank, config) };
    };
    // SAFETY: pass-through of the application's arguments.
    let rc = unsafe { real::comm_init_rank_config(comm, nranks, id, rank, config) };
    drop(hook);
    // SAFETY: the arguments after the real call.
    unsafe { after_init(comm, nranks, rank, &id, config, rc) };
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    comm: *mut NComm,
    nranks: c_int,
    rank: c_int,
    nid: c_int,
    ids: *mut UniqueId,
    config: P,
) -> c_int {
    let Some(hook) = enter_hook() else {
        // SAFETY: pass-through.
        return unsafe { real::comm_init_rank_scalable(comm, nranks, rank, nid, ids, config) };
    };
    // SAFETY: pass-through of the application's arguments.
    let rc = unsafe { real::comm_init_rank_scalable(comm, nranks, rank, nid, ids, config) };
    drop(hook);
    if !ids.is_null() && nid > 0 {
        // SAFETY: NCCL hashes the first of the `nid` ids the caller passed.
        let first = unsafe { *ids };
        // SAFETY: the arguments after the real call.
        unsafe { after_init(comm, nranks, rank, &first, config, rc) };
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> c_int {
    // SAFETY: pass-through of the caller's argument.
    let rc = unsafe { real::get_unique_id(id) };
    // Inside ncclCommInitAll (NCCL calls this export itself): keep the id it drew.
    if rc == result::SUCCESS && !id.is_null() && CAPTURING_INIT_ALL.with(Cell::get) {
        // SAFETY: NCCL just wrote the id.
        INIT_ALL_ID.with(|c| c.set(Some(unsafe { *id })));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut NComm,
    ndev: c_int,
    devlist: *const c_int,
) -> c_int {
    let Some(hook) = enter_hook() else {
        // SAFETY: pass-through.
        return unsafe { real::comm_init_all(comms, ndev, devlist) };
    };
    CAPTURING_INIT_ALL.with(|c| c.set(true));
    INIT_ALL_ID.with(|c| c.set(None));
    // SAFETY: pass-through of the application's arguments.
    let rc = unsafe { real::comm_init_all(comms, ndev, devlist) };
    CAPTURING_INIT_ALL.with(|c| c.set(false));
    drop(hook);
    let id = INIT_ALL_ID.with(Cell::take);
    let hash = id.map(|id| nccl_hash::init_comm_hash(hash_version(), &id.internal));
    ensure_active(0, ndev, hash.unwrap_or(0));
    let Some((shim, _g)) = active() else {
        return rc;
    };
    shielded(shim, || {
        if rc != result::SUCCESS || comms.is_null() {
            shim.nccl_init_failed(hash.unwrap_or(0), 0, -1, ndev, rc);
            return;
        }
        for i in 0..ndev.max(0) as usize {
            // SAFETY: NCCL filled `ndev` communicators.
            let h = unsafe { *comms.add(i) };
            if h == 0 {
                continue;
            }
            let mut r: c_int = i as c_int;
            // SAFETY: a valid out-pointer and an initialized communicator.
            unsafe { real::comm_user_rank(h, &mut r) };
            match hash {
                Some(x) => shim.nccl_created(h, x, 0, r, ndev, false, None, comm_device(h)),
                None => {
                    // The id NCCL drew was not seen: a process-local id, flagged.
                    let id = local_id(shim, h);
                    shim.nccl_created(h, id, 0, r, ndev, true, None, comm_device(h));
                }
            }
        }
    });
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommSplit(
    comm: NComm,
    color: c_int,
    key: c_int,
    newcomm: *mut NComm,
    config: P,
) -> c_int {
    let Some((shim, _g)) = active() else {
        // SAFETY: pass-through.
        return unsafe { real::comm_split(comm, color, key, newcomm, config) };
    };
    // Every split call on a parent counts, NCCL_SPLIT_NOCOLOR included.
    let parent = shielded(shim, || {
        shim.nccl_comm(comm).map(|e| {
            let n = e.children.fetch_add(1, Ordering::Relaxed) + 1;
            (e.id.load(Ordering::Relaxed), n as i32)
        })
    })
    .flatten();
    // SAFETY: pass-through of the application's arguments (the guard stays held: NCCL's own
    // calls inside pass through).
    let rc = unsafe { real::comm_split(comm, color, key, newcomm, config) };
    // SAFETY: the application's config.
    let name = unsafe { config_name(config) };
    shielded(shim, || {
        let Some((pid, count)) = parent else { return };
        let id = nccl_hash::split_comm_hash(hash_version(), pid, count, color);
        // SAFETY: NCCL writes the new communicator (or NULL) on success.
        let h = if newcomm.is_null() {
            0
        } else {
            unsafe { *newcomm }
        };
        if rc != result::SUCCESS && rc != result::IN_PROGRESS {
            if color != SPLIT_NOCOLOR {
                shim.nccl_init_failed(id, pid, -1, 0, rc);
            }
            return;
        }
        if color == SPLIT_NOCOLOR || h == 0 {
            return;
        }
        let (mut r, mut n) = (-1, 0);
        if rc == result::SUCCESS {
            // SAFETY: valid out-pointers, an initialized communicator.
            unsafe {
                real::comm_user_rank(h, &mut r);
                real::comm_count(h, &mut n);
            }
        }
        let dev = if rc == result::SUCCESS {
            comm_device(h)
        } else {
            current_device()
        };
        shim.nccl_created(h, id, pid, r, n, false, name.as_deref(), dev);
    });
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommShrink(
    comm: NComm,
    exclude: *mut c_int,
    nexclude: c_int,
    newcomm: *mut NComm,
    config: P,
    shrink_flags: c_int,
) -> c_int {
    let Some((shim, _g)) = active() else {
        // SAFETY: pass-through.
        return unsafe {
            real::comm_shrink(comm, exclude, nexclude, newcomm, config, shrink_flags)
        };
    };
    let parent = shielded(shim, || {
        shim.nccl_comm(comm).map(|e| e.id.load(Ordering::Relaxed))
    })
    .flatten();
    // SAFETY: pass-through of the application's arguments.
    let rc = unsafe { real::comm_shrink(comm, exclude, nexclude, newcomm, config, shrink_flags) };
    // SAFETY: the application's config.
    let name = unsafe { config_name(config) };
    shielded(shim, || {
        let Some(pid) = parent else { return };
        let id = nccl_hash::shrink_comm_hash(pid);
        // SAFETY: NCCL writes the new communicator (or NULL) on success.
        let h = if newcomm.is_null() {
            0
        } else {
            unsafe { *newcomm }
        };
        if rc != result::SUCCESS && rc != result::IN_PROGRESS {
            shim.nccl_init_failed(id, pid, -1, 0, rc);
            return;
        }
        if h == 0 {
            return; // an excluded rank gets no communicator
        }
        let (mut r, mut n) = (-1, 0);
        if rc == result::SUCCESS {
            // SAFETY: valid out-pointers, an initialized communicator.
            unsafe {
                real::comm_user_rank(h, &mut r);
                real::comm_count(h, &mut n);
            }
        }
        shim.nccl_created(h, id, pid, r, n, false, name.as_deref(), comm_device(h));
    });
    rc
}

/// Takes a communicator off the async-error list before NCCL frees it.
fn forget_live(shim: &Shim, comm: NComm) {
    let mut live = shim.nccl.live.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|l| l.handle != comm);
}

/// The end of a communicator: destroy or abort.
fn comm_gone(comm: NComm, f: impl FnOnce() -> c_int) -> c_int {
    let Some((shim, _g)) = active() else {
        return f();
    };
    let _ = shielded(shim, || forget_live(shim, comm));
    let rc = f();
    if state::life() == state::life::ACTIVE {
        shielded(shim, || {
            if let Some(e) = shim.nccl.comms.get(comm as u64) {
                shim.nccl_comm_record(CommEvent::Freed, e, 0, None, -1, 0);
            }
            shim.nccl.comms.remove(comm as u64);
        });
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommDestroy(comm: NComm) -> c_int {
    // SAFETY: pass-through of the application's argument.
    comm_gone(comm, || unsafe { real::comm_destroy(comm) })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommAbort(comm: NComm) -> c_int {
    // SAFETY: pass-through of the application's argument.
    comm_gone(comm, || unsafe { real::comm_abort(comm) })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommFinalize(comm: NComm) -> c_int {
    // SAFETY: pass-through of the application's argument.
    unsafe { real::comm_finalize(comm) }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: NComm, err: *mut c_int) -> c_int {
    // SAFETY: pass-through of the caller's arguments.
    let rc = unsafe { real::comm_get_async_error(comm, err) };
    if rc == result::SUCCESS
        && !err.is_null()
        && let Some((shim, _g)) = active()
    {
        // SAFETY: NCCL wrote the state.
        let e = unsafe { *err };
        if e != result::SUCCESS && e != result::IN_PROGRESS {
            shielded(shim, || shim.nccl_async_error(comm, e));
        }
    }
    rc
}

// ----- wrappers: groups --------------------------------------------------------------------------

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclGroupStart() -> c_int {
    if !in_hook() {
        GROUP_DEPTH.with(|d| d.set(d.get() + 1));
    }
    // SAFETY: no arguments.
    unsafe { real::group_start() }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclGroupEnd() -> c_int {
    if in_hook() {
        // SAFETY: no arguments.
        return unsafe { real::group_end() };
    }
    let depth = GROUP_DEPTH.with(Cell::get);
    if depth == 0 {
        // Unbalanced: NCCL reports it.
        // SAFETY: no arguments.
        return unsafe { real::group_end() };
    }
    GROUP_DEPTH.with(|d| d.set(depth - 1));
    if depth > 1 {
        // SAFETY: no arguments.
        return unsafe { real::group_end() };
    }
    let mut members = GROUP.with(|g| std::mem::take(&mut *g.borrow_mut()));
    let rc = match active() {
        Some((shim, guard)) if !members.is_empty() => group_end_recorded(shim, guard, &mut members),
        // SAFETY: no arguments.
        _ => unsafe { real::group_end() },
    };
    members.clear();
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.capacity() < members.capacity() {
            *g = members;
        }
    });
    rc
}

/// Streams of one group that get their own event pair (more are recorded with host times).
const GROUP_STREAMS_MAX: usize = 16;

fn group_end_recorded(shim: &'static Shim, guard: Guard, members: &mut [Member]) -> c_int {
    // (stream, in-flight slot, pending slot with a start event)
    let mut streams: Vec<(Stream, Slot, Option<usize>)> = Vec::new();
    let prepared = shielded(shim, || {
        let cu = cuda::get();
        for m in members.iter_mut() {
            if streams.iter().any(|s| s.0 == m.stream) {
                continue;
            }
            if streams.len() >= GROUP_STREAMS_MAX {
                break;
            }
            let captured = cu.is_some_and(|c| c.capturing(m.stream));
            let slot = shim.claim_owned(&m.call, in_flight_status::IN_CALL);
            let gpu = match (cu, slot) {
                (Some(c), Slot::Owned(s)) if !captured => start_events(shim, c, s, m.stream),
                _ => None,
            };
            streams.push((m.stream, slot, gpu));
        }
        for m in members.iter_mut() {
            if cu.is_some_and(|c| c.capturing(m.stream)) {
                m.call.flags |= flags::GRAPH_CAPTURED;
            }
        }
    })
    .is_some();
    // SAFETY: no arguments.
    let rc = unsafe { real::group_end() };
    if !prepared {
        return rc;
    }
    let _ = shielded(shim, || {
        let t = now_mono();
        for m in members.iter_mut() {
            // The group's operations are handed to the GPU at its end.
            m.call.t_exit = t;
            if rc != result::SUCCESS && rc != result::IN_PROGRESS && m.call.status == 0 {
                m.call.status = rc;
            }
        }
        if rc == result::SUCCESS {
            for m in members
                .iter()
                .filter(|m| m.call.flags & flags::GRAPH_CAPTURED != 0)
            {
                crate::graphs::captured(m.stream, m.comm, &m.call);
            }
        }
        let mut calls: Vec<Call> = Vec::new();
        for (stream, slot, gpu) in &streams {
            calls.clear();
            calls.extend(
                members
                    .iter()
                    .filter(|m| m.stream == *stream)
                    .map(|m| m.call),
            );
            hand_over(
                shim,
                gpu.filter(|_| rc == result::SUCCESS),
                *slot,
                *stream,
                &calls,
            );
        }
        // Streams past the limit.
        for m in members
            .iter()
            .filter(|m| !streams.iter().any(|s| s.0 == m.stream))
        {
            shim.push_call(&m.call);
        }
    });
    drop(guard);
    rc
}

// ----- wrappers: collectives and point-to-point --------------------------------------------------

macro_rules! record {
    ($begin:expr, $call:expr) => {
        match $begin {
            // SAFETY: pass-through of the application's arguments.
            Some(r) => end(r, unsafe { $call }),
            // SAFETY: as above.
            None => unsafe { $call },
        }
    };
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclAllReduce(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Allreduce, n, dt, -1, st, None),
        real::all_reduce(s, r, n, dt, op, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclBroadcast(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Broadcast, n, dt, root, st, None),
        real::broadcast(s, r, n, dt, root, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclBcast(
    b: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Broadcast, n, dt, root, st, None),
        real::bcast(b, n, dt, root, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclReduce(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Reduce, n, dt, root, st, None),
        real::reduce(s, r, n, dt, op, root, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclAllGather(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Allgather, n, dt, -1, st, None),
        real::all_gather(s, r, n, dt, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclReduceScatter(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Reducescatter, n, dt, -1, st, None),
        real::reduce_scatter(s, r, n, dt, op, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclAlltoAll(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Alltoall, n, dt, -1, st, None),
        real::all_to_all(s, r, n, dt, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclGather(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Gather, n, dt, root, st, None),
        real::gather(s, r, n, dt, root, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclScatter(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Scatter, n, dt, root, st, None),
        real::scatter(s, r, n, dt, root, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclSend(
    s: CP,
    n: usize,
    dt: c_int,
    peer: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Send, n, dt, peer, st, Some(Dir::Send)),
        real::send(s, n, dt, peer, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclRecv(
    r: P,
    n: usize,
    dt: c_int,
    peer: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Recv, n, dt, peer, st, Some(Dir::Recv)),
        real::recv(r, n, dt, peer, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclAllReduceConfig(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    comm: NComm,
    st: Stream,
    cfg: CP,
) -> c_int {
    record!(
        begin(comm, Op::Allreduce, n, dt, -1, st, None),
        real::all_reduce_config(s, r, n, dt, op, comm, st, cfg)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclBroadcastConfig(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
    cfg: CP,
) -> c_int {
    record!(
        begin(comm, Op::Broadcast, n, dt, root, st, None),
        real::broadcast_config(s, r, n, dt, root, comm, st, cfg)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclReduceConfig(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
    cfg: CP,
) -> c_int {
    record!(
        begin(comm, Op::Reduce, n, dt, root, st, None),
        real::reduce_config(s, r, n, dt, op, root, comm, st, cfg)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclAllGatherConfig(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    comm: NComm,
    st: Stream,
    cfg: CP,
) -> c_int {
    record!(
        begin(comm, Op::Allgather, n, dt, -1, st, None),
        real::all_gather_config(s, r, n, dt, comm, st, cfg)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclReduceScatterConfig(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    comm: NComm,
    st: Stream,
    cfg: CP,
) -> c_int {
    record!(
        begin(comm, Op::Reducescatter, n, dt, -1, st, None),
        real::reduce_scatter_config(s, r, n, dt, op, comm, st, cfg)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclAlltoAllConfig(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    comm: NComm,
    st: Stream,
    cfg: CP,
) -> c_int {
    record!(
        begin(comm, Op::Alltoall, n, dt, -1, st, None),
        real::all_to_all_config(s, r, n, dt, comm, st, cfg)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclGatherConfig(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
    cfg: CP,
) -> c_int {
    record!(
        begin(comm, Op::Gather, n, dt, root, st, None),
        real::gather_config(s, r, n, dt, root, comm, st, cfg)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclScatterConfig(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
    cfg: CP,
) -> c_int {
    record!(
        begin(comm, Op::Scatter, n, dt, root, st, None),
        real::scatter_config(s, r, n, dt, root, comm, st, cfg)
    )
}
