"""The staging units of a database in place (paramedic.db.units) and the cache's handling of them
(paramedic.db.stage.use_in_place), on real files and the real ReplicaSet; no BLAST+: a "version-5
database" here is three volumes of random bytes and its shared files, digested as paramedic.db.locate
digests a database in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paramedic.db.locate import _combined
from paramedic.db.manifest import IN_PLACE, Fragment, Manifest, volume_files_in_place
from paramedic.db.replicas import InPlaceReplica, ReplicaError
from paramedic.db.stage import StageCache, check_stageable
from paramedic.db.stripes import ReplicaSet
from paramedic.db.trust import DigestStore
from paramedic.db.units import check_names, plan_units, served_files, unit_digest
from paramedic.errors import UsageError
from paramedic.ship.wire import ProtocolError
from paramedic.site.replica_reads import ReplicaReads

DATE = "Dec 2, 2026  4:00 AM"  # BLAST+ dates hold spaces: keys are matched by prefix, never split


def make_db(root: Path, store: Path, volumes: int = 3) -> tuple[Manifest, list[tuple[str, int, int, int]]]:
    """A multi-volume version-5 database in place: db.00 ... with their own files, db.pdb ... shared."""
    root.mkdir(parents=True)
    spans, digests, first = [], {}, 0
    for i in range(volumes):
        for ext in ("pin", "phr", "psq", "pog"):
            (root / f"db.{i:02d}.{ext}").write_bytes(os.urandom(5_000 + i))
        spans.append((str(root / f"db.{i:02d}"), first, 10, 1000))
        first += 10
    for ext in ("pdb", "pos", "pot", "ptf", "pto"):
        (root / f"db.{ext}").write_bytes(os.urandom(3_000))
    (root / "db.pal").write_text("TITLE t\nDBLIST db.00 db.01 db.02\n")
    digest_store = DigestStore(store)
    for path, first, nseq, length in spans:
        own, shared = volume_files_in_place(Path(path))
        digests[f"{first} {Path(path).name} {nseq} {length} {DATE}"] = _combined(own, digest_store)
        digests[f"shared db {DATE}"] = _combined(shared, digest_store)
    fragments = [Fragment(f"range{i}", path, 10, 1000, "") for i, (path, *_) in enumerate(spans)]
    manifest = Manifest(
        1, "prot", "t", 10 * volumes, 1000 * volumes, "", "", fragments, str(root / "db"), "",
        {"layout": IN_PLACE}, digests,
    )  # fmt: skip
    return manifest, spans


def replicas(manifest: Manifest, spans: list[tuple[str, int, int, int]]) -> ReplicaSet:
    replica = InPlaceReplica("db", manifest, [path for path, *_ in spans])
    return ReplicaSet([replica], stripe_bytes=4096, digest_of=unit_digest)


def test_units_name_volumes_by_order_and_share_one_unit_of_shared_files(tmp_path: Path) -> None:
    manifest, spans = make_db(tmp_path / "db", tmp_path / "store")
    volumes, shared = plan_units(spans, manifest.volume_blake3, "db")
    assert [u.name for u in volumes] == ["v00000", "v00001", "v00002"]
    assert [u.base for u in volumes] == ["db.00", "db.01", "db.02"]
    assert [(u.name, u.base) for u in shared] == [("s000", "db")] and {u.shared for u in volumes} == {"s000"}
    # each unit's digest is the one paramedic.db.locate keyed, recomputed from a copy's files alone (a
    # copy's directory holds one unit: every file with its prefix counts, none may be added)
    assert all(unit_digest(tmp_path / "db", u.base) == u.digest for u in volumes)
    alone = tmp_path / "shared"
    alone.mkdir()
    for ext in ("pdb", "pos", "pot", "ptf", "pto"):
        (alone / f"db.{ext}").write_bytes((tmp_path / "db" / f"db.{ext}").read_bytes())
    assert unit_digest(alone, "db") == shared[0].digest
    (alone / "db.00.pin").write_bytes(b"planted")
    assert unit_digest(alone, "db") != shared[0].digest


def test_a_single_volume_holds_its_own_shared_files(tmp_path: Path) -> None:
    root = tmp_path / "one"
    root.mkdir()
    for ext in ("pin", "psq", "phr", "pdb", "pot"):
        (root / f"db.{ext}").write_bytes(os.urandom(100))
    own, shared = volume_files_in_place(root / "db")
    key = f"0 db 5 50 {DATE}"
    volumes, units = plan_units([(str(root / "db"), 0, 5, 50)], {key: "x"}, "db")
    assert shared == [] and units == [] and volumes[0].shared is None and len(own) == 5


def test_two_volumes_or_databases_of_one_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="two volumes named db"):
        check_names([str(tmp_path / "a" / "db"), str(tmp_path / "b" / "db")], "both")
    with pytest.raises(UsageError, match="two databases named m"):
        check_names([str(tmp_path / "a" / "m.00"), str(tmp_path / "b" / "m.01")], "both")
    check_names([str(tmp_path / "a" / "m.00"), str(tmp_path / "a" / "m.01")], "one")  # one database


def test_a_replica_serves_only_its_whitelist(tmp_path: Path) -> None:
    manifest, spans = make_db(tmp_path / "db", tmp_path / "store")
    replica = InPlaceReplica("db", manifest, [path for path, *_ in spans])
    assert [f.name for f in replica.volume_files("db")] == [
        f"db.{e}" for e in ("pdb", "pos", "pot", "ptf", "pto")
    ]
    assert [f.name for f in replica.volume_files("db.01")] == [
        f"db.01.{e}" for e in ("phr", "pin", "pog", "psq")
    ]
    assert replica.read("db.01.psq", 10, 5) == (tmp_path / "db" / "db.01.psq").read_bytes()[10:15]
    for name in ("db.pal", "../db/db.00.psq", str(tmp_path / "db" / "db.00.psq"), "db.00"):
        with pytest.raises(ReplicaError):
            replica.read(name, 0, 1)
    with pytest.raises(ReplicaError):
        replica.volume_files("db.03")
    assert set(served_files([path for path, *_ in spans])) == {"db", "db.00", "db.01", "db.02"}


def test_volumes_are_staged_with_links_to_shared_files_copied_once(tmp_path: Path) -> None:
    """Each volume's directory holds its own files and links to the shared ones, copied once; the seals
    hold while more volumes link them (a hard link would move the shared files' ctimes)."""
    manifest, spans = make_db(tmp_path / "db", tmp_path / "store")
    check_stageable(manifest, "db")
    volumes, shared = plan_units(spans, manifest.volume_blake3, "db")
    sources = served_files([path for path, *_ in spans])
    sizes = {base: sum(p.stat().st_size for p in files) for base, files in sources.items()}
    cache = StageCache(tmp_path / "cache")
    rs = replicas(manifest, spans)
    for _ in range(2):
        for unit in volumes:
            with cache.use_in_place(manifest, unit, shared[0], sizes.__getitem__, lambda: rs) as place:
                assert place is not None and place.name == unit.name
                assert (place / "db.pdb").is_symlink() and os.readlink(place / "db.pdb") == "../s000/db.pdb"
                assert (place / "db.pdb").read_bytes() == (tmp_path / "db" / "db.pdb").read_bytes()
                assert (place / f"{unit.base}.psq").read_bytes() == (
                    tmp_path / "db" / f"{unit.base}.psq"
                ).read_bytes()
    assert cache.stats.copies == 4  # three volumes and the shared files, once
    assert (
        cache.stats.discarded == 0 and cache.stats.hits == 2 + 6
    )  # the later volumes' shared hits, all reuses
    fresh = StageCache(tmp_path / "cache")  # another process: digests each copy once, keeps them
    with fresh.use_in_place(manifest, volumes[1], shared[0], sizes.__getitem__, lambda: rs) as place:
        assert place is not None
    assert fresh.stats.copies == 0 and fresh.stats.discarded == 0


def test_a_limit_counts_shared_files_once_and_evicts_whole_units(tmp_path: Path) -> None:
    manifest, spans = make_db(tmp_path / "db", tmp_path / "store")
    volumes, shared = plan_units(spans, manifest.volume_blake3, "db")
    sources = served_files([path for path, *_ in spans])
    sizes = {base: sum(p.stat().st_size for p in files) for base, files in sources.items()}
    limit = sizes["db"] + sizes["db.00"] + sizes["db.01"] + 4096  # the shared files, two volumes, seals
    cache = StageCache(tmp_path / "cache", limit)
    rs = replicas(manifest, spans)
    for unit in volumes:
        with cache.use_in_place(manifest, unit, shared[0], sizes.__getitem__, lambda: rs) as place:
            assert place is not None
    used = sum(
        p.lstat().st_size
        for p in (tmp_path / "cache").rglob("*")
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".")
    )
    assert used <= limit and cache.stats.evictions == 1  # the least recently used volume, never s000 held


def test_a_damaged_replica_byte_is_never_staged(tmp_path: Path) -> None:
    manifest, spans = make_db(tmp_path / "db", tmp_path / "store")
    volumes, shared = plan_units(spans, manifest.volume_blake3, "db")
    damaged = tmp_path / "db" / "db.pdb"
    data = bytearray(damaged.read_bytes())
    data[7] ^= 1
    damaged.write_bytes(bytes(data))
    cache = StageCache(tmp_path / "cache")
    rs = replicas(manifest, spans)
    with pytest.raises(Exception, match="no replica served it verified"):
        with cache.use_in_place(manifest, volumes[0], shared[0], lambda base: 20_000, lambda: rs):
            pass
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix == ".pdb"]


def test_a_volume_whose_shared_files_were_evicted_is_kept_and_linked_again(tmp_path: Path) -> None:
    manifest, spans = make_db(tmp_path / "db", tmp_path / "store")
    volumes, shared = plan_units(spans, manifest.volume_blake3, "db")
    cache = StageCache(tmp_path / "cache")
    rs = replicas(manifest, spans)
    with cache.use_in_place(manifest, volumes[0], shared[0], lambda base: 20_000, lambda: rs) as place:
        assert place is not None
    entry = cache.entry(manifest)
    assert cache._evict(entry / "s000") and not (entry / "s000").exists()  # nobody held it
    assert not (entry / "v00000" / "db.pdb").exists()  # a dangling link, until the shared files are back
    with cache.use_in_place(manifest, volumes[0], shared[0], lambda base: 20_000, lambda: rs) as place:
        assert (
            place is not None and (place / "db.pdb").read_bytes() == (tmp_path / "db" / "db.pdb").read_bytes()
        )
    assert cache.stats.copies == 3 and cache.stats.discarded == 0  # the shared files twice, the volume once


def test_a_storage_site_serves_a_database_in_place_by_names_and_shows_none_of_its_paths(
    tmp_path: Path,
) -> None:
    manifest, spans = make_db(tmp_path / "db", tmp_path / "store")
    reads = ReplicaReads(tmp_path / "db", manifest, volume_paths=[path for path, *_ in spans])
    header, payload = reads.answer("replica_manifest", {})
    assert str(tmp_path).encode() not in payload  # the site's paths are its own
    assert Manifest.from_json(payload.decode()).checksum() == header["manifest_sha256"] == manifest.checksum()
    listed, _ = reads.answer("volume_files", {"volume": "db"})
    assert [name for name, _ in listed["files"]] == [f"db.{e}" for e in ("pdb", "pos", "pot", "ptf", "pto")]
    reply, data = reads.answer("read", {"name": "db.02.psq", "offset": 3, "length": 4})
    reads.sent()
    assert data == (tmp_path / "db" / "db.02.psq").read_bytes()[3:7] and reply["length"] == 4
    for name in ("db.pal", "../db/db.pdb", str(tmp_path / "db" / "db.pdb"), "db.00"):
        with pytest.raises(ProtocolError):
            reads.answer("read", {"name": name, "offset": 0, "length": 1})
    with pytest.raises(ProtocolError):
        reads.answer("volume_files", {"volume": "db.07"})


def test_a_mirror_s_keys_are_the_digests_keys_read_from_headers_alone(tmp_path: Path) -> None:
    from paramedic.db.blastdb import Volume
    from paramedic.db.locate import _volume_digests, volume_keys

    manifest, spans = make_db(tmp_path / "db", tmp_path / "store")
    volumes = [Volume(path, first, nseq, length, DATE, 5) for path, first, nseq, length in spans]
    assert volume_keys(volumes) == set(_volume_digests(volumes)) == set(manifest.volume_blake3)
