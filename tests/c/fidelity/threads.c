/* MPI_THREAD_MULTIPLE: four threads, each with its own duplicate of MPI_COMM_WORLD, issue
 * all-reduces concurrently. Any number of ranks >= 2. */
#include <pthread.h>

#include "fidelity.h"

#define THREADS 4
#define ITERS 50

static MPI_Comm comms[THREADS];
static double results[THREADS];

static void *worker(void *arg) {
    int t = (int)(long)arg;
    double acc = 0;
    for (int i = 0; i < ITERS; i++) {
        double x = fid_rank + t + i, y = 0;
        if (MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, comms[t]) != MPI_SUCCESS) abort();
        acc += y;
    }
    results[t] = acc;
    return NULL;
}

int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    fid_open(argc, argv);
    if (provided != MPI_THREAD_MULTIPLE) {
        if (fid_rank == 0) printf("MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
        MPI_Abort(MPI_COMM_WORLD, 4);
    }
    for (int t = 0; t < THREADS; t++) {
        char name[16];
        CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comms[t]));
        snprintf(name, sizeof name, "thread-%d", t);
        MPI_Comm_set_name(comms[t], name);
    }
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)(long)t);
    double sum = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        sum += results[t];
        char name[16];
        snprintf(name, sizeof name, "thread-%d", t);
        for (int i = 0; i < ITERS; i++) expect(name, "allreduce", 8);
        MPI_Comm_free(&comms[t]);
    }
    fid_report("thread sums", sum);
    fid_close();
    MPI_Finalize();
    return 0;
}
