"""The node-local cache (paramedic.db.stage) on real files, real locks and real processes, copying through
the real ReplicaSet; and the scheduler's staging rules (pure). No BLAST+: a volume here is a few files
of random bytes, digested as `paramedic format` digests a volume."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from paramedic.db.manifest import FRAGMENT_DIGESTS, MANIFEST_NAME, Fragment, Manifest, volume_sha256
from paramedic.db.replicas import LocalReplica
from paramedic.db.stage import FILL_PREFIX, StageCache, check_stageable, parse_size
from paramedic.db.stripes import ReplicaSet
from paramedic.engine.core.scheduler import Plan, Scheduler, SearchTask
from paramedic.errors import DatabaseError, UsageError
from tests.unit.fragments import searched

VOLUME_BYTES = 3 * 10_000  # three files of 10,000 bytes per volume


def make_db(root: Path, fragments: int = 3, digests: str = FRAGMENT_DIGESTS) -> Manifest:
    """A database directory as `paramedic format` lays it out, with random bytes for volumes."""
    root.mkdir(parents=True)
    frags = []
    for i in range(fragments):
        volume = f"f{i:03d}"
        for ext in ("pin", "phr", "psq"):
            (root / f"{volume}.{ext}").write_bytes(os.urandom(10_000))
        (root / f"frag{i:03d}.pal").write_text(f"TITLE t\nDBLIST {volume}\nNSEQ 9\nLENGTH 99\n")
        frags.append(Fragment(f"frag{i:03d}", volume, 3, 33, volume_sha256(root, volume)))
    manifest = Manifest(
        1, "prot", "t", 9, 99, "whole", "0" * 64, frags, "in.fa", "0" * 64, {"digests": digests}
    )
    (root / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


class SlowReplica(LocalReplica):
    """A real directory read slowly, so that a copy is under way long enough to be watched or killed."""

    def __init__(self, directory: Path, delay: float):
        super().__init__(directory)
        self.delay = delay

    def read(self, name: str, offset: int, length: int) -> bytes:
        time.sleep(self.delay)
        return super().read(name, offset, length)


def replicas(db: Path, delay: float = 0.0, stripe: int = 4 << 20) -> ReplicaSet:
    replica = SlowReplica(db, delay) if delay else LocalReplica(db)
    return ReplicaSet([replica], stripe_bytes=stripe)


def bytes_in(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and not p.name.startswith("."))


def test_a_copy_is_published_whole_with_its_alias_and_reused(tmp_path):
    manifest = make_db(tmp_path / "db")
    cache = StageCache(tmp_path / "cache")
    with cache.use(manifest, 1, tmp_path / "db", lambda: replicas(tmp_path / "db")) as place:
        assert place is not None and place.name == "f001"
        for ext in ("pin", "phr", "psq"):
            assert (place / f"f001.{ext}").read_bytes() == (tmp_path / "db" / f"f001.{ext}").read_bytes()
        assert (place / "frag001.pal").read_text() == "TITLE t\nDBLIST f001\nNSEQ 9\nLENGTH 99\n"
    assert cache.stats.copies == 1 and cache.stats.hits == 0 and cache.stats.copied_bytes > VOLUME_BYTES
    assert not list(cache.entry(manifest).glob(FILL_PREFIX + "*"))

    again = StageCache(tmp_path / "cache")  # a later run
    opened = []
    with again.use(manifest, 1, tmp_path / "db", lambda: opened.append(1) or replicas(tmp_path / "db")) as p:
        assert p == place
    assert (again.stats.hits, again.stats.copies, opened) == (1, 0, [])  # no replica even opened
    assert again.staged(manifest) == [1]


def test_the_limit_evicts_the_least_recently_used_volume_and_is_respected(tmp_path):
    manifest = make_db(tmp_path / "db", fragments=3)
    limit = 2 * VOLUME_BYTES + 1000  # two volumes and their aliases
    cache = StageCache(tmp_path / "cache", limit)
    source = tmp_path / "db"
    for fragment in (0, 1, 0, 2):  # 0 is used again after 1: 1 is the least recently used
        with cache.use(manifest, fragment, source, lambda: replicas(source)) as place:
            assert place is not None
            assert bytes_in(tmp_path / "cache") <= limit
        time.sleep(0.01)  # distinct last-use times
    assert cache.staged(manifest) == [0, 2]
    assert (cache.stats.copies, cache.stats.hits, cache.stats.evictions) == (3, 1, 1)


def test_a_smaller_limit_trims_the_cache_a_larger_one_filled(tmp_path):
    manifest = make_db(tmp_path / "db", fragments=3)
    source = tmp_path / "db"
    for fragment in (2, 0, 1):  # 2 is the least recently used
        with StageCache(tmp_path / "cache").use(manifest, fragment, source, lambda: replicas(source)):
            pass
        time.sleep(0.01)
    smaller = StageCache(tmp_path / "cache", VOLUME_BYTES + 1000)
    with smaller.use(manifest, 0, source, lambda: replicas(source)):
        smaller.trim()  # 0 is in use: 2, then 1 go
    assert smaller.staged(manifest) == [0] and smaller.stats.evictions == 2
    assert bytes_in(tmp_path / "cache") <= VOLUME_BYTES + 1000


def test_a_volume_in_use_is_never_evicted_and_one_that_does_not_fit_is_searched_in_place(tmp_path):
    manifest = make_db(tmp_path / "db", fragments=2)
    source = tmp_path / "db"
    limit = VOLUME_BYTES + 1000  # one volume
    searching = StageCache(tmp_path / "cache", limit)
    other = StageCache(tmp_path / "cache", limit)  # another worker on the node
    with StageCache(tmp_path / "cache", limit).use(manifest, 0, source, lambda: replicas(source)):
        pass  # published by an earlier run
    with searching.use(manifest, 0, source, lambda: replicas(source)) as held:
        assert held is not None and searching.stats.hits == 1
        with other.use(manifest, 1, source, lambda: replicas(source)) as place:
            assert place is None  # 0 is being searched: not evicted, 1 does not fit
        assert (held / "f000.psq").exists()
    assert other.stats.in_place == ["f001"] and other.stats.evictions == 0
    with other.use(manifest, 1, source, lambda: replicas(source)) as place:  # now 0 can go
        assert place is not None
    assert other.stats.evictions == 1 and searching.staged(manifest) == [1]

    tiny = StageCache(tmp_path / "tiny", 100)  # smaller than any volume
    with tiny.use(manifest, 0, source, lambda: replicas(source)) as place:
        assert place is None
    assert tiny.stats.in_place == ["f000"] and tiny.stats.copies == 0


class GatedReplica(LocalReplica):
    """A real directory whose reads wait for `gate`: a copy stays under way until the test lets it go."""

    def __init__(self, directory: Path, gate):
        super().__init__(directory)
        self.gate = gate

    def read(self, name: str, offset: int, length: int) -> bytes:
        assert self.gate.wait(60), "the test never opened the gate"
        return super().read(name, offset, length)


def _copy_in_process(cache_dir: Path, db: Path, fragment: int, queue, gate) -> None:
    manifest = Manifest.from_json((db / MANIFEST_NAME).read_text())
    cache = StageCache(cache_dir)
    opened = lambda: ReplicaSet([GatedReplica(db, gate)], stripe_bytes=4096)  # noqa: E731
    with cache.use(manifest, fragment, db, opened) as place:
        queue.put((str(place), cache.stats.copies, cache.stats.hits, cache.stats.wait_seconds))


def blocked_on_flock(pids: set[int]) -> set[int]:
    """Which of `pids` wait for a flock now (the kernel's own list: /proc/locks, "->" lines)."""
    waiting = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[2] == "FLOCK" and int(fields[5]) in pids:
            waiting.add(int(fields[5]))
    return waiting


def test_workers_on_one_node_share_one_copy(tmp_path):
    """Three processes ask for the same volume at once: one copies, the others wait and use its copy.
    The copy is held open until the kernel shows both others blocked on the volume's lock, so that they
    waited for it whatever the machine's load (it was a race: a late process found the copy done)."""
    make_db(tmp_path / "db")
    context = multiprocessing.get_context("fork")
    queue, gate = context.Queue(), context.Event()
    procs = [
        context.Process(target=_copy_in_process, args=(tmp_path / "cache", tmp_path / "db", 2, queue, gate))
        for _ in range(3)
    ]
    for proc in procs:
        proc.start()
    pids = {proc.pid for proc in procs if proc.pid is not None}
    deadline = time.monotonic() + 60
    while len(blocked_on_flock(pids)) < 2:  # two wait; the third is in its (gated) copy
        assert time.monotonic() < deadline, "the other two never waited for the copy"
        time.sleep(0.01)
    time.sleep(0.15)  # they are blocked: each one's wait is now longer than the 0.1 s asserted below
    gate.set()
    results = [queue.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert len({place for place, *_ in results}) == 1
    assert sorted(copies for _, copies, _, _ in results) == [0, 0, 1]
    assert sorted(hits for _, _, hits, _ in results) == [0, 1, 1]
    assert all(waited > 0.1 for _, copies, _, waited in results if copies == 0)  # they waited for it


def test_a_copy_that_changed_after_publication_is_copied_again_never_used(tmp_path):
    manifest = make_db(tmp_path / "db")
    source = tmp_path / "db"
    cache = StageCache(tmp_path / "cache")
    with cache.use(manifest, 0, source, lambda: replicas(source)) as place:
        assert place is not None
    with open(place / "f000.psq", "r+b") as fh:  # damaged on the node's disk
        fh.seek(5)
        fh.write(b"\xff\xfe")
    with cache.use(manifest, 0, source, lambda: replicas(source)) as again:
        assert again == place
        assert (again / "f000.psq").read_bytes() == (source / "f000.psq").read_bytes()
    assert (cache.stats.discarded, cache.stats.copies) == (1, 2)


@pytest.mark.parametrize("seal", [b"[" * 100_000 + b"]" * 100_000, b" " * (1 << 20) + b"{}", b"\xff{"])
def test_a_seal_nested_too_deep_or_too_large_is_no_seal(tmp_path, seal):
    """`make fuzz`'s stage target: a .seal nested past the JSON parser's depth was a RecursionError (exit 1,
    "internal error") on the next search; now it is no seal: the copy is made again."""
    manifest = make_db(tmp_path / "db")
    source = tmp_path / "db"
    with StageCache(tmp_path / "cache").use(manifest, 0, source, lambda: replicas(source)) as place:
        assert place is not None
    (place / ".seal").write_bytes(seal)
    cache = StageCache(tmp_path / "cache")
    with cache.use(manifest, 0, source, lambda: replicas(source)) as again:
        assert again == place and volume_sha256(again, "f000") == manifest.fragments[0].sha256
    assert cache.stats.copies == 1


def test_a_replica_serving_bad_bytes_is_dropped_and_the_copy_comes_from_another(tmp_path):
    manifest = make_db(tmp_path / "db")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for p in (tmp_path / "db").iterdir():
        (mirror / p.name).write_bytes(p.read_bytes())
    for ext in ("pin", "phr", "psq"):  # a byte flipped in every 64: any stripe the mirror serves is bad
        data = bytearray((mirror / f"f001.{ext}").read_bytes())
        for i in range(0, len(data), 64):
            data[i] ^= 0xFF
        (mirror / f"f001.{ext}").write_bytes(bytes(data))
    # plain striping: stripe i from replica i mod 2, so the mirror serves stripe 0 whatever the timing
    # (steered by rate, the good replica could take every stripe and nothing would be blamed)
    chosen = ReplicaSet.open([str(mirror), str(tmp_path / "db")], manifest, policy="round-robin")
    cache = StageCache(tmp_path / "cache")
    with cache.use(manifest, 1, tmp_path / "db", lambda: chosen) as place:
        assert place is not None
        assert volume_sha256(place, "f001") == manifest.fragments[1].sha256
    report = chosen.report()
    assert "did not verify" in str(report[0]["dropped"]) and report[1]["dropped"] is None

    alone = ReplicaSet.open([str(mirror)], manifest)  # nobody serves it verified: refused, nothing kept
    other = StageCache(tmp_path / "other")
    with pytest.raises(DatabaseError, match="no replica served it verified"):
        with other.use(manifest, 1, tmp_path / "db", lambda: alone):
            pass
    assert not [p for p in other.entry(manifest).iterdir() if p.is_dir()]


KILLED_COPY = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from tests.unit.test_stage import replicas
from paramedic.db.manifest import Manifest
from paramedic.db.stage import StageCache
db = Path({db!r})
manifest = Manifest.from_json((db / "manifest.json").read_text())
with StageCache(Path({cache!r})).use(manifest, 0, db, lambda: replicas(db, delay=0.2, stripe=1024)):
    pass
"""


def test_a_killed_copy_leaves_no_half_fragment_and_its_leftovers_are_cleaned(tmp_path):
    manifest = make_db(tmp_path / "db")
    cache_dir = tmp_path / "cache"
    script = KILLED_COPY.format(
        tests=str(Path(__file__).parents[2]), db=str(tmp_path / "db"), cache=str(cache_dir)
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        entry = cache_dir / manifest.checksum()[:32]
        deadline = time.monotonic() + 30
        fills: list[Path] = []
        while time.monotonic() < deadline and not any(p.stat().st_size for f in fills for p in f.iterdir()):
            time.sleep(0.05)
            fills = list(entry.glob(FILL_PREFIX + "f000-*")) if entry.is_dir() else []
        assert fills, "the child never started copying"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert not (entry / "f000").exists()  # no half fragment under the volume's name
    assert list(entry.glob(FILL_PREFIX + "f000-*"))

    cache = StageCache(cache_dir)
    assert cache.staged(manifest) == []
    with cache.use(manifest, 1, tmp_path / "db", lambda: replicas(tmp_path / "db")) as place:
        assert place is not None  # another volume: the survey removed the dead copy's reservation
    assert cache.stats.cleaned == 1
    assert not list(entry.glob(FILL_PREFIX + "*"))
    with cache.use(manifest, 0, tmp_path / "db", lambda: replicas(tmp_path / "db")) as place:
        assert place is not None and volume_sha256(place, "f000") == manifest.fragments[0].sha256


@pytest.mark.parametrize("planted", ["file", "link", "odd name"])
def test_something_planted_under_a_copys_name_is_removed_not_kept_forever(tmp_path, planted):
    """Issue 41, item 10: a `.fill-*` file (not a copy's directory) was renamed `.evict-*` and never
    removed (rmtree leaves a file); a `.fill-*` of no copy's shape was never looked at."""
    manifest = make_db(tmp_path / "db")
    cache_dir = tmp_path / "cache"
    cache = StageCache(cache_dir)
    with cache.use(manifest, 0, tmp_path / "db", lambda: replicas(tmp_path / "db")) as place:
        assert place is not None
    entry = cache_dir / manifest.checksum()[:32]
    if planted == "file":
        (entry / f"{FILL_PREFIX}f001-100-abcd").write_bytes(b"x" * 100)
    elif planted == "link":
        (entry / f"{FILL_PREFIX}f001-100-abcd").symlink_to(tmp_path / "db")
    else:
        (entry / f"{FILL_PREFIX}garbage").mkdir()
    again = StageCache(cache_dir)
    with again.use(manifest, 1, tmp_path / "db", lambda: replicas(tmp_path / "db")) as place:
        assert place is not None
    assert not [p.name for p in entry.iterdir() if p.name.startswith((".fill-", ".evict-"))]
    assert (tmp_path / "db").is_dir()  # a link is removed, never followed


def test_sizes_and_refusals():
    assert parse_size("500M") == 500 << 20
    assert parse_size("200G") == 200 << 30
    assert parse_size("1.5T") == int(1.5 * (1 << 40))
    assert parse_size("4096") == 4096
    assert parse_size("64KiB") == 64 << 10
    for bad in ("", "G", "-1G", "12X", "1,5G"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_an_older_database_is_refused_for_staging(tmp_path):
    manifest = make_db(tmp_path / "db", digests="")
    with pytest.raises(DatabaseError, match="format it again"):
        check_stageable(manifest, "dbs/old")


def test_the_cache_directory_must_be_usable(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(Exception, match="cannot use it"):
        StageCache(tmp_path / "file" / "cache")


def test_lock_waiting_threads_see_one_copy(tmp_path):
    """Threads of one process hold separate lock descriptions: they share a copy as processes do."""
    manifest = make_db(tmp_path / "db")
    source = tmp_path / "db"
    caches = [StageCache(tmp_path / "cache") for _ in range(4)]
    places: list[Path | None] = []

    def worker(cache: StageCache) -> None:
        with cache.use(manifest, 0, source, lambda: replicas(source, delay=0.01, stripe=2048)) as place:
            places.append(place)

    threads = [threading.Thread(target=worker, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(set(places)) == 1 and places[0] is not None
    assert sum(c.stats.copies for c in caches) == 1 and sum(c.stats.hits for c in caches) == 3


# -- the scheduler's staging rules (pure) ------------------------------------------------------------
def staged_plan(fragments: int = 4) -> Plan:
    return Plan((range(0, 2), range(2, 4)), fragments, (range(0, 2), range(2, 4)), hitlist_size=2)


def done(s: Scheduler, task: SearchTask) -> None:
    s.search_done(task, searched([[] for _ in s.plan.batches[task.batch]]))


def test_the_scheduler_prefers_fragments_staged_on_the_workers_node():
    s = Scheduler(staged_plan(), nodes={1: "a", 2: "b"}, staged={"a": {3}, "b": {1, 2}}, stage_copies=4)
    assert s.next_task(1) == SearchTask(0, 3)
    assert s.next_task(2) == SearchTask(0, 1)


def test_copies_in_flight_are_bounded_and_a_finished_search_counts_as_staged():
    s = Scheduler(staged_plan(), nodes={1: "a", 2: "b", 3: "a"}, stage_copies=1)
    assert s.per_worker and not Scheduler(staged_plan()).per_worker  # the runner asks every idle worker
    first = s.next_task(1)
    assert isinstance(first, SearchTask) and s.copies_in_flight == 1
    assert s.next_task(2) is None  # node b has nothing staged and the one copy allowed is in flight
    shared = s.next_task(3)  # node a: the fragment being copied there, sharing the copy
    assert isinstance(shared, SearchTask) and shared.fragment == first.fragment
    assert s.copies_in_flight == 1
    done(s, first)
    assert s.copies_in_flight == 0 and first.fragment in s.staged["a"]
    nxt = s.next_task(2)
    assert isinstance(nxt, SearchTask) and s.copies_in_flight == 1


def test_a_fragment_staged_at_start_is_left_to_its_node():
    """A second run: each node's workers search what their node staged; an idle worker elsewhere waits
    (does ready pieces) rather than copy it, so the run copies nothing."""
    s = Scheduler(staged_plan(), nodes={1: "a", 2: "b"}, staged={"a": {0, 1}, "b": {2, 3}}, stage_copies=4)
    assert s.per_worker
    mine = {s.next_task(1) for _ in range(4)}
    assert mine == {SearchTask(b, f) for b in (0, 1) for f in (0, 1)}
    assert s.next_task(1) is None  # node a has nothing left of its own: b's fragments wait for b
    assert s.next_task(2) == SearchTask(0, 2)
    # The bound on copies is not what holds it back: without one, the same.
    s = Scheduler(staged_plan(), nodes={1: "a", 2: "b"}, staged={"a": {0, 1}, "b": {2, 3}})
    assert s.per_worker and [s.next_task(1) for _ in range(5)][-1] is None


def test_a_node_with_less_than_half_its_share_staged_takes_any_fragment():
    """A node new to the job (nothing staged) is not left idle: it copies as on a first run; a node with
    half its share or more staged (here 2 of 4 fragments for 1 of 2 workers) waits for its own."""
    s = Scheduler(staged_plan(), nodes={1: "a", 2: "b"}, staged={"a": {0, 1, 2, 3}})
    assert not s.per_worker  # nothing left to others: the policy as before
    assert s.next_task(2) == SearchTask(0, 0)
    s = Scheduler(staged_plan(), nodes={1: "a", 2: "b", 3: "b"}, staged={"a": {0, 1, 3}, "b": {2}})
    assert s.next_task(1) == SearchTask(0, 0)
    assert s.next_task(2) == SearchTask(0, 2)  # b: 1 of 4 for 2 of 3 workers, less than half: any
    assert s.next_task(3) == SearchTask(1, 2)
    assert s.next_task(3) == SearchTask(0, 1)  # ... then even a's (a copy)
    s = Scheduler(staged_plan(), nodes={1: "a", 2: "b"}, staged={"a": {0, 1}, "b": {2, 3}, "c": {0}})
    assert s._theirs == {"a": {2, 3}, "b": {0, 1}}  # c has no worker here: its fragments count for nobody


def test_without_nodes_the_scheduler_is_unchanged():
    a, b = Scheduler(staged_plan()), Scheduler(staged_plan())
    b_tasks = [b.next_task(w) for w in (1, 2, 1, 2)]
    assert [a.next_task(w) for w in (1, 2, 1, 2)] == b_tasks
    with pytest.raises(ValueError):
        Scheduler(staged_plan(), nodes={1: "a"}, stage_copies=0)


def test_settings_refuse_staging_with_query_segmentation(tmp_path):
    from paramedic.engine.core.settings import SearchSettings, StageSettings

    stage = StageSettings(tmp_path)
    with pytest.raises(UsageError, match="--strategy queries"):
        SearchSettings("blastp", ["-query", "q", "-db", "d"], strategy="queries", stage=stage)
    with pytest.raises(UsageError, match="--stage-copies"):
        StageSettings(tmp_path, copies=0)
    assert dataclasses.replace(stage, copies=3).copies == 3


def _stager(tmp_path: Path, db: Path, opened: list[Path]):
    """A rank's Stager over `db` whose replica sets are opened, one per call, on the directories in
    `opened` (the engine opens the -db directory and the mirrors; here each attempt gets its own)."""
    from paramedic.blast.run import Database
    from paramedic.engine.core.settings import StageSettings
    from paramedic.engine.rank import staging

    attempts = iter(opened)

    def open_replicas(urls, manifest, keys, required=None, dropped=None):
        return ReplicaSet.open([str(next(attempts))], manifest, keys)

    stager = staging.Stager(
        StageSettings(tmp_path / "cache"),
        Database("db", db, "prot", "t", 9, 99, "whole", ("frag000", "frag001", "frag002")),
    )
    return stager, open_replicas


def _damaged_copy(db: Path, where: Path) -> Path:
    where.mkdir()
    for path in db.iterdir():
        data = bytearray(path.read_bytes())
        if path.suffix in (".pin", ".phr", ".psq"):
            data[0] ^= 0xFF
        (where / path.name).write_bytes(bytes(data))
    return where


def test_a_copy_no_replica_served_verified_is_fetched_again_from_all_afresh(tmp_path, monkeypatch):
    """The first attempt's only replica serves bad bytes (dropped, nothing used); the copy is fetched
    again from a fresh set, verified, and the record keeps both sets' reports."""
    from paramedic.engine.rank import staging

    db = tmp_path / "db"
    manifest = make_db(db)
    bad = _damaged_copy(db, tmp_path / "bad")
    stager, fake_open = _stager(tmp_path, db, [bad, db])
    monkeypatch.setattr(staging, "open_replicas", fake_open)
    with stager.fragment(1) as staged:
        assert volume_sha256(staged.directory, "f001") == manifest.fragments[1].sha256
    reports = stager.record()["replicas"]
    assert [r["replica"] for r in reports] == [str(bad), str(db)]
    assert reports[0]["dropped"] and reports[1]["dropped"] is None


def test_a_copy_that_fails_twice_fails_the_task_and_leaves_nothing(tmp_path, monkeypatch):
    from paramedic.engine.rank import staging

    db = tmp_path / "db"
    make_db(db)
    bad = _damaged_copy(db, tmp_path / "bad")
    stager, fake_open = _stager(tmp_path, db, [bad, bad])
    monkeypatch.setattr(staging, "open_replicas", fake_open)
    with pytest.raises(DatabaseError, match="no replica"), stager.fragment(2):
        pass
    assert bytes_in(tmp_path / "cache") == 0
    assert not [p for p in (tmp_path / "cache").rglob(f"{FILL_PREFIX}*")]
