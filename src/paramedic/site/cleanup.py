"""How a storage-site job ends other than by publishing: failed (recorded, its partial data removed first),
cancelled by its compute site, expired when left idle, or stopped when its regeneration runs past
--regen-timeout; and the record of a done or failed job deleted once it has been idle for --expire-after.
A housekeeping thread moves idle jobs on even when no new job opens."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from paramedic.durable import write_durably
from paramedic.site.job_files import drop_job_data
from paramedic.site.jobs import CLEANUP_WAIT_SECONDS, JobTable, SiteJob, describe, duration
from paramedic.site.replica import Replica, drop_scratch, end_processes_in

HOUSEKEEPING_SECONDS = 60.0


class Cleanup:
    """Failing, cancelling and expiring the jobs of one table."""

    def __init__(
        self,
        table: JobTable,
        replica: Replica | None,
        log: Callable[[str], Any],
        expire_seconds: float,
        open_idle_seconds: float,
        regen_seconds: float,
    ):
        self.table = table
        self.replica = replica
        self.log = log
        self.expire_seconds = expire_seconds
        self.open_idle_seconds = open_idle_seconds
        self.regen_seconds = regen_seconds
        self.stopping = threading.Event()
        self.housekeeper = threading.Thread(target=self._housekeeping, daemon=True, name="housekeeping")

    def fail(self, job: SiteJob, message: str) -> None:
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
        drop_job_data(job.directory)
        drop_scratch(self.replica, job.job_id)
        job.stored_bytes = 0
        self.table.release_target(job)
        try:
            write_durably(job.directory / "failed.json", json.dumps({"message": message}).encode())
        except OSError as exc:
            self.log(f"job {job.job_id}: cannot record the failure: {describe(exc)}")

    def cancel(self, job: SiteJob) -> None:
        """The compute site gave up (its search failed): the job ends now and its data goes."""
        if job.active:
            self.fail(job, "cancelled by the compute site")

    def expire_idle_jobs(self) -> None:
        """Move on every idle job, and fail every job whose decoding runs past --regen-timeout (called
        with the table's lock held)."""
        now = time.time()
        jobs = self.table.jobs
        for job in list(jobs.values()):
            with job.lock:
                stuck = [i for i, t in job.decoding.items() if time.monotonic() - t > self.regen_seconds]
            if stuck and job.failure is None:
                self.fail(
                    job,
                    f"chunk {stuck[0]}: regenerating took longer than {duration(self.regen_seconds)} "
                    "(serve --regen-timeout); stopped",
                )
                if self.replica is not None:
                    end_processes_in(self.replica.workdir / job.job_id)
            if job.active:
                if now - job.touched >= self.open_idle_seconds:
                    self.fail(job, f"expired: no request for {duration(self.open_idle_seconds)}")
                    job.touched = now  # its failure stays readable for another period
                continue
            if now - job.touched < self.expire_seconds:
                continue
            shutil.rmtree(job.directory, ignore_errors=True)
            del jobs[job.job_id]
            self.log(f"job {job.job_id}: record deleted after {duration(self.expire_seconds)} idle")

    def _housekeeping(self) -> None:
        """Idle jobs expire (and free their disk space) even when no new job opens."""
        period = min(HOUSEKEEPING_SECONDS, max(min(self.open_idle_seconds, self.regen_seconds) / 4, 0.05))
        while not self.stopping.wait(period):
            try:
                with self.table.lock:
                    self.expire_idle_jobs()
            except Exception as exc:  # keep the thread: one bad record must not stop expiry
                self.log(f"housekeeping: {type(exc).__name__}: {exc}")
