"""Shipping a finished file of an application (a trace) to a storage site: `paramedic ship`, `trace --site`.

The same link as a search's (ship.destination): the same transports (TLS streams, the inbox), the same
final check (the site's file has this file's size and SHA-256) and the same run record section. The
modes:

    --ship metadata    the application's metadata (a trace: its first period and differences); the storage
                       site regenerates the file and checks it before writing. A codec that cuts a file into
                       units (a large trace: ranges of whole blocks) is pipelined: each unit is sent as soon
                       as it is encoded, while the next is encoded, and the site regenerates it meanwhile
    --ship compressed  the file zstd-compressed, in ranges
    --ship direct      the file as it is, in ranges
    --ship auto        measure the link, then the ParaMEDIC rule (ship.auto.ship_metadata) on this file's
                       real sizes and times: metadata when D - x > B * (f + g - c), g estimated by decoding
                       here, c the compressed path's own zstd

The site job's id is derived from `-out`, the codec and the file's digest: the same command run again
reopens a stopped run's job (the site keeps what it acknowledged) or learns that the file is there.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from paramedic.errors import InputError, UsageError
from paramedic.report.record import ShipReport
from paramedic.ship.apps import Application
from paramedic.ship.auto import COMPRESSED, METADATA, measure_link, ship_metadata
from paramedic.ship.codecs import CompressedCodec
from paramedic.ship.destination import Shipping, ShipSettings
from paramedic.ship.trace_codec import MAX_TRACE_BYTES, OVER_MEMORY, physical_memory
from paramedic.ship.transport import Opening, SiteError, open_shipper, scheme_named
from paramedic.ship.wire import MAX_PAYLOAD_BYTES


def max_file_bytes() -> int:
    """The largest file `paramedic ship` reads: the whole file is held (and encoded) in memory, so at most
    half of this machine's memory, and no more than a storage site regenerates (MAX_TRACE_BYTES, 16 GiB)."""
    return min(MAX_TRACE_BYTES, physical_memory() // 2)


def read_input(path: Path) -> bytes:
    """The file to ship, whole: a regular file of at most `max_file_bytes`. Anything else is refused in one
    line before it is read: `ship /dev/zero` read until memory ran out, and a FIFO blocked for ever (opened
    without blocking, then looked at; a file that grows meanwhile is read up to the bound and refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a regular file (a FIFO, a device or a directory): give a file")
        limit = max_file_bytes()
        if info.st_size > limit:
            raise InputError(
                f"{path}: {info.st_size:,} bytes, over the {limit:,} that `paramedic ship` holds"
            )
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror}") from exc
    if len(data) > limit:
        raise InputError(f"{path}: grew past the {limit:,} bytes that `paramedic ship` holds while read")
    return data


Metadata = tuple[dict[str, Any], bytes]
Check = Callable[[], Metadata | None]
OPEN_WAIT_ON_FAILURE = 1.0  # seconds a failed encoding waits for the site's job to open, to cancel it (a job
# still opening then idles out at the site, or the same command run again reopens it: its id is the same)


def _codec(app: Application, mode: str, precision: str) -> Any:
    """The application's codec for `mode` (ship.apps), told the precision of a trace's times."""
    codec = app.codec_for(mode)
    if hasattr(codec, "precision"):
        codec.precision = precision
    return codec


def _auto(
    settings: ShipSettings, app: Application, data: bytes, precision: str
) -> tuple[str, dict[str, Any], list[Metadata], float, Check | None, list[Any] | None]:
    """The mode `auto` picks for this file, the record of why, the metadata made on the way (f: its
    encoding, as the metadata path spends it; every unit's, when the codec cuts the file), its rebuild
    check (run only if the site refuses the file, as on the metadata path) and the units. g, the site's regeneration, is estimated from f by the codec's
    `decode_per_encode` (a trace's decoding costs 0.3-0.55 of its encoding); regenerating here to time
    it would cost g again. The link is measured on a thread meanwhile (the probes wait on the
    network, the encoding on the CPU), and the compressed size on another (zstd releases the GIL). The
    compressed path's own cost, c (that zstd's time), is weighed too: metadata when D - x > B * (f + g - c)."""
    measured: list[Any] = [None]
    sizes: list[float] = []

    def measure() -> None:
        # probes of at most a quarter of the file (about its compressed size: zstd gets about 4x on CLOG2)
        measured[0] = measure_link(settings.site, settings.keys, budget_bytes=len(data) // 4)[0]

    def compress() -> None:
        start = time.perf_counter()
        sizes.append(len(zstandard.ZstdCompressor(level=CompressedCodec.level).compress(data)))
        sizes.append(time.perf_counter() - start)

    probing = _Background(measure)
    codec = _codec(app, METADATA, precision)
    units = _units_of(codec, data)
    made, check, f = _encode_all(codec, data, units)
    compressing = _Background(compress)  # after the encoding: the two would share its cores
    for job in (compressing, probing):
        failure = job.wait()[1]
        if failure is not None:
            raise failure
    compressed, c = int(sizes[0]), sizes[1]
    g = f * codec.decode_per_encode
    decision: dict[str, Any] = {
        "D_output_bytes": len(data),
        "D_compressed_bytes": compressed,
        "x_metadata_bytes": _payload(made),
        "f_seconds": round(f, 4),
        "g_seconds": round(g, 4),
        "g_estimated_per_f": codec.decode_per_encode,
        "c_compress_seconds": round(c, 4),
    }
    link = measured[0]
    if link is None:
        mode, reason = (
            METADATA,
            "the transport has no link to measure (e.g. a shared directory); metadata is the least to write",
        )
    else:
        bandwidth = link.bandwidth_bytes_per_second
        added = max(f + g - c, 0.0)
        x = _payload(made)
        mode = METADATA if ship_metadata(compressed, x, bandwidth, added, 0.0) else COMPRESSED
        decision["link"] = {"rtt_seconds": link.rtt_seconds, "bandwidth_bytes_per_second": bandwidth}
        reason = f"D-x = {compressed - x} bytes vs B*(f+g-c) = {bandwidth * added:.0f} bytes"
    decision.update({"mode": mode, "reason": reason})
    return mode, decision, made, f, check, units


@dataclass
class _Shipment:
    """What `ship_file` sends, decided before the site's job opens: the mode and its codec, auto's record of
    why, the metadata made so far (auto makes all of it; the metadata mode makes it, or its first unit,
    while the job opens), its rebuild check (run only if the site refuses), the units a codec cuts the
    file into (`planned`: how many, known from the header), the file's SHA-256 and the site job ids an
    earlier run of the same command may have used."""

    mode: str
    codec: Any
    decision: dict[str, Any] | None
    made: list[Metadata] | None
    check: Check | None
    units: list[Any] | None
    encode_seconds: float
    planned: int | None
    sha: Any
    job_id: str
    ids: list[str]


def ship_file(
    settings: ShipSettings, app: Application, data: bytes, precision: str = "lossless"
) -> ShipReport:
    """Send `data` (a whole output file of `app`) to the storage site as `settings.out`; the site's file is
    checked against it (size and SHA-256) before this returns. `precision`: a trace's time precision
    (`data` is already reduced to it; recorded in the metadata and the report)."""
    if settings.mode not in app.ship_modes + ("auto",):
        raise UsageError(f"--ship {settings.mode}: {app.name} ships {', '.join(app.ship_modes)} or auto")
    shipment = _shipment(settings, app, data, precision)
    # units go over one stream, in order: the site regenerates each while the next arrives (over four
    # streams they shared the link and all arrived at the end, and so were regenerated at the end)
    streams = 1 if shipment.planned is not None else None
    shipper = open_shipper(_opening(settings, shipment.codec.name, shipment.job_id, streams))
    if shipment.mode == METADATA and shipment.made is None:
        earlier = _encode_while_opening(settings, app, data, shipment, shipper)
    else:
        earlier = _open_unless_published(settings, app, data, shipment, shipper)
    if earlier is not None:
        return _with_precision(earlier, app, precision)
    return _send(settings, app, data, precision, shipment, shipper)


def _shipment(settings: ShipSettings, app: Application, data: bytes, precision: str) -> _Shipment:
    """The mode (auto's choice, made on this file), its codec, and the job ids to ask and open."""
    mode, decision = settings.mode, None
    made: list[Metadata] | None = None
    check: Check | None = None
    units: list[Any] | None = None
    encode_seconds = 0.0
    if mode == "auto":
        mode, decision, made, encode_seconds, check, units = _auto(settings, app, data, precision)
    codec = _codec(app, mode, precision)
    if mode != METADATA:  # auto's metadata is not what goes
        made, check, units = None, None, None
    # how many units the file is cut into (cut while the site's job opens), from its header alone
    planned = None if mode != METADATA else len(units) if units else _unit_count(codec, data)
    sha = hashlib.sha256(data)  # once: 0.03 s of CPU for a 28 MB trace each time it is not done again
    # a file cut in units has chunks of its own: its job is not one of the file shipped whole
    job_codec = codec.name if planned is None else f"{codec.name}/units-{planned}"
    job_id = resumable_job_id(settings.out or "", job_codec, data, sha.digest())
    # an earlier run's file may have gone as the general codec's metadata: its job id is asked too
    general = resumable_job_id(settings.out or "", "general", data, sha.digest())
    ids = [job_id] + ([general] if mode == METADATA else [])
    return _Shipment(mode, codec, decision, made, check, units, encode_seconds, planned, sha, job_id, ids)


def _encode_while_opening(
    settings: ShipSettings, app: Application, data: bytes, shipment: _Shipment, shipper: Any
) -> ShipReport | None:
    """The metadata made (of a file cut in units: the first unit, the others while the ones before are
    sent) while the site is asked for an earlier run's file and, unless it has it, the job opens (TLS
    handshakes); the earlier run's report, or None. The metadata is not decoded here: the site regenerates
    the file and checks its SHA-256 before writing, and only if it refuses is the rebuild checked here (a
    layout the codec does not model). On a failure the job, once open, is dropped at the site."""
    earlier: list[ShipReport | None] = [None]

    def open_unless_published() -> None:
        earlier[0] = _published_earlier_of(settings, shipment.ids, data, shipment.sha.hexdigest())
        if earlier[0] is None:
            shipper.start()

    opened = _Background(open_unless_published)
    codec = shipment.codec
    try:
        units = _units_of(codec, data) if shipment.planned is not None else None
        made, check, seconds = _encode_all(codec, data, None if units is None else units[:1])
        if units is not None:
            check = _units_check(codec, units, data)
        for one in made:
            _limit(app, one)
    except BaseException:
        finished, failure = opened.wait(OPEN_WAIT_ON_FAILURE)
        if finished and failure is None and earlier[0] is None:  # the job is open: the site drops it
            Shipping(settings, shipment.mode, codec, shipper, 0).abort()
        raise  # (a job still opening expires at the site as idle ones do)
    shipment.units, shipment.made, shipment.check, shipment.encode_seconds = units, made, check, seconds
    failure = opened.wait()[1]
    if failure is not None:
        raise failure
    return earlier[0]


def _open_unless_published(
    settings: ShipSettings, app: Application, data: bytes, shipment: _Shipment, shipper: Any
) -> ShipReport | None:
    """The report of an earlier run whose file the site has; else the job opened, None."""
    done = _published_earlier_of(settings, shipment.ids, data, shipment.sha.hexdigest())
    if done is not None:
        return done
    for one in shipment.made or []:
        _limit(app, one)
    _start(shipper)
    return None


def _start(shipper: Any) -> None:
    """Open the site's job. Stopped meanwhile (Ctrl-C, SIGTERM: `paramedic ship` raises an interrupt), the
    job, which the site may have opened, is cancelled: it would hold its output path for an hour."""
    try:
        shipper.start()
    except KeyboardInterrupt:
        try:
            shipper.cancel()
        finally:
            shipper.close()
        raise


def _send(
    settings: ShipSettings,
    app: Application,
    data: bytes,
    precision: str,
    shipment: _Shipment,
    shipper: Any,
) -> ShipReport:
    """The file (or its metadata, unit after unit) over the open job, committed; a refusal by the site is
    answered by `_after_refusal`."""
    shipping = Shipping(settings, shipment.mode, shipment.codec, shipper, 0)
    shipping.decision = shipment.decision
    try:
        if shipment.made is not None:
            _send_metadata(app, shipment, shipper)
            shipping.encode_seconds = shipment.encode_seconds
            shipping.output_bytes = len(data)
            shipping.digest = shipment.sha.copy()
        else:
            shipping.write(data)
        shipping.commit()
    except SiteError as exc:
        shipping.abort()
        return _after_refusal(settings, app, data, precision, shipment, exc)
    except BaseException:
        shipping.abort()
        raise
    report = shipping.report()
    if shipment.planned is not None:
        report["streams"] = 1
    return _with_precision(report, app, precision)


def _send_metadata(app: Application, shipment: _Shipment, shipper: Any) -> None:
    """The metadata made, then each remaining unit's, encoded while the one before is on its way."""
    made = shipment.made or []
    for one in made:
        shipper.send(*one)
    for unit in (shipment.units or [])[len(made) :]:
        start = time.perf_counter()
        one = shipment.codec.encode_unit(unit)
        shipment.encode_seconds += time.perf_counter() - start
        _limit(app, one)
        shipper.send(*one)


def _after_refusal(
    settings: ShipSettings,
    app: Application,
    data: bytes,
    precision: str,
    shipment: _Shipment,
    refusal: SiteError,
) -> ShipReport:
    """The site refused the file. A site that cannot hold a trace's regeneration (serve --trace-memory):
    nothing is wrong with the metadata, so no rebuild here (it takes that memory too); `auto` ships the
    file compressed. Otherwise unchecked metadata is checked only now; a layout the columns do not rebuild
    ships as the general codec's metadata. Anything else is the refusal, raised."""
    if shipment.mode == METADATA and OVER_MEMORY in str(refusal):
        if settings.mode != "auto":
            raise refusal
        return _ship_compressed_instead(
            settings, app, data, precision, shipment.decision, shipment.sha, str(refusal)
        )
    replacement = shipment.check() if shipment.check is not None else None
    if replacement is None:
        raise refusal
    return _reship(settings, app, data, precision, replacement, shipment.decision, shipment.sha)


def _reship(
    settings: ShipSettings,
    app: Application,
    data: bytes,
    precision: str,
    made: Metadata,
    decision: dict[str, Any] | None,
    sha: Any,
) -> ShipReport:
    """Ship `made` (checked metadata) in a new job at the site (the first one failed): an id of its own, which
    the same command run again also asks about."""
    codec = _codec(app, METADATA, precision)
    shipper = open_shipper(
        _opening(settings, codec.name, resumable_job_id(settings.out or "", "general", data, sha.digest()))
    )
    _start(shipper)
    shipping = Shipping(settings, METADATA, codec, shipper, 0)
    shipping.decision = decision
    try:
        shipper.send(*made)
        shipping.output_bytes = len(data)
        shipping.digest = sha.copy()
        shipping.commit()
    except BaseException:
        shipping.abort()
        raise
    return _with_precision(shipping.report(), app, precision)


def _opening(settings: ShipSettings, codec: str, job_id: str, streams: int | None = None) -> Opening:
    """A shipping job of one file to the site: no setup, `-out` named, its id resumable; over `streams`
    (--streams when None)."""
    return Opening(
        settings.site,
        settings.keys,
        codec,
        {"out": settings.out},
        b"",
        streams or settings.streams,
        settings.timeout,
        job_id=job_id,
    )


def resumable_job_id(out: str, codec: str, data: bytes, file_digest: bytes | None = None) -> str:
    """The site job's id for shipping `data` as `out` with `codec`: the same for the same command on the
    same file, so a run stopped half-way and started again reopens its job (the site keeps what it
    acknowledged) or, when the site already published the file, learns it instead of being refused."""
    seed = hashlib.sha256(b"paramedic-ship\0" + out.encode() + b"\0" + codec.encode() + b"\0")
    seed.update(file_digest if file_digest is not None else hashlib.sha256(data).digest())
    return seed.hexdigest()[:32]


def _published_earlier_of(
    settings: ShipSettings, job_ids: list[str], data: bytes, digest: str
) -> ShipReport | None:
    """`_published_earlier` of the first of `job_ids` the site published. The ids are asked at once (a TLS
    site: one connection each, as the site closes a connection on the refusal an unknown job gets; asked
    one after the other they cost the metadata path 50 ms more before its job opened)."""
    answers: list[ShipReport | None] = [None] * len(job_ids)

    def asker(i: int) -> Callable[[], None]:
        def ask() -> None:
            answers[i] = _published_earlier(settings, job_ids[i], data, digest)

        return ask

    asking = [_Background(asker(i)) for i in range(1, len(job_ids))]
    if job_ids:
        asker(0)()
    for job in asking:
        failure = job.wait()[1]
        if failure is not None:
            raise failure
    return next((done for done in answers if done is not None), None)


def _published_earlier(settings: ShipSettings, job_id: str, data: bytes, digest: str) -> ShipReport | None:
    """The report of an earlier run of this command whose file the site published, checked against this
    file's size and SHA-256; None otherwise. A TLS site is asked; in an inbox the answer is the done.json
    an earlier run left unread in the job's directory."""
    scheme = scheme_named(settings.site.scheme, f"--site {settings.site}")
    done = scheme.finished_job(settings.site, settings.keys, job_id, settings.out or "")
    if done is None:
        return None
    if done.get("sha256") != digest or done.get("bytes", len(data)) != len(data):
        return None
    report = ShipReport(
        site=str(settings.site),
        mode=settings.mode,
        codec="",
        streams=settings.streams,
        output_path=settings.out or "",
        output_bytes=len(data),
        shipped_payload_bytes=0,
        setup_bytes=0,
        wire_bytes=0,
        ratio_output_to_payload=None,
        chunks=0,
        chunks_resent=0,
        reconnects=0,
        f_encode_seconds=0.0,
        transfer_seconds=None,
        finish_wait_seconds=0.0,
        g_site_decode_seconds=None,
        site_sha256=digest,
        auto_decision=None,
    )
    report["already_at_site"] = True
    return report


def _ship_compressed_instead(
    settings: ShipSettings,
    app: Application,
    data: bytes,
    precision: str,
    decision: dict[str, Any] | None,
    sha: Any,
    refusal: str,
) -> ShipReport:
    """`auto` chose metadata and the site refused to regenerate it for its memory: the file compressed, in a
    job of its own (the id `--ship compressed` would use), the refusal kept in the decision."""
    codec = _codec(app, COMPRESSED, precision)
    job_id = resumable_job_id(settings.out or "", codec.name, data, sha.digest())
    done = _published_earlier_of(settings, [job_id], data, sha.hexdigest())
    if done is not None:
        return _with_precision(done, app, precision)
    shipper = open_shipper(_opening(settings, codec.name, job_id))
    _start(shipper)
    shipping = Shipping(settings, COMPRESSED, codec, shipper, 0)
    shipping.decision = {**(decision or {}), "mode": COMPRESSED, "metadata_refused": refusal}
    try:
        shipping.write(data)
        shipping.commit()
    except BaseException:
        shipping.abort()
        raise
    return _with_precision(shipping.report(), app, precision)


def _with_precision(report: ShipReport, app: Application, precision: str) -> ShipReport:
    if app.name == "trace":
        report["precision"] = precision
    return report


def _limit(app: Application, made: Metadata) -> None:
    if len(made[1]) > MAX_PAYLOAD_BYTES:
        raise UsageError(
            f"the {app.name} metadata is {len(made[1])} bytes, over the link's {MAX_PAYLOAD_BYTES}-byte "
            "payload limit: ship it compressed"
        )


def _units_of(codec: Any, data: bytes) -> list[Any] | None:
    """The units the codec cuts `data` into (ship.trace_codec), None when it ships the file whole."""
    return codec.units(data) if hasattr(codec, "units") else None


def _unit_count(codec: Any, data: bytes) -> int | None:
    return codec.unit_count(data) if hasattr(codec, "unit_count") else None


def _units_check(codec: Any, units: list[Any], data: bytes) -> Check:
    return lambda: codec.check_units(units, data)


def _payload(made: list[Metadata]) -> int:
    return sum(len(payload) for _, payload in made)


def _encode_all(
    codec: Any, data: bytes, units: list[Any] | None
) -> tuple[list[Metadata], Check | None, float]:
    """The metadata of `units` (or of the whole file when None), and its rebuild check when the codec offers
    it apart (else it is checked already)."""
    start = time.perf_counter()
    check: Check | None
    if units is not None:
        made = [codec.encode_unit(unit) for unit in units]
        check = _units_check(codec, units, data)
    elif hasattr(codec, "encode_unchecked"):
        one, check = codec.encode_unchecked((0, data))
        made = [one]
    else:
        made, check = [codec.encode((0, data))], None
    return made, check, time.perf_counter() - start


class _Background:
    """`action` on a daemon thread (a site that never answers does not keep the process alive once the
    command has failed for another reason); `wait` gives what it raised, None when it succeeded."""

    def __init__(self, action: Callable[[], None]):
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(action,), daemon=True, name="open-site-job")
        self.thread.start()

    def _run(self, action: Callable[[], None]) -> None:
        try:
            action()
        except BaseException as exc:  # handed to the caller
            self.failure = exc

    def wait(self, timeout: float | None = None) -> tuple[bool, BaseException | None]:
        """(finished, what it raised)."""
        self.thread.join(timeout)
        return not self.thread.is_alive(), self.failure
