/* The rest of what real programs call to communicate: nonblocking collectives (MPI_Iallreduce, ...), the
   blocking collectives not wrapped before (MPI_Exscan, MPI_Reduce_scatter_block, MPI_Alltoallw), persistent
   requests (MPI_Send_init, MPI_Recv_init, MPI-4's MPI_Allreduce_init, ...; MPI_Start, MPI_Startall,
   MPI_Request_free), one-sided communication (windows, their synchronisation, MPI_Put, MPI_Get, the
   accumulates) and MPI-IO (MPI_File_*). Before these wrappers such calls were absent from the trace without
   a word. Each is a state named as MPE2 names it; collectives also log a collective event (root, bytes) as
   the blocking ones do; a started persistent send logs its message event at MPI_Start, a started persistent
   receive is remembered as an MPI_Irecv is (its message event at the Wait/Test that completes it).
   One-sided and MPI-IO calls are states only (MPE2 draws no arrow for them either).
   Included at the end of clogtrace.c. */

/* A call logged as a state only; the MPI calls an MPI library makes inside it (ROMIO's collective I/O,
   a window's synchronisation) are part of it, not states of their own (`nested`, as in the Fortran
   wrappers). */
#define PLAIN(NAME, PARAMS, ARGS)                   \
    int MPI_##NAME PARAMS {                         \
        START(S_##NAME);                            \
        int rc;                                     \
        nested++;                                   \
        rc = PMPI_##NAME ARGS;                      \
        nested--;                                   \
        FINAL();                                    \
        return rc;                                  \
    }

/* A collective: a state and a collective event (root as a world rank, -1 for none; bytes). */
#define COLL(NAME, PARAMS, ARGS, ROOT, BYTES)                          \
    int MPI_##NAME PARAMS {                                            \
        START(S_##NAME);                                               \
        if (_logging) coll(2 * S_##NAME, (ROOT), (BYTES));             \
        int rc = PMPI_##NAME ARGS;                                     \
        FINAL();                                                       \
        return rc;                                                     \
    }

static int64_t bytes_of_counts(const int *counts, MPI_Datatype t, MPI_Comm comm) {
    int size = 0;
    int64_t total = 0;
    if (counts == NULL || PMPI_Comm_size(comm, &size) != MPI_SUCCESS) return 0;
    for (int i = 0; i < size; i++) total += bytes_of(counts[i], t);
    return total;
}

#define ROOTED(root, comm) world_of(comm, root)

COLL(Exscan, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm),
     (sb, rb, c, t, op, comm), -1, bytes_of(c, t))
COLL(Reduce_scatter_block, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm),
     (sb, rb, c, t, op, comm), -1, bytes_of(c, t))
COLL(Alltoallw, (const void *sb, const int *scs, const int *sds, const MPI_Datatype *sts, void *rb,
                 const int *rcs, const int *rds, const MPI_Datatype *rts, MPI_Comm comm),
     (sb, scs, sds, sts, rb, rcs, rds, rts, comm), -1, 0)

/* Nonblocking collectives: logged where they start (MPE2 does the same); their Wait/Test is its own state. */
COLL(Ibarrier, (MPI_Comm comm, MPI_Request *r), (comm, r), -1, 0)
COLL(Ibcast, (void *b, int c, MPI_Datatype t, int root, MPI_Comm comm, MPI_Request *r), (b, c, t, root, comm, r),
     ROOTED(root, comm), bytes_of(c, t))
COLL(Ireduce, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm,
               MPI_Request *r),
     (sb, rb, c, t, op, root, comm, r), ROOTED(root, comm), bytes_of(c, t))
COLL(Iallreduce, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm, MPI_Request *r),
     (sb, rb, c, t, op, comm, r), -1, bytes_of(c, t))
COLL(Iscan, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm, MPI_Request *r),
     (sb, rb, c, t, op, comm, r), -1, bytes_of(c, t))
COLL(Iexscan, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm, MPI_Request *r),
     (sb, rb, c, t, op, comm, r), -1, bytes_of(c, t))
COLL(Iallgather, (const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt, MPI_Comm comm,
                  MPI_Request *r),
     (sb, sc, st, rb, rc_, rt, comm, r), -1, bytes_of(sc, st))
COLL(Iallgatherv, (const void *sb, int sc, MPI_Datatype st, void *rb, const int *rcs, const int *dis,
                   MPI_Datatype rt, MPI_Comm comm, MPI_Request *r),
     (sb, sc, st, rb, rcs, dis, rt, comm, r), -1, bytes_of(sc, st))
COLL(Igather, (const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt, int root,
               MPI_Comm comm, MPI_Request *r),
     (sb, sc, st, rb, rc_, rt, root, comm, r), ROOTED(root, comm), bytes_of(sc, st))
COLL(Igatherv, (const void *sb, int sc, MPI_Datatype st, void *rb, const int *rcs, const int *dis,
                MPI_Datatype rt, int root, MPI_Comm comm, MPI_Request *r),
     (sb, sc, st, rb, rcs, dis, rt, root, comm, r), ROOTED(root, comm), bytes_of(sc, st))
COLL(Iscatter, (const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt, int root,
                MPI_Comm comm, MPI_Request *r),
     (sb, sc, st, rb, rc_, rt, root, comm, r), ROOTED(root, comm), bytes_of(rc_, rt))
COLL(Iscatterv, (const void *sb, const int *scs, const int *dis, MPI_Datatype st, void *rb, int rc_,
                 MPI_Datatype rt, int root, MPI_Comm comm, MPI_Request *r),
     (sb, scs, dis, st, rb, rc_, rt, root, comm, r), ROOTED(root, comm), bytes_of(rc_, rt))
COLL(Ialltoall, (const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt, MPI_Comm comm,
                 MPI_Request *r),
     (sb, sc, st, rb, rc_, rt, comm, r), -1, bytes_of(sc, st))
COLL(Ialltoallv, (const void *sb, const int *scs, const int *sds, MPI_Datatype st, void *rb, const int *rcs,
                  const int *rds, MPI_Datatype rt, MPI_Comm comm, MPI_Request *r),
     (sb, scs, sds, st, rb, rcs, rds, rt, comm, r), -1, _logging ? bytes_of_counts(scs, st, comm) : 0)
COLL(Ireduce_scatter, (const void *sb, void *rb, const int *rcs, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                       MPI_Request *r),
     (sb, rb, rcs, t, op, comm, r), -1, _logging ? bytes_of_counts(rcs, t, comm) : 0)
COLL(Ireduce_scatter_block, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                             MPI_Request *r),
     (sb, rb, c, t, op, comm, r), -1, bytes_of(c, t))

/* Persistent requests: what each logs when started (a send's message event, a receive's remembering, a
   collective's event). More than NPERS at once count as dropped message events. */
#define NPERS 1024
enum { P_SEND = 1, P_RECV, P_COLL };
static struct { MPI_Request req; MPI_Comm comm; int kind, peer, tag, etype; int64_t bytes; } pers[NPERS];

static void persistent(MPI_Request req, int kind, MPI_Comm comm, int peer, int tag, int etype, int64_t bytes) {
    LOCK();
    int i = 0;
    while (i < NPERS && pers[i].kind) i++;
    if (i < NPERS) {
        pers[i].req = req;
        pers[i].comm = comm;
        pers[i].kind = kind;
        pers[i].peer = peer;
        pers[i].tag = tag;
        pers[i].etype = etype;
        pers[i].bytes = bytes;
    } else {
        n_dropped++;
    }
    UNLOCK();
}

static void started(MPI_Request req) {
    LOCK();
    for (int i = 0; i < NPERS; i++)
        if (pers[i].kind && pers[i].req == req) {
            if (pers[i].kind == P_SEND && pers[i].peer >= 0) msg(EVT_SEND, pers[i].peer, pers[i].tag, pers[i].bytes);
            else if (pers[i].kind == P_RECV) remember(req, pers[i].comm);
            else if (pers[i].kind == P_COLL) coll(pers[i].etype, pers[i].peer, pers[i].bytes);
            break;
        }
    UNLOCK();
}

#define SEND_INIT(NAME)                                                                                     \
    int MPI_##NAME(const void *b, int c, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request *r) { \
        START(S_##NAME);                                                                                    \
        int rc = PMPI_##NAME(b, c, t, dest, tag, comm, r);                                                  \
        if (_logging && rc == MPI_SUCCESS)                                                                  \
            persistent(*r, P_SEND, comm, dest >= 0 ? world_of(comm, dest) : -1, tag, 0, bytes_of(c, t));    \
        FINAL();                                                                                            \
        return rc;                                                                                          \
    }
SEND_INIT(Send_init)
SEND_INIT(Bsend_init)
SEND_INIT(Ssend_init)
SEND_INIT(Rsend_init)

int MPI_Recv_init(void *b, int c, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Request *r) {
    START(S_Recv_init);
    int rc = PMPI_Recv_init(b, c, t, src, tag, comm, r);
    if (_logging && rc == MPI_SUCCESS) persistent(*r, P_RECV, comm, -1, tag, 0, 0);
    FINAL();
    return rc;
}

int MPI_Start(MPI_Request *r) {
    START(S_Start);
    if (_logging) started(*r);
    int rc = PMPI_Start(r);
    FINAL();
    return rc;
}

int MPI_Startall(int n, MPI_Request *r) {
    START(S_Startall);
    if (_logging)
        for (int i = 0; i < n; i++) started(r[i]);
    int rc = PMPI_Startall(n, r);
    FINAL();
    return rc;
}

static void forget_request(MPI_Request req) {
    LOCK();
    for (int i = 0; i < NPERS; i++)
        if (pers[i].kind && pers[i].req == req) pers[i].kind = 0;
    for (int i = 0; i < req_top; i++)
        if (reqs[i].used && reqs[i].req == req) reqs[i].used = 0;
    while (req_top > 0 && !reqs[req_top - 1].used) req_top--;
    UNLOCK();
}

PLAIN(Cancel, (MPI_Request *r), (r))

int MPI_Request_free(MPI_Request *r) {
    START(S_Request_free);
    forget_request(*r);
    int rc = PMPI_Request_free(r);
    FINAL();
    return rc;
}

#if MPI_VERSION >= 4
/* MPI-4's persistent collectives: a state at the init, the collective event at each MPI_Start. */
#define COLL_INIT(NAME, PARAMS, ARGS, ROOT, BYTES)                                                 \
    int MPI_##NAME PARAMS {                                                                        \
        START(S_##NAME);                                                                           \
        int rc = PMPI_##NAME ARGS;                                                                 \
        if (_logging && rc == MPI_SUCCESS) persistent(*r, P_COLL, comm, (ROOT), 0, 2 * S_##NAME, (BYTES)); \
        FINAL();                                                                                   \
        return rc;                                                                                 \
    }
COLL_INIT(Barrier_init, (MPI_Comm comm, MPI_Info info, MPI_Request *r), (comm, info, r), -1, 0)
COLL_INIT(Bcast_init, (void *b, int c, MPI_Datatype t, int root, MPI_Comm comm, MPI_Info info, MPI_Request *r),
          (b, c, t, root, comm, info, r), ROOTED(root, comm), bytes_of(c, t))
COLL_INIT(Reduce_init, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm,
                        MPI_Info info, MPI_Request *r),
          (sb, rb, c, t, op, root, comm, info, r), ROOTED(root, comm), bytes_of(c, t))
COLL_INIT(Allreduce_init, (const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                           MPI_Info info, MPI_Request *r),
          (sb, rb, c, t, op, comm, info, r), -1, bytes_of(c, t))
COLL_INIT(Allgather_init, (const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt,
                           MPI_Comm comm, MPI_Info info, MPI_Request *r),
          (sb, sc, st, rb, rc_, rt, comm, info, r), -1, bytes_of(sc, st))
COLL_INIT(Alltoall_init, (const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt,
                          MPI_Comm comm, MPI_Info info, MPI_Request *r),
          (sb, sc, st, rb, rc_, rt, comm, info, r), -1, bytes_of(sc, st))
#endif

/* Communicators' creation: collective over the parent communicator. */
PLAIN(Comm_dup, (MPI_Comm comm, MPI_Comm *out), (comm, out))
PLAIN(Comm_split, (MPI_Comm comm, int color, int key, MPI_Comm *out), (comm, color, key, out))
PLAIN(Comm_split_type, (MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm *out), (comm, type, key, info, out))
PLAIN(Comm_create, (MPI_Comm comm, MPI_Group g, MPI_Comm *out), (comm, g, out))
PLAIN(Cart_create, (MPI_Comm comm, int nd, const int *dims, const int *periods, int reorder, MPI_Comm *out),
      (comm, nd, dims, periods, reorder, out))
PLAIN(Cart_sub, (MPI_Comm comm, const int *keep, MPI_Comm *out), (comm, keep, out))
PLAIN(Intercomm_create, (MPI_Comm local, int lleader, MPI_Comm peer, int rleader, int tag, MPI_Comm *out),
      (local, lleader, peer, rleader, tag, out))
PLAIN(Intercomm_merge, (MPI_Comm inter, int high, MPI_Comm *out), (inter, high, out))

/* One-sided communication. */
PLAIN(Win_create, (void *base, MPI_Aint size, int du, MPI_Info info, MPI_Comm comm, MPI_Win *win),
      (base, size, du, info, comm, win))
PLAIN(Win_allocate, (MPI_Aint size, int du, MPI_Info info, MPI_Comm comm, void *base, MPI_Win *win),
      (size, du, info, comm, base, win))
PLAIN(Win_allocate_shared, (MPI_Aint size, int du, MPI_Info info, MPI_Comm comm, void *base, MPI_Win *win),
      (size, du, info, comm, base, win))
PLAIN(Win_create_dynamic, (MPI_Info info, MPI_Comm comm, MPI_Win *win), (info, comm, win))
PLAIN(Win_free, (MPI_Win *win), (win))
PLAIN(Win_fence, (int assert_, MPI_Win win), (assert_, win))
PLAIN(Win_lock, (int type, int rank, int assert_, MPI_Win win), (type, rank, assert_, win))
PLAIN(Win_unlock, (int rank, MPI_Win win), (rank, win))
PLAIN(Win_lock_all, (int assert_, MPI_Win win), (assert_, win))
PLAIN(Win_unlock_all, (MPI_Win win), (win))
PLAIN(Win_flush, (int rank, MPI_Win win), (rank, win))
PLAIN(Win_flush_all, (MPI_Win win), (win))
PLAIN(Win_flush_local, (int rank, MPI_Win win), (rank, win))
PLAIN(Win_sync, (MPI_Win win), (win))
PLAIN(Win_start, (MPI_Group g, int assert_, MPI_Win win), (g, assert_, win))
PLAIN(Win_complete, (MPI_Win win), (win))
PLAIN(Win_post, (MPI_Group g, int assert_, MPI_Win win), (g, assert_, win))
PLAIN(Win_wait, (MPI_Win win), (win))
PLAIN(Put, (const void *ob, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Win w),
      (ob, oc, ot, target, disp, tc, tt, w))
PLAIN(Get, (void *ob, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Win w),
      (ob, oc, ot, target, disp, tc, tt, w))
PLAIN(Accumulate, (const void *ob, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt,
                   MPI_Op op, MPI_Win w),
      (ob, oc, ot, target, disp, tc, tt, op, w))
PLAIN(Get_accumulate, (const void *ob, int oc, MPI_Datatype ot, void *rb, int rc_, MPI_Datatype rt, int target,
                       MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Op op, MPI_Win w),
      (ob, oc, ot, rb, rc_, rt, target, disp, tc, tt, op, w))
PLAIN(Fetch_and_op, (const void *ob, void *rb, MPI_Datatype t, int target, MPI_Aint disp, MPI_Op op, MPI_Win w),
      (ob, rb, t, target, disp, op, w))
PLAIN(Compare_and_swap, (const void *ob, const void *cb, void *rb, MPI_Datatype t, int target, MPI_Aint disp,
                         MPI_Win w),
      (ob, cb, rb, t, target, disp, w))
PLAIN(Rput, (const void *ob, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt,
             MPI_Win w, MPI_Request *r),
      (ob, oc, ot, target, disp, tc, tt, w, r))
PLAIN(Rget, (void *ob, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Win w,
             MPI_Request *r),
      (ob, oc, ot, target, disp, tc, tt, w, r))

/* MPI-IO. */
PLAIN(File_open, (MPI_Comm comm, const char *name, int amode, MPI_Info info, MPI_File *fh),
      (comm, name, amode, info, fh))
PLAIN(File_close, (MPI_File *fh), (fh))
PLAIN(File_delete, (const char *name, MPI_Info info), (name, info))
PLAIN(File_set_view, (MPI_File fh, MPI_Offset disp, MPI_Datatype et, MPI_Datatype ft, const char *rep,
                      MPI_Info info),
      (fh, disp, et, ft, rep, info))
PLAIN(File_seek, (MPI_File fh, MPI_Offset off, int whence), (fh, off, whence))
PLAIN(File_sync, (MPI_File fh), (fh))
PLAIN(File_set_size, (MPI_File fh, MPI_Offset size), (fh, size))
PLAIN(File_preallocate, (MPI_File fh, MPI_Offset size), (fh, size))
#define FILE_RW(NAME, BUF)                                                                     \
    PLAIN(File_##NAME, (MPI_File fh, BUF b, int c, MPI_Datatype t, MPI_Status *st), (fh, b, c, t, st))
#define FILE_RW_AT(NAME, BUF)                                                                         \
    PLAIN(File_##NAME, (MPI_File fh, MPI_Offset off, BUF b, int c, MPI_Datatype t, MPI_Status *st), \
          (fh, off, b, c, t, st))
FILE_RW(read, void *)
FILE_RW(read_all, void *)
FILE_RW(read_shared, void *)
FILE_RW(read_ordered, void *)
FILE_RW(write, const void *)
FILE_RW(write_all, const void *)
FILE_RW(write_shared, const void *)
FILE_RW(write_ordered, const void *)
FILE_RW_AT(read_at, void *)
FILE_RW_AT(read_at_all, void *)
FILE_RW_AT(write_at, const void *)
FILE_RW_AT(write_at_all, const void *)
PLAIN(File_iread, (MPI_File fh, void *b, int c, MPI_Datatype t, MPI_Request *r), (fh, b, c, t, r))
PLAIN(File_iwrite, (MPI_File fh, const void *b, int c, MPI_Datatype t, MPI_Request *r), (fh, b, c, t, r))
PLAIN(File_iread_at, (MPI_File fh, MPI_Offset off, void *b, int c, MPI_Datatype t, MPI_Request *r),
      (fh, off, b, c, t, r))
PLAIN(File_iwrite_at, (MPI_File fh, MPI_Offset off, const void *b, int c, MPI_Datatype t, MPI_Request *r),
      (fh, off, b, c, t, r))
