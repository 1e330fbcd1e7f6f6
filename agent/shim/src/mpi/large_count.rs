//! MPI-4 large-count variants:
//!
//! `MPI_Count` counts and `MPI_Aint` displacements; recorded under the same names as the `int`
//! calls. Only libraries that have them (MPICH 4) export them: so does the shim
//! ([`crate::resolve::optional_export`]), so a program that tests for them sees what it would
//! see without commscope.

use std::ffi::c_int;

use commscope_wire::op::{Op, flags};

use super::collectives::{
    alltoallv_info, alltoallw_info, bcast_info, gathered, gatherv_info, neighbor_info,
    neighbor_v_info, neighbor_w_info, reduce_info, reduce_scatter_block_info, reduce_scatter_info,
    rooted_info, rooted_v_info,
};
use super::{CP, P};
use crate::abi::{H, pmpi};

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
    fn PMPI_Ibsend_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Irsend_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Isendrecv_c(sbuf: CP, scount: C, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: C, rt: H, src: c_int, rtag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Isendrecv_replace_c(buf: P, count: C, dt: H, dest: c_int, stag: c_int, src: c_int, rtag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Sendrecv_c(sbuf: CP, scount: C, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: C, rt: H, src: c_int, rtag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Sendrecv_replace_c(buf: P, count: C, dt: H, dest: c_int, stag: c_int, src: c_int, rtag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Send_init_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Recv_init_c(buf: P, count: C, dt: H, src: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ssend_init_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Bsend_init_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Rsend_init_c(buf: CP, count: C, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
}

optional!(MPI_Bcast_c => PMPI_Bcast_c: collective!(@local wrapper => PMPI_Bcast_c(buf: P, count: C, dt: H, root: c_int, comm: H), comm, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root)); );
optional!(MPI_Reduce_c => PMPI_Reduce_c: collective!(@local wrapper => PMPI_Reduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, root: c_int, comm: H), comm, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, s.root_value(root))); );
optional!(MPI_Allreduce_c => PMPI_Allreduce_c: collective!(@local wrapper => PMPI_Allreduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H), comm, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1)); );
optional!(MPI_Scan_c => PMPI_Scan_c: collective!(@local wrapper => PMPI_Scan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H), comm, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1)); );
optional!(MPI_Exscan_c => PMPI_Exscan_c: collective!(@local wrapper => PMPI_Exscan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H), comm, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1)); );
optional!(MPI_Allgather_c => PMPI_Allgather_c: collective!(@local wrapper => PMPI_Allgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H), comm, Op::Allgather,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n)); );
optional!(MPI_Alltoall_c => PMPI_Alltoall_c: collective!(@local wrapper => PMPI_Alltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H), comm, Op::Alltoall,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n)); );
optional!(MPI_Allgatherv_c => PMPI_Allgatherv_c: collective!(@local wrapper => PMPI_Allgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H), comm, Op::Allgatherv,
    |s, n, _, _| gatherv_info(s, sbuf, rcounts, rt, n)); );
optional!(MPI_Gather_c => PMPI_Gather_c: collective!(@local wrapper => PMPI_Gather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H), comm, Op::Gather,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (rcount, rt), (scount, st), s.in_place(sbuf))); );
optional!(MPI_Scatter_c => PMPI_Scatter_c: collective!(@local wrapper => PMPI_Scatter_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H), comm, Op::Scatter,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (scount, st), (rcount, rt), s.in_place(rbuf))); );
optional!(MPI_Gatherv_c => PMPI_Gatherv_c: collective!(@local wrapper => PMPI_Gatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, root: c_int, comm: H), comm, Op::Gatherv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, rcounts, rt, (scount, st), s.in_place(sbuf))); );
optional!(MPI_Scatterv_c => PMPI_Scatterv_c: collective!(@local wrapper => PMPI_Scatterv_c(sbuf: CP, scounts: CA, displs: AA, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H), comm, Op::Scatterv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, scounts, st, (rcount, rt), s.in_place(rbuf))); );
optional!(MPI_Reduce_scatter_c => PMPI_Reduce_scatter_c: collective!(@local wrapper => PMPI_Reduce_scatter_c(sbuf: CP, rbuf: P, rcounts: CA, dt: H, op: H, comm: H), comm, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, op, n)); );
optional!(MPI_Reduce_scatter_block_c => PMPI_Reduce_scatter_block_c: collective!(@local wrapper => PMPI_Reduce_scatter_block_c(sbuf: CP, rbuf: P, rcount: C, dt: H, op: H, comm: H), comm, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, op, n)); );
optional!(MPI_Alltoallv_c => PMPI_Alltoallv_c: collective!(@local wrapper => PMPI_Alltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H), comm, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n)); );
optional!(MPI_Alltoallw_c => PMPI_Alltoallw_c: collective!(@local wrapper => PMPI_Alltoallw_c(sbuf: CP, scounts: CA, sdispls: AA, sts: CP, rbuf: P, rcounts: CA, rdispls: AA, rts: CP, comm: H), comm, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n)); );
optional!(MPI_Ibcast_c => PMPI_Ibcast_c: icollective!(@local wrapper => PMPI_Ibcast_c(buf: P, count: C, dt: H, root: c_int, comm: H, req: P), comm, req, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root)); );
optional!(MPI_Ireduce_c => PMPI_Ireduce_c: icollective!(@local wrapper => PMPI_Ireduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, root: c_int, comm: H, req: P), comm, req, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, s.root_value(root))); );
optional!(MPI_Iallreduce_c => PMPI_Iallreduce_c: icollective!(@local wrapper => PMPI_Iallreduce_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, req: P), comm, req, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1)); );
optional!(MPI_Iallgather_c => PMPI_Iallgather_c: icollective!(@local wrapper => PMPI_Iallgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P), comm, req, Op::Allgather,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n)); );
optional!(MPI_Ialltoall_c => PMPI_Ialltoall_c: icollective!(@local wrapper => PMPI_Ialltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P), comm, req, Op::Alltoall,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n)); );
optional!(MPI_Ireduce_scatter_block_c => PMPI_Ireduce_scatter_block_c: icollective!(@local wrapper => PMPI_Ireduce_scatter_block_c(sbuf: CP, rbuf: P, rcount: C, dt: H, op: H, comm: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, op, n)); );

optional!(MPI_Send_c => PMPI_Send_c: wrap!(@local wrapper => PMPI_Send_c(buf: CP, count: C, dt: H,
        dest: c_int, tag: c_int, comm: H),
    |s, real| s.send(0, count, dt, dest, tag, comm, real)););
optional!(MPI_Ssend_c => PMPI_Ssend_c: wrap!(@local wrapper => PMPI_Ssend_c(buf: CP, count: C,
        dt: H, dest: c_int, tag: c_int, comm: H),
    |s, real| s.send(flags::SYNCHRONOUS, count, dt, dest, tag, comm, real)););
optional!(MPI_Bsend_c => PMPI_Bsend_c: wrap!(@local wrapper => PMPI_Bsend_c(buf: CP, count: C,
        dt: H, dest: c_int, tag: c_int, comm: H),
    |s, real| s.send(flags::BUFFERED, count, dt, dest, tag, comm, real)););
optional!(MPI_Rsend_c => PMPI_Rsend_c: wrap!(@local wrapper => PMPI_Rsend_c(buf: CP, count: C,
        dt: H, dest: c_int, tag: c_int, comm: H),
    |s, real| s.send(flags::READY, count, dt, dest, tag, comm, real)););
optional!(MPI_Recv_c => PMPI_Recv_c: wrap!(@local wrapper => PMPI_Recv_c(buf: P, count: C, dt: H,
        src: c_int, tag: c_int, comm: H, status: P),
    |s, real(status)| s.recv(count, dt, src, tag, comm, status, real)););
optional!(MPI_Isend_c => PMPI_Isend_c: wrap!(@local wrapper => PMPI_Isend_c(buf: CP, count: C,
        dt: H, dest: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Send, 0, count, dt, dest, tag, comm, req, real)););
optional!(MPI_Issend_c => PMPI_Issend_c: wrap!(@local wrapper => PMPI_Issend_c(buf: CP, count: C,
        dt: H, dest: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Send, flags::SYNCHRONOUS, count, dt, dest, tag, comm, req, real)););
optional!(MPI_Ibsend_c => PMPI_Ibsend_c: wrap!(@local wrapper => PMPI_Ibsend_c(buf: CP, count: C,
        dt: H, dest: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Send, flags::BUFFERED, count, dt, dest, tag, comm, req, real)););
optional!(MPI_Irsend_c => PMPI_Irsend_c: wrap!(@local wrapper => PMPI_Irsend_c(buf: CP, count: C,
        dt: H, dest: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Send, flags::READY, count, dt, dest, tag, comm, req, real)););
optional!(MPI_Irecv_c => PMPI_Irecv_c: wrap!(@local wrapper => PMPI_Irecv_c(buf: P, count: C,
        dt: H, src: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Recv, 0, count, dt, src, tag, comm, req, real)););
optional!(MPI_Sendrecv_c => PMPI_Sendrecv_c: wrap!(@local wrapper => PMPI_Sendrecv_c(sbuf: CP,
        scount: C, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: C, rt: H, src: c_int,
        rtag: c_int, comm: H, status: P),
    |s, real(status)| s.sendrecv(scount, st, dest, stag, src, rtag, comm, status, real)););
optional!(MPI_Sendrecv_replace_c => PMPI_Sendrecv_replace_c: wrap!(@local wrapper =>
        PMPI_Sendrecv_replace_c(buf: P, count: C, dt: H, dest: c_int, stag: c_int, src: c_int,
        rtag: c_int, comm: H, status: P),
    |s, real(status)| s.sendrecv(count, dt, dest, stag, src, rtag, comm, status, real)););
optional!(MPI_Isendrecv_c => PMPI_Isendrecv_c: wrap!(@local wrapper => PMPI_Isendrecv_c(sbuf: CP,
        scount: C, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: C, rt: H, src: c_int,
        rtag: c_int, comm: H, req: P),
    |s, real| s.isendrecv(scount, st, dest, stag, src, rtag, comm, req, real)););
optional!(MPI_Isendrecv_replace_c => PMPI_Isendrecv_replace_c: wrap!(@local wrapper =>
        PMPI_Isendrecv_replace_c(buf: P, count: C, dt: H, dest: c_int, stag: c_int, src: c_int,
        rtag: c_int, comm: H, req: P),
    |s, real| s.isendrecv(count, dt, dest, stag, src, rtag, comm, req, real)););

optional!(MPI_Send_init_c => PMPI_Send_init_c:
    persistent_init!(@local wrapper, PMPI_Send_init_c, Op::Send, 0, CP, C);
);
optional!(MPI_Recv_init_c => PMPI_Recv_init_c:
    persistent_init!(@local wrapper, PMPI_Recv_init_c, Op::Recv, 0, P, C);
);
optional!(MPI_Ssend_init_c => PMPI_Ssend_init_c:
    persistent_init!(@local wrapper, PMPI_Ssend_init_c, Op::Send, flags::SYNCHRONOUS, CP, C);
);
optional!(MPI_Bsend_init_c => PMPI_Bsend_init_c:
    persistent_init!(@local wrapper, PMPI_Bsend_init_c, Op::Send, flags::BUFFERED, CP, C);
);
optional!(MPI_Rsend_init_c => PMPI_Rsend_init_c:
    persistent_init!(@local wrapper, PMPI_Rsend_init_c, Op::Send, flags::READY, CP, C);
);

// ----- nonblocking collectives -------------------------------------------------------------------

pmpi! {
    fn PMPI_Iscan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Iexscan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Iallgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Igather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Iscatter_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Igatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Iscatterv_c(sbuf: CP, scounts: CA, displs: AA, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ireduce_scatter_c(sbuf: CP, rbuf: P, rcounts: CA, dt: H, op: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ialltoallw_c(sbuf: CP, scounts: CA, sdispls: AA, sts: CP, rbuf: P, rcounts: CA, rdispls: AA, rts: CP, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_allgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_allgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_alltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_alltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H, req: P) -> c_int;
    fn PMPI_Ineighbor_alltoallw_c(sbuf: CP, scounts: CA, sdispls: CP, sts: CP, rbuf: P, rcounts: CA, rdispls: CP, rts: CP, comm: H, req: P) -> c_int;
}

optional!(MPI_Iscan_c => PMPI_Iscan_c: icollective!(@local wrapper => PMPI_Iscan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, req: P), comm, req, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1)); );
optional!(MPI_Iexscan_c => PMPI_Iexscan_c: icollective!(@local wrapper => PMPI_Iexscan_c(sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, req: P), comm, req, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1)); );
optional!(MPI_Iallgatherv_c => PMPI_Iallgatherv_c: icollective!(@local wrapper => PMPI_Iallgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H, req: P), comm, req, Op::Allgatherv,
    |s, n, _, _| gatherv_info(s, sbuf, rcounts, rt, n)); );
optional!(MPI_Igather_c => PMPI_Igather_c: icollective!(@local wrapper => PMPI_Igather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, req: P), comm, req, Op::Gather,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (rcount, rt), (scount, st), s.in_place(sbuf))); );
optional!(MPI_Iscatter_c => PMPI_Iscatter_c: icollective!(@local wrapper => PMPI_Iscatter_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, req: P), comm, req, Op::Scatter,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (scount, st), (rcount, rt), s.in_place(rbuf))); );
optional!(MPI_Igatherv_c => PMPI_Igatherv_c: icollective!(@local wrapper => PMPI_Igatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, root: c_int, comm: H, req: P), comm, req, Op::Gatherv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, rcounts, rt, (scount, st), s.in_place(sbuf))); );
optional!(MPI_Iscatterv_c => PMPI_Iscatterv_c: icollective!(@local wrapper => PMPI_Iscatterv_c(sbuf: CP, scounts: CA, displs: AA, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, req: P), comm, req, Op::Scatterv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, scounts, st, (rcount, rt), s.in_place(rbuf))); );
optional!(MPI_Ireduce_scatter_c => PMPI_Ireduce_scatter_c: icollective!(@local wrapper => PMPI_Ireduce_scatter_c(sbuf: CP, rbuf: P, rcounts: CA, dt: H, op: H, comm: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, op, n)); );
optional!(MPI_Ialltoallv_c => PMPI_Ialltoallv_c: icollective!(@local wrapper => PMPI_Ialltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H, req: P), comm, req, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n)); );
optional!(MPI_Ialltoallw_c => PMPI_Ialltoallw_c: icollective!(@local wrapper => PMPI_Ialltoallw_c(sbuf: CP, scounts: CA, sdispls: AA, sts: CP, rbuf: P, rcounts: CA, rdispls: AA, rts: CP, comm: H, req: P), comm, req, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n)); );
optional!(MPI_Ineighbor_allgather_c => PMPI_Ineighbor_allgather_c: icollective!(@local wrapper => PMPI_Ineighbor_allgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P), comm, req, Op::NeighborAllgather,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt)); );
optional!(MPI_Ineighbor_allgatherv_c => PMPI_Ineighbor_allgatherv_c: icollective!(@local wrapper => PMPI_Ineighbor_allgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H, req: P), comm, req, Op::NeighborAllgatherv,
    |s, _, _, _| neighbor_v_info(s, comm, rcounts, rt, false)); );
optional!(MPI_Ineighbor_alltoall_c => PMPI_Ineighbor_alltoall_c: icollective!(@local wrapper => PMPI_Ineighbor_alltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, req: P), comm, req, Op::NeighborAlltoall,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt)); );
optional!(MPI_Ineighbor_alltoallv_c => PMPI_Ineighbor_alltoallv_c: icollective!(@local wrapper => PMPI_Ineighbor_alltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H, req: P), comm, req, Op::NeighborAlltoallv,
    |s, _, _, _| neighbor_v_info(s, comm, scounts, st, true)); );
optional!(MPI_Ineighbor_alltoallw_c => PMPI_Ineighbor_alltoallw_c: icollective!(@local wrapper => PMPI_Ineighbor_alltoallw_c(sbuf: CP, scounts: CA, sdispls: CP, sts: CP, rbuf: P, rcounts: CA, rdispls: CP, rts: CP, comm: H, req: P), comm, req, Op::NeighborAlltoallw,
    |s, _, _, _| neighbor_w_info(s, comm, scounts, sts)); );

// ----- persistent collectives --------------------------------------------------------------------

pcollective!(MPI_Allgather_init_c => PMPI_Allgather_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, info: H, req: P), comm, req, Op::Allgather,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
pcollective!(MPI_Allgatherv_init_c => PMPI_Allgatherv_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H, info: H, req: P), comm, req, Op::Allgatherv,
    |s, n, _, _| gatherv_info(s, sbuf, rcounts, rt, n));
pcollective!(MPI_Allreduce_init_c => PMPI_Allreduce_init_c:
    (sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
pcollective!(MPI_Alltoall_init_c => PMPI_Alltoall_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, info: H, req: P), comm, req, Op::Alltoall,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));
pcollective!(MPI_Alltoallv_init_c => PMPI_Alltoallv_init_c:
    (sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H, info: H, req: P), comm, req, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n));
pcollective!(MPI_Alltoallw_init_c => PMPI_Alltoallw_init_c:
    (sbuf: CP, scounts: CA, sdispls: AA, sts: CP, rbuf: P, rcounts: CA, rdispls: AA, rts: CP, comm: H, info: H, req: P), comm, req, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n));
pcollective!(MPI_Bcast_init_c => PMPI_Bcast_init_c:
    (buf: P, count: C, dt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root));
pcollective!(MPI_Exscan_init_c => PMPI_Exscan_init_c:
    (sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
pcollective!(MPI_Gather_init_c => PMPI_Gather_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Gather,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (rcount, rt), (scount, st), s.in_place(sbuf)));
pcollective!(MPI_Gatherv_init_c => PMPI_Gatherv_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Gatherv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, rcounts, rt, (scount, st), s.in_place(sbuf)));
pcollective!(MPI_Reduce_init_c => PMPI_Reduce_init_c:
    (sbuf: CP, rbuf: P, count: C, dt: H, op: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, s.root_value(root)));
pcollective!(MPI_Reduce_scatter_init_c => PMPI_Reduce_scatter_init_c:
    (sbuf: CP, rbuf: P, rcounts: CA, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, op, n));
pcollective!(MPI_Reduce_scatter_block_init_c => PMPI_Reduce_scatter_block_init_c:
    (sbuf: CP, rbuf: P, rcount: C, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, op, n));
pcollective!(MPI_Scan_init_c => PMPI_Scan_init_c:
    (sbuf: CP, rbuf: P, count: C, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));
pcollective!(MPI_Scatter_init_c => PMPI_Scatter_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Scatter,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (scount, st), (rcount, rt), s.in_place(rbuf)));
pcollective!(MPI_Scatterv_init_c => PMPI_Scatterv_init_c:
    (sbuf: CP, scounts: CA, displs: AA, st: H, rbuf: P, rcount: C, rt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Scatterv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, scounts, st, (rcount, rt), s.in_place(rbuf)));
pcollective!(MPI_Neighbor_allgather_init_c => PMPI_Neighbor_allgather_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, info: H, req: P), comm, req, Op::NeighborAllgather,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt));
pcollective!(MPI_Neighbor_allgatherv_init_c => PMPI_Neighbor_allgatherv_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H, info: H, req: P), comm, req, Op::NeighborAllgatherv,
    |s, _, _, _| neighbor_v_info(s, comm, rcounts, rt, false));
pcollective!(MPI_Neighbor_alltoall_init_c => PMPI_Neighbor_alltoall_init_c:
    (sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H, info: H, req: P), comm, req, Op::NeighborAlltoall,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt));
pcollective!(MPI_Neighbor_alltoallv_init_c => PMPI_Neighbor_alltoallv_init_c:
    (sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H, info: H, req: P), comm, req, Op::NeighborAlltoallv,
    |s, _, _, _| neighbor_v_info(s, comm, scounts, st, true));
pcollective!(MPI_Neighbor_alltoallw_init_c => PMPI_Neighbor_alltoallw_init_c:
    (sbuf: CP, scounts: CA, sdispls: CP, sts: CP, rbuf: P, rcounts: CA, rdispls: CP, rts: CP, comm: H, info: H, req: P), comm, req, Op::NeighborAlltoallw,
    |s, _, _, _| neighbor_w_info(s, comm, scounts, sts));

pmpi! {
    fn PMPI_Neighbor_allgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H) -> c_int;
    fn PMPI_Neighbor_allgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H) -> c_int;
    fn PMPI_Neighbor_alltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H) -> c_int;
    fn PMPI_Neighbor_alltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H) -> c_int;
    fn PMPI_Neighbor_alltoallw_c(sbuf: CP, scounts: CA, sdispls: AA, sts: CP, rbuf: P, rcounts: CA, rdispls: AA, rts: CP, comm: H) -> c_int;
}

optional!(MPI_Neighbor_allgather_c => PMPI_Neighbor_allgather_c: collective!(@local wrapper => PMPI_Neighbor_allgather_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H), comm, Op::NeighborAllgather,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt)); );
optional!(MPI_Neighbor_allgatherv_c => PMPI_Neighbor_allgatherv_c: collective!(@local wrapper => PMPI_Neighbor_allgatherv_c(sbuf: CP, scount: C, st: H, rbuf: P, rcounts: CA, displs: AA, rt: H, comm: H), comm, Op::NeighborAllgatherv,
    |s, _, _, _| neighbor_v_info(s, comm, rcounts, rt, false)); );
optional!(MPI_Neighbor_alltoall_c => PMPI_Neighbor_alltoall_c: collective!(@local wrapper => PMPI_Neighbor_alltoall_c(sbuf: CP, scount: C, st: H, rbuf: P, rcount: C, rt: H, comm: H), comm, Op::NeighborAlltoall,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt)); );
optional!(MPI_Neighbor_alltoallv_c => PMPI_Neighbor_alltoallv_c: collective!(@local wrapper => PMPI_Neighbor_alltoallv_c(sbuf: CP, scounts: CA, sdispls: AA, st: H, rbuf: P, rcounts: CA, rdispls: AA, rt: H, comm: H), comm, Op::NeighborAlltoallv,
    |s, _, _, _| neighbor_v_info(s, comm, scounts, st, true)); );
optional!(MPI_Neighbor_alltoallw_c => PMPI_Neighbor_alltoallw_c: collective!(@local wrapper => PMPI_Neighbor_alltoallw_c(sbuf: CP, scounts: CA, sdispls: AA, sts: CP, rbuf: P, rcounts: CA, rdispls: AA, rts: CP, comm: H), comm, Op::NeighborAlltoallw,
    |s, _, _, _| neighbor_w_info(s, comm, scounts, sts)); );
