/* MPI-4's large-count functions (MPI_Send_c, ...: counts as MPI_Count), logged as the same states as their
   int-count twins. An MPI that has them lets a program call them instead (mpi4py 4 does, for every
   buffer-based call, through weak symbols): without these wrappers its messages and collectives were
   missing from the trace without a word. Included at the end of clogtrace.c; empty before MPI 4. */
#if MPI_VERSION >= 4

static int64_t bytes_of_c(MPI_Count count, MPI_Datatype type) {
    int size = 0;
    if (type == MPI_DATATYPE_NULL || PMPI_Type_size(type, &size) != MPI_SUCCESS) return 0;
    return (int64_t)count * size;
}

#define SEND_LIKE_C(NAME)                                                                               \
    int MPI_##NAME##_c(const void *b, MPI_Count c, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {   \
        START(S_##NAME);                                                                                \
        if (_logging && dest >= 0) msg(EVT_SEND, world_of(comm, dest), tag, bytes_of_c(c, t));            \
        int rc = PMPI_##NAME##_c(b, c, t, dest, tag, comm);                                             \
        FINAL();                                                                                        \
        return rc;                                                                                      \
    }
SEND_LIKE_C(Send)
SEND_LIKE_C(Ssend)
SEND_LIKE_C(Rsend)
SEND_LIKE_C(Bsend)

#define ISEND_LIKE_C(NAME)                                                                              \
    int MPI_##NAME##_c(const void *b, MPI_Count c, MPI_Datatype t, int dest, int tag, MPI_Comm comm,      \
                       MPI_Request *r) {                                                                \
        START(S_##NAME);                                                                                \
        if (_logging && dest >= 0) msg(EVT_SEND, world_of(comm, dest), tag, bytes_of_c(c, t));            \
        int rc = PMPI_##NAME##_c(b, c, t, dest, tag, comm, r);                                          \
        FINAL();                                                                                        \
        return rc;                                                                                      \
    }
ISEND_LIKE_C(Isend)
ISEND_LIKE_C(Issend)

static void received(int rc, MPI_Status *st, MPI_Comm comm) {
    if (rc != MPI_SUCCESS || st->MPI_SOURCE < 0) return;
    int cnt = 0;
    PMPI_Get_count(st, MPI_BYTE, &cnt);
    msg(EVT_RECV, world_of(comm, st->MPI_SOURCE), st->MPI_TAG, cnt);
}

int MPI_Recv_c(void *b, MPI_Count c, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    START(S_Recv);
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    int rc = PMPI_Recv_c(b, c, t, src, tag, comm, st);
    if (_logging) received(rc, st, comm);
    FINAL();
    return rc;
}

int MPI_Irecv_c(void *b, MPI_Count c, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Request *r) {
    START(S_Irecv);
    int rc = PMPI_Irecv_c(b, c, t, src, tag, comm, r);
    if (_logging && rc == MPI_SUCCESS) remember(*r, comm);
    FINAL();
    return rc;
}

int MPI_Sendrecv_c(const void *sb, MPI_Count sc, MPI_Datatype st_, int dest, int stag, void *rb, MPI_Count rc_,
                   MPI_Datatype rt, int src, int rtag, MPI_Comm comm, MPI_Status *st) {
    START(S_Sendrecv);
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    if (_logging && dest >= 0) msg(EVT_SEND, world_of(comm, dest), stag, bytes_of_c(sc, st_));
    int rc = PMPI_Sendrecv_c(sb, sc, st_, dest, stag, rb, rc_, rt, src, rtag, comm, st);
    if (_logging) received(rc, st, comm);
    FINAL();
    return rc;
}

int MPI_Bcast_c(void *b, MPI_Count c, MPI_Datatype t, int root, MPI_Comm comm) {
    START(S_Bcast);
    if (_logging) coll(2 * S_Bcast, world_of(comm, root), bytes_of_c(c, t));
    int rc = PMPI_Bcast_c(b, c, t, root, comm);
    FINAL();
    return rc;
}

int MPI_Reduce_c(const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm) {
    START(S_Reduce);
    if (_logging) coll(2 * S_Reduce, world_of(comm, root), bytes_of_c(c, t));
    int rc = PMPI_Reduce_c(sb, rb, c, t, op, root, comm);
    FINAL();
    return rc;
}

#define REDUCE_ALL_C(NAME)                                                                                 \
    int MPI_##NAME##_c(const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, MPI_Comm comm) { \
        START(S_##NAME);                                                                                   \
        if (_logging) coll(2 * S_##NAME, -1, bytes_of_c(c, t));                                            \
        int rc = PMPI_##NAME##_c(sb, rb, c, t, op, comm);                                                  \
        FINAL();                                                                                           \
        return rc;                                                                                         \
    }
REDUCE_ALL_C(Allreduce)
REDUCE_ALL_C(Scan)

#define GATHER_ALL_C(NAME)                                                                                 \
    int MPI_##NAME##_c(const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_,             \
                       MPI_Datatype rt, MPI_Comm comm) {                                                   \
        START(S_##NAME);                                                                                   \
        if (_logging) coll(2 * S_##NAME, -1, bytes_of_c(sc, st));                                          \
        int rc = PMPI_##NAME##_c(sb, sc, st, rb, rc_, rt, comm);                                           \
        FINAL();                                                                                           \
        return rc;                                                                                         \
    }
GATHER_ALL_C(Allgather)
GATHER_ALL_C(Alltoall)

int MPI_Allgatherv_c(const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, const MPI_Count *rcs,
                     const MPI_Aint *dis, MPI_Datatype rt, MPI_Comm comm) {
    START(S_Allgatherv);
    if (_logging) coll(2 * S_Allgatherv, -1, bytes_of_c(sc, st));
    int rc = PMPI_Allgatherv_c(sb, sc, st, rb, rcs, dis, rt, comm);
    FINAL();
    return rc;
}

int MPI_Gather_c(const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_, MPI_Datatype rt, int root,
                 MPI_Comm comm) {
    START(S_Gather);
    if (_logging) coll(2 * S_Gather, world_of(comm, root), bytes_of_c(sc, st));
    int rc = PMPI_Gather_c(sb, sc, st, rb, rc_, rt, root, comm);
    FINAL();
    return rc;
}

int MPI_Scatter_c(const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_, MPI_Datatype rt, int root,
                  MPI_Comm comm) {
    START(S_Scatter);
    if (_logging) coll(2 * S_Scatter, world_of(comm, root), bytes_of_c(rc_, rt));
    int rc = PMPI_Scatter_c(sb, sc, st, rb, rc_, rt, root, comm);
    FINAL();
    return rc;
}

#endif
