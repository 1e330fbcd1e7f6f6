/* MPI_Abort: after one all-reduce, rank 1 aborts with code 7 while the others wait in a barrier.
 * The job's exit status must be the same with and without the shim. Any number of ranks >= 2. */
#include <unistd.h>

#include "fidelity.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    fid_open(argc, argv);
    int x = fid_rank, y = 0;
    CHECK(MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    expect("MPI_COMM_WORLD", "allreduce", 4);
    fid_close();
    if (fid_rank == 0) {
        printf("sum %d\n", y);
        fflush(stdout);
    }
    if (fid_rank == 1) {
        usleep(200 * 1000); /* the others are in the barrier */
        MPI_Abort(MPI_COMM_WORLD, 7);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
