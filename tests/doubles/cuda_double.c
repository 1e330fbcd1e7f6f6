/* TEST DOUBLE of the CUDA driver API (libcuda.so.1) — there is no GPU here.
 *
 * Built by the tests as `libcuda.so.1` under target/.../test-doubles/ and found by the loader in
 * place of NVIDIA's driver. It models just what commscope's shim and the NCCL test double need:
 *
 * - one context per process ("device" TESTDOUBLE_CUDA_DEVICE, default 0);
 * - streams as FIFO queues, each drained in order by its own worker thread (the "GPU");
 *   the legacy default stream (0, 1) and the per-thread one (2) share one queue;
 * - work items: event records (stamped with CLOCK_MONOTONIC when the queue reaches them, like
 *   a GPU timestamp; at once on an idle stream), busy "kernels" (testdouble_cuda_launch_busy), and host functions
 *   (cuLaunchHostFunc) that the NCCL double uses to wait for its peers;
 * - stream capture: between cuStreamBeginCapture and cuStreamEndCapture work is collected into a
 *   graph instead of running (each capture with its own id: cuStreamGetCaptureInfo_v2);
 *   cuGraphLaunch replays it. An event recorded on a capturing stream
 *   is counted as a capture violation (testdouble_cuda_capture_violations) — the shim must never
 *   cause one.
 *
 * - a virtual GPU clock: a host function may say when the work it stands for ended on the GPU
 *   (testdouble_cuda_work_ended); the next event its stream reaches is stamped with that time,
 *   not with when the worker got to it. The NCCL double gives every rank of a collective the
 *   same end, as a GPU's all-reduce ends together everywhere, so cross-rank comparisons in the
 *   tests are exact instead of depending on how late two cores schedule each worker.
 *
 * TESTDOUBLE_CUDA_NOOP_EVENTS=1 (benchmarks) completes an event the moment it is recorded.
 *
 * Error codes follow the driver's: 0 success, 1 invalid value, 400 invalid handle,
 * 600 not ready, 900 stream capture unsupported.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void (*CUhostFn)(void *);

enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_HANDLE = 400, NOT_READY = 600,
       CAPTURE_UNSUPPORTED = 900 };

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct event {
    int magic;
    volatile int recorded, done;
    uint64_t t;
    uint64_t gen;
};

enum kind { K_EVENT, K_BUSY, K_HOST };

struct item {
    enum kind kind;
    struct event *ev;
    uint64_t gen;
    uint64_t ns;
    CUhostFn fn;
    void *arg;
    struct item *next;
};

struct graph {
    struct item *head, *tail;
};

struct stream {
    int magic;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct item *head, *tail;
    int running; /* an item is being executed */
    int capturing;
    struct graph *capture;
    unsigned long long capture_id;
    pthread_t worker;
    int started;
};

#define EVENT_MAGIC 0x45564e54
#define STREAM_MAGIC 0x5354524d

static int ctx_token;
static int initialized;
static __thread int ctx_current = 0;
static struct stream default_stream = {STREAM_MAGIC, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                                       0, 0, 0, 0, 0, 0, 0};
static volatile long capture_violations;
static volatile long events_recorded;

static struct stream *stream_of(uintptr_t h) {
    if (h <= 2) return &default_stream;
    struct stream *s = (struct stream *)h;
    return s->magic == STREAM_MAGIC ? s : NULL;
}

/* The virtual GPU clock of the stream whose worker runs on this thread: set by a host function
 * (the end of the work it stood for), taken by the next event. */
static __thread uint64_t work_ended;

void testdouble_cuda_work_ended(uint64_t t) { work_ended = t; }

static void run_item(struct item *it) {
    switch (it->kind) {
    case K_EVENT:
        if (it->ev->gen == it->gen) {
            it->ev->t = work_ended ? work_ended : now_ns();
            work_ended = 0;
            __atomic_store_n(&it->ev->done, 1, __ATOMIC_RELEASE);
        }
        break;
    case K_BUSY: {
        struct timespec ts = {(time_t)(it->ns / 1000000000ull), (long)(it->ns % 1000000000ull)};
        nanosleep(&ts, NULL);
        break;
    }
    case K_HOST:
        it->fn(it->arg);
        break;
    }
}

static void *worker(void *p) {
    struct stream *s = p;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
        struct item *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        s->running = 1;
        pthread_mutex_unlock(&s->mu);
        run_item(it);
        free(it);
        pthread_mutex_lock(&s->mu);
        s->running = 0;
        pthread_cond_broadcast(&s->cv);
    }
    return NULL;
}

static void push_item(struct stream *s, struct item *it) {
    it->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->capturing) {
        struct graph *g = s->capture;
        if (g->tail) g->tail->next = it; else g->head = it;
        g->tail = it;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    if (!s->started) {
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_create(&s->worker, &a, worker, s);
        s->started = 1;
    }
    if (s->tail) s->tail->next = it; else s->head = it;
    s->tail = it;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

CUresult cuInit(unsigned flags) { (void)flags; initialized = 1; ctx_current = 1; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }
CUresult cuCtxGetCurrent(uintptr_t *ctx) {
    if (!initialized) return NOT_INITIALIZED;
    *ctx = ctx_current || initialized ? (uintptr_t)&ctx_token : 0;
    return OK;
}
CUresult cuCtxSetCurrent(uintptr_t ctx) { ctx_current = ctx != 0; return OK; }
CUresult cuCtxPushCurrent_v2(uintptr_t ctx) { (void)ctx; return OK; }
CUresult cuCtxPopCurrent_v2(uintptr_t *ctx) { if (ctx) *ctx = (uintptr_t)&ctx_token; return OK; }
CUresult cuCtxGetDevice(int *dev) {
    const char *d = getenv("TESTDOUBLE_CUDA_DEVICE");
    *dev = d ? atoi(d) : 0;
    return OK;
}
CUresult cuStreamGetCtx(uintptr_t stream, uintptr_t *ctx) {
    if (!stream_of(stream)) return INVALID_HANDLE;
    *ctx = (uintptr_t)&ctx_token;
    return OK;
}

CUresult cuStreamCreate(uintptr_t *out, unsigned flags) {
    (void)flags;
    struct stream *s = calloc(1, sizeof *s);
    s->magic = STREAM_MAGIC;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *out = (uintptr_t)s;
    return OK;
}
CUresult cuStreamDestroy_v2(uintptr_t stream) { (void)stream; return OK; /* leaked: workers may run */ }

CUresult cuStreamSynchronize(uintptr_t stream) {
    struct stream *s = stream_of(stream);
    if (!s) return INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    while (s->head || s->running) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return OK;
}

CUresult cuStreamBeginCapture_v2(uintptr_t stream, int mode) {
    (void)mode;
    struct stream *s = stream_of(stream);
    if (!s || stream <= 2) return CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&s->mu);
    static unsigned long long next_capture_id;
    s->capturing = 1;
    s->capture = calloc(1, sizeof(struct graph));
    s->capture_id = __atomic_add_fetch(&next_capture_id, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&s->mu);
    return OK;
}
CUresult cuStreamEndCapture(uintptr_t stream, uintptr_t *graph) {
    struct stream *s = stream_of(stream);
    if (!s || !s->capturing) return INVALID_VALUE;
    pthread_mutex_lock(&s->mu);
    s->capturing = 0;
    *graph = (uintptr_t)s->capture;
    s->capture = NULL;
    pthread_mutex_unlock(&s->mu);
    return OK;
}
CUresult cuStreamIsCapturing(uintptr_t stream, int *status) {
    struct stream *s = stream_of(stream);
    if (!s) return INVALID_HANDLE;
    *status = s->capturing ? 1 : 0;
    return OK;
}
CUresult cuThreadExchangeStreamCaptureMode(int *mode) { (void)mode; return OK; }
/* Status and the capture's unique id (the other outputs are optional and left alone). */
CUresult cuStreamGetCaptureInfo_v2(uintptr_t stream, int *status, unsigned long long *id, void *graph,
                                   void *deps, void *ndeps) {
    (void)graph; (void)deps; (void)ndeps;
    struct stream *s = stream_of(stream);
    if (!s || !status) return INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    *status = s->capturing ? 1 : 0;
    if (id && s->capturing) *id = s->capture_id;
    pthread_mutex_unlock(&s->mu);
    return OK;
}

/* Replays a captured graph on a stream (a graph is its own executable here). */
CUresult cuGraphInstantiateWithFlags(uintptr_t *exec, uintptr_t graph, unsigned long long flags) {
    (void)flags;
    *exec = graph;
    return OK;
}
/* Kept: a graph is its own executable here, and its items may still be queued. */
CUresult cuGraphExecDestroy(uintptr_t exec) { return exec ? OK : INVALID_HANDLE; }
CUresult cuGraphDestroy(uintptr_t graph) { return graph ? OK : INVALID_HANDLE; }
CUresult cuGraphLaunch(uintptr_t exec, uintptr_t stream) {
    struct stream *s = stream_of(stream);
    struct graph *g = (struct graph *)exec;
    if (!s || !g) return INVALID_HANDLE;
    for (struct item *it = g->head; it; it = it->next) {
        struct item *c = malloc(sizeof *c);
        *c = *it;
        if (c->kind == K_EVENT) c->gen = c->ev->gen;
        push_item(s, c);
    }
    return OK;
}

CUresult cuEventCreate(uintptr_t *out, unsigned flags) {
    (void)flags;
    struct event *e = calloc(1, sizeof *e);
    e->magic = EVENT_MAGIC;
    *out = (uintptr_t)e;
    return OK;
}
CUresult cuEventDestroy_v2(uintptr_t ev) {
    struct event *e = (struct event *)ev;
    if (!e || e->magic != EVENT_MAGIC) return INVALID_HANDLE;
    e->magic = 0; /* leaked on purpose: a queued record may still point at it */
    return OK;
}
static int noop_events = -1;

CUresult cuEventRecord(uintptr_t ev, uintptr_t stream) {
    struct event *e = (struct event *)ev;
    struct stream *s = stream_of(stream);
    if (!e || e->magic != EVENT_MAGIC || !s) return INVALID_HANDLE;
    /* TESTDOUBLE_CUDA_NOOP_EVENTS=1 (benchmarks): an event completes the moment it is recorded. */
    if (noop_events < 0) noop_events = getenv("TESTDOUBLE_CUDA_NOOP_EVENTS") != NULL;
    if (noop_events) {
        e->recorded = 1;
        e->gen++;
        e->t = now_ns();
        __atomic_store_n(&e->done, 1, __ATOMIC_RELEASE);
        return OK;
    }
    if (s->capturing) __atomic_add_fetch(&capture_violations, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&events_recorded, 1, __ATOMIC_RELAXED);
    /* On an idle stream the event completes at once, as a GPU stamps it (so an anchor taken on
     * an idle stream is as tight as the host's two clock reads around it). */
    pthread_mutex_lock(&s->mu);
    if (!s->capturing && !s->head && !s->running) {
        e->recorded = 1;
        e->gen++;
        e->t = now_ns();
        __atomic_store_n(&e->done, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&s->mu);
        return OK;
    }
    pthread_mutex_unlock(&s->mu);
    struct item *it = calloc(1, sizeof *it);
    it->kind = K_EVENT;
    it->ev = e;
    e->recorded = 1;
    e->done = 0;
    it->gen = ++e->gen;
    push_item(s, it);
    return OK;
}
CUresult cuEventQuery(uintptr_t ev) {
    struct event *e = (struct event *)ev;
    if (!e || e->magic != EVENT_MAGIC) return INVALID_HANDLE;
    if (!e->recorded) return OK;
    return __atomic_load_n(&e->done, __ATOMIC_ACQUIRE) ? OK : NOT_READY;
}
CUresult cuEventSynchronize(uintptr_t ev) {
    struct event *e = (struct event *)ev;
    if (!e || e->magic != EVENT_MAGIC) return INVALID_HANDLE;
    while (e->recorded && !__atomic_load_n(&e->done, __ATOMIC_ACQUIRE)) usleep(20);
    return OK;
}
CUresult cuEventElapsedTime(float *ms, uintptr_t a, uintptr_t b) {
    struct event *x = (struct event *)a, *y = (struct event *)b;
    if (!x || !y || x->magic != EVENT_MAGIC || y->magic != EVENT_MAGIC) return INVALID_HANDLE;
    if (!x->done || !y->done) return NOT_READY;
    *ms = (float)((double)((int64_t)(y->t - x->t)) / 1e6);
    return OK;
}

CUresult cuLaunchHostFunc(uintptr_t stream, CUhostFn fn, void *arg) {
    struct stream *s = stream_of(stream);
    if (!s) return INVALID_HANDLE;
    struct item *it = calloc(1, sizeof *it);
    it->kind = K_HOST;
    it->fn = fn;
    it->arg = arg;
    push_item(s, it);
    return OK;
}

/* Test-double extras. */
CUresult testdouble_cuda_launch_busy(uintptr_t stream, unsigned long long ns) {
    struct stream *s = stream_of(stream);
    if (!s) return INVALID_HANDLE;
    struct item *it = calloc(1, sizeof *it);
    it->kind = K_BUSY;
    it->ns = ns;
    push_item(s, it);
    return OK;
}
long testdouble_cuda_capture_violations(void) { return capture_violations; }
long testdouble_cuda_events_recorded(void) { return events_recorded; }

#ifdef TESTDOUBLE_HIP
/* Built with -DTESTDOUBLE_HIP as `libamdhip64.so`: the same "GPU" under the HIP runtime's names
 * that the shim uses for RCCL (same shapes, error codes and capture constants). */
#define HIP_ALIAS(hip, cu) __typeof__(cu) hip __attribute__((alias(#cu)))
HIP_ALIAS(hipInit, cuInit);
HIP_ALIAS(hipCtxGetCurrent, cuCtxGetCurrent);
HIP_ALIAS(hipCtxSetCurrent, cuCtxSetCurrent);
HIP_ALIAS(hipCtxPushCurrent, cuCtxPushCurrent_v2);
HIP_ALIAS(hipCtxPopCurrent, cuCtxPopCurrent_v2);
HIP_ALIAS(hipCtxGetDevice, cuCtxGetDevice);
HIP_ALIAS(hipStreamCreateWithFlags, cuStreamCreate);
HIP_ALIAS(hipStreamSynchronize, cuStreamSynchronize);
HIP_ALIAS(hipStreamIsCapturing, cuStreamIsCapturing);
HIP_ALIAS(hipStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2);
HIP_ALIAS(hipThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode);
HIP_ALIAS(hipEventCreateWithFlags, cuEventCreate);
HIP_ALIAS(hipEventRecord, cuEventRecord);
HIP_ALIAS(hipEventQuery, cuEventQuery);
HIP_ALIAS(hipEventSynchronize, cuEventSynchronize);
HIP_ALIAS(hipEventElapsedTime, cuEventElapsedTime);
HIP_ALIAS(hipEventDestroy, cuEventDestroy_v2);
HIP_ALIAS(hipLaunchHostFunc, cuLaunchHostFunc);
#endif
