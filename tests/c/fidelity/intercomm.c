/* Intercommunicators and their collectives (rooted with MPI_ROOT / MPI_PROC_NULL, all-reduce,
 * all-gather, barrier), Intercomm_merge, and MPI_Comm_create_group called by a subgroup only.
 * Needs an even number of ranks >= 4. */
#include "fidelity.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    fid_open(argc, argv);
    int n = fid_size, me = fid_rank, color = me % 2;
    double sum = 0;

    MPI_Comm local, inter, merged, evens = MPI_COMM_NULL;
    CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, me, &local));
    MPI_Comm_set_name(local, "local");
    /* Leaders: world rank 0 (evens) and world rank 1 (odds). */
    CHECK(MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, 1 - color, 99, &inter));
    MPI_Comm_set_name(inter, "inter");
    int lrank, rsize;
    MPI_Comm_rank(local, &lrank);
    MPI_Comm_remote_size(inter, &rsize);

    /* Group 0 (evens) broadcasts from its local rank 0 to group 1. */
    int data[4] = {0, 0, 0, 0};
    if (color == 0) {
        if (lrank == 0) for (int i = 0; i < 4; i++) data[i] = 7 * (i + 1);
        CHECK(MPI_Bcast(data, 4, MPI_INT, lrank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter));
    } else {
        CHECK(MPI_Bcast(data, 4, MPI_INT, 0, inter));
    }
    expect("inter", "broadcast", 16);
    for (int i = 0; i < 4; i++) sum += data[i];

    double x = me + 1, y = 0;
    CHECK(MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, inter));
    expect("inter", "allreduce", 8);
    sum += y;

    int *all = malloc(sizeof(int) * rsize);
    CHECK(MPI_Allgather(&me, 1, MPI_INT, all, 1, MPI_INT, inter));
    expect("inter", "allgather", 4L * rsize);
    for (int i = 0; i < rsize; i++) sum += all[i];

    CHECK(MPI_Barrier(inter));
    expect("inter", "barrier", 0);

    CHECK(MPI_Intercomm_merge(inter, color, &merged));
    MPI_Comm_set_name(merged, "merged");
    int m = me, msum = 0;
    CHECK(MPI_Allreduce(&m, &msum, 1, MPI_INT, MPI_SUM, merged));
    expect("merged", "allreduce", 4);
    sum += msum;

    /* Only the even ranks create (and use) a communicator from their group. */
    if (color == 0) {
        MPI_Group wg, eg;
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        int ne = (n + 1) / 2, *ranks = malloc(sizeof(int) * ne);
        for (int i = 0; i < ne; i++) ranks[i] = 2 * i;
        MPI_Group_incl(wg, ne, ranks, &eg);
        CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, eg, 5, &evens));
        MPI_Comm_set_name(evens, "evens");
        long e = me, esum = 0;
        CHECK(MPI_Allreduce(&e, &esum, 1, MPI_LONG, MPI_SUM, evens));
        expect("evens", "allreduce", 8);
        sum += esum;
        MPI_Group_free(&eg);
        MPI_Group_free(&wg);
        free(ranks);
        MPI_Comm_free(&evens);
    }

    MPI_Comm_free(&merged);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&local);
    fid_report("intercomm checksums", sum);
    fid_close();
    MPI_Finalize();
    return 0;
}
