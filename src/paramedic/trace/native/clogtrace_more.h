/* More of MPI's point-to-point and collective calls: the completion functions a program may complete its
   MPI_Irecv requests with (without them its receives' message events were missing and their requests
   stayed in the table), the v-collectives, MPI_Sendrecv_replace, and the probes, matched probes included
   (mpi4py's `recv` is MPI_Mprobe + MPI_Mrecv). Included at the end of clogtrace.c. */

/* Requests completed by an array call: `copy` is the array before the call (MPI sets completed ones to
   MPI_REQUEST_NULL), `done` the indices completed, `sts` their statuses (NULL: MPI_STATUSES_IGNORE). */
static void completed_some(const MPI_Request *copy, const int *done, int n_done, MPI_Status *sts) {
    for (int k = 0; k < n_done; k++) {
        MPI_Status *st = sts ? &sts[k] : NULL;
        if (st != NULL) completed(copy[done[k]], st);
    }
}

/* A copy of `n` requests (on the stack when few), NULL when out of memory (then nothing is logged). */
#define COPY_REQUESTS(n, r)                                                                             \
    MPI_Request small_req[64];                                                                          \
    MPI_Request *copy = (n) <= 64 ? small_req : malloc(sizeof(MPI_Request) * (size_t)((n) > 0 ? (n) : 1)); \
    if (copy && (n) > 0) memcpy(copy, r, sizeof(MPI_Request) * (size_t)(n))
#define FREE_REQUESTS() if (copy != small_req) free(copy)

int MPI_Testall(int n, MPI_Request *r, int *flag, MPI_Status *st) {
    START(S_Testall);
    COPY_REQUESTS(n, r);
    MPI_Status small_st[64];
    MPI_Status *sts = st;
    if (st == MPI_STATUSES_IGNORE) sts = n <= 64 ? small_st : malloc(sizeof(MPI_Status) * (size_t)(n > 0 ? n : 1));
    int rc = PMPI_Testall(n, r, flag, sts ? sts : st);
    if (_logging && rc == MPI_SUCCESS && *flag && copy && sts)
        for (int i = 0; i < n; i++) completed(copy[i], &sts[i]);
    FREE_REQUESTS();
    if (sts != st && sts != small_st) free(sts);
    FINAL();
    return rc;
}

int MPI_Testany(int n, MPI_Request *r, int *index, int *flag, MPI_Status *st) {
    START(S_Testany);
    COPY_REQUESTS(n, r);
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    int rc = PMPI_Testany(n, r, index, flag, st);
    if (_logging && rc == MPI_SUCCESS && *flag && copy && *index != MPI_UNDEFINED) completed(copy[*index], st);
    FREE_REQUESTS();
    FINAL();
    return rc;
}

#define SOME(NAME)                                                                                          \
    int MPI_##NAME(int n, MPI_Request *r, int *outcount, int *indices, MPI_Status *st) {                    \
        START(S_##NAME);                                                                                    \
        COPY_REQUESTS(n, r);                                                                                \
        MPI_Status small_st[64];                                                                            \
        MPI_Status *sts = st;                                                                               \
        if (st == MPI_STATUSES_IGNORE)                                                                      \
            sts = n <= 64 ? small_st : malloc(sizeof(MPI_Status) * (size_t)(n > 0 ? n : 1));                \
        int rc = PMPI_##NAME(n, r, outcount, indices, sts ? sts : st);                                      \
        if (_logging && rc == MPI_SUCCESS && copy && sts && *outcount != MPI_UNDEFINED)                     \
            completed_some(copy, indices, *outcount, sts);                                                  \
        FREE_REQUESTS();                                                                                    \
        if (sts != st && sts != small_st) free(sts);                                                        \
        FINAL();                                                                                            \
        return rc;                                                                                          \
    }
SOME(Testsome)
SOME(Waitsome)

int MPI_Sendrecv_replace(void *b, int c, MPI_Datatype t, int dest, int stag, int src, int rtag, MPI_Comm comm,
                         MPI_Status *st) {
    START(S_Sendrecv_replace);
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    if (_logging && dest >= 0) msg(EVT_SEND, world_of(comm, dest), stag, bytes_of(c, t));
    int rc = PMPI_Sendrecv_replace(b, c, t, dest, stag, src, rtag, comm, st);
    if (_logging && rc == MPI_SUCCESS && st->MPI_SOURCE >= 0) {
        int cnt = 0;
        PMPI_Get_count(st, MPI_BYTE, &cnt);
        msg(EVT_RECV, world_of(comm, st->MPI_SOURCE), st->MPI_TAG, cnt);
    }
    FINAL();
    return rc;
}

int MPI_Gatherv(const void *sb, int sc, MPI_Datatype st, void *rb, const int *rcs, const int *dis, MPI_Datatype rt,
                int root, MPI_Comm comm) {
    START(S_Gatherv);
    if (_logging) coll(2 * S_Gatherv, world_of(comm, root), bytes_of(sc, st));
    int rc = PMPI_Gatherv(sb, sc, st, rb, rcs, dis, rt, root, comm);
    FINAL();
    return rc;
}

int MPI_Scatterv(const void *sb, const int *scs, const int *dis, MPI_Datatype st, void *rb, int rc_,
                 MPI_Datatype rt, int root, MPI_Comm comm) {
    START(S_Scatterv);
    if (_logging) coll(2 * S_Scatterv, world_of(comm, root), bytes_of(rc_, rt));
    int rc = PMPI_Scatterv(sb, scs, dis, st, rb, rc_, rt, root, comm);
    FINAL();
    return rc;
}

int MPI_Alltoallv(const void *sb, const int *scs, const int *sds, MPI_Datatype st, void *rb, const int *rcs,
                  const int *rds, MPI_Datatype rt, MPI_Comm comm) {
    START(S_Alltoallv);
    int size = 0;
    int64_t total = 0;
    if (_logging && PMPI_Comm_size(comm, &size) == MPI_SUCCESS && scs)
        for (int i = 0; i < size; i++) total += bytes_of(scs[i], st);
    if (_logging) coll(2 * S_Alltoallv, -1, total);
    int rc = PMPI_Alltoallv(sb, scs, sds, st, rb, rcs, rds, rt, comm);
    FINAL();
    return rc;
}

int MPI_Reduce_scatter(const void *sb, void *rb, const int *rcs, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    START(S_Reduce_scatter);
    int size = 0;
    int64_t total = 0;
    if (_logging && PMPI_Comm_size(comm, &size) == MPI_SUCCESS && rcs)
        for (int i = 0; i < size; i++) total += bytes_of(rcs[i], t);
    if (_logging) coll(2 * S_Reduce_scatter, -1, total);
    int rc = PMPI_Reduce_scatter(sb, rb, rcs, t, op, comm);
    FINAL();
    return rc;
}

int MPI_Probe(int src, int tag, MPI_Comm comm, MPI_Status *st) {
    START(S_Probe);
    int rc = PMPI_Probe(src, tag, comm, st);
    FINAL();
    return rc;
}

int MPI_Iprobe(int src, int tag, MPI_Comm comm, int *flag, MPI_Status *st) {
    START(S_Iprobe);
    int rc = PMPI_Iprobe(src, tag, comm, flag, st);
    FINAL();
    return rc;
}

/* Matched messages (MPI_Message) -> the communicator they were probed on, for MPI_Mrecv's peer. */
#define NMSGS 256
static struct { MPI_Message m; MPI_Comm comm; int used; } probed[NMSGS];

static void remember_message(MPI_Message m, MPI_Comm comm) {
    if (m == MPI_MESSAGE_NULL || m == MPI_MESSAGE_NO_PROC) return;
    LOCK();
    int i = 0;
    while (i < NMSGS && probed[i].used) i++;
    if (i < NMSGS) {
        probed[i].m = m;
        probed[i].comm = comm;
        probed[i].used = 1;
    } else {
        n_dropped++;
    }
    UNLOCK();
}

static int message_comm(MPI_Message m, MPI_Comm *comm) {
    int found = 0;
    LOCK();
    for (int i = 0; i < NMSGS && !found; i++)
        if (probed[i].used && probed[i].m == m) {
            probed[i].used = 0;
            *comm = probed[i].comm;
            found = 1;
        }
    UNLOCK();
    return found;
}

int MPI_Mprobe(int src, int tag, MPI_Comm comm, MPI_Message *m, MPI_Status *st) {
    START(S_Mprobe);
    int rc = PMPI_Mprobe(src, tag, comm, m, st);
    if (_logging && rc == MPI_SUCCESS) remember_message(*m, comm);
    FINAL();
    return rc;
}

int MPI_Improbe(int src, int tag, MPI_Comm comm, int *flag, MPI_Message *m, MPI_Status *st) {
    START(S_Improbe);
    int rc = PMPI_Improbe(src, tag, comm, flag, m, st);
    if (_logging && rc == MPI_SUCCESS && *flag) remember_message(*m, comm);
    FINAL();
    return rc;
}

int MPI_Mrecv(void *b, int c, MPI_Datatype t, MPI_Message *m, MPI_Status *st) {
    START(S_Mrecv);
    MPI_Status own;
    MPI_Comm comm = MPI_COMM_WORLD;
    int known = _logging && message_comm(*m, &comm);
    if (st == MPI_STATUS_IGNORE) st = &own;
    int rc = PMPI_Mrecv(b, c, t, m, st);
    if (known && rc == MPI_SUCCESS && st->MPI_SOURCE >= 0) {
        int cnt = 0;
        PMPI_Get_count(st, MPI_BYTE, &cnt);
        msg(EVT_RECV, world_of(comm, st->MPI_SOURCE), st->MPI_TAG, cnt);
    }
    FINAL();
    return rc;
}

#if MPI_VERSION >= 4
int MPI_Mrecv_c(void *b, MPI_Count c, MPI_Datatype t, MPI_Message *m, MPI_Status *st) {
    START(S_Mrecv);
    MPI_Status own;
    MPI_Comm comm = MPI_COMM_WORLD;
    int known = _logging && message_comm(*m, &comm);
    if (st == MPI_STATUS_IGNORE) st = &own;
    int rc = PMPI_Mrecv_c(b, c, t, m, st);
    if (known && rc == MPI_SUCCESS && st->MPI_SOURCE >= 0) {
        int cnt = 0;
        PMPI_Get_count(st, MPI_BYTE, &cnt);
        msg(EVT_RECV, world_of(comm, st->MPI_SOURCE), st->MPI_TAG, cnt);
    }
    FINAL();
    return rc;
}

int MPI_Sendrecv_replace_c(void *b, MPI_Count c, MPI_Datatype t, int dest, int stag, int src, int rtag,
                           MPI_Comm comm, MPI_Status *st) {
    START(S_Sendrecv_replace);
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    if (_logging && dest >= 0) msg(EVT_SEND, world_of(comm, dest), stag, bytes_of_c(c, t));
    int rc = PMPI_Sendrecv_replace_c(b, c, t, dest, stag, src, rtag, comm, st);
    if (_logging) received(rc, st, comm);
    FINAL();
    return rc;
}

int MPI_Gatherv_c(const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, const MPI_Count *rcs, const MPI_Aint *dis,
                  MPI_Datatype rt, int root, MPI_Comm comm) {
    START(S_Gatherv);
    if (_logging) coll(2 * S_Gatherv, world_of(comm, root), bytes_of_c(sc, st));
    int rc = PMPI_Gatherv_c(sb, sc, st, rb, rcs, dis, rt, root, comm);
    FINAL();
    return rc;
}

int MPI_Scatterv_c(const void *sb, const MPI_Count *scs, const MPI_Aint *dis, MPI_Datatype st, void *rb,
                   MPI_Count rc_, MPI_Datatype rt, int root, MPI_Comm comm) {
    START(S_Scatterv);
    if (_logging) coll(2 * S_Scatterv, world_of(comm, root), bytes_of_c(rc_, rt));
    int rc = PMPI_Scatterv_c(sb, scs, dis, st, rb, rc_, rt, root, comm);
    FINAL();
    return rc;
}

int MPI_Alltoallv_c(const void *sb, const MPI_Count *scs, const MPI_Aint *sds, MPI_Datatype st, void *rb,
                    const MPI_Count *rcs, const MPI_Aint *rds, MPI_Datatype rt, MPI_Comm comm) {
    START(S_Alltoallv);
    int size = 0;
    int64_t total = 0;
    if (_logging && PMPI_Comm_size(comm, &size) == MPI_SUCCESS && scs)
        for (int i = 0; i < size; i++) total += bytes_of_c(scs[i], st);
    if (_logging) coll(2 * S_Alltoallv, -1, total);
    int rc = PMPI_Alltoallv_c(sb, scs, sds, st, rb, rcs, rds, rt, comm);
    FINAL();
    return rc;
}

int MPI_Reduce_scatter_c(const void *sb, void *rb, const MPI_Count *rcs, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    START(S_Reduce_scatter);
    int size = 0;
    int64_t total = 0;
    if (_logging && PMPI_Comm_size(comm, &size) == MPI_SUCCESS && rcs)
        for (int i = 0; i < size; i++) total += bytes_of_c(rcs[i], t);
    if (_logging) coll(2 * S_Reduce_scatter, -1, total);
    int rc = PMPI_Reduce_scatter_c(sb, rb, rcs, t, op, comm);
    FINAL();
    return rc;
}
#endif
