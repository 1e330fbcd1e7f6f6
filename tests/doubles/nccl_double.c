/* TEST DOUBLE of NCCL (libnccl.so.2) — collectives among processes on one machine, without a GPU.
 *
 * Built by the tests as `libnccl.so.2` (with `pnccl*` twins, like NCCL's PROFAPI builds) on top
 * of the CUDA driver test double. Each communicator is a shared-memory segment named after its
 * unique id; a collective is a host function queued on the caller's stream (so it completes
 * asynchronously, in stream order, like a kernel) that publishes "rank r reached operation k"
 * and waits until every member has, then "transfers" its bytes at TESTDOUBLE_NCCL_GBPS (default
 * 20) GB/s. A rank that never issues an operation leaves the others' stream work — and so their
 * CUDA end events — waiting forever, as on a GPU.
 *
 * Between ncclGroupStart and ncclGroupEnd operations are queued; the group end launches one
 * host function per stream that runs them together (a send and a receive between two ranks in one
 * group cannot deadlock), as NCCL fuses a group into one kernel.
 *
 * Like the real library, ncclBcast calls the exported ncclBroadcast and ncclCommInitAll calls
 * the exported ncclGetUniqueId (through the PLT, where a preloaded wrapper sees them).
 *
 * Fault injection: TESTDOUBLE_NCCL_ASYNC_ERROR="RANK:OPS" makes that rank's communicators report
 * ncclRemoteError from ncclCommGetAsyncError once it has issued OPS operations.
 * TESTDOUBLE_NCCL_VERSION sets what ncclGetVersion reports (default 23203).
 * TESTDOUBLE_NCCL_NOOP=1 makes every operation return at once without any work (benchmarks).
 *
 * Profiler plugin: like NCCL, NCCL_PROFILER_PLUGIN=<path> loads a library exporting
 * ncclProfiler_v7; each communicator's init calls its init with the communicator's commHash
 * (computed as NCCL >= 2.26 does: from the unique id, or from the parent's hash, split count and
 * color), each operation starts a Coll/P2p event when enqueued (stopped right after) and a
 * KernelCh event on channel 0 while its "kernel" runs, with a globaltimer-like clock (host
 * CLOCK_MONOTONIC + 10^12 ns) at channel start and stop. A collective's proxy sends to the next
 * rank of the ring and receives from the previous one (ProxyOp events, 4 steps each); with
 * ProxyStep asked for, each step goes through NCCL's states (send: SendGPUWait, SendPeerWait,
 * SendWait with transSize, stop; receive: RecvWait, RecvGPUWait with transSize, stop).
 *
 * A slow link: TESTDOUBLE_NCCL_SLOW_LINK="SRC:DST:FACTOR[:AFTER]" (communicator ranks, DST the
 * next rank of SRC's ring) makes every collective of a communicator with that link, from its
 * operation AFTER (default 0) on, take FACTOR times longer, as a ring runs at its slowest link's pace: SRC's send steps spend the extra time on
 * the network, every other rank's send steps spend it waiting for their GPU (for data from
 * upstream).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* As in NCCL's own binary: the node agent reads the version (which says how commHash is
 * computed) from this string. */
__attribute__((used)) static const char version_string[] = "NCCL version 2.32.3+testdouble";

typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int CUresult;
typedef void (*CUhostFn)(void *);
extern CUresult cuLaunchHostFunc(uintptr_t stream, CUhostFn fn, void *arg);
/* The CUDA double's virtual GPU clock (absent from a real driver). */
extern void testdouble_cuda_work_ended(uint64_t t) __attribute__((weak));
extern CUresult cuStreamIsCapturing(uintptr_t stream, int *status);

enum { ncclSuccess = 0, ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5,
       ncclRemoteError = 6 };

#define MAXR 64
#define MAX_SPLITS 64

struct shared {
    volatile uint64_t reached[MAXR];          /* collectives launched on the GPU, per rank */
    volatile uint64_t posted_at[MAXR][16];    /* when each rank launched collective k (slot k % 16) */
    volatile uint64_t sent[MAXR][MAXR];       /* p2p sends from a to b reached */
    volatile uint64_t received[MAXR][MAXR];   /* p2p receives by b from a reached */
    volatile int split_color[MAX_SPLITS][MAXR];
    volatile int split_key[MAX_SPLITS][MAXR];
    volatile uint64_t split_arrived[MAX_SPLITS];
    volatile uint64_t joined;
};

struct ncclComm {
    int rank, nranks, dev;
    uint64_t hash;           /* commHash */
    void *pctx;              /* the profiler plugin's context */
    uint64_t fseq[16];       /* per-function sequence numbers (the profiler's seqNumber) */
    unsigned char id[128];
    struct shared *sh;
    uint64_t ops;            /* collectives issued */
    uint64_t sends[MAXR], recvs[MAXR];
    int splits;
    int async_after;         /* -1: never */
};
typedef struct ncclComm *ncclComm_t;

static int elem_size(int dt) {
    switch (dt) {
    case 0: case 1: case 10: case 11: return 1;
    case 6: case 9: return 2;
    case 2: case 3: case 7: return 4;
    case 4: case 5: case 8: return 8;
    default: return 0;
    }
}

static double gbps(void) {
    const char *s = getenv("TESTDOUBLE_NCCL_GBPS");
    double v = s ? atof(s) : 20.0;
    return v > 0 ? v : 20.0;
}

/* Sleeps until CLOCK_MONOTONIC reaches `t` ns (a late wake-up does not delay later deadlines). */
static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

static void wait_until(volatile uint64_t *p, uint64_t v) {
    while (__atomic_load_n(p, __ATOMIC_ACQUIRE) < v) usleep(50);
}

static void shm_name(const unsigned char *id, char *name, size_t len) {
    uint64_t a, b;
    memcpy(&a, id, 8);
    memcpy(&b, id + 8, 8);
    snprintf(name, len, "/testdouble-nccl-%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

static struct shared *attach(const unsigned char *id) {
    char name[64];
    shm_name(id, name, sizeof name);
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return NULL;
    if (ftruncate(fd, sizeof(struct shared)) != 0) { close(fd); return NULL; }
    void *p = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* NCCL >= 2.26's commHash accumulator (src/include/bitops.h). */
struct acc { uint64_t a0, a1; };
static void eat(struct acc *h, const void *bytes, size_t n) {
    const unsigned char *b = bytes;
    h->a0 ^= n;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t x = 0;
        memcpy(&x, b + i, n - i < 8 ? n - i : 8);
        h->a0 += h->a1;
        h->a1 ^= h->a0;
        h->a0 ^= h->a0 >> 31;
        h->a0 *= 0x9de62bbc8cef3ce3ull;
        h->a1 ^= h->a1 >> 32;
        h->a1 *= 0x485cd6311b599e79ull;
        h->a0 += x;
    }
}
static uint64_t digest(const struct acc *h) {
    uint64_t x = h->a0;
    x ^= x >> 31;
    x *= 0xbac3bd562846de6bull;
    x += h->a1;
    x ^= x >> 32;
    x *= 0x995a187a14e7b445ull;
    return x;
}

/* ----- profiler plugin ----------------------------------------------------------------------- */

#include "profiler_v7.h"

static profiler_v7 *prof;
static int prof_mask;
static pthread_once_t prof_once = PTHREAD_ONCE_INIT;

static void prof_load(void) {
    const char *p = getenv("NCCL_PROFILER_PLUGIN");
    if (!p || !*p || strcmp(p, "none") == 0) return;
    void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (h) prof = dlsym(h, "ncclProfiler_v7");
}

static void prof_init(struct ncclComm *c) {
    pthread_once(&prof_once, prof_load);
    if (!prof) return;
    int mask = 0;
    if (prof->init(&c->pctx, c->hash, &mask, "", 1, c->nranks, c->rank, NULL) != 0) c->pctx = NULL;
    prof_mask = mask;
}

static uint64_t gpu_timer(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + 1000000000000ull;
}

/* Starts a Coll (func < 0x100) or P2p event with a v7 descriptor; returns its handle. */
static void *prof_op(struct ncclComm *c, int p2p, int fn, const char *func, size_t count, int dt, int root_or_peer) {
    static const char *dts[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                                "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                "ncclFloat8e5m2"};
    if (!prof || !c->pctx || !(prof_mask & (p2p ? 4 : 2))) return NULL;
    unsigned char d[160];
    memset(d, 0, sizeof d);
    const char *dtn = dt >= 0 && dt < 12 ? dts[dt] : "ncclInt8";
    uint64_t type = p2p ? 4 : 2;
    memcpy(d, &type, 8);
    memcpy(d + 16, &c->rank, 4);
    if (p2p) {
        memcpy(d + 24, &func, 8);
        memcpy(d + 40, &dtn, 8);
        memcpy(d + 48, &count, 8);
        memcpy(d + 56, &root_or_peer, 4);
        d[60] = 1;
    } else {
        uint64_t sn = c->fseq[fn & 15]++;
        const char *algo = "RING", *proto = "SIMPLE";
        memcpy(d + 24, &sn, 8);
        memcpy(d + 32, &func, 8);
        memcpy(d + 56, &count, 8);
        memcpy(d + 64, &root_or_peer, 4);
        memcpy(d + 72, &dtn, 8);
        d[80] = 1;
        d[81] = 8;
        memcpy(d + 88, &algo, 8);
        memcpy(d + 96, &proto, 8);
    }
    void *h = NULL;
    prof->startEvent(c->pctx, &h, d);
    return h;
}

static void *prof_channel_start(struct ncclComm *c, void *parent) {
    if (!prof || !parent || !(prof_mask & 64)) return NULL;
    unsigned char d[160];
    memset(d, 0, sizeof d);
    uint64_t type = 64, t = gpu_timer();
    memcpy(d, &type, 8);
    memcpy(d + 8, &parent, 8);
    memcpy(d + 16, &c->rank, 4);
    memcpy(d + 32, &t, 8);
    void *h = NULL;
    prof->startEvent(c->pctx, &h, d);
    return h;
}

/* A ProxyOp event (v7 descriptor) for a send to, or a receive from, `peer`. */
static void *prof_proxy_start(struct ncclComm *c, void *parent, int peer, int is_send, uint64_t bytes) {
    if (!prof || !parent || !(prof_mask & 8)) return NULL;
    unsigned char d[160];
    memset(d, 0, sizeof d);
    uint64_t type = 8;
    int pid = (int)getpid(), steps = 4, chunk = (int)(bytes / 4 > 0 ? bytes / 4 : 1);
    memcpy(d, &type, 8);
    memcpy(d + 8, &parent, 8);
    memcpy(d + 16, &c->rank, 4);
    memcpy(d + 24, &pid, 4);
    d[28] = 0;
    memcpy(d + 32, &peer, 4);
    memcpy(d + 36, &steps, 4);
    memcpy(d + 40, &chunk, 4);
    memcpy(d + 44, &is_send, 4);
    void *h = NULL;
    prof->startEvent(c->pctx, &h, d);
    return h;
}

static void prof_stop(void *h) {
    if (prof && h) prof->stopEvent(h);
}

/* `end`: the kernel's end on the GPU timer; 0: now. */
static void prof_channel_stop(void *h, uint64_t end) {
    if (!prof || !h) return;
    uint64_t args[2] = {end ? end : gpu_timer(), 0};
    prof->recordEventState(h, 22, args);
    prof->stopEvent(h);
}

/* A ProxyStep event (v7 descriptor) under a proxy operation. */
static void *prof_step_start(struct ncclComm *c, void *proxy, int step) {
    if (!prof || !proxy || !(prof_mask & 16)) return NULL;
    unsigned char d[160];
    memset(d, 0, sizeof d);
    uint64_t type = 16;
    memcpy(d, &type, 8);
    memcpy(d + 8, &proxy, 8);
    memcpy(d + 16, &c->rank, 4);
    memcpy(d + 24, &step, 4);
    void *h = NULL;
    prof->startEvent(c->pctx, &h, d);
    return h;
}

static void prof_state(void *h, int state, uint64_t trans_size) {
    if (!prof || !h) return;
    uint64_t args[2] = {trans_size, 0};
    prof->recordEventState(h, state, args);
}

/* TESTDOUBLE_NCCL_SLOW_LINK: the slow link's sender, its receiver and factor (or factor 1). */
static int slow_src = -1, slow_dst = -1;
static double slow_factor = 1.0;
static uint64_t slow_after; /* the communicator's operation index from which the link is slow */
static pthread_once_t slow_once = PTHREAD_ONCE_INIT;
static void slow_load(void) {
    const char *s = getenv("TESTDOUBLE_NCCL_SLOW_LINK");
    unsigned long long after = 0;
    int n = s ? sscanf(s, "%d:%d:%lf:%llu", &slow_src, &slow_dst, &slow_factor, &after) : 0;
    if (n < 3) slow_factor = 1.0;
    slow_after = after;
    if (slow_factor < 1.0) slow_factor = 1.0;
}

/* Transfers one collective's bytes over the ring, step by step, reporting the proxy's steps. */
/* Returns the modelled duration (ns): the same on every rank. */
static uint64_t ring_transfer(struct ncclComm *c, uint64_t k, void *send_px, void *recv_px, uint64_t bytes) {
    enum { STEPS = 4 };
    pthread_once(&slow_once, slow_load);
    int n = c->nranks, me = c->rank;
    double base = (double)bytes / gbps();
    int slow_ring = slow_factor > 1.0 && slow_src < n && slow_dst == (slow_src + 1) % n && k >= slow_after;
    double total = slow_ring ? base * slow_factor : base;
    uint64_t on_wire = (uint64_t)((me == slow_src && slow_ring ? total : base) / STEPS);
    uint64_t gpu_wait = (uint64_t)(total / STEPS) - on_wire;
    uint64_t chunk = bytes / STEPS;
    /* Against deadlines from the start, so that every rank ends when the transfer would. */
    uint64_t t = mono_ns();
    for (int k = 0; k < STEPS; k++) {
        void *ss = prof_step_start(c, send_px, k);
        void *rs = prof_step_start(c, recv_px, k);
        prof_state(ss, 8, 0);
        prof_state(rs, 10, 0);
        t += gpu_wait;
        if (gpu_wait) sleep_until(t);
        prof_state(ss, 20, chunk);
        prof_state(ss, 9, chunk);
        t += on_wire;
        sleep_until(t);
        prof_stop(ss);
        prof_state(rs, 12, chunk);
        prof_stop(rs);
    }
    return (uint64_t)(gpu_wait + on_wire) * STEPS;
}

/* Every pnccl* twin below is an alias of the same code as its nccl* name, as in NCCL's
 * PROFAPI builds (src/include/core.h). */

/* ----- library facts ------------------------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *v) {
    const char *s = getenv("TESTDOUBLE_NCCL_VERSION");
    *v = s ? atoi(s) : 23203;
    return ncclSuccess;
}
ncclResult_t pncclGetVersion(int *v) __attribute__((alias("ncclGetVersion")));

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 17);
    for (int i = 0; i < 128; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        id->internal[i] = (char)(x >> 24);
    }
    return ncclSuccess;
}
ncclResult_t pncclGetUniqueId(ncclUniqueId *id) __attribute__((alias("ncclGetUniqueId")));

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInvalidArgument: return "invalid argument";
    default: return "internal error";
    }
}
const char * pncclGetErrorString(ncclResult_t r) __attribute__((alias("ncclGetErrorString")));
const char *ncclGetLastError(ncclComm_t c) { (void)c; return ""; }
const char * pncclGetLastError(ncclComm_t c) __attribute__((alias("ncclGetLastError")));

static ncclComm_t make_comm2(const unsigned char *id, int nranks, int rank, int unlink_after, uint64_t hash);
static ncclComm_t make_comm(const unsigned char *id, int nranks, int rank) {
    struct acc h = {1, 1};
    eat(&h, id, 128);
    return make_comm2(id, nranks, rank, 1, digest(&h));
}

/* ----- communicators ------------------------------------------------------------------------- */

static ncclComm_t make_comm2(const unsigned char *id, int nranks, int rank, int unlink_after, uint64_t hash) {
    if (nranks < 1 || nranks > MAXR || rank < 0 || rank >= nranks) return NULL;
    struct ncclComm *c = calloc(1, sizeof *c);
    c->rank = rank;
    c->nranks = nranks;
    const char *d = getenv("TESTDOUBLE_CUDA_DEVICE");
    c->dev = d ? atoi(d) : 0;
    memcpy(c->id, id, 128);
    c->sh = attach(id);
    c->async_after = -1;
    c->hash = hash;
    const char *ae = getenv("TESTDOUBLE_NCCL_ASYNC_ERROR");
    const char *r = getenv("RANK");
    int myrank = r ? atoi(r) : rank;
    if (ae) {
        int er = -1, after = 0;
        if (sscanf(ae, "%d:%d", &er, &after) == 2 && er == myrank) c->async_after = after;
    }
    if (!c->sh) { free(c); return NULL; }
    __atomic_add_fetch(&c->sh->joined, 1, __ATOMIC_ACQ_REL);
    /* Init is collective: wait for every member; then nobody needs the name any more. */
    wait_until(&c->sh->joined, (uint64_t)nranks);
    if (rank == 0 && unlink_after) {
        char name[64];
        shm_name(id, name, sizeof name);
        shm_unlink(name);
    }
    prof_init(c);
    return c;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return ncclInvalidArgument;
    *comm = make_comm((unsigned char *)id.internal, nranks, rank);
    return *comm ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t pncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int r) __attribute__((alias("ncclCommInitRank")));

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config) {
    (void)config;
    if (!comm) return ncclInvalidArgument;
    *comm = make_comm((unsigned char *)id.internal, nranks, rank);
    return *comm ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t pncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId id, int r, void *cfg) __attribute__((alias("ncclCommInitRankConfig")));

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    (void)devlist;
    ncclUniqueId id;
    ncclResult_t rc = ncclGetUniqueId(&id); /* through the PLT, as NCCL does */
    if (rc != ncclSuccess) return rc;
    struct shared *sh = attach((unsigned char *)id.internal);
    if (!sh) return ncclInternalError;
    /* One process holds every rank: no waiting for the others to join. */
    sh->joined = (uint64_t)ndev;
    for (int i = 0; i < ndev; i++) {
        struct acc h = {1, 1};
        eat(&h, id.internal, 128);
        comms[i] = make_comm2((unsigned char *)id.internal, ndev, i, 0, digest(&h));
        if (!comms[i]) return ncclInvalidArgument;
        comms[i]->dev = devlist ? devlist[i] : i;
    }
    char name[64];
    shm_name((unsigned char *)id.internal, name, sizeof name);
    shm_unlink(name);
    return ncclSuccess;
}
ncclResult_t pncclCommInitAll(ncclComm_t *c, int n, const int *d) __attribute__((alias("ncclCommInitAll")));

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *config) {
    (void)config;
    if (!comm) return ncclInvalidArgument;
    int k = comm->splits++;
    if (k >= MAX_SPLITS) return ncclInternalError;
    struct shared *sh = comm->sh;
    sh->split_color[k][comm->rank] = color;
    sh->split_key[k][comm->rank] = key;
    __atomic_add_fetch(&sh->split_arrived[k], 1, __ATOMIC_ACQ_REL);
    wait_until(&sh->split_arrived[k], (uint64_t)comm->nranks);
    *newcomm = NULL;
    if (color < 0) return ncclSuccess;
    int n = 0, me = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (sh->split_color[k][r] != color) continue;
        int kr = sh->split_key[k][r];
        if (r != comm->rank && (kr < key || (kr == key && r < comm->rank))) me++;
        n++;
    }
    unsigned char id[128];
    memcpy(id, comm->id, 128);
    for (int i = 0; i < 16; i++) id[i] ^= (unsigned char)(0x5a + k * 7 + color * 13 + i);
    /* NCCL's split commHash: the parent's hash, its split counter (1 for the first), the color. */
    struct acc h = {1, 1};
    int child = k + 1;
    eat(&h, &comm->hash, 8);
    eat(&h, &child, 4);
    eat(&h, &color, 4);
    *newcomm = make_comm2(id, n, me, 1, digest(&h));
    return *newcomm ? ncclSuccess : ncclInternalError;
}
ncclResult_t pncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *n, void *cfg) __attribute__((alias("ncclCommSplit")));

ncclResult_t ncclCommCount(const ncclComm_t c, int *n) { if (!c) return ncclInvalidArgument; *n = c->nranks; return ncclSuccess; }
ncclResult_t pncclCommCount(const ncclComm_t c, int *n) __attribute__((alias("ncclCommCount")));
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) { if (!c) return ncclInvalidArgument; *r = c->rank; return ncclSuccess; }
ncclResult_t pncclCommUserRank(const ncclComm_t c, int *r) __attribute__((alias("ncclCommUserRank")));
ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *d) { if (!c) return ncclInvalidArgument; *d = c->dev; return ncclSuccess; }
ncclResult_t pncclCommCuDevice(const ncclComm_t c, int *d) __attribute__((alias("ncclCommCuDevice")));

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) {
    if (!c) return ncclInvalidArgument;
    *e = (c->async_after >= 0 && c->ops >= (uint64_t)c->async_after) ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}
ncclResult_t pncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) __attribute__((alias("ncclCommGetAsyncError")));

ncclResult_t ncclCommFinalize(ncclComm_t c) { return c ? ncclSuccess : ncclInvalidArgument; }
ncclResult_t pncclCommFinalize(ncclComm_t c) __attribute__((alias("ncclCommFinalize")));
ncclResult_t ncclCommDestroy(ncclComm_t c) { if (!c) return ncclInvalidArgument; free(c); return ncclSuccess; }
ncclResult_t pncclCommDestroy(ncclComm_t c) __attribute__((alias("ncclCommDestroy")));
ncclResult_t ncclCommAbort(ncclComm_t c) { if (!c) return ncclInvalidArgument; free(c); return ncclSuccess; }
ncclResult_t pncclCommAbort(ncclComm_t c) __attribute__((alias("ncclCommAbort")));

/* ----- operations ---------------------------------------------------------------------------- */

enum opkind { COLL, SEND, RECV };

struct op {
    enum opkind kind;
    ncclComm_t comm;
    uint64_t k;      /* the collective's index, or the p2p message's index with its peer */
    int peer;
    uint64_t bytes;
    void *ph;        /* the profiler's Coll/P2p event */
    int graph;       /* captured into a CUDA graph: a new collective each time the graph runs */
};

struct batch {
    int n;
    struct op ops[];
};

/* Raises a counter, never lowers it (a graph replay re-posts an old operation). */
static void raise_to(volatile uint64_t *p, uint64_t v) {
    uint64_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
}

static void post(struct op *o) {
    struct shared *sh = o->comm->sh;
    int me = o->comm->rank;
    switch (o->kind) {
    case COLL:
        /* A rank is at most one collective ahead of the slowest (it waits for all at each). */
        sh->posted_at[me][o->k % 16] = mono_ns();
        raise_to(&sh->reached[me], o->k + 1);
        break;
    case SEND: raise_to(&sh->sent[me][o->peer], o->k + 1); break;
    case RECV: raise_to(&sh->received[o->peer][me], o->k + 1); break;
    }
}

static void await(struct op *o) {
    struct shared *sh = o->comm->sh;
    int me = o->comm->rank;
    switch (o->kind) {
    case COLL:
        for (int r = 0; r < o->comm->nranks; r++) wait_until(&sh->reached[r], o->k + 1);
        break;
    case SEND: wait_until(&sh->received[me][o->peer], o->k + 1); break;
    case RECV: wait_until(&sh->sent[o->peer][me], o->k + 1); break;
    }
}

/* The "kernel": runs in stream order on the stream's worker. */
static void run_batch(void *p) {
    struct batch *b = p;
    uint64_t bytes = 0;
    void *ch[64] = {0}, *px[64][2] = {{0}};
    for (int i = 0; i < b->n && i < 64; i++) {
        struct op *o = &b->ops[i];
        int n = o->comm->nranks, me = o->comm->rank;
        ch[i] = prof_channel_start(o->comm, o->ph);
        /* The proxy's view: a ring for collectives, the peer for point-to-point. */
        if (o->kind == COLL && n > 1) {
            px[i][0] = prof_proxy_start(o->comm, o->ph, (me + 1) % n, 1, o->bytes);
            px[i][1] = prof_proxy_start(o->comm, o->ph, (me + n - 1) % n, 0, o->bytes);
        } else if (o->kind != COLL) {
            px[i][0] = prof_proxy_start(o->comm, o->ph, o->peer, o->kind == SEND, o->bytes);
        }
    }
    /* A collective in a CUDA graph is a new instance at every launch, numbered when it runs (so
     * a communicator must not get other work while a launch of it is pending; the jobs here
     * synchronize). The capture's own number is skipped alike on every rank. */
    for (int i = 0; i < b->n; i++)
        if (b->ops[i].graph && b->ops[i].kind == COLL)
            b->ops[i].k = __atomic_fetch_add(&b->ops[i].comm->ops, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < b->n; i++) post(&b->ops[i]);
    for (int i = 0; i < b->n; i++) await(&b->ops[i]);
    /* The virtual end of a batch of collectives: they start on the GPU when the last rank
     * launched them and take their modelled time — the same moment on every rank. */
    int all_coll = b->n <= 64;
    uint64_t vend = 0, modelled = 0;
    for (int i = 0; i < b->n; i++) {
        struct op *o = &b->ops[i];
        if (o->kind != COLL || o->comm->nranks < 2) {
            all_coll = 0;
            continue;
        }
        for (int r = 0; r < o->comm->nranks; r++) {
            uint64_t t = o->comm->sh->posted_at[r][o->k % 16];
            if (t > vend) vend = t;
        }
    }
    for (int i = 0; i < b->n; i++) {
        struct op *o = &b->ops[i];
        if (o->kind == COLL && o->comm->nranks > 1 && i < 64)
            modelled += ring_transfer(o->comm, o->k, px[i][0], px[i][1], o->bytes);
        else
            bytes += o->bytes;
    }
    sleep_ns((uint64_t)((double)bytes / gbps()));
    /* On the GPU timer (CLOCK_MONOTONIC + 10^12 s, see gpu_timer). */
    uint64_t gpu_end = all_coll && vend ? vend + modelled + 1000000000000ull : 0;
    for (int i = 0; i < b->n && i < 64; i++) {
        prof_stop(px[i][0]);
        prof_stop(px[i][1]);
        prof_channel_stop(ch[i], gpu_end);
        b->ops[i].ph = NULL; /* a graph replay reports no profiler events */
    }
    if (all_coll && vend && testdouble_cuda_work_ended) testdouble_cuda_work_ended(vend + modelled);
    /* Not freed: a batch captured into a CUDA graph runs again at every launch. */
}

struct pending { struct op op; uintptr_t stream; };
static __thread int group_depth;
static __thread struct pending *group_ops;
static __thread int group_n, group_cap;

static ncclResult_t launch_ops(struct pending *ops, int n) {
    /* One batch per stream, in first-use order. */
    int *done = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        int cnt = 0;
        for (int j = i; j < n; j++) if (!done[j] && ops[j].stream == ops[i].stream) cnt++;
        struct batch *b = malloc(sizeof *b + (size_t)cnt * sizeof(struct op));
        b->n = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && ops[j].stream == ops[i].stream) { b->ops[b->n++] = ops[j].op; done[j] = 1; }
        if (cuLaunchHostFunc(ops[i].stream, run_batch, b) != 0) { free(done); return 1; }
    }
    free(done);
    return ncclSuccess;
}

static int noop_mode = -1;

static ncclResult_t enqueue(struct op o, uintptr_t stream) {
    if (!o.comm) return ncclInvalidArgument;
    if (o.ph && prof) prof->stopEvent(o.ph); /* "stopped" = enqueued, as in NCCL */
    /* TESTDOUBLE_NCCL_NOOP=1 (benchmarks): operations complete at once, nothing is queued. */
    if (noop_mode < 0) noop_mode = getenv("TESTDOUBLE_NCCL_NOOP") != NULL;
    if (noop_mode) return ncclSuccess;
    int capturing = 0;
    if (cuStreamIsCapturing(stream, &capturing) == 0 && capturing) o.graph = 1;
    struct pending p = {o, stream};
    if (group_depth > 0) {
        if (group_n == group_cap) {
            group_cap = group_cap ? group_cap * 2 : 16;
            group_ops = realloc(group_ops, (size_t)group_cap * sizeof *group_ops);
        }
        group_ops[group_n++] = p;
        return ncclSuccess;
    }
    return launch_ops(&p, 1);
}

static ncclResult_t coll(ncclComm_t c, uint64_t bytes, uintptr_t stream, int fn, const char *func, size_t count,
                         int dt, int root) {
    if (!c) return ncclInvalidArgument;
    struct op o = {COLL, c, __atomic_fetch_add(&c->ops, 1, __ATOMIC_RELAXED), -1, bytes, NULL, 0};
    o.ph = prof_op(c, 0, fn, func, count, dt, root);
    return enqueue(o, stream);
}

ncclResult_t ncclGroupStart(void) { group_depth++; return ncclSuccess; }
ncclResult_t pncclGroupStart(void) __attribute__((alias("ncclGroupStart")));
ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) return ncclInvalidUsage;
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t rc = group_n ? launch_ops(group_ops, group_n) : ncclSuccess;
    group_n = 0;
    return rc;
}
ncclResult_t pncclGroupEnd(void) __attribute__((alias("ncclGroupEnd")));

#define SZ(n, dt) ((uint64_t)(n) * (uint64_t)elem_size(dt))

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, uintptr_t st) {
    (void)s; (void)r; (void)op;
    if (!elem_size(dt)) return ncclInvalidArgument;
    return coll(c, 2 * SZ(n, dt), st, 4, "AllReduce", n, dt, -1);
}
ncclResult_t pncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclAllReduce")));
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, ncclComm_t c, uintptr_t st) {
    (void)s; (void)r;
    if (!c || root < 0 || root >= c->nranks) return ncclInvalidArgument;
    return coll(c, SZ(n, dt), st, 0, "Broadcast", n, dt, root);
}
ncclResult_t pncclBroadcast(const void *s, void *r, size_t n, int dt, int root, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclBroadcast")));
/* As in NCCL: the legacy in-place broadcast is implemented by calling the exported one. */
ncclResult_t ncclBcast(void *b, size_t n, int dt, int root, ncclComm_t c, uintptr_t st) {
    return ncclBroadcast(b, b, n, dt, root, c, st);
}
ncclResult_t pncclBcast(void *b, size_t n, int dt, int root, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclBcast")));
ncclResult_t ncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, ncclComm_t c, uintptr_t st) {
    (void)s; (void)r; (void)op;
    if (!c || root < 0 || root >= c->nranks) return ncclInvalidArgument;
    return coll(c, SZ(n, dt), st, 1, "Reduce", n, dt, root);
}
ncclResult_t pncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclReduce")));
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int dt, ncclComm_t c, uintptr_t st) {
    (void)s; (void)r;
    return coll(c, c ? SZ(n, dt) * (uint64_t)c->nranks : 0, st, 2, "AllGather", n, dt, -1);
}
ncclResult_t pncclAllGather(const void *s, void *r, size_t n, int dt, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclAllGather")));
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, uintptr_t st) {
    (void)s; (void)r; (void)op;
    return coll(c, c ? SZ(n, dt) * (uint64_t)c->nranks : 0, st, 3, "ReduceScatter", n, dt, -1);
}
ncclResult_t pncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclReduceScatter")));
ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, int dt, ncclComm_t c, uintptr_t st) {
    (void)s; (void)r;
    return coll(c, c ? SZ(n, dt) * (uint64_t)c->nranks : 0, st, 8, "AlltoAll", n, dt, -1);
}
ncclResult_t pncclAlltoAll(const void *s, void *r, size_t n, int dt, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclAlltoAll")));
ncclResult_t ncclSend(const void *s, size_t n, int dt, int peer, ncclComm_t c, uintptr_t st) {
    (void)s;
    if (!c || peer < 0 || peer >= c->nranks) return ncclInvalidArgument;
    struct op o = {SEND, c, c->sends[peer]++, peer, SZ(n, dt), NULL};
    o.ph = prof_op(c, 1, 6, "Send", n, dt, peer);
    return enqueue(o, st);
}
ncclResult_t pncclSend(const void *s, size_t n, int dt, int peer, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclSend")));
ncclResult_t ncclRecv(void *r, size_t n, int dt, int peer, ncclComm_t c, uintptr_t st) {
    (void)r;
    if (!c || peer < 0 || peer >= c->nranks) return ncclInvalidArgument;
    struct op o = {RECV, c, c->recvs[peer]++, peer, SZ(n, dt), NULL};
    o.ph = prof_op(c, 1, 7, "Recv", n, dt, peer);
    return enqueue(o, st);
}
ncclResult_t pncclRecv(void *r, size_t n, int dt, int peer, ncclComm_t c, uintptr_t st) __attribute__((alias("ncclRecv")));

