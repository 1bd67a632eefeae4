"""The storage site's jobs in memory: each job's state (`SiteJob`), a job being opened (`Claim`), and the
table of them all with the output paths they hold (`JobTable`), shared by the parts of `site.store`.

A job's files are `site.job_files`'; what a job may take is `site.admission`'s; its chunks become output
in `site.decoding`; its final file is `site.publishing`'s; its failure and expiry are `site.cleanup`'s.
"""

from __future__ import annotations

import errno
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paramedic.db.manifest import Stamp
from paramedic.ship.codecs import Codec
from paramedic.ship.wire import ProtocolError
from paramedic.site.safefs import OutputLocation

JOB_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_CHUNKS = 1_000_000
KEEPALIVE_SECONDS = 30.0  # how often a live compute site touches its job (ship.client)
STALE_SECONDS = 4 * KEEPALIVE_SECONDS  # a job this silent is no longer fed by a live compute site

# The most a request waits for another thread's work on the same job (a failure's cleanup, a finishing)
# before it answers: under the compute site's own timeout for such a question (ship.client, 5 s)
CLEANUP_WAIT_SECONDS = 3.0

# The most a request waits for another request opening the same job (its setup parsed) before it refuses
OPENING_WAIT_SECONDS = 30.0


class JobFailed(Exception):
    """A job cannot complete (bad setup, decode failure, digest mismatch): the message goes to the client."""


@dataclass
class Claim:
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


class JobTable:
    """Every job the site holds, the jobs being opened, and which job writes each output path."""

    def __init__(self) -> None:
        self.jobs: dict[str, SiteJob] = {}
        self.targets: dict[str, str] = {}  # output path -> the active job that writes it
        self.opening: dict[str, Claim] = {}  # jobs whose setup is being parsed (outside self.lock)
        self.lock = threading.Lock()
        self.targets_lock = threading.Lock()

    def get(self, peer: str, job_id: str) -> SiteJob:
        with self.lock:
            job = self.jobs.get(job_id)
        if job is None or job.peer != peer:
            raise ProtocolError("unknown job (open it first)")
        job.touched = time.time()
        return job

    def held_by(self, peer: str) -> int:
        """What one compute site's open jobs hold here (under self.lock); its published outputs are
        `Published.held(peer)`."""
        return sum(j.stored_bytes for j in self.jobs.values() if j.active and j.peer == peer)

    def release_target(self, job: SiteJob) -> None:
        relative = job.setup_header.get("out")
        with self.targets_lock:
            if relative is not None and self.targets.get(relative) == job.job_id:
                del self.targets[relative]


def describe(exc: BaseException) -> str:
    """One line for the log and the client: an OSError's reason without the state paths."""
    if isinstance(exc, OSError) and not isinstance(exc, ProtocolError) and exc.strerror:
        return exc.strerror if exc.errno != errno.ENOSPC else "no space left on device"
    return str(exc) or type(exc).__name__  # (a MemoryError, or a ValueError without a message)


def duration(seconds: float) -> str:
    return f"{seconds / 3600:g} hours" if seconds >= 3600 else f"{seconds:g} s"
