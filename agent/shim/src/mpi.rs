//! The MPI entry points commscope wraps. Each forwards to its `PMPI_*` twin; while recording,
//! it stamps the time, keeps the in-flight table current and writes one record.
//!
//! Data volume (`bytes`) per op follows nccl-tests' "size": the whole buffer for
//! allreduce/broadcast/reduce/scan, the gathered or scattered total (per-rank part × ranks) for
//! allgather/gather/scatter/alltoall/reducescatter, the sum of the counts for v-variants where this
//! rank knows them, and the bytes sent for point-to-point.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

use commscope_wire::hash::{self, domain};
use commscope_wire::op::{Op, dtype, flags};
use commscope_wire::record::{Call, CommEvent, EXIT_STATUS_UNKNOWN};
use commscope_wire::shm::{Counter, in_flight_status};

use crate::abi::{H, STATUS_MAX, pmpi};
use crate::state::{Begun, Shim, Slot, activate, active_mpi, life, shielded, shutdown};
use crate::tables::{CommEntry, CommInfo, Dir, Pending, comm_flags};
use crate::util::now_mono;

type P = *mut c_void;
type CP = *const c_void;
type IP = *const c_int;

pmpi! {
    fn PMPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int;
    fn PMPI_Init_thread(argc: *mut c_int, argv: *mut *mut *mut c_char, required: c_int, provided: *mut c_int) -> c_int;
    fn PMPI_Finalize() -> c_int;
    fn PMPI_Abort(comm: H, code: c_int) -> c_int;

    fn PMPI_Barrier(comm: H) -> c_int;
    fn PMPI_Bcast(buf: P, count: c_int, dt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Reduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Allreduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Allgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H) -> c_int;
    fn PMPI_Allgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H) -> c_int;
    fn PMPI_Gather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Gatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Scatter(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Scatterv(sbuf: CP, scounts: IP, displs: IP, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Reduce_scatter(sbuf: CP, rbuf: P, rcounts: IP, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Reduce_scatter_block(sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Alltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H) -> c_int;
    fn PMPI_Alltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H) -> c_int;
    fn PMPI_Alltoallw(sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H) -> c_int;
    fn PMPI_Scan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Exscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H) -> c_int;

    fn PMPI_Ibarrier(comm: H, req: P) -> c_int;
    fn PMPI_Ibcast(buf: P, count: c_int, dt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Iallreduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Iallgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Iallgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Igather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Igatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Iscatter(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Iscatterv(sbuf: CP, scounts: IP, displs: IP, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce_scatter(sbuf: CP, rbuf: P, rcounts: IP, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce_scatter_block(sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoallw(sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H, req: P) -> c_int;
    fn PMPI_Iscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Iexscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P) -> c_int;

    fn PMPI_Send(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Ssend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Bsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Rsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Recv(buf: P, count: c_int, dt: H, src: c_int, tag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Isend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Issend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Irecv(buf: P, count: c_int, dt: H, src: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Sendrecv(sbuf: CP, scount: c_int, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: c_int, rt: H, src: c_int, rtag: c_int, comm: H, status: P) -> c_int;

    fn PMPI_Sendrecv_replace(buf: P, count: c_int, dt: H, dest: c_int, stag: c_int, src: c_int, rtag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Send_init(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ssend_init(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Bsend_init(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Rsend_init(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Recv_init(buf: P, count: c_int, dt: H, src: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Start(req: P) -> c_int;
    fn PMPI_Startall(n: c_int, reqs: P) -> c_int;

    fn PMPI_Wait(req: P, status: P) -> c_int;
    fn PMPI_Waitall(n: c_int, reqs: P, statuses: P) -> c_int;
    fn PMPI_Waitany(n: c_int, reqs: P, index: *mut c_int, status: P) -> c_int;
    fn PMPI_Waitsome(n: c_int, reqs: P, outcount: *mut c_int, indices: *mut c_int, statuses: P) -> c_int;
    fn PMPI_Test(req: P, flag: *mut c_int, status: P) -> c_int;
    fn PMPI_Testall(n: c_int, reqs: P, flag: *mut c_int, statuses: P) -> c_int;
    fn PMPI_Testany(n: c_int, reqs: P, index: *mut c_int, flag: *mut c_int, status: P) -> c_int;
    fn PMPI_Testsome(n: c_int, reqs: P, outcount: *mut c_int, indices: *mut c_int, statuses: P) -> c_int;
    fn PMPI_Request_free(req: P) -> c_int;

    fn PMPI_Comm_split(comm: H, color: c_int, key: c_int, newcomm: P) -> c_int;
    fn PMPI_Comm_split_type(comm: H, kind: c_int, key: c_int, info: H, newcomm: P) -> c_int;
    fn PMPI_Comm_dup(comm: H, newcomm: P) -> c_int;
    fn PMPI_Comm_dup_with_info(comm: H, info: H, newcomm: P) -> c_int;
    fn PMPI_Comm_idup(comm: H, newcomm: P, req: P) -> c_int;
    fn PMPI_Comm_create(comm: H, group: H, newcomm: P) -> c_int;
    fn PMPI_Comm_create_group(comm: H, group: H, tag: c_int, newcomm: P) -> c_int;
    fn PMPI_Cart_create(comm: H, ndims: c_int, dims: IP, periods: IP, reorder: c_int, newcomm: P) -> c_int;
    fn PMPI_Cart_sub(comm: H, remain: IP, newcomm: P) -> c_int;
    fn PMPI_Graph_create(comm: H, nnodes: c_int, index: IP, edges: IP, reorder: c_int, newcomm: P) -> c_int;
    fn PMPI_Dist_graph_create(comm: H, n: c_int, sources: IP, degrees: IP, dests: IP, weights: IP, info: H, reorder: c_int, newcomm: P) -> c_int;
    fn PMPI_Dist_graph_create_adjacent(comm: H, indeg: c_int, sources: IP, sweights: IP, outdeg: c_int, dests: IP, dweights: IP, info: H, reorder: c_int, newcomm: P) -> c_int;
    fn PMPI_Intercomm_create(local: H, local_leader: c_int, peer: H, remote_leader: c_int, tag: c_int, newcomm: P) -> c_int;
    fn PMPI_Intercomm_merge(inter: H, high: c_int, newcomm: P) -> c_int;
    fn PMPI_Comm_free(comm: P) -> c_int;
    fn PMPI_Comm_disconnect(comm: P) -> c_int;
    fn PMPI_Comm_set_name(comm: H, name: *const c_char) -> c_int;
}

// ----- lifecycle ---------------------------------------------------------------------------------

/// `void commscope_step(unsigned long long step)`: the application marks the start of training
/// step `step`. Recorded as a `process` record (event `step`), so the analyzer uses the real step
/// period instead of inferring it. Programs declare it weak and call it only when it resolves:
/// `extern void commscope_step(unsigned long long) __attribute__((weak));`
/// `if (commscope_step) commscope_step(n);` — without the shim, nothing happens.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn commscope_step(step: u64) {
    let Some((shim, _guard)) = active_mpi() else {
        return;
    };
    shielded(shim, || shim.push_step(step));
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int {
    // SAFETY: the application's arguments, passed through.
    let rc = unsafe { PMPI_Init(argc, argv) };
    if rc == 0 {
        activate();
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Init_thread(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    // SAFETY: the application's arguments, passed through.
    let rc = unsafe { PMPI_Init_thread(argc, argv, required, provided) };
    if rc == 0 {
        activate();
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Finalize() -> c_int {
    if crate::state::life() == life::ACTIVE {
        let _ = std::panic::catch_unwind(|| shutdown(true, EXIT_STATUS_UNKNOWN));
    }
    // SAFETY: no arguments.
    unsafe { PMPI_Finalize() }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Abort(comm: H, code: c_int) -> c_int {
    if crate::state::life() == life::ACTIVE {
        let _ = std::panic::catch_unwind(|| shutdown(false, code));
    }
    // SAFETY: the application's arguments, passed through.
    unsafe { PMPI_Abort(comm, code) }
}

// ----- helpers -----------------------------------------------------------------------------------

/// (size, rank, intercomm) of a communicator entry.
fn shape(e: Option<&CommEntry>) -> (u64, i32, bool) {
    match e {
        Some(e) => {
            let inter = e.flags.load(Ordering::Relaxed) & comm_flags::INTERCOMM != 0;
            let n = if inter {
                e.remote_size.load(Ordering::Relaxed)
            } else {
                e.size.load(Ordering::Relaxed)
            };
            (n.max(0) as u64, e.rank.load(Ordering::Relaxed), inter)
        }
        None => (0, -1, false),
    }
}

/// What a wrapper tells the recorder about a collective.
struct CollInfo {
    bytes: u64,
    count: u64,
    dtype: u16,
    root: i32,
    flags: u16,
}

impl Shim {
    fn dt(&self, h: H) -> u16 {
        self.type_info(h).1
    }
    fn in_place(&self, p: CP) -> u16 {
        if p as usize == self.abi.in_place {
            flags::IN_PLACE
        } else {
            0
        }
    }
    fn root_is_me(&self, root: c_int, me: i32, inter: bool) -> bool {
        if inter {
            root == self.abi.root
        } else {
            root == me
        }
    }
    fn root_value(&self, root: c_int) -> i32 {
        self.abi.rank_value(root)
    }

    /// Records a collective around `real`.
    #[inline(always)]
    fn coll(
        &self,
        comm: H,
        op: Op,
        info: impl FnOnce(&Shim, u64, i32, bool) -> CollInfo,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let e = self.comm(comm);
            let (n, me, inter) = shape(e);
            let i = info(self, n, me, inter);
            self.begin_coll(e, op, i.bytes, i.count, i.dtype, i.root, i.flags)
        });
        let rc = real();
        if let Some(b) = b {
            shielded(self, || self.finish(b.call, b.slot, rc));
        }
        rc
    }

    /// Records a nonblocking collective around `real`, which writes `req`.
    #[inline(always)]
    fn icoll(
        &self,
        comm: H,
        op: Op,
        req: P,
        info: impl FnOnce(&Shim, u64, i32, bool) -> CollInfo,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let e = self.comm(comm);
            let (n, me, inter) = shape(e);
            let i = info(self, n, me, inter);
            self.begin_coll(
                e,
                op,
                i.bytes,
                i.count,
                i.dtype,
                i.root,
                i.flags | flags::NONBLOCKING,
            )
        });
        let rc = real();
        if let Some(b) = b {
            shielded(self, || self.posted(b, rc, req, false, 0));
        }
        rc
    }

    /// A nonblocking call was posted: remember it under its request handle.
    fn posted(&self, b: Begun, rc: c_int, req: P, seq_at_completion: bool, dt: H) {
        if rc != 0 || req.is_null() {
            self.finish(b.call, b.slot, rc);
            return;
        }
        // SAFETY: MPI wrote the request handle to `req`.
        let h = unsafe { self.abi.read_handle(req) };
        self.mark_posted(&b);
        let p = Pending {
            call: b.call,
            slot: b.slot,
            seq_at_completion,
            comm: 0,
            dtype: dt as u64,
        };
        if !self.requests.insert(h, p) {
            self.shm.count(Counter::DroppedRequests, 1);
            let mut c = p.call;
            c.flags |= flags::UNTRACKED;
            self.finish(c, p.slot, 0);
        }
    }

    /// A request completed: write its record. `st` is its status (or null).
    fn completed(&self, h: u64, st: *const u8, rc: c_int) {
        let Some(p) = self.requests.take(h) else {
            return;
        };
        let mut call = p.call;
        let op = Op::from_code(call.op);
        if op == Op::Recv && !st.is_null() {
            // SAFETY: `st` is a status of the loaded flavour written by MPI.
            unsafe { self.complete_recv(&mut call, st, p.seq_at_completion, p.dtype as H) };
        }
        self.finish(call, p.slot, rc);
    }

    /// Records a blocking send.
    fn send(
        &self,
        fl: u16,
        buf_count: i64,
        dt: H,
        dest: c_int,
        tag: c_int,
        comm: H,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let count = cnt(buf_count);
            self.begin_p2p(
                comm,
                Op::Send,
                dest,
                tag,
                count * self.type_size(dt),
                count,
                self.dt(dt),
                fl,
                Dir::Send,
            )
        });
        let rc = real();
        if let Some(b) = b {
            shielded(self, || self.finish(b.call, b.slot, rc));
        }
        rc
    }

    /// Records a nonblocking send or receive.
    fn ip2p(
        &self,
        op: Op,
        fl: u16,
        count: i64,
        dt: H,
        peer: c_int,
        tag: c_int,
        comm: H,
        req: P,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let dir = if op == Op::Recv { Dir::Recv } else { Dir::Send };
        let b = shielded(self, || {
            let count = cnt(count);
            self.begin_p2p(
                comm,
                op,
                peer,
                tag,
                count * self.type_size(dt),
                count,
                self.dt(dt),
                fl | flags::NONBLOCKING,
                dir,
            )
        });
        let rc = real();
        if let Some(b) = b {
            let later =
                dir == Dir::Recv && b.call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) != 0;
            let recv_type = if dir == Dir::Recv { dt } else { 0 };
            shielded(self, || self.posted(b, rc, req, later, recv_type));
        }
        rc
    }
}

/// Sum of `n` counts (0 when the array is absent).
///
/// # Safety
/// `counts` must be null or point to `n` counts.
unsafe fn sum<T: Copy + Into<i64>>(counts: *const T, n: u64) -> u64 {
    if counts.is_null() {
        return 0;
    }
    // SAFETY: per the contract.
    (0..n as usize)
        .map(|i| cnt(unsafe { *counts.add(i) }))
        .sum()
}

/// A count (`int`, or `MPI_Count` in the large-count `_c` calls) as an unsigned size.
fn cnt(c: impl Into<i64>) -> u64 {
    c.into().max(0) as u64
}

// ----- blocking collectives ----------------------------------------------------------------------

macro_rules! real_or {
    ($call:expr) => {
        match active_mpi() {
            Some(x) => x,
            // SAFETY: pass-through of the application's arguments.
            None => return unsafe { $call },
        }
    };
}

fn reduce_info(s: &Shim, sbuf: CP, count: impl Into<i64> + Copy, dt: H, root: i32) -> CollInfo {
    CollInfo {
        bytes: cnt(count) * s.type_size(dt),
        count: cnt(count),
        dtype: s.dt(dt),
        root,
        flags: s.in_place(sbuf),
    }
}

/// Per-rank part × ranks, measured on the receive side.
fn gathered(s: &Shim, sbuf: CP, rcount: impl Into<i64> + Copy, rt: H, n: u64) -> CollInfo {
    CollInfo {
        bytes: cnt(rcount) * s.type_size(rt) * n,
        count: cnt(rcount) * n,
        dtype: s.dt(rt),
        root: -1,
        flags: s.in_place(sbuf),
    }
}

fn gatherv_info<T: Copy + Into<i64>>(
    s: &Shim,
    sbuf: CP,
    rcounts: *const T,
    rt: H,
    n: u64,
) -> CollInfo {
    // SAFETY: MPI requires `rcounts` to hold one count per rank here.
    let c = unsafe { sum(rcounts, n) };
    CollInfo {
        bytes: c * s.type_size(rt),
        count: c,
        dtype: s.dt(rt),
        root: -1,
        flags: s.in_place(sbuf),
    }
}

/// Gather/scatter: the root knows the total; other ranks know their part × ranks.
fn rooted_info<C: Copy + Into<i64>>(
    s: &Shim,
    root: c_int,
    me: i32,
    inter: bool,
    n: u64,
    root_side: (C, H),
    my_side: (C, H),
    fl: u16,
) -> CollInfo {
    let (c, t) = if s.root_is_me(root, me, inter) {
        root_side
    } else {
        my_side
    };
    CollInfo {
        bytes: cnt(c) * s.type_size(t) * n,
        count: cnt(c) * n,
        dtype: s.dt(t),
        root: s.root_value(root),
        flags: fl,
    }
}

fn rooted_v_info<T: Copy + Into<i64>, C: Copy + Into<i64>>(
    s: &Shim,
    root: c_int,
    me: i32,
    inter: bool,
    n: u64,
    counts: *const T,
    root_t: H,
    my: (C, H),
    fl: u16,
) -> CollInfo {
    let (c, t) = if s.root_is_me(root, me, inter) {
        // SAFETY: at the root MPI requires one count per rank.
        (unsafe { sum(counts, n) }, root_t)
    } else {
        (cnt(my.0), my.1)
    };
    CollInfo {
        bytes: c * s.type_size(t),
        count: c,
        dtype: s.dt(t),
        root: s.root_value(root),
        flags: fl,
    }
}

fn reduce_scatter_info<T: Copy + Into<i64>>(
    s: &Shim,
    sbuf: CP,
    rcounts: *const T,
    dt: H,
    n: u64,
) -> CollInfo {
    // SAFETY: MPI requires one count per rank.
    let c = unsafe { sum(rcounts, n) };
    CollInfo {
        bytes: c * s.type_size(dt),
        count: c,
        dtype: s.dt(dt),
        root: -1,
        flags: s.in_place(sbuf),
    }
}

fn reduce_scatter_block_info(
    s: &Shim,
    sbuf: CP,
    rcount: impl Into<i64> + Copy,
    dt: H,
    n: u64,
) -> CollInfo {
    CollInfo {
        bytes: cnt(rcount) * n * s.type_size(dt),
        count: cnt(rcount) * n,
        dtype: s.dt(dt),
        root: -1,
        flags: s.in_place(sbuf) | flags::BLOCK_VARIANT,
    }
}

fn alltoallv_info<T: Copy + Into<i64>>(
    s: &Shim,
    sbuf: CP,
    scounts: *const T,
    st: H,
    rcounts: *const T,
    rt: H,
    n: u64,
) -> CollInfo {
    let fl = s.in_place(sbuf);
    let (counts, t) = if fl != 0 {
        (rcounts, rt)
    } else {
        (scounts, st)
    };
    // SAFETY: MPI requires one count per rank.
    let c = unsafe { sum(counts, n) };
    CollInfo {
        bytes: c * s.type_size(t),
        count: c,
        dtype: s.dt(t),
        root: -1,
        flags: fl,
    }
}

fn alltoallw_info<T: Copy + Into<i64>>(
    s: &Shim,
    sbuf: CP,
    scounts: *const T,
    sts: CP,
    rcounts: *const T,
    rts: CP,
    n: u64,
) -> CollInfo {
    let fl = s.in_place(sbuf);
    let (counts, types) = if fl != 0 {
        (rcounts, rts)
    } else {
        (scounts, sts)
    };
    let (mut bytes, mut count) = (0u64, 0u64);
    if !counts.is_null() && !types.is_null() {
        for i in 0..n as usize {
            // SAFETY: MPI requires one count and one type per rank.
            let (c, t) = unsafe { (cnt(*counts.add(i)), s.abi.read_handle_at(types, i)) };
            count += c;
            bytes += c * s.type_size(t as H);
        }
    }
    CollInfo {
        bytes,
        count,
        dtype: dtype::MIXED,
        root: -1,
        flags: fl,
    }
}

/// Defines a blocking collective wrapper: the C signature, the communicator argument, the op, and
/// how to compute the record's size fields from the arguments (`|shim, ranks, my rank, intercomm|`).
macro_rules! collective {
    ($name:ident => $real:ident($($a:ident: $t:ty),* $(,)?), $comm:ident, $op:expr, |$s:ident, $n:pat_param, $me:pat_param, $inter:pat_param| $info:expr) => {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let (s, _g) = real_or!($real($($a),*));
            // SAFETY: pass-through of the application's arguments.
            s.coll($comm, $op, |$s, $n, $me, $inter| $info, || unsafe { $real($($a),*) })
        }
    };
}

/// Defines a nonblocking collective wrapper, like [`collective!`] plus the request argument.
macro_rules! icollective {
    ($name:ident => $real:ident($($a:ident: $t:ty),* $(,)?), $comm:ident, $req:ident, $op:expr, |$s:ident, $n:pat_param, $me:pat_param, $inter:pat_param| $info:expr) => {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let (s, _g) = real_or!($real($($a),*));
            // SAFETY: pass-through of the application's arguments.
            s.icoll($comm, $op, $req, |$s, $n, $me, $inter| $info, || unsafe { $real($($a),*) })
        }
    };
}

const NO_DATA: CollInfo = CollInfo {
    bytes: 0,
    count: 0,
    dtype: dtype::NONE,
    root: -1,
    flags: 0,
};

fn bcast_info(s: &Shim, count: impl Into<i64> + Copy, dt: H, root: c_int) -> CollInfo {
    CollInfo {
        bytes: cnt(count) * s.type_size(dt),
        count: cnt(count),
        dtype: s.dt(dt),
        root: s.root_value(root),
        flags: 0,
    }
}

collective!(MPI_Barrier => PMPI_Barrier(comm: H), comm, Op::Barrier, |_s, _, _, _| NO_DATA);
collective!(MPI_Bcast => PMPI_Bcast(buf: P, count: c_int, dt: H, root: c_int, comm: H), comm, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root));
collective!(MPI_Reduce => PMPI_Reduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H), comm, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, s.root_value(root)));
collective!(MPI_Allreduce => PMPI_Allreduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H), comm, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
collective!(MPI_Scan => PMPI_Scan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H), comm, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
collective!(MPI_Exscan => PMPI_Exscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H), comm, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
collective!(MPI_Allgather => PMPI_Allgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H), comm, Op::Allgather,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
collective!(MPI_Alltoall => PMPI_Alltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H), comm, Op::Alltoall,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
collective!(MPI_Allgatherv => PMPI_Allgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H), comm, Op::Allgatherv,
    |s, n, _, _| gatherv_info(s, sbuf, rcounts, rt, n));
collective!(MPI_Gather => PMPI_Gather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H), comm, Op::Gather,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (rcount, rt), (scount, st), s.in_place(sbuf)));
collective!(MPI_Scatter => PMPI_Scatter(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H), comm, Op::Scatter,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (scount, st), (rcount, rt), s.in_place(rbuf)));
collective!(MPI_Gatherv => PMPI_Gatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, root: c_int, comm: H), comm, Op::Gatherv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, rcounts, rt, (scount, st), s.in_place(sbuf)));
collective!(MPI_Scatterv => PMPI_Scatterv(sbuf: CP, scounts: IP, displs: IP, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H), comm, Op::Scatterv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, scounts, st, (rcount, rt), s.in_place(rbuf)));
collective!(MPI_Reduce_scatter => PMPI_Reduce_scatter(sbuf: CP, rbuf: P, rcounts: IP, dt: H, op: H, comm: H), comm, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, n));
collective!(MPI_Reduce_scatter_block => PMPI_Reduce_scatter_block(sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H), comm, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, n));
collective!(MPI_Alltoallv => PMPI_Alltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H), comm, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n));
collective!(MPI_Alltoallw => PMPI_Alltoallw(sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H), comm, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n));

// ----- nonblocking collectives -------------------------------------------------------------------

icollective!(MPI_Ibarrier => PMPI_Ibarrier(comm: H, req: P), comm, req, Op::Barrier, |_s, _, _, _| NO_DATA);
icollective!(MPI_Ibcast => PMPI_Ibcast(buf: P, count: c_int, dt: H, root: c_int, comm: H, req: P), comm, req, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root));
icollective!(MPI_Ireduce => PMPI_Ireduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H, req: P), comm, req, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, s.root_value(root)));
icollective!(MPI_Iallreduce => PMPI_Iallreduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P), comm, req, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
icollective!(MPI_Iscan => PMPI_Iscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P), comm, req, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
icollective!(MPI_Iexscan => PMPI_Iexscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P), comm, req, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
icollective!(MPI_Iallgather => PMPI_Iallgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P), comm, req, Op::Allgather,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
icollective!(MPI_Ialltoall => PMPI_Ialltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P), comm, req, Op::Alltoall,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
icollective!(MPI_Iallgatherv => PMPI_Iallgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H, req: P), comm, req, Op::Allgatherv,
    |s, n, _, _| gatherv_info(s, sbuf, rcounts, rt, n));
icollective!(MPI_Igather => PMPI_Igather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P), comm, req, Op::Gather,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (rcount, rt), (scount, st), s.in_place(sbuf)));
icollective!(MPI_Iscatter => PMPI_Iscatter(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P), comm, req, Op::Scatter,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (scount, st), (rcount, rt), s.in_place(rbuf)));
icollective!(MPI_Igatherv => PMPI_Igatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, root: c_int, comm: H, req: P), comm, req, Op::Gatherv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, rcounts, rt, (scount, st), s.in_place(sbuf)));
icollective!(MPI_Iscatterv => PMPI_Iscatterv(sbuf: CP, scounts: IP, displs: IP, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P), comm, req, Op::Scatterv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, scounts, st, (rcount, rt), s.in_place(rbuf)));
icollective!(MPI_Ireduce_scatter => PMPI_Ireduce_scatter(sbuf: CP, rbuf: P, rcounts: IP, dt: H, op: H, comm: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, n));
icollective!(MPI_Ireduce_scatter_block => PMPI_Ireduce_scatter_block(sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, n));
icollective!(MPI_Ialltoallv => PMPI_Ialltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H, req: P), comm, req, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n));
icollective!(MPI_Ialltoallw => PMPI_Ialltoallw(sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H, req: P), comm, req, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n));

// ----- point-to-point ----------------------------------------------------------------------------

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Send(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Send(buf, count, dt, dest, tag, comm));
    s.send(0, count.into(), dt, dest, tag, comm, || unsafe {
        PMPI_Send(buf, count, dt, dest, tag, comm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Ssend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Ssend(buf, count, dt, dest, tag, comm));
    s.send(
        flags::SYNCHRONOUS,
        count.into(),
        dt,
        dest,
        tag,
        comm,
        || unsafe { PMPI_Ssend(buf, count, dt, dest, tag, comm) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Bsend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Bsend(buf, count, dt, dest, tag, comm));
    s.send(
        flags::BUFFERED,
        count.into(),
        dt,
        dest,
        tag,
        comm,
        || unsafe { PMPI_Bsend(buf, count, dt, dest, tag, comm) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Rsend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Rsend(buf, count, dt, dest, tag, comm));
    s.send(flags::READY, count.into(), dt, dest, tag, comm, || unsafe {
        PMPI_Rsend(buf, count, dt, dest, tag, comm)
    })
}

impl Shim {
    /// Records a blocking receive around `real`, which gets the status to fill.
    #[allow(clippy::too_many_arguments)]
    fn recv(
        &self,
        count: i64,
        dt: H,
        src: c_int,
        tag: c_int,
        comm: H,
        status: P,
        real: impl FnOnce(P) -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let c = cnt(count);
            self.begin_p2p(
                comm,
                Op::Recv,
                src,
                tag,
                c * self.type_size(dt),
                c,
                self.dt(dt),
                0,
                Dir::Recv,
            )
        });
        let mut own = [0u8; STATUS_MAX];
        let st: P = if self.abi.is_status_ignore(status) {
            own.as_mut_ptr().cast()
        } else {
            status
        };
        let rc = real(st);
        if let Some(mut b) = b {
            shielded(self, || {
                let later = b.call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) != 0;
                if rc == 0 {
                    // SAFETY: MPI filled `st`.
                    unsafe { self.complete_recv(&mut b.call, st as *const u8, later, dt) };
                }
                self.finish(b.call, b.slot, rc)
            });
        }
        rc
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Recv(
    buf: P,
    count: c_int,
    dt: H,
    src: c_int,
    tag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Recv(buf, count, dt, src, tag, comm, status));
    // SAFETY: pass-through, with our own status buffer when the application ignores it.
    s.recv(count.into(), dt, src, tag, comm, status, |st| unsafe {
        PMPI_Recv(buf, count, dt, src, tag, comm, st)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Isend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
    req: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Isend(buf, count, dt, dest, tag, comm, req));
    s.ip2p(
        Op::Send,
        0,
        count.into(),
        dt,
        dest,
        tag,
        comm,
        req,
        || unsafe { PMPI_Isend(buf, count, dt, dest, tag, comm, req) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Issend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
    req: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Issend(buf, count, dt, dest, tag, comm, req));
    s.ip2p(
        Op::Send,
        flags::SYNCHRONOUS,
        count.into(),
        dt,
        dest,
        tag,
        comm,
        req,
        || unsafe { PMPI_Issend(buf, count, dt, dest, tag, comm, req) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Irecv(
    buf: P,
    count: c_int,
    dt: H,
    src: c_int,
    tag: c_int,
    comm: H,
    req: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Irecv(buf, count, dt, src, tag, comm, req));
    s.ip2p(
        Op::Recv,
        0,
        count.into(),
        dt,
        src,
        tag,
        comm,
        req,
        || unsafe { PMPI_Irecv(buf, count, dt, src, tag, comm, req) },
    )
}

impl Shim {
    /// Records a send-receive around `real`, which gets the status to fill.
    #[allow(clippy::too_many_arguments)]
    fn sendrecv(
        &self,
        scount: i64,
        st: H,
        dest: c_int,
        stag: c_int,
        src: c_int,
        rtag: c_int,
        comm: H,
        status: P,
        real: impl FnOnce(P) -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let c = cnt(scount);
            let mut b = self.begin_p2p(
                comm,
                Op::Sendrecv,
                dest,
                stag,
                c * self.type_size(st),
                c,
                self.dt(st),
                0,
                Dir::Send,
            );
            b.call.peer2 = self.abi.rank_value(src);
            b.call.tag2 = rtag;
            b
        });
        let mut own = [0u8; STATUS_MAX];
        let stp: P = if self.abi.is_status_ignore(status) {
            own.as_mut_ptr().cast()
        } else {
            status
        };
        let rc = real(stp);
        if let Some(mut b) = b {
            shielded(self, || {
                if rc == 0 {
                    // SAFETY: MPI filled the status.
                    let (from, tag, _) = unsafe { self.abi.status_fields(stp as *const u8) };
                    b.call.peer2 = self.abi.rank_value(from);
                    b.call.tag2 = tag;
                    if src == self.abi.any_source {
                        b.call.flags |= flags::ANY_SOURCE;
                    }
                    if rtag == self.abi.any_tag {
                        b.call.flags |= flags::ANY_TAG;
                    }
                    if b.call.peer2 >= 0 {
                        match self
                            .p2p
                            .next(b.call.comm_id, b.call.peer2, b.call.tag2, Dir::Recv)
                        {
                            Some(q) => b.call.op_seq2 = q,
                            None => {
                                b.call.flags |= flags::P2P_SEQ_UNKNOWN;
                                self.shm.count(Counter::DroppedP2pSeq, 1);
                            }
                        }
                    }
                }
                self.finish(b.call, b.slot, rc)
            });
        }
        rc
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Sendrecv(
    sbuf: CP,
    scount: c_int,
    st: H,
    dest: c_int,
    stag: c_int,
    rbuf: P,
    rcount: c_int,
    rt: H,
    src: c_int,
    rtag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Sendrecv(
        sbuf, scount, st, dest, stag, rbuf, rcount, rt, src, rtag, comm, status
    ));
    // SAFETY: pass-through, with a real status buffer.
    s.sendrecv(
        scount.into(),
        st,
        dest,
        stag,
        src,
        rtag,
        comm,
        status,
        |stp| unsafe {
            PMPI_Sendrecv(
                sbuf, scount, st, dest, stag, rbuf, rcount, rt, src, rtag, comm, stp,
            )
        },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Sendrecv_replace(
    buf: P,
    count: c_int,
    dt: H,
    dest: c_int,
    stag: c_int,
    src: c_int,
    rtag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Sendrecv_replace(
        buf, count, dt, dest, stag, src, rtag, comm, status
    ));
    // SAFETY: pass-through, with a real status buffer.
    s.sendrecv(
        count.into(),
        dt,
        dest,
        stag,
        src,
        rtag,
        comm,
        status,
        |stp| unsafe { PMPI_Sendrecv_replace(buf, count, dt, dest, stag, src, rtag, comm, stp) },
    )
}

// ----- persistent point-to-point -----------------------------------------------------------------

impl Shim {
    /// A persistent send or receive was created: keep its template under the request handle.
    #[allow(clippy::too_many_arguments)]
    fn persistent_init(
        &self,
        op: Op,
        fl: u16,
        count: i64,
        dt: H,
        peer: c_int,
        tag: c_int,
        comm: H,
        req: P,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let rc = real();
        if rc != 0 || req.is_null() {
            return rc;
        }
        shielded(self, || {
            // SAFETY: MPI wrote the request handle.
            let h = unsafe { self.abi.read_handle(req) };
            let c = cnt(count);
            let mut call = Call {
                op: op as u8,
                flags: fl | flags::PERSISTENT | flags::NONBLOCKING,
                peer: self.abi.rank_value(peer),
                tag,
                bytes: c * self.type_size(dt),
                count: c,
                dtype: self.dt(dt),
                rank: self.rank,
                peer2: -1,
                tag2: -1,
                ..Default::default()
            };
            let recv = op == Op::Recv;
            if recv && peer == self.abi.any_source {
                call.flags |= flags::ANY_SOURCE;
            }
            if recv && tag == self.abi.any_tag {
                call.flags |= flags::ANY_TAG;
            }
            if let Some(e) = self.comm(comm) {
                call.comm_id = e.id.load(Ordering::Relaxed);
                call.comm_rank = e.rank.load(Ordering::Relaxed);
                call.comm_size = e.size.load(Ordering::Relaxed);
            }
            let wildcard = recv && call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) != 0;
            let template = Pending {
                call,
                slot: Slot::None,
                seq_at_completion: wildcard,
                comm: self.abi.norm(comm),
                dtype: if recv { dt as u64 } else { 0 },
            };
            if !self.persistent.insert(h, template) {
                self.shm.count(Counter::DroppedRequests, 1);
            }
        });
        rc
    }

    /// A persistent request was started: it becomes a pending call like any nonblocking one.
    fn started(&self, h: u64) {
        let Some(t) = self.persistent.get(h) else {
            return;
        };
        let mut call = t.call;
        call.t_enter = now_mono();
        if let Some(e) = self.comms.get(t.comm) {
            call.seq = e.seq.load(Ordering::Relaxed);
        }
        if !t.seq_at_completion {
            let dir = if Op::from_code(call.op) == Op::Recv {
                Dir::Recv
            } else {
                Dir::Send
            };
            self.assign_p2p_seq(&mut call, dir);
        }
        let slot = self.claim(&call, in_flight_status::POSTED);
        let p = Pending { call, slot, ..t };
        if !self.requests.insert(h, p) {
            self.shm.count(Counter::DroppedRequests, 1);
            let mut c = p.call;
            c.flags |= flags::UNTRACKED;
            self.finish(c, p.slot, 0);
        }
    }
}

macro_rules! persistent_init {
    ($name:ident, $real:ident, $op:expr, $fl:expr, $buf:ty) => {
        persistent_init!($name, $real, $op, $fl, $buf, c_int);
    };
    ($name:ident, $real:ident, $op:expr, $fl:expr, $buf:ty, $count:ty) => {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name(
            buf: $buf,
            count: $count,
            dt: H,
            peer: c_int,
            tag: c_int,
            comm: H,
            req: P,
        ) -> c_int {
            let (s, _g) = real_or!($real(buf, count, dt, peer, tag, comm, req));
            // SAFETY: pass-through of the application's arguments.
            s.persistent_init(
                $op,
                $fl,
                count.into(),
                dt,
                peer,
                tag,
                comm,
                req,
                || unsafe { $real(buf, count, dt, peer, tag, comm, req) },
            )
        }
    };
}

persistent_init!(MPI_Send_init, PMPI_Send_init, Op::Send, 0, CP);
persistent_init!(
    MPI_Ssend_init,
    PMPI_Ssend_init,
    Op::Send,
    flags::SYNCHRONOUS,
    CP
);
persistent_init!(
    MPI_Bsend_init,
    PMPI_Bsend_init,
    Op::Send,
    flags::BUFFERED,
    CP
);
persistent_init!(MPI_Rsend_init, PMPI_Rsend_init, Op::Send, flags::READY, CP);
persistent_init!(MPI_Recv_init, PMPI_Recv_init, Op::Recv, 0, P);

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Start(req: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Start(req));
    // SAFETY: MPI requires a valid request pointer.
    let h = if s.persistent.is_empty() || req.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(req) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Start(req) };
    if rc == 0 && h != 0 {
        shielded(s, || s.started(h));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Startall(n: c_int, reqs: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Startall(n, reqs));
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Startall(n, reqs) };
    if rc == 0 && !s.persistent.is_empty() && !reqs.is_null() {
        shielded(s, || {
            for i in 0..n.max(0) as usize {
                // SAFETY: MPI requires `n` request handles.
                let h = unsafe { s.abi.read_handle_at(reqs, i) };
                s.started(h);
            }
        });
    }
    rc
}

// ----- completion --------------------------------------------------------------------------------

thread_local! {
    static HANDLES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static STATUSES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Copies the handles of a request array; returns false (pass through) when none is pending.
fn snapshot(s: &Shim, n: c_int, reqs: CP, out: &mut Vec<u64>) -> bool {
    out.clear();
    if n <= 0 || reqs.is_null() {
        return false;
    }
    let mut any = false;
    for i in 0..n as usize {
        // SAFETY: MPI requires `n` request handles.
        let h = unsafe { s.abi.read_handle_at(reqs, i) };
        any |= s.requests.contains(h);
        out.push(h);
    }
    any
}

/// A status array to use: the application's, or scratch space when it ignores statuses.
fn statuses(s: &Shim, n: c_int, given: P, scratch: &mut Vec<u8>) -> P {
    if !s.abi.is_status_ignore(given) {
        return given;
    }
    scratch.clear();
    scratch.resize(n.max(1) as usize * s.abi.status_size, 0);
    scratch.as_mut_ptr().cast()
}

fn status_at(s: &Shim, base: P, i: usize) -> *const u8 {
    (base as *const u8).wrapping_add(i * s.abi.status_size)
}

/// The code for request `i` of a multiple completion: the call's, or the status' error field.
fn rc_at(s: &Shim, rc: c_int, st: *const u8) -> c_int {
    if rc == 0 {
        return 0;
    }
    // SAFETY: `st` points into a status array MPI wrote.
    let (_, _, err) = unsafe { s.abi.status_fields(st) };
    err
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Wait(req: P, status: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Wait(req, status));
    // SAFETY: MPI requires a valid request pointer.
    let h = if s.requests.is_empty() || req.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(req) }
    };
    if h == 0 || !s.requests.contains(h) {
        // SAFETY: pass-through.
        return unsafe { PMPI_Wait(req, status) };
    }
    let mut own = [0u8; STATUS_MAX];
    let st: P = if s.abi.is_status_ignore(status) {
        own.as_mut_ptr().cast()
    } else {
        status
    };
    // SAFETY: pass-through with a real status buffer.
    let rc = unsafe { PMPI_Wait(req, st) };
    shielded(s, || s.completed(h, st as *const u8, rc));
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Test(req: P, flag: *mut c_int, status: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Test(req, flag, status));
    // SAFETY: MPI requires a valid request pointer.
    let h = if s.requests.is_empty() || req.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(req) }
    };
    if h == 0 || !s.requests.contains(h) {
        // SAFETY: pass-through.
        return unsafe { PMPI_Test(req, flag, status) };
    }
    let mut own = [0u8; STATUS_MAX];
    let st: P = if s.abi.is_status_ignore(status) {
        own.as_mut_ptr().cast()
    } else {
        status
    };
    // SAFETY: pass-through with a real status buffer.
    let rc = unsafe { PMPI_Test(req, flag, st) };
    // SAFETY: MPI wrote `flag`.
    if !flag.is_null() && unsafe { *flag } != 0 {
        shielded(s, || s.completed(h, st as *const u8, rc));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Waitall(n: c_int, reqs: P, sts: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Waitall(n, reqs, sts));
    if s.requests.is_empty() {
        // SAFETY: pass-through.
        return unsafe { PMPI_Waitall(n, reqs, sts) };
    }
    HANDLES.with(|hc| {
        STATUSES.with(|sc| {
            let (Ok(mut hs), Ok(mut scratch)) = (hc.try_borrow_mut(), sc.try_borrow_mut()) else {
                // SAFETY: pass-through.
                return unsafe { PMPI_Waitall(n, reqs, sts) };
            };
            if !snapshot(s, n, reqs, &mut hs) {
                // SAFETY: pass-through.
                return unsafe { PMPI_Waitall(n, reqs, sts) };
            }
            let st = statuses(s, n, sts, &mut scratch);
            // SAFETY: pass-through with a real status array of `n` entries.
            let rc = unsafe { PMPI_Waitall(n, reqs, st) };
            shielded(s, || {
                for (i, &h) in hs.iter().enumerate() {
                    let sp = status_at(s, st, i);
                    s.completed(h, sp, rc_at(s, rc, sp));
                }
            });
            rc
        })
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Testall(n: c_int, reqs: P, flag: *mut c_int, sts: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Testall(n, reqs, flag, sts));
    if s.requests.is_empty() {
        // SAFETY: pass-through.
        return unsafe { PMPI_Testall(n, reqs, flag, sts) };
    }
    HANDLES.with(|hc| {
        STATUSES.with(|sc| {
            let (Ok(mut hs), Ok(mut scratch)) = (hc.try_borrow_mut(), sc.try_borrow_mut()) else {
                // SAFETY: pass-through.
                return unsafe { PMPI_Testall(n, reqs, flag, sts) };
            };
            if !snapshot(s, n, reqs, &mut hs) {
                // SAFETY: pass-through.
                return unsafe { PMPI_Testall(n, reqs, flag, sts) };
            }
            let st = statuses(s, n, sts, &mut scratch);
            // SAFETY: pass-through with a real status array of `n` entries.
            let rc = unsafe { PMPI_Testall(n, reqs, flag, st) };
            // SAFETY: MPI wrote `flag`.
            if !flag.is_null() && unsafe { *flag } != 0 {
                shielded(s, || {
                    for (i, &h) in hs.iter().enumerate() {
                        let sp = status_at(s, st, i);
                        s.completed(h, sp, rc_at(s, rc, sp));
                    }
                });
            }
            rc
        })
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Waitany(n: c_int, reqs: P, index: *mut c_int, status: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Waitany(n, reqs, index, status));
    any_completion(
        s,
        n,
        reqs,
        index,
        std::ptr::null_mut(),
        status,
        |st| unsafe { PMPI_Waitany(n, reqs, index, st) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Testany(
    n: c_int,
    reqs: P,
    index: *mut c_int,
    flag: *mut c_int,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Testany(n, reqs, index, flag, status));
    any_completion(s, n, reqs, index, flag, status, |st| unsafe {
        PMPI_Testany(n, reqs, index, flag, st)
    })
}

/// Waitany/Testany: one request (at `*index`) completed when `flag` (if given) is set.
fn any_completion(
    s: &Shim,
    n: c_int,
    reqs: P,
    index: *mut c_int,
    flag: *mut c_int,
    status: P,
    real: impl Fn(P) -> c_int,
) -> c_int {
    if s.requests.is_empty() {
        return real(status);
    }
    HANDLES.with(|hc| {
        let Ok(mut hs) = hc.try_borrow_mut() else {
            return real(status);
        };
        if !snapshot(s, n, reqs, &mut hs) {
            return real(status);
        }
        let mut own = [0u8; STATUS_MAX];
        let st: P = if s.abi.is_status_ignore(status) {
            own.as_mut_ptr().cast()
        } else {
            status
        };
        let rc = real(st);
        // SAFETY: MPI wrote `flag` and `index`.
        let done = flag.is_null() || unsafe { *flag } != 0;
        // SAFETY: as above.
        let i = if index.is_null() {
            -1
        } else {
            unsafe { *index }
        };
        if done && i >= 0 && (i as usize) < hs.len() {
            let h = hs[i as usize];
            shielded(s, || s.completed(h, st as *const u8, rc));
        }
        rc
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Waitsome(
    n: c_int,
    reqs: P,
    outcount: *mut c_int,
    indices: *mut c_int,
    sts: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Waitsome(n, reqs, outcount, indices, sts));
    some_completion(s, n, reqs, outcount, indices, sts, |st| unsafe {
        PMPI_Waitsome(n, reqs, outcount, indices, st)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Testsome(
    n: c_int,
    reqs: P,
    outcount: *mut c_int,
    indices: *mut c_int,
    sts: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Testsome(n, reqs, outcount, indices, sts));
    some_completion(s, n, reqs, outcount, indices, sts, |st| unsafe {
        PMPI_Testsome(n, reqs, outcount, indices, st)
    })
}

/// Waitsome/Testsome: the requests at `indices[..*outcount]` completed, with statuses in order.
fn some_completion(
    s: &Shim,
    n: c_int,
    reqs: P,
    outcount: *mut c_int,
    indices: *mut c_int,
    sts: P,
    real: impl Fn(P) -> c_int,
) -> c_int {
    if s.requests.is_empty() {
        return real(sts);
    }
    HANDLES.with(|hc| {
        STATUSES.with(|sc| {
            let (Ok(mut hs), Ok(mut scratch)) = (hc.try_borrow_mut(), sc.try_borrow_mut()) else {
                return real(sts);
            };
            if !snapshot(s, n, reqs, &mut hs) {
                return real(sts);
            }
            let st = statuses(s, n, sts, &mut scratch);
            let rc = real(st);
            // SAFETY: MPI wrote `outcount`.
            let k = if outcount.is_null() {
                0
            } else {
                unsafe { *outcount }
            };
            if k > 0 && k != s.abi.undefined && !indices.is_null() {
                shielded(s, || {
                    for j in 0..k.min(n) as usize {
                        // SAFETY: MPI wrote `k` indices.
                        let i = unsafe { *indices.add(j) };
                        if i >= 0 && (i as usize) < hs.len() {
                            let sp = status_at(s, st, j);
                            s.completed(hs[i as usize], sp, rc_at(s, rc, sp));
                        }
                    }
                });
            }
            rc
        })
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Request_free(req: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Request_free(req));
    // SAFETY: MPI requires a valid request pointer.
    let h = if (s.requests.is_empty() && s.persistent.is_empty()) || req.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(req) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Request_free(req) };
    if h != 0 && rc == 0 {
        shielded(s, || {
            s.persistent.take(h);
            if let Some(p) = s.requests.take(h) {
                let mut c = p.call;
                c.flags |= flags::REQUEST_FREED;
                s.finish(c, p.slot, 0);
            }
        });
    }
    rc
}

// ----- communicators -----------------------------------------------------------------------------

/// How a constructor relates the new communicator to its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ctor {
    /// Collective over the whole parent (split, create, cart, graph, merge): every parent member
    /// advances the parent's creation counter, whether or not it joins.
    Collective,
    /// A duplicate: same members as the parent (used also before a nonblocking dup completes).
    Dup,
    /// Built from a group, collective over the group's members only (`Comm_create_group`).
    Group,
    /// An intercommunicator joining two groups (`Intercomm_create`).
    Inter,
}

impl Shim {
    fn comm_created(&self, parent: H, newcomm: P, kind: Ctor) {
        let parent_entry = self.comm(parent);
        let parent_id = parent_entry
            .map(|e| e.id.load(Ordering::Relaxed))
            .unwrap_or(0);
        let counter = match (kind, parent_entry) {
            (Ctor::Collective | Ctor::Dup, Some(e)) => {
                Some(e.children.fetch_add(1, Ordering::Relaxed))
            }
            _ => None,
        };
        if newcomm.is_null() {
            return;
        }
        // SAFETY: MPI wrote the new handle.
        let new = unsafe { self.abi.read_handle(newcomm) };
        if new == self.abi.comm_null {
            return;
        }
        let shape_of = if kind == Ctor::Dup { parent } else { new as H };
        let members = self.members(shape_of);
        let (inter, size, rank, remote) = self.comm_shape(shape_of);
        let id = match kind {
            Ctor::Collective | Ctor::Dup => {
                hash::derived_comm_id(domain::DERIVED, parent_id, counter.unwrap_or(0), &members)
            }
            Ctor::Group => hash::derived_comm_id(
                domain::GROUP,
                parent_id,
                self.set_counter(parent_id, &members),
                &members,
            ),
            Ctor::Inter => {
                hash::derived_comm_id(domain::GROUP, 0, self.set_counter(0, &members), &members)
            }
        };
        let info = CommInfo {
            id,
            size,
            rank,
            remote_size: remote,
            flags: if inter { comm_flags::INTERCOMM } else { 0 },
        };
        match self.comms.insert(new, info) {
            Some(e) => self.comm_record(CommEvent::Created, e, parent_id, None),
            None => self.shm.count(Counter::DroppedComms, 1),
        }
    }

    fn ctor(&self, parent: H, newcomm: P, kind: Ctor, real: impl FnOnce() -> c_int) -> c_int {
        let rc = real();
        if rc == 0 {
            shielded(self, || self.comm_created(parent, newcomm, kind));
        }
        rc
    }

    fn comm_gone(&self, h: u64) {
        if let Some(e) = self.comms.get(h) {
            self.comm_record(CommEvent::Freed, e, 0, None);
            self.comms.remove(h);
        }
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_split(comm: H, color: c_int, key: c_int, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_split(comm, color, key, newcomm));
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Comm_split(comm, color, key, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_split_type(
    comm: H,
    kind: c_int,
    key: c_int,
    info: H,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_split_type(comm, kind, key, info, newcomm));
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Comm_split_type(comm, kind, key, info, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_dup(comm: H, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_dup(comm, newcomm));
    s.ctor(comm, newcomm, Ctor::Dup, || unsafe {
        PMPI_Comm_dup(comm, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_dup_with_info(comm: H, info: H, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_dup_with_info(comm, info, newcomm));
    s.ctor(comm, newcomm, Ctor::Dup, || unsafe {
        PMPI_Comm_dup_with_info(comm, info, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_idup(comm: H, newcomm: P, req: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_idup(comm, newcomm, req));
    s.ctor(comm, newcomm, Ctor::Dup, || unsafe {
        PMPI_Comm_idup(comm, newcomm, req)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_create(comm: H, group: H, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_create(comm, group, newcomm));
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Comm_create(comm, group, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_create_group(comm: H, group: H, tag: c_int, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_create_group(comm, group, tag, newcomm));
    s.ctor(comm, newcomm, Ctor::Group, || unsafe {
        PMPI_Comm_create_group(comm, group, tag, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Cart_create(
    comm: H,
    ndims: c_int,
    dims: IP,
    periods: IP,
    reorder: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Cart_create(
        comm, ndims, dims, periods, reorder, newcomm
    ));
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Cart_create(comm, ndims, dims, periods, reorder, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Cart_sub(comm: H, remain: IP, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Cart_sub(comm, remain, newcomm));
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Cart_sub(comm, remain, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Graph_create(
    comm: H,
    nnodes: c_int,
    index: IP,
    edges: IP,
    reorder: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Graph_create(
        comm, nnodes, index, edges, reorder, newcomm
    ));
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Graph_create(comm, nnodes, index, edges, reorder, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Dist_graph_create(
    comm: H,
    n: c_int,
    sources: IP,
    degrees: IP,
    dests: IP,
    weights: IP,
    info: H,
    reorder: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Dist_graph_create(
        comm, n, sources, degrees, dests, weights, info, reorder, newcomm
    ));
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Dist_graph_create(
            comm, n, sources, degrees, dests, weights, info, reorder, newcomm,
        )
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Dist_graph_create_adjacent(
    comm: H,
    indeg: c_int,
    sources: IP,
    sweights: IP,
    outdeg: c_int,
    dests: IP,
    dweights: IP,
    info: H,
    reorder: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Dist_graph_create_adjacent(
        comm, indeg, sources, sweights, outdeg, dests, dweights, info, reorder, newcomm
    ));
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Dist_graph_create_adjacent(
            comm, indeg, sources, sweights, outdeg, dests, dweights, info, reorder, newcomm,
        )
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Intercomm_create(
    local: H,
    local_leader: c_int,
    peer: H,
    remote_leader: c_int,
    tag: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Intercomm_create(
        local,
        local_leader,
        peer,
        remote_leader,
        tag,
        newcomm
    ));
    s.ctor(local, newcomm, Ctor::Inter, || unsafe {
        PMPI_Intercomm_create(local, local_leader, peer, remote_leader, tag, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Intercomm_merge(inter: H, high: c_int, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Intercomm_merge(inter, high, newcomm));
    s.ctor(inter, newcomm, Ctor::Collective, || unsafe {
        PMPI_Intercomm_merge(inter, high, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_free(comm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_free(comm));
    // SAFETY: MPI requires a valid pointer to a communicator handle.
    let h = if comm.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(comm) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Comm_free(comm) };
    if rc == 0 && h != 0 {
        shielded(s, || s.comm_gone(h));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_disconnect(comm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_disconnect(comm));
    // SAFETY: MPI requires a valid pointer to a communicator handle.
    let h = if comm.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(comm) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Comm_disconnect(comm) };
    if rc == 0 && h != 0 {
        shielded(s, || s.comm_gone(h));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_set_name(comm: H, name: *const c_char) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_set_name(comm, name));
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Comm_set_name(comm, name) };
    if rc == 0 && !name.is_null() {
        shielded(s, || {
            if let Some(e) = s.comm(comm) {
                // SAFETY: MPI requires a NUL-terminated name.
                let n = unsafe { std::ffi::CStr::from_ptr(name) };
                s.comm_record(CommEvent::Named, e, 0, Some(n.to_bytes()));
            }
        });
    }
    rc
}

// ----- MPI-4 large-count variants -----------------------------------------------------------------
//
// `MPI_Count` counts and `MPI_Aint` displacements; recorded under the same names as the `int`
// calls. Only libraries that have them (MPICH 4) ever call these.

/// `MPI_Count`.
type C = i64;
/// An array of `MPI_Count`.
type CA = *const i64;
/// An array of `MPI_Aint` displacements.
type AA = *const isize;

pmpi! {
    fn PMPI_Bcast_c(buf: P, count: C, dt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Reduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Allreduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Scan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Exscan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Allgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H) -> c_int;
    fn PMPI_Alltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H) -> c_int;
    fn PMPI_Allgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H) -> c_int;
    fn PMPI_Gather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Scatter_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Gatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Scatterv_c(sbuf: CP, scounts: CA, displs: AA, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Reduce_scatter_c(sbuf: CP, rbuf: P, rcounts: CA, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Reduce_scatter_block_c(sbuf: CP, rbuf: P, rcount: C, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Alltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H) -> c_int;
    fn PMPI_Alltoallw_c(sbuf: CP, scounts: CA, sdispls: AA, sts: CP, rbuf: P, rcounts: CA, rdispls: AA, rts: CP, comm: H) -> c_int;
    fn PMPI_Ibcast_c(buf: P, count: C, dt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Iallreduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Iallgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce_scatter_block_c(sbuf: CP, rbuf: P, rcount: C, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Send_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Ssend_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Bsend_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Rsend_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Recv_c(buf: P, count: C, dt: H, src: c_int, tag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Isend_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Issend_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Irecv_c(buf: P, count: C, dt: H, src: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Sendrecv_c(sbuf: CP, scount: C, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: C, rt: H, src: c_int, rtag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Sendrecv_replace_c(buf: P, count: C, dt: H, dest: c_int, stag: c_int, src: c_int, rtag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Send_init_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Recv_init_c(buf: P, count: C, dt: H, src: c_int, tag: c_int, comm: H, req: P) -> c_int;
}

collective!(MPI_Bcast_c => PMPI_Bcast_c(buf: P, count: C, dt: H, root: c_int, comm: H), comm, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root));
collective!(MPI_Reduce_c => PMPI_Reduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, root: c_int, comm: H), comm, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, s.root_value(root)));
collective!(MPI_Allreduce_c => PMPI_Allreduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H), comm, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
collective!(MPI_Scan_c => PMPI_Scan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H), comm, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
collective!(MPI_Exscan_c => PMPI_Exscan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H), comm, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
collective!(MPI_Allgather_c => PMPI_Allgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H), comm, Op::Allgather,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
collective!(MPI_Alltoall_c => PMPI_Alltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H), comm, Op::Alltoall,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
collective!(MPI_Allgatherv_c => PMPI_Allgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H), comm, Op::Allgatherv,
    |s, n, _, _| gatherv_info(s, sbuf, rcounts, rt, n));
collective!(MPI_Gather_c => PMPI_Gather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H), comm, Op::Gather,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (rcount, rt), (scount, st), s.in_place(sbuf)));
collective!(MPI_Scatter_c => PMPI_Scatter_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H), comm, Op::Scatter,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (scount, st), (rcount, rt), s.in_place(rbuf)));
collective!(MPI_Gatherv_c => PMPI_Gatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, root: c_int, comm: H), comm, Op::Gatherv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, rcounts, rt, (scount, st), s.in_place(sbuf)));
collective!(MPI_Scatterv_c => PMPI_Scatterv_c(sbuf: CP, scounts: CA, displs: AA, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H), comm, Op::Scatterv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, scounts, st, (rcount, rt), s.in_place(rbuf)));
collective!(MPI_Reduce_scatter_c => PMPI_Reduce_scatter_c(sbuf: CP, rbuf: P, rcounts: CA, dt: H, op: H, comm: H), comm, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, n));
collective!(MPI_Reduce_scatter_block_c => PMPI_Reduce_scatter_block_c(sbuf: CP, rbuf: P, rcount: C, dt: H, op: H, comm: H), comm, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, n));
collective!(MPI_Alltoallv_c => PMPI_Alltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H), comm, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n));
collective!(MPI_Alltoallw_c => PMPI_Alltoallw_c(sbuf: CP, scounts: CA, sdispls: AA, sts: CP, rbuf: P, rcounts: CA, rdispls: AA, rts: CP, comm: H), comm, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n));
icollective!(MPI_Ibcast_c => PMPI_Ibcast_c(buf: P, count: C, dt: H, root: c_int, comm: H, req: P), comm, req, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root));
icollective!(MPI_Ireduce_c => PMPI_Ireduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, root: c_int, comm: H, req: P), comm, req, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, s.root_value(root)));
icollective!(MPI_Iallreduce_c => PMPI_Iallreduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, req: P), comm, req, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, -1));
icollective!(MPI_Iallgather_c => PMPI_Iallgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P), comm, req, Op::Allgather,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
icollective!(MPI_Ialltoall_c => PMPI_Ialltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P), comm, req, Op::Alltoall,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
icollective!(MPI_Ireduce_scatter_block_c => PMPI_Ireduce_scatter_block_c(sbuf: CP, rbuf: P, rcount: C, dt: H, op: H, comm: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, n));

/// Defines a blocking large-count send wrapper.
macro_rules! send_c {
    ($name:ident, $real:ident, $fl:expr) => {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name(
            buf: CP,
            count: C,
            dt: H,
            dest: c_int,
            tag: c_int,
            comm: H,
        ) -> c_int {
            let (s, _g) = real_or!($real(buf, count, dt, dest, tag, comm));
            // SAFETY: pass-through of the application's arguments.
            s.send($fl, count, dt, dest, tag, comm, || unsafe {
                $real(buf, count, dt, dest, tag, comm)
            })
        }
    };
}

send_c!(MPI_Send_c, PMPI_Send_c, 0);
send_c!(MPI_Ssend_c, PMPI_Ssend_c, flags::SYNCHRONOUS);
send_c!(MPI_Bsend_c, PMPI_Bsend_c, flags::BUFFERED);
send_c!(MPI_Rsend_c, PMPI_Rsend_c, flags::READY);

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Recv_c(
    buf: P,
    count: C,
    dt: H,
    src: c_int,
    tag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Recv_c(buf, count, dt, src, tag, comm, status));
    // SAFETY: pass-through, with our own status buffer when the application ignores it.
    s.recv(count, dt, src, tag, comm, status, |st| unsafe {
        PMPI_Recv_c(buf, count, dt, src, tag, comm, st)
    })
}

/// Defines a nonblocking large-count send or receive wrapper.
macro_rules! ip2p_c {
    ($name:ident, $real:ident, $op:expr, $fl:expr, $buf:ty) => {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name(
            buf: $buf,
            count: C,
            dt: H,
            peer: c_int,
            tag: c_int,
            comm: H,
            req: P,
        ) -> c_int {
            let (s, _g) = real_or!($real(buf, count, dt, peer, tag, comm, req));
            // SAFETY: pass-through of the application's arguments.
            s.ip2p($op, $fl, count, dt, peer, tag, comm, req, || unsafe {
                $real(buf, count, dt, peer, tag, comm, req)
            })
        }
    };
}

ip2p_c!(MPI_Isend_c, PMPI_Isend_c, Op::Send, 0, CP);
ip2p_c!(
    MPI_Issend_c,
    PMPI_Issend_c,
    Op::Send,
    flags::SYNCHRONOUS,
    CP
);
ip2p_c!(MPI_Irecv_c, PMPI_Irecv_c, Op::Recv, 0, P);

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Sendrecv_c(
    sbuf: CP,
    scount: C,
    st: H,
    dest: c_int,
    stag: c_int,
    rbuf: P,
    rcount: C,
    rt: H,
    src: c_int,
    rtag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Sendrecv_c(
        sbuf, scount, st, dest, stag, rbuf, rcount, rt, src, rtag, comm, status
    ));
    // SAFETY: pass-through, with a real status buffer.
    s.sendrecv(
        scount,
        st,
        dest,
        stag,
        src,
        rtag,
        comm,
        status,
        |stp| unsafe {
            PMPI_Sendrecv_c(
                sbuf, scount, st, dest, stag, rbuf, rcount, rt, src, rtag, comm, stp,
            )
        },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Sendrecv_replace_c(
    buf: P,
    count: C,
    dt: H,
    dest: c_int,
    stag: c_int,
    src: c_int,
    rtag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Sendrecv_replace_c(
        buf, count, dt, dest, stag, src, rtag, comm, status
    ));
    // SAFETY: pass-through, with a real status buffer.
    s.sendrecv(
        count,
        dt,
        dest,
        stag,
        src,
        rtag,
        comm,
        status,
        |stp| unsafe { PMPI_Sendrecv_replace_c(buf, count, dt, dest, stag, src, rtag, comm, stp) },
    )
}

persistent_init!(MPI_Send_init_c, PMPI_Send_init_c, Op::Send, 0, CP, C);
persistent_init!(MPI_Recv_init_c, PMPI_Recv_init_c, Op::Recv, 0, P, C);
