"""Where a job's output goes: output objects that say what they need from the runner, and the one factory.

Every output object answers the same three questions, so that no runner tells them apart by type:
    who writes the report     `placement()`: None, rank 0 (or the storage site) writes it in query order;
                              else the workers write their pieces and rank 0 places them (`Placement`)
    what rank 0 keeps         `holds_pieces`: True, a piece's merged subjects (metadata), never its bytes
    what the record says      `output_bytes`, `report()` (the ship section), `output_writes()`

- `WriterSink`: regenerated pieces, stitched in query order by an OrderedWriter onto a byte sink: a local
  file (written under a temporary name, renamed when complete) or a storage site that receives the bytes
  (`--ship direct|compressed`).
- `WorkerSink`: the workers hold the pieces they wrote and write them into the file themselves
  (`--output-strategy` other than master, paramedic.output.strategies); rank 0 places them.
- `MetadataSink`: released pieces shipped as they are, their merged subject ids (`--ship metadata`); the
  storage site regenerates the output.
- `PublishedSink`: an earlier run's output is already at the storage site.
`open_sink` builds the one a job asks for; with `--ship auto`, `auto_chooser` returns the function the
master calls with the probe's result to build it then. `workers_write` is the one test of whether the
workers write (a worker rank has no sink and asks it of the job).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from paramedic.durable import fsync_dir, note_partial
from paramedic.engine.core.master import PieceHeld, PieceResult, Sink
from paramedic.engine.core.placement import Keeper
from paramedic.engine.core.scheduler import PieceTask, Plan
from paramedic.engine.job.job import Job
from paramedic.engine.rank.journal import Journal
from paramedic.errors import JobError, OutputError
from paramedic.output.stitch import AgreementCheck, stitch_alone
from paramedic.output.strategies import output_strategy
from paramedic.output.writer import ByteSink, LocalFile, OrderedWriter
from paramedic.report.record import ShipReport

if TYPE_CHECKING:
    from paramedic.ship.auto import Link

    # the shipping side (codecs, transports, zstd, sockets) is imported by the jobs that ship
    from paramedic.ship.destination import Shipping


class Output(Sink, Protocol):
    """A job's output as rank 0's job shell sees it (see the module's docstring)."""

    @property
    def output_bytes(self) -> int: ...

    def report(self) -> ShipReport | None: ...

    def output_writes(self) -> dict[str, Any] | None: ...


def workers_write(job: Job) -> bool:
    """The workers write the report file (--output-strategy other than master, with -out FILE)."""
    return output_strategy(job.target.output_strategy).workers_write and job.target.out is not None


class WriterSink:
    """Pieces regenerated here, written in query order."""

    holds_pieces = False

    def __init__(
        self, outfmt: str, pieces: tuple[range, ...], target: ByteSink, shipping: Shipping | None = None
    ):
        self.writer = OrderedWriter(target, outfmt, pieces)
        self.shipping = shipping

    def add(self, index: int, data: bytes) -> int:
        return self.writer.add(index, data)

    def ship(self, tasks: list[PieceTask]) -> int:
        raise AssertionError("a writer regenerates its pieces")

    def commit(self) -> None:
        self.writer.commit()

    def abort(self) -> None:
        self.writer.abort()

    @property
    def output_bytes(self) -> int:
        return self.writer.bytes_written

    def report(self) -> ShipReport | None:
        return self.shipping.report() if self.shipping is not None else None

    def placement(self) -> None:
        return None  # rank 0 writes (or ships) every piece in query order

    def output_writes(self) -> None:
        return None


class WorkerSink:
    """--output-strategy other than master: the workers hold the pieces they wrote and write them into
    the file themselves (paramedic.output.strategies, paramedic.engine.rank.mpiio); rank 0 places the pieces
    from their sizes and sends the orders (paramedic.engine.runtime.ranks), then checks that every piece was
    written and renames the file into place. Pieces rank 0 is given with their bytes (journaled by an
    earlier run, or every piece in a one-rank job) it stitches, holds and writes itself."""

    holds_pieces = False

    def __init__(
        self, outfmt: str, pieces: tuple[range, ...], strategy: str, out: Path, partial: Path | None
    ):
        self.outfmt = outfmt
        self.pieces = pieces
        self.shipping = None
        self.out = out
        job = os.environ.get("PARAMEDIC_JOB_ID") or str(os.getpid())
        self.tmp = partial or out.with_name(f".{out.name}.partial-{job}")
        if partial is None:  # named after the job: removed by a later run if the launcher is killed
            note_partial(self.tmp)
        self.strategy = output_strategy(strategy)(len(pieces))
        self.agreement = AgreementCheck()
        self.own: dict[int, bytes] = {}  # rank 0's pieces until its Holder exists
        self.holder: Keeper | None = None
        self.closed = False
        self.acknowledged = {"pieces": 0, "bytes": 0}
        self.write_seconds = 0.0

    # -- the master's calls -------------------------------------------------------------------------
    def add(self, index: int, data: bytes) -> int:
        """A piece whose bytes rank 0 has: stitched and held here, written by rank 0."""
        piece = self.pieces[index]
        out, agreement = stitch_alone(
            self.outfmt, len(self.pieces), index, data, piece.start, len(piece), self.pieces[-1].stop
        )
        self.agreement.add(index, agreement)
        if self.holder is not None:
            self.holder.keep(index, out)
        else:
            self.own[index] = out
        self.strategy.held(index, len(out), 0)
        return len(piece)

    def ship(self, tasks: list[PieceTask]) -> int:
        raise AssertionError("the workers write their pieces")

    def held(self, result: PieceHeld) -> int:
        self.agreement.add(result.task.piece, result.agreement)
        self.strategy.held(result.task.piece, result.size, result.holder)
        return result.task.n_queries

    # -- the runner's calls (paramedic.engine.runtime.ranks) ------------------------------------------------
    def attach(self, holder: Keeper) -> None:
        """The file is open on every rank: rank 0's holder takes the pieces it was given so far."""
        self.holder = holder
        for index, data in self.own.items():
            holder.keep(index, data)
        self.own = {}

    def acknowledge(self, pieces: int, nbytes: int) -> None:
        self.acknowledged["pieces"] += pieces
        self.acknowledged["bytes"] += nbytes

    def closed_by_ranks(self) -> None:
        """Every rank synced and closed the file (its figures acknowledged)."""
        self.closed = True

    # -- the end ------------------------------------------------------------------------------------
    def commit(self) -> None:
        if (
            not self.closed
        ):  # a one-rank job (paramedic.engine.core.runner.run_serial): rank 0 wrote every piece
            from mpi4py import MPI

            from paramedic.engine.rank.mpiio import Holder, OutputFile

            holder = Holder(OutputFile(MPI.COMM_SELF, self.tmp), MPI.COMM_SELF)
            self.attach(holder)
            holder.run(self.strategy.take().get(0, []))
            share = self.strategy.start_round(1)
            if share is not None:
                holder.round(share[0])
            holder.drain()
            holder.file.close()
            self.write_seconds += holder.file.seconds
            self.acknowledge(holder.written_pieces, holder.written_bytes)
            self.closed = True
        total = self.strategy.total
        if not self.strategy.complete or self.acknowledged != {"pieces": len(self.pieces), "bytes": total}:
            raise OutputError(
                f"internal: {self.acknowledged['pieces']} of {len(self.pieces)} pieces and "
                f"{self.acknowledged['bytes']} of {total} bytes acknowledged as written"
            )
        try:
            size = self.tmp.stat().st_size
            if size != total:
                raise OutputError(
                    f"cannot write {self.out}: the file holds {size} bytes, {total} were written"
                )
            os.replace(self.tmp, self.out)
            fsync_dir(self.out.parent)
        except OSError as exc:
            raise OutputError(f"cannot write {self.out}: {exc.strerror}") from exc

    def abort(self) -> None:
        """The ranks end with the job (comm.Abort); the temporary file goes."""
        self.tmp.unlink(missing_ok=True)

    @property
    def output_bytes(self) -> int:
        return self.strategy.total

    def report(self) -> ShipReport | None:
        return None

    def placement(self) -> WorkerSink:
        return self  # the workers write; rank 0 places (this object's strategy) and renames the file

    def output_writes(self) -> dict[str, Any]:
        return self.strategy.counts()


class MetadataSink:
    """Pieces shipped as metadata: the storage site regenerates the output."""

    holds_pieces = True

    def __init__(self, shipping: Shipping):
        self.shipping = shipping

    def add(self, index: int, data: bytes) -> int:
        raise AssertionError("metadata is shipped, not written")

    def ship(self, tasks: list[PieceTask]) -> int:
        self.shipping.ship_pieces(tasks)
        return sum(task.n_queries for task in tasks)

    def commit(self) -> None:
        self.shipping.commit()

    def abort(self) -> None:
        self.shipping.abort()

    @property
    def output_bytes(self) -> int:
        return int(self.report()["output_bytes"])

    def report(self) -> ShipReport:
        return self.shipping.report()

    def placement(self) -> None:
        return None

    def output_writes(self) -> None:
        return None


def open_sink(job: Job, plan: Plan, mode: str | None, journal: Journal | None) -> Output:
    """The job's sink: `mode` None for a local -out (or standard output), else how --site ships."""
    outfmt = job.options.outfmt()
    if job.target.ship is None or mode is None:
        partial = journal.partial_output if journal is not None else None
        if workers_write(job):
            assert job.target.out is not None  # workers write only into a file
            return WorkerSink(outfmt, plan.pieces, job.target.output_strategy, job.target.out, partial)
        return WriterSink(outfmt, plan.pieces, LocalFile(job.target.out, partial))
    return shipped_sink(job, plan, open_shipping(job, plan, mode, journal))


def shipped_sink(job: Job, plan: Plan, shipping: Shipping) -> Output:
    """The output object of an open shipping: metadata shipped as pieces, or the report's bytes."""
    if shipping.holds_pieces:
        return MetadataSink(shipping)
    return WriterSink(job.options.outfmt(), plan.pieces, shipping, shipping)


class AutoChooser:
    """--ship auto: called by the master with the probe's regenerated output and cost, decides by the
    ParaMEDIC rule (paramedic.ship.auto) and opens the output (`chosen`, for rank 0's job shell)."""

    def __init__(self, job: Job, plan: Plan, link: Link | None, journal: Journal | None):
        self.job, self.plan, self.link, self.journal = job, plan, link, journal
        self.chosen: Output | None = None

    def __call__(self, probe: PieceTask, result: PieceResult) -> Output:
        from paramedic.ship.auto import METADATA, decide  # TLS and the link's rule: only when shipping
        from paramedic.ship.registry import codec_for_mode

        job = self.job
        start = time.perf_counter()
        _, payload = codec_for_mode(METADATA).encode((probe.first_query, probe.subjects or (), job.db.nseq))
        encode_seconds = time.perf_counter() - start
        mode, decision = decide(
            self.link,
            len(job.queries),
            probe.n_queries,
            result.data,
            result.seconds,
            len(payload),
            encode_seconds,
            _subset_cost(job),
        )
        shipping = open_shipping(job, self.plan, mode, self.journal)
        shipping.decision = decision
        self.chosen = shipped_sink(job, self.plan, shipping)
        return self.chosen


def _subset_cost(job: Job) -> tuple[int, float]:
    """A restricted search's subset as the metadata carries it: its bytes and the seconds to make them
    (0, 0.0 without a restriction)."""
    if job.db.subset is None:
        return 0, 0.0
    from paramedic.ship.subset_wire import encode_subset

    start = time.perf_counter()
    _, blob = encode_subset(job.db.subset)
    return len(blob), time.perf_counter() - start


def open_shipping(job: Job, plan: Plan, mode: str, journal: Journal | None = None) -> Shipping:
    """With --site: open the job at the storage site (refusals, e.g. a replica mismatch, fail here). The
    codec of `mode` takes from the job what the site needs (paramedic.ship.codecs.Codec.job_setup)."""
    from paramedic.ship.codecs import JobSpec
    from paramedic.ship.destination import cancel_site_job, start_shipping
    from paramedic.ship.registry import ships_pieces

    assert job.target.ship is not None
    if ships_pieces(mode) and plan.query_segmentation:
        raise JobError(f"--ship {mode} needs the fragments strategy (query segmentation merges nothing)", 2)
    spec = JobSpec(
        program=job.program,
        options=job.options.without("query", "db", "out").argv(),
        db_arg=job.db.arg,
        manifest_sha256=job.manifest_checksum,
        pieces=plan.pieces,
        queries=job.queries,
        nseq=job.db.nseq,
        subset=job.db.subset,
    )
    earlier = journal.earlier_site_job() if journal is not None else None
    if earlier is not None:  # a killed run's job still holds the output path at the site
        cancel_site_job(job.target.ship, earlier)
    import uuid  # here: a search that ships nothing does not load it (4 ms with platform)

    job_id = uuid.uuid4().hex
    if journal is not None:  # noted before the site opens it: a run killed while it opens is cancelled too
        journal.note_site_job(job_id)
    return start_shipping(job.target.ship, mode, spec, job_id)


def measure_site(job: Job) -> Link | None:
    """--ship auto: measure the link before the search (and check the replica early)."""
    from paramedic.ship.auto import measure_link
    from paramedic.ship.transport import SiteError

    assert job.target.ship is not None
    link, manifest = measure_link(job.target.ship.site, job.target.ship.keys)
    if manifest is not None and manifest != job.manifest_checksum:
        raise SiteError(
            "storage site: the storage site's replica is not the compute site's database "
            "(manifest checksums differ)"
        )
    return link


def published_earlier(job: Job, journal: Journal | None) -> dict[str, Any] | None:
    """With --site: the site's `done` answer when an earlier run of this search, stopped before it heard
    it, had the site publish the output (the journal names that run's site job). Such a run cannot open a
    new job (the site never replaces a file), and has nothing left to do."""
    if (
        job.target.ship is None
        or journal is None
        or job.target.save_metadata is not None
        or job.target.ship.keys is None
    ):
        return None
    earlier = journal.earlier_site_job()
    if earlier is None:
        return None
    from paramedic.ship.transport import scheme_named

    scheme = scheme_named(job.target.ship.site.scheme, f"--site {job.target.ship.site}")
    return scheme.finished_job(job.target.ship.site, job.target.ship.keys, earlier, job.target.ship.out)


class PublishedSink:
    """The output is already at the storage site (see `published_earlier`): nothing is written or sent."""

    holds_pieces = True

    def __init__(self, job: Job, done: dict[str, Any]):
        assert job.target.ship is not None
        self.ship_settings = job.target.ship
        self.done = done

    def add(self, index: int, data: bytes) -> int:
        raise AssertionError("the output is already at the site")

    def ship(self, tasks: list[PieceTask]) -> int:
        return sum(task.n_queries for task in tasks)

    def commit(self) -> None:
        pass

    def abort(self) -> None:
        pass

    @property
    def output_bytes(self) -> int:
        return int(self.done.get("bytes") or self.done.get("size") or 0)

    def placement(self) -> None:
        return None

    def output_writes(self) -> None:
        return None

    def report(self) -> ShipReport:
        ship = self.ship_settings
        return ShipReport(
            site=str(ship.site), mode=ship.mode, codec="", streams=ship.streams, output_path=ship.out,
            output_bytes=self.output_bytes, shipped_payload_bytes=0, setup_bytes=0, wire_bytes=0,
            ratio_output_to_payload=None, chunks=0, chunks_resent=0, reconnects=0, f_encode_seconds=0.0,
            transfer_seconds=None, finish_wait_seconds=0.0, g_site_decode_seconds=self.done.get("decode_seconds"),
            site_sha256=self.done.get("sha256"), auto_decision=None,
        )  # fmt: skip
