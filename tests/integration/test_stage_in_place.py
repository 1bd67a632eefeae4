"""--stage and --mirror on databases searched in place (issue 42, item 5): makeblastdb's own databases,
version 4 and 5, one volume and several, with and without -parse_seqids, in a read-only directory.

A volume is staged with its own files; a version-5 database's shared files (.pdb, .pos, .pot, .ptf,
.pto) are staged once per cache entry and linked beside each staged volume. Every report is compared byte
for byte with one BLAST+ run on the same -db, cold and warm, within a cache smaller than the database, with
a directory mirror (the same database at another path) and a storage site serving its copy (tls://), whose
bytes, damaged after it started, must not enter a copy. Each database's fixture asserts its case.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import blast, paramedic, take_fasta
from tests.support.site import StorageSite

pytestmark = pytest.mark.integration

SHARED = (".pdb", ".pos", ".pot", ".ptf", ".pto")
# name -> (makeblastdb arguments, version, volumes at least, ids kept)
DBS = {
    "v5-seqids-several": (["-blastdb_version", "5", "-parse_seqids", "-max_file_sz", "400KB"], 5, 3, True),
    "v5-one": (["-blastdb_version", "5"], 5, 1, False),
    "v4-several": (["-blastdb_version", "4", "-max_file_sz", "400KB"], 4, 3, False),
    "v4-seqids-one": (["-blastdb_version", "4", "-parse_seqids"], 4, 1, True),
}


def _makeblastdb(fasta: Path, out: Path, *extra: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["makeblastdb", "-in", str(fasta), "-dbtype", "prot", "-out", out.name, *extra],
        check=True,
        capture_output=True,
        cwd=out.parent,
    )


def _set_writable(directory: Path, writable: bool) -> None:
    for path in [directory, *directory.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _listing(directory: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Path]:
    """Read-only databases made by makeblastdb from 2,400 UniProt proteins; 30 queries; keys for a site."""
    base = tmp_path_factory.mktemp("stage-in-place")
    fasta = take_fasta(data_dir / "mmseqs2" / "DB.fasta", base / "proteins.fasta", 2400)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", base / "q.fasta", 30)
    dbs = base / "dbs"
    for name, (args, version, volumes, seqids) in DBS.items():
        _makeblastdb(fasta, dbs / name / "db", *args)
        pins = sorted((dbs / name).glob("*.pin"))
        assert len(pins) >= volumes and (len(pins) > 1) == (volumes > 1), (name, len(pins))
        assert int.from_bytes(pins[0].read_bytes()[:4], "big") == version
        assert any((dbs / name).glob("*.p[os]i" if version == 4 else "*.pog")) == seqids, name
        if version == 5 and volumes > 1:  # the database-wide files a staged volume needs beside it
            assert all((dbs / name / f"db{suffix}").is_file() for suffix in SHARED), name
    # another database (other proteins): a mirror of it is refused
    other = take_fasta(data_dir / "mmseqs2" / "DB.fasta", base / "other.fasta", 2400, start=2400)
    _makeblastdb(other, base / "other" / "v4-several" / "db", *DBS["v4-several"][0])
    # two databases whose single volumes are both named `db`, under one alias: not stageable by name
    _makeblastdb(fasta, dbs / "dup" / "a" / "db", "-blastdb_version", "4")
    _makeblastdb(other, dbs / "dup" / "b" / "db", "-blastdb_version", "4")
    (dbs / "dup.pal").write_text(f"TITLE dup\nDBLIST {dbs / 'dup' / 'a' / 'db'} {dbs / 'dup' / 'b' / 'db'}\n")
    # an alias over two version-5 databases of several volumes in two directories, one with a space
    half = take_fasta(other, base / "half.fasta", 1200)
    _makeblastdb(
        half, dbs / "two parts" / "b", "-blastdb_version", "5", "-parse_seqids", "-max_file_sz", "200KB"
    )
    assert len(list((dbs / "two parts").glob("b.*.pin"))) >= 2 and (dbs / "two parts" / "b.pdb").is_file()
    (dbs / "both.pal").write_text(
        f'TITLE both\nDBLIST {dbs / "v5-seqids-several" / "db"} "{dbs / "two parts" / "b"}"\n'
    )
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    _set_writable(dbs, False)
    yield base
    _set_writable(dbs, True)


def _search(
    site: Path,
    out: Path,
    db: str,
    *flags: str,
    env: dict[str, str] | None = None,
    check: bool = True,
    blast_args: tuple[str, ...] = (),
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """paramedic with 2 workers and batches of about 10 queries (each volume searched several times), against
    one BLAST+ run on the same -db: byte for byte; nothing appears in or changes in the databases."""
    dbs = site / "dbs"
    before = _listing(dbs)
    common = [
        "-query",
        str(site / "q.fasta"),
        "-db",
        db,
        "-evalue",
        "1e-3",
        "-outfmt",
        "6 std sseqid",
        *blast_args,
    ]
    proc = paramedic(
        "search", "blastp", *common, "-out", str(out), "--np", "3", "--batch", "10", "--quiet", *flags,
        cwd=dbs, env=env, check=check,
    )  # fmt: skip
    assert _listing(dbs) == before, "the database's directory changed"
    if not check:
        return proc, {}
    reference = out.with_name(out.name + ".ref")
    blast("blastp", *common, "-out", str(reference), cwd=dbs)
    assert out.read_bytes() == reference.read_bytes(), proc.stderr
    assert reference.read_text().count("\n") >= 30, "too few hits to test a merge"
    return proc, json.loads(out.with_name(out.name + ".run.json").read_text())


def _units(name: str, site: Path) -> int:
    """What a cold cache copies of database `name`: each volume, and once its shared files (version 5)."""
    directory = site / "dbs" / name
    volumes = len(list(directory.glob("*.pin")))
    return volumes + (1 if volumes > 1 and (directory / "db.pdb").is_file() else 0)


def _replicas(record: dict) -> list[dict]:
    return [r for rank in record["ranks_stats"] if rank.get("stage") for r in rank["stage"]["replicas"]]


def _cache_bytes(cache: Path) -> int:
    return sum(p.lstat().st_size for p in cache.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("name", list(DBS))
def test_a_database_in_place_is_staged_cold_and_warm(site: Path, tmp_path: Path, name: str) -> None:
    cache = tmp_path / "cache"
    _, cold = _search(site, tmp_path / "cold.tsv", f"{name}/db", "--stage", str(cache))
    stage = cold["stage"]
    assert cold["strategy"] == "fragments" and stage["in_place"] == [] and stage["write_failures"] == []
    assert stage["copies"] == _units(name, site)  # each volume once, the shared files once
    searches = stage["copies"] + stage["hits"]
    assert stage["hits"] > 0 and cold["batches"] >= 2
    served = _replicas(cold)
    assert served and all(r["dropped"] is None for r in served)
    entry = next(p for p in cache.iterdir() if p.is_dir())
    volumes = sorted(p for p in entry.iterdir() if p.is_dir() and p.name.startswith("v"))
    assert len(volumes) == len(list((site / "dbs" / name).glob("*.pin")))
    for volume in volumes:  # a copy under the volume's own names; shared files linked, never copied twice
        links = [p for p in volume.iterdir() if p.is_symlink()]
        shared = [p for p in entry.iterdir() if p.name.startswith("s") and p.is_dir()]
        if _units(name, site) > len(volumes):
            assert len(shared) == 1 and sorted(p.name for p in links) == sorted(f"db{s}" for s in SHARED)
            assert all(os.readlink(p) == f"../{shared[0].name}/{p.name}" for p in links)
        else:
            assert links == [] and shared == []
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700

    _, warm = _search(site, tmp_path / "warm.tsv", f"{name}/db", "--stage", str(cache))
    assert warm["stage"]["copies"] == 0 and warm["stage"]["hits"] >= searches
    assert _replicas(warm) == []  # a warm cache opens no replica


def test_an_alias_over_two_directories_stages_each_database_s_shared_files_once(
    site: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    _, record = _search(site, tmp_path / "cold.tsv", "both", "--stage", str(cache))
    volumes = len(list((site / "dbs" / "v5-seqids-several").glob("*.pin")))
    volumes += len(list((site / "dbs" / "two parts").glob("*.pin")))
    assert record["stage"]["copies"] == volumes + 2 and record["stage"]["in_place"] == []
    entry = next(p for p in cache.iterdir() if p.is_dir())
    shared = sorted(p.name for p in entry.iterdir() if p.is_dir() and p.name.startswith("s"))
    assert shared == ["s000", "s001"]
    targets = {os.readlink(p) for p in entry.glob("v*/*.pdb")}  # (BLAST+'s order: b.00 before db.00)
    assert targets == {"../s000/b.pdb", "../s001/db.pdb"}
    _, warm = _search(site, tmp_path / "warm.tsv", "both", "--stage", str(cache))
    assert warm["stage"]["copies"] == 0


def test_a_restricted_search_reads_its_masks_over_the_staged_copies(site: Path, tmp_path: Path) -> None:
    """-seqidlist: each fragment's alias masks the staged volume (paramedic.blast.run._restricted_range)."""
    name = "v5-seqids-several"
    ids = subprocess.run(
        ["blastdbcmd", "-db", f"{name}/db", "-entry", "all", "-outfmt", "%a"],
        cwd=site / "dbs", check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    chosen = tmp_path / "ids.txt"
    chosen.write_text("\n".join(ids[::3]) + "\n")  # a third of the proteins, in every volume
    cache = tmp_path / "cache"
    _, record = _search(
        site,
        tmp_path / "out.tsv",
        f"{name}/db",
        "--stage",
        str(cache),
        blast_args=("-seqidlist", str(chosen)),
    )
    assert record["stage"]["copies"] == _units(name, site) and record["stage"]["in_place"] == []
    subjects = {line.split("\t")[1] for line in (tmp_path / "out.tsv").read_text().splitlines()}
    assert subjects <= set(ids[::3]) and len(subjects) >= 10  # restricted, and still many subjects


@pytest.mark.parametrize("name", ["v5-seqids-several", "v4-several"])
def test_a_cache_smaller_than_the_database_keeps_its_limit_and_the_output(
    site: Path, tmp_path: Path, name: str
) -> None:
    directory = site / "dbs" / name
    volume = [
        sum(p.stat().st_size for p in directory.glob(f"{pin.stem}.*")) for pin in directory.glob("*.pin")
    ]
    shared = sum((directory / f"db{s}").stat().st_size for s in SHARED if (directory / f"db{s}").exists())
    assert len(volume) >= 3
    limit = shared + 2 * max(volume) + 1024  # the shared files and two volumes of three or more
    cache = tmp_path / "cache"
    for run in ("first", "second"):
        _, record = _search(
            site, tmp_path / f"{run}.tsv", f"{name}/db", "--stage", str(cache), "--stage-limit", str(limit)
        )
        assert record["stage"]["evictions"] > 0 or record["stage"]["in_place"], record["stage"]
        assert _cache_bytes(cache) <= limit


def test_a_directory_mirror_at_another_path_serves_stripes(site: Path, tmp_path: Path) -> None:
    name = "v5-seqids-several"
    mirror = tmp_path / "mirror" / name
    shutil.copytree(site / "dbs" / name, mirror)  # the same database (checksums agree: paths excluded)
    _, record = _search(
        site, tmp_path / "out.tsv", f"{name}/db", "--stage", str(tmp_path / "cache"), "--mirror",
        str(mirror.parent / name), env={"PARAMEDIC_STRIPE_BYTES": "8192"},
    )  # fmt: skip
    served = _replicas(record)
    theirs = [r for r in served if r["replica"] == str(mirror.parent / name)]
    assert theirs and sum(r["bytes"] for r in theirs) > 0 and all(r["dropped"] is None for r in served)
    assert record["stage"]["copies"] == _units(name, site)


def test_a_damaged_directory_mirror_is_dropped_where_it_is_damaged(site: Path, tmp_path: Path) -> None:
    """A mirror of the same release (its headers, so its keys, are the job's) whose sequences are
    damaged: opened without digesting it (its keys are read from its headers), its stripes checked
    as they are copied."""
    name = "v5-seqids-several"
    mirror = tmp_path / "mirror" / name
    shutil.copytree(site / "dbs" / name, mirror)
    damaged = [p for p in mirror.iterdir() if p.suffix == ".psq"]  # (a damaged .pdb: BLAST+ cannot open it)
    assert len(damaged) >= 3
    for path in damaged:
        _flip_all(path)
    # Which replica serves which stripe follows the replicas' measured rates: a run may take every
    # damaged stripe from -db itself (seen once in CI: only the mirror's whole shared files and headers
    # read). Each run's report is BLAST+'s (_search); up to 5 fresh caches until one reads the damage.
    tried = []
    for attempt in range(5):
        _, record = _search(
            site, tmp_path / f"out{attempt}.tsv", f"{name}/db", "--stage", str(tmp_path / f"cache{attempt}"),
            "--mirror", str(mirror), env={"PARAMEDIC_STRIPE_BYTES": "8192"},
        )  # fmt: skip
        assert record["stage"]["copies"] == _units(name, site)
        theirs = [r for r in _replicas(record) if r["replica"] == str(mirror)]
        # a rank whose copy took the mirror's damaged stripes dropped it (a rank may have copied only what
        # is whole there: the shared files, the headers); the copies all verified
        dropped = [r["dropped"] for r in theirs if r["dropped"]]
        assert all("did not verify" in why for why in dropped), theirs
        tried.append(theirs)
        if dropped:
            break
    assert dropped, tried


def _flip_all(path: Path) -> None:
    """Every stripe of the file wrong, its times put back (the site's start-time digests still claim it)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    for position in {*range(0, len(data), 64), len(data) - 1}:
        data[position] ^= 0xFF
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_storage_site_serves_its_replica_in_place_and_is_dropped_when_it_lies(
    site: Path, tmp_path: Path
) -> None:
    """A `paramedic serve --replica` of the same database in place (at the site's own paths) serves its
    volumes and shared files by name; once its files are damaged (after it started, times kept), every
    copy that took its bytes drops it and the report is still BLAST+'s."""
    name = "v5-seqids-several"
    replica = tmp_path / "replica" / name
    shutil.copytree(site / "dbs" / name, replica)
    (tmp_path / "root").mkdir()
    server = StorageSite(replica / "db", tmp_path / "root", site / "keys" / "server", tmp_path / "serve.log")
    server.start()
    try:
        url = f"{server.url}/{name}"
        flags = ["--mirror", url, "--keys", str(site / "keys" / "compute-a")]
        env = {"PARAMEDIC_STRIPE_BYTES": "8192"}
        _, good = _search(
            site, tmp_path / "good.tsv", f"{name}/db", "--stage", str(tmp_path / "c1"), *flags, env=env
        )
        theirs = [r for r in _replicas(good) if r["replica"].startswith("tls://")]
        assert theirs and sum(r["bytes"] for r in theirs) > 0 and all(r["dropped"] is None for r in theirs)
        damaged = [p for p in replica.iterdir() if p.suffix != ".pal" and p.stat().st_size > 0]
        assert any(p.suffix == ".pdb" for p in damaged) and len(damaged) >= 3 * 4
        for path in damaged:
            _flip_all(path)
        _, bad = _search(
            site, tmp_path / "bad.tsv", f"{name}/db", "--stage", str(tmp_path / "c2"), *flags, env=env
        )
    finally:
        server.stop()
    theirs = [r for r in _replicas(bad) if r["replica"].startswith("tls://")]
    used = [r for r in theirs if r["bytes"] > r["wasted_bytes"]]
    assert used and all(r["dropped"] for r in used), theirs
    assert bad["stage"]["copies"] == _units(name, site)


def test_refusals_are_one_line(site: Path, tmp_path: Path) -> None:
    cases = [
        ("v4-several/db", ("--mirror", str(site / "other" / "v4-several")), 4, "holds a different database"),
        ("dup", (), 2, "two volumes named db"),
    ]
    for db, flags, code, words in cases:
        proc, _ = _search(
            site, tmp_path / "refused.tsv", db, "--stage", str(tmp_path / "c"), *flags, check=False
        )
        assert proc.returncode == code, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("paramedic: error:") and words in lines[0], lines
        assert not (tmp_path / "refused.tsv").exists()
