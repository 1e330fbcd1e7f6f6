/* A job that runs for a while at a steady pace: every step one all-reduce and one ring
 * exchange (sendrecv), then a short sleep. Rank 0 decides when to stop (after SECONDS), through
 * the all-reduce itself, so every rank runs the same number of steps.
 * Usage: steady SECONDS [SLEEP_US]
 * Each rank prints "rank R: S steps, checksum ok|BAD" — the result must not depend on whether
 * anything around the job (agent, collector) was restarted.
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
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    int sleep_us = argc > 2 ? atoi(argv[2]) : 500;
    double t0 = MPI_Wtime();
    long steps = 0, sum = 0, expect = 0, ring = 0;
    for (;;) {
        long v[2] = {rank + steps, 0}, r[2];
        if (rank == 0 && MPI_Wtime() - t0 >= seconds) v[1] = 1;
        MPI_Allreduce(v, r, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        sum += r[0];
        expect += (long)size * (size - 1) / 2 + (long)size * steps;
        long out = rank, in = -1;
        MPI_Sendrecv(&out, 1, MPI_LONG, (rank + 1) % size, 7, &in, 1, MPI_LONG,
                     (rank + size - 1) % size, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        ring += in == (rank + size - 1) % size;
        steps++;
        if (r[1]) break;
        if (sleep_us > 0) usleep(sleep_us);
    }
    printf("rank %d: %ld steps, checksum %s\n", rank, steps,
           sum == expect && ring == steps ? "ok" : "BAD");
    MPI_Finalize();
    return 0;
}
