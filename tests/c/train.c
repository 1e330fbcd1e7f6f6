/* A job shaped like training, with one way for a rank to end or get stuck, for the tests of
 * how a rank's end is told (tests/tests/endings.rs).
 *
 * Usage: train MODE RANK STEP [STEPS]
 * Every step: 1 ms of compute, an all-reduce in the rank's tensor-parallel pair (rank / 2), then
 * one in its data-parallel half (rank % 2); a world barrier every 10 steps. After the compute of
 * step STEP, rank RANK (for `cycle`, RANK and RANK + 3):
 *   healthy  does nothing unusual
 *   exit     calls exit(3) without MPI_Finalize
 *   return   returns 3 from main without MPI_Finalize
 *   segv     dereferences NULL (SIGSEGV)
 *   segvh    dereferences NULL with a SIGSEGV handler of its own, installed before MPI_Init
 *            (so the MPI library's and commscope's handlers come after it); the handler writes
 *            "own handler" to stderr and exits with status 42
 *   kill     sends itself SIGKILL
 *   abort    calls MPI_Abort(MPI_COMM_WORLD, 7)
 *   root     broadcasts on the world communicator from root 1, where every other rank
 *            broadcasts from root 0 (every rank then blocks)
 *   cycle    RANK receives from RANK + 3 and RANK + 3 from RANK: neither sends
 *   spin     spins in its own code, never calling MPI again
 * Every rank prints "step N" at STEP so a test knows the fault is due, and a healthy run ends
 * with MPI_Finalize and status 0.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile double sink;

static void compute_1ms(void) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double a = 1.0;
    do {
        for (int i = 0; i < 1000; i++) a = a * 1.0000001 + 1e-9;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 1000000L);
    sink += a;
}

static void own_handler(int sig) {
    (void)sig;
    static const char msg[] = "own handler\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(42);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "segvh") == 0) signal(SIGSEGV, own_handler);
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "healthy";
    int bad = argc > 2 ? atoi(argv[2]) : 0;
    int fault_step = argc > 3 ? atoi(argv[3]) : 20;
    int steps = argc > 4 ? atoi(argv[4]) : 400;
    MPI_Comm tp, dp;
    MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &tp);
    MPI_Comm_set_name(tp, "tensor-parallel");
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &dp);
    MPI_Comm_set_name(dp, "data-parallel");
    double grad[256];
    for (int i = 0; i < 256; i++) grad[i] = rank + i;
    for (int step = 0; step < steps; step++) {
        compute_1ms();
        if (step == fault_step) {
            printf("step %d\n", step);
            fflush(stdout);
            int me = rank == bad || (strcmp(mode, "cycle") == 0 && rank == bad + 3);
            if (me && strcmp(mode, "exit") == 0) exit(3);
            if (me && strcmp(mode, "return") == 0) return 3;
            if (me && (strcmp(mode, "segv") == 0 || strcmp(mode, "segvh") == 0)) {
                volatile int *p = NULL;
                *p = 1;
            }
            if (me && strcmp(mode, "kill") == 0) kill(getpid(), SIGKILL);
            if (me && strcmp(mode, "abort") == 0) MPI_Abort(MPI_COMM_WORLD, 7);
            if (strcmp(mode, "root") == 0) {
                int buf[64] = {0};
                MPI_Bcast(buf, 64, MPI_INT, rank == bad ? 1 : 0, MPI_COMM_WORLD);
            }
            if (me && strcmp(mode, "cycle") == 0) {
                int peer = rank == bad ? bad + 3 : bad, v;
                MPI_Recv(&v, 1, MPI_INT, peer, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            }
            if (me && strcmp(mode, "spin") == 0)
                for (;;) compute_1ms();
        }
        MPI_Allreduce(MPI_IN_PLACE, grad, 256, MPI_DOUBLE, MPI_SUM, tp);
        MPI_Allreduce(MPI_IN_PLACE, grad, 256, MPI_DOUBLE, MPI_SUM, dp);
        if (step % 10 == 9) MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Comm_free(&tp);
    MPI_Comm_free(&dp);
    MPI_Finalize();
    return 0;
}
