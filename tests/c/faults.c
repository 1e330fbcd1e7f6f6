/* A training-like loop with one injected fault, for the diagnosis tests.
 *
 * Usage: faults MODE RANK [STEPS] [FAULT_STEP] [ITERS]
 * Every step: some compute (ITERS multiply-adds of CPU work), an all-reduce on the world communicator,
 * and every 4th step an all-reduce on a communicator of the even or the odd ranks.
 * From FAULT_STEP on (default 100), rank RANK:
 *   healthy   does nothing unusual
 *   compute   computes 4 times as much before its collectives
 *   throttle  nothing itself: it writes its pid to $FAULTS_PIDFILE at the start, and the test puts
 *             it into a cgroup with a CPU limit
 *   stop      stops calling collectives (sleeps) while the others wait
 *   bcast     calls MPI_Bcast where the others call MPI_Allreduce
 *   recv      calls MPI_Recv from the next rank, which never sends
 *   kill      kills itself with SIGKILL 1 s into the step (the others wait for it by then)
 *   freeze    (with pairs) enters the all-reduce on its pair first and stops (SIGSTOP) 200 ms
 *             later; its partner enters 400 ms after it
 *   pairbcast (with pairs) calls MPI_Bcast on its pair where its partner and every other pair
 *             call MPI_Allreduce
 * The modes marked "with pairs" also split the ranks into tensor-parallel pairs (rank / 2) that
 * all-reduce at every step before the world all-reduce.
 * Every rank prints "step N" to stdout at FAULT_STEP so the test knows the fault has begun, and
 * marks each step with commscope_step() when the shim provides it.
 */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double sink;

/* commscope's step marker, when the shim is loaded. */
extern void commscope_step(unsigned long long) __attribute__((weak));

static void compute(long iters) {
    double a = 1.0;
    for (long i = 0; i < iters; i++) a = a * 1.0000001 + 1e-9;
    sink += a;
}

/* Stops the whole process 200 ms after it is started (the main thread is then inside MPI). */
static void *stop_soon(void *arg) {
    (void)arg;
    usleep(200 * 1000);
    raise(SIGSTOP);
    return NULL;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "healthy";
    int bad = argc > 2 ? atoi(argv[2]) : size - 1;
    int steps = argc > 3 ? atoi(argv[3]) : 400;
    int fault_step = argc > 4 ? atoi(argv[4]) : 100;
    long iters = argc > 5 ? atol(argv[5]) : 400000;
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    MPI_Comm_set_name(half, "half");
    int pairs = strcmp(mode, "freeze") == 0 || strcmp(mode, "pairbcast") == 0;
    MPI_Comm pair = MPI_COMM_NULL;
    if (pairs) {
        MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pair);
        MPI_Comm_set_name(pair, "tensor-parallel");
    }
    if (rank == bad && strcmp(mode, "throttle") == 0) {
        const char *f = getenv("FAULTS_PIDFILE");
        if (f) {
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s.tmp", f);
            FILE *fp = fopen(tmp, "w");
            if (fp) {
                fprintf(fp, "%d\n", (int)getpid());
                fclose(fp);
                rename(tmp, f);
            }
        }
    }
    double x[256] = {0};
    for (int s = 0; s < steps; s++) {
        if (commscope_step) commscope_step((unsigned long long)s);
        int faulty = rank == bad && s >= fault_step;
        if (s == fault_step) {
            printf("rank %d step %d\n", rank, s);
            fflush(stdout);
        }
        if (faulty && strcmp(mode, "stop") == 0) {
            for (;;) sleep(1);
        }
        if (faulty && strcmp(mode, "kill") == 0) {
            /* Dies while the others already wait for it in the next all-reduce. */
            usleep(1000 * 1000);
            raise(SIGKILL);
        }
        compute(faulty && strcmp(mode, "compute") == 0 ? 4 * iters : iters);
        if (faulty && strcmp(mode, "recv") == 0) {
            MPI_Recv(x, 1, MPI_DOUBLE, (rank + 1) % size, 999, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        if (pairs) {
            int partner_faulty = rank == (bad ^ 1) && s == fault_step;
            if (rank == bad && s == fault_step && strcmp(mode, "freeze") == 0) {
                pthread_t t;
                pthread_create(&t, NULL, stop_soon, NULL);
            }
            if (partner_faulty && strcmp(mode, "freeze") == 0) usleep(400 * 1000);
            if (faulty && strcmp(mode, "pairbcast") == 0) {
                MPI_Bcast(x, 256, MPI_DOUBLE, 0, pair);
            } else {
                MPI_Allreduce(MPI_IN_PLACE, x, 256, MPI_DOUBLE, MPI_SUM, pair);
            }
        }
        if (faulty && strcmp(mode, "bcast") == 0) {
            MPI_Bcast(x, 256, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        } else {
            MPI_Allreduce(MPI_IN_PLACE, x, 256, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        }
        if (s % 4 == 3) MPI_Allreduce(MPI_IN_PLACE, x, 16, MPI_DOUBLE, MPI_SUM, half);
    }
    if (pair != MPI_COMM_NULL) MPI_Comm_free(&pair);
    MPI_Comm_free(&half);
    MPI_Finalize();
    return 0;
}
