/* An NCCL job for the tests, written against the NCCL and CUDA driver APIs and linked with their
 * test doubles (tests/doubles): it forks RANKS processes, like a launcher, each with RANK and
 * WORLD_SIZE in its environment, and runs one communicator per process.
 *
 * Usage: nccl_job RANKS MODE [ARG]
 *   basic        every wrapped entry point: 12 all-reduces with 2 ms of "compute" before each,
 *                ncclBcast (which NCCL implements by calling ncclBroadcast), reduce, all-gather,
 *                reduce-scatter, all-to-all, a group of two all-reduces, a group ring of
 *                send/recv, a split into even/odd ranks with an all-reduce on each half, and an
 *                all-reduce captured into a CUDA graph that is then launched 3 times (then the
 *                graph is destroyed).
 *   slow R [N]   N (20) all-reduces; rank R computes 30 ms before each where the others compute 2 ms.
 *   ring N C     N all-reduces of C floats, 1 ms of "compute" before each (for the link view:
 *                TESTDOUBLE_NCCL_SLOW_LINK throttles one link of the ring).
 *   graphhang R  an all-reduce captured into a CUDA graph, the graph launched 5 times; then rank R
 *                sleeps while the others launch it once more and wait for their stream.
 *   hang R       10 all-reduces; then rank R sleeps while the others issue one more and wait
 *                for their stream, which never finishes.
 *   async R      5 all-reduces, then 1.5 s of idling (the double reports ncclRemoteError on
 *                rank R: TESTDOUBLE_NCCL_ASYNC_ERROR).
 *   initall N    one process, ncclCommInitAll over N devices, one all-reduce group over them.
 *   bench N      (1 rank, with TESTDOUBLE_NCCL_NOOP=1) N all-reduces in bursts of 64 with 1 ms
 *                between bursts; prints the mean time inside ncclAllReduce, and the mean time
 *                of one cuEventRecord, in ns.
 * Prints "capture violations: N" per rank (events recorded on a capturing stream).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef uintptr_t stream_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId *);
ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
ncclResult_t ncclCommInitAll(ncclComm_t *, int, const int *);
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, void *);
ncclResult_t ncclCommDestroy(ncclComm_t);
ncclResult_t ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, stream_t);
ncclResult_t ncclBcast(void *, size_t, int, int, ncclComm_t, stream_t);
ncclResult_t ncclReduce(const void *, void *, size_t, int, int, int, ncclComm_t, stream_t);
ncclResult_t ncclAllGather(const void *, void *, size_t, int, ncclComm_t, stream_t);
ncclResult_t ncclReduceScatter(const void *, void *, size_t, int, int, ncclComm_t, stream_t);
ncclResult_t ncclAlltoAll(const void *, void *, size_t, int, ncclComm_t, stream_t);
ncclResult_t ncclSend(const void *, size_t, int, int, ncclComm_t, stream_t);
ncclResult_t ncclRecv(void *, size_t, int, int, ncclComm_t, stream_t);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

int cuInit(unsigned);
int cuStreamCreate(stream_t *, unsigned);
int cuStreamSynchronize(stream_t);
int cuStreamBeginCapture_v2(stream_t, int);
int cuStreamEndCapture(stream_t, uintptr_t *);
int cuGraphInstantiateWithFlags(uintptr_t *, uintptr_t, unsigned long long);
int cuGraphLaunch(uintptr_t, stream_t);
int cuGraphExecDestroy(uintptr_t);
int cuGraphDestroy(uintptr_t);
int testdouble_cuda_launch_busy(stream_t, unsigned long long);
int cuEventCreate(uintptr_t *, unsigned);
int cuEventRecord(uintptr_t, stream_t);
long testdouble_cuda_capture_violations(void);

enum { FLOAT = 7, SUM = 0 };
#define MS 1000000ull

#define CHECK(x)                                                                \
    do {                                                                        \
        int rc_ = (x);                                                          \
        if (rc_ != 0) {                                                         \
            fprintf(stderr, "rank %d: %s failed: %d\n", rank, #x, rc_);        \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static int rank, nranks;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void bench(ncclComm_t comm, stream_t s, int n) {
    uint64_t inside = 0;
    for (int i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        CHECK(ncclAllReduce(NULL, NULL, 1 << 20, FLOAT, SUM, comm, s));
        inside += now_ns() - t0;
        if (i % 64 == 63) usleep(1000);
    }
    uintptr_t ev;
    CHECK(cuEventCreate(&ev, 0));
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) CHECK(cuEventRecord(ev, s));
    uint64_t rec = now_ns() - t0;
    printf("allreduce: %.1f ns per call over %d calls\n", (double)inside / n, n);
    printf("cuEventRecord: %.1f ns per call\n", (double)rec / n);
}

/* Captures an all-reduce of `count` floats into a CUDA graph on a new stream; returns the
 * stream, the graph and its executable. */
static void capture_allreduce(ncclComm_t comm, size_t count, stream_t *cs, uintptr_t *graph, uintptr_t *exec) {
    CHECK(cuStreamCreate(cs, 1));
    CHECK(cuStreamBeginCapture_v2(*cs, 0));
    CHECK(ncclAllReduce(NULL, NULL, count, FLOAT, SUM, comm, *cs));
    CHECK(cuStreamEndCapture(*cs, graph));
    CHECK(cuGraphInstantiateWithFlags(exec, *graph, 0));
}

static void basic(ncclComm_t comm, stream_t s) {
    for (int i = 0; i < 12; i++) {
        testdouble_cuda_launch_busy(s, 2 * MS);
        CHECK(ncclAllReduce(NULL, NULL, 1 << 18, FLOAT, SUM, comm, s));
    }
    CHECK(ncclBcast(NULL, 1000, FLOAT, 0, comm, s));
    CHECK(ncclReduce(NULL, NULL, 1000, FLOAT, SUM, 1, comm, s));
    CHECK(ncclAllGather(NULL, NULL, 1000, FLOAT, comm, s));
    CHECK(ncclReduceScatter(NULL, NULL, 1000, FLOAT, SUM, comm, s));
    CHECK(ncclAlltoAll(NULL, NULL, 1000, FLOAT, comm, s));
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(NULL, NULL, 4096, FLOAT, SUM, comm, s));
    CHECK(ncclAllReduce(NULL, NULL, 8192, FLOAT, SUM, comm, s));
    CHECK(ncclGroupEnd());
    CHECK(ncclGroupStart());
    CHECK(ncclSend(NULL, 2048, FLOAT, (rank + 1) % nranks, comm, s));
    CHECK(ncclRecv(NULL, 2048, FLOAT, (rank + nranks - 1) % nranks, comm, s));
    CHECK(ncclGroupEnd());
    ncclComm_t half;
    CHECK(ncclCommSplit(comm, rank % 2, rank, &half, NULL));
    CHECK(ncclAllReduce(NULL, NULL, 512, FLOAT, SUM, half, s));
    /* Graph capture: the all-reduce is recorded into the graph, then runs at each launch (after
     * the work already queued on the communicator: one order of operations per communicator). */
    CHECK(cuStreamSynchronize(s));
    stream_t cs;
    uintptr_t graph, exec;
    capture_allreduce(comm, 256, &cs, &graph, &exec);
    for (int i = 0; i < 3; i++) CHECK(cuGraphLaunch(exec, cs));
    CHECK(cuStreamSynchronize(cs));
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuStreamSynchronize(s));
    CHECK(ncclCommDestroy(half));
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: nccl_job RANKS MODE [ARG]\n");
        return 2;
    }
    nranks = atoi(argv[1]);
    const char *mode = argv[2];
    /* A bug in the doubles must fail a test, never hang it. */
    alarm(60);
    int arg = argc > 3 ? atoi(argv[3]) : -1;

    if (strcmp(mode, "initall") == 0) {
        rank = 0;
        CHECK(cuInit(0));
        int n = nranks;
        ncclComm_t comms[8];
        stream_t st[8];
        CHECK(ncclCommInitAll(comms, n, NULL));
        for (int i = 0; i < n; i++) CHECK(cuStreamCreate(&st[i], 1));
        for (int round = 0; round < 3; round++) {
            CHECK(ncclGroupStart());
            for (int i = 0; i < n; i++) CHECK(ncclAllReduce(NULL, NULL, 1024, FLOAT, SUM, comms[i], st[i]));
            CHECK(ncclGroupEnd());
        }
        for (int i = 0; i < n; i++) CHECK(cuStreamSynchronize(st[i]));
        for (int i = 0; i < n; i++) CHECK(ncclCommDestroy(comms[i]));
        printf("capture violations: %ld\n", testdouble_cuda_capture_violations());
        return 0;
    }

    ncclUniqueId id;
    rank = -1;
    CHECK(ncclGetUniqueId(&id));
    printf("unique id: ");
    for (int i = 0; i < 128; i++) printf("%02x", (unsigned char)id.internal[i]);
    printf("\n");
    fflush(stdout);
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid > 0) continue;
        rank = r;
        char buf[16];
        snprintf(buf, sizeof buf, "%d", r);
        setenv("RANK", buf, 1);
        snprintf(buf, sizeof buf, "%d", nranks);
        setenv("WORLD_SIZE", buf, 1);
        CHECK(cuInit(0));
        stream_t s;
        CHECK(cuStreamCreate(&s, 1));
        ncclComm_t comm;
        CHECK(ncclCommInitRank(&comm, nranks, id, rank));
        if (strcmp(mode, "basic") == 0) {
            basic(comm, s);
        } else if (strcmp(mode, "slow") == 0) {
            int iters = argc > 4 ? atoi(argv[4]) : 20;
            for (int i = 0; i < iters; i++) {
                testdouble_cuda_launch_busy(s, (rank == arg ? 30 : 2) * MS);
                CHECK(ncclAllReduce(NULL, NULL, 1 << 16, FLOAT, SUM, comm, s));
            }
            CHECK(cuStreamSynchronize(s));
        } else if (strcmp(mode, "ring") == 0) {
            int iters = arg > 0 ? arg : 20;
            size_t count = argc > 4 ? (size_t)atol(argv[4]) : (size_t)1 << 20;
            for (int i = 0; i < iters; i++) {
                testdouble_cuda_launch_busy(s, 1 * MS);
                CHECK(ncclAllReduce(NULL, NULL, count, FLOAT, SUM, comm, s));
            }
            CHECK(cuStreamSynchronize(s));
        } else if (strcmp(mode, "graphhang") == 0) {
            stream_t cs;
            uintptr_t graph, exec;
            capture_allreduce(comm, 1024, &cs, &graph, &exec);
            for (int i = 0; i < 5; i++) CHECK(cuGraphLaunch(exec, cs));
            CHECK(cuStreamSynchronize(cs));
            printf("rank %d ready\n", rank);
            fflush(stdout);
            if (rank == arg) {
                for (;;) sleep(1);
            }
            CHECK(cuGraphLaunch(exec, cs));
            CHECK(cuStreamSynchronize(cs)); /* never returns */
        } else if (strcmp(mode, "hang") == 0) {
            for (int i = 0; i < 10; i++) CHECK(ncclAllReduce(NULL, NULL, 1024, FLOAT, SUM, comm, s));
            CHECK(cuStreamSynchronize(s));
            printf("rank %d ready\n", rank);
            fflush(stdout);
            if (rank == arg) {
                for (;;) sleep(1);
            }
            CHECK(ncclAllReduce(NULL, NULL, 1024, FLOAT, SUM, comm, s));
            CHECK(cuStreamSynchronize(s)); /* never returns */
        } else if (strcmp(mode, "bench") == 0) {
            bench(comm, s, arg > 0 ? arg : 100000);
        } else if (strcmp(mode, "async") == 0) {
            for (int i = 0; i < 5; i++) CHECK(ncclAllReduce(NULL, NULL, 1024, FLOAT, SUM, comm, s));
            CHECK(cuStreamSynchronize(s));
            usleep(1500 * 1000);
        } else {
            fprintf(stderr, "unknown mode %s\n", mode);
            exit(2);
        }
        if (strcmp(mode, "hang") != 0 && strcmp(mode, "graphhang") != 0) CHECK(ncclCommDestroy(comm));
        printf("rank %d capture violations: %ld\n", rank, testdouble_cuda_capture_violations());
        fflush(stdout);
        exit(0);
    }
    int worst = 0;
    for (int r = 0; r < nranks; r++) {
        int st = 0;
        if (wait(&st) < 0) break;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code > worst) worst = code;
    }
    return worst;
}
