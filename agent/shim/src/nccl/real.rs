//! Finding NCCL's real functions (`pncclX`, else the real `ncclX`), wherever it was loaded.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{CStr, c_char, c_int, c_void};

use super::*;

/// A real NCCL function, declared by its `pncclX` twin.
pub(super) type Real = crate::resolve::Real;

/// The public name of a twin (`pncclX` → `ncclX`).
pub(super) fn plain(twin: &'static CStr) -> &'static CStr {
    CStr::from_bytes_with_nul(&twin.to_bytes_with_nul()[1..]).unwrap_or(twin)
}

/// Resolves `pncclX`, else the real `ncclX`, wherever the library was loaded (in the global
/// scope or privately, as a dependency of an `RTLD_LOCAL` object): never this library's wrapper.
pub(super) fn resolve(twin: &'static CStr) -> *mut c_void {
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
    (@address forward $real:ident, $twin:literal) => {
        match $real.get() {
            0 => crate::resolve::undefined(plain($twin)),
            p => p,
        }
    };
    (@address own $real:ident, $twin:literal) => {
        match $real.get() {
            0 => return result::INTERNAL_ERROR,
            p => p,
        }
    };
    (@def $mode:ident $(fn $name:ident = $twin:literal ($($arg:ident: $ty:ty),* $(,)?);)*) => {
        $(
            #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) -> c_int {
                static REAL: Real = Real::with($twin, resolve);
                let p = real!(@address $mode REAL, $twin);
                // SAFETY: `p` is the NCCL library's function of this name, whose C signature is
                // the one declared here (handles and enums as machine words / ints).
                let f: unsafe extern "C" fn($($ty),*) -> c_int = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller passes valid arguments (the application's own, or the shim's).
                unsafe { f($($arg),*) }
            }
        )*
    };
    (forward { $($forward:tt)* } own { $($own:tt)* }) => {
        real!(@def forward $($forward)*);
        real!(@def own $($own)*);
    };
}

// The real NCCL functions.
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
/// `ncclGetLastError(comm)`: the library's text for its last error (empty when none).
pub(super) fn last_error(comm: NComm) -> Vec<u8> {
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
