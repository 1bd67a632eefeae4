"""Who may open a job at the storage site, and what a job may hold: the output path's shape, the site's
and one compute site's open jobs (MAX_ACTIVE_JOBS, MAX_ACTIVE_JOBS_PER_PEER), one writer per output path
(a silent job of the same compute site superseded), the replica digested for a job that regenerates,
and the bytes a job and a compute site hold against `site.space`'s bounds.

A job's room and output are claimed under the table's lock, its setup parsed outside it: a setup takes
seconds to parse, and every other compute site's requests wait for that lock (issue 41, item 3).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from paramedic.db.manifest import Stamp
from paramedic.ship.paths import output_path_problem
from paramedic.ship.registry import make_codec
from paramedic.ship.wire import ProtocolError, field_str
from paramedic.site.cleanup import Cleanup
from paramedic.site.job_files import make_job_directory
from paramedic.site.jobs import (
    JOB_ID,
    OPENING_WAIT_SECONDS,
    STALE_SECONDS,
    Claim,
    JobFailed,
    JobTable,
    SiteJob,
    describe,
)
from paramedic.site.replica import Replica, prepare
from paramedic.site.safefs import OutputLocation
from paramedic.site.space import Published, Space

MAX_ACTIVE_JOBS = 256
MAX_ACTIVE_JOBS_PER_PEER = 32


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


class Admission:
    """Opening jobs into a table, and counting their bytes against the site's bounds."""

    def __init__(
        self,
        root: Path,
        root_fd: int,
        state: Path,
        replica: Replica | None,
        space: Space,
        published: Published,
        table: JobTable,
        cleanup: Cleanup,
        log: Callable[[str], Any],
    ):
        self.root = root
        self.root_fd = root_fd
        self.state = state
        self.replica = replica
        self.space = space
        self.published = published
        self.table = table
        self.cleanup = cleanup
        self.log = log

    # -- opening --------------------------------------------------------------------------------------
    def open(self, peer: str, header: dict[str, Any], setup_payload: bytes | None) -> SiteJob | None:
        """Open (or reopen) a job; None when the setup payload is needed and was not sent."""
        job_id = field_str(header, "job", 32)
        if not JOB_ID.match(job_id):
            raise ProtocolError("bad job id")
        codec_name = field_str(header, "codec", 64)
        stamps = None
        if (
            self.replica is not None
            and job_id not in self.table.jobs
            and make_codec(codec_name).layout == "pieces"
        ):
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
            with self.table.lock:
                del self.table.opening[job_id]
                if not opened:
                    self._release_claim(claim)
            claim.ended.set()

    def _claim(
        self, job_id: str, peer: str, header: dict[str, Any], setup_payload: bytes | None
    ) -> SiteJob | Claim | None:
        """Under the table's lock: the job if it exists (reopened), None if its setup must be sent, else
        the job's claim on a slot and its output path (`opening`) while its setup is parsed. A job being
        opened by another request is waited for (a bounded time), then reopened."""
        table = self.table
        with table.lock:
            self.cleanup.expire_idle_jobs()
            job = table.jobs.get(job_id)
            if job is not None:
                return self._reopen(job, peer, header)
            other = table.opening.get(job_id)
            if other is None:
                return self._new_claim(job_id, peer, header, setup_payload)
        other.ended.wait(OPENING_WAIT_SECONDS)
        with table.lock:
            job = table.jobs.get(job_id)
            if job is None:
                raise ProtocolError(
                    "job not opened: another request opening it was refused or is still at it"
                )
            return self._reopen(job, peer, header)

    def _new_claim(
        self, job_id: str, peer: str, header: dict[str, Any], setup_payload: bytes | None
    ) -> Claim | None:
        """A new job's checks that need the table's lock (held): room, output path, free space."""
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
                raise ProtocolError(f"output path {relative!r}: {describe(exc)}") from None
            if codec.layout == "pieces" and setup_payload is None:
                location.remove_empty_directories()
                return None
            self.space.check_free(len(setup_payload or b""))
            more = len(setup_payload or b"")
            held = self.table.held_by(peer) + self.published.held(peer)
            problem = self.space.peer_problem(held + more, more)
            if problem is not None:
                raise ProtocolError(problem)
        except BaseException:
            location.remove_empty_directories()
            raise
        claim = Claim(job_id, peer, codec, setup, relative, out, location)
        self.table.opening[job_id] = claim
        with self.table.targets_lock:
            self.table.targets[relative] = job_id
        return claim

    def _make_job(self, claim: Claim, payload: bytes, stamps: tuple[Stamp, ...] | None) -> SiteJob:
        """A claimed job made: its setup parsed (outside the table's lock), its directory written, and
        the job put among the table's."""
        context = prepare(self.replica, claim.codec, claim.setup, payload, claim.job_id)
        record = {
            "job": claim.job_id,
            "peer": claim.peer,
            "codec": claim.codec.name,
            "setup": claim.setup,
            "opened": time.time(),
        }
        directory = make_job_directory(self.state, claim.job_id, payload, record, stamps)
        job = SiteJob(
            claim.job_id, directory, claim.peer, claim.out, claim.codec, context, claim.setup, claim.location
        )
        job.replica_stamps = stamps
        job.stored_bytes = len(payload)
        with self.table.lock:
            self.table.jobs[claim.job_id] = job
        self.log(f"job {claim.job_id}: opened by {claim.peer}, {claim.codec.name}, output {claim.relative}")
        return job

    def _release_claim(self, claim: Claim) -> None:
        """A claim refused while its setup was parsed: its output path free again, nothing left on the way."""
        with self.table.targets_lock:
            if self.table.targets.get(claim.relative) == claim.job_id:
                del self.table.targets[claim.relative]
        claim.location.remove_empty_directories()
        if self.replica is not None:
            shutil.rmtree(self.replica.workdir / claim.job_id, ignore_errors=True)

    @staticmethod
    def _reopen(job: SiteJob, peer: str, header: dict[str, Any]) -> SiteJob:
        """A job opened again (another stream, a reconnection): the same compute site, the same setup."""
        if job.peer != peer:
            raise ProtocolError("job belongs to another compute site")
        if header.get("setup") != job.setup_header:
            raise ProtocolError("job reopened with a different setup")
        job.touched = time.time()
        return job

    def _check_room(self, peer: str) -> None:
        """Refuses a new job past the site's open jobs, or past this compute site's (under the lock)."""
        active: list[SiteJob | Claim] = [j for j in self.table.jobs.values() if j.active]
        active += self.table.opening.values()
        if len(active) >= MAX_ACTIVE_JOBS:
            raise ProtocolError(f"storage site busy: {len(active)} jobs open")
        mine = sum(1 for j in active if j.peer == peer)
        if mine >= MAX_ACTIVE_JOBS_PER_PEER:
            raise ProtocolError(f"storage site busy: this compute site has {mine} jobs open")

    def _free_target(self, relative: str, peer: str) -> None:
        """Refuses an output another job is writing now. The same compute site's job silent for minutes (a
        live one sends keep-alives) is a search killed and started again: that job is failed instead."""
        with self.table.targets_lock:
            holder_id = self.table.targets.get(relative, "")
        if holder_id in self.table.opening:
            raise ProtocolError(
                f"output path {relative!r}: another job is writing it now (retry once it ends or expires)"
            )
        holder = self.table.jobs.get(holder_id)
        if holder is None or not holder.active:
            return
        if holder.peer != peer or time.time() - holder.touched < STALE_SECONDS:
            raise ProtocolError(
                f"output path {relative!r}: another job is writing it now (retry once it ends or expires)"
            )
        self.cleanup.fail(holder, "superseded: a new job of the same compute site writes the same output")

    # -- space ----------------------------------------------------------------------------------------
    def reserve(self, job: SiteJob, more: int) -> None:
        """Count `more` bytes against the job, or fail the job (JobFailed) if they would pass a quota or eat
        into the free-space reserve (site.space). Counted at once, so concurrent decodes cannot both pass
        a bound."""
        with job.lock:
            problem = self.space.job_problem(job.stored_bytes + more)
            if problem is None:
                job.stored_bytes += more
        if problem is None:
            published = self.published.held(job.peer)  # (files looked at: not under the table's lock)
            with self.table.lock:
                held = self.table.held_by(job.peer)
            problem = self.space.peer_problem(held + published, more)
        if problem is not None:
            self.cleanup.fail(job, problem)
            raise JobFailed(job.failure or problem)
