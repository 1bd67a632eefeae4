"""The storage site's disk space: what a job, and all of one compute site's jobs, may hold, and the free
space kept in reserve on the file systems of the site's state and output root.

A bound is checked when bytes are counted against a job (`site.store.JobStore`), so that a compute site
cannot fill the disk the site and the other compute sites share. Without `serve --site-quota`, one
compute site's jobs may hold half of what it could use (`Space.default_share`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from paramedic.durable import write_durably
from paramedic.ship.wire import ProtocolError

# Without --site-quota, one compute site's jobs may hold this share of the free space above the reserve
# (plus what they hold themselves)
DEFAULT_PEER_SHARE = 0.5

# What a write takes beyond its own bytes: the file system's blocks rounded up, and the small marker files
# written beside it (a chunk's header, a decoded chunk's record)
WRITE_OVERHEAD = 64 * 1024


@dataclass(frozen=True)
class Quota:
    """Bytes a job, and all of one compute site's jobs, may hold (chunks, pieces, the partial output), and
    the free space kept on the state's and the root's file systems (None: a bound not set)."""

    job_bytes: int | None = None
    peer_bytes: int | None = None
    reserve_bytes: int = 256 * 2**20


class Space:
    """The bounds of `quota` over the file systems of `paths` (the site's state and its output root)."""

    def __init__(self, quota: Quota, paths: tuple[Path, ...]):
        self.quota = quota
        self.paths = paths
        self._lock = threading.Lock()
        self._coming = 0  # bytes being written now: the file system does not count them free or used yet

    def _free(self) -> list[int]:
        free = []
        for path in self.paths:
            try:
                info = os.statvfs(path)
            except OSError:
                continue
            free.append(info.f_bavail * info.f_frsize)
        return free

    def check_free(self, more: int) -> None:
        """ProtocolError when `more` bytes, beside every write under way (`coming`), would eat into the
        reserve of free space."""
        for free in self._free():
            if free - self._coming - more < self.quota.reserve_bytes:
                raise ProtocolError(
                    f"storage site nearly full ({free} bytes free, {self.quota.reserve_bytes} kept in reserve)"
                )

    @contextmanager
    def coming(self, more: int) -> Iterator[None]:
        """Write `more` bytes inside: checked against the free space together with every other write under
        way, and counted until the block ends. Two concurrent writes (a chunk and another chunk's decoded
        range) each passed a check of the free space alone, and the second met a full disk (ENOSPC)."""
        more += WRITE_OVERHEAD
        with self._lock:
            self.check_free(more)
            self._coming += more
        try:
            yield
        finally:
            with self._lock:
                self._coming -= more

    def default_share(self, held: int) -> int:
        """Without --site-quota, one compute site's jobs may hold half of what it could use: the free space
        above the reserve plus what it holds itself (`held`, on disk now), not what other sites hold (two
        sites took half of everything each, and a third failed). Whoever comes next always finds half of
        the free space: no site, nor a few together, can make every other site's jobs fail."""
        free = self._free()
        if not free:
            return 2**62
        return max(int((min(free) - self.quota.reserve_bytes + held) * DEFAULT_PEER_SHARE), 0)

    def job_problem(self, holding: int) -> str | None:
        """Why a job may not hold `holding` bytes (its per-job quota), or None."""
        limit = self.quota.job_bytes
        if limit is not None and holding > limit:
            return f"the job would hold more than the storage site's per-job quota ({limit} bytes)"
        return None

    def peer_problem(self, held: int, more: int) -> str | None:
        """Why one compute site's jobs may not hold `held` bytes, `more` of them new (its quota, its
        default share, the reserve of free space), or None."""
        limit = self.quota.peer_bytes
        if limit is not None and held > limit:
            return (
                f"this compute site's jobs would hold more than its quota ({limit} bytes, the outputs "
                "they published here included)"
            )
        if limit is None and held > (share := self.default_share(held - more)):
            return (
                f"this compute site's jobs would hold more than its default share of the storage "
                f"site's space ({share} bytes, half of what is free and what it holds; serve "
                "--site-quota sets it)"
            )
        try:
            self.check_free(more)
        except ProtocolError as exc:
            return str(exc)
        return None


# The most outputs the ledger remembers per compute site (the oldest are forgotten beyond it)
MAX_PUBLISHED_PER_PEER = 10_000
# How long a compute site's count of published bytes is trusted before its files are looked at again (each
# chunk asks: a site with thousands of outputs must not stat them all for every chunk)
PUBLISHED_FRESH_SECONDS = 1.0
MAX_LEDGER_BYTES = 64 * 2**20


class Published:
    """The outputs each compute site's jobs published under the root, counted against its quota for as long
    as they are there (the same file: its inode and size); kept in the state, so a restart counts them.
    Before, a quota counted open jobs only: a compute site stored 37 MiB under --site-quota 5M in finished
    outputs until the other sites found the disk full (issue 41, item 5)."""

    def __init__(self, path: Path, root_fd: int):
        self.path = path
        self.root_fd = root_fd
        self._lock = threading.Lock()
        self.outputs: dict[str, dict[str, list[int]]] = _read_ledger(path)
        self._counted: dict[str, tuple[float, int]] = {}  # peer -> (when its files were looked at, bytes)

    def add(self, peer: str, relative: str) -> None:
        """Count the file just published at `relative` (under the root) against `peer`."""
        stamp = self._stamp(relative)
        if stamp is None:
            return
        with self._lock:
            mine = self.outputs.setdefault(peer, {})
            mine.pop(relative, None)
            mine[relative] = stamp
            while len(mine) > MAX_PUBLISHED_PER_PEER:
                del mine[next(iter(mine))]
            self._counted.pop(peer, None)
            self._save()

    def held(self, peer: str) -> int:
        """Bytes of `peer`'s published outputs still under the root (looked at again once the count is
        PUBLISHED_FRESH_SECONDS old); those removed or replaced since are forgotten."""
        with self._lock:
            counted = self._counted.get(peer)
            if counted is not None and time.monotonic() - counted[0] < PUBLISHED_FRESH_SECONDS:
                return counted[1]
            mine = self.outputs.get(peer, {})
            gone = [rel for rel, stamp in mine.items() if self._stamp(rel) != stamp]
            for relative in gone:
                del mine[relative]
            if gone:
                self._save()
            total = sum(stamp[2] for stamp in mine.values())
            self._counted[peer] = (time.monotonic(), total)
            return total

    def _stamp(self, relative: str) -> list[int] | None:
        try:
            info = os.stat(relative, dir_fd=self.root_fd, follow_symlinks=False)
        except (OSError, ValueError):
            return None
        return [info.st_dev, info.st_ino, info.st_size]

    def _save(self) -> None:
        """Written whole under a temporary name and renamed (a crash leaves the old ledger or the new)."""
        try:
            write_durably(self.path, json.dumps(self.outputs).encode())
        except OSError:
            pass  # counted in memory still; the next publication writes it again


def _read_ledger(path: Path) -> dict[str, dict[str, list[int]]]:
    """The ledger left by the site before a restart ({} when missing or unreadable: nothing counted)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_LEDGER_BYTES + 1)
        value = json.loads(data) if len(data) <= MAX_LEDGER_BYTES else {}
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        str(peer): {str(rel): list(stamp) for rel, stamp in outputs.items() if _is_stamp(stamp)}
        for peer, outputs in value.items()
        if isinstance(outputs, dict)
    }


def _is_stamp(value: object) -> bool:
    return isinstance(value, list) and len(value) == 3 and all(type(v) is int for v in value)
