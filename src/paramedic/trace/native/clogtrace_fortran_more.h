/* More Fortran bindings (`use mpi`, mpif.h), as clogtrace_fortran.h's: the v-collectives, the probes,
   MPI_Sendrecv_replace, the nonblocking and remaining blocking collectives, persistent requests, one-sided
   communication and MPI-IO (Open MPI's Fortran functions call PMPI_* directly: without these their calls
   were absent from a Fortran program's trace). A call that logs no message or collective event passes its
   arguments through untouched (F_PLAIN: every Fortran argument is a pointer; a CHARACTER argument's
   hidden length comes last). What is still not wrapped is listed by clogtrace_gaps.h.
   Included at the end of clogtrace.c, after clogtrace_fortran.h and clogtrace_ext.h. */

static int64_t f_bytes_of_counts(const F *counts, F *t, F *comm) {
    MPI_Comm c = PMPI_Comm_f2c(*comm);
    MPI_Datatype type = PMPI_Type_f2c(*t);
    int size = 0;
    int64_t total = 0;
    if (counts == NULL || PMPI_Comm_size(c, &size) != MPI_SUCCESS) return 0;
    for (int i = 0; i < size; i++) total += bytes_of(counts[i], type);
    return total;
}

#define F_ROOT(root, comm) world_of(PMPI_Comm_f2c(*(comm)), *(root))
#define F_BYTES(c, t) bytes_of(*(c), PMPI_Type_f2c(*(t)))

/* A Fortran collective: a state and a collective event, arguments passed through. */
#define F_COLL(lower, state, PARAMS, ARGS, ROOT, BYTES) \
    void mpi_##lower##_ PARAMS {                        \
        REAL(pmpi_##lower##_, PARAMS);                  \
        START(state);                                   \
        if (_logging) coll(2 * state, (ROOT), (BYTES)); \
        CALL(real ARGS);                                \
        FINAL();                                        \
    }

/* A Fortran call logged as a state only. */
#define F_PLAIN(lower, state, PARAMS, ARGS) \
    void mpi_##lower##_ PARAMS {            \
        REAL(pmpi_##lower##_, PARAMS);      \
        START(state);                       \
        CALL(real ARGS);                    \
        FINAL();                            \
    }

typedef void *P; /* an argument passed through */

F_COLL(gatherv, S_Gatherv, (void *sb, F *sc, F *st, void *rb, P rcs, P dis, P rt, F *root, F *comm, P ierr),
       (sb, sc, st, rb, rcs, dis, rt, root, comm, ierr), F_ROOT(root, comm), F_BYTES(sc, st))
F_COLL(scatterv, S_Scatterv, (void *sb, P scs, P dis, P st, void *rb, F *rc, F *rt, F *root, F *comm, P ierr),
       (sb, scs, dis, st, rb, rc, rt, root, comm, ierr), F_ROOT(root, comm), F_BYTES(rc, rt))
F_COLL(alltoallv, S_Alltoallv, (void *sb, F *scs, P sds, F *st, void *rb, P rcs, P rds, P rt, F *comm, P ierr),
       (sb, scs, sds, st, rb, rcs, rds, rt, comm, ierr), -1, _logging ? f_bytes_of_counts(scs, st, comm) : 0)
F_COLL(reduce_scatter, S_Reduce_scatter, (void *sb, void *rb, F *rcs, F *t, P op, F *comm, P ierr), (sb, rb, rcs, t, op, comm, ierr),
       -1, _logging ? f_bytes_of_counts(rcs, t, comm) : 0)
F_COLL(reduce_scatter_block, S_Reduce_scatter_block, (void *sb, void *rb, F *c, F *t, P op, P comm, P ierr), (sb, rb, c, t, op, comm, ierr),
       -1, F_BYTES(c, t))
F_COLL(exscan, S_Exscan, (void *sb, void *rb, F *c, F *t, P op, P comm, P ierr), (sb, rb, c, t, op, comm, ierr), -1,
       F_BYTES(c, t))
F_COLL(ibarrier, S_Ibarrier, (P comm, P req, P ierr), (comm, req, ierr), -1, 0)
F_COLL(ibcast, S_Ibcast, (void *b, F *c, F *t, F *root, F *comm, P req, P ierr), (b, c, t, root, comm, req, ierr),
       F_ROOT(root, comm), F_BYTES(c, t))
F_COLL(iallreduce, S_Iallreduce, (void *sb, void *rb, F *c, F *t, P op, P comm, P req, P ierr), (sb, rb, c, t, op, comm, req, ierr),
       -1, F_BYTES(c, t))
F_COLL(ireduce, S_Ireduce, (void *sb, void *rb, F *c, F *t, P op, F *root, F *comm, P req, P ierr),
       (sb, rb, c, t, op, root, comm, req, ierr), F_ROOT(root, comm), F_BYTES(c, t))
F_COLL(iallgather, S_Iallgather, (void *sb, F *sc, F *st, void *rb, P rc, P rt, P comm, P req, P ierr),
       (sb, sc, st, rb, rc, rt, comm, req, ierr), -1, F_BYTES(sc, st))
F_COLL(ialltoall, S_Ialltoall, (void *sb, F *sc, F *st, void *rb, P rc, P rt, P comm, P req, P ierr),
       (sb, sc, st, rb, rc, rt, comm, req, ierr), -1, F_BYTES(sc, st))

void mpi_sendrecv_replace_(void *b, F *c, F *t, F *dest, F *stag, F *src, F *rtag, F *comm, F *status, F *ierr) {
    REAL(pmpi_sendrecv_replace_, (void *, F *, F *, F *, F *, F *, F *, F *, F *, F *));
    START(S_Sendrecv_replace);
    F own[FSTATUS_WORDS];
    status = fstatus_or(status, own);
    MPI_Comm cm = PMPI_Comm_f2c(*comm);
    if (_logging && *dest >= 0) msg(EVT_SEND, world_of(cm, *dest), *stag, F_BYTES(c, t));
    CALL(real(b, c, t, dest, stag, src, rtag, comm, status, ierr));
    if (_logging && FOK(ierr)) f_received(status, cm);
    FINAL();
}

F_PLAIN(probe, S_Probe, (P src, P tag, P comm, P status, P ierr), (src, tag, comm, status, ierr))
F_PLAIN(iprobe, S_Iprobe, (P src, P tag, P comm, P flag, P status, P ierr), (src, tag, comm, flag, status, ierr))

/* Persistent requests (what MPI_Start logs: clogtrace_ext.h's table, with the C handles). */
#define F_SEND_INIT(lower, state)                                                                           \
    void mpi_##lower##_(void *b, F *c, F *t, F *dest, F *tag, F *comm, F *req, F *ierr) {                    \
        REAL(pmpi_##lower##_, (void *, F *, F *, F *, F *, F *, F *, F *));                                  \
        START(state);                                                                                       \
        CALL(real(b, c, t, dest, tag, comm, req, ierr));                                                    \
        MPI_Comm cm = PMPI_Comm_f2c(*comm);                                                                 \
        if (_logging && FOK(ierr))                                                                          \
            persistent(PMPI_Request_f2c(*req), P_SEND, cm, *dest >= 0 ? world_of(cm, *dest) : -1, *tag, 0,  \
                       F_BYTES(c, t));                                                                      \
        FINAL();                                                                                            \
    }
F_SEND_INIT(send_init, S_Send_init)
F_SEND_INIT(bsend_init, S_Bsend_init)
F_SEND_INIT(ssend_init, S_Ssend_init)
F_SEND_INIT(rsend_init, S_Rsend_init)

void mpi_recv_init_(void *b, F *c, F *t, F *src, F *tag, F *comm, F *req, F *ierr) {
    REAL(pmpi_recv_init_, (void *, F *, F *, F *, F *, F *, F *, F *));
    START(S_Recv_init);
    CALL(real(b, c, t, src, tag, comm, req, ierr));
    if (_logging && FOK(ierr)) persistent(PMPI_Request_f2c(*req), P_RECV, PMPI_Comm_f2c(*comm), -1, *tag, 0, 0);
    FINAL();
}

void mpi_start_(F *req, F *ierr) {
    REAL(pmpi_start_, (F *, F *));
    START(S_Start);
    if (_logging) started(PMPI_Request_f2c(*req));
    CALL(real(req, ierr));
    FINAL();
}

void mpi_startall_(F *count, F *reqs, F *ierr) {
    REAL(pmpi_startall_, (F *, F *, F *));
    START(S_Startall);
    if (_logging)
        for (int i = 0; i < *count; i++) started(PMPI_Request_f2c(reqs[i]));
    CALL(real(count, reqs, ierr));
    FINAL();
}

void mpi_request_free_(F *req, F *ierr) {
    REAL(pmpi_request_free_, (F *, F *));
    START(S_Request_free);
    forget_request(PMPI_Request_f2c(*req));
    CALL(real(req, ierr));
    FINAL();
}

/* Communicators' creation. */
F_PLAIN(comm_dup, S_Comm_dup, (P comm, P out, P ierr), (comm, out, ierr))
F_PLAIN(comm_split, S_Comm_split, (P comm, P color, P key, P out, P ierr), (comm, color, key, out, ierr))
F_PLAIN(comm_split_type, S_Comm_split_type, (P comm, P type, P key, P info, P out, P ierr), (comm, type, key, info, out, ierr))
F_PLAIN(comm_create, S_Comm_create, (P comm, P g, P out, P ierr), (comm, g, out, ierr))
F_PLAIN(cart_create, S_Cart_create, (P comm, P nd, P dims, P periods, P reorder, P out, P ierr),
        (comm, nd, dims, periods, reorder, out, ierr))
F_PLAIN(cart_sub, S_Cart_sub, (P comm, P keep, P out, P ierr), (comm, keep, out, ierr))

/* One-sided communication. */
F_PLAIN(win_create, S_Win_create, (P base, P size, P du, P info, P comm, P win, P ierr), (base, size, du, info, comm, win, ierr))
F_PLAIN(win_allocate, S_Win_allocate, (P size, P du, P info, P comm, P base, P win, P ierr), (size, du, info, comm, base, win, ierr))
F_PLAIN(win_free, S_Win_free, (P win, P ierr), (win, ierr))
F_PLAIN(win_fence, S_Win_fence, (P a, P win, P ierr), (a, win, ierr))
F_PLAIN(win_lock, S_Win_lock, (P type, P rank, P a, P win, P ierr), (type, rank, a, win, ierr))
F_PLAIN(win_unlock, S_Win_unlock, (P rank, P win, P ierr), (rank, win, ierr))
F_PLAIN(win_lock_all, S_Win_lock_all, (P a, P win, P ierr), (a, win, ierr))
F_PLAIN(win_unlock_all, S_Win_unlock_all, (P win, P ierr), (win, ierr))
F_PLAIN(win_flush, S_Win_flush, (P rank, P win, P ierr), (rank, win, ierr))
F_PLAIN(win_flush_all, S_Win_flush_all, (P win, P ierr), (win, ierr))
F_PLAIN(win_start, S_Win_start, (P g, P a, P win, P ierr), (g, a, win, ierr))
F_PLAIN(win_complete, S_Win_complete, (P win, P ierr), (win, ierr))
F_PLAIN(win_post, S_Win_post, (P g, P a, P win, P ierr), (g, a, win, ierr))
F_PLAIN(win_wait, S_Win_wait, (P win, P ierr), (win, ierr))
F_PLAIN(put, S_Put, (P ob, P oc, P ot, P target, P disp, P tc, P tt, P win, P ierr),
        (ob, oc, ot, target, disp, tc, tt, win, ierr))
F_PLAIN(get, S_Get, (P ob, P oc, P ot, P target, P disp, P tc, P tt, P win, P ierr),
        (ob, oc, ot, target, disp, tc, tt, win, ierr))
F_PLAIN(accumulate, S_Accumulate, (P ob, P oc, P ot, P target, P disp, P tc, P tt, P op, P win, P ierr),
        (ob, oc, ot, target, disp, tc, tt, op, win, ierr))

/* MPI-IO (a file name's hidden CHARACTER length last). */
F_PLAIN(file_open, S_File_open, (P comm, P name, P amode, P info, P fh, P ierr, size_t len), (comm, name, amode, info, fh, ierr, len))
F_PLAIN(file_close, S_File_close, (P fh, P ierr), (fh, ierr))
F_PLAIN(file_set_view, S_File_set_view, (P fh, P disp, P et, P ft, P rep, P info, P ierr, size_t len),
        (fh, disp, et, ft, rep, info, ierr, len))
F_PLAIN(file_seek, S_File_seek, (P fh, P off, P whence, P ierr), (fh, off, whence, ierr))
F_PLAIN(file_sync, S_File_sync, (P fh, P ierr), (fh, ierr))
F_PLAIN(file_set_size, S_File_set_size, (P fh, P size, P ierr), (fh, size, ierr))
#define F_FILE_RW(lower, state) \
    F_PLAIN(lower, state, (P fh, P b, P c, P t, P st, P ierr), (fh, b, c, t, st, ierr))
#define F_FILE_RW_AT(lower, state) \
    F_PLAIN(lower, state, (P fh, P off, P b, P c, P t, P st, P ierr), (fh, off, b, c, t, st, ierr))
F_FILE_RW(file_read, S_File_read)
F_FILE_RW(file_read_all, S_File_read_all)
F_FILE_RW(file_write, S_File_write)
F_FILE_RW(file_write_all, S_File_write_all)
F_FILE_RW_AT(file_read_at, S_File_read_at)
F_FILE_RW_AT(file_read_at_all, S_File_read_at_all)
F_FILE_RW_AT(file_write_at, S_File_write_at)
F_FILE_RW_AT(file_write_at_all, S_File_write_at_all)
