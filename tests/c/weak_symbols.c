/* Tests for optional MPI functions the way mpi4py does: weak references, defined only when the
 * loaded MPI has them. Prints one line per function; the output must be the same with and
 * without the shim (which defines wrappers for all of them).
 */
#include <mpi.h>
#include <stdio.h>

/* Declared under names of their own (the symbol names given by asm labels), so the prototypes
 * never clash with mpi.h's, which only some MPIs have. */
#define WEAK(local, symbol) extern int local(void) __asm__(symbol) __attribute__((weak))
WEAK(bcast_c, "MPI_Bcast_c");
WEAK(allreduce_init, "MPI_Allreduce_init");
WEAK(neighbor_allgather_c, "MPI_Neighbor_allgather_c");
WEAK(mrecv_c, "MPI_Mrecv_c");
WEAK(fortran_allreduce, "mpi_allreduce_");
WEAK(ompi_fortran_allreduce, "ompi_allreduce_f");
WEAK(mpix_allreduce_init, "MPIX_Allreduce_init");
WEAK(nccl_allreduce_config, "ncclAllReduceConfig");

#define SHOW(f, name) printf("%-26s %s\n", name, (void *)&f ? "defined" : "absent")

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        SHOW(bcast_c, "MPI_Bcast_c");
        SHOW(allreduce_init, "MPI_Allreduce_init");
        SHOW(neighbor_allgather_c, "MPI_Neighbor_allgather_c");
        SHOW(mrecv_c, "MPI_Mrecv_c");
        SHOW(fortran_allreduce, "mpi_allreduce_");
        SHOW(ompi_fortran_allreduce, "ompi_allreduce_f");
        SHOW(mpix_allreduce_init, "MPIX_Allreduce_init");
        SHOW(nccl_allreduce_config, "ncclAllReduceConfig");
    }
    MPI_Finalize();
    return 0;
}
