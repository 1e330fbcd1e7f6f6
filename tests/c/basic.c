/* A deterministic MPI program: N all-reduces, one line of output per rank, a chosen exit code.
 * Usage: basic [ITERATIONS [EXIT_CODE]]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long iterations = argc > 1 ? atol(argv[1]) : 10;
    int code = argc > 2 ? atoi(argv[2]) : 0;
    long sum = 0;
    for (long i = 0; i < iterations; i++) {
        long mine = rank + i, total = 0;
        MPI_Allreduce(&mine, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        sum += total;
    }
    printf("rank %d of %d: %ld all-reduces, checksum %ld\n", rank, size, iterations, sum);
    MPI_Finalize();
    return code;
}
