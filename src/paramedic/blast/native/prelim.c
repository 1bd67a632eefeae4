/*
 * Reads BLAST+'s preliminary hit list out of a running search, loaded with LD_PRELOAD.
 *
 * Why: BLAST+ searches in two stages. The preliminary stage keeps, per query, at most N subjects
 * (GetPrelimHitlistSize: 1,050 for blastp-style searches with composition-based statistics), and only
 * those are aligned again in the traceback. A database fragment keeps its own N, so a query with more
 * than N candidates in the whole database gets other answers from fragments than from one run. With
 * each fragment's preliminary list (subject, best e-value, score, as BLAST+'s heap ranks them) the
 * engine computes the whole database's list exactly and searches again against those subjects only
 * (paramedic.blast.prelim, paramedic.engine.merge).
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
 * Record, native byte order:
 *   split:  uint32 magic 0x50524c53 ("PRLS"), int32 0, int32 0
 *   batch:  uint32 magic 0x50524c31 ("PRL1"), int32 number of queries, int32 number of query lists
 *   list:   int32 query index in the batch, int32 hsplist_max (BLAST+'s N), int32 entries
 *   entry:  int32 subject oid, int32 score of the best HSP, double best e-value
 * The struct layouts are those of BLAST+ 2.12 (blast_hits.h, blast_hspstream.h); the engine checks
 * the records against a known search before it trusts them (paramedic.blast.prelim.check).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
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

#define MAGIC 0x50524c31u
#define SPLIT_MAGIC 0x50524c53u
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

static int active(void) {
    const char *on = getenv("PARAMEDIC_PRELIM");
    return on != NULL && (strcmp(on, "1") == 0 || strcmp(on, "2") == 0);
}

static int prelim_only(void) {
    const char *on = getenv("PARAMEDIC_PRELIM");
    return on != NULL && strcmp(on, "2") == 0;
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
        if (prelim_only()) drop_lists(stream->results);
    }
    real_close(stream);
}
