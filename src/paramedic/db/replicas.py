"""Replicas of a formatted database that a fragment's files can be read from (issue 14's seam).

A replica is a place that holds the files of a `paramedic format` database: a directory (shared storage,
a mirror mount) or a storage site serving its database read-only (`paramedic serve`, `tls://`). Staging
(`paramedic.db.stage`) and striped reads over several replicas (`paramedic.db.stripes`) see replicas only
through `Replica`; a URL's replica comes from its scheme's plugin (`ship.transport`, the same plugin that
ships output), passed in as a `ReplicaOpener`. Whatever a replica serves is untrusted until it verifies
against the manifest's SHA-256s (a database searched in place: its BLAKE3s, `InPlaceReplica`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from paramedic.db.manifest import MANIFEST_NAME, Manifest
from paramedic.errors import DatabaseError, UsageError

# The most one read asks for: a stripe (paramedic.db.stripes) is at most this long.
MAX_READ_BYTES = 16 << 20


@dataclass(frozen=True)
class VolumeFile:
    """One file of a makeblastdb volume (e.g. f003.psq) and its size, as a replica lists it."""

    name: str
    size: int


class Replica(Protocol):
    """Read-only access to one copy of a database's files. Methods raise `ReplicaError` for anything the
    replica cannot do (unreachable, refused, short read): the caller drops the replica, never the run."""

    @property
    def label(self) -> str:
        """Where it is, for messages and the run record (a path or a URL, no secrets)."""
        ...

    def manifest(self) -> Manifest:
        """The replica's manifest: replicas are used together only when their checksums are equal."""
        ...

    def volume_files(self, volume: str) -> list[VolumeFile]:
        """The files of a volume (`Fragment.volume`), in name order, as `volume_sha256` digests them."""
        ...

    def read(self, name: str, offset: int, length: int) -> bytes:
        """`length` bytes (at most MAX_READ_BYTES) of volume file `name` from `offset`: exactly that many,
        or ReplicaError."""
        ...

    def close(self) -> None: ...


class ReplicaError(DatabaseError):
    """A replica failed a request; the read moves to another replica."""


class LocalReplica:
    """A database directory on a filesystem this process can read (shared storage, a mirror mount)."""

    def __init__(self, directory: Path):
        self.directory = directory

    @property
    def label(self) -> str:
        return str(self.directory)

    def manifest(self) -> Manifest:
        try:
            return Manifest.from_json((self.directory / MANIFEST_NAME).read_text())
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ReplicaError(f"replica {self.label}: no readable {MANIFEST_NAME} ({exc})") from exc

    def volume_files(self, volume: str) -> list[VolumeFile]:
        try:
            return [
                VolumeFile(p.name, p.stat().st_size)
                for p in sorted(self.directory.iterdir())
                if p.name.startswith(volume + ".") and p.suffix not in (".pal", ".nal")
            ]
        except OSError as exc:
            raise ReplicaError(f"replica {self.label}: cannot list volume {volume} ({exc.strerror})") from exc

    def read(self, name: str, offset: int, length: int) -> bytes:
        if "/" in name or name.startswith(".") or not 0 < length <= MAX_READ_BYTES or offset < 0:
            raise ReplicaError(f"replica {self.label}: bad read {name!r} {offset}+{length}")
        return _read_exactly(self.label, self.directory / name, name, offset, length)

    def close(self) -> None:
        pass


def _read_exactly(label: str, path: Path, name: str, offset: int, length: int) -> bytes:
    """`length` bytes of `path` from `offset`, or ReplicaError (a file shorter than it was listed too)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ReplicaError(f"replica {label}: cannot read {name} ({exc.strerror})") from exc
    if len(data) != length:
        raise ReplicaError(f"replica {label}: {name} is shorter than it was listed")
    return data


# Opens the replica at a URL or directory path; the engine passes `ship.transport.open_replica`, which
# finds a URL's scheme plugin (this layer knows only directories).
ReplicaOpener = Callable[[str, Path | None], Replica]


def open_directory_replica(url: str, keys: Path | None = None) -> Replica:
    """The replica in directory `url` (a URL's scheme is a transport's: ship.transport.open_replica)."""
    if "://" in url:
        raise UsageError(f"--mirror {url}: a URL needs its transport (ship.transport.open_replica)")
    return LocalReplica(Path(url).resolve())


class InPlaceReplica:
    """A database searched in place, at paths of this host (the -db itself, or a `--mirror` directory
    holding the same database elsewhere): its units' files served from a whitelist built when it opens
    (paramedic.db.units), so a name asked for never becomes a path."""

    def __init__(self, label: str, manifest: Manifest, volume_paths: list[str]):
        from paramedic.db.units import served_files

        self._label = label
        self._manifest = manifest
        try:
            self.units = served_files(volume_paths)
        except (DatabaseError, UsageError) as exc:
            raise ReplicaError(f"replica {label}: {exc}") from exc
        self.files = {p.name: p for files in self.units.values() for p in files}

    @property
    def label(self) -> str:
        return self._label

    def manifest(self) -> Manifest:
        return self._manifest

    def volume_files(self, volume: str) -> list[VolumeFile]:
        files = self.units.get(volume)
        if files is None:
            raise ReplicaError(f"replica {self.label}: no volume {volume[:80]!r}")
        try:
            return [VolumeFile(p.name, p.stat().st_size) for p in files]
        except OSError as exc:
            raise ReplicaError(f"replica {self.label}: cannot list volume {volume} ({exc.strerror})") from exc

    def read(self, name: str, offset: int, length: int) -> bytes:
        path = self.files.get(name)
        if path is None or not 0 < length <= MAX_READ_BYTES or offset < 0:
            raise ReplicaError(f"replica {self.label}: bad read {name[:80]!r} {offset}+{length}")
        return _read_exactly(self.label, path, name, offset, length)

    def close(self) -> None:
        pass


def mirror_in_place(url: str, manifest: Manifest) -> InPlaceReplica:
    """The same database as a job's -db in place, at `url`: a directory holding it under the -db's own
    name, or a -db path itself. It is the same release when its volumes' keys (names, counts, letters,
    dates: paths excluded) and statistics are the job's; its bytes are not digested here (a large mirror
    would be read whole at every job's start) but checked against the job's digests as each unit is
    copied, so a damaged mirror is dropped where it is damaged. Another release (other keys) is refused
    by the identity check: its manifest then has none of the job's digests."""
    from dataclasses import replace

    from paramedic.db.blastdb import open_blastdb
    from paramedic.db.locate import volume_keys

    path = Path(url)
    name = manifest.input_path.strip("\"'")
    target = path / Path(name).name if path.is_dir() and " " not in name else path
    text = str(target.resolve()) if target.is_absolute() or path.is_dir() else str(target)
    try:
        theirs = open_blastdb(f'"{text}"' if " " in text else text, Path.cwd(), manifest.dbtype)
        keys = volume_keys(theirs.volumes)
    except DatabaseError as exc:
        raise ReplicaError(f"replica {url}: {exc}") from exc
    paths = [v.path for v in theirs.volumes]
    same = (theirs.title, theirs.nseq, theirs.length) == (manifest.title, manifest.nseq, manifest.length)
    if same and keys == set(manifest.volume_blake3):
        return InPlaceReplica(url, manifest, paths)
    other = replace(manifest, title=theirs.title, volume_blake3=dict.fromkeys(sorted(keys), ""))
    return InPlaceReplica(url, other, paths)
