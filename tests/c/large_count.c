/* MPI-4 large-count (`_c`) calls: recorded under the same names as the int calls.
 * Usage: large_count OUT_DIR (4 ranks, an MPI with MPI-4 large-count support).
 * Writes OUT_DIR/rank-<R>.txt with "call <comm> <op> <bytes>" lines, as coverage.c does.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;
static void call(const char *op, long bytes) { fprintf(out, "call MPI_COMM_WORLD %s %ld\n", op, bytes); }

#define W MPI_COMM_WORLD
#define D MPI_DOUBLE
static void wait1(MPI_Request *q) { MPI_Wait(q, MPI_STATUS_IGNORE); }

/* A ring as a topology communicator: one in- and one out-neighbour. */
static MPI_Comm ring(int left, int right) {
    MPI_Comm c;
    MPI_Dist_graph_create_adjacent(W, 1, &left, MPI_UNWEIGHTED, 1, &right, MPI_UNWEIGHTED, MPI_INFO_NULL, 0, &c);
    return c;
}

/* The other nonblocking collectives and the neighbourhood ones, blocking and not. Sizes follow
 * docs/trace-format.md: a gather's root counts the total, another rank its part times the ranks
 * (v variants: its own part); neighbourhood sizes are over the one neighbour. */
static void more_collectives(int me, int n, double *a, double *b, MPI_Count *counts, MPI_Aint *displs) {
    const int root = 2;
    long part = 16, all = 16L * n;
    MPI_Request q;
    MPI_Datatype types[64];
    MPI_Aint wd[64];
    for (int i = 0; i < n; i++) { types[i] = D; wd[i] = 16 * i; }
    MPI_Iscan_c(a, b, (MPI_Count)3, D, MPI_SUM, W, &q); wait1(&q); call("scan", 24);
    MPI_Iexscan_c(a, b, (MPI_Count)3, D, MPI_SUM, W, &q); wait1(&q); call("exscan", 24);
    MPI_Iallgatherv_c(a, (MPI_Count)2, D, b, counts, displs, D, W, &q); wait1(&q); call("allgatherv", all);
    MPI_Igather_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, root, W, &q); wait1(&q); call("gather", all);
    MPI_Iscatter_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, root, W, &q); wait1(&q); call("scatter", all);
    MPI_Igatherv_c(a, (MPI_Count)2, D, b, counts, displs, D, root, W, &q); wait1(&q); call("gatherv", me == root ? all : part);
    MPI_Iscatterv_c(a, counts, displs, D, b, (MPI_Count)2, D, root, W, &q); wait1(&q); call("scatterv", me == root ? all : part);
    MPI_Ireduce_scatter_c(a, b, counts, D, MPI_SUM, W, &q); wait1(&q); call("reducescatter", all);
    MPI_Ialltoallv_c(a, counts, displs, D, b, counts, displs, D, W, &q); wait1(&q); call("alltoallv", all);
    MPI_Ialltoallw_c(a, counts, wd, types, b, counts, wd, types, W, &q); wait1(&q); call("alltoallw", all);
    MPI_Comm c = ring((me + n - 1) % n, (me + 1) % n);
    MPI_Neighbor_allgather_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, c); call("neighbor_allgather", part);
    MPI_Neighbor_allgatherv_c(a, (MPI_Count)2, D, b, counts, displs, D, c); call("neighbor_allgatherv", part);
    MPI_Neighbor_alltoall_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, c); call("neighbor_alltoall", part);
    MPI_Neighbor_alltoallv_c(a, counts, displs, D, b, counts, displs, D, c); call("neighbor_alltoallv", part);
    MPI_Neighbor_alltoallw_c(a, counts, wd, types, b, counts, wd, types, c); call("neighbor_alltoallw", part);
    MPI_Ineighbor_allgather_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, c, &q); wait1(&q); call("neighbor_allgather", part);
    MPI_Ineighbor_allgatherv_c(a, (MPI_Count)2, D, b, counts, displs, D, c, &q); wait1(&q); call("neighbor_allgatherv", part);
    MPI_Ineighbor_alltoall_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, c, &q); wait1(&q); call("neighbor_alltoall", part);
    MPI_Ineighbor_alltoallv_c(a, counts, displs, D, b, counts, displs, D, c, &q); wait1(&q); call("neighbor_alltoallv", part);
    MPI_Ineighbor_alltoallw_c(a, counts, wd, types, b, counts, wd, types, c, &q); wait1(&q); call("neighbor_alltoallw", part);
    MPI_Comm_free(&c);
}

/* Persistent sends of every mode and persistent receives, started twice: a record per start. */
static void persistent_p2p(int left, int right, double *a, double *b) {
    MPI_Request rq[4], sq[4];
    for (int i = 0; i < 4; i++)
        MPI_Recv_init_c(b + 8 * i, (MPI_Count)(i + 1), D, left, 20 + i, W, &rq[i]);
    MPI_Send_init_c(a, (MPI_Count)1, D, right, 20, W, &sq[0]);
    MPI_Ssend_init_c(a, (MPI_Count)2, D, right, 21, W, &sq[1]);
    MPI_Bsend_init_c(a, (MPI_Count)3, D, right, 22, W, &sq[2]);
    MPI_Rsend_init_c(a, (MPI_Count)4, D, right, 23, W, &sq[3]);
    int bsize = 2 * (24 + MPI_BSEND_OVERHEAD);
    void *bbuf = malloc(bsize);
    MPI_Buffer_attach(bbuf, bsize);
    for (int round = 0; round < 2; round++) {
        MPI_Startall(4, rq);
        MPI_Barrier(W); call("barrier", 0); /* every receive is posted before the ready send */
        MPI_Startall(4, sq);
        for (int i = 0; i < 4; i++) { call("recv", 8 * (i + 1)); call("send", 8 * (i + 1)); }
        MPI_Waitall(4, sq, MPI_STATUSES_IGNORE);
        MPI_Waitall(4, rq, MPI_STATUSES_IGNORE);
    }
    MPI_Buffer_detach(&bbuf, &bsize);
    free(bbuf);
    for (int i = 0; i < 4; i++) { MPI_Request_free(&rq[i]); MPI_Request_free(&sq[i]); }
}

/* Every large-count persistent collective, created once and started once. */
static void persistent_collectives(int me, int n, double *a, double *b, MPI_Count *counts, MPI_Aint *displs) {
    const int root = 2;
    long part = 16, all = 16L * n;
    MPI_Info i0 = MPI_INFO_NULL;
    MPI_Datatype types[64];
    MPI_Aint wd[64];
    for (int i = 0; i < n; i++) { types[i] = D; wd[i] = 16 * i; }
    MPI_Comm c = ring((me + n - 1) % n, (me + 1) % n);
    MPI_Request q[21];
    int k = 0;
    MPI_Allgather_init_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, W, i0, &q[k++]); call("allgather", all);
    MPI_Allgatherv_init_c(a, (MPI_Count)2, D, b, counts, displs, D, W, i0, &q[k++]); call("allgatherv", all);
    MPI_Allreduce_init_c(a, b, (MPI_Count)3, D, MPI_SUM, W, i0, &q[k++]); call("allreduce", 24);
    MPI_Alltoall_init_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, W, i0, &q[k++]); call("alltoall", all);
    MPI_Alltoallv_init_c(a, counts, displs, D, b, counts, displs, D, W, i0, &q[k++]); call("alltoallv", all);
    MPI_Alltoallw_init_c(a, counts, wd, types, b, counts, wd, types, W, i0, &q[k++]); call("alltoallw", all);
    MPI_Bcast_init_c(a, (MPI_Count)5, D, root, W, i0, &q[k++]); call("broadcast", 40);
    MPI_Exscan_init_c(a, b, (MPI_Count)3, D, MPI_SUM, W, i0, &q[k++]); call("exscan", 24);
    MPI_Gather_init_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, root, W, i0, &q[k++]); call("gather", all);
    MPI_Gatherv_init_c(a, (MPI_Count)2, D, b, counts, displs, D, root, W, i0, &q[k++]); call("gatherv", me == root ? all : part);
    MPI_Reduce_init_c(a, b, (MPI_Count)3, D, MPI_SUM, root, W, i0, &q[k++]); call("reduce", 24);
    MPI_Reduce_scatter_init_c(a, b, counts, D, MPI_SUM, W, i0, &q[k++]); call("reducescatter", all);
    MPI_Reduce_scatter_block_init_c(a, b, (MPI_Count)2, D, MPI_SUM, W, i0, &q[k++]); call("reducescatter", all);
    MPI_Scan_init_c(a, b, (MPI_Count)3, D, MPI_SUM, W, i0, &q[k++]); call("scan", 24);
    MPI_Scatter_init_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, root, W, i0, &q[k++]); call("scatter", all);
    MPI_Scatterv_init_c(a, counts, displs, D, b, (MPI_Count)2, D, root, W, i0, &q[k++]); call("scatterv", me == root ? all : part);
    MPI_Neighbor_allgather_init_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, c, i0, &q[k++]); call("neighbor_allgather", part);
    MPI_Neighbor_allgatherv_init_c(a, (MPI_Count)2, D, b, counts, displs, D, c, i0, &q[k++]); call("neighbor_allgatherv", part);
    MPI_Neighbor_alltoall_init_c(a, (MPI_Count)2, D, b, (MPI_Count)2, D, c, i0, &q[k++]); call("neighbor_alltoall", part);
    MPI_Neighbor_alltoallv_init_c(a, counts, displs, D, b, counts, displs, D, c, i0, &q[k++]); call("neighbor_alltoallv", part);
    MPI_Neighbor_alltoallw_init_c(a, counts, wd, types, b, counts, wd, types, c, i0, &q[k++]); call("neighbor_alltoallw", part);
    /* One at a time: collectives on a communicator must be started in the same order everywhere. */
    for (int i = 0; i < k; i++) { MPI_Start(&q[i]); wait1(&q[i]); MPI_Request_free(&q[i]); }
    MPI_Comm_free(&c);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.txt", argv[1], me);
    out = fopen(path, "w");
    double *a = calloc(4096, sizeof(double)), *b = calloc(4096, sizeof(double));
    MPI_Count counts[64];
    MPI_Aint displs[64];
    for (int i = 0; i < n; i++) { counts[i] = 2; displs[i] = 2 * i; }

    MPI_Allreduce_c(a, b, (MPI_Count)512, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); call("allreduce", 4096);
    MPI_Bcast_c(a, (MPI_Count)100, MPI_DOUBLE, 1, MPI_COMM_WORLD); call("broadcast", 800);
    MPI_Reduce_c(a, b, (MPI_Count)10, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD); call("reduce", 80);
    MPI_Allgather_c(a, (MPI_Count)3, MPI_DOUBLE, b, (MPI_Count)3, MPI_DOUBLE, MPI_COMM_WORLD); call("allgather", 24L * n);
    MPI_Allgatherv_c(a, (MPI_Count)2, MPI_DOUBLE, b, counts, displs, MPI_DOUBLE, MPI_COMM_WORLD); call("allgatherv", 16L * n);
    MPI_Alltoall_c(a, (MPI_Count)1, MPI_DOUBLE, b, (MPI_Count)1, MPI_DOUBLE, MPI_COMM_WORLD); call("alltoall", 8L * n);
    MPI_Reduce_scatter_block_c(a, b, (MPI_Count)2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); call("reducescatter", 16L * n);
    MPI_Request r[2];
    MPI_Iallreduce_c(a, b, (MPI_Count)8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r[0]); call("allreduce", 64);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    int right = (me + 1) % n, left = (me + n - 1) % n;
    MPI_Irecv_c(b, (MPI_Count)16, MPI_DOUBLE, left, 5, MPI_COMM_WORLD, &r[0]); call("recv", 128);
    MPI_Isend_c(a, (MPI_Count)16, MPI_DOUBLE, right, 5, MPI_COMM_WORLD, &r[1]); call("send", 128);
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    if (me % 2 == 0) {
        MPI_Send_c(a, (MPI_Count)4, MPI_DOUBLE, right, 6, MPI_COMM_WORLD); call("send", 32);
        MPI_Recv_c(b, (MPI_Count)4, MPI_DOUBLE, left, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE); call("recv", 32);
    } else {
        MPI_Recv_c(b, (MPI_Count)4, MPI_DOUBLE, left, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE); call("recv", 32);
        MPI_Send_c(a, (MPI_Count)4, MPI_DOUBLE, right, 6, MPI_COMM_WORLD); call("send", 32);
    }
    MPI_Sendrecv_c(a, (MPI_Count)5, MPI_DOUBLE, right, 7, b, (MPI_Count)5, MPI_DOUBLE, left, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    call("sendrecv", 40);
    /* MPI-4 nonblocking send-receives, and the nonblocking buffered and ready sends in both
     * count widths. The first receives from a wildcard source (tag 8): MPICH 4.0 completes it
     * with an empty status, so its receive half cannot be resolved. The _replace ones reuse the
     * blocking send-receive's tag 7: their messages are the second and third on it. */
    MPI_Isendrecv(a, 3, MPI_DOUBLE, right, 8, b, 3, MPI_DOUBLE, MPI_ANY_SOURCE, 8, MPI_COMM_WORLD, &r[0]);
    call("sendrecv", 24);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    MPI_Isendrecv_replace(a, 2, MPI_DOUBLE, right, 7, left, 7, MPI_COMM_WORLD, &r[0]);
    call("sendrecv", 16);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    MPI_Isendrecv_c(a, (MPI_Count)4, MPI_DOUBLE, right, 10, b, (MPI_Count)4, MPI_DOUBLE, left, 10, MPI_COMM_WORLD, &r[0]);
    call("sendrecv", 32);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    MPI_Isendrecv_replace_c(a, (MPI_Count)1, MPI_DOUBLE, right, 7, left, 7, MPI_COMM_WORLD, &r[0]);
    call("sendrecv", 8);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    int bsize = 1024 + 2 * MPI_BSEND_OVERHEAD;
    void *bbuf = malloc(bsize);
    MPI_Buffer_attach(bbuf, bsize);
    MPI_Ibsend(a, 2, MPI_DOUBLE, right, 12, MPI_COMM_WORLD, &r[0]); call("send", 16);
    MPI_Ibsend_c(a, (MPI_Count)3, MPI_DOUBLE, right, 13, MPI_COMM_WORLD, &r[1]); call("send", 24);
    MPI_Recv(b, 2, MPI_DOUBLE, left, 12, MPI_COMM_WORLD, MPI_STATUS_IGNORE); call("recv", 16);
    MPI_Recv(b, 3, MPI_DOUBLE, left, 13, MPI_COMM_WORLD, MPI_STATUS_IGNORE); call("recv", 24);
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    MPI_Buffer_detach(&bbuf, &bsize);
    free(bbuf);
    MPI_Irecv(b, 1, MPI_DOUBLE, left, 14, MPI_COMM_WORLD, &r[0]); call("recv", 8);
    MPI_Irecv(b + 1, 2, MPI_DOUBLE, left, 15, MPI_COMM_WORLD, &r[1]); call("recv", 16);
    MPI_Barrier(MPI_COMM_WORLD); call("barrier", 0);
    MPI_Request rs[2];
    MPI_Irsend(a, 1, MPI_DOUBLE, right, 14, MPI_COMM_WORLD, &rs[0]); call("send", 8);
    MPI_Irsend_c(a, (MPI_Count)2, MPI_DOUBLE, right, 15, MPI_COMM_WORLD, &rs[1]); call("send", 16);
    MPI_Waitall(2, rs, MPI_STATUSES_IGNORE);
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    more_collectives(me, n, a, b, counts, displs);
    persistent_p2p(left, right, a, b);
    persistent_collectives(me, n, a, b, counts, displs);
    fclose(out);
    MPI_Finalize();
    return 0;
}
