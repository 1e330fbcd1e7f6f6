/* A call to a function no loaded library defines. Built twice: with -DLIBRARY as a library whose
 * `call()` calls ncclGetUniqueId (left undefined), and as a program that opens that library
 * lazily and calls it. Without commscope the dynamic loader stops the program at the call
 * ("symbol lookup error", exit status 127); under the shim, whose wrapper then cannot find the
 * real function, the program must end the same way.
 * Usage: undefined_call LIBRARY
 */
#ifdef LIBRARY
typedef struct { char internal[128]; } ncclUniqueId;
int ncclGetUniqueId(ncclUniqueId *);
int call(void) {
    ncclUniqueId id;
    return ncclGetUniqueId(&id);
}
#else
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    int (*call)(void) = (int (*)(void))dlsym(h, "call");
    printf("calling\n");
    fflush(stdout);
    return call() == 0 ? 0 : 3;
}
#endif
