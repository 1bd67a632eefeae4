/* The tracer's merge inside MPI_Finalize, as MPE2 merges: the processes form a binary tree (rank r's
   children are 2r+1 and 2r+2), each reads back its own log from local storage, corrects its times to rank
   0's clock, and merges by time its own records with the streams of its children (a three-way merge);
   it sends the result to its parent in chunks, and rank 0 writes the one CLOG2 file (MPE2's layout:
   big-endian, 1,024-byte preamble, 64 KiB blocks, communicator table). No process holds more than its
   read buffer and a few chunks, whatever the trace's size.

   Order: by (corrected time, rank), a process's own records in their logged order; its two TIMESHIFT
   records (clock offsets at MPI_Init and MPI_Finalize) after its records of the same time. This is the
   order of paramedic/trace/merge.py (the reference the tests compare with, byte for byte).

   Included by clogtrace.c after its state (buf, out_fd, world_rank, t_init, off_init, ...). Output:
   $PARAMEDIC_TRACE_DIR/merged.clog2 and merged.summary (the merge's wall time, then per rank: records,
   dropped message events, clock offsets, status, bytes of records logged, and what PARAMEDIC_TRACE_MAX left
   out: calls, events, the time it stopped recording on rank 0's clock or -1), written by rank 0 once every
   rank has reported. */
#include <errno.h>
#include <math.h>
#include <stdio.h>

#define MERGE_TAG_DATA 7711
#define MERGE_TAG_END 7712
#define BLOCK_SIZE 65536
#define PREAMBLE 1024
#define MAX_REC 136 /* 24-byte header + the largest body (STATEDEF, 112) */
#define SUMMARY_MAGIC 0x594d4d5553544d50ULL /* "PMTSUMMY" */

enum { ST_OK = 0, ST_LOG = 1, ST_ORDER = 2, ST_STREAM = 3, ST_WRITE = 4, ST_NOLOG = 5 };

static const int body_size[12] = {0, 0, 112, 104, 40, 8, 40, 24, 16, 48, 48, 8};
static int64_t log_bytes;  /* bytes of records written to the log (after its 16-byte head) */
static int log_failed;     /* a write to the log failed: the log is incomplete */

static int rec_size(const char *rec) {
    int32_t rectype;
    memcpy(&rectype, rec + 20, 4);
    return (rectype >= 2 && rectype < 12) ? 24 + body_size[rectype] : -1;
}

/* One input of a three-way merge: this process's log, or a child's stream. `cur` is its next record (in
   the stream's layout: int64 corrected ns, int32 icomm, rank, thread, rectype, native-order body). */
struct source {
    int peer; /* -1: own log */
    int done, status;
    char *chunk;
    size_t len, pos;
    char cur[MAX_REC];
    int cur_size;
    int64_t key;
    int32_t key_rank;
    /* own log */
    int fd;
    int punch;              /* free what was read of the log as the merge goes (fallocate PUNCH_HOLE) */
    int64_t read_to;        /* the log's bytes read so far (its file offset) */
    int64_t punched;        /* the log's bytes freed so far */
    int64_t left;           /* record bytes still to read from the file */
    int64_t records;        /* records read */
    int64_t last;           /* the previous record's corrected time */
    double slope;
    int64_t ts_time[2];     /* the TIMESHIFT records' times and offsets, pending while ts < 2 */
    int64_t ts_off[2];
    int ts;
    char hold[MAX_REC];     /* the next own record (corrected), held while a TIMESHIFT record goes first */
    int hold_size;          /* 0: none held */
};

static int64_t merge_base; /* rank 0's MPI_Init time on its own clock */
static size_t chunk_cap = 1u << 20;

/* The log's bytes already read into memory freed on disk (a hole punched over them, whole 1 MiB steps),
   so that the logs still to merge and the merged file written so far hold about one trace between them,
   not two at the end of the merge. Where the filesystem cannot punch holes (EOPNOTSUPP: some network and
   older filesystems) the log stays whole until it is removed, as before. Not with PARAMEDIC_TRACE_KEEP. */
static void own_free_read(struct source *s) {
    const int64_t step = 1 << 20;
    int64_t upto = s->read_to / step * step;
    if (!s->punch || upto <= s->punched) return;
    if (fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)s->punched,
                  (off_t)(upto - s->punched)) != 0) {
        s->punch = 0;
        return;
    }
    s->punched = upto;
}

/* The own log's next raw record into s->hold (time still on the local clock); 0 at its end or on error. */
static int own_read(struct source *s) {
    if (s->left <= 0) return 0;
    /* s->chunk is a read buffer of chunk_cap bytes: s->pos..s->len unread */
    if (s->len - s->pos < MAX_REC) {
        memmove(s->chunk, s->chunk + s->pos, s->len - s->pos);
        s->len -= s->pos;
        s->pos = 0;
        while (s->len < chunk_cap) {
            ssize_t n = read(s->fd, s->chunk + s->len, chunk_cap - s->len);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            s->len += (size_t)n;
            s->read_to += n;
        }
        own_free_read(s);
    }
    if (s->len - s->pos < 24) { s->status = ST_LOG; return 0; }
    int size = rec_size(s->chunk + s->pos);
    if (size < 0 || (int64_t)size > s->left || s->len - s->pos < (size_t)size) { s->status = ST_LOG; return 0; }
    memcpy(s->hold, s->chunk + s->pos, (size_t)size);
    s->hold_size = size;
    s->pos += (size_t)size;
    s->left -= size;
    s->records++;
    return 1;
}

static int64_t corrected_ns(const struct source *s, int64_t ns) {
    return ns + off_init + (int64_t)rint((double)(ns - t_init) * s->slope) - merge_base;
}

/* The own log's next record: its records with corrected times, each TIMESHIFT record before the first
   record later than it. */
static void own_next(struct source *s) {
    if (s->hold_size == 0 && s->status == ST_OK && own_read(s)) {
        int64_t ns;
        memcpy(&ns, s->hold, 8);
        int64_t t = corrected_ns(s, ns);
        if (t < s->last) s->status = ST_ORDER;
        s->last = t;
        memcpy(s->hold, &t, 8);
    }
    int64_t held = 0;
    if (s->hold_size) memcpy(&held, s->hold, 8);
    s->key_rank = world_rank;
    if (s->ts < 2 && (s->hold_size == 0 || s->ts_time[s->ts] < held)) {
        int32_t h[4] = {0, world_rank, 0, REC_TIMESHIFT};
        double seconds = (double)s->ts_off[s->ts] / 1e9;
        memcpy(s->cur, &s->ts_time[s->ts], 8);
        memcpy(s->cur + 8, h, 16);
        memcpy(s->cur + 24, &seconds, 8);
        s->cur_size = 32;
        s->key = s->ts_time[s->ts];
        s->ts++;
        return;
    }
    if (s->hold_size) {
        memcpy(s->cur, s->hold, (size_t)s->hold_size);
        s->cur_size = s->hold_size;
        s->hold_size = 0;
        s->key = held;
        return;
    }
    s->done = 1;
}

/* A child's next record: from its current chunk, or the next message (DATA: records; END: its status). */
static void child_next(struct source *s, MPI_Comm comm) {
    for (;;) {
        if (s->pos < s->len) {
            const char *rec = s->chunk + s->pos;
            int size = s->len - s->pos >= 24 ? rec_size(rec) : -1;
            if (size < 0 || s->len - s->pos < (size_t)size) {
                s->status = ST_STREAM; /* the rest of this chunk is dropped; the stream is read to its end */
                s->pos = s->len;
                continue;
            }
            memcpy(s->cur, rec, (size_t)size);
            s->cur_size = size;
            memcpy(&s->key, rec, 8);
            memcpy(&s->key_rank, rec + 12, 4);
            s->pos += (size_t)size;
            return;
        }
        MPI_Status st;
        PMPI_Recv(s->chunk, (int)chunk_cap, MPI_BYTE, s->peer, MPI_ANY_TAG, comm, &st);
        int n = 0;
        PMPI_Get_count(&st, MPI_BYTE, &n);
        if (st.MPI_TAG == MERGE_TAG_END) {
            int64_t status = ST_STREAM;
            if (n == 8) memcpy(&status, s->chunk, 8);
            if (status != ST_OK && s->status == ST_OK) s->status = (int)status;
            s->done = 1;
            return;
        }
        s->len = (size_t)n;
        s->pos = 0;
    }
}

/* Where merged records go: the parent (chunks, sent while the next one fills) or, on rank 0, the file. */
struct sink {
    int parent; /* -1: rank 0, writing the file */
    char *bufs[2];
    int which;
    size_t len;
    MPI_Request pending;
    /* rank 0 */
    int fd;
    char block[BLOCK_SIZE];
    size_t used;
    int64_t blocks;
    int status;
};

static void put_be32(char *p, int32_t v) { uint32_t u = __builtin_bswap32((uint32_t)v); memcpy(p, &u, 4); }
static void put_be64(char *p, uint64_t v) { v = __builtin_bswap64(v); memcpy(p, &v, 8); }

static void write_all(struct sink *k, const char *p, size_t n) {
    while (n > 0 && k->status == ST_OK) {
        ssize_t w = write(k->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { k->status = ST_WRITE; return; }
        p += w;
        n -= (size_t)w;
    }
}

/* Close the block with an ENDBLOCK (the next record's time) or ENDLOG (CLOG_MAXTIME) record. */
static void end_block(struct sink *k, double time, int32_t rectype) {
    char *p = k->block + k->used;
    uint64_t bits;
    memcpy(&bits, &time, 8);
    put_be64(p, bits);
    memset(p + 8, 0, 12);
    put_be32(p + 20, rectype);
    write_all(k, k->block, BLOCK_SIZE);
    memset(k->block, 0, BLOCK_SIZE);
    k->used = 0;
    k->blocks++;
}

/* A record in the stream's layout, written big-endian into the current block (MPE2's packing: a block
   closes when the next record would leave less than an ENDBLOCK's room). */
static void file_put(struct sink *k, const char *rec, int size) {
    int64_t ns;
    int32_t h[4];
    memcpy(&ns, rec, 8);
    memcpy(h, rec + 8, 16);
    double seconds = (double)ns / 1e9;
    if (k->used + (size_t)size >= BLOCK_SIZE - 24) end_block(k, seconds, 1);
    char *p = k->block + k->used;
    uint64_t bits;
    memcpy(&bits, &seconds, 8);
    put_be64(p, bits);
    for (int i = 0; i < 4; i++) put_be32(p + 8 + 4 * i, h[i]);
    const char *b = rec + 24;
    int body = size - 24;
    if (h[3] == REC_TIMESHIFT) {
        memcpy(&bits, b, 8);
        put_be64(p + 24, bits);
    } else {
        int ints = (h[3] == REC_STATEDEF || h[3] == REC_COMMEVT) ? 16 : body; /* names stay bytes */
        for (int i = 0; i < ints; i += 4) {
            int32_t v;
            memcpy(&v, b + i, 4);
            put_be32(p + 24 + i, v);
        }
        memcpy(p + 24 + ints, b + ints, (size_t)(body - ints));
    }
    k->used += (size_t)size;
}

static void sink_put(struct sink *k, MPI_Comm comm, const char *rec, int size) {
    if (k->parent < 0) { file_put(k, rec, size); return; }
    if (k->len + (size_t)size > chunk_cap) {
        PMPI_Wait(&k->pending, MPI_STATUS_IGNORE);
        PMPI_Isend(k->bufs[k->which], (int)k->len, MPI_BYTE, k->parent, MERGE_TAG_DATA, comm, &k->pending);
        k->which ^= 1;
        k->len = 0;
    }
    memcpy(k->bufs[k->which] + k->len, rec, (size_t)size);
    k->len += (size_t)size;
}

/* MPE2's preamble for a merged file (paramedic/trace/clog2.make_preamble). */
static size_t preamble(char *out, int world_size, int64_t commtable) {
    char num[3][32];
    snprintf(num[0], sizeof num[0], "%d", BLOCK_SIZE);
    snprintf(num[1], sizeof num[1], "%d", world_size);
    const int64_t giga = 1 << 30;
    char fptr[3][32];
    snprintf(fptr[0], 32, "%lld", (long long)(commtable / giga));
    snprintf(fptr[1], 32, "%lld", (long long)giga);
    snprintf(fptr[2], 32, "%lld", (long long)(commtable % giga));
    const char *parts[] = {
        "CLOG-02.44", "is_big_endian=", "TRUE ", "is_finalzed=", "TRUE ", "block_size=", num[0],
        "num_buffered_blocks=", "128", "max_comm_world_size=", num[1], "max_thread_count=", "1",
        "known_eventID_start=", "0", "user_eventID_start=", "600", "known_solo_eventID_start=", "-10",
        "user_solo_eventID_start=", "5000", "known_stateID_count=", "300", "user_stateID_count=", "0",
        "known_solo_eventID_count=", "10", "user_solo_eventID_count=", "0", "commtable_fptr=", fptr[0],
        fptr[1], fptr[2]};
    size_t at = 0;
    memset(out, 0, PREAMBLE);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t n = strlen(parts[i]) + 1;
        if (at + n > PREAMBLE) break;
        memcpy(out + at, parts[i], n);
        at += n;
    }
    return PREAMBLE;
}

static void path_in(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

/* The tree merge; every process of MPI_COMM_WORLD calls it from MPI_Finalize (`have_log`: its log is
   whole). */
static void tree_merge(const char *dir, int have_log) {
    MPI_Comm comm;
    int size;
    PMPI_Comm_dup(MPI_COMM_WORLD, &comm);
    PMPI_Comm_size(comm, &size);
    double started = PMPI_Wtime();
    const char *chunk = getenv("PARAMEDIC_TRACE_CHUNK");
    if (chunk) chunk_cap = (size_t)strtoull(chunk, NULL, 10);
    if (chunk_cap < 4096) chunk_cap = 4096;
    int64_t base = t_init + off_init;
    PMPI_Bcast(&base, 1, MPI_INT64_T, 0, comm);
    merge_base = base;

    struct source src[3];
    int nsrc = 0;
    memset(src, 0, sizeof src);
    /* own log */
    struct source *own = &src[nsrc++];
    own->peer = -1;
    own->chunk = malloc(chunk_cap);
    double span = (double)(t_fini - t_init > 1 ? t_fini - t_init : 1);
    own->slope = (double)(off_fini - off_init) / span;
    if (fabs(own->slope) >= 0.5) own->slope = 0.0; /* not a drift: offsets too noisy for a short run */
    own->ts_time[0] = t_init + off_init - base;
    own->ts_off[0] = off_init;
    own->ts_time[1] = t_fini + off_fini - base;
    own->ts_off[1] = off_fini;
    own->last = INT64_MIN;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.raw", dir, world_rank);
    own->punch = getenv("PARAMEDIC_TRACE_KEEP") == NULL;
    own->fd = have_log && own->chunk && own->punch ? open(path, O_RDWR) : -1;
    if (own->fd < 0) {
        own->punch = 0;
        own->fd = have_log && own->chunk ? open(path, O_RDONLY) : -1;
    }
    own->left = log_bytes;
    own->read_to = 16;
    if (own->fd < 0 || lseek(own->fd, 16, SEEK_SET) != 16) {
        own->status = have_log ? ST_LOG : ST_NOLOG;
        own->left = 0;
    }
    for (int c = 2 * world_rank + 1; c <= 2 * world_rank + 2 && c < size; c++) {
        struct source *s = &src[nsrc++];
        s->peer = c;
        s->chunk = malloc(chunk_cap);
        if (s->chunk == NULL) abort();
    }
    struct sink *k = calloc(1, sizeof *k);
    if (k == NULL) abort();
    k->parent = world_rank == 0 ? -1 : (world_rank - 1) / 2;
    k->pending = MPI_REQUEST_NULL;
    char part[4096];
    path_in(part, sizeof part, dir, "merged.clog2.part");
    if (k->parent < 0) {
        k->fd = open(part, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (k->fd < 0) k->status = ST_WRITE;
        char zeros[PREAMBLE] = {0};
        write_all(k, zeros, PREAMBLE);
    } else {
        k->bufs[0] = malloc(chunk_cap);
        k->bufs[1] = malloc(chunk_cap);
        if (k->bufs[0] == NULL || k->bufs[1] == NULL) abort();
    }
    if (own->chunk == NULL) abort();

    for (int i = 0; i < nsrc; i++) {
        if (src[i].peer < 0) own_next(&src[i]);
        else child_next(&src[i], comm);
    }
    for (;;) {
        struct source *best = NULL;
        for (int i = 0; i < nsrc; i++) {
            struct source *s = &src[i];
            if (s->done) continue;
            if (best == NULL || s->key < best->key || (s->key == best->key && s->key_rank < best->key_rank))
                best = s;
        }
        if (best == NULL) break;
        sink_put(k, comm, best->cur, best->cur_size);
        if (best->peer < 0) own_next(best);
        else child_next(best, comm);
    }
    int64_t status = ST_OK;
    for (int i = 0; i < nsrc; i++)
        if (src[i].status != ST_OK && status == ST_OK) status = src[i].status;
    if (own->fd >= 0) {
        close(own->fd);
        if (own->records != (int64_t)n_records) status = status ? status : ST_LOG;
        if (getenv("PARAMEDIC_TRACE_KEEP") == NULL) unlink(path);
    }
    if (k->parent >= 0) {
        PMPI_Wait(&k->pending, MPI_STATUS_IGNORE);
        if (k->len) PMPI_Send(k->bufs[k->which], (int)k->len, MPI_BYTE, k->parent, MERGE_TAG_DATA, comm);
        PMPI_Send(&status, 1, MPI_INT64_T, k->parent, MERGE_TAG_END, comm);
    }
    /* every process's figures (its own status: a subtree's is already in `status` on its way up) */
    int64_t cut_at = cut_ns < 0 ? -1 : corrected_ns(own, cut_ns);
    int64_t mine[9] = {(int64_t)n_records, (int64_t)n_dropped, off_init, off_fini, own->status,
                       logged, (int64_t)calls_left_out, (int64_t)events_left_out, cut_at};
    int64_t *all = world_rank == 0 ? malloc(sizeof mine * (size_t)size) : NULL;
    PMPI_Gather(mine, 9, MPI_INT64_T, all, 9, MPI_INT64_T, 0, comm);
    if (k->parent < 0) {
        end_block(k, 100000000.0, 0);
        static const char table[44] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 'M', 'P', 'I',
                                       '_', 'C', 'O', 'M', 'M', '_', 'W', 'O', 'R', 'L', 'D', 0, 0, 0,
                                       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        write_all(k, table, sizeof table);
        char pre[PREAMBLE];
        preamble(pre, size, PREAMBLE + k->blocks * BLOCK_SIZE);
        if (k->status == ST_OK && pwrite(k->fd, pre, PREAMBLE, 0) != PREAMBLE) k->status = ST_WRITE;
        if (k->fd >= 0 && close(k->fd) != 0 && k->status == ST_OK) k->status = ST_WRITE;
        if (status == ST_OK) status = k->status;
        char final[4096], summary[4096], summary_part[4096];
        path_in(final, sizeof final, dir, "merged.clog2");
        path_in(summary, sizeof summary, dir, "merged.summary");
        path_in(summary_part, sizeof summary_part, dir, "merged.summary.part");
        if (status != ST_OK || rename(part, final) != 0) {
            unlink(part);
            if (status == ST_OK) status = ST_WRITE;
        }
        /* magic, world size, overall status, merge nanoseconds, then 9 numbers per rank */
        int64_t head[4] = {(int64_t)SUMMARY_MAGIC, size, status, (int64_t)((PMPI_Wtime() - started) * 1e9)};
        int fd = open(summary_part, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            int ok = write(fd, head, sizeof head) == (ssize_t)sizeof head &&
                     write(fd, all, sizeof mine * (size_t)size) == (ssize_t)(sizeof mine * (size_t)size);
            close(fd);
            if (!ok || rename(summary_part, summary) != 0) unlink(summary_part);
        }
        free(all);
    }
    for (int i = 0; i < nsrc; i++) free(src[i].chunk);
    free(k->bufs[0]);
    free(k->bufs[1]);
    free(k);
    PMPI_Comm_free(&comm);
}
