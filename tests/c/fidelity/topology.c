/* Neighbourhood collectives on a periodic 2-D grid and on a ring built with
 * MPI_Dist_graph_create_adjacent (blocking and nonblocking), and persistent collectives
 * (MPI-4's MPI_*_init; Open MPI 4's MPIX_*_init) started several times. Any number of ranks >= 2. */
#include "fidelity.h"

#if MPI_VERSION >= 4
#define ALLREDUCE_INIT MPI_Allreduce_init
#define BCAST_INIT MPI_Bcast_init
#elif defined(OPEN_MPI)
#include <mpi-ext.h>
#define ALLREDUCE_INIT MPIX_Allreduce_init
#define BCAST_INIT MPIX_Bcast_init
#else
#error "no persistent collectives in this MPI"
#endif

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    fid_open(argc, argv);
    int n = fid_size, me = fid_rank;
    double sum = 0;

    /* A periodic 2-D grid: 4 neighbours each (two per dimension). */
    int dims[2] = {0, 0}, periods[2] = {1, 1};
    MPI_Dims_create(n, 2, dims);
    MPI_Comm cart;
    CHECK(MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &cart));
    MPI_Comm_set_name(cart, "cart");
    int from[4], to[4] = {me, me + 1, me + 2, me + 3};
    CHECK(MPI_Neighbor_allgather(&me, 1, MPI_INT, from, 1, MPI_INT, cart));
    expect("cart", "neighbor_allgather", 16);
    for (int i = 0; i < 4; i++) sum += from[i];
    CHECK(MPI_Neighbor_alltoall(to, 1, MPI_INT, from, 1, MPI_INT, cart));
    expect("cart", "neighbor_alltoall", 16);
    for (int i = 0; i < 4; i++) sum += from[i];
    int sc[4] = {1, 2, 1, 2}, sd[4] = {0, 1, 3, 4}, rc[4] = {1, 2, 1, 2}, rd[4] = {0, 1, 3, 4};
    double sv[6], rv[6];
    for (int i = 0; i < 6; i++) sv[i] = me + 0.5 * i;
    MPI_Request req;
    CHECK(MPI_Ineighbor_alltoallv(sv, sc, sd, MPI_DOUBLE, rv, rc, rd, MPI_DOUBLE, cart, &req));
    CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
    expect("cart", "neighbor_alltoallv", 48);
    for (int i = 0; i < 6; i++) sum += rv[i];

    /* A directed ring: receive from the left, send to the right. */
    int left = (me + n - 1) % n, right = (me + 1) % n;
    MPI_Comm ring;
    CHECK(MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 1, &left, MPI_UNWEIGHTED, 1, &right,
                                         MPI_UNWEIGHTED, MPI_INFO_NULL, 0, &ring));
    MPI_Comm_set_name(ring, "ring");
    double d = me * 1.25, e = 0;
    int one = 1;
    MPI_Aint zero = 0;
    MPI_Datatype dt = MPI_DOUBLE;
    CHECK(MPI_Neighbor_alltoallw(&d, &one, &zero, &dt, &e, &one, &zero, &dt, ring));
    expect("ring", "neighbor_alltoallw", 8);
    sum += e;
    int two[2] = {me, -me}, got[2], cnt2 = 2, disp0 = 0;
    CHECK(MPI_Neighbor_allgatherv(two, 2, MPI_INT, got, &cnt2, &disp0, MPI_INT, ring));
    expect("ring", "neighbor_allgatherv", 8);
    sum += got[0] - got[1];

    /* Persistent collectives: created once, started three times. */
    double pa[4], pb[4];
    int pc = 0;
    MPI_Request preq[2];
    CHECK(ALLREDUCE_INIT(pa, pb, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &preq[0]));
    CHECK(BCAST_INIT(&pc, 1, MPI_INT, n - 1, MPI_COMM_WORLD, MPI_INFO_NULL, &preq[1]));
    for (int it = 0; it < 3; it++) {
        for (int i = 0; i < 4; i++) pa[i] = me + it + i;
        if (me == n - 1) pc = 11 * (it + 1);
        CHECK(MPI_Start(&preq[0]));
        CHECK(MPI_Wait(&preq[0], MPI_STATUS_IGNORE));
        expect("MPI_COMM_WORLD", "allreduce", 32);
        CHECK(MPI_Startall(1, &preq[1]));
        CHECK(MPI_Waitall(1, &preq[1], MPI_STATUSES_IGNORE));
        expect("MPI_COMM_WORLD", "broadcast", 4);
        sum += pb[0] + pb[3] + pc;
    }
    MPI_Request_free(&preq[0]);
    MPI_Request_free(&preq[1]);

    MPI_Comm_free(&ring);
    MPI_Comm_free(&cart);
    fid_report("topology checksums", sum);
    fid_close();
    MPI_Finalize();
    return 0;
}
