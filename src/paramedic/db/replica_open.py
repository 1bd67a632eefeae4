"""Opening the replicas a `db.stripes.ReplicaSet` reads from, each checked to hold the database of the
manifest (a replica of another database is refused at once). The first `required` URLs (the -db
directory) must open; the extra mirrors open side by side on daemon threads, each given
MIRROR_OPEN_SECONDS (one after another, a mirror whose link trickled held the search for its connection's
whole timeout: 3 s became 57-119 s), and one that does not open in time, or that the job's check at its
start already dropped, is kept as an absent replica, dropped, with why."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from paramedic.db.manifest import Manifest
from paramedic.db.replicas import Replica, ReplicaError, ReplicaOpener, VolumeFile
from paramedic.errors import DatabaseError

MIRROR_OPEN_SECONDS = 5.0  # an extra mirror not open (connected, manifest read) by then is dropped


def open_replicas(
    urls: Sequence[str],
    manifest: Manifest,
    keys: Path | None,
    required: int | None,
    opener: ReplicaOpener,
    dropped: Mapping[str, str] | None,
) -> tuple[list[Replica], dict[int, str]]:
    """The replicas at `urls` (in order; an absent one stands for a mirror not opened) and why each absent
    one is dropped, by position. Whatever was opened is closed again when this raises."""
    replicas: list[Replica] = []
    absent: dict[int, str] = {}
    known = dict(dropped or {})
    mirror = [required is not None and position >= required for position in range(len(urls))]
    extra = {
        position: _Opening(url, keys, opener)
        for position, url in enumerate(urls)
        if mirror[position] and url not in known
    }
    deadline = time.monotonic() + MIRROR_OPEN_SECONDS
    try:
        for position, url in enumerate(urls):
            if mirror[position] and url in known:
                replicas.append(_Absent(url))
                absent[position] = f"dropped at the job's start, not opened again ({known[url]})"
                continue
            if position in extra:
                try:
                    replica, theirs = extra[position].result(deadline)
                except ReplicaError as exc:
                    replicas.append(_Absent(url))
                    absent[position] = str(exc)
                    continue
            else:
                replica = opener(url, keys)
                theirs = replica.manifest().checksum()
            replicas.append(replica)
            _same_database(replica, theirs, manifest)
        return replicas, absent
    except BaseException:
        for opening in extra.values():
            opening.abandon()
        for replica in replicas:
            replica.close()
        raise


def _same_database(replica: Replica, theirs: str, manifest: Manifest) -> None:
    """DatabaseError unless the replica's manifest checksum (`theirs`) is the database's."""
    if theirs != manifest.checksum():
        raise DatabaseError(
            f"replica {replica.label} holds a different database (manifest checksum "
            f"{theirs[:12]}, expected {manifest.checksum()[:12]}): refused"
        )


class _Opening:
    """A mirror being opened (connected, its manifest read) on a daemon thread of its own."""

    def __init__(self, url: str, keys: Path | None, opener: ReplicaOpener):
        self.label = url.split("?", 1)[0]
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._opened: tuple[Replica, str] | None = None
        self._failure: BaseException | None = None
        self._abandoned = False
        threading.Thread(target=self._open, args=(url, keys, opener), daemon=True, name="open-mirror").start()

    def _open(self, url: str, keys: Path | None, opener: ReplicaOpener) -> None:
        try:
            replica = opener(url, keys)
        except BaseException as exc:  # handed to `result`
            self._failure = exc
            self._done.set()
            return
        try:
            opened = (replica, replica.manifest().checksum())
        except BaseException as exc:  # handed to `result`
            replica.close()
            self._failure = exc
            self._done.set()
            return
        with self._lock:
            if self._abandoned:  # too late: nobody will use or close it
                replica.close()
                return
            self._opened = opened
        self._done.set()

    def result(self, deadline: float) -> tuple[Replica, str]:
        """The replica and its manifest's checksum; what opening it raised; or ReplicaError once
        `deadline` has passed (the mirror is then closed as soon as it opens)."""
        self._done.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self._opened is None and self._failure is None:
                self._abandoned = True
                raise ReplicaError(
                    f"replica {self.label}: did not open within {MIRROR_OPEN_SECONDS:g} s (a link that "
                    "trickles, or a site that does not answer)"
                )
            if self._failure is not None:
                raise self._failure
            assert self._opened is not None
            opened, self._opened = self._opened, None  # the caller's now, to use and close
        return opened

    def abandon(self) -> None:
        """The set failed to open: close this mirror now, or when it opens."""
        with self._lock:
            self._abandoned = True
            opened, self._opened = self._opened, None
        if opened is not None:
            opened[0].close()


class _Absent:
    """A mirror that could not be opened: listed (dropped) in the record, never read."""

    parallelism = 1

    def __init__(self, url: str):
        self.label = url.split("?", 1)[0]

    def manifest(self) -> Manifest:
        raise ReplicaError(f"replica {self.label}: not reachable")

    def volume_files(self, volume: str) -> list[VolumeFile]:
        raise ReplicaError(f"replica {self.label}: not reachable")

    def read(self, name: str, offset: int, length: int) -> bytes:
        raise ReplicaError(f"replica {self.label}: not reachable")

    def close(self) -> None:
        pass
