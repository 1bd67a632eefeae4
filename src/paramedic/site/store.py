"""The storage site's jobs on disk: received chunks, decoded output, the final file. Survives restarts.

Every step is durable before it is acknowledged, so a restarted server resumes where it stopped:

    state/<job>/job.json         who opened the job, its output path, codec and setup header
    state/<job>/setup.bin        the setup payload (for the BLAST codec: the queries)
    state/<job>/chunks/N.bin     a chunk's payload, fsynced; then N.json (its header) marks it acknowledged
    state/<job>/decoded/N.json   the chunk is decoded: for "ranges" its bytes are in the partial output at
                                 their offset (pwrite, fsync); for "pieces" its pieces are in pieces/
    state/<job>/done.json        the final file is in place: its size and SHA-256
    state/<job>/failed.json      the job cannot complete: why (final; a restart does not retry it)

Jobs left idle for `expire_seconds` (--expire-after) move on, so abandoned jobs neither hold one of the
MAX_ACTIVE_JOBS slots nor disk space for ever: an open job fails as expired (its partial data removed),
and the record of a done or failed job is deleted (a client that lost its last reply can still ask
until then).

An `ordered` codec's chunks are unpacked in index order as the gaps fill (after a restart, by replaying the
stored chunks from the first); their decoding, the expensive part, still runs in parallel.

The final file is written beside its target under a temporary name, fsynced and renamed; its digest is
computed from the bytes on disk, so what is reported is what was stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from paramedic.blast.run import Database
from paramedic.durable import fsync_dir, write_durably
from paramedic.errors import ParamedicError
from paramedic.ship.codecs import Codec, make_codec
from paramedic.ship.paths import output_path_problem
from paramedic.ship.wire import ProtocolError, field_int, field_str

JOB_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_ACTIVE_JOBS = 64
MAX_CHUNKS = 1_000_000
MAX_QUEUED_DECODES = 256
DEFAULT_EXPIRE_SECONDS = 7 * 24 * 3600.0
STATE_DIR_NAME = ".paramedic-state"


class JobFailed(Exception):
    """A job cannot complete (bad setup, decode failure, digest mismatch): the message goes to the client."""


@dataclass(frozen=True)
class Replica:
    """The storage site's copy of the formatted database."""

    database: Database
    manifest_sha256: str
    workdir: Path  # scratch space for regeneration runs


def safe_output_path(root: Path, relative: str) -> Path:
    """`relative` under `root`, or ProtocolError: no absolute paths, no `..`, no symlinks on the way."""
    problem = output_path_problem(relative)
    if problem is not None:
        raise ProtocolError(f"output path {relative[:100]!r}: {problem}")
    path = PurePosixPath(relative)
    current = root
    for part in path.parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise ProtocolError(f"output path {relative!r}: {part} is a symbolic link")
        if current.exists() and not current.is_dir():
            raise ProtocolError(f"output path {relative!r}: {part} is not a directory")
        current.mkdir(exist_ok=True)
    target = current / path.parts[-1]
    if target.is_symlink() or target.is_dir():
        raise ProtocolError(f"output path {relative!r}: exists and is not a regular file")
    if not str(target.resolve()).startswith(str(root.resolve()) + os.sep):
        raise ProtocolError(f"output path {relative!r}: leaves the root")
    return target


@dataclass
class SiteJob:
    job_id: str
    directory: Path
    peer: str
    out: Path
    codec: Codec
    context: Any
    setup_header: dict[str, Any]
    acked: set[int] = field(default_factory=set)
    decoded: dict[int, dict[str, Any]] = field(default_factory=dict)
    failure: str | None = None
    decode_seconds: float = 0.0
    unpacked: int = 0  # ordered codecs: chunks 0 .. unpacked-1 are unpacked
    # The last request for this job; wall-clock time, so that it survives restarts (file mtimes).
    touched: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)
    unpack_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def partial(self) -> Path:
        return self.out.with_name(f".{self.out.name}.paramedic-{self.job_id}")

    def done(self) -> dict[str, Any] | None:
        path = self.directory / "done.json"
        return json.loads(path.read_text()) if path.exists() else None


class JobStore:
    def __init__(
        self,
        root: Path,
        state: Path,
        replica: Replica,
        io_workers: int,
        log=print,
        expire_seconds: float = DEFAULT_EXPIRE_SECONDS,
    ):
        self.root = root.resolve()
        self.state = state
        self.replica = replica
        self.expire_seconds = expire_seconds
        self.log = log
        self.jobs: dict[str, SiteJob] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=io_workers, thread_name_prefix="io-worker")
        self.queue_slots = threading.BoundedSemaphore(MAX_QUEUED_DECODES)
        self.state.mkdir(parents=True, exist_ok=True)
        self._resume_from_disk()

    # -- opening --------------------------------------------------------------------------------------
    def open(self, peer: str, header: dict[str, Any], setup_payload: bytes | None) -> SiteJob | None:
        """Open (or reopen) a job; None when the setup payload is needed and was not sent."""
        job_id = field_str(header, "job", 32)
        if not JOB_ID.match(job_id):
            raise ProtocolError("bad job id")
        with self.lock:
            self._expire_idle_jobs()
            job = self.jobs.get(job_id)
            if job is not None:
                if job.peer != peer:
                    raise ProtocolError("job belongs to another compute site")
                if header.get("setup") != job.setup_header:
                    raise ProtocolError("job reopened with a different setup")
                job.touched = time.time()
                return job
            active = sum(1 for j in self.jobs.values() if j.failure is None and j.done() is None)
            if active >= MAX_ACTIVE_JOBS:
                raise ProtocolError(f"storage site busy: {active} jobs open")
            setup = header.get("setup")
            if not isinstance(setup, dict):
                raise ProtocolError("open: setup must be an object")
            codec = make_codec(field_str(header, "codec", 64))
            if codec.layout == "pieces" and setup_payload is None:
                return None
            out = safe_output_path(self.root, field_str(setup, "out", 1024))
            context = codec.prepare(setup, setup_payload or b"", self.replica)
            directory = self.state / job_id
            tmp = self.state / f".{job_id}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "chunks").mkdir(parents=True)
            (tmp / "decoded").mkdir()
            (tmp / "pieces").mkdir()
            write_durably(tmp / "setup.bin", setup_payload or b"")
            record = {"job": job_id, "peer": peer, "codec": codec.name, "setup": setup, "opened": time.time()}
            write_durably(tmp / "job.json", json.dumps(record).encode())
            os.replace(tmp, directory)
            fsync_dir(self.state)
            job = SiteJob(job_id, directory, peer, out, codec, context, setup)
            self.jobs[job_id] = job
            self.log(f"job {job_id}: opened by {peer}, {codec.name}, output {setup['out']}")
            return job

    def get(self, peer: str, job_id: str) -> SiteJob:
        with self.lock:
            job = self.jobs.get(job_id)
        if job is None or job.peer != peer:
            raise ProtocolError("unknown job (open it first)")
        job.touched = time.time()
        return job

    def _expire_idle_jobs(self) -> None:
        """Move on every job idle for expire_seconds (called with self.lock held)."""
        now = time.time()
        for job in list(self.jobs.values()):
            if now - job.touched < self.expire_seconds:
                continue
            if job.failure is None and job.done() is None:
                hours = self.expire_seconds / 3600
                self._fail(job, f"expired: no request for {hours:g} hours")
                job.touched = now  # its failure stays readable for another period
                continue
            shutil.rmtree(job.directory, ignore_errors=True)
            del self.jobs[job.job_id]
            self.log(f"job {job.job_id}: record deleted after {self.expire_seconds / 3600:g} hours idle")

    # -- chunks ---------------------------------------------------------------------------------------
    def put_chunk(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> bool:
        """Store a chunk durably and queue its decoding; False when its checksum does not match."""
        index = field_int(header, "index", 0, MAX_CHUNKS - 1)
        if job.failure is not None:
            raise JobFailed(job.failure)
        if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            return False
        with job.lock:
            if index in job.acked:
                return True
        chunk_header = {k: v for k, v in header.items() if k not in ("op", "job")}
        try:
            write_durably(job.directory / "chunks" / f"{index}.bin", payload)
            write_durably(job.directory / "chunks" / f"{index}.json", json.dumps(chunk_header).encode())
        except OSError:
            if job.failure is not None:  # failed meanwhile: its chunk directory is gone
                raise JobFailed(job.failure) from None
            raise
        with job.lock:
            job.acked.add(index)
        if job.codec.ordered:
            self._unpack_in_order(job)
        else:
            self._queue_decode(job, index, chunk_header, payload, unpacked=False)
        return True

    def _unpack_in_order(self, job: SiteJob) -> None:
        """Unpack an ordered codec's chunks from the first not yet unpacked up to the first gap."""
        with job.unpack_lock:
            while job.failure is None and job.unpacked in job.acked:
                index = job.unpacked
                chunks = job.directory / "chunks"
                try:
                    header = json.loads((chunks / f"{index}.json").read_text())
                    data = job.codec.unpack(header, (chunks / f"{index}.bin").read_bytes(), job.context)
                except (ProtocolError, ParamedicError, OSError, ValueError) as exc:
                    self._fail(job, f"chunk {index}: {exc}")
                    return
                job.unpacked += 1
                if index not in job.decoded:
                    self._queue_decode(job, index, header, data, unpacked=True)

    def _queue_decode(
        self, job: SiteJob, index: int, header: dict[str, Any], data: Any, *, unpacked: bool
    ) -> None:
        self.queue_slots.acquire()
        future = self.pool.submit(self._decode, job, index, header, data, unpacked)
        future.add_done_callback(lambda _: self.queue_slots.release())

    def _decode(self, job: SiteJob, index: int, header: dict[str, Any], data: Any, unpacked: bool) -> None:
        if job.failure is not None:
            return
        start = time.perf_counter()
        try:
            if not unpacked:
                data = job.codec.unpack(header, data, job.context)
            segments = job.codec.decode(header, data, job.context)
            placed = []
            if job.codec.layout == "ranges":
                fd = os.open(job.partial, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    for seg in segments:
                        os.pwrite(fd, seg.data, seg.position)
                        placed.append([seg.position, len(seg.data)])
                    os.fsync(fd)
                finally:
                    os.close(fd)
            else:
                for seg in segments:
                    write_durably(job.directory / "pieces" / f"{seg.position}.out", seg.data)
                    placed.append([seg.position, len(seg.data)])
            marker = {"segments": placed, "seconds": time.perf_counter() - start}
            write_durably(job.directory / "decoded" / f"{index}.json", json.dumps(marker).encode())
            with job.lock:
                job.decoded[index] = marker
                job.decode_seconds += marker["seconds"]
        except (ProtocolError, ParamedicError, OSError, ValueError) as exc:
            self._fail(job, f"chunk {index}: {exc}")

    def _fail(self, job: SiteJob, message: str) -> None:
        """A failed job is final: recorded on disk (a restart does not retry it), its partial data removed."""
        with job.lock:
            if job.failure is not None:
                return
            job.failure = message
        self.log(f"job {job.job_id}: failed: {message}")
        try:
            write_durably(job.directory / "failed.json", json.dumps({"message": message}).encode())
            job.partial.unlink(missing_ok=True)
        except OSError as exc:
            self.log(f"job {job.job_id}: cannot record the failure: {exc}")
        _drop_job_data(job.directory)

    # -- finishing ------------------------------------------------------------------------------------
    def finish(self, job: SiteJob, header: dict[str, Any]) -> dict[str, Any] | None:
        """The final file's size and digest once it is durable; None while chunks are still decoding."""
        try:
            return self._finish(job, header)
        except JobFailed as exc:
            self._fail(job, str(exc))
            raise

    def _finish(self, job: SiteJob, header: dict[str, Any]) -> dict[str, Any] | None:
        done = job.done()
        if done is not None:
            return done
        if job.failure is not None:
            raise JobFailed(job.failure)
        n_chunks = field_int(header, "chunks", 1, MAX_CHUNKS)
        with job.lock:
            missing = [i for i in range(n_chunks) if i not in job.acked]
            if missing:
                raise JobFailed(f"finish before chunks {missing[:5]} arrived")
            if any(i not in job.decoded for i in range(n_chunks)):
                return None
            segments = sorted(tuple(s) for i in range(n_chunks) for s in job.decoded[i]["segments"])
        if job.codec.layout == "ranges":
            expected = field_int(header, "size", 0, 2**50)
            position = 0
            for offset, length in segments:
                if offset != position:
                    raise JobFailed(f"output ranges leave a gap or overlap at byte {position}")
                position += length
            if position != expected:
                raise JobFailed(f"output has {position} bytes, the compute site sent {expected}")
            if expected == 0:
                job.partial.touch()
            os.truncate(job.partial, expected)
        else:
            indices = [s[0] for s in segments]
            if indices != list(range(len(job.context.pieces))):
                raise JobFailed("pieces missing or repeated")
            with open(job.partial, "wb") as fh:
                pieces = ((i, (job.directory / "pieces" / f"{i}.out").read_bytes()) for i in indices)
                try:
                    job.codec.assemble(pieces, job.context, fh)
                except ValueError as exc:
                    raise JobFailed(f"cannot assemble the report: {exc}") from exc
        digest, size = _digest(job.partial)
        wanted = header.get("sha256")
        if wanted is not None and wanted != digest:
            raise JobFailed("the output's SHA-256 differs from the compute site's")
        with open(job.partial, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(job.partial, job.out)
        fsync_dir(job.out.parent)
        done = {"sha256": digest, "bytes": size, "decode_seconds": round(job.decode_seconds, 3)}
        write_durably(job.directory / "done.json", json.dumps(done).encode())
        _drop_job_data(job.directory)
        self.log(f"job {job.job_id}: wrote {job.out} ({size} bytes, sha256 {digest[:16]}...)")
        return done

    # -- restart --------------------------------------------------------------------------------------
    def _resume_from_disk(self) -> None:
        for directory in sorted(self.state.iterdir()):
            if not JOB_ID.match(directory.name) or not (directory / "job.json").exists():
                continue
            try:
                record = json.loads((directory / "job.json").read_text())
                codec = make_codec(record["codec"])
                setup = record["setup"]
                out = safe_output_path(self.root, setup["out"])
                context = None
                if not (directory / "done.json").exists() and not (directory / "failed.json").exists():
                    context = codec.prepare(setup, (directory / "setup.bin").read_bytes(), self.replica)
            except (ProtocolError, ParamedicError, OSError, ValueError, KeyError) as exc:
                self.log(f"job {directory.name}: cannot resume ({exc}); left on disk")
                continue
            job = SiteJob(directory.name, directory, record["peer"], out, codec, context, setup)
            job.touched = max(p.stat().st_mtime for p in (directory, *directory.rglob("*")))
            self.jobs[job.job_id] = job
            failed = directory / "failed.json"
            if failed.exists():
                job.failure = json.loads(failed.read_text()).get("message", "failed")
                continue
            if job.done() is not None:
                continue
            for path in (directory / "decoded").glob("*.json"):
                job.decoded[int(path.stem)] = json.loads(path.read_text())
            for path in (directory / "chunks").glob("*.json"):
                job.acked.add(int(path.stem))
            pending = len(job.acked - job.decoded.keys())
            if codec.ordered:
                self._unpack_in_order(job)  # replays every stored chunk, decodes the undecoded ones
            else:
                for index in sorted(job.acked - job.decoded.keys()):
                    header = json.loads((directory / "chunks" / f"{index}.json").read_text())
                    data = (directory / "chunks" / f"{index}.bin").read_bytes()
                    self._queue_decode(job, index, header, data, unpacked=False)
            self.log(
                f"job {job.job_id}: resumed from disk, {len(job.acked)} chunks held, {pending} to decode"
            )

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _drop_job_data(directory: Path) -> None:
    """What an ended job no longer needs: chunks, pieces and setup (its record and result stay)."""
    shutil.rmtree(directory / "chunks", ignore_errors=True)
    shutil.rmtree(directory / "pieces", ignore_errors=True)
    (directory / "setup.bin").unlink(missing_ok=True)


def _digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size
