/* Per-call cost of a wrapped collective: MPI_Allreduce of one int on MPI_COMM_SELF.
 * Usage: bench_self CALLS_PER_WINDOW WINDOWS
 * Prints one line per window: "ns_per_call <value>".
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    long calls = argc > 1 ? atol(argv[1]) : 1000000;
    int windows = argc > 2 ? atoi(argv[2]) : 10;
    int x = 1, y = 0;
    for (long i = 0; i < calls / 10; i++) MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_SELF);
    for (int w = 0; w < windows; w++) {
        double t0 = now();
        for (long i = 0; i < calls; i++) MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_SELF);
        double t1 = now();
        printf("ns_per_call %.2f\n", (t1 - t0) / calls);
    }
    MPI_Finalize();
    return 0;
}
