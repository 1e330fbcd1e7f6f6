/* Calls MPI_Allreduce on MPI_COMM_SELF at a steady rate: a known record rate for measuring the
 * agent. Usage: rate CALLS_PER_SECOND SECONDS. Prints "N calls".
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    double rate = argc > 1 ? atof(argv[1]) : 10000;
    double seconds = argc > 2 ? atof(argv[2]) : 10;
    double t0 = now();
    long n = 0;
    int x = 1, y;
    for (;;) {
        double t = now() - t0;
        if (t >= seconds) break;
        long due = (long)(t * rate);
        while (n < due) {
            MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_SELF);
            n++;
        }
        struct timespec pause = {0, 200000};
        nanosleep(&pause, NULL);
    }
    printf("%ld calls\n", n);
    MPI_Finalize();
    return 0;
}
