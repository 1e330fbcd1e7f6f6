/* A job in which one rank stops calling collectives while the others wait for it.
 *
 * Usage: hang HANG_RANK
 * Every rank does 10 all-reduces on the world communicator and a few on a split communicator.
 * Then HANG_RANK sleeps forever while every other rank enters one more all-reduce on the world
 * communicator, where it stays until the job is killed.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int hang = argc > 1 ? atoi(argv[1]) : size - 1;
    double x[256] = {0};
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    for (int i = 0; i < 10; i++) MPI_Allreduce(MPI_IN_PLACE, x, 256, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < 3; i++) MPI_Allreduce(MPI_IN_PLACE, x, 256, MPI_DOUBLE, MPI_SUM, half);
    printf("rank %d ready\n", rank);
    fflush(stdout);
    if (rank == hang) {
        for (;;) sleep(1);
    }
    MPI_Allreduce(MPI_IN_PLACE, x, 256, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
