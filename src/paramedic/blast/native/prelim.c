/*
 * Reads BLAST+'s preliminary hit list out of a running search, loaded with LD_PRELOAD.
 *
 * Why: BLAST+ searches in two stages. The preliminary stage keeps, per query, at most N subjects
 * (GetPrelimHitlistSize: 1,050 for blastp-style searches with composition-based statistics), and only
 * those are aligned again in the traceback. A database fragment keeps its own N, so a query with more
 * than N candidates in the whole database gets other answers from fragments than from one run. With
 * each fragment's preliminary list (subject, best e-value, score, as BLAST+'s heap ranks them) the
 * engine computes the whole database's list exactly and searches again against those subjects only
 * (paramedic.blast.prelim, paramedic.engine.core.merge).
 *
 * How: BlastHSPStreamClose is called (through libblast's PLT) once per query batch, after the
 * preliminary stage and before the traceback reads the stream. This shim finalises the stream's writer
 * as BLAST+ would (BlastHSPStreamSimpleClose), appends the kept lists to ./paramedic-prelim.bin in the
 * working directory, and calls the real BlastHSPStreamClose. Active when PARAMEDIC_PRELIM is 1 or 2.
 *
 * With PARAMEDIC_PRELIM=2 the search stops after the preliminary stage: once the lists are written,
 * every query's list is emptied, so the traceback has nothing to align and the report is empty. The
 * engine then aligns each query once, against the whole database's list (the top N of the fragments'
 * lists), as one BLAST+ run over the whole database aligns it (docs/DESIGN.md, "Traceback once").
 *
 * BLAST+ splits a long query batch into chunks (SplitQuery_CalculateNumChunks) and merges the chunks'
 * lists with BlastHSPStreamMerge; those lists are not a top-N the merge can reproduce, so the shim also
 * interposes BlastHSPStreamMerge and writes a split record, on which the engine refuses the search.
 *
 * A batch made only of queries BLAST+ cannot search (say, a protein of X alone: "Could not calculate
 * ungapped Karlin-Altschul parameters") gets a stream (BlastHSPStreamNew) that BLAST+ frees without a
 * preliminary stage or a close; its queries have no hits in BLAST+'s report. The shim interposes
 * BlastHSPStreamFree and writes a skipped record for such a stream (and an empty batch to the whole
 * lists), so that the engine's batches stay in step with BLAST+'s; when aligning given lists, the
 * skipped batch's (empty) entry is passed over ("skipped Q").
 *
 * Record, native byte order:
 *   split:  uint32 magic 0x50524c53 ("PRLS"), int32 0, int32 0
 *   skipped: uint32 magic 0x50524c4b ("PRLK"), int32 number of queries, int32 0
 *   batch:  uint32 magic 0x50524c31 ("PRL1"), int32 number of queries, int32 number of query lists
 *   list:   int32 query index in the batch, int32 hsplist_max (BLAST+'s N), int32 entries
 *   entry:  int32 subject oid, int32 score of the best HSP, double best e-value
 *
 * With PARAMEDIC_HSPS=1 as well, the kept lists are also appended whole to ./paramedic-hsps.bin, every
 * HSP as BLAST+'s preliminary stage left it, so that the piece that aligns them need not find them again
 * (PARAMEDIC_PRELIM=3 below):
 *   batch:  uint32 magic 0x50524c52 ("PRLR"), int32 number of queries, int32 number of lists,
 *           int32 flags (1: an HSP holds a pointer, or its context is not its query's, so the batch
 *           cannot be written back)
 *   list:   int32 query index in the batch, int32 subject oid, int32 hsp_max, int32 HSPs
 *   HSP:    struct HspRecord below, its context relative to its query's first (0 .. C-1, C the
 *           contexts per query that PARAMEDIC_CONTEXTS gives: 1, 2 for blastn's strands, 6 frames),
 *           so that the engine moves a list to another batch without touching its HSPs
 *
 * With PARAMEDIC_PRELIM=3 the search aligns given lists instead of finding them: ./paramedic-inject.bin
 * (or the file PARAMEDIC_INJECT names) holds batches (uint32 magic 0x50524c51 "PRLQ", int32 batches; per batch int32 queries, int32
 * lists, then lists and HSPs as above, oids of the searched database, contexts relative to the query:
 * the shim places them at the query's position in the batch). For each batch whose query count
 * matches, the subject loop of the preliminary stage sees no subject (BlastSeqSrcIteratorNext answers
 * end of database), and the lists are written into BLAST+'s own stream just before it is closed, through
 * BlastHSPStreamWrite: the writer, the sort and the traceback then run as after a scan that found
 * exactly those lists. A batch that does not match is scanned as usual. One line per batch goes to
 * ./paramedic-inject.txt ("injected Q L" or "scanned Q"), which the engine reads back.
 *
 * The struct layouts are those of BLAST+ 2.12 (blast_hits.h, blast_hspstream.h); the engine checks
 * the records against a known search before it trusts them (paramedic.blast.prelim_check).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t Int4;
typedef int16_t Int2;
typedef uint8_t Boolean;

typedef struct BlastSeg {
    Int2 frame;
    Int4 offset;
    Int4 end;
    Int4 gapped_start;
} BlastSeg;

typedef struct BlastHSP {
    Int4 score;
    Int4 num_ident;
    double bit_score;
    double evalue;
    BlastSeg query;
    BlastSeg subject;
    Int4 context;
    void *gap_info;
    Int4 num;
    Int2 comp_adjustment_method;
    void *pat_info;
    Int4 num_positives;
    void *map_info;
} BlastHSP;

typedef struct BlastHSPList {
    Int4 oid;
    Int4 query_index;
    BlastHSP **hsp_array;
    Int4 hspcnt;
    Int4 allocated;
    Int4 hsp_max;
    Boolean do_not_reallocate;
    double best_evalue;
} BlastHSPList;

typedef struct BlastHitList {
    Int4 hsplist_count;
    Int4 hsplist_max;
    double worst_evalue;
    Int4 low_score;
    Boolean heapified;
    BlastHSPList **hsplist_array;
    Int4 hsplist_current;
    Int4 num_hits;
} BlastHitList;

typedef struct BlastHSPResults {
    Int4 num_queries;
    BlastHitList **hitlist_array;
} BlastHSPResults;

typedef struct BlastHSPStream {
    int program;
    Int4 num_hsplists;
    Int4 num_hsplists_alloc;
    BlastHSPList **sorted_hsplists;
    BlastHSPResults *results;
    Boolean results_sorted;
    void *sort_by_score;
    void *x_lock;
    void *writer;
    Boolean writer_initialized;
    Boolean writer_finalized;
    void *pre_pipe;
    void *tback_pipe;
} BlastHSPStream;

typedef void (*close_fn)(BlastHSPStream *);

/* One HSP of a dumped or injected list: BlastHSP's values, without its pointers. */
typedef struct HspRecord {
    double bit_score;
    double evalue;
    Int4 score, num_ident, context, num, comp_adjustment_method, num_positives;
    Int4 q_frame, q_offset, q_end, q_gapped_start;
    Int4 s_frame, s_offset, s_end, s_gapped_start;
} HspRecord;

typedef struct ListHead {
    Int4 query;
    Int4 oid;
    Int4 hsp_max;
    Int4 hsps;
} ListHead;

#define MAGIC 0x50524c31u
#define SPLIT_MAGIC 0x50524c53u
#define SKIPPED_MAGIC 0x50524c4bu
#define HSPS_MAGIC 0x50524c52u
#define INJECT_MAGIC 0x50524c51u
#define TINY_EVALUE 1.0e-180 /* s_EvalueComp: two e-values below this are equal */

/* The key BLAST+'s heap (s_EvalueCompareHSPLists) ranks a list by: its best e-value, and the score of
 * the HSP that Blast_HSPListSortByEvalue puts first (best e-value, then highest score). */
static void list_key(const BlastHSPList *list, double *evalue, Int4 *score) {
    double best = list->hsp_array[0]->evalue;
    for (Int4 i = 1; i < list->hspcnt; i++)
        if (list->hsp_array[i]->evalue < best) best = list->hsp_array[i]->evalue;
    Int4 top = INT32_MIN;
    for (Int4 i = 0; i < list->hspcnt; i++) {
        double e = list->hsp_array[i]->evalue;
        int equal = (e < TINY_EVALUE && best < TINY_EVALUE) || e == best;
        if (equal && list->hsp_array[i]->score > top) top = list->hsp_array[i]->score;
    }
    *evalue = best;
    *score = top;
}

static void dump(const BlastHSPResults *results) {
    FILE *out = fopen("paramedic-prelim.bin", "ab");
    if (out == NULL) return; /* the engine sees the missing batch and refuses the run */
    Int4 lists = 0;
    for (Int4 q = 0; q < results->num_queries; q++) lists += results->hitlist_array[q] != NULL;
    uint32_t magic = MAGIC;
    fwrite(&magic, sizeof magic, 1, out);
    fwrite(&results->num_queries, sizeof(Int4), 1, out);
    fwrite(&lists, sizeof lists, 1, out);
    for (Int4 q = 0; q < results->num_queries; q++) {
        const BlastHitList *hits = results->hitlist_array[q];
        if (hits == NULL) continue;
        Int4 entries = 0;
        for (Int4 j = 0; j < hits->hsplist_count; j++) {
            const BlastHSPList *list = hits->hsplist_array[j];
            entries += list != NULL && list->hspcnt > 0;
        }
        Int4 head[3] = {q, hits->hsplist_max, entries};
        fwrite(head, sizeof(Int4), 3, out);
        for (Int4 j = 0; j < hits->hsplist_count; j++) {
            const BlastHSPList *list = hits->hsplist_array[j];
            if (list == NULL || list->hspcnt <= 0) continue;
            double evalue;
            Int4 score;
            list_key(list, &evalue, &score);
            Int4 ids[2] = {list->oid, score};
            fwrite(ids, sizeof(Int4), 2, out);
            fwrite(&evalue, sizeof evalue, 1, out);
        }
    }
    fclose(out);
}

static void record_of(const BlastHSP *hsp, HspRecord *out) {
    memset(out, 0, sizeof *out);
    out->bit_score = hsp->bit_score;
    out->evalue = hsp->evalue;
    out->score = hsp->score;
    out->num_ident = hsp->num_ident;
    out->context = hsp->context;
    out->num = hsp->num;
    out->comp_adjustment_method = hsp->comp_adjustment_method;
    out->num_positives = hsp->num_positives;
    out->q_frame = hsp->query.frame;
    out->q_offset = hsp->query.offset;
    out->q_end = hsp->query.end;
    out->q_gapped_start = hsp->query.gapped_start;
    out->s_frame = hsp->subject.frame;
    out->s_offset = hsp->subject.offset;
    out->s_end = hsp->subject.end;
    out->s_gapped_start = hsp->subject.gapped_start;
}

static void fill_hsp(const HspRecord *in, BlastHSP *hsp) {
    hsp->bit_score = in->bit_score;
    hsp->evalue = in->evalue;
    hsp->score = in->score;
    hsp->num_ident = in->num_ident;
    hsp->context = in->context;
    hsp->num = in->num;
    hsp->comp_adjustment_method = (Int2)in->comp_adjustment_method;
    hsp->num_positives = in->num_positives;
    hsp->query.frame = (Int2)in->q_frame;
    hsp->query.offset = in->q_offset;
    hsp->query.end = in->q_end;
    hsp->query.gapped_start = in->q_gapped_start;
    hsp->subject.frame = (Int2)in->s_frame;
    hsp->subject.offset = in->s_offset;
    hsp->subject.end = in->s_end;
    hsp->subject.gapped_start = in->s_gapped_start;
}

/* Contexts per query (BLAST_GetNumberOfContexts), from PARAMEDIC_CONTEXTS; 0 when unset or invalid,
 * and then no list is written back or given. */
static Int4 contexts_per_query(void) {
    const char *text = getenv("PARAMEDIC_CONTEXTS");
    if (text == NULL) return 0;
    char *end;
    long value = strtol(text, &end, 10);
    return (*end == '\0' && value >= 1 && value <= 6) ? (Int4)value : 0;
}

/* The kept lists whole, in the order dump() writes their keys. */
static void dump_hsps(const BlastHSPResults *results) {
    FILE *out = fopen("paramedic-hsps.bin", "ab");
    if (out == NULL) return; /* the engine sees the missing batch and scans in the piece instead */
    Int4 lists = 0, flags = 0, per = contexts_per_query();
    if (per == 0) flags = 1;
    for (Int4 q = 0; q < results->num_queries; q++) {
        const BlastHitList *hits = results->hitlist_array[q];
        if (hits == NULL) continue;
        for (Int4 j = 0; j < hits->hsplist_count; j++) {
            const BlastHSPList *list = hits->hsplist_array[j];
            if (list == NULL || list->hspcnt <= 0) continue;
            lists++;
            for (Int4 i = 0; i < list->hspcnt; i++) {
                const BlastHSP *hsp = list->hsp_array[i];
                if (hsp->gap_info != NULL || hsp->pat_info != NULL || hsp->map_info != NULL) flags = 1;
                if (hsp->context < q * per || hsp->context >= (q + 1) * per) flags = 1;
            }
        }
    }
    Int4 head[4] = {(Int4)HSPS_MAGIC, results->num_queries, lists, flags};
    fwrite(head, sizeof(Int4), 4, out);
    for (Int4 q = 0; q < results->num_queries; q++) {
        const BlastHitList *hits = results->hitlist_array[q];
        if (hits == NULL) continue;
        for (Int4 j = 0; j < hits->hsplist_count; j++) {
            const BlastHSPList *list = hits->hsplist_array[j];
            if (list == NULL || list->hspcnt <= 0) continue;
            ListHead lh = {q, list->oid, list->hsp_max, list->hspcnt};
            fwrite(&lh, sizeof lh, 1, out);
            for (Int4 i = 0; i < list->hspcnt; i++) {
                HspRecord record;
                record_of(list->hsp_array[i], &record);
                record.context -= q * per;
                fwrite(&record, sizeof record, 1, out);
            }
        }
    }
    fclose(out);
}

static int active(void) {
    const char *on = getenv("PARAMEDIC_PRELIM");
    return on != NULL && (strcmp(on, "1") == 0 || strcmp(on, "2") == 0);
}

static int prelim_only(void) {
    const char *on = getenv("PARAMEDIC_PRELIM");
    return on != NULL && strcmp(on, "2") == 0;
}

static int dump_whole(void) {
    const char *on = getenv("PARAMEDIC_HSPS");
    return on != NULL && strcmp(on, "1") == 0;
}

/* PARAMEDIC_PRELIM=3: the lists to align, loaded once; `pending` is the stream whose preliminary stage
 * is skipped, from BLAST_PreliminarySearchEngine until the stream is closed. */
static struct {
    int loaded;
    char *data;
    size_t size, at;
    Int4 batches, done;
    BlastHSPStream *pending;
    BlastHSPStream *searched; /* the last stream a preliminary stage ran on (any mode) */
    size_t batch_at; /* where the pending batch's lists begin */
    Int4 batch_lists;
    Int4 per; /* contexts per query */
} inject;

static int injecting(void) {
    const char *on = getenv("PARAMEDIC_PRELIM");
    return on != NULL && strcmp(on, "3") == 0;
}

static void note(const char *line) {
    FILE *out = fopen("paramedic-inject.txt", "a");
    if (out == NULL) return;
    fputs(line, out);
    fclose(out);
}

/* Reads the whole file and checks every size in it, so that a batch is skipped only when all its
 * lists can be written back. */
static void load_injection(void) {
    inject.loaded = 1;
    inject.per = contexts_per_query();
    if (inject.per == 0) return; /* every batch scans */
    const char *path = getenv("PARAMEDIC_INJECT");
    FILE *in = fopen(path != NULL ? path : "paramedic-inject.bin", "rb");
    if (in == NULL) return;
    fseek(in, 0, SEEK_END);
    long length = ftell(in);
    fseek(in, 0, SEEK_SET);
    size_t size = length >= 8 ? (size_t)length : 0;
    char *data = size >= 8 ? malloc(size) : NULL;
    if (data == NULL || fread(data, 1, size, in) != size) {
        free(data);
        fclose(in);
        return;
    }
    fclose(in);
    uint32_t magic;
    Int4 batches;
    memcpy(&magic, data, 4);
    memcpy(&batches, data + 4, 4);
    size_t at = 8;
    for (Int4 b = 0; magic == INJECT_MAGIC && b < batches; b++) {
        Int4 counts[2];
        if (size - at < sizeof counts) break;
        memcpy(counts, data + at, sizeof counts);
        at += sizeof counts;
        int bad = counts[0] <= 0 || counts[1] < 0;
        for (Int4 l = 0; !bad && l < counts[1]; l++) {
            ListHead lh;
            if (size - at < sizeof lh) { bad = 1; break; }
            memcpy(&lh, data + at, sizeof lh);
            at += sizeof lh;
            bad = lh.hsps <= 0 || lh.query < 0 || lh.query >= counts[0] || lh.oid < 0 ||
                  (size_t)lh.hsps > (size - at) / sizeof(HspRecord);
            for (Int4 i = 0; !bad && i < lh.hsps; i++) {
                Int4 context;
                memcpy(&context, data + at + offsetof(HspRecord, context), sizeof context);
                bad = context < 0 || context >= inject.per;
                at += sizeof(HspRecord);
            }
        }
        if (bad) break;
        if (b == batches - 1 && at == size) {
            inject.data = data;
            inject.size = size;
            inject.at = 8;
            inject.batches = batches;
            return;
        }
    }
    free(data);
}

typedef Int4 (*prelim_fn)(int, void *, void *, const void *, void *, void *, void *, const void *,
                          void *, void *, void *, const void *, const void *, BlastHSPStream *, void *,
                          void *, void *);

Int4 BLAST_PreliminarySearchEngine(int program, void *query, void *query_info, const void *seq_src,
                                   void *gap_align, void *score_params, void *lookup_wrap,
                                   const void *word_options, void *ext_params, void *hit_params,
                                   void *eff_len_params, const void *psi_options,
                                   const void *db_options, BlastHSPStream *hsp_stream,
                                   void *diagnostics, void *interrupt_search, void *progress_info) {
    static prelim_fn real_prelim;
    if (real_prelim == NULL) real_prelim = (prelim_fn)dlsym(RTLD_NEXT, "BLAST_PreliminarySearchEngine");
    inject.searched = hsp_stream;
    if (injecting() && hsp_stream != NULL && hsp_stream->results != NULL && inject.pending == NULL) {
        if (!inject.loaded) load_injection();
        char line[64];
        Int4 queries = hsp_stream->results->num_queries;
        if (inject.data != NULL && inject.done < inject.batches) {
            Int4 counts[2];
            memcpy(counts, inject.data + inject.at, sizeof counts);
            if (counts[0] == queries) {
                inject.pending = hsp_stream;
                inject.batch_at = inject.at + sizeof counts;
                inject.batch_lists = counts[1];
            } else {
                /* Not the batch the engine expected: this and every later batch scan, for the
                 * records that follow would be matched against the wrong queries. */
                free(inject.data);
                inject.data = NULL;
            }
        }
        if (inject.pending == NULL) {
            snprintf(line, sizeof line, "scanned %d\n", (int)queries);
            note(line);
        }
    }
    return real_prelim(program, query, query_info, seq_src, gap_align, score_params, lookup_wrap,
                       word_options, ext_params, hit_params, eff_len_params, psi_options, db_options,
                       hsp_stream, diagnostics, interrupt_search, progress_info);
}

typedef Int4 (*next_fn)(const void *, void *);

Int4 BlastSeqSrcIteratorNext(const void *seq_src, void *itr) {
    static next_fn real_next;
    if (real_next == NULL) real_next = (next_fn)dlsym(RTLD_NEXT, "BlastSeqSrcIteratorNext");
    if (inject.pending != NULL) return -1; /* BLAST_SEQSRC_EOF: the lists are given, not searched */
    return real_next(seq_src, itr);
}

typedef BlastHSPList *(*list_new_fn)(Int4);
typedef Int2 (*save_fn)(BlastHSPList *, BlastHSP *);
typedef int (*write_fn)(BlastHSPStream *, BlastHSPList **);

/* Writes the pending batch's lists into its stream, as the subject loop would have. */
static void write_injected(BlastHSPStream *stream) {
    list_new_fn list_new = (list_new_fn)dlsym(RTLD_NEXT, "Blast_HSPListNew");
    save_fn save = (save_fn)dlsym(RTLD_NEXT, "Blast_HSPListSaveHSP");
    write_fn write = (write_fn)dlsym(RTLD_NEXT, "BlastHSPStreamWrite");
    size_t at = inject.batch_at;
    Int4 written = 0;
    for (Int4 l = 0; l < inject.batch_lists; l++) {
        ListHead lh;
        memcpy(&lh, inject.data + at, sizeof lh);
        at += sizeof lh;
        BlastHSPList *list = list_new(lh.hsp_max);
        list->oid = lh.oid;
        list->query_index = lh.query;
        for (Int4 i = 0; i < lh.hsps; i++) {
            HspRecord record;
            memcpy(&record, inject.data + at, sizeof record);
            at += sizeof record;
            record.context += lh.query * inject.per; /* the query's own contexts in this batch */
            BlastHSP *hsp = calloc(1, sizeof(BlastHSP));
            fill_hsp(&record, hsp);
            save(list, hsp);
        }
        if (write(stream, &list) == 0) written++;
    }
    inject.at = at;
    inject.done++;
    inject.pending = NULL;
    char line[64];
    snprintf(line, sizeof line, "injected %d %d\n", (int)stream->results->num_queries, (int)written);
    note(line);
}

/* Empties every query's list: the traceback then reads no subject. The lists themselves are left
 * allocated (a few MB per batch at most, freed with the process): freeing BLAST+'s structures from here
 * would tie the shim to more of their layout than it reads. */
static void drop_lists(BlastHSPResults *results) {
    for (Int4 q = 0; q < results->num_queries; q++)
        if (results->hitlist_array[q] != NULL) results->hitlist_array[q]->hsplist_count = 0;
}

typedef int (*merge_fn)(void *, uint32_t, BlastHSPStream *, BlastHSPStream *);

int BlastHSPStreamMerge(void *split_blk, uint32_t chunk, BlastHSPStream *from, BlastHSPStream *into) {
    static merge_fn real_merge;
    if (real_merge == NULL) real_merge = (merge_fn)dlsym(RTLD_NEXT, "BlastHSPStreamMerge");
    if (active()) {
        FILE *out = fopen("paramedic-prelim.bin", "ab");
        if (out != NULL) {
            uint32_t record[3] = {SPLIT_MAGIC, 0, 0};
            fwrite(record, sizeof record, 1, out);
            fclose(out);
        }
    }
    return real_merge(split_blk, chunk, from, into);
}

void BlastHSPStreamClose(BlastHSPStream *stream) {
    static close_fn real_close, simple_close;
    if (real_close == NULL) {
        real_close = (close_fn)dlsym(RTLD_NEXT, "BlastHSPStreamClose");
        simple_close = (close_fn)dlsym(RTLD_NEXT, "BlastHSPStreamSimpleClose");
    }
    if (active() && stream != NULL && stream->results != NULL &&
        !stream->results_sorted && simple_close != NULL) {
        simple_close(stream); /* runs the writer's finaliser once, as the real close would */
        dump(stream->results);
        if (dump_whole()) dump_hsps(stream->results);
        if (prelim_only()) drop_lists(stream->results);
    }
    if (inject.pending != NULL && inject.pending == stream) write_injected(stream);
    real_close(stream);
}

typedef BlastHSPStream *(*free_fn)(BlastHSPStream *);

/* A stream freed that no preliminary stage ran on: BLAST+ skipped the batch (no query it could search). */
static void skipped(const BlastHSPStream *stream) {
    Int4 queries = stream->results->num_queries;
    if (active()) {
        FILE *out = fopen("paramedic-prelim.bin", "ab");
        if (out != NULL) {
            uint32_t record[3] = {SKIPPED_MAGIC, (uint32_t)queries, 0};
            fwrite(record, sizeof record, 1, out);
            fclose(out);
        }
        if (dump_whole()) {
            out = fopen("paramedic-hsps.bin", "ab");
            if (out != NULL) {
                Int4 head[4] = {(Int4)HSPS_MAGIC, queries, 0, 0};
                fwrite(head, sizeof(Int4), 4, out);
                fclose(out);
            }
        }
    }
    if (injecting()) {
        if (!inject.loaded) load_injection();
        if (inject.data != NULL && inject.done < inject.batches) {
            Int4 counts[2];
            memcpy(counts, inject.data + inject.at, sizeof counts);
            if (counts[0] == queries && counts[1] == 0) { /* its entry, empty: the next batch's is next */
                inject.at += sizeof counts;
                inject.done++;
            } else { /* not the batch the engine expected: every later batch scans */
                free(inject.data);
                inject.data = NULL;
            }
        }
        char line[64];
        snprintf(line, sizeof line, "skipped %d\n", (int)queries);
        note(line);
    }
}

BlastHSPStream *BlastHSPStreamFree(BlastHSPStream *stream) {
    static free_fn real_free;
    if (real_free == NULL) real_free = (free_fn)dlsym(RTLD_NEXT, "BlastHSPStreamFree");
    if (stream != NULL && stream == inject.searched) {
        inject.searched = NULL;
    } else if (stream != NULL && stream->results != NULL && !stream->results_sorted &&
               (active() || injecting())) {
        skipped(stream);
    }
    return real_free(stream);
}
