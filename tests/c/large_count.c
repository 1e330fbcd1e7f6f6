/* MPI-4 large-count (`_c`) calls: recorded under the same names as the int calls.
 * Usage: large_count OUT_DIR (4 ranks, an MPI with MPI-4 large-count support).
 * Writes OUT_DIR/rank-<R>.txt with "call <comm> <op> <bytes>" lines, as coverage.c does.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;
static void call(const char *op, long bytes) { fprintf(out, "call MPI_COMM_WORLD %s %ld\n", op, bytes); }

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
    fclose(out);
    MPI_Finalize();
    return 0;
}
