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
from paramedic.engine.core.settings import StageSettings
from paramedic.errors import DatabaseError, UsageError

if TYPE_CHECKING:  # the cache and the replicas are imported by the ranks that stage (sockets, TLS)
    from paramedic.db.stripes import ReplicaSet
    from paramedic.db.units import Unit

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
        self.manifest: Manifest = _manifest(db)
        from paramedic.db.stage import StageCache

        self.cache = StageCache(stage.directory, stage.limit)
        self.trimmed = False
        self.replicas: ReplicaSet | None = None
        self.retired: list[dict[str, object]] = []  # reports of replica sets given up after a failure
        self.node = node_name()
        self.units: tuple[list[Unit], dict[str, Unit]] | None = None
        self.sources: dict[str, list[Path]] | None = None

    def _replicas(self) -> ReplicaSet:
        if self.replicas is None:
            urls = [str(self.db.directory), *self.settings.mirrors]
            local = {"local": self.db} if self.db.in_place else {}  # a database in place: its own replica
            self.replicas = open_replicas(
                urls,
                self.manifest,
                self.settings.keys,
                required=1,
                dropped=dict(self.settings.dropped_mirrors),
                **local,
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
        if self.db.in_place:
            volumes, _ = self._units()
            entry = self.cache.entry(self.manifest)
            here = {i for i, unit in enumerate(volumes) if (entry / unit.name).is_dir()}
            return self.node, tuple(f for f, r in enumerate(self.db.ranges) if r[0] in here)
        return self.node, tuple(self.cache.staged(self.manifest))

    def _units(self) -> tuple[list[Unit], dict[str, Unit]]:
        """A database in place's units (paramedic.db.units): per volume, and its shared ones by name."""
        if self.units is None:
            from paramedic.db.units import plan_units

            volumes, shared = plan_units(self.db.spans, self.manifest.volume_blake3, self.db.arg)
            self.units = volumes, {u.name: u for u in shared}
        return self.units

    def _size(self, base: str) -> int:
        """The bytes of a unit's files as the -db holds them (what its copy reserves in the cache)."""
        if self.sources is None:
            from paramedic.db.units import served_files

            self.sources = served_files(self.db.span_paths())
        try:
            return sum(p.stat().st_size for p in self.sources[base])
        except (KeyError, OSError) as exc:
            raise DatabaseError(f"{self.db.arg}: volume {base} is missing or unreadable") from exc

    @contextmanager
    def fragment(self, fragment: int) -> Iterator[Database]:
        """The database to search fragment `fragment` in: the staged copy (held for the block), or the
        -db directory itself when the copy does not fit the cache."""
        if not self.trimmed:  # a cache filled under a larger limit is brought within this one (by the
            self.trimmed = True  # ranks that search: their records count the evictions)
            self.cache.trim()
        if self.db.in_place:
            index = self.db.ranges[fragment][0]
            volumes, shared = self._units()
            unit = volumes[index]
            link = None if unit.shared is None else shared[unit.shared]
            with self.cache.use_in_place(self.manifest, unit, link, self._size, lambda: self) as place:
                if place is None:
                    yield self.db
                    return
                spans = list(self.db.spans)
                spans[index] = (str(place / unit.base), *spans[index][1:])
                yield dataclasses.replace(self.db, spans=tuple(spans))
            return
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
    local: Database | None = None,
) -> ReplicaSet:
    """The replicas at `urls`, identity checked; a URL's scheme plugin opens it (`tls://`: a storage site).
    `required`: the first so many must be reachable (the -db directory); the mirrors after them are extra
    sources, dropped (with why, in the record) when down or serving no reads. `dropped`: mirrors the job's
    check already dropped (URL -> why): listed as dropped, not opened again. A database in place (its
    manifest says so): `local` is the job's -db, the first URL; a directory URL holds the same database
    under the -db's name (paramedic.db.replicas.mirror_in_place), and copies verify against BLAKE3s."""
    from paramedic.db.replicas import (
        MAX_READ_BYTES,
        InPlaceReplica,
        Replica,
        ReplicaOpener,
        mirror_in_place,
    )
    from paramedic.db.stripes import ReplicaSet
    from paramedic.db.units import unit_digest
    from paramedic.ship.transport import open_replica  # each URL's scheme plugin

    def in_place(url: str, keys: Path | None) -> Replica:
        if local is not None and url == urls[0]:
            return InPlaceReplica(local.arg, manifest, local.span_paths())
        return open_replica(url, keys) if "://" in url else mirror_in_place(url, manifest)

    opener: ReplicaOpener = open_replica
    options: dict[str, object] = {}
    if manifest.in_place:
        opener = in_place
        options["digest_of"] = unit_digest
    stripe = os.environ.get(STRIPE_VARIABLE)
    if stripe:
        if not stripe.isdigit() or not 0 < int(stripe) <= MAX_READ_BYTES:
            raise UsageError(f"{STRIPE_VARIABLE}={stripe}: expected 1 to {MAX_READ_BYTES} bytes")
        options["stripe_bytes"] = int(stripe)
    return ReplicaSet.open(urls, manifest, keys, required=required, opener=opener, dropped=dropped, **options)


def _manifest(db: Database) -> Manifest:
    """The job's manifest: a formatted database's file, or a database in place's, made as the job made it
    (its digests remembered: paramedic.db.trust)."""
    if not db.in_place:
        return load_manifest(db.directory)
    from paramedic.db.locate import manifest_of

    return manifest_of(db)


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
