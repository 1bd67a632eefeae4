"""How the replicas of a `db.stripes.ReplicaSet` list a volume's files: asked side by side, each on a
daemon thread of its own (a mirror that trickles holds its thread, never the copy), the extra mirrors
given MIRROR_LIST_SECONDS after the first listing came in, each listing checked (it is untrusted: names
inside the volume, sizes that are sizes, no more than the copy may write), and the replicas grouped by
the listing they gave, the most agreed-on first."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path

from paramedic.db.replica_health import ReplicaHealth
from paramedic.db.replicas import Replica, ReplicaError, VolumeFile

# An extra mirror that has not listed a volume's files this long after the first replica did is dropped
# for the run: the listings are asked side by side (one after another, a mirror that opened and then
# trickled held every volume's copy for its reply's deadline: 120 s, at 5 B/s)
MIRROR_LIST_SECONDS = 5.0
_MAX_NAME = 255

Groups = list[tuple[list[VolumeFile], list[int]]]


def listings(health: ReplicaHealth, volume: str, required: int | None, max_bytes: int | None) -> Groups:
    """Live replicas grouped by how they list the volume's files, the most agreed-on listing first; a
    replica whose listing fails, comes too late or does not pass the checks is dropped."""
    groups: dict[tuple[VolumeFile, ...], list[int]] = {}
    live = health.live()
    asked = {index: _Listing(health.replicas[index], volume) for index in live}
    required = len(health.uses) if required is None else required
    deadline: float | None = None  # the mirrors' race: from the first listing that came in
    for index in sorted(live, key=lambda i: i >= required):  # the required replicas first
        if index >= required and deadline is None:
            deadline = _first_listed(asked.values()) + MIRROR_LIST_SECONDS
        try:
            files = asked[index].result(deadline if index >= required else None)
            check_listing(volume, files, max_bytes)
        except ReplicaError as exc:
            health.drop(index, str(exc))
            continue
        groups.setdefault(tuple(files), []).append(index)
    return sorted(((list(k), v) for k, v in groups.items()), key=lambda g: -len(g[1]))


def drop_other_listings(health: ReplicaHealth, groups: Groups, files: list[VolumeFile], volume: str) -> None:
    """The replicas that listed the volume otherwise than the copy that verified are dropped."""
    for other, servers in groups:
        if other != files:
            for index in servers:
                health.drop(index, f"lists volume {volume}'s files differently from the verified copy")


class _Listing:
    """A replica's listing of a volume, asked on a daemon thread of its own: a mirror that trickles holds
    that thread (until its own connection's deadlines end it), never the copy."""

    def __init__(self, replica: Replica, volume: str):
        self.label = replica.label
        self.volume = volume
        self.done = threading.Event()
        self.files: list[VolumeFile] | None = None
        self.failure: ReplicaError | None = None
        threading.Thread(target=self._list, args=(replica,), daemon=True, name="list-volume").start()

    def _list(self, replica: Replica) -> None:
        try:
            self.files = replica.volume_files(self.volume)
        except ReplicaError as exc:
            self.failure = exc
        except Exception as exc:  # noqa: BLE001 - any failure of a replica drops it, never the run
            self.failure = ReplicaError(f"replica {self.label}: listing failed: {type(exc).__name__}: {exc}")
        self.done.set()

    def result(self, deadline: float | None) -> list[VolumeFile]:
        """The listing, or ReplicaError (the replica's own, or at `deadline`: not listed in time)."""
        if not self.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
            raise ReplicaError(
                f"replica {self.label}: did not list volume {self.volume} within {MIRROR_LIST_SECONDS:g} s of "
                "the first replica (a link that trickles, or a site that stopped answering)"
            )
        if self.failure is not None:
            raise self.failure
        assert self.files is not None
        return self.files


def _first_listed(asked: Iterable[_Listing]) -> float:
    """When the first listing came in, or the last failed (monotonic): the mirrors race that."""
    pending = list(asked)
    while not any(a.done.is_set() and a.failure is None for a in pending):
        waiting = [a for a in pending if not a.done.is_set()]
        if not waiting:
            break
        waiting[0].done.wait(0.05)
    return time.monotonic()


def check_listing(volume: str, files: list[VolumeFile], max_bytes: int | None = None) -> None:
    """A replica's listing is untrusted: names inside the volume (no paths), sizes that are sizes."""
    for file in files:
        name = file.name
        if not _in_volume(volume, name):
            raise ReplicaError(f"replica lists a file {str(name)[:80]!r} that is not in volume {volume}")
        if not isinstance(file.size, int) or isinstance(file.size, bool) or file.size < 0:
            raise ReplicaError(f"replica lists {name} with a bad size")
    if not files:
        raise ReplicaError(f"replica has no files of volume {volume}")
    if len({f.name for f in files}) != len(files):
        raise ReplicaError(f"replica lists a file of volume {volume} twice")
    total = sum(f.size for f in files)
    if max_bytes is not None and total > max_bytes:
        raise ReplicaError(
            f"replica lists volume {volume} as {total} bytes, more than the copy may write "
            f"(--stage-limit {max_bytes})"
        )


def _in_volume(volume: str, name: object) -> bool:
    """Whether a listed name is a file of the volume: no path, no alias file, not too long."""
    return (
        isinstance(name, str)
        and name.startswith(volume + ".")
        and "/" not in name
        and "\0" not in name
        and len(name) <= _MAX_NAME
        and not name.endswith((".pal", ".nal"))
    )


def remove_strays(dest: Path, volume: str, files: list[VolumeFile]) -> None:
    """Files of the volume in `dest` that the listing does not have would enter the digest: remove them."""
    names = {f.name for f in files}
    for path in dest.glob(volume + ".*"):
        if path.name not in names and path.suffix not in (".pal", ".nal"):
            path.unlink()
