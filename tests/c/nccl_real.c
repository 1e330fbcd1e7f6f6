/* Calls the real NCCL's library-level entry points and one communicator init, printing what it
 * got: run with and without the shim, the two outputs must be identical. Without a GPU the init
 * fails (and the shim must record that failure). The unique id goes to stderr (it differs per
 * run) so the test can compute the communicator's commHash.
 *
 * Built as a program, or with -DNCCL_REAL_LIBRARY as a shared library exporting
 * `nccl_real_run()`, which Python loads with ctypes (RTLD_LOCAL): then libnccl.so.2 is a private
 * dependency, outside the global scope, as in a framework's extension module.
 */
#include <stdio.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
int ncclGetVersion(int *);
int ncclGetUniqueId(ncclUniqueId *);
const char *ncclGetErrorString(int);
const char *ncclGetLastError(ncclComm_t);
int ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);

int nccl_real_run(void) {
    int v = 0;
    int rc = ncclGetVersion(&v);
    printf("ncclGetVersion: rc=%d version=%d\n", rc, v);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    rc = ncclGetUniqueId(&id);
    int nonzero = 0;
    for (int i = 0; i < 128; i++) nonzero |= id.internal[i] != 0;
    printf("ncclGetUniqueId: rc=%d filled=%d\n", rc, nonzero);
    fprintf(stderr, "unique id: ");
    for (int i = 0; i < 128; i++) fprintf(stderr, "%02x", (unsigned char)id.internal[i]);
    fprintf(stderr, "\n");
    for (int e = 0; e <= 9; e++) printf("ncclGetErrorString(%d): %s\n", e, ncclGetErrorString(e));
    printf("ncclGetLastError: '%s'\n", ncclGetLastError(NULL));
    ncclComm_t comm = NULL;
    rc = ncclCommInitRank(&comm, 1, id, 0);
    printf("ncclCommInitRank: rc=%d comm=%s\n", rc, comm ? "set" : "null");
    printf("ncclGetLastError: '%s'\n", ncclGetLastError(NULL));
    fflush(stdout);
    return 0;
}

#ifndef NCCL_REAL_LIBRARY
int main(void) { return nccl_real_run(); }
#endif
