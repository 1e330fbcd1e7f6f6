/* NCCL's profiler plugin function table (ncclProfiler_v5_t, the same for v6 and v7), as the NCCL
 * test double and the plugin benchmark call it. Descriptors are passed as bytes at the v7 offsets
 * (reference/nccl.md §3.5). */
#ifndef COMMSCOPE_TEST_PROFILER_V7_H
#define COMMSCOPE_TEST_PROFILER_V7_H
#include <stdint.h>

typedef struct {
    const char *name;
    int (*init)(void **ctx, uint64_t commId, int *mask, const char *commName, int nNodes, int nranks,
                int rank, void *logfn);
    int (*startEvent)(void *ctx, void **handle, void *descr);
    int (*stopEvent)(void *handle);
    int (*recordEventState)(void *handle, int state, void *args);
    int (*finalize)(void *ctx);
} profiler_v7;

#endif
