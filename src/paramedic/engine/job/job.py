"""Everything a search job needs, checked before any rank starts work.

`prepare_job` turns typed settings into a Job: queries read and validated, database resolved as BLAST+
would resolve -db and checked against its manifest, options checked, output path tested for writability.
Every problem a user can cause surfaces here as one clear error, before the parallel part begins.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal

from paramedic.blast.options import BlastOptions, check_values
from paramedic.blast.prelim import (
    batch_residues,
    composition_adjusted,
    expected_limit,
    query_batches,
    split_query,
)
from paramedic.blast.programs import PROGRAMS, Program
from paramedic.blast.run import NEGATIVE, Database
from paramedic.blast.tools import startup_seconds, taxid_matching
from paramedic.db.fasta import read_fasta
from paramedic.db.locate import resolve_database
from paramedic.db.manifest import Manifest, Stamp, Verification
from paramedic.db.subset import resolve_subset, restriction, with_absolute_lists
from paramedic.durable import refused_target, stream_target
from paramedic.engine.core.costs import Shape
from paramedic.engine.core.plan import DEFAULT_REGEN_GROUP, PlanInputs, make_plan
from paramedic.engine.core.scheduler import Plan
from paramedic.engine.core.settings import SearchSettings, StageSettings
from paramedic.engine.core.strategy import (
    StrategyChoice,
    WorkerMemory,
    blast_refusal,
    choose_strategy,
    local_workers,
    query_balance,
    weigh,
)
from paramedic.engine.rank.journal import journal_path
from paramedic.engine.rank.metadata import SearchIdentity, load_metadata, metadata_key
from paramedic.errors import InputError, OutputError, UsageError
from paramedic.output.stitch import can_stitch
from paramedic.output.strategies import output_strategy

if TYPE_CHECKING:
    from paramedic.ship.destination import ShipSettings

COMPRESSED_MODE = "compressed"  # the --ship mode that sends the output itself, zstd-compressed


@dataclass(frozen=True)
class Target:
    """Where a job's results go: the report (a local file, standard output, or a storage site), who
    writes it, the run record, the journal a killed search resumes from, and the metadata file."""

    out: Path | None  # the local report; None: standard output, or the storage site (`ship`)
    record: Path | None  # the run record
    ship: ShipSettings | None = None  # --site: the report goes to a storage site
    # Where finished work is kept so that the search resumes after a kill (paramedic.engine.rank.journal);
    # None when the report goes to standard output or --no-journal
    journal: Path | None = None
    restart: bool = False  # --restart: an earlier run's journal is discarded
    save_metadata: Path | None = None  # --metadata FILE
    output_strategy: str = "master"  # who writes the report file (paramedic.output.strategies)

    def describe(self) -> str:
        """Where the report goes, as the run record says it."""
        if self.ship is not None:
            return f"{self.ship.site}/{self.ship.out}"
        return str(self.out) if self.out else "-"


def _target(settings: SearchSettings, options: BlastOptions) -> Target:
    """The job's target, its files checked writable now (not after the search)."""
    cwd = settings.cwd
    if settings.ship is not None:
        # -out names the file under the storage site's root; the run record stays here, at the same
        # relative path (one record per output path, as for a local -out)
        from paramedic.ship.destination import check_shippable

        check_shippable(options)
        out_path = None
        record: Path | None = settings.record or cwd / (settings.ship.out + ".run.json")
        journal = journal_path(cwd / settings.ship.out) if settings.journal else None
    else:
        out = options.get("out")
        out_path = _resolve(cwd, out) if out and out != "-" else None
        if out_path is not None:
            check_writable(out_path)
        # a stream (/dev/null, a FIFO, /dev/stdout) is written through, as standard output is: no journal
        # or record beside it (/dev/null.run.json), and no worker writes into it at an offset
        file_path = None if out_path is None or stream_target(out_path) else out_path
        if out_path is not None and file_path is None:
            _check_stream_writer(out_path, settings.output_strategy)
        record = settings.record or (file_path.with_name(file_path.name + ".run.json") if file_path else None)
        journal = journal_path(file_path) if file_path and settings.journal else None
    save_path = _resolve(cwd, str(settings.save_metadata)) if settings.save_metadata else None
    if save_path is not None:
        check_writable(save_path)
        metadata_key(create=True, option="--metadata")  # a key that cannot be made fails now, not at the end
    return Target(
        out=out_path,
        record=record,
        ship=settings.ship,
        journal=journal,
        restart=settings.restart,
        save_metadata=save_path,
        output_strategy=settings.output_strategy,
    )


@dataclass(frozen=True)
class Job:
    program: str
    options: BlastOptions
    db: Database
    queries: list[tuple[str, str]]
    target: Target
    plan_inputs: PlanInputs
    quiet: bool
    manifest_checksum: str
    identity: SearchIdentity
    preloaded: list[list[int]] | None  # metadata loaded with --from-metadata
    # Fragment searches keep their alignments and reports are written from them (paramedic.blast.render)
    keep_alignments: bool = False
    partition_size: int | None = None  # --partition-size (paramedic.engine.runtime.partitions)
    replica_group_size: int | None = None  # --replica-group-size (paramedic.engine.core.scheduler)
    # Which strategy, and why (paramedic.engine.core.strategy; the run record's strategy_reason)
    strategy: StrategyChoice | None = None
    # How fragment searches align (--traceback) and why, in numbers (the run record's traceback_reason)
    traceback_reason: str | None = None
    stage: StageSettings | None = None  # --stage: fragments searched from a node-local copy
    # With --stage, per rank of the job: its node's name and the fragments already staged there, as
    # every rank reported at start (paramedic.engine.rank.staging; set in paramedic.engine.runtime.roles)
    stage_nodes: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    # prepare_job(digest="later"): waits for the database's digest and raises its refusal. The local
    # runner calls it before any result is taken (paramedic.engine.core.master), so the digest overlaps
    # the first searches and still comes before any byte of output.
    verified: Verification | None = field(default=None, compare=False, repr=False)
    # The -db volumes' files as they were digested (paramedic.db.manifest.volume_stamps)
    volume_stamps: tuple[Stamp, ...] = ()
    # A restricted search, as the run record says it (`restriction_record`); None: not restricted
    restriction: dict[str, object] | None = None
    # The first job's digest spread over the job's nodes (paramedic.db.spread): the run record's figures
    first_digest: dict[str, object] | None = None

    def plan(self, workers: int, one_machine: bool = False) -> Plan:
        """The job's plan for `workers` (`one_machine`: worker threads of this process, equal workers)."""
        return self.plan_inputs.plan(workers, one_machine)

    def for_workers(self) -> Job:
        """The job as a worker rank gets it: without the queries (each task brings its own,
        paramedic.engine.runtime.ranks `RankTransport.send`) or the metadata loaded for the master, so that no
        rank holds every query but rank 0 and the partition masters."""
        return replace(self, queries=[], preloaded=None, verified=None)

    def journal_identity(self) -> dict[str, object]:
        """What the journaled work depends on: a journal made with anything else is not continued."""
        return {
            "program": self.program,
            "options": self.options.without("query", "db", "out").argv(),
            "database": self.manifest_checksum,
            "queries": self.identity.queries_sha256,
            "strategy": "queries" if self.plan_inputs.query_segmentation else "fragments",
            "alignments": self.keep_alignments,
            "traceback_once": self.plan_inputs.traceback_once,
            "from_metadata": self.preloaded is not None,
        }


def prepare_job(
    settings: SearchSettings,
    workers: int | None = None,
    digest: Literal["now", "later"] = "now",
    memory: WorkerMemory | None = None,  # a worker's on the job's tightest node (strategy.job_memory)
    early: Verification | None = None,  # the database's digest, started by the caller
    one_node: bool = False,  # every worker on this node: one BLAST+ run is a candidate (issue 44)
) -> Job:
    """The checked job; `workers`: how many worker ranks it will have (the launcher's; default: one
    per local core, as `paramedic search` starts them), which `--strategy auto` weighs. With
    `digest="later"` the database's digest is still running when the job is returned: the caller must
    call `Job.verified` before it takes any result.

    In three phases, each computed once and handed on typed: the request (queries, database, options,
    checked: `Request`), the strategy (`Choice`), the plan's inputs (`PlanInputs`)."""
    request = _request(settings, early)
    if workers is None:
        workers = local_workers(os.environ)[0]
    choice = _choose(settings, request, workers, memory, one_node)
    settings, strategy, db, manifest = choice.settings, choice.strategy, request.db, request.manifest
    query_segmentation = strategy.strategy == "queries"
    verified = request.verified
    stage = None if settings.stage is None else check_stage(settings.stage, manifest, db.arg)
    if request.repaired and stage is not None and len(stage.dropped_mirrors) == len(stage.mirrors):
        verified = Verification(db.directory, manifest)  # no mirror left to fetch a damaged fragment from
    if not query_segmentation and not strategy.whole_blast and settings.from_metadata is None:
        from paramedic.blast.prelim_check import check_shim  # the engine's searches only

        check_shim()  # the shim that reads BLAST+'s preliminary list: built and checked now, or refused now
    plan_inputs, traceback_reason = _plan_inputs(settings, request, choice)
    identity = SearchIdentity.of(request.program.name, request.options, manifest.checksum(), request.queries)
    preloaded = None
    if settings.from_metadata is not None:
        preloaded = load_metadata(
            _resolve(settings.cwd, str(settings.from_metadata)), identity, len(request.queries), db.nseq
        )
    if digest == "now":
        verified()  # every job digests its database: sizes and times are not a digest
    return Job(
        program=request.program.name,
        options=request.options,
        db=db,
        queries=request.queries,
        # --ship auto may have become compressed (`_ship_data_when_inexact`) since the target was made
        target=replace(request.target, ship=settings.ship),
        plan_inputs=plan_inputs,
        quiet=settings.quiet,
        manifest_checksum=manifest.checksum(),
        volume_stamps=request.verified.stamps,
        identity=identity,
        preloaded=preloaded,
        keep_alignments=plan_inputs.keep_alignments,
        partition_size=settings.partition_size,
        replica_group_size=settings.replica_group_size,
        strategy=strategy,
        traceback_reason=None if query_segmentation or strategy.whole_blast else traceback_reason,
        stage=stage,
        verified=verified if digest == "later" else None,
        restriction=restriction_record(request.program.name, request.options, db, request.subset_seconds),
    )


@dataclass(frozen=True)
class Request:
    """prepare_job's first phase: what the command asks, read and checked."""

    program: Program
    options: BlastOptions
    queries: list[tuple[str, str]]
    lengths: list[int]  # each query's residues
    blast_batches: list[range]  # BLAST+'s own batches of the query file ([] for blastn): cut once here
    db: Database  # with its positive restriction resolved (`_restricted`)
    manifest: Manifest
    verified: Verification  # the database's digest, started (its stamps: checked again at the end)
    repaired: bool  # --stage with mirrors: each copied fragment is verified, the digest skips them
    target: Target
    inexact: str | None  # why the fragments strategy cannot give BLAST+'s own output (None: it can)
    subset_seconds: float  # resolving the restriction's subset


@dataclass(frozen=True)
class Choice:
    """prepare_job's second phase: how the work is split, and the settings it leaves."""

    settings: SearchSettings  # --ship as the job ships (a restricted or inexact job ships data)
    strategy: StrategyChoice
    startup_seconds: float  # BLAST+'s start, measured here once


def _request(settings: SearchSettings, early: Verification | None) -> Request:
    """The queries read, the database resolved as BLAST+ resolves -db and its digest started, the options
    checked (by BLAST+ too), BLAST+'s query batches cut, and the restriction resolved."""
    program = PROGRAMS.get(settings.program)
    if program is None:
        raise UsageError(f"unknown program {settings.program!r}: choose one of {', '.join(PROGRAMS)}")
    options = with_absolute_lists(BlastOptions.parse(program.name, settings.blast_args), settings.cwd)
    if not options.get("db"):
        raise UsageError("-db is required")
    if options.get("query") == "":
        raise UsageError("-query needs a file name (- or no -query: standard input)")
    check_outfmt(program.name, options)
    cwd = settings.cwd
    queries = read_queries(cwd, options.get("query"), program)
    db, manifest = resolve_database(options.get("db") or "", cwd, digest=False, dbtype=program.db_type)
    # --stage with mirrors: fragments are copied and each copy verified, from -db or a mirror (a damaged
    # fragment of -db is fetched from a mirror: issue 41, item 9), so the job digests the whole volume only
    repaired = settings.stage is not None and bool(settings.stage.mirrors)
    if early is not None and early.of(db.directory, manifest) and not repaired:
        verified = early  # started before the engine was imported (paramedic.engine.runtime.launch)
    else:  # while the rest is checked
        verified = Verification(db.directory, manifest, fragments=not repaired)
    if db.dbtype != program.db_type:
        kind = {"prot": "protein", "nucl": "nucleotide"}
        raise UsageError(
            f"{program.name} searches a {kind[program.db_type]} database; {db.arg} is {kind[db.dbtype]}"
        )
    # BLAST+ checks the values (skipped if done, or passed before for this database)
    check_values(program.name, options, db.checked(), manifest.checksum())
    target = _target(settings, options)
    lengths = [len(s) for _, s in queries]
    inexact = fragments_inexact(settings.blast_args) or _split_reason(program.name, options, lengths, queries)
    residues = batch_residues(program.name, options)
    blast_batches = query_batches(lengths, residues) if residues else []
    if db.misnumbered and settings.traceback != "once":
        inexact = inexact or (
            f"cannot find the subjects of {db.arg} by their ids: its volumes are numbered past 99 (db.99, "
            "db.100), which BLAST+ reads in another order than its id index was written in; use --traceback "
            "once or --strategy queries"
        )
    subset_started = time.perf_counter()
    db, unrestricted = _restricted(settings, options, db, inexact)
    return Request(
        program=program,
        options=options,
        queries=queries,
        lengths=lengths,
        blast_batches=blast_batches,
        db=db,
        manifest=manifest,
        verified=verified,
        repaired=repaired,
        target=target,
        inexact=inexact or unrestricted,
        subset_seconds=time.perf_counter() - subset_started,
    )


def _choose(
    settings: SearchSettings, request: Request, workers: int, memory: WorkerMemory | None, one_node: bool
) -> Choice:
    """The strategy: fragments or queries by the rule (`choose_strategy`), and with `--strategy auto` the
    cost model's weighing of one BLAST+ run against the engine's plan."""
    program, options, lengths, db = request.program.name, request.options, request.lengths, request.db
    startup = startup_seconds(program)
    segments = make_plan(
        program=program,
        query_lengths=lengths,
        fragment_residues=[f.length for f in request.manifest.fragments],
        workers=workers,
        hitlist_size=options.hitlist_size(),
        startup_seconds=startup,
        stitchable=can_stitch(options.outfmt()),
        batch=settings.batch,
        query_segmentation=True,
        blast_batches=request.blast_batches,
    )
    balance = query_balance([sum(lengths[q] for q in p) for p in segments.pieces], workers)
    settings = _ship_data_when_inexact(_ship_restricted(settings, options, db), request.inexact)
    strategy = choose_strategy(settings, db, request.manifest, request.inexact, balance, memory)
    if settings.strategy == "auto":  # the cost model weighs one BLAST+ run against the engine's plan
        shape = Shape(
            program=program,
            query_residues=sum(lengths),
            database_residues=db.subset.length if db.subset is not None else db.length,
            cores=workers,
            blast_batches=tuple(sum(lengths[q] for q in b) for b in request.blast_batches),
            outfmt=options.outfmt_number(),
            startup_seconds=startup,
            queries=len(request.queries),
            queries_tasks=len(segments.pieces),
            queries_balance=balance.ratio,
            fragment_searches=2 * workers,
            pairwise=options.outfmt_number() not in (6, 7, 10),
        )
        refused = blast_refusal(
            settings,
            one_node,
            request.target.journal,
            strategy.database_bytes,
            strategy.memory,
            options.outfmt_number(),
        )
        strategy = weigh(strategy, shape, refused)
    return Choice(settings=settings, strategy=strategy, startup_seconds=startup)


def _plan_inputs(settings: SearchSettings, request: Request, choice: Choice) -> tuple[PlanInputs, str]:
    """What the plan is made from at run time, with the traceback's choice and why it was made."""
    program, options, db = request.program.name, request.options, request.db
    query_segmentation = choice.strategy.strategy == "queries"
    ships_metadata = settings.ship is not None and _ships_pieces(settings.ship.mode)
    traceback_once, traceback_reason = choose_traceback(
        settings,
        program,
        options,
        request.lengths,
        request.blast_batches,
        db.nseq,
        metadata=ships_metadata
        or settings.from_metadata is not None
        or settings.save_metadata is not None
        or (settings.ship is not None and settings.ship.mode == "auto"),  # auto may ship metadata
    )
    traceback_once = traceback_once and not query_segmentation
    keep_alignments = (
        not query_segmentation
        and not choice.strategy.whole_blast  # one BLAST+ run writes its own report
        and not traceback_once
        and not ships_metadata
        and settings.from_metadata is None
        and _renders(program, options, db)
    )
    inputs = PlanInputs(
        program=program,
        query_lengths=request.lengths,
        fragment_residues=[f.length for f in request.manifest.fragments],
        hitlist_size=options.hitlist_size(),
        startup_seconds=choice.startup_seconds,
        stitchable=can_stitch(options.outfmt()),
        batch=settings.batch,
        piece_queries=settings.piece_queries,
        query_segmentation=query_segmentation,
        keep_alignments=keep_alignments,
        blast_batches=request.blast_batches,
        search_filled_again=composition_adjusted(options, program) or options.has("qcov_hsp_perc"),
        traceback_once=traceback_once,
        group_fragments=settings.fragment_groups == "auto"
        and settings.stage is None  # a staged fragment is copied and searched on its own
        and settings.replica_group_size is None  # workers keep to their share of the fragments
        and choice.strategy.fits_each_worker(),
    )
    return inputs, traceback_reason


def _renders(program: str, options: BlastOptions, db: Database) -> bool:
    """Whether blast_formatter can write the report from the fragment searches' alignments, with the
    subjects' own ids at hand (imported here: the engine's plans only, not one BLAST+ run's start)."""
    from paramedic.blast.render import can_render
    from paramedic.db.seqids import SeqIdTable

    return can_render(program, options) and (db.in_place or SeqIdTable.exists(db.directory))


def _restricted(
    settings: SearchSettings, options: BlastOptions, db: Database, inexact: str | None
) -> tuple[Database, str | None]:
    """The database with the job's positive restriction resolved, once, for every fragment search
    (paramedic.db.subset), and why the fragments strategy cannot honour it (None: it can). Not resolved
    when only whole-database searches will run: BLAST+ applies it there itself."""
    name = _any_restriction(options)
    if name is not None and db.misnumbered:
        raise UsageError(
            f"-{name}: {db.arg} has volumes numbered past 99 (db.99, db.100), which BLAST+ reads in another "
            "order than its id index was written in, so BLAST+ itself finds some ids wrongly; rebuild it in "
            "fewer than 100 volumes (a larger makeblastdb -max_file_sz)"
        )
    if restriction(options) is None or settings.strategy == "queries" or inexact:
        return db, None
    if not db.in_place:
        return db, (
            f"applies -{name} only to a database searched in place, not to one `paramedic format` made; "
            "use --strategy queries"
        )
    subset = resolve_subset(db, options, settings.cwd)
    if subset.nseq == 0:  # BLAST+ warns once a query and writes a report without hits
        return db, f"has nothing to search: -{name} selects no sequence of {db.arg}; use --strategy queries"
    return replace(db, subset=subset), None


def restriction_record(
    program: str, options: BlastOptions, db: Database, seconds: float
) -> dict[str, object] | None:
    """The run record's `restriction`: the option given; with taxids, how the installed BLAST+ matches
    them (issue 43: 2.12 matches the stored taxids exactly, 2.15+ expands them to descendant taxa through
    taxonomy4blast.sqlite3); and the subset, when resolved once for the fragment searches (its size and
    the seconds its resolution took)."""
    name = _any_restriction(options)
    if name is None:
        return None
    record: dict[str, object] = {"option": f"-{name}"}
    if "taxid" in name:
        record.update(taxid_matching(program, options.has("no_taxid_expansion")))
    if db.subset is not None:
        record["subset"] = {
            "sequences": db.subset.nseq,
            "letters": db.subset.length,
            "resolved_seconds": round(seconds, 3),
        }
    return record


def read_queries(cwd: Path, query: str | None, program: Program) -> list[tuple[str, str]]:
    """The queries, read once, as BLAST+ takes -query: a file, or standard input for `-` or no -query.
    Standard input, a pipe (`-query <(gunzip -c q.gz)`, /dev/fd/63) or a device is copied once into a
    temporary file of the job's own and that is read: a FASTA file is opened twice (its gzip magic, then
    its text), which a pipe does not survive."""
    if query is None or query == "-":
        if sys.stdin is None:  # started with descriptor 0 closed
            raise InputError("standard input: closed (give -query FILE)")
        return _read_copy(sys.stdin.buffer, "standard input", program)
    path = _resolve(cwd, query)
    if not _read_once(path):
        return _read_fasta(path, program)
    try:
        with open(path, "rb") as source:
            return _read_copy(source, str(path), program)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc


def _read_once(path: Path) -> bool:
    """`path` names something that can be read once only (a pipe, a device), not a file or a directory."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False  # read_fasta says what is wrong with it
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _read_copy(source: BinaryIO, name: str, program: Program) -> list[tuple[str, str]]:
    """`source` copied into the job's temporary directory (TMPDIR), read, and removed; a problem in it
    is said under `name` (standard input, the user's path), not the copy's."""
    fd, copy = tempfile.mkstemp(prefix="query-", suffix=".fasta")
    try:
        with os.fdopen(fd, "wb") as fh:
            shutil.copyfileobj(source, fh, 1 << 20)
        try:
            return _read_fasta(Path(copy), program)
        except InputError as exc:
            raise InputError(str(exc).replace(copy, name)) from None
    finally:
        Path(copy).unlink(missing_ok=True)


def _read_fasta(path: Path, program: Program) -> list[tuple[str, str]]:
    return [  # a guess of the molecule type is said, never a refusal: BLAST+ searches such a query
        (r.header, r.sequence) for r in read_fasta(path, program.query_type, _warn, program.name)
    ]


def _any_restriction(options: BlastOptions) -> str | None:
    """The restriction option given, positive or negative (None: none)."""
    return restriction(options) or next((n for n in NEGATIVE if options.has(n)), None)


def _ship_restricted(settings: SearchSettings, options: BlastOptions, db: Database) -> SearchSettings:
    """Metadata under a restriction carries the resolved subset, under which the storage site regenerates
    (paramedic.ship.subset_wire). Two cannot: a negative restriction, which only BLAST+ run on the whole
    database applies (--strategy queries: no metadata), and a subset whose masks are too large to ship.
    For those --ship auto ships the output, compressed, and --ship metadata is refused in one line."""
    ship = settings.ship
    if ship is None or not (ship.mode == "auto" or _ships_pieces(ship.mode)):
        return settings
    negative = next((n for n in NEGATIVE if options.has(n)), None)
    why = None
    if negative is not None:
        why = (
            f"-{negative} is applied by BLAST+ searching the whole database (--strategy queries), which "
            "makes no metadata"
        )
    elif db.subset is not None:
        from paramedic.ship.subset_wire import MAX_SUBSET_BYTES, encoded_size

        size = encoded_size(db.subset)
        if size > MAX_SUBSET_BYTES:
            why = (
                f"-{restriction(options)} selects a subset whose masks take {size:,} bytes compressed, over "
                f"the {MAX_SUBSET_BYTES:,} a storage site takes"
            )
    if why is None:
        return settings
    if ship.mode != "auto":
        raise UsageError(f"--ship {ship.mode}: {why}; use --ship compressed")
    return _ship_compressed(settings, why, "--ship compressed")


def _ship_data_when_inexact(settings: SearchSettings, inexact: str | None) -> SearchSettings:
    """--ship auto weighs metadata against the output; metadata needs the fragments strategy, so when
    that would not be exact (and no strategy was asked) the output itself is shipped, compressed, and
    the user told why: what works, not a refusal whose advice is refused in turn."""
    ship = settings.ship
    if ship is None or ship.mode != "auto" or settings.from_metadata is not None:
        return settings
    if settings.strategy == "queries":
        why = "--strategy queries was asked, which makes no metadata"
    elif settings.strategy == "auto" and inexact is not None:
        reason = inexact.split("; use --strategy queries")[0].split(": use --strategy queries")[0]
        why = f"metadata needs the fragments strategy, which {reason}"
    else:
        return settings
    return _ship_compressed(settings, why, "--ship compressed, --strategy queries")


def _ship_compressed(settings: SearchSettings, why: str, advice: str) -> SearchSettings:
    """--ship auto become compressed, and the user told why (once, unless --quiet)."""
    assert settings.ship is not None
    if not settings.quiet:
        print(
            f"paramedic: --ship auto: {why}: the output is shipped compressed instead ({advice})",
            file=sys.stderr,
        )
    return replace(settings, ship=replace(settings.ship, mode=COMPRESSED_MODE))


# Fragment searches stop after the preliminary stage (traceback once) when the subjects a piece is
# aligned against, at most its queries' preliminary lists (N each), are at most this share of the
# database: the piece's search scans only those, and saves every fragment's own traceback.
TRACEBACK_ONCE_SHARE = 0.1


def choose_traceback(
    settings: SearchSettings,
    program: str,
    options: BlastOptions,
    lengths: list[int],
    blast_batches: list[range],
    nseq: int,
    metadata: bool,
) -> tuple[bool, str]:
    """Whether fragment searches stop after BLAST+'s preliminary stage, each query then aligned once
    against the whole database's list (docs/DESIGN.md, "Traceback once"), and why.

    It pays when the subjects a piece is aligned against (at most N per query, BLAST+'s preliminary list)
    are a small share of the database: the piece's search scans only those, and every fragment's own
    traceback is saved. A piece is one BLAST+ batch where BLAST+ fixes them (paramedic.engine.core.plan),
    else DEFAULT_REGEN_GROUP queries. Metadata is then the whole lists, not the hits: auto keeps aligning
    per fragment when metadata is asked (shipped, saved or used)."""
    if settings.traceback == "once":
        return True, "--traceback once was asked"
    if settings.traceback == "per-fragment":
        return False, "--traceback per-fragment was asked"
    if program == "tblastx":
        return False, "tblastx's preliminary list is its hit list: nothing to align once"
    if metadata:
        return False, "metadata is asked (shipped, saved or used): the merged hits, which fragments align"
    limit = expected_limit(options, program)
    largest = max((len(b) for b in blast_batches), default=min(len(lengths), DEFAULT_REGEN_GROUP))
    share = largest * limit / max(1, nseq)
    numbers = (
        f"the largest piece's preliminary lists ({largest} quer{'y' if largest == 1 else 'ies'} x "
        f"{limit:,} subjects) are {share:.1%} of the database's {nseq:,} sequences"
    )
    if share <= TRACEBACK_ONCE_SHARE:
        return True, f"{numbers} (at most {TRACEBACK_ONCE_SHARE:.0%}): each query is aligned once"
    return False, f"{numbers} (over {TRACEBACK_ONCE_SHARE:.0%}): each fragment search aligns its hits"


def _ships_pieces(mode: str) -> bool:
    from paramedic.ship.registry import ships_pieces  # the shipping side only when it ships

    return ships_pieces(mode)


def check_stage(stage: StageSettings, manifest: Manifest, where: str) -> StageSettings:
    """Before the job's work starts: the database can be staged, the cache directory used, and every
    --mirror holds this very database (manifest checksum), or one line and a refusal now. Returns the
    settings with the mirrors found down or slow (said once) in `dropped_mirrors`: the ranks skip them
    rather than wait for each again (MIRROR_OPEN_SECONDS per rank, on top of this check's)."""
    from paramedic.db.stage import StageCache, check_stageable
    from paramedic.engine.rank.staging import open_replicas

    check_stageable(manifest, where)
    StageCache(stage.directory, stage.limit)
    if not stage.mirrors:
        return stage
    dropped = []  # one down is an extra source lost (said once), another database a mistake
    replicas = open_replicas(stage.mirrors, manifest, stage.keys, required=0)
    for url, use in zip(stage.mirrors, replicas.uses, strict=True):
        if use.dropped is not None:
            print(f"paramedic: warning: --mirror {use.label}: {use.dropped}; searching without it",
                  file=sys.stderr, flush=True)  # fmt: skip
            dropped.append((url, use.dropped))
    replicas.close()
    return replace(stage, dropped_mirrors=tuple(dropped))


def _warn(text: str) -> None:
    print(f"paramedic: warning: {text}", file=sys.stderr, flush=True)


def _resolve(cwd: Path, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else cwd / p


# Options the database-segmented engine cannot honour exactly, with the reason it refuses them.
FRAGMENTS_REFUSE = {
    **{
        name: f"cannot honour -{name}: BLAST+ drops a sequence only when all of its "
        f"{'taxids' if 'taxid' in name else 'ids'} are listed, which only its own reader knows; use --strategy queries"
        for name in NEGATIVE
    },
    "culling_limit": "cannot honour -culling_limit: BLAST+ culls a query's hits across all subjects, "
    "so fragments culled apart keep hits the whole database drops; use --strategy queries",
    "best_hit_overhang": "cannot honour -best_hit_overhang: BLAST+ keeps a query's best hits across all "
    "subjects, so fragments filtered apart keep hits the whole database drops; use --strategy queries",
    "best_hit_score_edge": "cannot honour -best_hit_score_edge: BLAST+ keeps a query's best hits across all "
    "subjects, so fragments filtered apart keep hits the whole database drops; use --strategy queries",
}


# BLAST+ 2.12's report formats are 0-18; these are refused before anything runs.
_OUTFMT_REFUSED = {
    13: "writes one file per query, which paramedic does not assemble; use -outfmt 15 (single-file JSON)",
    14: "writes one file per query, which paramedic does not assemble; use -outfmt 16 (single-file XML2)",
}


def check_outfmt(program: str, options: BlastOptions) -> None:
    """Refuse, before MPI starts, a format BLAST+ does not have or paramedic cannot write whole."""
    number = options.outfmt_number()
    if not 0 <= number <= 18:
        raise UsageError(f"-outfmt {number}: BLAST+ formats are 0 to 18")
    if number == 17 and program != "blastn":
        raise UsageError("-outfmt 17 (SAM) is for blastn only")
    if number in _OUTFMT_REFUSED:
        raise UsageError(f"-outfmt {number} {_OUTFMT_REFUSED[number]}")


def _split_reason(program: str, options: BlastOptions, lengths: list[int], queries: list) -> str | None:
    """Why the fragments strategy refuses these queries: one that BLAST+ may split into chunks."""
    index = split_query(program, options, lengths)
    if index is None:
        return None
    name = queries[index][0].split()[0] if queries[index][0] else f"#{index + 1}"
    return (
        f"cannot search query {name} ({lengths[index]} residues) exactly: BLAST+ splits a query batch "
        "this long into chunks whose lists the merge does not reproduce; use --strategy queries"
    )


def fragments_inexact(blast_args: list[str]) -> str | None:
    """Why the fragments strategy would not be exact with these BLAST+ options (None: it would)."""
    for arg in blast_args:
        reason = FRAGMENTS_REFUSE.get(arg.lstrip("-")) if arg.startswith("-") else None
        if reason:
            return reason
    return None


def _check_stream_writer(out: Path, strategy: str) -> None:
    """A worker output strategy writes pieces at offsets of a file: a stream has none."""
    if output_strategy(strategy).workers_write:
        raise UsageError(
            f"--output-strategy {strategy} writes a file at offsets, and -out {out} is a device or a pipe: "
            "drop --output-strategy (rank 0 writes it through)"
        )


def check_writable(path: Path) -> None:
    """Fail now, not after the search, when the output cannot be created (or, for a stream, opened)."""
    refused = refused_target(path)
    if refused is not None:
        raise OutputError(f"-out {path}: {refused}")
    if stream_target(path):  # written through, as BLAST+ writes it (paramedic.output.writer.LocalFile)
        if not os.access(path, os.W_OK):
            raise OutputError(f"-out {path}: not writable")
        return
    parent = path.parent
    if path.is_dir():
        raise OutputError(f"-out {path}: is a directory")
    if not parent.is_dir():
        raise OutputError(f"-out {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"-out {path}: directory {parent} is not writable")
