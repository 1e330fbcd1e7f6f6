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

//!
//! Modules: [`real`] (finding NCCL's functions), [`identity`] (communicator ids, activation),
//! [`record`] (a call's record and its CUDA events), [`poller`] (the GPU poller thread),
//! [`comms`], [`groups`] and [`calls`] (the exported wrappers).

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::cell::{Cell, RefCell, UnsafeCell};
use std::ffi::{CStr, c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};

use commscope_wire::op::lib;
use commscope_wire::record::Call;

use crate::cuda::Handle;
use crate::tables::CommTable;

pub mod calls;
pub mod comms;
pub mod groups;
pub mod identity;
pub mod poller;
pub mod real;
pub mod record;

pub use poller::{start_poller, stop};
use real::{Real, resolve};
pub use record::{count_is_per_rank, replay};

/// `ncclComm_t`, `cudaStream_t`: pointers, kept as machine words.
pub(super) type NComm = usize;
pub(super) type Stream = usize;
pub(super) type CP = *const c_void;
pub(super) type P = *mut c_void;

/// `ncclResult_t` values the shim looks at.
pub mod result {
    pub const SUCCESS: i32 = 0;
    pub const INTERNAL_ERROR: i32 = 3;
    pub const IN_PROGRESS: i32 = 7;
}

/// `NCCL_SPLIT_NOCOLOR`.
pub(super) const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_API_MAGIC`, the first word of an initialized `ncclConfig_t` after its size.
pub(super) const CONFIG_MAGIC: u32 = 0xcafe_beef;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

// ----- library facts -----------------------------------------------------------------------------

pub(super) static VERSION: AtomicI32 = AtomicI32::new(0);
pub(super) static LIB: AtomicU8 = AtomicU8::new(u8::MAX);

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

pub use commscope_wire::op::nccl_dtype as dtype_info;

// ----- process-wide NCCL state -------------------------------------------------------------------

/// Work handed to the GPU poller: owned by whoever holds in-flight slot `i` (the wrapper that
/// claimed it, then — once `ready` — the poller, which frees the slot when done).
#[derive(Debug, Default)]
pub(super) struct PendingData {
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
pub(super) struct Live {
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
pub(super) struct Member {
    call: Call,
    stream: Stream,
    comm: NComm,
}
