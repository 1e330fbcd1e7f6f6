// Real NCCL on one GPU for tests/gpu/check.sh: a one-rank communicator, all-reduces and
// all-gathers of 1 KiB … 64 MiB, and a host-side cost loop of small all-reduces.
// Usage: nccl_gpu [timing|cost N]
// Declares the few NCCL entry points it calls (no nccl.h needed).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
extern "C" {
int ncclGetUniqueId(ncclUniqueId *);
int ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
int ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
int ncclAllGather(const void *, void *, size_t, int, ncclComm_t, cudaStream_t);
int ncclCommDestroy(ncclComm_t);
}

#define CK(x) do { int r_ = (int)(x); if (r_) { fprintf(stderr, "%s failed: %d\n", #x, r_); return 1; } } while (0)

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "timing";
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    size_t max = 64u << 20;
    void *buf, *out;
    CK(cudaMalloc(&buf, max));
    CK(cudaMalloc(&out, max));
    ncclUniqueId id;
    CK(ncclGetUniqueId(&id));
    ncclComm_t comm;
    CK(ncclCommInitRank(&comm, 1, id, 0));
    if (strcmp(mode, "cost") == 0) {
        int n = argc > 2 ? atoi(argv[2]) : 20000;
        double inside = 0;
        for (int i = 0; i < n; i++) {
            double t0 = now_ns();
            CK(ncclAllReduce(buf, buf, 256, 7, 0, comm, s));
            inside += now_ns() - t0;
            if (i % 64 == 63) CK(cudaStreamSynchronize(s));
        }
        CK(cudaStreamSynchronize(s));
        cudaEvent_t e;
        CK(cudaEventCreate(&e));
        double t0 = now_ns();
        for (int i = 0; i < n; i++) CK(cudaEventRecord(e, s));
        double rec = now_ns() - t0;
        CK(cudaStreamSynchronize(s));
        printf("allreduce: %.1f ns per call over %d calls\n", inside / n, n);
        printf("cudaEventRecord: %.1f ns per call\n", rec / n);
    } else {
        for (size_t b = 1024; b <= max; b *= 4) {
            for (int i = 0; i < 10; i++) CK(ncclAllReduce(buf, buf, b / 4, 7, 0, comm, s));
            for (int i = 0; i < 5; i++) CK(ncclAllGather(buf, out, b / 4, 7, comm, s));
        }
        CK(cudaStreamSynchronize(s));
        printf("done\n");
    }
    CK(ncclCommDestroy(comm));
    return 0;
}
