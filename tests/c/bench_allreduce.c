/* Throughput of an MPI_Allreduce loop. Usage: bench_allreduce BYTES ITERATIONS
 * Rank 0 prints "seconds <value>" for the timed loop (after a warm-up and a barrier).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    long bytes = argc > 1 ? atol(argv[1]) : 8;
    long iters = argc > 2 ? atol(argv[2]) : 1000;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long n = bytes / 8 > 0 ? bytes / 8 : 1;
    double *a = calloc(n, sizeof(double)), *b = calloc(n, sizeof(double));
    for (long i = 0; i < iters / 10 + 1; i++) MPI_Allreduce(a, b, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) MPI_Allreduce(a, b, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    if (rank == 0) printf("seconds %.6f\n", t1 - t0);
    free(a);
    free(b);
    MPI_Finalize();
    return 0;
}
