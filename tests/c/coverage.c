/* Exercises every MPI entry point libcommscope.so wraps, on many kinds of communicators, and
 * writes down what it did so a test can compare the trace against it.
 *
 * Usage: coverage OUT_DIR   (needs exactly 8 ranks)
 *
 * OUT_DIR/rank-<R>.txt gets lines:
 *   call <comm-name> <op> <bytes>        one per call this rank made
 *   members <comm-name> <r> <r> ...      world ranks of each named communicator's members
 * Bytes follow commscope's rule (docs/trace-format.md): nccl-tests' "size" of the collective.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static FILE *out;
static int world_rank, world_size;

static void call(const char *comm, const char *op, long bytes) {
    fprintf(out, "call %s %s %ld\n", comm, op, bytes);
}

static void name_comm(MPI_Comm c, const char *name) {
    MPI_Comm_set_name(c, name);
    MPI_Group g, wg;
    int n;
    MPI_Comm_group(c, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_size(g, &n);
    int inter = 0;
    MPI_Comm_test_inter(c, &inter);
    int *r = malloc(sizeof(int) * 2 * (n + 8)), *w = malloc(sizeof(int) * 2 * (n + 8));
    for (int i = 0; i < n; i++) r[i] = i;
    MPI_Group_translate_ranks(g, n, r, wg, w);
    int total = n;
    if (inter) {
        MPI_Group rg;
        int rn;
        MPI_Comm_remote_group(c, &rg);
        MPI_Group_size(rg, &rn);
        for (int i = 0; i < rn; i++) r[i] = i;
        MPI_Group_translate_ranks(rg, rn, r, wg, w + n);
        total += rn;
        MPI_Group_free(&rg);
    }
    fprintf(out, "members %s", name);
    for (int i = 0; i < total; i++) fprintf(out, " %d", w[i]);
    fprintf(out, "\n");
    free(r);
    free(w);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
}

/* All blocking and nonblocking collectives on `c` (an intracommunicator of size n). */
static void all_collectives(MPI_Comm c, const char *name) {
    int n, me;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    int *ibuf = calloc(4096, sizeof(int)), *ibuf2 = calloc(4096, sizeof(int));
    double *dbuf = calloc(4096, sizeof(double)), *dbuf2 = calloc(4096, sizeof(double));
    int *counts = malloc(sizeof(int) * n), *displs = malloc(sizeof(int) * n);
    MPI_Datatype *types = malloc(sizeof(MPI_Datatype) * n);

    MPI_Barrier(c); call(name, "barrier", 0);
    for (int root = 0; root < 3 && root < n; root++) {
        MPI_Bcast(ibuf, 100, MPI_INT, root, c); call(name, "broadcast", 400);
    }
    MPI_Reduce(dbuf, dbuf2, 50, MPI_DOUBLE, MPI_SUM, n - 1, c); call(name, "reduce", 400);
    for (int i = 0; i < 3; i++) {
        MPI_Allreduce(dbuf, dbuf2, 1024, MPI_DOUBLE, MPI_SUM, c); call(name, "allreduce", 8192);
    }
    MPI_Allreduce(MPI_IN_PLACE, dbuf, 1024, MPI_DOUBLE, MPI_MAX, c); call(name, "allreduce", 8192);
    MPI_Allgather(ibuf, 10, MPI_INT, ibuf2, 10, MPI_INT, c); call(name, "allgather", 10L * 4 * n);
    long vsum = 0;
    for (int i = 0; i < n; i++) { counts[i] = i + 1; displs[i] = vsum; vsum += counts[i]; }
    MPI_Allgatherv(ibuf, me + 1, MPI_INT, ibuf2, counts, displs, MPI_INT, c); call(name, "allgatherv", vsum * 4);
    MPI_Gather(ibuf, 5, MPI_INT, ibuf2, 5, MPI_INT, 0, c); call(name, "gather", 5L * 4 * n);
    int groot = 1 % n;
    MPI_Gatherv(ibuf, me + 1, MPI_INT, ibuf2, counts, displs, MPI_INT, groot, c);
    call(name, "gatherv", me == groot ? vsum * 4 : (me + 1) * 4L);
    MPI_Scatter(ibuf, 6, MPI_INT, ibuf2, 6, MPI_INT, 2 % n, c); call(name, "scatter", 6L * 4 * n);
    for (int i = 0; i < n; i++) { counts[i] = 2; displs[i] = 2 * i; }
    MPI_Scatterv(ibuf, counts, displs, MPI_INT, ibuf2, 2, MPI_INT, 0, c);
    call(name, "scatterv", me == 0 ? 2L * 4 * n : 8);
    for (int i = 0; i < n; i++) counts[i] = 3;
    MPI_Reduce_scatter(ibuf, ibuf2, counts, MPI_INT, MPI_SUM, c); call(name, "reducescatter", 3L * n * 4);
    MPI_Reduce_scatter_block(ibuf, ibuf2, 4, MPI_INT, MPI_SUM, c); call(name, "reducescatter", 4L * n * 4);
    MPI_Alltoall(ibuf, 2, MPI_INT, ibuf2, 2, MPI_INT, c); call(name, "alltoall", 2L * 4 * n);
    for (int i = 0; i < n; i++) { counts[i] = 1; displs[i] = i; types[i] = MPI_INT; }
    MPI_Alltoallv(ibuf, counts, displs, MPI_INT, ibuf2, counts, displs, MPI_INT, c); call(name, "alltoallv", 4L * n);
    for (int i = 0; i < n; i++) displs[i] = 4 * i; /* byte displacements */
    MPI_Alltoallw(ibuf, counts, displs, types, ibuf2, counts, displs, types, c); call(name, "alltoallw", 4L * n);
    MPI_Scan(ibuf, ibuf2, 7, MPI_INT, MPI_SUM, c); call(name, "scan", 28);
    MPI_Exscan(ibuf, ibuf2, 7, MPI_INT, MPI_SUM, c); call(name, "exscan", 28);

    /* Nonblocking collectives, completed through every wait/test flavour. */
    MPI_Request r[4];
    int flag = 0, idx, outc, indices[4];
    MPI_Iallreduce(dbuf, dbuf2, 256, MPI_DOUBLE, MPI_SUM, c, &r[0]); call(name, "allreduce", 2048);
    MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    MPI_Ibcast(ibuf, 64, MPI_INT, 0, c, &r[0]); call(name, "broadcast", 256);
    do { MPI_Test(&r[0], &flag, MPI_STATUS_IGNORE); } while (!flag);
    MPI_Ibarrier(c, &r[0]); call(name, "barrier", 0);
    MPI_Waitany(1, r, &idx, MPI_STATUS_IGNORE);
    MPI_Iallgather(ibuf, 3, MPI_INT, ibuf2, 3, MPI_INT, c, &r[0]); call(name, "allgather", 12L * n);
    MPI_Ialltoall(ibuf, 1, MPI_INT, ibuf + 2048, 1, MPI_INT, c, &r[1]); call(name, "alltoall", 4L * n);
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    MPI_Ireduce(dbuf, dbuf2, 32, MPI_DOUBLE, MPI_SUM, 0, c, &r[0]); call(name, "reduce", 256);
    MPI_Iscan(ibuf, ibuf2, 4, MPI_INT, MPI_SUM, c, &r[1]); call(name, "scan", 16);
    int left = 2;
    while (left > 0) {
        MPI_Waitsome(2, r, &outc, indices, MPI_STATUSES_IGNORE);
        if (outc != MPI_UNDEFINED) left -= outc;
    }
    MPI_Ireduce_scatter_block(ibuf, ibuf2, 2, MPI_INT, MPI_SUM, c, &r[0]); call(name, "reducescatter", 8L * n);
    MPI_Iexscan(ibuf, ibuf2 + 1024, 4, MPI_INT, MPI_SUM, c, &r[1]); call(name, "exscan", 16);
    do { MPI_Testall(2, r, &flag, MPI_STATUSES_IGNORE); } while (!flag);
    MPI_Igather(ibuf, 2, MPI_INT, ibuf2, 2, MPI_INT, 0, c, &r[0]); call(name, "gather", 8L * n);
    do { MPI_Testany(1, r, &idx, &flag, MPI_STATUS_IGNORE); } while (!flag);
    free(ibuf); free(ibuf2); free(dbuf); free(dbuf2); free(counts); free(displs); free(types);
}

/* Point-to-point patterns on the world communicator. */
static void p2p(void) {
    const char *w = "MPI_COMM_WORLD";
    int me = world_rank, n = world_size;
    int right = (me + 1) % n, left = (me + n - 1) % n;
    char sbuf[1024], rbuf[1024];
    memset(sbuf, me, sizeof sbuf);
    MPI_Status st;

    /* Blocking ring, ordered to avoid deadlock. */
    if (me % 2 == 0) {
        MPI_Send(sbuf, 1024, MPI_CHAR, right, 7, MPI_COMM_WORLD); call(w, "send", 1024);
        MPI_Recv(rbuf, 1024, MPI_CHAR, left, 7, MPI_COMM_WORLD, &st); call(w, "recv", 1024);
    } else {
        MPI_Recv(rbuf, 1024, MPI_CHAR, left, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE); call(w, "recv", 1024);
        MPI_Send(sbuf, 1024, MPI_CHAR, right, 7, MPI_COMM_WORLD); call(w, "send", 1024);
    }
    /* Synchronous send to a wildcard-source receive. */
    if (me % 2 == 0) {
        MPI_Ssend(sbuf, 100, MPI_CHAR, me + 1, 11, MPI_COMM_WORLD); call(w, "send", 100);
    } else {
        MPI_Recv(rbuf, 100, MPI_CHAR, MPI_ANY_SOURCE, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE); call(w, "recv", 100);
    }
    /* Buffered send to a wildcard-tag receive. */
    int bsize = 4096 + MPI_BSEND_OVERHEAD;
    void *bbuf = malloc(bsize);
    MPI_Buffer_attach(bbuf, bsize);
    MPI_Bsend(sbuf, 64, MPI_CHAR, left, 12, MPI_COMM_WORLD); call(w, "send", 64);
    MPI_Recv(rbuf, 64, MPI_CHAR, right, MPI_ANY_TAG, MPI_COMM_WORLD, &st); call(w, "recv", 64);
    /* The same with a nonblocking buffered send. */
    MPI_Request bq;
    MPI_Ibsend(sbuf, 48, MPI_CHAR, left, 14, MPI_COMM_WORLD, &bq); call(w, "send", 48);
    MPI_Recv(rbuf, 64, MPI_CHAR, right, 14, MPI_COMM_WORLD, &st); call(w, "recv", 48);
    MPI_Wait(&bq, MPI_STATUS_IGNORE);
    MPI_Buffer_detach(&bbuf, &bsize);
    free(bbuf);
    /* Ready send: the receive is posted before a barrier. */
    MPI_Request rq;
    MPI_Irecv(rbuf, 32, MPI_CHAR, left, 13, MPI_COMM_WORLD, &rq); call(w, "recv", 32);
    MPI_Barrier(MPI_COMM_WORLD); call(w, "barrier", 0);
    MPI_Rsend(sbuf, 32, MPI_CHAR, right, 13, MPI_COMM_WORLD); call(w, "send", 32);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    /* And a nonblocking ready send. */
    MPI_Irecv(rbuf, 24, MPI_CHAR, left, 15, MPI_COMM_WORLD, &rq); call(w, "recv", 24);
    MPI_Barrier(MPI_COMM_WORLD); call(w, "barrier", 0);
    MPI_Request irs;
    MPI_Irsend(sbuf, 24, MPI_CHAR, right, 15, MPI_COMM_WORLD, &irs); call(w, "send", 24);
    MPI_Wait(&irs, MPI_STATUS_IGNORE);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    /* Nonblocking exchanges with three tags, completed by different calls. */
    MPI_Request r[6];
    int flag = 0, idx, outc, indices[6];
    for (int t = 0; t < 3; t++) {
        MPI_Irecv(rbuf + 100 * t, 10, MPI_CHAR, t == 2 ? MPI_ANY_SOURCE : left, 20 + t, MPI_COMM_WORLD, &r[2 * t]);
        call(w, "recv", 10);
        MPI_Isend(sbuf, 10, MPI_CHAR, right, 20 + t, MPI_COMM_WORLD, &r[2 * t + 1]);
        call(w, "send", 10);
    }
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    int left_to_do = 2;
    while (left_to_do > 0) {
        MPI_Waitsome(2, r + 2, &outc, indices, MPI_STATUSES_IGNORE);
        if (outc != MPI_UNDEFINED) left_to_do -= outc;
    }
    MPI_Status sts[2];
    do { MPI_Testall(2, r + 4, &flag, sts); } while (!flag);
    /* Synchronous nonblocking send completed with a Test loop; ANY_TAG receive with Waitany. */
    MPI_Issend(sbuf, 16, MPI_CHAR, right, 30, MPI_COMM_WORLD, &r[0]); call(w, "send", 16);
    MPI_Irecv(rbuf, 16, MPI_CHAR, left, MPI_ANY_TAG, MPI_COMM_WORLD, &r[1]); call(w, "recv", 16);
    MPI_Waitany(2, r, &idx, MPI_STATUS_IGNORE);
    MPI_Waitany(2, r, &idx, &st);
    do { MPI_Testany(2, r, &idx, &flag, MPI_STATUS_IGNORE); } while (!flag);
    /* Sendrecv: shift by two. */
    MPI_Sendrecv(sbuf, 200, MPI_CHAR, (me + 2) % n, 40, rbuf, 200, MPI_CHAR, MPI_ANY_SOURCE, 40, MPI_COMM_WORLD, &st);
    call(w, "sendrecv", 200);
    /* Receives posted larger than what arrives record what arrived. */
    MPI_Send(sbuf, 10, MPI_CHAR, right, 90, MPI_COMM_WORLD); call(w, "send", 10);
    MPI_Recv(rbuf, 1000, MPI_CHAR, left, 90, MPI_COMM_WORLD, MPI_STATUS_IGNORE); call(w, "recv", 10);
    MPI_Irecv(rbuf, 1000, MPI_CHAR, MPI_ANY_SOURCE, 91, MPI_COMM_WORLD, &rq); call(w, "recv", 20);
    MPI_Send(sbuf, 20, MPI_CHAR, right, 91, MPI_COMM_WORLD); call(w, "send", 20);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    /* Persistent requests: a halo exchange started three times, with Start and Startall. */
    MPI_Request pr[2];
    MPI_Recv_init(rbuf, 48, MPI_CHAR, left, 70, MPI_COMM_WORLD, &pr[0]);
    MPI_Send_init(sbuf, 48, MPI_CHAR, right, 70, MPI_COMM_WORLD, &pr[1]);
    for (int k = 0; k < 3; k++) {
        if (k == 0) {
            MPI_Start(&pr[0]);
            MPI_Start(&pr[1]);
        } else {
            MPI_Startall(2, pr);
        }
        call(w, "recv", 48);
        call(w, "send", 48);
        MPI_Waitall(2, pr, MPI_STATUSES_IGNORE);
    }
    MPI_Request_free(&pr[0]);
    MPI_Request_free(&pr[1]);
    /* Sendrecv_replace: shift by three. */
    MPI_Sendrecv_replace(rbuf, 24, MPI_CHAR, (me + 3) % n, 80, (me + n - 3) % n, 80, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    call(w, "sendrecv", 24);
    /* A send to MPI_PROC_NULL is still a call. */
    MPI_Send(sbuf, 8, MPI_CHAR, MPI_PROC_NULL, 50, MPI_COMM_WORLD); call(w, "send", 8);
    /* A send request released with MPI_Request_free; the barrier keeps the buffer alive. */
    MPI_Isend(sbuf, 4, MPI_CHAR, right, 60, MPI_COMM_WORLD, &rq); call(w, "send", 4);
    MPI_Request_free(&rq);
    MPI_Recv(rbuf, 4, MPI_CHAR, left, 60, MPI_COMM_WORLD, MPI_STATUS_IGNORE); call(w, "recv", 4);
    MPI_Barrier(MPI_COMM_WORLD); call(w, "barrier", 0);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (argc < 2 || world_size != 8) {
        if (world_rank == 0) fprintf(stderr, "usage: coverage OUT_DIR (with 8 ranks)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.txt", argv[1], world_rank);
    out = fopen(path, "w");
    if (!out) { perror(path); MPI_Abort(MPI_COMM_WORLD, 3); }
    name_comm(MPI_COMM_WORLD, "MPI_COMM_WORLD");

    all_collectives(MPI_COMM_WORLD, "MPI_COMM_WORLD");
    p2p();

    /* Split by parity: two communicators of 4, named by color. */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
    const char *half_name = world_rank % 2 ? "half-odd" : "half-even";
    name_comm(half, half_name);
    all_collectives(half, half_name);

    /* Split by shared memory (one node here: everyone). */
    MPI_Comm shared;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &shared);
    name_comm(shared, "shared");
    MPI_Allreduce(MPI_IN_PLACE, &provided, 1, MPI_INT, MPI_MAX, shared); call("shared", "allreduce", 4);

    /* Duplicates: blocking, with info, nonblocking. */
    MPI_Comm dup, dupi, idup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    name_comm(dup, "world-dup");
    all_collectives(dup, "world-dup");
    MPI_Comm_dup_with_info(half, MPI_INFO_NULL, &dupi);
    name_comm(dupi, world_rank % 2 ? "half-odd-dup" : "half-even-dup");
    MPI_Barrier(dupi); call(world_rank % 2 ? "half-odd-dup" : "half-even-dup", "barrier", 0);
    MPI_Request rq;
    MPI_Comm_idup(MPI_COMM_WORLD, &idup, &rq);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    name_comm(idup, "world-idup");
    MPI_Allreduce(MPI_IN_PLACE, &provided, 1, MPI_INT, MPI_MAX, idup); call("world-idup", "allreduce", 4);

    /* Comm_create (collective over the parent): even ranks only. */
    MPI_Group wg, eg, fg;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int evens[4] = {0, 2, 4, 6}, first[4] = {0, 1, 2, 3};
    MPI_Group_incl(wg, 4, evens, &eg);
    MPI_Comm ev;
    MPI_Comm_create(MPI_COMM_WORLD, eg, &ev);
    if (ev != MPI_COMM_NULL) {
        name_comm(ev, "evens");
        MPI_Bcast(&provided, 1, MPI_INT, 3, ev); call("evens", "broadcast", 4);
    }
    /* Comm_create_group (collective over the group only): ranks 0-3. */
    MPI_Group_incl(wg, 4, first, &fg);
    MPI_Comm fc = MPI_COMM_NULL;
    if (world_rank < 4) {
        MPI_Comm_create_group(MPI_COMM_WORLD, fg, 99, &fc);
        name_comm(fc, "first-four");
        MPI_Barrier(fc); call("first-four", "barrier", 0);
    }

    /* Cartesian 2x4 and its rows. */
    MPI_Comm cart, row;
    int dims[2] = {2, 4}, periods[2] = {1, 1}, remain[2] = {0, 1};
    MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &cart);
    name_comm(cart, "cart");
    MPI_Allreduce(MPI_IN_PLACE, &provided, 1, MPI_INT, MPI_MAX, cart); call("cart", "allreduce", 4);
    MPI_Cart_sub(cart, remain, &row);
    const char *row_name = world_rank < 4 ? "cart-row0" : "cart-row1";
    name_comm(row, row_name);
    MPI_Allreduce(MPI_IN_PLACE, &provided, 1, MPI_INT, MPI_MAX, row); call(row_name, "allreduce", 4);

    /* Graph topologies: a ring three ways. */
    int index[8], edges[16];
    for (int i = 0; i < 8; i++) { index[i] = 2 * (i + 1); edges[2 * i] = (i + 7) % 8; edges[2 * i + 1] = (i + 1) % 8; }
    MPI_Comm graph, dgraph, adj;
    MPI_Graph_create(MPI_COMM_WORLD, 8, index, edges, 0, &graph);
    name_comm(graph, "graph");
    MPI_Barrier(graph); call("graph", "barrier", 0);
    int src = world_rank, deg = 1, dst = (world_rank + 1) % 8;
    MPI_Dist_graph_create(MPI_COMM_WORLD, 1, &src, &deg, &dst, MPI_UNWEIGHTED, MPI_INFO_NULL, 0, &dgraph);
    name_comm(dgraph, "dist-graph");
    MPI_Barrier(dgraph); call("dist-graph", "barrier", 0);
    int in = (world_rank + 7) % 8, outn = (world_rank + 1) % 8;
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 1, &in, MPI_UNWEIGHTED, 1, &outn, MPI_UNWEIGHTED, MPI_INFO_NULL, 0, &adj);
    name_comm(adj, "dist-graph-adjacent");
    MPI_Barrier(adj); call("dist-graph-adjacent", "barrier", 0);

    /* An intercommunicator between the halves, then merged. */
    MPI_Comm inter, merged;
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, world_rank % 2 ? 0 : 1, 77, &inter);
    name_comm(inter, "inter");
    MPI_Barrier(inter); call("inter", "barrier", 0);
    MPI_Intercomm_merge(inter, world_rank % 2, &merged);
    name_comm(merged, "merged");
    MPI_Allreduce(MPI_IN_PLACE, &provided, 1, MPI_INT, MPI_MAX, merged); call("merged", "allreduce", 4);

    /* Free in a different order than created; reuse a freed handle slot. */
    MPI_Comm_free(&merged);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&dup);
    MPI_Comm again;
    MPI_Comm_dup(half, &again);
    name_comm(again, world_rank % 2 ? "half-odd-again" : "half-even-again");
    MPI_Barrier(again); call(world_rank % 2 ? "half-odd-again" : "half-even-again", "barrier", 0);
    MPI_Comm_free(&again);
    MPI_Comm_free(&half);
    MPI_Group_free(&wg);
    MPI_Group_free(&eg);
    MPI_Group_free(&fg);
    fclose(out);
    MPI_Finalize();
    return 0;
}
