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

`JobStore` is the front of the parts that do this, one job each: `site.jobs` (the jobs in memory and the
table of them), `site.job_files` (a job's directory, above), `site.admission` (opening a job: its output
path, room and quotas), `site.decoding` (chunks stored and decoded), `site.publishing` (the final file),
`site.cleanup` (failure, cancel, expiry), `site.resume` (a restart) and `site.replica` (the database copy
regenerations read).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from paramedic.site.admission import Admission
from paramedic.site.cleanup import Cleanup
from paramedic.site.decoding import Decoding
from paramedic.site.fair import FairPool
from paramedic.site.jobs import JobFailed, JobTable, SiteJob
from paramedic.site.publishing import Publishing
from paramedic.site.replica import Replica
from paramedic.site.resume import Resume
from paramedic.site.space import Published, Quota, Space

# the store's own vocabulary, from the parts that define it: what it raises, holds and is given
__all__ = ["JobFailed", "JobStore", "Replica", "SiteJob"]

MAX_QUEUED_DECODES = 256
MAX_QUEUED_DECODES_PER_PEER = 64  # one compute site's decodes waiting for a worker
DEFAULT_EXPIRE_SECONDS = 7 * 24 * 3600.0
DEFAULT_OPEN_IDLE_SECONDS = 3600.0
# The most one chunk's decoding (a metadata chunk: BLAST+ regenerating its pieces) may take; a BLAST+ that
# never returns fails its job, and is killed, after this (serve --regen-timeout)
DEFAULT_REGEN_SECONDS = 3600.0
STATE_DIR_NAME = ".paramedic-state"
PUBLISHED_LEDGER = "published.json"  # each compute site's published outputs (site.space.Published)


class JobStore:
    """The storage site's jobs under `root` and `state`: what `site.server` and `site.inbox` call."""

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
        self.space = Space(quota or Quota(), (state, self.root))
        self.log = log
        self.table = JobTable()
        # the table's, under the names callers know
        self.jobs, self.targets, self.opening = self.table.jobs, self.table.targets, self.table.opening
        self.lock, self.targets_lock = self.table.lock, self.table.targets_lock
        pool = FairPool(io_workers, MAX_QUEUED_DECODES_PER_PEER, MAX_QUEUED_DECODES)
        self.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.published = Published(self.state / PUBLISHED_LEDGER, self.root_fd)
        open_idle_seconds = min(open_idle_seconds, expire_seconds)
        self.cleanup = Cleanup(
            self.table, replica, self._say, expire_seconds, open_idle_seconds, regen_seconds
        )
        self.admission = Admission(
            self.root,
            self.root_fd,
            state,
            replica,
            self.space,
            self.published,
            self.table,
            self.cleanup,
            self._say,
        )
        self.decoding = Decoding(pool, self.space, replica, regen_seconds, self.admission, self.cleanup)
        self.publishing = Publishing(replica, self.published, self.table, self.cleanup, self._say)
        Resume(
            self.root,
            self.root_fd,
            state,
            replica,
            self.published,
            self.table,
            self.cleanup,
            self.decoding,
            self._say,
        ).from_disk()
        self.cleanup.housekeeper.start()

    def _say(self, message: str) -> None:
        self.log(message)  # (read at each call: a caller may set `log` after the store is made)

    @property
    def pool(self) -> Any:
        """The I/O workers that decode chunks (site.fair)."""
        return self.decoding.pool

    @pool.setter
    def pool(self, pool: Any) -> None:
        self.decoding.pool = pool

    def open(self, peer: str, header: dict[str, Any], setup_payload: bytes | None) -> SiteJob | None:
        """Open (or reopen) a job; None when the setup payload is needed and was not sent (site.admission)."""
        return self.admission.open(peer, header, setup_payload)

    def get(self, peer: str, job_id: str) -> SiteJob:
        return self.table.get(peer, job_id)

    def put_chunk(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> bool:
        """Store a chunk durably and queue its decoding; False when its checksum does not match."""
        return self.decoding.put_chunk(job, header, payload)

    def finish(self, job: SiteJob, header: dict[str, Any]) -> dict[str, Any] | None:
        """The final file's size and digest once it is durable; None while chunks are still decoding."""
        return self.publishing.finish(job, header)

    def cancel(self, job: SiteJob) -> None:
        """The compute site gave up (its search failed): the job ends now and its data goes."""
        self.cleanup.cancel(job)

    def close(self) -> None:
        self.cleanup.stopping.set()
        self.decoding.pool.shutdown()
