/* MPI_IN_PLACE in every collective that allows it. Any number of ranks >= 2. */
#include "fidelity.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    fid_open(argc, argv);
    const char *W = "MPI_COMM_WORLD";
    int n = fid_size, me = fid_rank;
    double sum = 0;

    double v[8];
    for (int i = 0; i < 8; i++) v[i] = me + i;
    CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    expect(W, "allreduce", 64);
    for (int i = 0; i < 8; i++) sum += v[i];

    double r[8];
    for (int i = 0; i < 8; i++) r[i] = me * i;
    if (me == 0)
        CHECK(MPI_Reduce(MPI_IN_PLACE, r, 8, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
    else
        CHECK(MPI_Reduce(r, NULL, 8, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
    expect(W, "reduce", 64);
    if (me == 0) for (int i = 0; i < 8; i++) sum += r[i];

    int *g = calloc(n, sizeof(int));
    g[me] = 3 * me + 1;
    if (me == 0)
        CHECK(MPI_Gather(MPI_IN_PLACE, 1, MPI_INT, g, 1, MPI_INT, 0, MPI_COMM_WORLD));
    else
        CHECK(MPI_Gather(&g[me], 1, MPI_INT, NULL, 0, MPI_INT, 0, MPI_COMM_WORLD));
    expect(W, "gather", 4L * n);
    if (me == 0) for (int i = 0; i < n; i++) sum += g[i];

    int *sc = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) sc[i] = 10 * i;
    int mine = -1;
    if (me == 0) {
        CHECK(MPI_Scatter(sc, 1, MPI_INT, MPI_IN_PLACE, 1, MPI_INT, 0, MPI_COMM_WORLD));
        mine = sc[0];
    } else {
        CHECK(MPI_Scatter(NULL, 0, MPI_INT, &mine, 1, MPI_INT, 0, MPI_COMM_WORLD));
    }
    expect(W, "scatter", 4L * n);
    sum += mine;

    int *ag = calloc(n, sizeof(int));
    ag[me] = me * me;
    CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ag, 1, MPI_INT, MPI_COMM_WORLD));
    expect(W, "allgather", 4L * n);
    for (int i = 0; i < n; i++) sum += ag[i];

    int *counts = malloc(sizeof(int) * n), *displs = malloc(sizeof(int) * n), total = 0;
    for (int i = 0; i < n; i++) {
        counts[i] = i + 1;
        displs[i] = total;
        total += counts[i];
    }
    int *agv = calloc(total, sizeof(int));
    for (int k = 0; k < counts[me]; k++) agv[displs[me] + k] = me + k;
    CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, agv, counts, displs, MPI_INT,
                         MPI_COMM_WORLD));
    expect(W, "allgatherv", 4L * total);
    for (int i = 0; i < total; i++) sum += agv[i];

    int *a2a = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) a2a[i] = 100 * me + i;
    CHECK(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a2a, 1, MPI_INT, MPI_COMM_WORLD));
    expect(W, "alltoall", 4L * n);
    for (int i = 0; i < n; i++) sum += a2a[i];

    int *rsb = malloc(sizeof(int) * 2 * n);
    for (int i = 0; i < 2 * n; i++) rsb[i] = i + me;
    CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, rsb, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    expect(W, "reducescatter", 8L * n);
    sum += rsb[0] + rsb[1];

    long sc2 = me + 1;
    CHECK(MPI_Scan(MPI_IN_PLACE, &sc2, 1, MPI_LONG, MPI_PROD, MPI_COMM_WORLD));
    expect(W, "scan", 8);
    sum += (double)sc2;

    fid_report("in-place checksums", sum);
    fid_close();
    MPI_Finalize();
    return 0;
}
