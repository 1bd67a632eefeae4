"""A storage-site job's directory in the state, file by file (the layout is `site.store`'s docstring's):
made whole under a temporary name, its chunks read back checked, what an ended job no longer needs
removed, and the record of the replica's stamps its pieces were regenerated under."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from paramedic.db.manifest import Stamp
from paramedic.durable import fsync_dir, write_durably
from paramedic.ship.wire import ProtocolError
from paramedic.site.jobs import describe

# A job's record of the replica's stamps (paramedic.db.manifest.volume_stamps) its pieces were regenerated
# under: the volume files' names, inodes, sizes and times, a few kilobytes at most.
REPLICA_STAMPS = "replica.json"
MAX_REPLICA_STAMPS_BYTES = 1 << 20


def make_job_directory(
    state: Path, job_id: str, payload: bytes, record: dict[str, Any], stamps: tuple[Stamp, ...] | None
) -> Path:
    """The job's state directory, made whole under a temporary name and renamed into place: its setup,
    its record, the replica's stamps, and empty chunks/decoded/pieces."""
    directory = state / job_id
    tmp = state / f".{job_id}.tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "chunks").mkdir(parents=True)
        (tmp / "decoded").mkdir()
        (tmp / "pieces").mkdir()
        write_durably(tmp / "setup.bin", payload)
        write_durably(tmp / "job.json", json.dumps(record).encode())
        if stamps is not None:
            write_replica_stamps(tmp, stamps)
        os.replace(tmp, directory)
        fsync_dir(state)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ProtocolError(f"storage site cannot open the job: {describe(exc)}") from None
    return directory


def write_replica_stamps(directory: Path, stamps: tuple[Stamp, ...]) -> None:
    write_durably(directory / REPLICA_STAMPS, json.dumps([list(stamp) for stamp in stamps]).encode())


def same_replica(directory: Path, stamps: tuple[Stamp, ...]) -> bool:
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


def forget_pieces(directory: Path) -> None:
    """Drop a job's regenerated pieces and their records; its chunks stay, to be decoded again."""
    for sub, pattern in (("decoded", "*.json"), ("pieces", "*")):
        for path in (directory / sub).glob(pattern):
            path.unlink(missing_ok=True)


def drop_job_data(directory: Path) -> None:
    """What an ended job no longer needs: chunks, decoded markers, pieces and setup (its record and result
    stay)."""
    shutil.rmtree(directory / "chunks", ignore_errors=True)
    shutil.rmtree(directory / "decoded", ignore_errors=True)
    shutil.rmtree(directory / "pieces", ignore_errors=True)
    (directory / "setup.bin").unlink(missing_ok=True)
    (directory / REPLICA_STAMPS).unlink(missing_ok=True)


def stored_chunk(directory: Path, index: int, header: dict[str, Any]) -> bytes:
    """A chunk's payload read back from the job's directory, as the compute site sent it (its SHA-256)."""
    data = (directory / "chunks" / f"{index}.bin").read_bytes()
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise ProtocolError(f"chunk {index} changed on disk since it was stored (SHA-256 mismatch)")
    return data
