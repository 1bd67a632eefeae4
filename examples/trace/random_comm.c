/* An aperiodic MPI program for `paramedic trace` (bench/traces.py, the trace tests): each step, every rank
   draws a random peer, tag and size (from a seed all ranks share, so sends and receives match), and now
   and then a collective. Usage: mpiexec -n N random_comm STEPS SEED */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned long long state;
static unsigned next(void) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)(state >> 33);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int steps = argc > 1 ? atoi(argv[1]) : 1000;
    state = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    static char sendbuf[1 << 16], recvbuf[1 << 16];
    double sum = 0;
    for (int s = 0; s < steps; s++) {
        /* a random permutation shift: rank r sends to (r + k) % size, receives from (r - k) % size */
        int k = 1 + (int)(next() % (unsigned)(size > 1 ? size - 1 : 1));
        int tag = (int)(next() % 100);
        int bytes = 1 + (int)(next() % (1 << 16));
        int kind = (int)(next() % 10);
        if (kind == 0) {
            MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        } else if (kind == 1) {
            MPI_Bcast(sendbuf, bytes, MPI_BYTE, (int)(next() % (unsigned)size), MPI_COMM_WORLD);
        } else if (kind < 5) {
            MPI_Sendrecv(sendbuf, bytes, MPI_BYTE, (rank + k) % size, tag, recvbuf, sizeof recvbuf, MPI_BYTE,
                         (rank - k + size) % size, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Request reqs[2];
            MPI_Irecv(recvbuf, sizeof recvbuf, MPI_BYTE, (rank - k + size) % size, tag, MPI_COMM_WORLD, &reqs[0]);
            MPI_Isend(sendbuf, bytes, MPI_BYTE, (rank + k) % size, tag, MPI_COMM_WORLD, &reqs[1]);
            MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
        }
        for (int i = 0; i < (int)(next() % 2000); i++) sum += i * 1e-9;
    }
    if (rank == 0) printf("%d steps, %g\n", steps, sum);
    MPI_Finalize();
    return 0;
}
