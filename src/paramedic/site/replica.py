"""The storage site's copy of the database, which its jobs regenerate their output from: digested before
a job regenerates from it, checked unchanged before a regenerated report is published, a codec's job
context prepared over it, and each job's scratch directory beside it (and any BLAST+ still running
there) removed when the job ends."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paramedic.blast.run import Database
from paramedic.db.locate import recheck_in_place
from paramedic.db.manifest import Manifest, Stamp, check_stamps, verify_volumes, volume_stamps
from paramedic.errors import DatabaseError
from paramedic.ship.apps import codec_needs_replica
from paramedic.ship.codecs import Codec
from paramedic.ship.wire import ProtocolError
from paramedic.site.jobs import JobFailed

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


def prepare(replica: Replica | None, codec: Codec, setup: dict[str, Any], payload: bytes, job_id: str) -> Any:
    """The codec's job context; a site without a replica refuses the applications that need one
    (`ship.apps`: BLAST's metadata), and serves the others (traces, plain output)."""
    if replica is None:
        if codec_needs_replica(codec.name):
            raise ProtocolError(
                f"this storage site holds no database replica: it cannot regenerate {codec.name} "
                "output (ship compressed or direct, or serve with --replica)"
            )
        return codec.prepare(setup, payload, None)
    return codec.prepare(setup, payload, _job_replica(replica, job_id))


def _job_replica(replica: Replica, job_id: str) -> Replica:
    """The replica with a scratch directory of the job's own: its BLAST+ runs are found (by their
    working directory) and ended when its regeneration runs past --regen-timeout."""
    workdir = replica.workdir / job_id
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)  # its queries and BLAST+'s files: the site's
    return dataclasses.replace(replica, workdir=workdir)


def drop_scratch(replica: Replica | None, job_id: str) -> None:
    """The job's regeneration scratch directory (none at a site without a replica), and whatever BLAST+
    still runs in it: a job failed or cancelled while a regeneration hung would otherwise leave that
    process running, and the I/O worker thread waiting for it, for good."""
    if replica is not None:
        end_processes_in(replica.workdir / job_id)
        shutil.rmtree(replica.workdir / job_id, ignore_errors=True)


def end_processes_in(directory: Path) -> None:
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
