"""The storage site's jobs on disk: received chunks, decoded output, the final file. Survives restarts.

Every step is durable before it is acknowledged, so a restarted server resumes where it stopped:

    state/<job>/job.json         who opened the job, its output path, codec and setup header
    state/<job>/setup.bin        the setup payload (for the BLAST codec: the queries)
    state/<job>/chunks/N.bin     a chunk's payload, fsynced; then N.json (its header) marks it acknowledged
    state/<job>/decoded/N.json   the chunk is decoded: for "ranges" its bytes are in the partial output at
                                 their offset (pwrite, fsync); for "pieces" its pieces are in pieces/
    state/<job>/replica.json     for "pieces" with a replica: the replica files' stamps the pieces were
                                 regenerated under; a restart that finds them moved regenerates them again
    state/<job>/done.json        the final file is in place: its size and SHA-256
    state/<job>/failed.json      the job cannot complete: why (final; a restart does not retry it)

Jobs left idle move on, so abandoned jobs neither hold one of the MAX_ACTIVE_JOBS slots nor disk space
for ever: an open job with no request for `open_idle_seconds` (default one hour, never longer than
--expire-after; a live compute site sends a keep-alive every KEEPALIVE_SECONDS) fails as expired, its
partial data removed, and the record of a done or failed job is deleted after `expire_seconds`
(--expire-after: a client that lost its last reply can still ask until then). A compute site that fails
cancels its job; a new job of the same compute site for the same output supersedes a job of its silent for
STALE_SECONDS (a search killed and started again). One compute site holds at most MAX_ACTIVE_JOBS_PER_PEER open jobs, and `Quota` bounds the
bytes a job and a compute site may hold and keeps a reserve of free space: a job that would pass a bound,
or meets a full disk, fails and its data is removed, so the next jobs still find room.

Every stored piece of output carries its SHA-256 (in decoded/N.json), checked when the final file is
assembled; the final file is read back from disk and its digest compared with what was written (and, for
output ranges, with the compute site's) before it is published. Output is written through `site.safefs`
(no symbolic link is followed at write time; an existing file is never replaced; two jobs cannot hold the
same output path).

An `ordered` codec's chunks are unpacked in index order as the gaps fill (after a restart, by replaying the
stored chunks from the first); their decoding, the expensive part, still runs in parallel.

The final file is written beside its target under a temporary name, fsynced and renamed; its digest is
computed from the bytes on disk, so what is reported is what was stored.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from paramedic.blast.forkserver import bounded
from paramedic.blast.run import Database
from paramedic.db.locate import recheck_in_place
from paramedic.db.manifest import Manifest, Stamp, check_stamps, verify_volumes, volume_stamps
from paramedic.durable import fsync_dir, write_durably
from paramedic.errors import DatabaseError, ParamedicError
from paramedic.ship.apps import codec_needs_replica
from paramedic.ship.codecs import Codec
from paramedic.ship.paths import output_path_problem
from paramedic.ship.registry import make_codec
from paramedic.ship.wire import ProtocolError, field_int, field_str, loads_json
from paramedic.site.fair import FairPool
from paramedic.site.safefs import OutputLocation, TargetExists, UnsafePath
from paramedic.site.space import Published, Quota, Space

JOB_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_ACTIVE_JOBS = 256
MAX_ACTIVE_JOBS_PER_PEER = 32
MAX_CHUNKS = 1_000_000
MAX_QUEUED_DECODES = 256
MAX_QUEUED_DECODES_PER_PEER = 64  # one compute site's decodes waiting for a worker
DEFAULT_EXPIRE_SECONDS = 7 * 24 * 3600.0
DEFAULT_OPEN_IDLE_SECONDS = 3600.0
# The most one chunk's decoding (a metadata chunk: BLAST+ regenerating its pieces) may take; a BLAST+ that
# never returns fails its job, and is killed, after this (serve --regen-timeout)
DEFAULT_REGEN_SECONDS = 3600.0
KEEPALIVE_SECONDS = 30.0  # how often a live compute site touches its job (ship.client)
STALE_SECONDS = 4 * KEEPALIVE_SECONDS  # a job this silent is no longer fed by a live compute site
HOUSEKEEPING_SECONDS = 60.0
STATE_DIR_NAME = ".paramedic-state"
PUBLISHED_LEDGER = "published.json"  # each compute site's published outputs (site.space.Published)


class JobFailed(Exception):
    """A job cannot complete (bad setup, decode failure, digest mismatch): the message goes to the client."""


DEFAULT_MAX_SETUP_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Replica:
    """The storage site's copy of the formatted database."""

    database: Database
    manifest_sha256: str
    workdir: Path  # scratch space for regeneration runs
    manifest: Manifest | None = None  # what the replica's bytes are checked against, once per job
    max_setup_bytes: int = DEFAULT_MAX_SETUP_BYTES  # a job's setup inflated at most (serve --max-setup)

    def verify(self) -> tuple[Stamp, ...] | None:
        """Digest the replica's volumes before a job regenerates from them: the replica may change while
        `serve` runs (sizes and times kept or not). ProtocolError (the job is refused) when they differ.
        Returns the volume files' stamps, taken before the digest, for `unchanged` when the job ends."""
        if self.manifest is None:
            return None
        try:
            stamps = volume_stamps(self.database.directory, self.manifest)
            if self.manifest.in_place:  # its digests, remembered while the files keep their stamps
                recheck_in_place(self.database, self.manifest)
            else:
                verify_volumes(self.database.directory, self.manifest)
        except DatabaseError as exc:
            raise ProtocolError(f"storage site's replica is damaged: {exc}") from None
        return stamps

    def unchanged(self, stamps: tuple[Stamp, ...] | None) -> None:
        """JobFailed unless the replica's files are still the ones digested when the job opened: a
        replica rewritten while the job regenerated (times kept) published another report (issue 23)."""
        if stamps is None:
            return
        try:
            check_stamps(self.database.directory, stamps)
        except DatabaseError:
            raise JobFailed(
                "storage site's replica changed while this job regenerated from it (a volume written or "
                "replaced): its report is not published"
            ) from None


def safe_output_path(root: Path, relative: str) -> Path:
    """`relative` under `root`, or ProtocolError: no absolute paths, no `..`, no symlinks on the way.
    (A check of the path's shape; every write is checked again by `site.safefs`.)"""
    problem = output_path_problem(relative) or _invisible_character(relative)
    if problem is not None:
        raise ProtocolError(f"output path {relative[:100]!r}: {problem}")
    path = PurePosixPath(relative)
    current = root
    for part in path.parts[:-1]:
        current = current / part
        try:  # one look (a failed job may remove an empty directory between two)
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            raise ProtocolError(f"output path {relative!r}: {part} is a symbolic link")
        if not stat.S_ISDIR(mode):
            raise ProtocolError(f"output path {relative!r}: {part} is not a directory")
    target = current / path.parts[-1]
    if target.is_symlink() or target.is_dir():
        raise ProtocolError(f"output path {relative!r}: exists and is not a regular file")
    return target


# Characters a name may not hold at the site: controls, format characters (the bidirectional overrides
# that show "evil\u202egpj.exe" as "evilexe.jpg", zero-width joiners), line and paragraph separators,
# surrogates
_INVISIBLE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")


def _invisible_character(relative: str) -> str | None:
    """Why a name would not read as what it is (issue 41: U+202E was accepted), or None."""
    for char in relative:
        if unicodedata.category(char) in _INVISIBLE_CATEGORIES:
            return f"contains U+{ord(char):04X}, a control or formatting character"
    return None


def output_location(root_fd: int, relative: str, job_id: str) -> OutputLocation:
    path = PurePosixPath(relative)
    name = path.parts[-1]
    return OutputLocation(root_fd, path.parts[:-1], name, f".{name}.paramedic-{job_id}", relative)


# The most a request waits for another thread's work on the same job (a failure's cleanup, a finishing)
# before it answers: under the compute site's own timeout for such a question (ship.client, 5 s)
CLEANUP_WAIT_SECONDS = 3.0


# The most a request waits for another request opening the same job (its setup parsed) before it refuses
OPENING_WAIT_SECONDS = 30.0


@dataclass
class _Claim:
    """A job being opened: its slot and output path are held while its setup is parsed."""

    job_id: str
    peer: str
    codec: Codec
    setup: dict[str, Any]
    relative: str
    out: Path
    location: OutputLocation
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass
class SiteJob:
    job_id: str
    directory: Path
    peer: str
    out: Path
    codec: Codec
    context: Any
    setup_header: dict[str, Any]
    location: OutputLocation | None = None
    # the replica's files as digested when the job opened (Replica.verify); None after a restart
    replica_stamps: tuple[Stamp, ...] | None = None
    acked: set[int] = field(default_factory=set)
    decoded: dict[int, dict[str, Any]] = field(default_factory=dict)
    failure: str | None = None
    # set once a failed job's data is gone: whoever sees the failure waits for it before saying so (a
    # compute site told "failed" finds nothing of the job left)
    cleaned: threading.Event = field(default_factory=threading.Event)
    decode_seconds: float = 0.0
    unpacked: int = 0  # ordered codecs: chunks 0 .. unpacked-1 are unpacked
    stored_bytes: int = 0  # chunks, pieces and output ranges held for the job (Quota)
    running: int = 0  # decodes running now (reported to a client waiting in finish)
    decoding: dict[int, float] = field(default_factory=dict)  # chunk -> when its decode began (monotonic)
    # The last request for this job; wall-clock time, so that it survives restarts (file mtimes).
    touched: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)
    unpack_lock: threading.Lock = field(default_factory=threading.Lock)
    io_lock: threading.Lock = field(default_factory=threading.Lock)  # the partial file; finishing

    @property
    def partial(self) -> Path:
        return self.out.with_name(f".{self.out.name}.paramedic-{self.job_id}")

    def done(self) -> dict[str, Any] | None:
        path = self.directory / "done.json"
        return json.loads(path.read_text()) if path.exists() else None

    def settled(self) -> dict[str, Any] | None:
        """As `done`, after a finishing under way (the output being published, its digest recorded) has
        ended, waiting a bounded time: a compute site asking about an earlier run's job must not be
        told "open" in the moment between the file's publication and its record."""
        if self.io_lock.acquire(timeout=CLEANUP_WAIT_SECONDS):
            self.io_lock.release()
        if self.failure is not None:
            self.cleaned.wait(CLEANUP_WAIT_SECONDS)
        return self.done()

    @property
    def active(self) -> bool:
        return self.failure is None and not (self.directory / "done.json").exists()


class JobStore:
    def _prepare(self, codec: Codec, setup: dict[str, Any], payload: bytes, job_id: str) -> Any:
        """The codec's job context; a site without a replica refuses the applications that need one
        (`ship.apps`: BLAST's metadata), and serves the others (traces, plain output)."""
        if self.replica is None:
            if codec_needs_replica(codec.name):
                raise ProtocolError(
                    f"this storage site holds no database replica: it cannot regenerate {codec.name} "
                    "output (ship compressed or direct, or serve with --replica)"
                )
            return codec.prepare(setup, payload, None)
        return codec.prepare(setup, payload, self._job_replica(job_id))

    def __init__(
        self,
        root: Path,
        state: Path,
        replica: Replica | None,
        io_workers: int,
        log=print,
        expire_seconds: float = DEFAULT_EXPIRE_SECONDS,
        open_idle_seconds: float = DEFAULT_OPEN_IDLE_SECONDS,
        quota: Quota | None = None,
        regen_seconds: float = DEFAULT_REGEN_SECONDS,
    ):
        self.root = root.resolve()
        self.root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.state = state
        self.replica = replica
        self.expire_seconds = expire_seconds
        self.open_idle_seconds = min(open_idle_seconds, expire_seconds)
        self.regen_seconds = regen_seconds
        self.space = Space(quota or Quota(), (state, self.root))
        self.log = log
        self.jobs: dict[str, SiteJob] = {}
        self.targets: dict[str, str] = {}  # output path -> the active job that writes it
        self.opening: dict[str, _Claim] = {}  # jobs whose setup is being parsed (outside self.lock)
        self.lock = threading.Lock()
        self.targets_lock = threading.Lock()
        self.pool = FairPool(io_workers, MAX_QUEUED_DECODES_PER_PEER, MAX_QUEUED_DECODES)
        self.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.published = Published(self.state / PUBLISHED_LEDGER, self.root_fd)
        self.stopping = threading.Event()
        self._resume_from_disk()
        self.housekeeper = threading.Thread(target=self._housekeeping, daemon=True, name="housekeeping")
        self.housekeeper.start()

    # -- opening --------------------------------------------------------------------------------------
    def open(self, peer: str, header: dict[str, Any], setup_payload: bytes | None) -> SiteJob | None:
        """Open (or reopen) a job; None when the setup payload is needed and was not sent. The job's room
        and output are claimed under the store's lock, its setup parsed outside it: a setup takes seconds
        to parse, and every other compute site's requests wait for that lock (issue 41, item 3)."""
        job_id = field_str(header, "job", 32)
        if not JOB_ID.match(job_id):
            raise ProtocolError("bad job id")
        codec_name = field_str(header, "codec", 64)
        stamps = None
        if self.replica is not None and job_id not in self.jobs and make_codec(codec_name).layout == "pieces":
            stamps = self.replica.verify()  # a new job that regenerates: its replica's bytes, digested
        claim = self._claim(job_id, peer, header, setup_payload)
        if claim is None or isinstance(claim, SiteJob):
            return claim
        opened = False  # until then a refusal removes the directories made on the output's way
        try:
            job = self._make_job(claim, setup_payload or b"", stamps)
            opened = True
            return job
        finally:
            with self.lock:
                del self.opening[job_id]
                if not opened:
                    self._release_claim(claim)
            claim.ended.set()

    def _claim(
        self, job_id: str, peer: str, header: dict[str, Any], setup_payload: bytes | None
    ) -> SiteJob | _Claim | None:
        """Under the store's lock: the job if it exists (reopened), None if its setup must be sent, else
        the job's claim on a slot and its output path (`opening`) while its setup is parsed. A job being
        opened by another request is waited for (a bounded time), then reopened."""
        with self.lock:
            self._expire_idle_jobs()
            job = self.jobs.get(job_id)
            if job is not None:
                return self._reopen(job, peer, header)
            other = self.opening.get(job_id)
            if other is None:
                return self._new_claim(job_id, peer, header, setup_payload)
        other.ended.wait(OPENING_WAIT_SECONDS)
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise ProtocolError(
                    "job not opened: another request opening it was refused or is still at it"
                )
            return self._reopen(job, peer, header)

    def _new_claim(
        self, job_id: str, peer: str, header: dict[str, Any], setup_payload: bytes | None
    ) -> _Claim | None:
        """A new job's checks that need the store's lock (held): room, output path, free space."""
        self._check_room(peer)
        setup = header.get("setup")
        if not isinstance(setup, dict):
            raise ProtocolError("open: setup must be an object")
        codec = make_codec(field_str(header, "codec", 64))
        relative = field_str(setup, "out", 1024)
        out = safe_output_path(self.root, relative)
        self._free_target(relative, peer)
        location = output_location(self.root_fd, relative, job_id)
        try:
            try:
                location.check_target_free()
            except OSError as exc:
                raise ProtocolError(f"output path {relative!r}: {_describe(exc)}") from None
            if codec.layout == "pieces" and setup_payload is None:
                location.remove_empty_directories()
                return None
            self.space.check_free(len(setup_payload or b""))
            more = len(setup_payload or b"")
            held = self._held_by(peer) + self.published.held(peer)
            problem = self.space.peer_problem(held + more, more)
            if problem is not None:
                raise ProtocolError(problem)
        except BaseException:
            location.remove_empty_directories()
            raise
        claim = _Claim(job_id, peer, codec, setup, relative, out, location)
        self.opening[job_id] = claim
        with self.targets_lock:
            self.targets[relative] = job_id
        return claim

    def _make_job(self, claim: _Claim, payload: bytes, stamps: tuple[Stamp, ...] | None) -> SiteJob:
        """A claimed job made: its setup parsed (outside the store's lock), its directory written, and
        the job put among the store's."""
        context = self._prepare(claim.codec, claim.setup, payload, claim.job_id)
        record = {
            "job": claim.job_id,
            "peer": claim.peer,
            "codec": claim.codec.name,
            "setup": claim.setup,
            "opened": time.time(),
        }
        directory = self._job_directory(claim.job_id, payload, record, stamps)
        job = SiteJob(
            claim.job_id, directory, claim.peer, claim.out, claim.codec, context, claim.setup, claim.location
        )
        job.replica_stamps = stamps
        job.stored_bytes = len(payload)
        with self.lock:
            self.jobs[claim.job_id] = job
        self.log(f"job {claim.job_id}: opened by {claim.peer}, {claim.codec.name}, output {claim.relative}")
        return job

    def _release_claim(self, claim: _Claim) -> None:
        """A claim refused while its setup was parsed: its output path free again, nothing left on the way."""
        with self.targets_lock:
            if self.targets.get(claim.relative) == claim.job_id:
                del self.targets[claim.relative]
        claim.location.remove_empty_directories()
        if self.replica is not None:
            shutil.rmtree(self.replica.workdir / claim.job_id, ignore_errors=True)

    def _reopen(self, job: SiteJob, peer: str, header: dict[str, Any]) -> SiteJob:
        """A job opened again (another stream, a reconnection): the same compute site, the same setup."""
        if job.peer != peer:
            raise ProtocolError("job belongs to another compute site")
        if header.get("setup") != job.setup_header:
            raise ProtocolError("job reopened with a different setup")
        job.touched = time.time()
        return job

    def _check_room(self, peer: str) -> None:
        """Refuses a new job past the site's open jobs, or past this compute site's (under the lock)."""
        active: list[SiteJob | _Claim] = [j for j in self.jobs.values() if j.active]
        active += self.opening.values()
        if len(active) >= MAX_ACTIVE_JOBS:
            raise ProtocolError(f"storage site busy: {len(active)} jobs open")
        mine = sum(1 for j in active if j.peer == peer)
        if mine >= MAX_ACTIVE_JOBS_PER_PEER:
            raise ProtocolError(f"storage site busy: this compute site has {mine} jobs open")

    def _free_target(self, relative: str, peer: str) -> None:
        """Refuses an output another job is writing now. The same compute site's job silent for minutes (a
        live one sends keep-alives) is a search killed and started again: that job is failed instead."""
        with self.targets_lock:
            holder_id = self.targets.get(relative, "")
        if holder_id in self.opening:
            raise ProtocolError(
                f"output path {relative!r}: another job is writing it now (retry once it ends or expires)"
            )
        holder = self.jobs.get(holder_id)
        if holder is None or not holder.active:
            return
        if holder.peer != peer or time.time() - holder.touched < STALE_SECONDS:
            raise ProtocolError(
                f"output path {relative!r}: another job is writing it now (retry once it ends or expires)"
            )
        self._fail(holder, "superseded: a new job of the same compute site writes the same output")

    def _job_directory(
        self, job_id: str, payload: bytes, record: dict[str, Any], stamps: tuple[Stamp, ...] | None
    ) -> Path:
        """The job's state directory, made whole under a temporary name and renamed into place: its setup,
        its record, the replica's stamps, and empty chunks/decoded/pieces."""
        directory = self.state / job_id
        tmp = self.state / f".{job_id}.tmp"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "chunks").mkdir(parents=True)
            (tmp / "decoded").mkdir()
            (tmp / "pieces").mkdir()
            write_durably(tmp / "setup.bin", payload)
            write_durably(tmp / "job.json", json.dumps(record).encode())
            if stamps is not None:
                _write_replica_stamps(tmp, stamps)
            os.replace(tmp, directory)
            fsync_dir(self.state)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ProtocolError(f"storage site cannot open the job: {_describe(exc)}") from None
        return directory

    def _drop_scratch(self, job: SiteJob) -> None:
        """The job's regeneration scratch directory (none at a site without a replica), and whatever BLAST+
        still runs in it: a job failed or cancelled while a regeneration hung would otherwise leave that
        process running, and the I/O worker thread waiting for it, for good."""
        if self.replica is not None:
            _end_processes_in(self.replica.workdir / job.job_id)
            shutil.rmtree(self.replica.workdir / job.job_id, ignore_errors=True)

    def _job_replica(self, job_id: str) -> Replica:
        """The replica with a scratch directory of the job's own: its BLAST+ runs are found (by their
        working directory) and ended when its regeneration runs past --regen-timeout."""
        assert self.replica is not None
        workdir = self.replica.workdir / job_id
        workdir.mkdir(parents=True, exist_ok=True, mode=0o700)  # its queries and BLAST+'s files: the site's
        return dataclasses.replace(self.replica, workdir=workdir)

    def get(self, peer: str, job_id: str) -> SiteJob:
        with self.lock:
            job = self.jobs.get(job_id)
        if job is None or job.peer != peer:
            raise ProtocolError("unknown job (open it first)")
        job.touched = time.time()
        return job

    def cancel(self, job: SiteJob) -> None:
        """The compute site gave up (its search failed): the job ends now and its data goes."""
        if job.active:
            self._fail(job, "cancelled by the compute site")

    def _expire_idle_jobs(self) -> None:
        """Move on every idle job, and fail every job whose decoding runs past --regen-timeout (called
        with self.lock held)."""
        now = time.time()
        for job in list(self.jobs.values()):
            with job.lock:
                stuck = [i for i, t in job.decoding.items() if time.monotonic() - t > self.regen_seconds]
            if stuck and job.failure is None:
                self._fail(
                    job,
                    f"chunk {stuck[0]}: regenerating took longer than {_duration(self.regen_seconds)} "
                    "(serve --regen-timeout); stopped",
                )
                if self.replica is not None:
                    _end_processes_in(self.replica.workdir / job.job_id)
            if job.active:
                if now - job.touched >= self.open_idle_seconds:
                    self._fail(job, f"expired: no request for {_duration(self.open_idle_seconds)}")
                    job.touched = now  # its failure stays readable for another period
                continue
            if now - job.touched < self.expire_seconds:
                continue
            shutil.rmtree(job.directory, ignore_errors=True)
            del self.jobs[job.job_id]
            self.log(f"job {job.job_id}: record deleted after {_duration(self.expire_seconds)} idle")

    def _housekeeping(self) -> None:
        """Idle jobs expire (and free their disk space) even when no new job opens."""
        period = min(HOUSEKEEPING_SECONDS, max(min(self.open_idle_seconds, self.regen_seconds) / 4, 0.05))
        while not self.stopping.wait(period):
            try:
                with self.lock:
                    self._expire_idle_jobs()
            except Exception as exc:  # keep the thread: one bad record must not stop expiry
                self.log(f"housekeeping: {type(exc).__name__}: {exc}")

    # -- space ----------------------------------------------------------------------------------------
    def _reserve(self, job: SiteJob, more: int) -> None:
        """Count `more` bytes against the job, or fail the job (JobFailed) if they would pass a quota or eat
        into the free-space reserve (site.space). Counted at once, so concurrent decodes cannot both pass
        a bound."""
        with job.lock:
            problem = self.space.job_problem(job.stored_bytes + more)
            if problem is None:
                job.stored_bytes += more
        if problem is None:
            published = self.published.held(job.peer)  # (files looked at: not under the store's lock)
            with self.lock:
                held = self._held_by(job.peer)
            problem = self.space.peer_problem(held + published, more)
        if problem is not None:
            self._fail(job, problem)
            raise JobFailed(job.failure or problem)

    def _held_by(self, peer: str) -> int:
        """What one compute site's open jobs hold here (under self.lock); its published outputs are
        `self.published.held(peer)`."""
        return sum(j.stored_bytes for j in self.jobs.values() if j.active and j.peer == peer)

    # -- chunks ---------------------------------------------------------------------------------------
    def put_chunk(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> bool:
        """Store a chunk durably and queue its decoding; False when its checksum does not match."""
        index = field_int(header, "index", 0, MAX_CHUNKS - 1)
        if job.failure is not None:
            job.cleaned.wait(CLEANUP_WAIT_SECONDS)
            raise JobFailed(job.failure)
        if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            return False
        with job.lock:
            if index in job.acked:
                return True
        self._reserve(job, len(payload))
        chunk_header = {k: v for k, v in header.items() if k not in ("op", "job")}
        try:
            with self.space.coming(len(payload)):
                write_durably(job.directory / "chunks" / f"{index}.bin", payload)
                write_durably(job.directory / "chunks" / f"{index}.json", json.dumps(chunk_header).encode())
        except (OSError, ProtocolError) as exc:
            if job.failure is None:  # e.g. the disk is full: the job ends here, its data goes
                self._fail(job, f"storage site cannot store chunk {index}: {_describe(exc)}")
            raise JobFailed(job.failure) from None
        if job.failure is not None:  # failed while this chunk was written: its cleanup may have missed it
            _drop_job_data(job.directory)
            raise JobFailed(job.failure)
        with job.lock:
            job.acked.add(index)
        if job.codec.ordered:
            self._unpack_in_order(job)
        else:  # read back from disk when its decode starts: a chunk waiting for a worker holds no memory
            self._queue_decode(job, index, chunk_header, None, unpacked=False)
        return True

    def _unpack_in_order(self, job: SiteJob) -> None:
        """Unpack an ordered codec's chunks from the first not yet unpacked up to the first gap."""
        with job.unpack_lock:
            while job.failure is None and job.unpacked in job.acked:
                index = job.unpacked
                chunks = job.directory / "chunks"
                try:
                    header = loads_json((chunks / f"{index}.json").read_bytes(), "chunk header")
                    data = job.codec.unpack(header, (chunks / f"{index}.bin").read_bytes(), job.context)
                except (ProtocolError, ParamedicError, OSError, ValueError) as exc:
                    self._fail(job, f"chunk {index}: {_describe(exc)}")
                    return
                except Exception as exc:  # a bug in a codec: the job fails, the site goes on
                    self._fail(job, f"chunk {index}: internal error while unpacking: {exc!r}")
                    return
                job.unpacked += 1
                if index not in job.decoded:
                    self._queue_decode(job, index, header, data, unpacked=True)

    def _queue_decode(
        self, job: SiteJob, index: int, header: dict[str, Any], data: Any, *, unpacked: bool
    ) -> None:
        try:  # the compute sites take the I/O workers in turn (site.fair)
            self.pool.submit(job.peer, lambda: self._decode(job, index, header, data, unpacked))
        except RuntimeError:  # the store is closing
            return

    def _decode(self, job: SiteJob, index: int, header: dict[str, Any], data: Any, unpacked: bool) -> None:
        """On an I/O worker. Whatever goes wrong fails the job, in the log and for the client: nothing may
        vanish in the pool and leave the job pending."""
        if job.failure is not None:
            return
        with job.lock:
            job.running += 1
            job.decoding[index] = time.monotonic()
        start = time.perf_counter()
        try:
            # the regeneration's bound reaches the BLAST+ fork server too: one that stops answering is
            # killed at it, not waited for by this thread for good (housekeeping fails the job meanwhile)
            with bounded(self.regen_seconds):
                if data is None:
                    data = _stored_chunk(job.directory, index, header)
                if not unpacked:
                    data = job.codec.unpack(header, data, job.context)
                segments = job.codec.decode(header, data, job.context)
            size = sum(len(seg.data) for seg in segments)
            self._reserve(job, size)
            placed: list[list[int | str]] = []  # [position, length] or [piece, length, sha256]
            with job.io_lock, self.space.coming(size):
                if job.failure is not None:
                    return
                if job.codec.layout == "ranges":
                    assert job.location is not None
                    with job.location.open_partial(create=True) as fd:
                        for seg in segments:
                            os.pwrite(fd, seg.data, seg.position)
                            placed.append([seg.position, len(seg.data)])
                        os.fsync(fd)
                else:
                    for seg in segments:
                        write_durably(job.directory / "pieces" / f"{seg.position}.out", seg.data)
                        placed.append([seg.position, len(seg.data), hashlib.sha256(seg.data).hexdigest()])
            marker: dict[str, Any] = {"segments": placed, "seconds": time.perf_counter() - start}
            write_durably(job.directory / "decoded" / f"{index}.json", json.dumps(marker).encode())
            if job.failure is not None:  # failed meanwhile (another chunk): its cleanup may have missed this
                _drop_job_data(job.directory)
                return
            with job.lock:
                job.decoded[index] = marker
                job.decode_seconds += marker["seconds"]
        except JobFailed:
            pass  # already failed (a quota), and logged
        except (ProtocolError, ParamedicError, OSError, ValueError) as exc:
            try:  # a BLAST+ that crashed on a replica changed under it: say that, not "exit -11"
                if self.replica is not None:
                    self.replica.unchanged(job.replica_stamps)
            except JobFailed as changed:
                self._fail(job, str(changed))
            else:
                self._fail(job, f"chunk {index}: {_describe(exc)}")
        except Exception as exc:  # a bug in a codec, or in BLAST+'s handling: fail, never hang
            self._fail(job, f"chunk {index}: internal error while decoding: {exc!r}")
        finally:
            with job.lock:
                job.running -= 1
                job.decoding.pop(index, None)

    def _fail(self, job: SiteJob, message: str) -> None:
        """A failed job is final: recorded on disk (a restart does not retry it), its partial data removed
        first (so a failure for want of space frees space before it is recorded). A second caller (another
        thread failing the same job) returns once the first has removed the data."""
        with job.lock:
            first = job.failure is None
            if first:
                job.failure = message
        if not first:
            job.cleaned.wait(CLEANUP_WAIT_SECONDS)
            return
        try:
            self._drop_failed(job, message)
        finally:
            job.cleaned.set()

    def _drop_failed(self, job: SiteJob, message: str) -> None:
        self.log(f"job {job.job_id}: failed: {message}")
        with job.io_lock:
            if job.location is not None:
                job.location.drop_partial()
                job.location.remove_empty_directories()
        _drop_job_data(job.directory)
        self._drop_scratch(job)
        job.stored_bytes = 0
        self._release_target(job)
        try:
            write_durably(job.directory / "failed.json", json.dumps({"message": message}).encode())
        except OSError as exc:
            self.log(f"job {job.job_id}: cannot record the failure: {_describe(exc)}")

    def _release_target(self, job: SiteJob) -> None:
        relative = job.setup_header.get("out")
        with self.targets_lock:
            if relative is not None and self.targets.get(relative) == job.job_id:
                del self.targets[relative]

    # -- finishing ------------------------------------------------------------------------------------
    def finish(self, job: SiteJob, header: dict[str, Any]) -> dict[str, Any] | None:
        """The final file's size and digest once it is durable; None while chunks are still decoding."""
        try:
            with job.io_lock:
                return self._finish(job, header)
        except JobFailed as exc:
            self._fail(job, str(exc))
            raise
        except (OSError, UnsafePath) as exc:  # e.g. the disk filled while assembling
            self._fail(job, f"cannot write the output: {_describe(exc)}")
            raise JobFailed(job.failure) from None

    def _finish(self, job: SiteJob, header: dict[str, Any]) -> dict[str, Any] | None:
        done = job.done()
        if done is not None:
            return done
        if job.failure is not None:
            raise JobFailed(job.failure)
        location = job.location
        assert location is not None
        n_chunks = field_int(header, "chunks", 1, MAX_CHUNKS)
        with job.lock:
            missing = [i for i in range(n_chunks) if i not in job.acked]
            if missing:
                raise JobFailed(f"finish before chunks {missing[:5]} arrived")
            if any(i not in job.decoded for i in range(n_chunks)):
                return None
            segments = sorted(tuple(s) for i in range(n_chunks) for s in job.decoded[i]["segments"])
        wanted = header.get("sha256")
        if location.published():  # a restart after the file got its name: only the records are left to do
            return self._done(job, wanted)
        if job.codec.layout == "ranges":
            self._write_ranges(job, location, segments, field_int(header, "size", 0, 2**50), wanted)
        else:
            self._assemble_pieces(job, location, segments)
        try:
            location.publish()
        except TargetExists as exc:
            raise JobFailed(str(exc)) from None
        return self._done(job, wanted)

    @staticmethod
    def _write_ranges(
        job: SiteJob, location: OutputLocation, segments: list[tuple[Any, ...]], expected: int, wanted: Any
    ) -> None:
        """The ranges layout: the chunks' ranges must tile the file the compute site sent, whose SHA-256
        the bytes on disk must have."""
        position = 0
        for offset, length, *_ in segments:
            if offset != position:
                raise JobFailed(f"output ranges leave a gap or overlap at byte {position}")
            position += length
        if position != expected:
            raise JobFailed(f"output has {position} bytes, the compute site sent {expected}")
        with location.open_partial(create=True) as fd:
            os.ftruncate(fd, expected)
            os.fsync(fd)
            digest, _ = _digest_fd(fd)
        if wanted is not None and wanted != digest:
            raise JobFailed("the output's SHA-256 differs from the compute site's")

    def _assemble_pieces(
        self, job: SiteJob, location: OutputLocation, segments: list[tuple[Any, ...]]
    ) -> None:
        """The pieces layout: every piece regenerated once, each still its regeneration's bytes, assembled
        by the codec; the file on disk must be what was assembled."""
        indices = [s[0] for s in segments]
        if indices != list(range(len(job.context.pieces))):
            raise JobFailed("pieces missing or repeated")
        sums = {s[0]: s[2] if len(s) > 2 else None for s in segments}
        if self.replica is not None:
            self.replica.unchanged(job.replica_stamps)  # every piece is regenerated by now
        with location.open_partial(create=True, truncate=True) as fd:
            out = _HashingFile(fd)
            try:
                job.codec.assemble(self._checked_pieces(job, indices, sums), job.context, out)
            except ValueError as exc:
                raise JobFailed(f"cannot assemble the report: {exc}") from exc
            os.fsync(fd)
            on_disk, size = _digest_fd(fd)
        if on_disk != out.digest.hexdigest() or size != out.size:
            raise JobFailed("the output file on disk differs from what was assembled (SHA-256 mismatch)")

    def _checked_pieces(self, job: SiteJob, indices: list[int], sums: dict[int, str | None]):
        for i in indices:
            data = (job.directory / "pieces" / f"{i}.out").read_bytes()
            if sums[i] is not None and hashlib.sha256(data).hexdigest() != sums[i]:
                raise JobFailed(
                    f"regenerated piece {i} changed on disk after it was written (SHA-256 mismatch)"
                )
            yield i, data

    def _done(self, job: SiteJob, wanted: Any) -> dict[str, Any]:
        """The published file's digest, from its bytes on disk; then the records."""
        assert job.location is not None
        digest = hashlib.sha256()
        size = 0
        for block in job.location.read_target():
            digest.update(block)
            size += len(block)
        if wanted is not None and wanted != digest.hexdigest():
            raise JobFailed("the published output's SHA-256 differs from the compute site's")
        done: dict[str, Any] = {
            "sha256": digest.hexdigest(),
            "bytes": size,
            "decode_seconds": round(job.decode_seconds, 3),
        }
        write_durably(job.directory / "done.json", json.dumps(done).encode())
        self.published.add(job.peer, job.location.display)
        job.location.drop_partial()
        _drop_job_data(job.directory)
        self._drop_scratch(job)
        job.stored_bytes = 0
        self._release_target(job)
        self.log(
            f"job {job.job_id}: wrote {job.location.display} ({size} bytes, sha256 {done['sha256'][:16]}...)"
        )
        return done

    # -- restart --------------------------------------------------------------------------------------
    def _resume_from_disk(self) -> None:
        """The jobs a stopped site held, taken up again from their directories in the state."""
        replica: list[tuple[Stamp, ...] | None | str] = []  # digested once, for every job resumed

        def replica_now() -> tuple[Stamp, ...] | None:
            """The replica's stamps, digested now (it may have changed while the site was down: the
            digest at a job's open does not cover a restart); ProtocolError when it differs."""
            if not replica:
                try:
                    assert self.replica is not None
                    replica.append(self.replica.verify())
                except ProtocolError as exc:
                    replica.append(str(exc))
            if isinstance(replica[0], str):
                raise ProtocolError(replica[0])
            return replica[0]

        for directory in sorted(self.state.iterdir()):
            if JOB_ID.match(directory.name) and (directory / "job.json").exists():
                self._resume(directory, replica_now)

    def _resume(self, directory: Path, replica_now: Callable[[], tuple[Stamp, ...] | None]) -> None:
        """One job's directory: its record read back (or the job left on disk, said), a failed or done job
        kept as it is, an unfinished one prepared again and its stored chunks decoded."""
        try:
            record = loads_json((directory / "job.json").read_bytes(), "job.json")
            codec = make_codec(record["codec"])
            setup = record["setup"]
            relative = setup["out"]
            out = safe_output_path(self.root, relative)
            peer = str(record["peer"])
            if ":" not in peer and peer != "inbox":  # recorded before owners had a transport prefix
                peer = f"tls:{peer}"
        except (ProtocolError, ParamedicError, OSError, ValueError, KeyError, TypeError) as exc:
            self.log(f"job {directory.name}: cannot resume ({_describe(exc)}); left on disk")
            return
        location = output_location(self.root_fd, relative, directory.name)
        job = SiteJob(directory.name, directory, peer, out, codec, None, setup, location)
        job.touched = max(p.stat().st_mtime for p in (directory, *directory.rglob("*")))
        self.jobs[job.job_id] = job
        failed = directory / "failed.json"
        if failed.exists():
            try:
                job.failure = str(loads_json(failed.read_bytes(), "failed.json").get("message", "failed"))
            except (ProtocolError, OSError, AttributeError):
                job.failure = "failed"
            return
        if job.done() is not None:
            if relative not in self.published.outputs.get(peer, {}):  # (done under an older site)
                self.published.add(peer, relative)
            return
        try:
            job.context = self._prepare(codec, setup, (directory / "setup.bin").read_bytes(), job.job_id)
            if codec.layout == "pieces" and self.replica is not None:
                job.replica_stamps = replica_now()
                if job.replica_stamps is not None and not _same_replica(directory, job.replica_stamps):
                    _forget_pieces(directory)  # regenerated from bytes written since: again, from now
                    _write_replica_stamps(directory, job.replica_stamps)
                    self.log(
                        f"job {job.job_id}: the replica was written since its pieces were regenerated; "
                        "they are regenerated again"
                    )
        except (ProtocolError, ParamedicError, OSError, ValueError, MemoryError) as exc:
            self._fail(job, f"cannot resume after a restart: {_describe(exc)}")
            return
        with self.targets_lock:
            holder = self.targets.setdefault(relative, job.job_id)
        if holder != job.job_id:
            self._fail(job, f"output path {relative!r}: another job is writing it now")
            return
        self._reload_chunks(job)

    def _reload_chunks(self, job: SiteJob) -> None:
        """A resumed job's stored chunks: those decoded counted, the others decoded again."""
        directory = job.directory
        for path in (directory / "decoded").glob("*.json"):
            job.decoded[int(path.stem)] = json.loads(path.read_text())
        for path in (directory / "chunks").glob("*.json"):
            job.acked.add(int(path.stem))
        job.stored_bytes = sum(
            p.stat().st_size for sub in ("chunks", "pieces") for p in (directory / sub).glob("*")
        )
        if job.codec.layout == "ranges":
            job.stored_bytes += sum(seg[1] for m in job.decoded.values() for seg in m["segments"])
        pending = len(job.acked - job.decoded.keys())
        if job.codec.ordered:
            self._unpack_in_order(job)  # replays every stored chunk, decodes the undecoded ones
        else:
            for index in sorted(job.acked - job.decoded.keys()):
                header = json.loads((directory / "chunks" / f"{index}.json").read_text())
                self._queue_decode(job, index, header, None, unpacked=False)
        self.log(f"job {job.job_id}: resumed from disk, {len(job.acked)} chunks held, {pending} to decode")

    def close(self) -> None:
        self.stopping.set()
        self.pool.shutdown()


class _HashingFile:
    """A binary file object over a descriptor that digests what is written through it."""

    def __init__(self, fd: int):
        self.fd = fd
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.digest.update(data)
        self.size += len(data)
        return len(data)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:g} hours" if seconds >= 3600 else f"{seconds:g} s"


def _describe(exc: BaseException) -> str:
    """One line for the log and the client: an OSError's reason without the state paths."""
    if isinstance(exc, OSError) and not isinstance(exc, ProtocolError) and exc.strerror:
        return exc.strerror if exc.errno != errno.ENOSPC else "no space left on device"
    return str(exc) or type(exc).__name__  # (a MemoryError, or a ValueError without a message)


# A job's record of the replica's stamps (paramedic.db.manifest.volume_stamps) its pieces were regenerated
# under: the volume files' names, inodes, sizes and times, a few kilobytes at most.
REPLICA_STAMPS = "replica.json"
MAX_REPLICA_STAMPS_BYTES = 1 << 20


def _write_replica_stamps(directory: Path, stamps: tuple[Stamp, ...]) -> None:
    write_durably(directory / REPLICA_STAMPS, json.dumps([list(stamp) for stamp in stamps]).encode())


def _same_replica(directory: Path, stamps: tuple[Stamp, ...]) -> bool:
    """Whether the job's pieces were regenerated under these very replica files (issue 23): a replica
    written while the site was down, even put back byte for byte, has new ctimes (no user can set
    them back), so the pieces regenerated before the restart may hold bytes that no longer verify: the
    restart's digest covers the replica now, not then. False when the record is missing or unreadable
    (a job opened by an older site): its pieces are regenerated again, which is always exact."""
    try:
        with open(directory / REPLICA_STAMPS, "rb") as fh:
            data = fh.read(MAX_REPLICA_STAMPS_BYTES + 1)
        recorded = json.loads(data) if len(data) <= MAX_REPLICA_STAMPS_BYTES else None
    except (OSError, ValueError, RecursionError):
        return False
    return recorded == [list(stamp) for stamp in stamps]


def _forget_pieces(directory: Path) -> None:
    """Drop a job's regenerated pieces and their records; its chunks stay, to be decoded again."""
    for sub, pattern in (("decoded", "*.json"), ("pieces", "*")):
        for path in (directory / sub).glob(pattern):
            path.unlink(missing_ok=True)


def _end_processes_in(directory: Path) -> None:
    """Kill the processes (this site's BLAST+ runs) whose working directory is inside `directory`."""
    inside = str(directory.resolve()) + os.sep
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.stat(entry).st_uid != os.geteuid():
                continue
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if (cwd + os.sep).startswith(inside):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass


def _drop_job_data(directory: Path) -> None:
    """What an ended job no longer needs: chunks, decoded markers, pieces and setup (its record and result
    stay)."""
    shutil.rmtree(directory / "chunks", ignore_errors=True)
    shutil.rmtree(directory / "decoded", ignore_errors=True)
    shutil.rmtree(directory / "pieces", ignore_errors=True)
    (directory / "setup.bin").unlink(missing_ok=True)
    (directory / REPLICA_STAMPS).unlink(missing_ok=True)


def _stored_chunk(directory: Path, index: int, header: dict[str, Any]) -> bytes:
    """A chunk's payload read back from the job's directory, as the compute site sent it (its SHA-256)."""
    data = (directory / "chunks" / f"{index}.bin").read_bytes()
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise ProtocolError(f"chunk {index} changed on disk since it was stored (SHA-256 mismatch)")
    return data


def _digest_fd(fd: int) -> tuple[str, int]:
    """SHA-256 and size of the file behind `fd`, read back from the start."""
    digest = hashlib.sha256()
    size = 0
    position = 0
    while block := os.pread(fd, 1 << 20, position):
        digest.update(block)
        size += len(block)
        position += len(block)
    return digest.hexdigest(), size
