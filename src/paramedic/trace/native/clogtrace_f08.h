/* `use mpi_f08`: the Fortran 2008 bindings of the common calls, as aliases of the mpif.h wrappers
   (clogtrace_fortran.h, clogtrace_fortran_more.h). An f08 handle is a TYPE holding one INTEGER, passed by
   reference as an INTEGER is; an f08 status has the layout of mpif.h's INTEGER status (Open MPI: the same
   six INTEGERs; MPICH: the C struct either way), and its MPI_STATUS_IGNORE is recognised
   (F08_STATUS_IGNORE); ierror is OPTIONAL (NULL when left out, as FOK allows). So each alias names the MPI's
   f08 function for the wrapper to call (its profiling entry pmpi_*_f08_, Open MPI; else the MPI's own
   mpi_*_f08_ through RTLD_NEXT, MPICH's non-buffer calls, which call PMPI_*) and calls the mpif.h wrapper,
   which logs the call. MPICH's f08 calls with a buffer are other functions (mpi_send_f08ts_) that call
   the C MPI_* ones, logged by the C wrappers. Included at the end of clogtrace.c, after the Fortran
   wrappers. */

typedef void *A; /* an argument passed on */

#define F08_ALIAS(lower, PARAMS, ARGS)                                                            \
    void mpi_##lower##_f08_ PARAMS {                                                              \
        static void *slot;                                                                        \
        f08_target = f08_real("pmpi_" #lower "_f08_", "mpi_" #lower "_f08_", &slot);                \
        mpi_##lower##_ ARGS;                                                                      \
    }
#define F08_1(l) F08_ALIAS(l, (A a), (a))
#define F08_2(l) F08_ALIAS(l, (A a, A b), (a, b))
#define F08_3(l) F08_ALIAS(l, (A a, A b, A c), (a, b, c))
#define F08_4(l) F08_ALIAS(l, (A a, A b, A c, A d), (a, b, c, d))
#define F08_5(l) F08_ALIAS(l, (A a, A b, A c, A d, A e), (a, b, c, d, e))
#define F08_6(l) F08_ALIAS(l, (A a, A b, A c, A d, A e, A f), (a, b, c, d, e, f))
#define F08_7(l) F08_ALIAS(l, (A a, A b, A c, A d, A e, A f, A g), (a, b, c, d, e, f, g))
#define F08_8(l) F08_ALIAS(l, (A a, A b, A c, A d, A e, A f, A g, A h), (a, b, c, d, e, f, g, h))
#define F08_9(l) F08_ALIAS(l, (A a, A b, A c, A d, A e, A f, A g, A h, A i), (a, b, c, d, e, f, g, h, i))
#define F08_10(l) F08_ALIAS(l, (A a, A b, A c, A d, A e, A f, A g, A h, A i, A j), (a, b, c, d, e, f, g, h, i, j))
#define F08_13(l) \
    F08_ALIAS(l, (A a, A b, A c, A d, A e, A f, A g, A h, A i, A j, A k, A m, A n), (a, b, c, d, e, f, g, h, i, j, k, m, n))

/* point to point */
F08_7(send)
F08_7(ssend)
F08_7(rsend)
F08_7(bsend)
F08_8(isend)
F08_8(issend)
F08_8(recv)
F08_8(irecv)
F08_13(sendrecv)
F08_10(sendrecv_replace)
F08_5(probe)
F08_6(iprobe)
/* completion */
F08_3(wait)
F08_4(test)
F08_4(waitall)
F08_5(waitany)
F08_5(testall)
F08_6(testany)
F08_6(waitsome)
F08_6(testsome)
/* collectives */
F08_2(barrier)
F08_6(bcast)
F08_8(reduce)
F08_7(allreduce)
F08_7(scan)
F08_7(exscan)
F08_8(allgather)
F08_8(alltoall)
F08_9(allgatherv)
F08_9(gather)
F08_9(scatter)
F08_10(gatherv)
F08_10(scatterv)
F08_10(alltoallv)
F08_7(reduce_scatter)
F08_3(ibarrier)
F08_7(ibcast)
F08_8(iallreduce)
/* persistent requests */
F08_8(send_init)
F08_8(recv_init)
F08_2(start)
F08_3(startall)
F08_2(request_free)
/* communicators */
F08_2(comm_free)
F08_3(comm_dup)
F08_5(comm_split)
F08_7(cart_create)
