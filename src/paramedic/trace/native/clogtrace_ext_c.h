/* The MPI-4 large-count twins (counts as MPI_Count) of clogtrace_ext.h's calls, logged as the same states:
   mpi4py 4 on an MPI-4 library calls these for every buffer-based call (MPI_Iallreduce_c, MPI_Put_c,
   MPI_File_write_at_all_c, MPI_Win_create_c, ...), and before them such a program's nonblocking
   collectives, one-sided and MPI-IO calls were absent from its trace. Included at the end of clogtrace.c;
   empty before MPI 4. */
#if MPI_VERSION >= 4

#define PLAIN_C(NAME, PARAMS, ARGS)       \
    int MPI_##NAME##_c PARAMS {           \
        START(S_##NAME);                  \
        int rc;                           \
        nested++;                         \
        rc = PMPI_##NAME##_c ARGS;        \
        nested--;                         \
        FINAL();                          \
        return rc;                        \
    }

#define COLL_C(NAME, PARAMS, ARGS, ROOT, BYTES)                \
    int MPI_##NAME##_c PARAMS {                                \
        START(S_##NAME);                                       \
        if (_logging) coll(2 * S_##NAME, (ROOT), (BYTES));     \
        int rc = PMPI_##NAME##_c ARGS;                         \
        FINAL();                                               \
        return rc;                                             \
    }

static int64_t bytes_of_counts_c(const MPI_Count *counts, MPI_Datatype t, MPI_Comm comm) {
    int size = 0;
    int64_t total = 0;
    if (counts == NULL || PMPI_Comm_size(comm, &size) != MPI_SUCCESS) return 0;
    for (int i = 0; i < size; i++) total += bytes_of_c(counts[i], t);
    return total;
}

COLL_C(Exscan, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, MPI_Comm comm),
       (sb, rb, c, t, op, comm), -1, bytes_of_c(c, t))
COLL_C(Reduce_scatter_block, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, MPI_Comm comm),
       (sb, rb, c, t, op, comm), -1, bytes_of_c(c, t))
COLL_C(Alltoallw, (const void *sb, const MPI_Count *scs, const MPI_Aint *sds, const MPI_Datatype *sts, void *rb,
                   const MPI_Count *rcs, const MPI_Aint *rds, const MPI_Datatype *rts, MPI_Comm comm),
       (sb, scs, sds, sts, rb, rcs, rds, rts, comm), -1, 0)
COLL_C(Ibcast, (void *b, MPI_Count c, MPI_Datatype t, int root, MPI_Comm comm, MPI_Request *r),
       (b, c, t, root, comm, r), ROOTED(root, comm), bytes_of_c(c, t))
COLL_C(Ireduce, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm,
                 MPI_Request *r),
       (sb, rb, c, t, op, root, comm, r), ROOTED(root, comm), bytes_of_c(c, t))
COLL_C(Iallreduce, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, MPI_Comm comm, MPI_Request *r),
       (sb, rb, c, t, op, comm, r), -1, bytes_of_c(c, t))
COLL_C(Iscan, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, MPI_Comm comm, MPI_Request *r),
       (sb, rb, c, t, op, comm, r), -1, bytes_of_c(c, t))
COLL_C(Iexscan, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, MPI_Comm comm, MPI_Request *r),
       (sb, rb, c, t, op, comm, r), -1, bytes_of_c(c, t))
COLL_C(Iallgather, (const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_, MPI_Datatype rt,
                    MPI_Comm comm, MPI_Request *r),
       (sb, sc, st, rb, rc_, rt, comm, r), -1, bytes_of_c(sc, st))
COLL_C(Iallgatherv, (const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, const MPI_Count *rcs,
                     const MPI_Aint *dis, MPI_Datatype rt, MPI_Comm comm, MPI_Request *r),
       (sb, sc, st, rb, rcs, dis, rt, comm, r), -1, bytes_of_c(sc, st))
COLL_C(Igather, (const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_, MPI_Datatype rt, int root,
                 MPI_Comm comm, MPI_Request *r),
       (sb, sc, st, rb, rc_, rt, root, comm, r), ROOTED(root, comm), bytes_of_c(sc, st))
COLL_C(Igatherv, (const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, const MPI_Count *rcs,
                  const MPI_Aint *dis, MPI_Datatype rt, int root, MPI_Comm comm, MPI_Request *r),
       (sb, sc, st, rb, rcs, dis, rt, root, comm, r), ROOTED(root, comm), bytes_of_c(sc, st))
COLL_C(Iscatter, (const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_, MPI_Datatype rt,
                  int root, MPI_Comm comm, MPI_Request *r),
       (sb, sc, st, rb, rc_, rt, root, comm, r), ROOTED(root, comm), bytes_of_c(rc_, rt))
COLL_C(Iscatterv, (const void *sb, const MPI_Count *scs, const MPI_Aint *dis, MPI_Datatype st, void *rb,
                   MPI_Count rc_, MPI_Datatype rt, int root, MPI_Comm comm, MPI_Request *r),
       (sb, scs, dis, st, rb, rc_, rt, root, comm, r), ROOTED(root, comm), bytes_of_c(rc_, rt))
COLL_C(Ialltoall, (const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_, MPI_Datatype rt,
                   MPI_Comm comm, MPI_Request *r),
       (sb, sc, st, rb, rc_, rt, comm, r), -1, bytes_of_c(sc, st))
COLL_C(Ialltoallv, (const void *sb, const MPI_Count *scs, const MPI_Aint *sds, MPI_Datatype st, void *rb,
                    const MPI_Count *rcs, const MPI_Aint *rds, MPI_Datatype rt, MPI_Comm comm, MPI_Request *r),
       (sb, scs, sds, st, rb, rcs, rds, rt, comm, r), -1, _logging ? bytes_of_counts_c(scs, st, comm) : 0)
COLL_C(Ireduce_scatter, (const void *sb, void *rb, const MPI_Count *rcs, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                         MPI_Request *r),
       (sb, rb, rcs, t, op, comm, r), -1, _logging ? bytes_of_counts_c(rcs, t, comm) : 0)
COLL_C(Ireduce_scatter_block, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                               MPI_Request *r),
       (sb, rb, c, t, op, comm, r), -1, bytes_of_c(c, t))

#define SEND_INIT_C(NAME)                                                                                     \
    int MPI_##NAME##_c(const void *b, MPI_Count c, MPI_Datatype t, int dest, int tag, MPI_Comm comm,           \
                       MPI_Request *r) {                                                                      \
        START(S_##NAME);                                                                                      \
        int rc = PMPI_##NAME##_c(b, c, t, dest, tag, comm, r);                                                \
        if (_logging && rc == MPI_SUCCESS)                                                                    \
            persistent(*r, P_SEND, comm, dest >= 0 ? world_of(comm, dest) : -1, tag, 0, bytes_of_c(c, t));    \
        FINAL();                                                                                              \
        return rc;                                                                                            \
    }
SEND_INIT_C(Send_init)
SEND_INIT_C(Bsend_init)
SEND_INIT_C(Ssend_init)
SEND_INIT_C(Rsend_init)

int MPI_Recv_init_c(void *b, MPI_Count c, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Request *r) {
    START(S_Recv_init);
    int rc = PMPI_Recv_init_c(b, c, t, src, tag, comm, r);
    if (_logging && rc == MPI_SUCCESS) persistent(*r, P_RECV, comm, -1, tag, 0, 0);
    FINAL();
    return rc;
}

#define COLL_INIT_C(NAME, PARAMS, ARGS, ROOT, BYTES)                                                          \
    int MPI_##NAME##_c PARAMS {                                                                               \
        START(S_##NAME);                                                                                      \
        int rc = PMPI_##NAME##_c ARGS;                                                                        \
        if (_logging && rc == MPI_SUCCESS) persistent(*r, P_COLL, comm, (ROOT), 0, 2 * S_##NAME, (BYTES));    \
        FINAL();                                                                                              \
        return rc;                                                                                            \
    }
COLL_INIT_C(Bcast_init, (void *b, MPI_Count c, MPI_Datatype t, int root, MPI_Comm comm, MPI_Info info,
                         MPI_Request *r),
            (b, c, t, root, comm, info, r), ROOTED(root, comm), bytes_of_c(c, t))
COLL_INIT_C(Reduce_init, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm,
                          MPI_Info info, MPI_Request *r),
            (sb, rb, c, t, op, root, comm, info, r), ROOTED(root, comm), bytes_of_c(c, t))
COLL_INIT_C(Allreduce_init, (const void *sb, void *rb, MPI_Count c, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                             MPI_Info info, MPI_Request *r),
            (sb, rb, c, t, op, comm, info, r), -1, bytes_of_c(c, t))
COLL_INIT_C(Allgather_init, (const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_,
                             MPI_Datatype rt, MPI_Comm comm, MPI_Info info, MPI_Request *r),
            (sb, sc, st, rb, rc_, rt, comm, info, r), -1, bytes_of_c(sc, st))
COLL_INIT_C(Alltoall_init, (const void *sb, MPI_Count sc, MPI_Datatype st, void *rb, MPI_Count rc_,
                            MPI_Datatype rt, MPI_Comm comm, MPI_Info info, MPI_Request *r),
            (sb, sc, st, rb, rc_, rt, comm, info, r), -1, bytes_of_c(sc, st))

PLAIN_C(Win_create, (void *base, MPI_Aint size, MPI_Aint du, MPI_Info info, MPI_Comm comm, MPI_Win *win),
        (base, size, du, info, comm, win))
PLAIN_C(Win_allocate, (MPI_Aint size, MPI_Aint du, MPI_Info info, MPI_Comm comm, void *base, MPI_Win *win),
        (size, du, info, comm, base, win))
PLAIN_C(Win_allocate_shared, (MPI_Aint size, MPI_Aint du, MPI_Info info, MPI_Comm comm, void *base, MPI_Win *win),
        (size, du, info, comm, base, win))
PLAIN_C(Put, (const void *ob, MPI_Count oc, MPI_Datatype ot, int target, MPI_Aint disp, MPI_Count tc,
              MPI_Datatype tt, MPI_Win w),
        (ob, oc, ot, target, disp, tc, tt, w))
PLAIN_C(Get, (void *ob, MPI_Count oc, MPI_Datatype ot, int target, MPI_Aint disp, MPI_Count tc, MPI_Datatype tt,
              MPI_Win w),
        (ob, oc, ot, target, disp, tc, tt, w))
PLAIN_C(Accumulate, (const void *ob, MPI_Count oc, MPI_Datatype ot, int target, MPI_Aint disp, MPI_Count tc,
                     MPI_Datatype tt, MPI_Op op, MPI_Win w),
        (ob, oc, ot, target, disp, tc, tt, op, w))
PLAIN_C(Get_accumulate, (const void *ob, MPI_Count oc, MPI_Datatype ot, void *rb, MPI_Count rc_, MPI_Datatype rt,
                         int target, MPI_Aint disp, MPI_Count tc, MPI_Datatype tt, MPI_Op op, MPI_Win w),
        (ob, oc, ot, rb, rc_, rt, target, disp, tc, tt, op, w))
PLAIN_C(Rput, (const void *ob, MPI_Count oc, MPI_Datatype ot, int target, MPI_Aint disp, MPI_Count tc,
               MPI_Datatype tt, MPI_Win w, MPI_Request *r),
        (ob, oc, ot, target, disp, tc, tt, w, r))
PLAIN_C(Rget, (void *ob, MPI_Count oc, MPI_Datatype ot, int target, MPI_Aint disp, MPI_Count tc, MPI_Datatype tt,
               MPI_Win w, MPI_Request *r),
        (ob, oc, ot, target, disp, tc, tt, w, r))

#define FILE_RW_C(NAME, BUF)                                                                            \
    PLAIN_C(File_##NAME, (MPI_File fh, BUF b, MPI_Count c, MPI_Datatype t, MPI_Status *st), (fh, b, c, t, st))
#define FILE_RW_AT_C(NAME, BUF)                                                                             \
    PLAIN_C(File_##NAME, (MPI_File fh, MPI_Offset off, BUF b, MPI_Count c, MPI_Datatype t, MPI_Status *st), \
            (fh, off, b, c, t, st))
FILE_RW_C(read, void *)
FILE_RW_C(read_all, void *)
FILE_RW_C(read_shared, void *)
FILE_RW_C(read_ordered, void *)
FILE_RW_C(write, const void *)
FILE_RW_C(write_all, const void *)
FILE_RW_C(write_shared, const void *)
FILE_RW_C(write_ordered, const void *)
FILE_RW_AT_C(read_at, void *)
FILE_RW_AT_C(read_at_all, void *)
FILE_RW_AT_C(write_at, const void *)
FILE_RW_AT_C(write_at_all, const void *)
PLAIN_C(File_iread, (MPI_File fh, void *b, MPI_Count c, MPI_Datatype t, MPI_Request *r), (fh, b, c, t, r))
PLAIN_C(File_iwrite, (MPI_File fh, const void *b, MPI_Count c, MPI_Datatype t, MPI_Request *r), (fh, b, c, t, r))
PLAIN_C(File_iread_at, (MPI_File fh, MPI_Offset off, void *b, MPI_Count c, MPI_Datatype t, MPI_Request *r),
        (fh, off, b, c, t, r))
PLAIN_C(File_iwrite_at, (MPI_File fh, MPI_Offset off, const void *b, MPI_Count c, MPI_Datatype t, MPI_Request *r),
        (fh, off, b, c, t, r))
#endif
