"""The compute site's end of `--site`: send the job's output, or its metadata, to the storage site.

    --ship direct      the report's bytes, as regenerated here, in ranges at explicit offsets
    --ship compressed  the same ranges, zstd-compressed (the generic plugin)
    --ship metadata    per query only the merged subject ids; the storage site regenerates the report
    --ship auto        measure the link, then choose by the ParaMEDIC rule (`ship.auto`)

Shipping overlaps the search: a range ships as soon as the ordered writer has it, metadata as soon as
the merge of its queries is done. The job ends only when the site reports the file durable.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from paramedic.blast.options import BlastOptions
from paramedic.errors import UsageError
from paramedic.report.record import ShipReport
from paramedic.ship.blast_codec import UNSHIPPABLE_OUTFMTS
from paramedic.ship.codecs import Codec, JobSpec, split_range
from paramedic.ship.paths import output_path_problem
from paramedic.ship.registry import codec_for_mode, ship_modes
from paramedic.ship.transport import Opening, Shipper, SiteAddress, SiteError, open_shipper, scheme_named

SHIP_MODES = (*ship_modes(), "auto")  # from the codecs (paramedic.ship.registry); auto chooses
METADATA_FLUSH_SECONDS = 10.0
# Ids per metadata container: well under idcodec.MAX_IDS, so big jobs ship in several containers (which
# still refer to each other's ids: the cost of splitting is a few bytes per container).
METADATA_CONTAINER_IDS = 2**18


class Piece(Protocol):
    """What shipping metadata reads of a released output piece (the engine's `PieceTask` is one): its
    position in the output, its queries, and per query the merged subject ids in BLAST order."""

    @property
    def piece(self) -> int: ...
    @property
    def first_query(self) -> int: ...
    @property
    def n_queries(self) -> int: ...
    @property
    def subjects(self) -> tuple[tuple[int, ...], ...] | None: ...


@dataclass(frozen=True)
class ShipSettings:
    site: SiteAddress
    keys: Path | None
    mode: str
    out: str  # path under the storage site's --root
    streams: int = 4
    timeout: float = 300.0

    @classmethod
    def build(cls, site: str, keys: Path | None, mode: str, out: str | None, streams: int, timeout: float):
        address = SiteAddress.parse(site)
        if mode not in SHIP_MODES:
            raise UsageError(f"--ship {mode}: choose one of {', '.join(SHIP_MODES)}")
        scheme_named(address.scheme, f"--site {site}").check(address, keys)
        if keys is not None and not keys.is_dir():
            raise UsageError(f"--keys {keys}: not a directory")
        if not out or out == "-":
            raise UsageError("with --site, -out names the output file under the storage site's root")
        problem = output_path_problem(out)
        if problem is not None:
            raise UsageError(
                f"-out {out}: with --site, -out is a relative path under the storage site's root ({problem})"
            )
        if streams < 1 or streams > 64:
            raise UsageError("--streams must be between 1 and 64")
        return cls(address, keys, mode, out, streams, timeout)


def check_shippable(options: BlastOptions) -> None:
    if options.outfmt_number() in UNSHIPPABLE_OUTFMTS:
        raise UsageError(f"-outfmt {options.outfmt_number()} writes one file per query; it cannot be shipped")


class Shipping:
    """One job's shipping: the codec, the shipper, and the figures for the run record."""

    def __init__(self, settings: ShipSettings, mode: str, codec: Codec, shipper: Shipper, nseq: int):
        self.settings = settings
        self.mode = mode
        self.codec = codec
        self.shipper = shipper
        self.nseq = nseq
        self.encode_seconds = 0.0  # f(x): making the payloads
        self.output_bytes = 0  # D as produced here (ranges modes)
        self.digest = hashlib.sha256()
        self.started = time.perf_counter()
        self.result: dict[str, Any] | None = None
        self.finish_seconds = 0.0
        self.decision: dict[str, Any] | None = None
        self.buffered: list[Piece] = []
        self.buffered_since = 0.0
        self.flush_queries = 1  # set by start_shipping: a quarter of the job's queries

    @property
    def holds_pieces(self) -> bool:
        return self.codec.layout == "pieces"

    # -- ranges: a ByteSink for the OrderedWriter ------------------------------------------------------
    def write(self, data: bytes) -> None:
        for offset, part in split_range(self.output_bytes, data):
            start = time.perf_counter()
            header, payload = self.codec.encode((offset, part))
            self.encode_seconds += time.perf_counter() - start
            self.shipper.send(header, payload)
        self.output_bytes += len(data)
        self.digest.update(data)

    # -- pieces: metadata ------------------------------------------------------------------------------
    def ship_pieces(self, tasks: Sequence[Piece]) -> None:
        """Ship released pieces, a few at a time: consecutive ones travel as one chunk (each chunk costs a
        container header and a round trip; the ids compress against earlier chunks' either way), so pieces
        wait until a quarter of the queries or METADATA_FLUSH_SECONDS have gathered. The site still gets
        work long before the search ends."""
        if not self.buffered:
            self.buffered_since = time.monotonic()
        self.buffered.extend(tasks)
        gathered = sum(t.n_queries for t in self.buffered)
        if gathered >= self.flush_queries or time.monotonic() - self.buffered_since >= METADATA_FLUSH_SECONDS:
            self._flush_pieces()

    def _flush_pieces(self) -> None:
        tasks, self.buffered = self.buffered, []
        for run in _consecutive(tasks, METADATA_CONTAINER_IDS):
            first = run[0].first_query
            subjects = [s for task in run for s in (task.subjects or ())]
            start = time.perf_counter()
            header, payload = self.codec.encode((first, subjects, self.nseq))
            self.encode_seconds += time.perf_counter() - start
            self.shipper.send(header, payload)

    # -- end ---------------------------------------------------------------------------------------------
    def commit(self) -> None:
        self._flush_pieces()
        start = time.perf_counter()
        final: dict[str, Any] = {}
        if not self.holds_pieces:
            final = {"size": self.output_bytes, "sha256": self.digest.hexdigest()}
        self.result = self.shipper.finish(final)
        self.finish_seconds = time.perf_counter() - start
        if not self.holds_pieces and self.result.get("sha256") != final["sha256"]:
            raise SiteError("the storage site's file differs from the output made here")
        self.shipper.close()

    def abort(self) -> None:
        """The job failed here: the site drops its job (and its data) instead of keeping it open."""
        try:
            self.shipper.cancel()
        finally:
            self.shipper.close()

    def report(self) -> ShipReport:
        stats = self.shipper.stats
        result = self.result or {}
        output_bytes = int(result.get("bytes", self.output_bytes))
        return ShipReport(
            site=str(self.settings.site),
            mode=self.mode,
            codec=self.codec.name,
            streams=self.settings.streams,
            output_path=self.settings.out,
            output_bytes=output_bytes,
            shipped_payload_bytes=stats.payload_bytes,
            setup_bytes=stats.setup_bytes,
            wire_bytes=stats.wire_bytes,
            ratio_output_to_payload=round(output_bytes / stats.payload_bytes, 1)
            if stats.payload_bytes
            else None,
            chunks=stats.chunks,
            chunks_resent=stats.resent,
            reconnects=stats.reconnects,
            f_encode_seconds=round(self.encode_seconds, 3),
            transfer_seconds=stats.transfer_seconds,
            finish_wait_seconds=round(self.finish_seconds, 3),
            g_site_decode_seconds=result.get("decode_seconds"),
            site_sha256=result.get("sha256"),
            auto_decision=self.decision,
        )


def _consecutive(tasks: Sequence[Piece], max_ids: int) -> list[list[Piece]]:
    """Runs of consecutive pieces, each holding at most `max_ids` subject ids (or a single piece)."""
    runs: list[list[Piece]] = []
    ids = 0
    for task in sorted(tasks, key=lambda t: t.piece):
        n = sum(len(s) for s in task.subjects or ())
        if runs and runs[-1][-1].piece + 1 == task.piece and ids + n <= max_ids:
            runs[-1].append(task)
            ids += n
        else:
            runs.append([task])
            ids = n
    return runs


def cancel_site_job(settings: ShipSettings, job_id: str) -> None:
    """Drop a job this compute site opened in an earlier run that was killed (best effort): a search
    that resumes opens a new one, and the site lets only one job write an output path."""
    if not re.fullmatch(r"[0-9a-f]{32}", job_id):
        return
    shipper = open_shipper(Opening(settings.site, settings.keys, "", timeout=settings.timeout, job_id=job_id))
    try:
        shipper.cancel()
    finally:
        shipper.close()


def start_shipping(settings: ShipSettings, mode: str, job: JobSpec, job_id: str | None = None) -> Shipping:
    """Open the job at the storage site (a refusal, e.g. a replica mismatch, fails here) and start sending.
    `job_id`: the id the job gets (chosen here, so that it can be noted before the site opens the job)."""
    codec = codec_for_mode(mode)
    header, payload = codec.job_setup(job)
    setup: dict[str, Any] = {**header, "out": settings.out}
    shipper = open_shipper(
        Opening(
            settings.site,
            settings.keys,
            codec.name,
            setup,
            payload,
            settings.streams,
            settings.timeout,
            job_id,
        )
    )
    shipper.start()
    shipping = Shipping(settings, mode, codec, shipper, job.nseq)
    shipping.flush_queries = max(1, len(job.queries) // 4)
    return shipping
