//! Blocking, nonblocking and neighbourhood collectives: each records one call around its `PMPI_*` twin.
//!
//! Data volume (`bytes`) per op follows nccl-tests' "size" (see [`super`]).

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use commscope_wire::op::{Op, dtype, flags};
use commscope_wire::record::Call;

use super::{CP, CollInfo, IP, P, cnt, shape, sum};
use crate::abi::{H, pmpi};
use crate::state::{Shim, shielded};
use crate::tables::CommEntry;

pmpi! {
    fn PMPI_Allgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H) -> c_int;
    fn PMPI_Allgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H) -> c_int;
    fn PMPI_Allreduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Alltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H) -> c_int;
    fn PMPI_Alltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H) -> c_int;
    fn PMPI_Alltoallw(sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H) -> c_int;
    fn PMPI_Barrier(comm: H) -> c_int;
    fn PMPI_Bcast(buf: P, count: c_int, dt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Exscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Gather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Gatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Iallgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Iallgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Iallreduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoallw(sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H, req: P) -> c_int;
    fn PMPI_Ibarrier(comm: H, req: P) -> c_int;
    fn PMPI_Ibcast(buf: P, count: c_int, dt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Iexscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Igather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Igatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce_scatter(sbuf: CP, rbuf: P, rcounts: IP, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce_scatter_block(sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Iscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Iscatter(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Iscatterv(sbuf: CP, scounts: IP, displs: IP, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Reduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Reduce_scatter(sbuf: CP, rbuf: P, rcounts: IP, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Reduce_scatter_block(sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Scan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H) -> c_int;
    fn PMPI_Scatter(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Scatterv(sbuf: CP, scounts: IP, displs: IP, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H) -> c_int;
}

impl Shim {
    /// A collective's entry record on `comm`, sized by `info` from the communicator's shape
    /// (`|shim, ranks, my rank, intercomm|`), with `fl` added to its flags; and the
    /// communicator's entry.
    #[inline(always)]
    pub(crate) fn sized_coll(
        &self,
        comm: H,
        op: Op,
        fl: u16,
        info: impl FnOnce(&Shim, u64, i32, bool) -> CollInfo,
    ) -> (Call, Option<&CommEntry>) {
        let e = self.comm(comm);
        let (n, me, inter) = shape(e);
        let i = info(self, n, me, inter);
        let mut call = self.coll_call(e, op, i.bytes, i.count, i.dtype, i.root, i.flags | fl);
        call.red_op = i.red_op;
        (call, e)
    }

    /// Records a collective around `real`.
    #[inline(always)]
    pub(crate) fn coll(
        &self,
        comm: H,
        op: Op,
        info: impl FnOnce(&Shim, u64, i32, bool) -> CollInfo,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let (call, e) = self.sized_coll(comm, op, 0, info);
            self.begin_coll(e, call)
        });
        let rc = real();
        if let Some(b) = b {
            shielded(self, || self.finish(b.call, b.slot, rc));
        }
        rc
    }

    /// Records a nonblocking collective around `real`, which writes `req`.
    #[inline(always)]
    pub(crate) fn icoll(
        &self,
        comm: H,
        op: Op,
        req: P,
        info: impl FnOnce(&Shim, u64, i32, bool) -> CollInfo,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let (call, e) = self.sized_coll(comm, op, flags::NONBLOCKING, info);
            self.begin_coll(e, call)
        });
        let rc = real();
        if let Some(b) = b {
            shielded(self, || self.posted(b, rc, req, false, 0));
        }
        rc
    }
}

/// Reduce, allreduce, scan, exscan: the whole buffer, reduced with `op`.
pub(crate) fn reduce_info(
    s: &Shim,
    sbuf: CP,
    count: impl Into<i64> + Copy,
    dt: H,
    op: H,
    root: i32,
) -> CollInfo {
    CollInfo::typed(s, cnt(count), dt, root, s.in_place(sbuf)).reducing(s, op)
}

/// Per-rank part × ranks, measured on the receive side.
pub(crate) fn gathered(
    s: &Shim,
    sbuf: CP,
    rcount: impl Into<i64> + Copy,
    rt: H,
    n: u64,
) -> CollInfo {
    CollInfo::typed(s, cnt(rcount) * n, rt, -1, s.in_place(sbuf))
}

pub(crate) fn gatherv_info<T: Copy + Into<i64>>(
    s: &Shim,
    sbuf: CP,
    rcounts: *const T,
    rt: H,
    n: u64,
) -> CollInfo {
    // SAFETY: MPI requires `rcounts` to hold one count per rank here.
    let c = unsafe { sum(rcounts, n) };
    CollInfo::typed(s, c, rt, -1, s.in_place(sbuf))
}

/// Gather/scatter: the root knows the total; other ranks know their part × ranks.
pub(crate) fn rooted_info<C: Copy + Into<i64>>(
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
    CollInfo::typed(s, cnt(c) * n, t, s.root_value(root), fl)
}

pub(crate) fn rooted_v_info<T: Copy + Into<i64>, C: Copy + Into<i64>>(
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
    CollInfo::typed(s, c, t, s.root_value(root), fl)
}

pub(crate) fn reduce_scatter_info<T: Copy + Into<i64>>(
    s: &Shim,
    sbuf: CP,
    rcounts: *const T,
    dt: H,
    op: H,
    n: u64,
) -> CollInfo {
    // SAFETY: MPI requires one count per rank.
    let c = unsafe { sum(rcounts, n) };
    CollInfo::typed(s, c, dt, -1, s.in_place(sbuf)).reducing(s, op)
}

pub(crate) fn reduce_scatter_block_info(
    s: &Shim,
    sbuf: CP,
    rcount: impl Into<i64> + Copy,
    dt: H,
    op: H,
    n: u64,
) -> CollInfo {
    CollInfo::typed(
        s,
        cnt(rcount) * n,
        dt,
        -1,
        s.in_place(sbuf) | flags::BLOCK_VARIANT,
    )
    .reducing(s, op)
}

pub(crate) fn alltoallv_info<T: Copy + Into<i64>>(
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
    CollInfo::typed(s, c, t, -1, fl)
}

/// The size fields of `n` per-peer counts with a datatype each (`alltoallw`-style); `type_at(i)`
/// reads the i-th datatype.
///
/// # Safety
/// `counts` must be null or hold `n` counts, and `type_at` must be valid for `0..n`.
pub(crate) unsafe fn mixed_info<T: Copy + Into<i64>>(
    s: &Shim,
    counts: *const T,
    n: u64,
    type_at: impl Fn(usize) -> H,
    flags: u16,
) -> CollInfo {
    let (mut bytes, mut count) = (0u64, 0u64);
    if !counts.is_null() {
        for i in 0..n as usize {
            // SAFETY: per the contract.
            let c = cnt(unsafe { *counts.add(i) });
            count += c;
            bytes += c * s.type_size(type_at(i));
        }
    }
    CollInfo {
        bytes,
        count,
        dtype: dtype::MIXED,
        root: -1,
        flags,
        red_op: 0,
    }
}

/// A C array of datatype handles, read element by element (`NULL`: none).
fn type_array(s: &Shim, types: CP) -> impl Fn(usize) -> H + '_ {
    // SAFETY: callers read only indices MPI requires the array to hold.
    move |i| unsafe { s.abi.read_handle_at(types, i) as H }
}

pub(crate) fn alltoallw_info<T: Copy + Into<i64>>(
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
    let counts = if types.is_null() {
        std::ptr::null()
    } else {
        counts
    };
    // SAFETY: MPI requires one count and one datatype per rank.
    unsafe { mixed_info(s, counts, n, type_array(s, types), fl) }
}

/// Defines a blocking collective wrapper: the C signature, the communicator argument, the op, and
pub(crate) const NO_DATA: CollInfo = CollInfo {
    bytes: 0,
    count: 0,
    dtype: dtype::NONE,
    root: -1,
    flags: 0,
    red_op: 0,
};

pub(crate) fn bcast_info(s: &Shim, count: impl Into<i64> + Copy, dt: H, root: c_int) -> CollInfo {
    CollInfo::typed(s, cnt(count), dt, s.root_value(root), 0)
}

collective!(MPI_Barrier => PMPI_Barrier(comm: H), comm, Op::Barrier, |_s, _, _, _| NO_DATA);
collective!(MPI_Bcast => PMPI_Bcast(buf: P, count: c_int, dt: H, root: c_int, comm: H), comm, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root));
collective!(MPI_Reduce => PMPI_Reduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H), comm, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, s.root_value(root)));
collective!(MPI_Allreduce => PMPI_Allreduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H), comm, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
collective!(MPI_Scan => PMPI_Scan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H), comm, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
collective!(MPI_Exscan => PMPI_Exscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H), comm, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
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
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, op, n));
collective!(MPI_Reduce_scatter_block => PMPI_Reduce_scatter_block(sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H), comm, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, op, n));
collective!(MPI_Alltoallv => PMPI_Alltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H), comm, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n));
collective!(MPI_Alltoallw => PMPI_Alltoallw(sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H), comm, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n));

// ----- nonblocking collectives -------------------------------------------------------------------

icollective!(MPI_Ibarrier => PMPI_Ibarrier(comm: H, req: P), comm, req, Op::Barrier, |_s, _, _, _| NO_DATA);
icollective!(MPI_Ibcast => PMPI_Ibcast(buf: P, count: c_int, dt: H, root: c_int, comm: H, req: P), comm, req, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root));
icollective!(MPI_Ireduce => PMPI_Ireduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H, req: P), comm, req, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, s.root_value(root)));
icollective!(MPI_Iallreduce => PMPI_Iallreduce(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P), comm, req, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
icollective!(MPI_Iscan => PMPI_Iscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P), comm, req, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
icollective!(MPI_Iexscan => PMPI_Iexscan(sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, req: P), comm, req, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
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
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, op, n));
icollective!(MPI_Ireduce_scatter_block => PMPI_Ireduce_scatter_block(sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, op, n));
icollective!(MPI_Ialltoallv => PMPI_Ialltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H, req: P), comm, req, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n));
icollective!(MPI_Ialltoallw => PMPI_Ialltoallw(sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H, req: P), comm, req, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n));

// ----- neighbourhood collectives -----------------------------------------------------------------
//
// On a topology communicator every member exchanges with its neighbours only. Sizes follow the
// same rule as the dense collectives, over the neighbours: the gathered total received for
// all-gather and all-to-all (count × in-degree), the sum of the send counts for the v/w
// all-to-alls (over the out-degree).

/// (in-degree, out-degree) of a communicator, from its entry.
fn degrees(s: &Shim, comm: H) -> (u64, u64) {
    s.comm(comm).map_or((0, 0), |e| {
        (
            e.indegree.load(Ordering::Relaxed).max(0) as u64,
            e.outdegree.load(Ordering::Relaxed).max(0) as u64,
        )
    })
}

/// `neighbor_allgather` and `neighbor_alltoall`: what arrives from the in-neighbours.
pub(crate) fn neighbor_info(s: &Shim, comm: H, rcount: impl Into<i64> + Copy, rt: H) -> CollInfo {
    let (indeg, _) = degrees(s, comm);
    CollInfo::typed(s, cnt(rcount) * indeg, rt, -1, 0)
}

/// `neighbor_allgatherv`: the sum of the counts received from the in-neighbours.
pub(crate) fn neighbor_v_info<T: Copy + Into<i64>>(
    s: &Shim,
    comm: H,
    counts: *const T,
    t: H,
    outgoing: bool,
) -> CollInfo {
    let (indeg, outdeg) = degrees(s, comm);
    // SAFETY: MPI requires one count per in- (or out-) neighbour.
    let c = unsafe { sum(counts, if outgoing { outdeg } else { indeg }) };
    CollInfo::typed(s, c, t, -1, 0)
}

/// `neighbor_alltoallw`: counts and datatypes per out-neighbour.
pub(crate) fn neighbor_w_info<T: Copy + Into<i64>>(
    s: &Shim,
    comm: H,
    counts: *const T,
    types: CP,
) -> CollInfo {
    let (_, outdeg) = degrees(s, comm);
    let counts = if types.is_null() {
        std::ptr::null()
    } else {
        counts
    };
    // SAFETY: MPI requires one count and one datatype per out-neighbour.
    unsafe { mixed_info(s, counts, outdeg, type_array(s, types), 0) }
}

pmpi! {
    fn PMPI_Neighbor_allgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H) -> c_int;
    fn PMPI_Neighbor_allgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H) -> c_int;
    fn PMPI_Neighbor_alltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H) -> c_int;
    fn PMPI_Neighbor_alltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H) -> c_int;
    fn PMPI_Neighbor_alltoallw(sbuf: CP, scounts: IP, sdispls: CP, sts: CP, rbuf: P, rcounts: IP, rdispls: CP, rts: CP, comm: H) -> c_int;
    fn PMPI_Ineighbor_allgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_allgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_alltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_alltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_alltoallw(sbuf: CP, scounts: IP, sdispls: CP, sts: CP, rbuf: P, rcounts: IP, rdispls: CP, rts: CP, comm: H, req: P) -> c_int;
}

collective!(MPI_Neighbor_allgather => PMPI_Neighbor_allgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H), comm, Op::NeighborAllgather,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt));
collective!(MPI_Neighbor_allgatherv => PMPI_Neighbor_allgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H), comm, Op::NeighborAllgatherv,
    |s, _, _, _| neighbor_v_info(s, comm, rcounts, rt, false));
collective!(MPI_Neighbor_alltoall => PMPI_Neighbor_alltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H), comm, Op::NeighborAlltoall,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt));
collective!(MPI_Neighbor_alltoallv => PMPI_Neighbor_alltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H), comm, Op::NeighborAlltoallv,
    |s, _, _, _| neighbor_v_info(s, comm, scounts, st, true));
collective!(MPI_Neighbor_alltoallw => PMPI_Neighbor_alltoallw(sbuf: CP, scounts: IP, sdispls: CP, sts: CP, rbuf: P, rcounts: IP, rdispls: CP, rts: CP, comm: H), comm, Op::NeighborAlltoallw,
    |s, _, _, _| neighbor_w_info(s, comm, scounts, sts));
icollective!(MPI_Ineighbor_allgather => PMPI_Ineighbor_allgather(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P), comm, req, Op::NeighborAllgather,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt));
icollective!(MPI_Ineighbor_allgatherv => PMPI_Ineighbor_allgatherv(sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H, req: P), comm, req, Op::NeighborAllgatherv,
    |s, _, _, _| neighbor_v_info(s, comm, rcounts, rt, false));
icollective!(MPI_Ineighbor_alltoall => PMPI_Ineighbor_alltoall(sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, req: P), comm, req, Op::NeighborAlltoall,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt));
icollective!(MPI_Ineighbor_alltoallv => PMPI_Ineighbor_alltoallv(sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H, req: P), comm, req, Op::NeighborAlltoallv,
    |s, _, _, _| neighbor_v_info(s, comm, scounts, st, true));
icollective!(MPI_Ineighbor_alltoallw => PMPI_Ineighbor_alltoallw(sbuf: CP, scounts: IP, sdispls: CP, sts: CP, rbuf: P, rcounts: IP, rdispls: CP, rts: CP, comm: H, req: P), comm, req, Op::NeighborAlltoallw,
    |s, _, _, _| neighbor_w_info(s, comm, scounts, sts));
