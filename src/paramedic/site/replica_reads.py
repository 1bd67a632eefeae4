"""Read-only access to the storage site's replica for authenticated compute sites (issue 14, item 3).

A compute site that mirrors its database from this site (`--mirror tls://site:7700/db`) asks, over the
same authenticated TLS connections and frames as shipping, for the replica's manifest, the files of a
fragment volume, and byte ranges of those files at explicit offsets (ship/replica_client.py). Only the
files of the manifest's fragment volumes are served (of a database in place: its volumes' and their
shared files, paramedic.db.units): the whitelist (name -> path and size) is built when
the server starts, and a request names a file only by a key of that whitelist, so no path from the
network ever reaches the file system. Reads are bounded: at most `replicas.MAX_READ_BYTES` each, and at
most `max_reads` at once over all connections, counted until the reply is sent, which has a deadline for
the whole frame (memory: a reader that does not read holds a slot, not a buffer per connection), on top of the server's connection limits and
frame deadlines. What is served is verified by the compute site against the manifest's SHA-256s.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from paramedic.db.manifest import MANIFEST_NAME, Manifest
from paramedic.db.replicas import MAX_READ_BYTES
from paramedic.errors import DatabaseError, UsageError
from paramedic.ship.wire import ProtocolError, field_int, field_str

READ_OPS = ("replica_manifest", "volume_files", "read")
DEFAULT_MAX_READS = 8  # reads being served at once, all connections: 8 x 16 MiB of buffers at most
BUSY_SECONDS = 30.0  # a read waits this long for a slot, then the request is refused


class ReplicaReads:
    """The whitelist of volume files and the answers to the read requests."""

    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        max_reads: int = DEFAULT_MAX_READS,
        volume_paths: list[str] | None = None,
    ):
        self.directory = directory
        self.manifest_sha256 = manifest.checksum()
        self.volumes: dict[str, list[tuple[str, int]]] = {}
        self.files: dict[str, tuple[Path, int]] = {}
        self.slots = threading.BoundedSemaphore(max_reads)
        if manifest.in_place:
            self._in_place(manifest, volume_paths or [])
            return
        try:
            self.manifest_bytes = (directory / MANIFEST_NAME).read_bytes()
        except OSError as exc:
            raise DatabaseError(f"{directory}: cannot read {MANIFEST_NAME} ({exc.strerror})") from exc
        try:
            entries = sorted(directory.iterdir())
        except OSError as exc:
            raise DatabaseError(f"{directory}: unreadable ({exc.strerror})") from exc
        for fragment in manifest.fragments:
            listing = []
            for path in entries:
                if not path.name.startswith(fragment.volume + ".") or path.suffix in (".pal", ".nal"):
                    continue
                st = path.lstat()
                if not stat.S_ISREG(st.st_mode):  # a symbolic link or anything else is not served
                    continue
                listing.append((path.name, st.st_size))
                self.files[path.name] = (path, st.st_size)
            self.volumes[fragment.volume] = listing

    def _in_place(self, manifest: Manifest, volume_paths: list[str]) -> None:
        """A database in place: each volume's files and its database's shared ones, by the names both
        sites agree on (paramedic.db.units); the manifest sent names volumes without this site's paths
        (its checksum leaves them out)."""
        from paramedic.db.units import check_names, served_files

        try:
            check_names(volume_paths, "--replica")
            served = served_files(volume_paths)
        except UsageError as exc:
            raise DatabaseError(str(exc)) from exc
        for base, paths in served.items():
            listing = []
            for path in paths:
                try:  # a link the site's own database holds (volumes on other disks) is resolved now
                    real = path.resolve(strict=True)
                    st = real.stat()
                except OSError as exc:
                    raise DatabaseError(f"{path}: unreadable ({exc.strerror})") from exc
                if not stat.S_ISREG(st.st_mode):
                    continue
                listing.append((path.name, st.st_size))
                self.files[path.name] = (real, st.st_size)
            self.volumes[base] = listing
        shown = replace(
            manifest,
            fragments=[replace(f, volume=Path(f.volume).name) for f in manifest.fragments],
            input_path=Path(manifest.input_path.strip("\"'")).name,
        )
        self.manifest_bytes = shown.to_json().encode()

    def answer(self, op: str, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """The reply (header, payload) to a read request; ProtocolError refuses it (the connection closes)."""
        if op == "replica_manifest":
            return {"op": "replica_manifest", "manifest_sha256": self.manifest_sha256}, self.manifest_bytes
        if op == "volume_files":
            volume = field_str(header, "volume", 256)
            listing = self.volumes.get(volume)
            if listing is None:
                raise ProtocolError(f"no fragment volume {volume[:80]!r} in this replica")
            return {"op": "volume_files", "volume": volume, "files": [[n, s] for n, s in listing]}, b""
        if op == "read":
            return self._read(header)
        raise ProtocolError(f"unknown request {op[:40]!r}")

    def _read(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        name = field_str(header, "name", 256)
        entry = self.files.get(name)
        if entry is None:
            raise ProtocolError(f"{name[:80]!r} is not a file of this replica's fragment volumes")
        path, size = entry
        offset = field_int(header, "offset", 0, size)
        length = field_int(header, "length", 1, MAX_READ_BYTES)
        if offset + length > size:
            raise ProtocolError(f"read of {name} past its end ({offset}+{length} > {size})")
        if not self.slots.acquire(timeout=BUSY_SECONDS):
            raise ProtocolError("storage site busy: too many replica reads at once")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                data = os.pread(fd, length, offset)
            finally:
                os.close(fd)
            if len(data) != length:  # changed on disk since the server started
                raise ProtocolError(f"{name} is shorter than when the server started")
        except BaseException:
            self.slots.release()
            raise
        # the slot stays taken until the reply is sent (`sent`): slow readers hold at most max_reads buffers
        return {"op": "data", "name": name, "offset": offset, "length": length}, data

    def sent(self) -> None:
        """A "data" reply went out (or failed to): its slot is free again."""
        self.slots.release()
