/* A program that polls, as hpcc's RandomAccess does: each round, rank 0 posts a receive and tests it
   (MPI_Test, then MPI_Testany) until the message comes, while the other ranks compute for `spin_us`
   microseconds, probe for a go-ahead with MPI_Iprobe, and send. Nearly every call is a failed poll with
   the same arguments. At the end each rank prints its peak resident memory (VmHWM, from /proc).

   mpicc -O2 -o poll poll.c && mpiexec -n 2 ./poll ROUNDS SPIN_US */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long peak_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    double spin = (argc > 2 ? atof(argv[2]) : 1000.0) / 1e6;
    long polls = 0;
    int value = 0;
    for (int r = 0; r < rounds; r++) {
        if (rank == 0) {
            for (int peer = 1; peer < size; peer++) {
                MPI_Request req;
                int flag = 0, index;
                MPI_Irecv(&value, 1, MPI_INT, peer, r, MPI_COMM_WORLD, &req);
                MPI_Send(&r, 1, MPI_INT, peer, 1000000 + r, MPI_COMM_WORLD); /* go ahead */
                while (!flag) {
                    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
                    polls++;
                    if (!flag) {
                        MPI_Testany(1, &req, &index, &flag, MPI_STATUS_IGNORE);
                        polls++;
                    }
                }
            }
        } else {
            int flag = 0, go;
            while (!flag) {
                MPI_Iprobe(0, 1000000 + r, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
                polls++;
            }
            MPI_Recv(&go, 1, MPI_INT, 0, 1000000 + r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            double until = now() + spin;
            while (now() < until) {
            }
            value = rank + r;
            MPI_Send(&value, 1, MPI_INT, 0, r, MPI_COMM_WORLD);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d polls %ld vmhwm_kb %ld\n", rank, polls, peak_kb());
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
