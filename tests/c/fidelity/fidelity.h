/* Shared by the fidelity programs (legal but unusual MPI usage). Each program:
 *  - writes one line per MPI call it makes, "call <comm-name> <op> <bytes>", to
 *    OUT_DIR/rank-<R>.txt (bytes by commscope's rule, docs/trace-format.md), so the test can
 *    check the trace holds exactly those calls;
 *  - prints results on rank 0 only, which must be the same with and without the shim.
 * Usage: <program> OUT_DIR
 */
#ifndef FIDELITY_H
#define FIDELITY_H

#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *fid_out;
static int fid_rank, fid_size;

/* Opens this rank's expectation file; call right after MPI_Init. */
static void fid_open(int argc, char **argv) {
    MPI_Comm_rank(MPI_COMM_WORLD, &fid_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &fid_size);
    if (argc < 2) {
        if (fid_rank == 0) fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.txt", argv[1], fid_rank);
    fid_out = fopen(path, "w");
    if (!fid_out) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

static void expect(const char *comm, const char *op, long bytes) {
    fprintf(fid_out, "call %s %s %ld\n", comm, op, bytes);
}

/* Gathers every rank's checksum to rank 0, which prints them (one gather, expected). */
__attribute__((unused)) static void fid_report(const char *what, double checksum) {
    double *all = malloc(sizeof(double) * fid_size);
    MPI_Gather(&checksum, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    expect("MPI_COMM_WORLD", "gather", 8L * fid_size);
    if (fid_rank == 0) {
        printf("%s:", what);
        for (int i = 0; i < fid_size; i++) printf(" %.6g", all[i]);
        printf("\n");
        fflush(stdout);
    }
    free(all);
}

static void fid_close(void) {
    fclose(fid_out);
}

#define CHECK(x)                                                                      \
    do {                                                                              \
        int rc_ = (x);                                                                \
        if (rc_ != MPI_SUCCESS) {                                                     \
            fprintf(stderr, "rank %d: %s failed: %d\n", fid_rank, #x, rc_);           \
            MPI_Abort(MPI_COMM_WORLD, 3);                                             \
        }                                                                             \
    } while (0)

#endif
