/* The Fortran bindings (mpif.h and `use mpi`: gfortran's lower-case names with one trailing underscore).
   Open MPI's Fortran functions call PMPI_* directly, so the C wrappers never see a Fortran program's calls:
   these wrappers log them (as the C ones do, with handles converted by the PMPI_*_f2c functions) and call
   the MPI library's own Fortran profiling entry (pmpi_send_, ...), found with dlsym(RTLD_NEXT). Of the
   Fortran 2008 bindings (`use mpi_f08`) only MPI_Init, MPI_Init_thread and MPI_Finalize are wrapped (below).
   Included at the end of clogtrace.c. */
#include <dlfcn.h>

#define FSTATUS_WORDS 16 /* more than any MPI's MPI_STATUS_SIZE (Open MPI 6, MPICH 5) */

/* MPI_STATUS_IGNORE and MPI_STATUSES_IGNORE of `use mpi_f08`: MPICH's are objects of their own; Open MPI's
   are the same sentinels as mpif.h's (mpi_fortran_status_ignore_). */
#ifdef MPICH_VERSION
#define F08_STATUS_IGNORE(p) ((void *)(p) == (void *)MPI_F08_STATUS_IGNORE)
#define F08_STATUSES_IGNORE(p) ((void *)(p) == (void *)MPI_F08_STATUSES_IGNORE)
#else
#define F08_STATUS_IGNORE(p) 0
#define F08_STATUSES_IGNORE(p) 0
#endif

static void *fortran_real(const char *name, void **slot) {
    if (*slot == NULL) *slot = dlsym(RTLD_NEXT, name);
    if (*slot == NULL) {
        fprintf(stderr, "paramedic trace: the MPI library has no Fortran entry %s\n", name);
        abort();
    }
    return *slot;
}

static MPI_Fint *fstatus_or(MPI_Fint *status, MPI_Fint *own) {
    return (status == NULL || status == MPI_F_STATUS_IGNORE || F08_STATUS_IGNORE(status)) ? own : status;
}

static void f_received(MPI_Fint *fstatus, MPI_Comm comm) {
    MPI_Status st;
    if (PMPI_Status_f2c(fstatus, &st) != MPI_SUCCESS || st.MPI_SOURCE < 0) return;
    int cnt = 0;
    PMPI_Get_count(&st, MPI_BYTE, &cnt);
    msg(EVT_RECV, world_of(comm, st.MPI_SOURCE), st.MPI_TAG, cnt);
}

static void f_completed(MPI_Request req, MPI_Fint *fstatus) {
    MPI_Status st;
    if (PMPI_Status_f2c(fstatus, &st) == MPI_SUCCESS) completed(req, &st);
}

/* The real function: the MPI's `name`, or the one an f08 alias (clogtrace_f08.h) set for this call. */
static __thread void *f08_target;
static void *real_or_f08(const char *name, void **slot) {
    void *target = f08_target;
    f08_target = NULL;
    return target != NULL ? target : fortran_real(name, slot);
}
#define REAL(name, params) \
    typedef void(*name##_t) params; \
    static void *slot_##name; \
    name##_t real = (name##_t)real_or_f08(#name, &slot_##name)


#define CALL(expr) do { nested++; expr; nested--; } while (0)
#define FOK(ierr) ((ierr) == NULL || *(ierr) == MPI_SUCCESS)
typedef MPI_Fint F; /* a Fortran INTEGER passed by reference */

static void refuse(const char *why) {
    char path[4096];
    const char *dir = getenv("PARAMEDIC_TRACE_DIR");
    if (dir == NULL) return;
    snprintf(path, sizeof path, "%s/refused", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        if (write(fd, why, strlen(why)) < 0) { /* the exit below says enough */ }
        close(fd);
    }
    fprintf(stderr, "paramedic trace: %s\n", why);
    _exit(97);
}

void mpi_init_(F *ierr) {
    REAL(pmpi_init_, (F *));
    CALL(real(ierr));
    if (FOK(ierr)) start_log();
}

void mpi_init_thread_(F *required, F *provided, F *ierr) {
    REAL(pmpi_init_thread_, (F *, F *, F *));
    CALL(real(required, provided, ierr));
    if (FOK(ierr)) threaded = *provided == MPI_THREAD_MULTIPLE;
    if (FOK(ierr)) start_log();
}

/* The Fortran 2008 bindings (`use mpi_f08`): their MPI_Init, MPI_Init_thread and MPI_Finalize start and end
   the log (a handle is a TYPE holding one INTEGER, passed by reference as an INTEGER is; ierror is OPTIONAL:
   NULL when left out). MPICH's f08 functions call the C MPI_* ones, whose wrappers log them; Open MPI's call
   PMPI_* (not logged): clogtrace_gaps.h names those the program links. The real function is the MPI's
   profiling entry (Open MPI: pmpi_init_f08_) or, where it has none (MPICH), its own (RTLD_NEXT). */
static void *f08_real(const char *pmpi, const char *mpi, void **slot) {
    if (*slot == NULL) *slot = dlsym(RTLD_NEXT, pmpi);
    return *slot != NULL ? *slot : fortran_real(mpi, slot);
}

void mpi_init_f08_(F *ierr) {
    static void *slot;
    void (*real)(F *) = (void (*)(F *))f08_real("pmpi_init_f08_", "mpi_init_f08_", &slot);
    CALL(real(ierr));
    if (FOK(ierr)) start_log();
}

void mpi_init_thread_f08_(F *required, F *provided, F *ierr) {
    static void *slot;
    void (*real)(F *, F *, F *) =
        (void (*)(F *, F *, F *))f08_real("pmpi_init_thread_f08_", "mpi_init_thread_f08_", &slot);
    CALL(real(required, provided, ierr));
    if (FOK(ierr)) threaded = *provided == MPI_THREAD_MULTIPLE;
    if (FOK(ierr)) start_log();
}

void mpi_finalize_f08_(F *ierr) {
    static void *slot;
    void (*real)(F *) = (void (*)(F *))f08_real("pmpi_finalize_f08_", "mpi_finalize_f08_", &slot);
    end_log();
    CALL(real(ierr));
}

void mpi_finalize_(F *ierr) {
    REAL(pmpi_finalize_, (F *));
    end_log();
    CALL(real(ierr));
}

#define F_SEND(lower, state)                                                                          \
    void mpi_##lower##_(void *b, F *c, F *t, F *dest, F *tag, F *comm, F *ierr) {                      \
        REAL(pmpi_##lower##_, (void *, F *, F *, F *, F *, F *, F *));                                                                \
        START(state);                                                                                 \
        if (_logging && *dest >= 0)                                                                   \
            msg(EVT_SEND, world_of(PMPI_Comm_f2c(*comm), *dest), *tag, bytes_of(*c, PMPI_Type_f2c(*t))); \
        CALL(real(b, c, t, dest, tag, comm, ierr));                                                   \
        FINAL();                                                                                      \
    }
F_SEND(send, S_Send)
F_SEND(ssend, S_Ssend)
F_SEND(rsend, S_Rsend)
F_SEND(bsend, S_Bsend)

#define F_ISEND(lower, state)                                                                         \
    void mpi_##lower##_(void *b, F *c, F *t, F *dest, F *tag, F *comm, F *req, F *ierr) {              \
        REAL(pmpi_##lower##_, (void *, F *, F *, F *, F *, F *, F *, F *));                                                               \
        START(state);                                                                                 \
        if (_logging && *dest >= 0)                                                                   \
            msg(EVT_SEND, world_of(PMPI_Comm_f2c(*comm), *dest), *tag, bytes_of(*c, PMPI_Type_f2c(*t))); \
        CALL(real(b, c, t, dest, tag, comm, req, ierr));                                              \
        FINAL();                                                                                      \
    }
F_ISEND(isend, S_Isend)
F_ISEND(issend, S_Issend)

void mpi_recv_(void *b, F *c, F *t, F *src, F *tag, F *comm, F *status, F *ierr) {
    REAL(pmpi_recv_, (void *, F *, F *, F *, F *, F *, F *, F *));
    START(S_Recv);
    F own[FSTATUS_WORDS];
    status = fstatus_or(status, own);
    CALL(real(b, c, t, src, tag, comm, status, ierr));
    if (_logging && FOK(ierr)) f_received(status, PMPI_Comm_f2c(*comm));
    FINAL();
}

void mpi_irecv_(void *b, F *c, F *t, F *src, F *tag, F *comm, F *req, F *ierr) {
    REAL(pmpi_irecv_, (void *, F *, F *, F *, F *, F *, F *, F *));
    START(S_Irecv);
    CALL(real(b, c, t, src, tag, comm, req, ierr));
    if (_logging && FOK(ierr)) remember(PMPI_Request_f2c(*req), PMPI_Comm_f2c(*comm));
    FINAL();
}

void mpi_sendrecv_(void *sb, F *sc, F *stype, F *dest, F *stag, void *rb, F *rc, F *rtype, F *src, F *rtag,
                   F *comm, F *status, F *ierr) {
    REAL(pmpi_sendrecv_, (void *, F *, F *, F *, F *, void *, F *, F *, F *, F *, F *, F *, F *));
    START(S_Sendrecv);
    F own[FSTATUS_WORDS];
    status = fstatus_or(status, own);
    MPI_Comm c = PMPI_Comm_f2c(*comm);
    if (_logging && *dest >= 0) msg(EVT_SEND, world_of(c, *dest), *stag, bytes_of(*sc, PMPI_Type_f2c(*stype)));
    CALL(real(sb, sc, stype, dest, stag, rb, rc, rtype, src, rtag, comm, status, ierr));
    if (_logging && FOK(ierr)) f_received(status, c);
    FINAL();
}

void mpi_wait_(F *req, F *status, F *ierr) {
    REAL(pmpi_wait_, (F *, F *, F *));
    START(S_Wait);
    F own[FSTATUS_WORDS];
    status = fstatus_or(status, own);
    MPI_Request c = PMPI_Request_f2c(*req);
    CALL(real(req, status, ierr));
    if (_logging && FOK(ierr)) f_completed(c, status);
    FINAL();
}

void mpi_test_(F *req, F *flag, F *status, F *ierr) {
    REAL(pmpi_test_, (F *, F *, F *, F *));
    START(S_Test);
    F own[FSTATUS_WORDS];
    status = fstatus_or(status, own);
    MPI_Request c = PMPI_Request_f2c(*req);
    CALL(real(req, flag, status, ierr));
    if (_logging && FOK(ierr) && *flag) f_completed(c, status);
    FINAL();
}

void mpi_waitall_(F *count, F *reqs, F *statuses, F *ierr) {
    REAL(pmpi_waitall_, (F *, F *, F *, F *));
    START(S_Waitall);
    int n = *count > 0 ? *count : 0;
    MPI_Request *c = malloc(sizeof(MPI_Request) * (size_t)(n ? n : 1));
    F *own = NULL;
    if (statuses == NULL || statuses == MPI_F_STATUSES_IGNORE || F08_STATUSES_IGNORE(statuses)) statuses = own = malloc(sizeof(F) * FSTATUS_WORDS * (size_t)(n ? n : 1));
    if (c)
        for (int i = 0; i < n; i++) c[i] = PMPI_Request_f2c(reqs[i]);
    CALL(real(count, reqs, statuses, ierr));
    /* the status of request i is the i-th status in Fortran's MPI_STATUS_SIZE stride */
    if (_logging && FOK(ierr) && c && statuses) {
        MPI_Fint stride = (MPI_Fint)(sizeof(MPI_Status) / sizeof(int));
#ifdef MPI_F_STATUS_SIZE
        stride = MPI_F_STATUS_SIZE;
#elif defined(OMPI_MAJOR_VERSION)
        stride = 6;
#endif
        for (int i = 0; i < n; i++) f_completed(c[i], statuses + (size_t)i * (size_t)stride);
    }
    free(c);
    free(own);
    FINAL();
}

void mpi_waitany_(F *count, F *reqs, F *index, F *status, F *ierr) {
    REAL(pmpi_waitany_, (F *, F *, F *, F *, F *));
    START(S_Waitany);
    int n = *count > 0 ? *count : 0;
    F own[FSTATUS_WORDS];
    status = fstatus_or(status, own);
    MPI_Request *c = malloc(sizeof(MPI_Request) * (size_t)(n ? n : 1));
    if (c)
        for (int i = 0; i < n; i++) c[i] = PMPI_Request_f2c(reqs[i]);
    CALL(real(count, reqs, index, status, ierr));
    /* Fortran's index is 1-based; MPI_UNDEFINED when no request was active */
    if (_logging && FOK(ierr) && c && *index >= 1 && *index <= n) f_completed(c[*index - 1], status);
    free(c);
    FINAL();
}

/* The Fortran status array's stride: MPI_STATUS_SIZE integers. */
static size_t f_status_stride(void) {
#ifdef MPI_F_STATUS_SIZE
    return MPI_F_STATUS_SIZE;
#elif defined(OMPI_MAJOR_VERSION)
    return 6;
#else
    return sizeof(MPI_Status) / sizeof(int);
#endif
}

/* The requests of a Fortran array call, converted before it (MPI sets completed ones to MPI_REQUEST_NULL),
   and the statuses to use (`own`, allocated, when the program ignores them); NULL when out of memory. */
static MPI_Request *f_requests(int n, const F *reqs) {
    MPI_Request *c = malloc(sizeof(MPI_Request) * (size_t)(n ? n : 1));
    if (c)
        for (int i = 0; i < n; i++) c[i] = PMPI_Request_f2c(reqs[i]);
    return c;
}

static F *f_statuses(int n, F *statuses, F **own) {
    *own = NULL;
    if (statuses == NULL || statuses == MPI_F_STATUSES_IGNORE || F08_STATUSES_IGNORE(statuses))
        statuses = *own = malloc(sizeof(F) * FSTATUS_WORDS * (size_t)(n ? n : 1));
    return statuses;
}

void mpi_testall_(F *count, F *reqs, F *flag, F *statuses, F *ierr) {
    REAL(pmpi_testall_, (F *, F *, F *, F *, F *));
    START(S_Testall);
    int n = *count > 0 ? *count : 0;
    MPI_Request *c = f_requests(n, reqs);
    F *own;
    statuses = f_statuses(n, statuses, &own);
    CALL(real(count, reqs, flag, statuses, ierr));
    if (_logging && FOK(ierr) && *flag && c && statuses)
        for (int i = 0; i < n; i++) f_completed(c[i], statuses + (size_t)i * f_status_stride());
    free(c);
    free(own);
    FINAL();
}

void mpi_testany_(F *count, F *reqs, F *index, F *flag, F *status, F *ierr) {
    REAL(pmpi_testany_, (F *, F *, F *, F *, F *, F *));
    START(S_Testany);
    int n = *count > 0 ? *count : 0;
    F own[FSTATUS_WORDS];
    status = fstatus_or(status, own);
    MPI_Request *c = f_requests(n, reqs);
    CALL(real(count, reqs, index, flag, status, ierr));
    if (_logging && FOK(ierr) && *flag && c && *index >= 1 && *index <= n) f_completed(c[*index - 1], status);
    free(c);
    FINAL();
}

/* Testsome and Waitsome: `outcount` requests completed, their 1-based indices, their statuses in order. */
#define F_SOME(name, state)                                                                               \
    void mpi_##name##_(F *count, F *reqs, F *outcount, F *indices, F *statuses, F *ierr) {               \
        REAL(pmpi_##name##_, (F *, F *, F *, F *, F *, F *));                                             \
        START(state);                                                                                     \
        int n = *count > 0 ? *count : 0;                                                                  \
        MPI_Request *c = f_requests(n, reqs);                                                             \
        F *own;                                                                                           \
        statuses = f_statuses(n, statuses, &own);                                                         \
        CALL(real(count, reqs, outcount, indices, statuses, ierr));                                       \
        if (_logging && FOK(ierr) && c && statuses && *outcount != MPI_UNDEFINED)                         \
            for (int k = 0; k < *outcount && k < n; k++)                                                  \
                if (indices[k] >= 1 && indices[k] <= n)                                                   \
                    f_completed(c[indices[k] - 1], statuses + (size_t)k * f_status_stride());              \
        free(c);                                                                                          \
        free(own);                                                                                        \
        FINAL();                                                                                          \
    }
F_SOME(testsome, S_Testsome)
F_SOME(waitsome, S_Waitsome)

void mpi_barrier_(F *comm, F *ierr) {
    REAL(pmpi_barrier_, (F *, F *));
    START(S_Barrier);
    if (_logging) coll(2 * S_Barrier, -1, 0);
    CALL(real(comm, ierr));
    FINAL();
}

void mpi_bcast_(void *b, F *c, F *t, F *root, F *comm, F *ierr) {
    REAL(pmpi_bcast_, (void *, F *, F *, F *, F *, F *));
    START(S_Bcast);
    if (_logging) coll(2 * S_Bcast, world_of(PMPI_Comm_f2c(*comm), *root), bytes_of(*c, PMPI_Type_f2c(*t)));
    CALL(real(b, c, t, root, comm, ierr));
    FINAL();
}

void mpi_reduce_(void *sb, void *rb, F *c, F *t, F *op, F *root, F *comm, F *ierr) {
    REAL(pmpi_reduce_, (void *, void *, F *, F *, F *, F *, F *, F *));
    START(S_Reduce);
    if (_logging) coll(2 * S_Reduce, world_of(PMPI_Comm_f2c(*comm), *root), bytes_of(*c, PMPI_Type_f2c(*t)));
    CALL(real(sb, rb, c, t, op, root, comm, ierr));
    FINAL();
}

#define F_REDUCE_ALL(lower, state)                                                             \
    void mpi_##lower##_(void *sb, void *rb, F *c, F *t, F *op, F *comm, F *ierr) {              \
        REAL(pmpi_##lower##_, (void *, void *, F *, F *, F *, F *, F *));               \
        START(state);                                                                          \
        if (_logging) coll(2 * state, -1, bytes_of(*c, PMPI_Type_f2c(*t)));                    \
        CALL(real(sb, rb, c, t, op, comm, ierr));                                              \
        FINAL();                                                                               \
    }
F_REDUCE_ALL(allreduce, S_Allreduce)
F_REDUCE_ALL(scan, S_Scan)

#define F_GATHER_ALL(lower, state)                                                                   \
    void mpi_##lower##_(void *sb, F *sc, F *st, void *rb, F *rc, F *rt, F *comm, F *ierr) {           \
        REAL(pmpi_##lower##_, (void *, F *, F *, void *, F *, F *, F *, F *));                \
        START(state);                                                                                \
        if (_logging) coll(2 * state, -1, bytes_of(*sc, PMPI_Type_f2c(*st)));                        \
        CALL(real(sb, sc, st, rb, rc, rt, comm, ierr));                                              \
        FINAL();                                                                                     \
    }
F_GATHER_ALL(allgather, S_Allgather)
F_GATHER_ALL(alltoall, S_Alltoall)

void mpi_allgatherv_(void *sb, F *sc, F *st, void *rb, F *rcs, F *dis, F *rt, F *comm, F *ierr) {
    REAL(pmpi_allgatherv_, (void *, F *, F *, void *, F *, F *, F *, F *, F *));
    START(S_Allgatherv);
    if (_logging) coll(2 * S_Allgatherv, -1, bytes_of(*sc, PMPI_Type_f2c(*st)));
    CALL(real(sb, sc, st, rb, rcs, dis, rt, comm, ierr));
    FINAL();
}

void mpi_gather_(void *sb, F *sc, F *st, void *rb, F *rc, F *rt, F *root, F *comm, F *ierr) {
    REAL(pmpi_gather_, (void *, F *, F *, void *, F *, F *, F *, F *, F *));
    START(S_Gather);
    if (_logging) coll(2 * S_Gather, world_of(PMPI_Comm_f2c(*comm), *root), bytes_of(*sc, PMPI_Type_f2c(*st)));
    CALL(real(sb, sc, st, rb, rc, rt, root, comm, ierr));
    FINAL();
}

void mpi_scatter_(void *sb, F *sc, F *st, void *rb, F *rc, F *rt, F *root, F *comm, F *ierr) {
    REAL(pmpi_scatter_, (void *, F *, F *, void *, F *, F *, F *, F *, F *));
    START(S_Scatter);
    if (_logging) coll(2 * S_Scatter, world_of(PMPI_Comm_f2c(*comm), *root), bytes_of(*rc, PMPI_Type_f2c(*rt)));
    CALL(real(sb, sc, st, rb, rc, rt, root, comm, ierr));
    FINAL();
}

void mpi_comm_free_(F *comm, F *ierr) {
    REAL(pmpi_comm_free_, (F *, F *));
    MPI_Comm c = PMPI_Comm_f2c(*comm);
    LOCK();
    for (int i = 0; i < NCOMMS; i++)
        if (comms[i].used && comms[i].comm == c) {
            PMPI_Group_free(&comms[i].group);
            comms[i].used = 0;
        }
    UNLOCK();
    START(S_Comm_free);
    CALL(real(comm, ierr));
    FINAL();
}

/* A program linked with the other MPI than the launcher's (Debian's LAMMPS, an Open MPI program, started by
   an MPICH mpiexec such as the mpich wheel's, or the reverse) gets a tracer built for the launcher's MPI:
   its PMPI calls would reach the program's libmpi with the other MPI's handles and crash in MPI_Init
   (status 11, untraced the ranks run as unconnected singletons). Seen as the other MPI's own symbols in the
   process, before main: refused with the reason. */
__attribute__((constructor)) static void other_mpi(void) {
    if (getenv("PARAMEDIC_TRACE_DIR") == NULL) return;
#ifdef OPEN_MPI
    if (dlsym(RTLD_DEFAULT, "MPIR_Err_create_code") == NULL) return; /* MPICH's, not in Open MPI */
    refuse("this program is linked with MPICH, but the launcher is Open MPI's: start it with MPICH's "
           "mpiexec (mpiexec.mpich for Debian's MPICH)");
#else
    if (dlsym(RTLD_DEFAULT, "ompi_mpi_comm_world") == NULL) return; /* Open MPI's MPI_COMM_WORLD */
    refuse("this program is linked with Open MPI, but the launcher is MPICH's: start it with Open MPI's "
           "mpiexec (mpiexec.openmpi on Debian)");
#endif
}

/* A program that reaches MPI through dlsym on the MPI library's handle calls the library's own MPI_Init,
   not this one: nothing is logged. Said at exit, so that `paramedic trace` refuses the run with the reason
   instead of writing an empty trace. */
__attribute__((destructor)) static void unseen_init(void) {
    if (getenv("PARAMEDIC_TRACE_DIR") == NULL || world_rank >= 0) return;
    int init = 0, fini = 0;
    PMPI_Initialized(&init);
    PMPI_Finalized(&fini);
    if (!init && !fini) return;
    refuse("this program initialised MPI without calling the MPI_Init the tracer wraps: it reaches MPI "
           "through dlsym on the MPI library's handle (or another path the tracer cannot see), so none of "
           "its calls can be traced");
}
