"""The BLAST codec: ship subject ids, regenerate the exact BLAST+ report from the storage site's replica.

Compute side: a unit is a run of consecutive queries with their merged subject ids; the payload is the id
container of `idcodec` (sorted, delta-coded varints, zstd, checksummed). Storage side: each regeneration
piece of the unit is searched again by BLAST+ against its subjects only (`blast.run.regenerate`) and the
pieces are stitched in order at the end (`output.stitch`), exactly as the compute site would have done.
Everything a job's setup says comes off the network, so it is validated before anything runs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from paramedic.blast.options import BlastOptions
from paramedic.blast.programs import PROGRAMS
from paramedic.blast.run import NEGATIVE, POSITIVE, Database, Subset, regenerate
from paramedic.errors import ParamedicError
from paramedic.output.stitch import Stitcher, can_stitch
from paramedic.ship.codecs import (
    BinaryWriter,
    Codec,
    JobSpec,
    Segment,
    pack_json,
    piece_ranges,
    register_codec,
    sequence_of_ranges,
    unpack_json,
    validate_queries,
)
from paramedic.ship.idcodec import IdHistory, MetadataFormatError, decode_subjects, encode_subjects
from paramedic.ship.query_file import StoredQueries
from paramedic.ship.subset_wire import decode_subset, encode_subset
from paramedic.ship.wire import ProtocolError, field_int, field_str

MAX_QUERIES = 1_000_000
MAX_SETUP_BYTES = 64 * 2**20  # a job's queries inflated, unless the site says otherwise (serve --max-setup)
# Options a compute site may not set at the storage site: the site chooses its own files.
SITE_REFUSED_OPTIONS = (
    "query",
    "db",
    "out",
    "window_masker_db",
    "filtering_db",
    "in_pssm",
    "out_pssm",
    "out_ascii_pssm",
    "in_msa",
    "index_name",
)
# One file per query (13, 14) cannot be shipped as one file.
UNSHIPPABLE_OUTFMTS = (13, 14)


@dataclass(frozen=True)
class BlastJobSetup:
    """What the storage site needs to regenerate a job's report (sent once, at job start)."""

    program: str
    options: list[str]  # BLAST+ options without -query, -db, -out
    db_arg: str  # the -db string as the user gave it (outfmt 5 and 7 print it)
    manifest_sha256: str
    pieces: tuple[range, ...]
    queries: list[tuple[str, str]]
    # A restricted search's subset, resolved at the compute site (paramedic.ship.subset_wire): the site
    # regenerates under it, with its statistics, and reads none of the user's list files
    subset: Subset | None = None

    def encode(self) -> tuple[dict[str, Any], bytes]:
        header: dict[str, Any] = {
            "program": self.program,
            "options": self.options,
            "db_arg": self.db_arg,
            "manifest_sha256": self.manifest_sha256,
            "n_queries": len(self.queries),
            "pieces": sequence_of_ranges(self.pieces),
        }
        queries = pack_json([list(q) for q in self.queries])
        if self.subset is None:
            return header, queries
        header["subset"], masks = encode_subset(self.subset)
        return header, masks + queries  # the masks first, their size in the header


@dataclass(frozen=True)
class BlastSiteContext:
    program: str
    options: BlastOptions
    db: Database
    queries: Sequence[tuple[str, str]]  # StoredQueries at the site
    pieces: tuple[range, ...]
    workdir: Path
    history: IdHistory = dataclasses.field(default_factory=IdHistory)  # the job's ids unpacked so far


def _return_freed_memory() -> None:
    """Give the parsed queries' freed heap back to the system (glibc keeps it otherwise: a site holding a
    job for hours would keep the peak of its setup's parse)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _private_file(path: Path) -> Path:
    """`path` made empty, mode 0600, before anything is written to it: a compute site's queries are its
    own, and a file opened for writing keeps the mode it was made with (they were 0644: issue 41)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    return path


def _restriction(options: BlastOptions) -> str | None:
    """The positive restriction a setup names (regenerated under the subset it carries), or None; a
    negative one is refused: only BLAST+ run on the whole database applies it (--strategy queries), which
    makes no metadata."""
    negative = [name for name in NEGATIVE if options.has(name)]
    if negative:
        raise ProtocolError(f"setup: -{negative[0]} is applied by BLAST+ on the whole database, not here")
    positive = [name for name in POSITIVE if options.has(name)]
    if len(positive) > 1:
        raise ProtocolError(f"setup: -{positive[0]} and -{positive[1]} together")
    return positive[0] if positive else None


@register_codec
class BlastMetadataCodec(Codec):
    name = "blast-metadata"
    layout = "pieces"
    ship_mode = None  # its `--ship` mode is the application's (ship.apps: "metadata" of blast)
    ordered = True  # a query's ids are coded against earlier queries' ids (idcodec.IdHistory)

    def __init__(self) -> None:
        self.history = IdHistory()  # compute site: the job's ids encoded so far

    def job_setup(self, job: JobSpec) -> tuple[dict[str, Any], bytes]:
        return BlastJobSetup(
            job.program, job.options, job.db_arg, job.manifest_sha256, job.pieces, job.queries, job.subset
        ).encode()

    def encode(self, unit: tuple[int, Sequence[Sequence[int]], int]) -> tuple[dict[str, Any], bytes]:
        first_query, subjects, nseq = unit
        payload = encode_subjects(first_query, [sorted(set(s)) for s in subjects], nseq, self.history)
        return {"first_query": first_query, "n_queries": len(subjects)}, payload

    def prepare(self, setup: dict[str, Any], payload: bytes, site: Any) -> BlastSiteContext:
        program = field_str(setup, "program", 16)
        if program not in PROGRAMS:
            raise ProtocolError(f"unknown program {program!r}")
        argv = setup.get("options")
        if not isinstance(argv, list) or len(argv) > 200 or not all(isinstance(a, str) for a in argv):
            raise ProtocolError("setup: options must be a list of strings")
        try:
            options = BlastOptions.parse(program, argv)
            outfmt = options.outfmt_number()  # a UsageError for "-outfmt abc": a refusal, not a bug
        except ParamedicError as exc:
            raise ProtocolError(f"setup: {exc}") from exc
        refused = [name for name in SITE_REFUSED_OPTIONS if options.has(name)]
        if refused:
            raise ProtocolError(f"setup: option -{refused[0]} is not accepted by the storage site")
        if outfmt in UNSHIPPABLE_OUTFMTS:
            raise ProtocolError(f"setup: -outfmt {outfmt} writes one file per query")
        restricted = _restriction(options)
        db_arg = field_str(setup, "db_arg", 1024)
        path = PurePosixPath(db_arg)
        if not db_arg or "\0" in db_arg or "\n" in db_arg or ".." in path.parts or db_arg.startswith("-"):
            raise ProtocolError("setup: bad -db string")
        if field_str(setup, "manifest_sha256", 64) != site.manifest_sha256:
            raise ProtocolError(
                "the storage site's replica is not the compute site's database (manifest checksums differ)"
            )
        if PROGRAMS[program].db_type != site.database.dbtype:
            raise ProtocolError(f"{program} cannot search the replica ({site.database.dbtype})")
        subset = None
        if restricted is not None or "subset" in setup:
            if restricted is None:
                raise ProtocolError("setup: a subset without -seqidlist, -taxids or -taxidlist")
            if "subset" not in setup:
                raise ProtocolError(f"setup: -{restricted} without its resolved subset")
            spill = site.workdir / f"subset-{uuid.uuid4().hex}.masks"  # mapped, not held in memory
            subset, payload = decode_subset(setup["subset"], payload, site.database, spill)
        n_queries = field_int(setup, "n_queries", 1, MAX_QUERIES)
        pieces = piece_ranges(setup.get("pieces"), n_queries)
        if len(pieces) > 1 and not can_stitch(options.outfmt()):
            raise ProtocolError("setup: this output format is regenerated as one piece")
        limit = getattr(site, "max_setup_bytes", MAX_SETUP_BYTES)
        # [[header, sequence], ...]: n arrays and 2n - 1 commas in one array, whatever the queries hold
        parsed = validate_queries(unpack_json(payload, limit, max_values=3 * n_queries), n_queries)
        if len(parsed) != n_queries:
            raise ProtocolError("setup: query count differs from n_queries")
        # on disk for the job's life: memory holds one offset per query, not the queries
        queries = StoredQueries(_private_file(site.workdir / f"queries-{uuid.uuid4().hex}.txt"), parsed)
        del parsed
        _return_freed_memory()
        # under a restriction the subset's masks and statistics replace its options (run._applied)
        database = dataclasses.replace(site.database, arg=db_arg, subset=subset)
        return BlastSiteContext(program, options, database, queries, pieces, site.workdir)

    def unpack(
        self, header: dict[str, Any], payload: bytes, context: BlastSiteContext
    ) -> tuple[int, list[list[int]]]:
        try:
            return decode_subjects(payload, context.db.nseq, context.history)
        except MetadataFormatError as exc:
            raise ProtocolError(f"metadata: {exc}") from exc

    def decode(
        self, header: dict[str, Any], unpacked: tuple[int, list[list[int]]], context: BlastSiteContext
    ) -> list[Segment]:
        first, subjects = unpacked
        stop = first + len(subjects)
        if stop > len(context.queries):
            raise ProtocolError("metadata: queries beyond the job")
        indices = [i for i, p in enumerate(context.pieces) if first <= p.start and p.stop <= stop]
        if (
            not indices
            or context.pieces[indices[0]].start != first
            or context.pieces[indices[-1]].stop != stop
        ):
            raise ProtocolError("metadata: a chunk must cover whole regeneration pieces")
        segments = []
        for index in indices:
            piece = context.pieces[index]
            data, _ = regenerate(
                context.program,
                context.options,
                context.db,
                context.queries[piece.start : piece.stop],
                subjects[piece.start - first : piece.stop - first],
                context.workdir,
            )
            segments.append(Segment(index, data))
        return segments

    def assemble(
        self, pieces: Iterator[tuple[int, bytes]], context: BlastSiteContext, out: BinaryWriter
    ) -> None:
        stitcher = Stitcher(context.options.outfmt(), len(context.pieces))
        total = len(context.queries)
        for index, data in pieces:
            out.write(stitcher.piece(index, data, context.pieces[index].start, total))
