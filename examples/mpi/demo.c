/* commscope demo: a small "training step" loop over MPI.
 *
 * Each step: a tensor-parallel all-reduce inside pairs of ranks, a data-parallel all-reduce
 * across pairs, a broadcast of the step's learning rate from rank 0, and a ring exchange of
 * halos with nonblocking send/receive. Prints one line per rank at the end.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    MPI_Comm tp, dp;
    MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &tp);
    MPI_Comm_set_name(tp, "tensor-parallel");
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &dp);
    MPI_Comm_set_name(dp, "data-parallel");

    const int n = 1 << 14;
    double *grad = malloc(n * sizeof(double));
    double *halo_out = malloc(1024 * sizeof(double));
    double *halo_in = malloc(1024 * sizeof(double));
    for (int i = 0; i < n; i++) grad[i] = rank + i * 1e-6;
    for (int i = 0; i < 1024; i++) halo_out[i] = rank;

    const int steps = 20;
    double lr = 0.1;
    for (int step = 0; step < steps; step++) {
        MPI_Allreduce(MPI_IN_PLACE, grad, n / 4, MPI_DOUBLE, MPI_SUM, tp);
        MPI_Allreduce(MPI_IN_PLACE, grad, n, MPI_DOUBLE, MPI_SUM, dp);
        MPI_Bcast(&lr, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        MPI_Request req[2];
        int right = (rank + 1) % size, left = (rank + size - 1) % size;
        MPI_Irecv(halo_in, 1024, MPI_DOUBLE, left, step, MPI_COMM_WORLD, &req[0]);
        MPI_Isend(halo_out, 1024, MPI_DOUBLE, right, step, MPI_COMM_WORLD, &req[1]);
        MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        for (int i = 0; i < n; i++) grad[i] *= 1.0 / size;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d of %d finished %d steps (grad[0] = %.3f)\n", rank, size, steps, grad[0]);
    free(grad);
    free(halo_out);
    free(halo_in);
    MPI_Comm_free(&tp);
    MPI_Comm_free(&dp);
    MPI_Finalize();
    return 0;
}
