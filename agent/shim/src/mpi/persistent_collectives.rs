//! Persistent collectives: MPI-4's `MPI_<coll>_init` (MPICH 4) and Open MPI 4's
//! `MPIX_<coll>_init`, each exported only where the loaded library has it. The call that creates
//! the request records nothing; every `MPI_Start` of it is one instance on its communicator,
//! completed by `MPI_Wait*`/`MPI_Test*` like a nonblocking collective.

use std::ffi::c_int;

use commscope_wire::op::Op;

use super::collectives::{
    NO_DATA, alltoallv_info, alltoallw_info, bcast_info, gathered, gatherv_info, neighbor_info,
    neighbor_v_info, neighbor_w_info, reduce_info, reduce_scatter_block_info, reduce_scatter_info,
    rooted_info, rooted_v_info,
};
use super::{CP, IP, P};
use crate::abi::H;

pcollective!(MPI_Allgather_init => PMPI_Allgather_init, MPIX_Allgather_init => PMPIX_Allgather_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, info: H, req: P), comm, req, Op::Allgather,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));

pcollective!(MPI_Allgatherv_init => PMPI_Allgatherv_init, MPIX_Allgatherv_init => PMPIX_Allgatherv_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H, info: H, req: P), comm, req, Op::Allgatherv,
    |s, n, _, _| gatherv_info(s, sbuf, rcounts, rt, n));

pcollective!(MPI_Allreduce_init => PMPI_Allreduce_init, MPIX_Allreduce_init => PMPIX_Allreduce_init:
    (sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Allreduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));

pcollective!(MPI_Alltoall_init => PMPI_Alltoall_init, MPIX_Alltoall_init => PMPIX_Alltoall_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, info: H, req: P), comm, req, Op::Alltoall,
    |s, n, _, _| gathered(s, sbuf, rcount, rt, n));

pcollective!(MPI_Alltoallv_init => PMPI_Alltoallv_init, MPIX_Alltoallv_init => PMPIX_Alltoallv_init:
    (sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H, info: H, req: P), comm, req, Op::Alltoallv,
    |s, n, _, _| alltoallv_info(s, sbuf, scounts, st, rcounts, rt, n));

pcollective!(MPI_Alltoallw_init => PMPI_Alltoallw_init, MPIX_Alltoallw_init => PMPIX_Alltoallw_init:
    (sbuf: CP, scounts: IP, sdispls: IP, sts: CP, rbuf: P, rcounts: IP, rdispls: IP, rts: CP, comm: H, info: H, req: P), comm, req, Op::Alltoallw,
    |s, n, _, _| alltoallw_info(s, sbuf, scounts, sts, rcounts, rts, n));

pcollective!(MPI_Barrier_init => PMPI_Barrier_init, MPIX_Barrier_init => PMPIX_Barrier_init:
    (comm: H, info: H, req: P), comm, req, Op::Barrier,
    |_s, _, _, _| NO_DATA);

pcollective!(MPI_Bcast_init => PMPI_Bcast_init, MPIX_Bcast_init => PMPIX_Bcast_init:
    (buf: P, count: c_int, dt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Broadcast,
    |s, _, _, _| bcast_info(s, count, dt, root));

pcollective!(MPI_Exscan_init => PMPI_Exscan_init, MPIX_Exscan_init => PMPIX_Exscan_init:
    (sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Exscan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));

pcollective!(MPI_Gather_init => PMPI_Gather_init, MPIX_Gather_init => PMPIX_Gather_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Gather,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (rcount, rt), (scount, st), s.in_place(sbuf)));

pcollective!(MPI_Gatherv_init => PMPI_Gatherv_init, MPIX_Gatherv_init => PMPIX_Gatherv_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Gatherv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, rcounts, rt, (scount, st), s.in_place(sbuf)));

pcollective!(MPI_Reduce_init => PMPI_Reduce_init, MPIX_Reduce_init => PMPIX_Reduce_init:
    (sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Reduce,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, s.root_value(root)));

pcollective!(MPI_Reduce_scatter_init => PMPI_Reduce_scatter_init, MPIX_Reduce_scatter_init => PMPIX_Reduce_scatter_init:
    (sbuf: CP, rbuf: P, rcounts: IP, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_info(s, sbuf, rcounts, dt, op, n));

pcollective!(MPI_Reduce_scatter_block_init => PMPI_Reduce_scatter_block_init, MPIX_Reduce_scatter_block_init => PMPIX_Reduce_scatter_block_init:
    (sbuf: CP, rbuf: P, rcount: c_int, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Reducescatter,
    |s, n, _, _| reduce_scatter_block_info(s, sbuf, rcount, dt, op, n));

pcollective!(MPI_Scan_init => PMPI_Scan_init, MPIX_Scan_init => PMPIX_Scan_init:
    (sbuf: CP, rbuf: P, count: c_int, dt: H, op: H, comm: H, info: H, req: P), comm, req, Op::Scan,
    |s, _, _, _| reduce_info(s, sbuf, count, dt, op, -1));

pcollective!(MPI_Scatter_init => PMPI_Scatter_init, MPIX_Scatter_init => PMPIX_Scatter_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Scatter,
    |s, n, me, inter| rooted_info(s, root, me, inter, n, (scount, st), (rcount, rt), s.in_place(rbuf)));

pcollective!(MPI_Scatterv_init => PMPI_Scatterv_init, MPIX_Scatterv_init => PMPIX_Scatterv_init:
    (sbuf: CP, scounts: IP, displs: IP, st: H, rbuf: P, rcount: c_int, rt: H, root: c_int, comm: H, info: H, req: P), comm, req, Op::Scatterv,
    |s, n, me, inter| rooted_v_info(s, root, me, inter, n, scounts, st, (rcount, rt), s.in_place(rbuf)));

pcollective!(MPI_Neighbor_allgather_init => PMPI_Neighbor_allgather_init, MPIX_Neighbor_allgather_init => PMPIX_Neighbor_allgather_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, info: H, req: P), comm, req, Op::NeighborAllgather,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt));

pcollective!(MPI_Neighbor_allgatherv_init => PMPI_Neighbor_allgatherv_init, MPIX_Neighbor_allgatherv_init => PMPIX_Neighbor_allgatherv_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcounts: IP, displs: IP, rt: H, comm: H, info: H, req: P), comm, req, Op::NeighborAllgatherv,
    |s, _, _, _| neighbor_v_info(s, comm, rcounts, rt, false));

pcollective!(MPI_Neighbor_alltoall_init => PMPI_Neighbor_alltoall_init, MPIX_Neighbor_alltoall_init => PMPIX_Neighbor_alltoall_init:
    (sbuf: CP, scount: c_int, st: H, rbuf: P, rcount: c_int, rt: H, comm: H, info: H, req: P), comm, req, Op::NeighborAlltoall,
    |s, _, _, _| neighbor_info(s, comm, rcount, rt));

pcollective!(MPI_Neighbor_alltoallv_init => PMPI_Neighbor_alltoallv_init, MPIX_Neighbor_alltoallv_init => PMPIX_Neighbor_alltoallv_init:
    (sbuf: CP, scounts: IP, sdispls: IP, st: H, rbuf: P, rcounts: IP, rdispls: IP, rt: H, comm: H, info: H, req: P), comm, req, Op::NeighborAlltoallv,
    |s, _, _, _| neighbor_v_info(s, comm, scounts, st, true));

pcollective!(MPI_Neighbor_alltoallw_init => PMPI_Neighbor_alltoallw_init, MPIX_Neighbor_alltoallw_init => PMPIX_Neighbor_alltoallw_init:
    (sbuf: CP, scounts: IP, sdispls: CP, sts: CP, rbuf: P, rcounts: IP, rdispls: CP, rts: CP, comm: H, info: H, req: P), comm, req, Op::NeighborAlltoallw,
    |s, _, _, _| neighbor_w_info(s, comm, scounts, sts));
