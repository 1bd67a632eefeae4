#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
/* MPI_THREAD_MULTIPLE: two threads per rank exchange messages with the ranks beside them at once (each its
   own tag), the thread that initialised MPI joins them and calls MPI_Barrier. argv[1]: rounds per thread.
   Used by tests/integration/test_trace_bindings.py: each thread's states on its own CLOG2 thread number. */
static int rank, size, rounds;

static void *exchange(void *arg) {
    int tag = (int)(long)arg, right = (rank + 1) % size, left = (rank + size - 1) % size;
    double out[8] = {0}, in[8];
    for (int i = 0; i < rounds; i++) {
        MPI_Request r[2];
        MPI_Irecv(in, 8, MPI_DOUBLE, left, tag, MPI_COMM_WORLD, &r[0]);
        MPI_Isend(out, 8, MPI_DOUBLE, right, tag, MPI_COMM_WORLD, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        MPI_Sendrecv(out, 8, MPI_DOUBLE, right, 100 + tag, in, 8, MPI_DOUBLE, left, 100 + tag, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "no MPI_THREAD_MULTIPLE\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rounds = argc > 1 ? atoi(argv[1]) : 100;
    pthread_t t[2];
    for (long k = 0; k < 2; k++) pthread_create(&t[k], NULL, exchange, (void *)k);
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
