/* fork() after MPI_Init: the child (which shares the shim's ring mapping) exits through exit(),
 * running atexit handlers, without touching MPI; the parent goes on.
 * Usage: forker  — prints "parent done" per rank.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int x = 1, y = 0;
    for (int i = 0; i < 5; i++) MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    pid_t pid = fork();
    if (pid == 0) {
        usleep(300000); /* long enough for the parent's background thread to flush meanwhile */
        exit(0);
    }
    for (int i = 0; i < 5; i++) MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int status = 0;
    waitpid(pid, &status, 0);
    for (int i = 0; i < 5; i++) MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("parent done, child status %d\n", WEXITSTATUS(status));
    MPI_Finalize();
    return 0;
}
