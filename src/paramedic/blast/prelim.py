"""BLAST+'s preliminary hit list, read out of fragment searches, and BLAST+'s own query batches.

BLAST+ searches in two stages (docs/DESIGN.md, "Preliminary list"): the preliminary stage keeps, per
query, the best N subjects under one order (best e-value, score of the first HSP, ordinal id), and only
those are aligned again in the traceback. Per subject both stages are independent of the other subjects,
so the whole database's preliminary list is the top N of the union of the fragments' lists. The
preloaded shim `native/prelim.c` writes each search's lists to `paramedic-prelim.bin` in its working
directory; this module builds the shim, reads its records and checks them against what BLAST+ must have
done (batch sizes, N), so that a BLAST+ whose internals differ is refused instead of trusted.

BLAST+ reads the query file in batches (`GetQueryBatchSize`, `CBlastInput::GetNextSeqBatch`): queries
are added while the batch holds fewer residues than the program's batch size. Within a batch, the
composition-based traceback skips a subject only when every query of the batch has filled its hit list
(`BlastCompo_EarlyTermination`), so a query's answer can depend on its batch: the engine cuts work only
at these batch boundaries.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

from paramedic.blast.forkserver import PRELIM_SOURCE, prelim_shim
from paramedic.blast.hits import Candidate, PrelimList
from paramedic.blast.options import BlastOptions
from paramedic.errors import BlastError

SOURCE = PRELIM_SOURCE
DUMP_NAME = "paramedic-prelim.bin"
LISTS_NAME = "paramedic-hsps.bin"  # the kept lists whole (PARAMEDIC_HSPS=1)
INJECT_NAME = "paramedic-inject.bin"  # the lists a piece aligns (PARAMEDIC_PRELIM=3)
INJECT_NOTE = "paramedic-inject.txt"  # what the shim did with each of the piece's batches
_MAGIC = 0x50524C31
_SPLIT_MAGIC = 0x50524C53
_SKIPPED_MAGIC = 0x50524C4B  # a batch BLAST+ did not search: none of its queries could be (no hits)
_LISTS_MAGIC = 0x50524C52  # contexts relative to their query (PARAMEDIC_CONTEXTS)
_INJECT_MAGIC = 0x50524C51
# Programs whose query batches BLAST+ fixes in advance (GetQueryBatchSize); blastn's app sizes them as
# it goes (CBatchSizeMixer). Every program's preliminary lists are read.
BATCHED = frozenset({"blastp", "blastx", "tblastn", "tblastx"})
_BATCH = struct.Struct("=Iii")
_LIST = struct.Struct("=iii")
_ENTRY = struct.Struct("=iid")
_LISTS_BATCH = struct.Struct("=Iiii")  # magic, queries, lists, flags
_HEAD = struct.Struct("=iiii")  # query, oid, hsp_max, HSPs
_HSP_BYTES = 72  # struct HspRecord in native/prelim.c
_INJECT_BATCH = struct.Struct("=ii")  # queries, lists
# Contexts per query in a batch (BLAST_GetNumberOfContexts): a strand each for blastn, a frame each for
# translated queries. An HSP's context is its query's first context plus its strand or frame.
CONTEXTS = {"blastp": 1, "tblastn": 1, "blastn": 2, "blastx": 6, "tblastx": 6}
# Programs whose pieces align the fragments' lists as given (PARAMEDIC_PRELIM=3) instead of finding
# them again. The shim hands a batch its lists only when the batch holds the queries the engine
# expected, so a piece's batches must be known: BLAST+ fixes them in advance for BATCHED programs, and
# blastn keeps to the size its BATCH_SIZE variable forces (`piece_batch_residues`).
INJECTABLE = BATCHED | {"blastn"}

# GetQueryBatchSize (BLAST+ 2.12, blast_input_aux.cpp): residues per batch, by program and task.
_BATCH_RESIDUES = {"blastp": 10000, "blastx": 10002, "tblastx": 10002, "tblastn": 20000}
# SplitQuery_GetChunkSize: residues per query chunk, by program or blastn task.
_CHUNK_RESIDUES = {
    "blastp": 10000,
    "blastx": 10002,
    "tblastn": 20000,
    "megablast": 5000000,
    "dc-megablast": 5000000,
}


shim = prelim_shim  # the compiled preload library, or None without a C compiler


def environment(
    prelim_only: bool = False, whole_lists: bool = False, program: str = "blastp"
) -> dict[str, str]:
    """Extra environment for a search whose preliminary lists are to be read; with `prelim_only` the
    search stops after its preliminary stage (no traceback, an empty report); with `whole_lists` the
    kept lists are written whole too (`LISTS_NAME`), for `injection`, each HSP's context relative to
    its query's (the shim is told `program`'s contexts per query)."""
    library = shim()
    if library is None:
        raise BlastError(
            "--strategy fragments needs a C compiler (Debian: apt-get install gcc) to read BLAST+'s "
            "preliminary hit list; use --strategy queries"
        )
    env = {"LD_PRELOAD": str(library), "PARAMEDIC_PRELIM": "2" if prelim_only else "1"}
    if whole_lists:
        env["PARAMEDIC_HSPS"] = "1"
        env["PARAMEDIC_CONTEXTS"] = str(CONTEXTS[program])
    return env


def inject_environment(program: str, options: BlastOptions) -> dict[str, str]:
    """Extra environment for a search that aligns the lists in `INJECT_NAME` of its working directory
    (written by `injection`) instead of finding them: its preliminary stage sees no subject. blastn's
    batches are fixed by BATCH_SIZE (`piece_batch_residues`)."""
    library = shim()
    if library is None:
        raise BlastError("no C compiler to build the preliminary-list shim")
    env = {"LD_PRELOAD": str(library), "PARAMEDIC_PRELIM": "3", "PARAMEDIC_CONTEXTS": str(CONTEXTS[program])}
    if program not in BATCHED:
        env["BATCH_SIZE"] = str(piece_batch_residues(program, options))
    return env


def whole_lists(data: bytes, queries: int, gids: Sequence[int], program: str) -> bytes | None:
    """A search's kept lists whole (the shim's `LISTS_NAME`), each keyed by the query's index in the
    search and the subject's global id, for the piece that aligns them (`injection`). Each HSP's
    context is its query's own already (the shim writes it so: a piece batches its queries otherwise),
    so only the lists' heads are rewritten here. None when a batch holds what cannot be written back (an
    HSP with an edit script, or of another query's context): its pieces then find their lists again.
    Anything malformed raises BlastError. `program`: whose contexts the shim was told (`environment`)."""
    del program  # the shim moved the contexts (PARAMEDIC_CONTEXTS)
    out: list[bytes] = []
    at = start = 0
    while at < len(data):
        try:
            magic, n_queries, n_lists, flags = _LISTS_BATCH.unpack_from(data, at)
        except struct.error:
            raise _unexpected("a truncated list record") from None
        at += _LISTS_BATCH.size
        if magic != _LISTS_MAGIC or n_queries <= 0 or start + n_queries > queries or n_lists < 0:
            raise _unexpected("a malformed list record")
        for _ in range(n_lists):
            try:
                index, oid, hsp_max, hsps = _HEAD.unpack_from(data, at)
            except struct.error:
                raise _unexpected("a truncated list") from None
            end = at + _HEAD.size + hsps * _HSP_BYTES
            if not 0 <= index < n_queries or not 0 <= oid < len(gids) or hsps <= 0 or end > len(data):
                raise _unexpected("a malformed list")
            out.append(_HEAD.pack(start + index, gids[oid], hsp_max, hsps))
            out.append(data[at + _HEAD.size : end])
            at = end
        if flags:
            return None
        start += n_queries
    return b"".join(out)


def injection(
    searched: Sequence[tuple[int, bytes]],
    first: int,
    subjects: Sequence[Sequence[int]],
    batches: Sequence[range],
    program: str,
) -> bytes | None:
    """The file a piece aligns (`inject_environment`): per BLAST+ batch of the piece (`batches`, query
    indices from 0 at global query `first`), each query's lists of exactly its `subjects`, taken from
    the fragment searches' `whole_lists` (`searched`: the global index of each one's first query, its
    lists; the shim places each HSP's context at its query's in the batch). None when a subject's list
    is in none of them. `program`: whose contexts the shim is told (`inject_environment`)."""
    del program
    wanted = {first + i: set(s) for i, s in enumerate(subjects)}
    found: dict[tuple[int, int], bytes] = {}
    for start, data in searched:
        at = 0
        while at < len(data):
            index, gid, _, hsps = _HEAD.unpack_from(data, at)
            end = at + _HEAD.size + hsps * _HSP_BYTES
            query = start + index
            if gid in wanted.get(query, ()):
                found[(gid, query)] = data[at:end]
            at = end
    if len(found) != sum(len(s) for s in wanted.values()):
        return None
    out = [struct.pack("=Ii", _INJECT_MAGIC, len(batches))]
    for batch in batches:
        lists = sorted(k for k in found if first + batch.start <= k[1] < first + batch.stop)
        out.append(_INJECT_BATCH.pack(len(batch), len(lists)))
        for gid, query in lists:
            out.append(struct.pack("=i", query - first - batch.start))
            out.append(found[(gid, query)][4:])
    return b"".join(out)


def injected(note: str) -> int:
    """How many of a piece's batches aligned the given lists (the shim's `INJECT_NOTE`)."""
    return sum(1 for line in note.splitlines() if line.startswith("injected "))


def batch_residues(program: str, options: BlastOptions) -> int | None:
    """BLAST+'s query batch size in residues (GetQueryBatchSize), honouring its BATCH_SIZE variable;
    None for blastn, whose batches follow the search (CBatchSizeMixer)."""
    if program not in BATCHED:
        return None
    forced = os.environ.get("BATCH_SIZE")
    if forced:
        try:
            return int(forced)
        except ValueError as exc:
            raise BlastError(f"BATCH_SIZE={forced!r} is not an integer") from exc
    return _BATCH_RESIDUES.get(program, 10000)


def piece_batch_residues(program: str, options: BlastOptions) -> int:
    """The query batch size of a search that aligns given lists. blastn's app sizes its batches by the
    extensions the last batch made (CBatchSizeMixer), and a search that scans nothing makes none, so
    BATCH_SIZE fixes them: a quarter of its query chunk, well under the batches of up to a chunk that
    the app makes itself (and under the size at which a batch is split into chunks). Its reports do not
    depend on how its queries are batched: each query's lists are aligned on their own, which the
    conformance tests check against BLAST+ for every batch its pieces make."""
    residues = batch_residues(program, options)
    if residues is not None:
        return residues
    task = options.get("task") or "megablast"
    return _CHUNK_RESIDUES.get(task, 1_000_000) // 4


def split_query(program: str, options: BlastOptions, lengths: Sequence[int]) -> int | None:
    """The first query that BLAST+ may split into chunks (SplitQuery_CalculateNumChunks), or None.

    A batch is split when its residues reach two chunks less their overlap; the chunks' lists are merged
    in a way the engine does not reproduce, so such a search is refused up front. tblastx (ungapped) and
    blastx batches of several queries are never split. blastn's batches are not known in advance: a query
    of half a chunk or more is taken as a risk. The runtime shim record is the last check."""
    if program == "tblastx" or options.has("ungapped"):
        return None
    task = options.get("task") or ("megablast" if program == "blastn" else program)
    chunk = _CHUNK_RESIDUES.get(task, 1_000_000 if program == "blastn" else _BATCH_RESIDUES[program])
    overlap = 297 if program == "blastx" else 100
    bound = 2 * (chunk - overlap) - 1000  # margin for the separators between concatenated queries
    if program == "blastn":
        return next((i for i, n in enumerate(lengths) if 2 * n >= chunk), None)
    residues = batch_residues(program, options) or 1
    for batch in query_batches(lengths, residues):
        if program == "blastx" and len(batch) > 1:
            continue
        if sum(lengths[i] for i in batch) >= bound:
            return max(batch, key=lambda i: lengths[i])
    return None


def query_batches(lengths: Sequence[int], residues: int) -> list[range]:
    """BLAST+'s own batches of a query file: queries are added while fewer than `residues` are held."""
    batches: list[range] = []
    start = 0
    while start < len(lengths):
        held, stop = 0, start
        while stop < len(lengths) and held < residues:
            held += lengths[stop]
            stop += 1
        batches.append(range(start, stop))
        start = stop
    return batches


def composition_adjusted(options: BlastOptions, program: str) -> bool:
    """Whether the traceback adjusts for composition (blastp, blastx, tblastn unless -comp_based_stats 0):
    only then can it skip subjects once a batch's hit lists are full (BlastCompo_EarlyTermination)."""
    cbs = options.get("comp_based_stats")
    return program in ("blastp", "blastx", "tblastn") and (cbs is None or cbs.upper() not in ("0", "F"))


def expected_limit(options: BlastOptions, program: str) -> int:
    """N as BLAST+ 2.12 computes it (GetPrelimHitlistSize), to check the shim reads the right fields."""
    hitlist = options.hitlist_size()
    if composition_adjusted(options, program):
        return 1050 if hitlist <= 500 else 2 * hitlist + 50
    if options.has("ungapped") or program == "tblastx":
        return hitlist
    return min(max(2 * hitlist, 10), hitlist + 50)


def read_dump(
    data: bytes, lengths: Sequence[int], residues: int | None, gids: Sequence[int]
) -> list[PrelimList | None]:
    """Per query of the search (None: no candidate), from the shim's records.

    `lengths` are the search's query lengths. With `residues` (programs whose batches are modelled) the
    batches are recomputed and must match the records; blastn sizes its batches as it goes
    (CBatchSizeMixer), so there the records need only cover the queries in order. `gids` maps the
    searched database's ordinal ids to global ids. Anything unexpected raises BlastError: a BLAST+ whose
    internals differ from 2.12's must never be trusted silently.
    """
    expected = query_batches(lengths, residues) if residues is not None else None
    result: list[PrelimList | None] = [None] * len(lengths)
    at = start = batches = 0
    while at < len(data):
        try:
            magic, n_queries, n_lists = _BATCH.unpack_from(data, at)
        except struct.error:
            raise _unexpected("a truncated record") from None
        at += _BATCH.size
        if magic == _SPLIT_MAGIC:
            raise BlastError(
                "BLAST+ split a long query into chunks, which --strategy fragments does not reproduce "
                "exactly: use --strategy queries"
            )
        batch = range(start, start + n_queries)
        if expected is not None and (batches >= len(expected) or expected[batches] != batch):
            raise _unexpected(f"a batch of {n_queries} queries where BLAST+ 2.12 makes another")
        if magic == _SKIPPED_MAGIC and n_lists == 0 and 0 < n_queries and batch.stop <= len(lengths):
            magic = _MAGIC  # its queries have no candidate, as in BLAST+'s own report
        if magic != _MAGIC or n_queries <= 0 or batch.stop > len(lengths) or not 0 <= n_lists <= n_queries:
            raise _unexpected(f"a batch of {n_queries} queries at query {start + 1}")
        for _ in range(n_lists):
            if len(data) - at < _LIST.size:
                raise _unexpected("a truncated query list")
            index, limit, count = _LIST.unpack_from(data, at)
            at += _LIST.size
            if not 0 <= index < n_queries or limit <= 0 or not 0 <= count <= limit:
                raise _unexpected("a malformed query list")
            if len(data) - at < count * _ENTRY.size:
                raise _unexpected("a truncated query list")
            entries = list(_ENTRY.iter_unpack(data[at : at + count * _ENTRY.size]))
            at += count * _ENTRY.size
            if len(entries) != count:
                raise _unexpected("a truncated query list")
            oids = [oid for oid, _, _ in entries]
            if (
                entries
                and (min(oids) < 0 or max(oids) >= len(gids))
                or not all(e >= 0 for _, _, e in entries)
            ):
                raise _unexpected("a subject outside the database")  # (or an e-value below 0, or NaN)
            candidates = tuple([Candidate(evalue, score, gids[oid]) for oid, score, evalue in entries])
            result[batch.start + index] = PrelimList(limit, candidates)
        start, batches = batch.stop, batches + 1
    if start != len(lengths):
        raise _unexpected(f"lists for {start} of {len(lengths)} queries")
    return result


def _unexpected(what: str) -> BlastError:
    return BlastError(
        f"BLAST+'s preliminary hit list could not be read ({what}); this BLAST+ is not the 2.12 the "
        "fragments strategy is built for: use --strategy queries"
    )
