/* commscope's diagnosis demo: a training-step loop in which one rank becomes a straggler for a
 * while, and later another rank stops calling collectives (the job hangs).
 *
 * Usage: diagnosis [STRAGGLER] [HANG_RANK] [SLOW_FROM SLOW_UNTIL HANG_AT]   (seconds since start)
 * Each step: compute, an all-reduce inside pairs of ranks (tensor-parallel), an all-reduce across
 * pairs (data-parallel) and every 4th step a world all-reduce (loss). Between SLOW_FROM and
 * SLOW_UNTIL the straggler computes 4 times as much; at HANG_AT the hang rank stops calling and
 * sleeps until the job is killed. Times are each rank's own, from a barrier at the start.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static double sink;

static void compute(long iters) {
    double a = 1.0;
    for (long i = 0; i < iters; i++) a = a * 1.0000001 + 1e-9;
    sink += a;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int straggler = argc > 1 ? atoi(argv[1]) : 5 % size;
    int hang = argc > 2 ? atoi(argv[2]) : 2 % size;
    double slow_from = argc > 3 ? atof(argv[3]) : 3.0;
    double slow_until = argc > 4 ? atof(argv[4]) : 13.0;
    double hang_at = argc > 5 ? atof(argv[5]) : 30.0;

    MPI_Comm tp, dp;
    MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &tp);
    MPI_Comm_set_name(tp, "tensor-parallel");
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &dp);
    MPI_Comm_set_name(dp, "data-parallel");

    double grad[4096] = {0}, loss = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long step = 0;; step++) {
        double t = MPI_Wtime() - t0;
        if (rank == hang && t >= hang_at) {
            for (;;) sleep(1);
        }
        int slow = rank == straggler && t >= slow_from && t < slow_until;
        compute(slow ? 1600000 : 400000);
        MPI_Allreduce(MPI_IN_PLACE, grad, 1024, MPI_DOUBLE, MPI_SUM, tp);
        MPI_Allreduce(MPI_IN_PLACE, grad, 4096, MPI_DOUBLE, MPI_SUM, dp);
        if (step % 4 == 3) MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return 0;
}
