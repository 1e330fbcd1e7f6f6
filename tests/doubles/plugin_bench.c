/* Benchmark of the profiler plugin's callbacks: drives a plugin's ncclProfiler_v7 table the way
 * NCCL's proxy and profiler threads do for one network all-reduce on 2 channels — Coll start and
 * stop, per channel a KernelCh start, stop state and stop, a send and a receive ProxyOp, and 8
 * ProxySteps under each (send: SendGPUWait, SendPeerWait, SendWait, stop; receive: RecvWait,
 * RecvGPUWait, stop; only if the plugin's mask asks for ProxyStep) — and prints the time per
 * operation and per callback.
 *
 * Usage: plugin_bench PLUGIN.so OPS   (with COMMSCOPE_TRACE_DIR set so the recorder is on)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "profiler_v7.h"

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static unsigned char descr[160];
static void head(uint64_t type, void *parent) {
    memset(descr, 0, sizeof descr);
    int rank = 0;
    memcpy(descr, &type, 8);
    memcpy(descr + 8, &parent, 8);
    memcpy(descr + 16, &rank, 4);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: plugin_bench PLUGIN.so OPS\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    profiler_v7 *p = h ? dlsym(h, "ncclProfiler_v7") : NULL;
    if (!p) {
        fprintf(stderr, "no ncclProfiler_v7 in %s: %s\n", argv[1], dlerror());
        return 1;
    }
    long ops = atol(argv[2]);
    void *ctx = NULL;
    int mask = 0;
    p->init(&ctx, 0x5eed5eed5eedull, &mask, "bench", 2, 2, 0, NULL);
    /* As NCCL: ProxyStep events only when the plugin asked for them. */
    int steps_on = (mask & 16) != 0;
    const char *func = "AllReduce", *dt = "ncclFloat32", *algo = "RING", *proto = "SIMPLE";
    int pid = (int)getpid();
    long callbacks = 0;
    uint64_t app = 0; /* time in the callbacks NCCL makes on the application's thread */
    uint64_t t0 = now_ns();
    for (long i = 0; i < ops; i++) {
        void *coll = NULL;
        uint64_t sn = (uint64_t)i;
        size_t count = 1 << 20;
        head(2, NULL);
        memcpy(descr + 24, &sn, 8);
        memcpy(descr + 32, &func, 8);
        memcpy(descr + 56, &count, 8);
        memcpy(descr + 72, &dt, 8);
        descr[80] = 2;
        descr[81] = 8;
        memcpy(descr + 88, &algo, 8);
        memcpy(descr + 96, &proto, 8);
        uint64_t a = now_ns();
        p->startEvent(ctx, &coll, descr);
        p->stopEvent(coll);
        app += now_ns() - a;
        callbacks += 2;
        for (int ch = 0; ch < 2; ch++) {
            void *k = NULL, *px[2] = {NULL, NULL};
            uint64_t timer = now_ns();
            head(64, coll);
            descr[24] = (unsigned char)ch;
            memcpy(descr + 32, &timer, 8);
            p->startEvent(ctx, &k, descr);
            for (int s = 0; s < 2; s++) {
                int peer = 1, steps = 8, chunk = 1 << 19;
                head(8, coll);
                memcpy(descr + 24, &pid, 4);
                descr[28] = (unsigned char)ch;
                memcpy(descr + 32, &peer, 4);
                memcpy(descr + 36, &steps, 4);
                memcpy(descr + 40, &chunk, 4);
                int send = s == 0;
                memcpy(descr + 44, &send, 4);
                p->startEvent(ctx, &px[s], descr);
                callbacks++;
            }
            for (int step = 0; step < 8 * steps_on; step++) {
                uint64_t size[2] = {1 << 19, 0};
                void *ss = NULL, *rs = NULL;
                head(16, px[0]);
                memcpy(descr + 24, &step, 4);
                p->startEvent(ctx, &ss, descr);
                head(16, px[1]);
                memcpy(descr + 24, &step, 4);
                p->startEvent(ctx, &rs, descr);
                p->recordEventState(ss, 8, size);
                p->recordEventState(rs, 10, size);
                p->recordEventState(ss, 20, size);
                p->recordEventState(ss, 9, size);
                p->stopEvent(ss);
                p->recordEventState(rs, 12, size);
                p->stopEvent(rs);
                callbacks += 9;
            }
            p->stopEvent(px[0]);
            p->stopEvent(px[1]);
            uint64_t stop[2] = {now_ns(), 0};
            p->recordEventState(k, 22, stop);
            p->stopEvent(k);
            callbacks += 5;
        }
    }
    uint64_t t = now_ns() - t0;
    printf("plugin: %.1f ns per operation, %.1f ns per callback (%ld operations, %ld callbacks each); "
           "on the application's thread (Coll start and stop, incl. 2 clock reads): %.1f ns\n",
           (double)t / (double)ops, (double)t / (double)callbacks, ops, callbacks / ops, (double)app / (double)ops);
    return 0;
}
