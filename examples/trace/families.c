#include <mpi.h>
#include <stdio.h>
#include <string.h>
/* A call of each family the tracer's clogtrace_ext.h wraps (nonblocking and persistent collectives, persistent
   point-to-point, one-sided, MPI-IO, a communicator's creation), three rounds, and one call it does not wrap
   (a neighbourhood collective, which `paramedic trace` names as untraced). argv[1]: a file for MPI-IO.
   Used by tests/integration/test_trace_bindings.py. */
int main(int argc, char **argv) {
    int rank, size, n = 3;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    double a[4] = {1, 2, 3, 4}, b[4], w[4 * 16];
    MPI_Request r[2], pr[2];
    MPI_Send_init(a, 4, MPI_DOUBLE, right, 5, MPI_COMM_WORLD, &pr[0]);
    MPI_Recv_init(b, 4, MPI_DOUBLE, left, 5, MPI_COMM_WORLD, &pr[1]);
    MPI_Win win;
    MPI_Win_create(w, sizeof w, sizeof(double), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    for (int i = 0; i < n; i++) {
        MPI_Iallreduce(a, b, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r[0]);
        MPI_Ibcast(a, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        MPI_Startall(2, pr);
        MPI_Waitall(2, pr, MPI_STATUSES_IGNORE);
        MPI_Exscan(a, b, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Win_fence(0, win);
        MPI_Put(a, 4, MPI_DOUBLE, right, 4 * rank, 4, MPI_DOUBLE, win);
        MPI_Win_fence(0, win);
        MPI_Win_lock(MPI_LOCK_SHARED, left, 0, win);
        MPI_Get(b, 4, MPI_DOUBLE, left, 0, 4, MPI_DOUBLE, win);
        MPI_Win_unlock(left, win);
    }
    MPI_Win_free(&win);
    MPI_Request never; /* a receive nobody sends to, cancelled: no message event */
    MPI_Irecv(b, 4, MPI_DOUBLE, left, 999, MPI_COMM_WORLD, &never);
    MPI_Cancel(&never);
    MPI_Wait(&never, MPI_STATUS_IGNORE);
    MPI_Request_free(&pr[0]);
    MPI_Request_free(&pr[1]);
    MPI_Comm ring;
    int periodic = 1;
    MPI_Cart_create(MPI_COMM_WORLD, 1, &size, &periodic, 0, &ring);
    MPI_Neighbor_allgather(a, 1, MPI_DOUBLE, w, 1, MPI_DOUBLE, ring);
    MPI_Comm_free(&ring);
    MPI_File fh;
    MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh);
    MPI_File_write_at_all(fh, (MPI_Offset)(rank * sizeof a), a, 4, MPI_DOUBLE, MPI_STATUS_IGNORE);
    MPI_File_read_at(fh, (MPI_Offset)(left * sizeof a), b, 4, MPI_DOUBLE, MPI_STATUS_IGNORE);
    MPI_File_close(&fh);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
