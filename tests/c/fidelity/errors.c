/* MPI_ERRORS_RETURN: calls with an invalid rank, root and datatype return their error to the
 * program (which prints the error classes) and the job goes on. Any number of ranks >= 2. */
#include "fidelity.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    fid_open(argc, argv);
    const char *W = "MPI_COMM_WORLD";
    int n = fid_size, me = fid_rank, cls[3] = {0, 0, 0}, rc;
    CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

    int buf[2] = {me, me};
    rc = MPI_Send(buf, 1, MPI_INT, n, 0, MPI_COMM_WORLD); /* no rank n */
    MPI_Error_class(rc, &cls[0]);
    expect(W, "send", 4);
    rc = MPI_Bcast(buf, 1, MPI_INT, n, MPI_COMM_WORLD); /* no root n */
    MPI_Error_class(rc, &cls[1]);
    expect(W, "broadcast", 4);
    rc = MPI_Allreduce(MPI_IN_PLACE, buf, 1, MPI_DATATYPE_NULL, MPI_SUM, MPI_COMM_WORLD);
    MPI_Error_class(rc, &cls[2]);
    expect(W, "allreduce", 0);

    CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    expect(W, "allreduce", 8);
    if (me == 0) {
        printf("error classes: rank %d (MPI_ERR_RANK %d), root %d (MPI_ERR_ROOT %d), type %d\n",
               cls[0], MPI_ERR_RANK, cls[1], MPI_ERR_ROOT, cls[2]);
        printf("then: %d %d\n", buf[0], buf[1]);
        fflush(stdout);
    }
    fid_close();
    MPI_Finalize();
    return 0;
}
