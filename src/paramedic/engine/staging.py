"""A rank's side of --stage: its node-local cache (paramedic.db.stage), where it copies from, what it
tells its master at start, and what the scheduler learns from it.

One `Stager` per process and database: the cache and the replicas (the -db directory and the --mirror
URLs, paramedic.db.stripes) live as long as the rank, across its tasks; the replicas are opened on the
first copy only, so a warm cache opens nothing.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paramedic.blast.run import Database
from paramedic.db.manifest import Manifest, load_manifest
from paramedic.engine.settings import StageSettings
from paramedic.errors import DatabaseError, UsageError

if TYPE_CHECKING:  # the cache and the replicas are imported by the ranks that stage (sockets, TLS)
    from paramedic.db.stripes import ReplicaSet

# (node name, fragments already staged there): what each rank reports at start
Hello = tuple[str, tuple[int, ...]]


def node_name() -> str:
    """This rank's node, as the ranks on it share a --stage directory."""
    return os.uname().nodename  # gethostname(), without importing socket in every search


class Stager:
    """This process's cache for one database, and the replicas it copies from."""

    def __init__(self, stage: StageSettings, db: Database):
        self.settings = stage
        self.db = db
        self.manifest: Manifest = load_manifest(db.directory)
        from paramedic.db.stage import StageCache

        self.cache = StageCache(stage.directory, stage.limit)
        self.trimmed = False
        self.replicas: ReplicaSet | None = None
        self.retired: list[dict[str, object]] = []  # reports of replica sets given up after a failure
        self.node = node_name()

    def _replicas(self) -> ReplicaSet:
        if self.replicas is None:
            urls = [str(self.db.directory), *self.settings.mirrors]
            self.replicas = open_replicas(
                urls,
                self.manifest,
                self.settings.keys,
                required=1,
                dropped=dict(self.settings.dropped_mirrors),
            )
            atexit.register(self.replicas.close)  # a storage site's streams end with the rank
        return self.replicas

    def fetch_volume(self, volume: str, sha256: str, dest: Path, max_bytes: int | None = None) -> object:
        """Copy a volume through the replicas; when none served it verified, once more from all of them
        afresh (a failure may have been passing: a dropped connection, a file being replaced), and never
        use what did not verify."""
        try:
            return self._replicas().fetch_volume(volume, sha256, dest, max_bytes)
        except DatabaseError:
            failed = self._replicas()
            self.retired += failed.report()
            failed.close()
            self.replicas = None
            for path in dest.iterdir():
                path.unlink()
            return self._replicas().fetch_volume(volume, sha256, dest, max_bytes)

    def hello(self) -> Hello:
        return self.node, tuple(self.cache.staged(self.manifest))

    @contextmanager
    def fragment(self, fragment: int) -> Iterator[Database]:
        """The database to search fragment `fragment` in: the staged copy (held for the block), or the
        -db directory itself when the copy does not fit the cache."""
        if not self.trimmed:  # a cache filled under a larger limit is brought within this one (by the
            self.trimmed = True  # ranks that search: their records count the evictions)
            self.cache.trim()
        with self.cache.use(self.manifest, fragment, self.db.directory, lambda: self) as place:
            yield self.db if place is None else dataclasses.replace(self.db, directory=place)

    def record(self) -> dict[str, Any]:
        """The run record's per-rank `stage`: the cache's counts, and what each replica served."""
        return {
            "node": self.node,
            "directory": str(self.settings.directory),
            **self.cache.stats.as_record(),
            "replicas": self.retired + (self.replicas.report() if self.replicas is not None else []),
        }


# Stripe size in bytes for reading a volume from several replicas (default 4 MiB; small values make many
# stripes of a small database, for tests and measurements)
STRIPE_VARIABLE = "PARAMEDIC_STRIPE_BYTES"


def open_replicas(
    urls: Sequence[str],
    manifest: Manifest,
    keys: Path | None,
    required: int | None = None,
    dropped: Mapping[str, str] | None = None,
) -> ReplicaSet:
    """The replicas at `urls`, identity checked; a URL's scheme plugin opens it (`tls://`: a storage site).
    `required`: the first so many must be reachable (the -db directory); the mirrors after them are extra
    sources, dropped (with why, in the record) when down or serving no reads. `dropped`: mirrors the job's
    check already dropped (URL -> why): listed as dropped, not opened again."""
    from paramedic.db.replicas import MAX_READ_BYTES
    from paramedic.db.stripes import ReplicaSet
    from paramedic.ship.transport import open_replica  # each URL's scheme plugin

    stripe = os.environ.get(STRIPE_VARIABLE)
    if not stripe:
        return ReplicaSet.open(urls, manifest, keys, required=required, opener=open_replica, dropped=dropped)
    if not stripe.isdigit() or not 0 < int(stripe) <= MAX_READ_BYTES:
        raise UsageError(f"{STRIPE_VARIABLE}={stripe}: expected 1 to {MAX_READ_BYTES} bytes")
    return ReplicaSet.open(
        urls,
        manifest,
        keys,
        required=required,
        opener=open_replica,
        dropped=dropped,
        stripe_bytes=int(stripe),
    )


_STAGERS: dict[tuple[Path, Path], Stager] = {}


def stager(stage: StageSettings, db: Database) -> Stager:
    """This process's Stager for (cache, database), made on first use."""
    key = (stage.directory, db.directory)
    if key not in _STAGERS:
        _STAGERS[key] = Stager(stage, db)
    return _STAGERS[key]


def scheduling(
    stage: StageSettings | None, hellos: Sequence[Hello] | None, ranks: Sequence[int]
) -> dict[str, Any]:
    """The Scheduler's staging arguments for a master whose worker `i` is job rank `ranks[i]`: each
    worker's node, the fragments staged per node, and the bound on copies in flight. Empty without
    --stage (the scheduler then behaves as before)."""
    if stage is None or hellos is None:
        return {}
    nodes = {i: hellos[rank][0] for i, rank in enumerate(ranks)}
    staged: dict[str, set[int]] = {}
    for rank in ranks:
        node, fragments = hellos[rank]
        staged.setdefault(node, set()).update(fragments)
    return {"nodes": nodes, "staged": staged, "stage_copies": stage.copies}


def summary(stage: StageSettings | None, per_rank: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The run record's `stage` section: the settings and the job's totals over its ranks."""
    if stage is None:
        return None
    ranks = [r for r in per_rank if r is not None]
    total = {
        key: sum(r[key] for r in ranks)
        for key in ("hits", "copies", "copied_bytes", "evictions", "evicted_bytes", "discarded", "cleaned")
    }
    seconds = {key: round(sum(r[key] for r in ranks), 3) for key in ("copy_seconds", "wait_seconds")}
    per_node: dict[str, dict[str, int]] = {}  # what each node copied and found staged (a rerun: no copies)
    for r in ranks:
        figures = per_node.setdefault(r["node"], {"copies": 0, "copied_bytes": 0, "hits": 0})
        for key in figures:
            figures[key] += r[key]
    return {
        "directory": str(stage.directory),
        "limit_bytes": stage.limit,
        "mirrors": list(stage.mirrors),
        "mirrors_dropped_at_start": dict(stage.dropped_mirrors),  # by the job's check: no rank opened them
        "copies_in_flight_bound": stage.copies,
        "nodes": sorted(per_node),
        "per_node": dict(sorted(per_node.items())),
        **total,
        **seconds,
        "in_place": sorted({v for r in ranks for v in r["in_place"]}),
        "write_failures": sorted({w for r in ranks for w in r.get("write_failures", [])}),
    }
