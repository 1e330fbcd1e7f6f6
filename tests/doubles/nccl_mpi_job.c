/* An MPI job that also uses NCCL, as nccl-tests and many HPC codes do: MPI launches the ranks and
 * carries NCCL's unique id, NCCL does the GPU collectives (here the test doubles of NCCL and the
 * CUDA driver). Every rank: 3 MPI all-reduces, 5 NCCL all-reduces, 1 MPI barrier.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
int ncclGetUniqueId(ncclUniqueId *);
int ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
int ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, uintptr_t);
int ncclCommDestroy(ncclComm_t);
int cuInit(unsigned);
int cuStreamCreate(uintptr_t *, unsigned);
int cuStreamSynchronize(uintptr_t);

#define CHECK(x) do { int r_ = (x); if (r_) { fprintf(stderr, "%s failed: %d\n", #x, r_); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double x[64] = {0};
    for (int i = 0; i < 3; i++) MPI_Allreduce(MPI_IN_PLACE, x, 64, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    ncclUniqueId id;
    if (rank == 0) CHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(cuInit(0));
    uintptr_t s;
    CHECK(cuStreamCreate(&s, 1));
    ncclComm_t comm;
    CHECK(ncclCommInitRank(&comm, size, id, rank));
    for (int i = 0; i < 5; i++) CHECK(ncclAllReduce(NULL, NULL, 1 << 16, 7, 0, comm, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(ncclCommDestroy(comm));
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
