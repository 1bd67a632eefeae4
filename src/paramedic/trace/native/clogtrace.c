/* paramedic trace: a PMPI profiling library that records a process's MPI calls as CLOG2 records.

   Preloaded (LD_PRELOAD) into an unmodified MPI program, it defines the MPI_* functions below, which log and
   call the PMPI_* ones. Each process writes its records, in MPE2's CLOG2 record layout (24-byte header and
   body, native byte order) but with the header's time as int64 nanoseconds of the local clock, into a
   bounded buffer (PARAMEDIC_TRACE_BUFFER bytes, 8 MiB by default) that is appended to its own file
   $PARAMEDIC_TRACE_DIR/rank-<world rank>.raw each time it fills. At MPI_Init and MPI_Finalize every rank
   measures its clock's offset against rank 0's (ping-pongs after a barrier; the one with the shortest
   round trip counts) and writes both in the file's trailer. Then, still inside MPI_Finalize, the processes
   merge their logs along a binary tree and rank 0 writes the one CLOG2 file (clogtrace_merge.h).

   Bounded cost: a process holds its buffer (and, merging, a few 1 MiB chunks), whatever the run's length.
   With PARAMEDIC_TRACE_MAX (bytes of the whole merged file) each process may log a share of it
   (`share`, set at MPI_Init from the world size and CLOG2's packing); a call that would not fit (with
   its final event and MPI_Finalize's two reserved) is not logged, nor any call after it: the process
   stops recording there and counts what it left out (calls, and message or collective events of the call
   in progress that did not fit), which the merge's summary reports with the time it stopped. The
   records it kept stay whole states: the merged file is a valid CLOG2 file of at most that size.

   A call is a state: a start bare event (etype 2*stateID) and a final one (2*stateID+1). Sends log a
   message event (-101: peer, tag, bytes) after the start event; receives log one (-102) from the status,
   before the final event (an MPI_Irecv's at the Wait/Test that completes it). Collectives log a collective
   event (etype = the start etype, root, bytes). Peers are ranks in MPI_COMM_WORLD. */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>

#define REC_BAREEVT 5
#define REC_MSGEVT 7
#define REC_COLLEVT 8
#define REC_STATEDEF 2
#define REC_COMMEVT 9
#define REC_TIMESHIFT 11
#define EVT_SEND -101
#define EVT_RECV -102
#define MAGIC 0x5052544345544d50ULL /* "PMTECTRP" */

enum {
#define STATE(name, id) S_##name = id,
#include "clogtrace_states.h"
#undef STATE
};

static const struct { int id; const char *name; } state_names[] = {
#define STATE(name, id) {id, "MPI_" #name},
#include "clogtrace_states.h"
#undef STATE
};

static char *buf;
static size_t buf_cap, buf_len;
static int out_fd = -1;
static int world_rank = -1, active;
static const char *trace_dir; /* set on every rank when traced: each takes part in the collective steps */
static int64_t t_init, t_fini, off_init, off_fini;
static uint64_t n_records, n_dropped;
static int64_t share = INT64_MAX;  /* bytes of records this process may log (PARAMEDIC_TRACE_MAX) */
static int64_t logged;             /* bytes of records logged (buffered or written) */
static int64_t reserved;           /* room kept for the final events of calls in progress (threads) */
static int cut;                    /* the share was reached: nothing more is logged */
static int64_t cut_ns = -1;        /* when (local clock), -1: never */
static uint64_t calls_left_out, events_left_out;
#define FINAL_ROOM 32                /* a state's final bare event */
#define FINALIZE_ROOM 64             /* MPI_Finalize's start and final events, always logged */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#include "clogtrace_merge.h"
#include "clogtrace_gaps.h"

static void flush_buffer(void) {
    size_t done = 0;
    while (done < buf_len) {
        ssize_t n = write(out_fd, buf + done, buf_len - done);
        if (n <= 0) { active = 0; log_failed = 1; return; }
        done += (size_t)n;
        log_bytes += n;
    }
    buf_len = 0;
}

/* A program that asked for MPI_THREAD_MULTIPLE (and got it) may call MPI from several threads at once:
   the buffer, the request, message and communicator tables are then taken under one lock (recursive:
   a completion logs its message through put), each thread logs under a number of its own (CLOG2's thread
   field: 0 for the thread that called MPI_Init, then 1, 2, ... in order of their first call), and a
   record's time is read under the lock, so that the process's records stay in time order. */
static int threaded;
static pthread_mutex_t log_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static __thread int thread_no = -1;
static int n_threads = 1;
#define LOCK() do { if (threaded) pthread_mutex_lock(&log_lock); } while (0)
#define UNLOCK() do { if (threaded) pthread_mutex_unlock(&log_lock); } while (0)
#define NOW INT64_MIN /* put's time: read when the record is written */

/* A record: header (time as int64 ns, icomm 0, rank, thread, rectype) and `body` of `len` bytes. */
static void put(int64_t t, int rectype, const void *body, size_t len) {
    if (!active) return;
    LOCK();
    if (thread_no < 0) thread_no = threaded ? n_threads++ : 0;
    if (t == NOW) t = now_ns();
    if (rectype == REC_BAREEVT && (*(const int32_t *)body & 1) && reserved >= FINAL_ROOM)
        reserved -= FINAL_ROOM; /* a call's final event: its room was kept by call_fits */
    if ((rectype == REC_MSGEVT || rectype == REC_COLLEVT) &&
        logged + reserved + 24 + (int64_t)len + FINALIZE_ROOM > share) {
        events_left_out++; /* the call's final event and MPI_Finalize's keep their room */
        UNLOCK();
        return;
    }
    if (buf_len + 24 + len > buf_cap) flush_buffer();
    char *p = buf + buf_len;
    int32_t h[4] = {0, world_rank, thread_no, rectype};
    memcpy(p, &t, 8);
    memcpy(p + 8, h, 16);
    memcpy(p + 24, body, len);
    buf_len += 24 + len;
    logged += 24 + (int64_t)len;
    n_records++;
    UNLOCK();
}

/* A call is logged while its start and final events fit in the share with MPI_Finalize's room kept; the
   first that does not stops the process's recording for the rest of the run (every later call counted). */
static int call_fits(void) {
    if (share == INT64_MAX) return 1;
    LOCK();
    int fits = !cut && logged + reserved + 2 * FINAL_ROOM + FINALIZE_ROOM <= share;
    if (fits) reserved += FINAL_ROOM; /* its final event's, whatever other threads log meanwhile */
    if (!fits) {
        if (!cut) cut_ns = now_ns();
        cut = 1;
        calls_left_out++;
    }
    UNLOCK();
    return fits;
}

static void bare(int etype) {
    int32_t b[2] = {etype, 0};
    put(NOW, REC_BAREEVT, b, 8);
}

static void msg(int etype, int peer, int tag, int64_t size) {
    int32_t b[6] = {etype, 0, peer, tag, (int32_t)(size > INT32_MAX ? INT32_MAX : size), 0};
    put(NOW, REC_MSGEVT, b, 24);
}

static void coll(int etype, int root, int64_t size) {
    int32_t b[4] = {etype, root, (int32_t)(size > INT32_MAX ? INT32_MAX : size), 0};
    put(NOW, REC_COLLEVT, b, 16);
}

/* A Fortran binding's wrapper (clogtrace_fortran.h) logs the call itself and sets `nested` around the real
   call: an MPI whose Fortran binding calls the C MPI_* functions (not PMPI_*) is not logged twice. */
static __thread int nested;
#define LOGGING (active && !nested)
#define START(s) int _state = (s); int _logging = LOGGING && call_fits(); if (_logging) bare(2 * _state)
#define FINAL() if (_logging) bare(2 * _state + 1)

static int64_t bytes_of(int count, MPI_Datatype type) {
    int size = 0;
    if (type == MPI_DATATYPE_NULL || PMPI_Type_size(type, &size) != MPI_SUCCESS) return 0;
    return (int64_t)count * size;
}

/* Communicator -> world rank translation, cached per communicator (evicted by MPI_Comm_free). */
#define NCOMMS 32
static struct { MPI_Comm comm; MPI_Group group; int used; } comms[NCOMMS];
static MPI_Group world_group;

static int world_of_locked(MPI_Comm comm, int rank);

static int world_of(MPI_Comm comm, int rank) {
    if (rank < 0 || comm == MPI_COMM_WORLD) return rank;
    LOCK();
    int out = world_of_locked(comm, rank);
    UNLOCK();
    return out;
}

static int world_of_locked(MPI_Comm comm, int rank) {
    int slot = -1;
    for (int i = 0; i < NCOMMS; i++)
        if (comms[i].used && comms[i].comm == comm) { slot = i; break; }
    if (slot < 0) {
        int inter = 0;
        PMPI_Comm_test_inter(comm, &inter);
        if (inter) return rank;
        for (int i = 0; i < NCOMMS; i++)
            if (!comms[i].used) { slot = i; break; }
        if (slot < 0) { slot = 0; PMPI_Group_free(&comms[0].group); }
        comms[slot].comm = comm;
        comms[slot].used = 1;
        PMPI_Comm_group(comm, &comms[slot].group);
    }
    int out = rank;
    PMPI_Group_translate_ranks(comms[slot].group, 1, &rank, world_group, &out);
    return out == MPI_UNDEFINED ? rank : out;
}

/* Requests of MPI_Irecv, to log their messages when they complete. */
#define NREQ 4096
static struct { MPI_Request req; MPI_Comm comm; int used; } reqs[NREQ];
static int req_top; /* slots at or above req_top are free: a scan stops there */

static void remember_locked(MPI_Request req, MPI_Comm comm);

static void remember(MPI_Request req, MPI_Comm comm) {
    LOCK();
    remember_locked(req, comm);
    UNLOCK();
}

static void remember_locked(MPI_Request req, MPI_Comm comm) {
    for (int i = 0; i < NREQ; i++)
        if (!reqs[i].used) {
            reqs[i].req = req;
            reqs[i].comm = comm;
            reqs[i].used = 1;
            if (i >= req_top) req_top = i + 1;
            return;
        }
    n_dropped++;
}

static void completed_locked(MPI_Request req, MPI_Status *st);

static void completed(MPI_Request req, MPI_Status *st) {
    LOCK();
    completed_locked(req, st);
    UNLOCK();
}

static void completed_locked(MPI_Request req, MPI_Status *st) {
    for (int i = 0; i < req_top; i++)
        if (reqs[i].used && reqs[i].req == req) {
            reqs[i].used = 0;
            while (req_top > 0 && !reqs[req_top - 1].used) req_top--;
            int cnt = 0, cancelled = 0;
            if (PMPI_Test_cancelled(st, &cancelled) == MPI_SUCCESS && cancelled) return; /* no message came */
            PMPI_Get_count(st, MPI_BYTE, &cnt);
            if (st->MPI_SOURCE >= 0) msg(EVT_RECV, world_of(reqs[i].comm, st->MPI_SOURCE), st->MPI_TAG, cnt);
            return;
        }
}

/* This process runs on rank 0's kernel (the same boot: /proc/sys/kernel/random/boot_id), whose
   CLOCK_MONOTONIC is one clock for every process: collective, every rank calls it. */
static int same_clock_as_root(void) {
    char id[64] = {0}, root[64];
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, id, sizeof id - 1) < 0) id[0] = 0;
        close(fd);
    }
    const char *clocks = getenv("PARAMEDIC_TRACE_CLOCKS"); /* "measure": as if on another kernel (tests) */
    if (clocks != NULL && strcmp(clocks, "measure") == 0) id[0] = 0;
    memcpy(root, id, sizeof id);
    PMPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
    return id[0] != 0 && memcmp(id, root, sizeof id) == 0;
}

/* Offset of this clock against rank 0's: rank 0 answers each rank's pings with its time. A rank on rank
   0's kernel reads the same clock: its offset is 0, not measured (on 2 busy cores MPICH's ping-pongs
   "measured" up to 3.5 ms, which the merge then added to every time of that rank). */
static int64_t clock_offset(void) {
    int size;
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    PMPI_Barrier(MPI_COMM_WORLD);
    int same = same_clock_as_root(), small_flags[64], skip_all = 0;
    int *flags = small_flags;
    if (world_rank == 0 && size > 64) flags = malloc(sizeof(int) * (size_t)size);
    if (flags == NULL) { flags = small_flags; skip_all = 1; } /* out of memory: measure nobody, offsets 0 */
    PMPI_Bcast(&skip_all, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!skip_all) PMPI_Gather(&same, 1, MPI_INT, flags, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int64_t best = 0, best_rtt = INT64_MAX, t0, t1, remote;
    for (int peer = 1; peer < size && !skip_all; peer++) {
        if (world_rank == 0 && flags[peer]) continue;
        if (world_rank == peer && same) continue;
        for (int k = 0; k < 10; k++) {
            if (world_rank == 0) {
                PMPI_Recv(&t0, 1, MPI_INT64_T, peer, 7701, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                remote = now_ns();
                PMPI_Send(&remote, 1, MPI_INT64_T, peer, 7702, MPI_COMM_WORLD);
            } else if (world_rank == peer) {
                t0 = now_ns();
                PMPI_Send(&t0, 1, MPI_INT64_T, 0, 7701, MPI_COMM_WORLD);
                PMPI_Recv(&remote, 1, MPI_INT64_T, 0, 7702, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                t1 = now_ns();
                if (t1 - t0 < best_rtt) { best_rtt = t1 - t0; best = remote - (t0 + (t1 - t0) / 2); }
            }
        }
    }
    if (flags != small_flags) free(flags);
    PMPI_Barrier(MPI_COMM_WORLD);
    return best;
}

static void start_log(void) {
    static int started;
    if (started++) return; /* MPI_Init from Fortran may reach the C MPI_Init too */
    thread_no = 0;
    const char *dir = getenv("PARAMEDIC_TRACE_DIR");
    PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    PMPI_Comm_group(MPI_COMM_WORLD, &world_group);
    if (dir == NULL) return;
    trace_dir = dir;
    const char *cap = getenv("PARAMEDIC_TRACE_BUFFER");
    buf_cap = cap ? (size_t)strtoull(cap, NULL, 10) : (8u << 20);
    if (buf_cap < 4096) buf_cap = 4096;
    buf = malloc(buf_cap);
    const char *max = getenv("PARAMEDIC_TRACE_MAX");
    if (max != NULL && *max) {
        /* The merged file: a 1,024-byte preamble, 64 KiB blocks that each hold at least BLOCK_SIZE - 160
           bytes of records but the last, the 44-byte communicator table; its records are every process's
           plus two TIMESHIFT records (32 bytes) each, and rank 0's state definitions. Each process gets an
           equal part of what remains (at least its communicator event and MPI_Finalize's). */
        int size = 1;
        PMPI_Comm_size(MPI_COMM_WORLD, &size);
        double whole = strtod(max, NULL) - PREAMBLE - 44 - BLOCK_SIZE;
        double records = whole * (BLOCK_SIZE - 24 - MAX_REC) / BLOCK_SIZE - 64.0 * size;
        int64_t defs = (int64_t)(sizeof state_names / sizeof state_names[0]) * (24 + 112);
        double each = (records - (double)defs) / size;
        share = each > 72 + FINALIZE_ROOM ? (int64_t)each : 72 + FINALIZE_ROOM;
        if (world_rank == 0) share += defs;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.raw", dir, world_rank);
    out_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    uint64_t head[2] = {MAGIC, 0};
    int ok = buf != NULL && out_fd >= 0 && write(out_fd, head, sizeof head) == sizeof head;
    off_init = clock_offset(); /* collective: every traced rank measures, logging or not */
    t_init = now_ns();
    if (!ok) { log_failed = 1; return; }
    active = 1;
    if (world_rank == 0) {
        /* the state definitions: stateID, start and final etypes, pad, colour, name, format */
        for (size_t i = 0; i < sizeof state_names / sizeof state_names[0]; i++) {
            char body[112] = {0};
            int32_t ids[4] = {state_names[i].id, 2 * state_names[i].id, 2 * state_names[i].id + 1, 0};
            memcpy(body, ids, 16);
            snprintf(body + 16, 24, "%d %d %d", 40 + (37 * state_names[i].id) % 200,
                     40 + (91 * state_names[i].id) % 200, 40 + (53 * state_names[i].id) % 200);
            snprintf(body + 40, 32, "%s", state_names[i].name);
            put(t_init, REC_STATEDEF, body, 112);
        }
    }
    /* MPI_COMM_WORLD's creation: etype, icomm, rank, world rank, global id (32 bytes) */
    char body[48] = {0};
    int32_t ids[4] = {0, 0, world_rank, world_rank};
    memcpy(body, ids, 16);
    snprintf(body + 28, 20, "MPI_COMM_WORLD");
    put(t_init, REC_COMMEVT, body, 48);
}

static void end_log(void) {
    static int ended;
    if (trace_dir == NULL || ended++) return;
    if (active) bare(2 * S_Finalize);
    off_fini = clock_offset();
    t_fini = now_ns();
    if (active) {
        bare(2 * S_Finalize + 1);
        flush_buffer();
        /* trailer: records, dropped message events, times and offsets at init and finalize, magic (read
           by paramedic/trace/merge.py, the reference merge, when PARAMEDIC_TRACE_KEEP keeps the logs) */
        int64_t tail[7] = {(int64_t)n_records, (int64_t)n_dropped, t_init, off_init, t_fini, off_fini, (int64_t)MAGIC};
        if (write(out_fd, tail, sizeof tail) != sizeof tail) log_failed = 1;
    }
    int have_log = active && !log_failed;
    active = 0;
    if (out_fd >= 0) close(out_fd);
    out_fd = -1;
    free(buf);
    buf = NULL;
    if (world_rank == 0) list_gaps(trace_dir);
    tree_merge(trace_dir, have_log);
}

int MPI_Init(int *argc, char ***argv) {
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) start_log();
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) threaded = *provided == MPI_THREAD_MULTIPLE;
    if (rc == MPI_SUCCESS) start_log();
    return rc;
}

int MPI_Finalize(void) {
    end_log();
    return PMPI_Finalize();
}

#define SEND_LIKE(NAME)                                                                             \
    int MPI_##NAME(const void *b, int c, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {        \
        START(S_##NAME);                                                                            \
        if (_logging && dest >= 0) msg(EVT_SEND, world_of(comm, dest), tag, bytes_of(c, t));          \
        int rc = PMPI_##NAME(b, c, t, dest, tag, comm);                                             \
        FINAL();                                                                                    \
        return rc;                                                                                  \
    }
SEND_LIKE(Send)
SEND_LIKE(Ssend)
SEND_LIKE(Rsend)
SEND_LIKE(Bsend)

#define ISEND_LIKE(NAME)                                                                                   \
    int MPI_##NAME(const void *b, int c, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request *r) { \
        START(S_##NAME);                                                                                   \
        if (_logging && dest >= 0) msg(EVT_SEND, world_of(comm, dest), tag, bytes_of(c, t));                 \
        int rc = PMPI_##NAME(b, c, t, dest, tag, comm, r);                                                 \
        FINAL();                                                                                           \
        return rc;                                                                                         \
    }
ISEND_LIKE(Isend)
ISEND_LIKE(Issend)

int MPI_Recv(void *b, int c, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    START(S_Recv);
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    int rc = PMPI_Recv(b, c, t, src, tag, comm, st);
    if (_logging && rc == MPI_SUCCESS && st->MPI_SOURCE >= 0) {
        int cnt = 0;
        PMPI_Get_count(st, MPI_BYTE, &cnt);
        msg(EVT_RECV, world_of(comm, st->MPI_SOURCE), st->MPI_TAG, cnt);
    }
    FINAL();
    return rc;
}

int MPI_Irecv(void *b, int c, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Request *r) {
    START(S_Irecv);
    int rc = PMPI_Irecv(b, c, t, src, tag, comm, r);
    if (_logging && rc == MPI_SUCCESS) remember(*r, comm);
    FINAL();
    return rc;
}

int MPI_Sendrecv(const void *sb, int sc, MPI_Datatype st_, int dest, int stag, void *rb, int rc_,
                 MPI_Datatype rt, int src, int rtag, MPI_Comm comm, MPI_Status *st) {
    START(S_Sendrecv);
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    if (_logging && dest >= 0) msg(EVT_SEND, world_of(comm, dest), stag, bytes_of(sc, st_));
    int rc = PMPI_Sendrecv(sb, sc, st_, dest, stag, rb, rc_, rt, src, rtag, comm, st);
    if (_logging && rc == MPI_SUCCESS && st->MPI_SOURCE >= 0) {
        int cnt = 0;
        PMPI_Get_count(st, MPI_BYTE, &cnt);
        msg(EVT_RECV, world_of(comm, st->MPI_SOURCE), st->MPI_TAG, cnt);
    }
    FINAL();
    return rc;
}

int MPI_Wait(MPI_Request *r, MPI_Status *st) {
    START(S_Wait);
    MPI_Status own;
    MPI_Request req = *r;
    if (st == MPI_STATUS_IGNORE) st = &own;
    int rc = PMPI_Wait(r, st);
    if (_logging && rc == MPI_SUCCESS) completed(req, st);
    FINAL();
    return rc;
}

int MPI_Test(MPI_Request *r, int *flag, MPI_Status *st) {
    START(S_Test);
    MPI_Status own;
    MPI_Request req = *r;
    if (st == MPI_STATUS_IGNORE) st = &own;
    int rc = PMPI_Test(r, flag, st);
    if (_logging && rc == MPI_SUCCESS && *flag) completed(req, st);
    FINAL();
    return rc;
}

int MPI_Waitall(int n, MPI_Request *r, MPI_Status *st) {
    START(S_Waitall);
    MPI_Request small_req[64];
    MPI_Status small_st[64];
    MPI_Request *copy = n <= 64 ? small_req : malloc(sizeof(MPI_Request) * (size_t)n);
    MPI_Status *sts = st;
    if (st == MPI_STATUSES_IGNORE) sts = n <= 64 ? small_st : malloc(sizeof(MPI_Status) * (size_t)n);
    if (copy) memcpy(copy, r, sizeof(MPI_Request) * (size_t)n);
    int rc = PMPI_Waitall(n, r, sts ? sts : st);
    if (_logging && rc == MPI_SUCCESS && copy && sts)
        for (int i = 0; i < n; i++) completed(copy[i], &sts[i]);
    if (copy != small_req) free(copy);
    if (sts != st && sts != small_st) free(sts);
    FINAL();
    return rc;
}

int MPI_Waitany(int n, MPI_Request *r, int *index, MPI_Status *st) {
    START(S_Waitany);
    MPI_Request small_req[64];
    MPI_Status own;
    MPI_Request *copy = n <= 64 ? small_req : malloc(sizeof(MPI_Request) * (size_t)n);
    if (st == MPI_STATUS_IGNORE) st = &own;
    if (copy) memcpy(copy, r, sizeof(MPI_Request) * (size_t)n);
    int rc = PMPI_Waitany(n, r, index, st);
    if (_logging && rc == MPI_SUCCESS && copy && *index != MPI_UNDEFINED) completed(copy[*index], st);
    if (copy != small_req) free(copy);
    FINAL();
    return rc;
}

int MPI_Barrier(MPI_Comm comm) {
    START(S_Barrier);
    if (_logging) coll(2 * S_Barrier, -1, 0);
    int rc = PMPI_Barrier(comm);
    FINAL();
    return rc;
}

int MPI_Bcast(void *b, int c, MPI_Datatype t, int root, MPI_Comm comm) {
    START(S_Bcast);
    if (_logging) coll(2 * S_Bcast, world_of(comm, root), bytes_of(c, t));
    int rc = PMPI_Bcast(b, c, t, root, comm);
    FINAL();
    return rc;
}

int MPI_Reduce(const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm) {
    START(S_Reduce);
    if (_logging) coll(2 * S_Reduce, world_of(comm, root), bytes_of(c, t));
    int rc = PMPI_Reduce(sb, rb, c, t, op, root, comm);
    FINAL();
    return rc;
}

int MPI_Allreduce(const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    START(S_Allreduce);
    if (_logging) coll(2 * S_Allreduce, -1, bytes_of(c, t));
    int rc = PMPI_Allreduce(sb, rb, c, t, op, comm);
    FINAL();
    return rc;
}

int MPI_Scan(const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    START(S_Scan);
    if (_logging) coll(2 * S_Scan, -1, bytes_of(c, t));
    int rc = PMPI_Scan(sb, rb, c, t, op, comm);
    FINAL();
    return rc;
}

int MPI_Allgather(const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt, MPI_Comm comm) {
    START(S_Allgather);
    if (_logging) coll(2 * S_Allgather, -1, bytes_of(sc, st));
    int rc = PMPI_Allgather(sb, sc, st, rb, rc_, rt, comm);
    FINAL();
    return rc;
}

int MPI_Allgatherv(const void *sb, int sc, MPI_Datatype st, void *rb, const int *rcs, const int *dis,
                   MPI_Datatype rt, MPI_Comm comm) {
    START(S_Allgatherv);
    if (_logging) coll(2 * S_Allgatherv, -1, bytes_of(sc, st));
    int rc = PMPI_Allgatherv(sb, sc, st, rb, rcs, dis, rt, comm);
    FINAL();
    return rc;
}

int MPI_Gather(const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt, int root,
               MPI_Comm comm) {
    START(S_Gather);
    if (_logging) coll(2 * S_Gather, world_of(comm, root), bytes_of(sc, st));
    int rc = PMPI_Gather(sb, sc, st, rb, rc_, rt, root, comm);
    FINAL();
    return rc;
}

int MPI_Scatter(const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt, int root,
                MPI_Comm comm) {
    START(S_Scatter);
    if (_logging) coll(2 * S_Scatter, world_of(comm, root), bytes_of(rc_, rt));
    int rc = PMPI_Scatter(sb, sc, st, rb, rc_, rt, root, comm);
    FINAL();
    return rc;
}

int MPI_Alltoall(const void *sb, int sc, MPI_Datatype st, void *rb, int rc_, MPI_Datatype rt, MPI_Comm comm) {
    START(S_Alltoall);
    if (_logging) coll(2 * S_Alltoall, -1, bytes_of(sc, st));
    int rc = PMPI_Alltoall(sb, sc, st, rb, rc_, rt, comm);
    FINAL();
    return rc;
}

int MPI_Comm_free(MPI_Comm *comm) {
    LOCK();
    for (int i = 0; i < NCOMMS; i++)
        if (comms[i].used && comms[i].comm == *comm) {
            PMPI_Group_free(&comms[i].group);
            comms[i].used = 0;
        }
    UNLOCK();
    START(S_Comm_free);
    int rc = PMPI_Comm_free(comm);
    FINAL();
    return rc;
}

#include "clogtrace_fortran.h"
#include "clogtrace_bigcount.h"
#include "clogtrace_more.h"
#include "clogtrace_ext.h"
#include "clogtrace_ext_c.h"
#include "clogtrace_fortran_more.h"
#include "clogtrace_f08.h"
