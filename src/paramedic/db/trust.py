"""Digests of a database's files, computed once and remembered: trust that does not grow with every job.

A database in place has no manifest of ours: its identity (what a resumed job, a storage site's replica
and a compute site agree on) is the BLAKE3 digest of its files. Digesting nr (364 GB) takes minutes, so
each file's digest is remembered, keyed by what an unprivileged writer cannot keep unchanged: device,
inode, size, mtime_ns and ctime_ns (ctime cannot be set back; a file replaced has another inode). A digest
is remembered only when the file's times are older than the digest's start by `RACY_SECONDS`: writes
through a shared mapping can land before ctime moves (31 s seen), as git's "racily clean" entries are
checked by content again. Root, clock changes and bit rot escape stamps: `paramedic verify -db X` digests
everything again (a cron job after update_blastdb.pl).

The store follows ~/.ssh's rules: a directory of the user's own, no one else may write it or its files;
otherwise it is not used (every file is digested) and the caller is told once.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import blake3

from paramedic.durable import write_durably
from paramedic.errors import DatabaseError

RACY_SECONDS = 60.0
STORE_VARIABLE = "PARAMEDIC_DIGESTS"  # the store's directory (default: ~/.cache/paramedic/digests)
_VERSION = 1


def store_directory() -> Path:
    given = os.environ.get(STORE_VARIABLE)
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "paramedic" / "digests"


class DigestStore:
    """Remembered digests, one small file per database file (named by the digest of its path)."""

    def __init__(self, directory: Path | None = None, warn: Callable[[str], None] = lambda _: None):
        self.directory = directory or store_directory()
        self.usable = self._usable(warn)

    def _usable(self, warn: Callable[[str], None]) -> bool:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = self.directory.stat()
        except OSError as exc:
            warn(f"remembered digests: {self.directory}: {exc.strerror}; every file is digested")
            return False
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            warn(
                f"remembered digests: {self.directory} is not yours alone (owner or group/other write): "
                "not used; every file is digested"
            )
            return False
        return True

    def _entry(self, path: Path) -> Path:
        return self.directory / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")

    def recall(self, path: Path, info: os.stat_result) -> str | None:
        """The digest remembered for `path` as it is now (`info`), or None."""
        if not self.usable:
            return None
        entry = self._entry(path)
        try:
            with open(entry, "rb") as fh:
                meta = os.fstat(fh.fileno())
                if meta.st_uid != os.getuid() or meta.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    return None
                data = json.loads(fh.read(4096))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("stamp") != _stamp(path, info):
            return None
        digest = data.get("blake3")
        return digest if isinstance(digest, str) and len(digest) == 64 else None

    def remember(self, path: Path, info: os.stat_result, digest: str, started_ns: int) -> None:
        """Keep `digest` for `path` stamped `info`, unless its times are too close to the digest's start."""
        if not self.usable:
            return
        margin = int(RACY_SECONDS * 1e9)
        if max(info.st_mtime_ns, info.st_ctime_ns) > started_ns - margin:
            return  # racily clean: digested again next time
        data = {"version": _VERSION, "stamp": _stamp(path, info), "blake3": digest}
        try:
            write_durably(self._entry(path), json.dumps(data).encode(), sync=False)
        except OSError:
            pass  # a store that cannot be written only costs another digest


# Digests this process was handed by the ranks that computed them (paramedic.db.spread), by the stamp
# this process sees: `digests` takes them as its own for this job.
_HANDED: dict[tuple[object, ...], str] = {}


def hand(path: Path, info: os.stat_result, digest: str, started_ns: int, store: DigestStore | None) -> None:
    """A digest another rank computed of `path` as this process sees it (`info`): used by this job,
    and remembered as if computed here (the racy-clean rule with the other rank's start)."""
    _HANDED[tuple(_stamp(path, info))] = digest
    if store is not None:
        store.remember(path, info, digest, started_ns)


def unknown(paths: Iterable[Path], store: DigestStore) -> list[tuple[Path, os.stat_result]]:
    """The files whose digest is neither remembered nor handed for their stamp now (unreadable ones
    too: digesting them says why)."""
    out = []
    for path in paths:
        try:
            info = path.stat()
        except OSError:
            out.append((path, os.stat_result((0,) * 10)))
            continue
        if _HANDED.get(tuple(_stamp(path, info))) is None and store.recall(path, info) is None:
            out.append((path, info))
    return out


def _stamp(path: Path, info: os.stat_result) -> list[object]:
    return [str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def file_digest(path: Path) -> str:
    """BLAKE3 of a file's bytes, on every core (the library maps the file and hashes it in parallel)."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if path.stat().st_size:
        hasher.update_mmap(path)
    return hasher.hexdigest()


def digests(paths: Iterable[Path], store: DigestStore | None = None, fresh: bool = False) -> dict[Path, str]:
    """Each file's digest: remembered when its stamp is known (unless `fresh`), else computed and
    remembered. A file that changes while it is digested is refused."""
    store = store or DigestStore()
    out: dict[Path, str] = {}
    for path in paths:
        try:
            before = path.stat()
            known = None if fresh else _HANDED.get(tuple(_stamp(path, before))) or store.recall(path, before)
            if known is not None:
                out[path] = known
                continue
            started = time.time_ns()
            digest = file_digest(path)
            after = path.stat()
        except OSError as exc:
            raise DatabaseError(f"{path}: unreadable ({exc.strerror})") from exc
        if _stamp(path, after) != _stamp(path, before):
            raise DatabaseError(
                f"{path}: changed while it was digested; search again once the database is whole"
            )
        store.remember(path, before, digest, started)
        out[path] = digest
    return out


def verify(paths: Iterable[Path], store: DigestStore | None = None) -> tuple[int, list[Path]]:
    """Digest every file afresh and remember it (`paramedic verify`); the bytes read and the files whose
    remembered digest no longer matches although their stamp does (changed by root, a clock set back, or
    the disk itself): those a job would have trusted wrongly."""
    store = store or DigestStore()
    wrong: list[Path] = []
    total = 0
    for path in paths:
        try:
            info = path.stat()
        except OSError as exc:
            raise DatabaseError(f"{path}: unreadable ({exc.strerror})") from exc
        known = store.recall(path, info)
        fresh = digests([path], store, fresh=True)[path]
        total += info.st_size
        if known is not None and known != fresh:
            wrong.append(path)
    return total, wrong
