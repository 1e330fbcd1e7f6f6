/* An NCCL job that reaches NCCL only through dlsym on its own dlopen handle, as a framework that
 * loads its collective library by path does: no call goes through the global scope, so a
 * preloaded library never sees one. Forks RANKS processes (RANK and WORLD_SIZE set), each
 * running N all-reduces of 1 Mi floats on one communicator.
 *
 * Usage: nccl_dlsym_job LIBNCCL RANKS N
 * Prints "unique id: <hex>".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef uintptr_t stream_t;

int cuInit(unsigned);
int cuStreamCreate(stream_t *, unsigned);
int cuStreamSynchronize(stream_t);

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "no %s: %s\n", name, dlerror());
        exit(3);
    }
    return p;
}

#define CHECK(x)                                                        \
    do {                                                                \
        int rc_ = (x);                                                  \
        if (rc_ != 0) {                                                 \
            fprintf(stderr, "%s failed: %d\n", #x, rc_);                \
            exit(1);                                                    \
        }                                                               \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: nccl_dlsym_job LIBNCCL RANKS N\n");
        return 2;
    }
    alarm(60);
    int nranks = atoi(argv[2]), n = atoi(argv[3]);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 2;
    }
    ncclResult_t (*get_id)(ncclUniqueId *) = sym(h, "ncclGetUniqueId");
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int) = sym(h, "ncclCommInitRank");
    ncclResult_t (*allreduce)(const void *, void *, size_t, int, int, ncclComm_t, stream_t) =
        sym(h, "ncclAllReduce");
    ncclResult_t (*destroy)(ncclComm_t) = sym(h, "ncclCommDestroy");

    ncclUniqueId id;
    CHECK(get_id(&id));
    printf("unique id: ");
    for (int i = 0; i < 128; i++) printf("%02x", (unsigned char)id.internal[i]);
    printf("\n");
    fflush(stdout);
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid > 0) continue;
        char buf[16];
        snprintf(buf, sizeof buf, "%d", r);
        setenv("RANK", buf, 1);
        snprintf(buf, sizeof buf, "%d", nranks);
        setenv("WORLD_SIZE", buf, 1);
        CHECK(cuInit(0));
        stream_t s;
        CHECK(cuStreamCreate(&s, 1));
        ncclComm_t comm;
        CHECK(init(&comm, nranks, id, r));
        for (int i = 0; i < n; i++) CHECK(allreduce(NULL, NULL, 1 << 20, 7 /* float */, 0, comm, s));
        CHECK(cuStreamSynchronize(s));
        CHECK(destroy(comm));
        exit(0);
    }
    int failed = 0;
    for (int r = 0; r < nranks; r++) {
        int st = 0;
        wait(&st);
        failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return failed;
}
