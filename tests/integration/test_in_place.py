"""Databases users hold, searched where they lie (issue 42): makeblastdb's output, version 4 and 5, one
volume to more than 100, with and without -parse_seqids, an alias over two databases and two databases in
one -db, from a read-only directory. Every report is compared byte for byte with one BLAST+ run on the
same -db, with both strategies; nothing may appear in, or change in, the database's directory.

Each database's fixture asserts the case it exists for (its version, its volume count, whether it kept
the ids), and each comparison asserts that the hits cross fragments, so that a merge is really tested.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from paramedic.db.blastdb import read_header
from tests.conftest import blast, paramedic, take_fasta

pytestmark = pytest.mark.integration


def _makeblastdb(fasta: Path, out: Path, dbtype: str, *extra: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(  # from its directory: makeblastdb takes no -out with a space
        ["makeblastdb", "-in", str(fasta), "-dbtype", dbtype, "-out", out.name, *extra],
        check=True,
        capture_output=True,
        cwd=out.parent,
    )


def _listing(directory: Path) -> list[tuple[str, int, int]]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*"))


def _read_only(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


# name -> (makeblastdb arguments, version, at least this many volumes, ids kept)
PROTEIN_DBS = {
    "v5-one": (["-blastdb_version", "5"], 5, 1, False),
    "v5-seqids-several": (["-blastdb_version", "5", "-parse_seqids", "-max_file_sz", "400KB"], 5, 3, True),
    "v4-seqids-one": (["-blastdb_version", "4", "-parse_seqids"], 4, 1, True),
    "v4-several": (["-blastdb_version", "4", "-max_file_sz", "400KB"], 4, 3, False),
    "v5-over-100": (["-blastdb_version", "5", "-max_file_sz", "10KB"], 5, 101, False),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Path]:
    """A read-only directory of databases made by makeblastdb from 2,400 UniProt proteins, and 12 queries."""
    base = tmp_path_factory.mktemp("inplace")
    fasta = take_fasta(data_dir / "mmseqs2" / "DB.fasta", base / "proteins.fasta", 2400)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", base / "q.fasta", 12)
    dbs = base / "dbs"
    for name, (args, version, volumes, seqids) in PROTEIN_DBS.items():
        _makeblastdb(fasta, dbs / name / "db", "prot", *args)
        pins = sorted((dbs / name).glob("*.pin"))
        assert len(pins) >= volumes, (name, len(pins))
        assert int.from_bytes(pins[0].read_bytes()[:4], "big") == version
        assert any((dbs / name).glob("*.p[os]i" if version == 4 else "*.pog")) == seqids, name
    # an alias over two databases, as users write one (absolute paths, one with a space)
    half = take_fasta(fasta, base / "half.fasta", 1200, start=1200)
    _makeblastdb(half, dbs / "two parts" / "b", "prot", "-blastdb_version", "5")
    (dbs / "both.pal").write_text(
        f'TITLE both\nDBLIST {dbs / "v5-over-100" / "db"} "{dbs / "two parts" / "b"}"\n'
    )
    # ids kept in more than 100 volumes: makeblastdb's id index and BLAST+'s reading order disagree
    _makeblastdb(fasta, dbs / "seqids-over-100" / "db", "prot", "-parse_seqids", "-max_file_sz", "10KB")
    assert (dbs / "seqids-over-100" / "db.100.pin").exists() and any((dbs / "seqids-over-100").glob("*.pog"))
    # an alias whose volumes BLAST+ numbers interleaved: m.00, m.005 (another database), m.01, ...
    _makeblastdb(fasta, dbs / "inter" / "a" / "m", "prot", "-max_file_sz", "400KB")
    _makeblastdb(half, dbs / "inter" / "b" / "m.005", "prot")
    (dbs / "inter.pal").write_text(
        f"TITLE inter\nDBLIST {dbs / 'inter' / 'a' / 'm'} {dbs / 'inter' / 'b' / 'm.005'}\n"
    )
    _read_only(dbs)
    yield base
    _writable(dbs)


def _compare(
    site: Path,
    tmp_path: Path,
    db: str,
    *engine: str,
    program: str = "blastp",
    evalue: str = "1e-3",
    outfmt: str = "6 std sseqid",
):
    """paramedic and BLAST+ on the same -db; returns the report."""
    dbs = site / "dbs"
    before = _listing(dbs)
    common = ["-query", str(site / "q.fasta"), "-db", db, "-evalue", evalue, "-outfmt", outfmt]
    blast(program, *common, "-out", str(tmp_path / "ref.tsv"), cwd=dbs)
    proc = paramedic("search", program, *common, "-out", str(tmp_path / "out.tsv"), *engine, cwd=dbs)
    assert (tmp_path / "out.tsv").read_bytes() == (tmp_path / "ref.tsv").read_bytes(), proc.stderr
    assert _listing(dbs) == before, "the database's directory changed"
    report = (tmp_path / "ref.tsv").read_text()
    assert report.count("\n") >= 30, "too few hits to test a merge"
    return report, proc.stderr


@pytest.mark.parametrize("name", list(PROTEIN_DBS))
@pytest.mark.parametrize("engine", ["fragments", "fragments, traceback once", "queries"])
def test_a_makeblastdb_database_is_searched_in_place(
    site: Path, tmp_path: Path, name: str, engine: str
) -> None:
    """Per fragment, a database with ids names each subject by its id, mapped back to its ordinal id
    through the database's own index; traceback once takes ordinal ids from the preliminary lists."""
    strategy, _, once = engine.partition(", ")
    args = ["--strategy", strategy] + (["--traceback", "once"] if once else [])
    if strategy == "fragments" and not once:
        args += ["--traceback", "per-fragment"]
    _, err = _compare(site, tmp_path, f"{name}/db", *args)
    assert f"strategy: {strategy}" in err


@pytest.mark.parametrize("name", ["v5-seqids-several", "v4-several", "v5-over-100"])
@pytest.mark.parametrize("outfmt", ["0", "5"])
def test_reports_are_written_from_the_searches_alignments(
    site: Path, tmp_path: Path, name: str, outfmt: str
) -> None:
    """The fragment searches' alignments make the report (blast_formatter), no second search: subjects
    named by their own ids as they are, or by ordinal ids made the whole database's (a volume's first id
    plus the id in the search)."""
    import json

    _compare(site, tmp_path, f"{name}/db", "--strategy", "fragments", "--traceback", "per-fragment",
             outfmt=outfmt)  # fmt: skip
    record = json.loads((tmp_path / "out.tsv.run.json").read_text())
    tasks = [rank["tasks"] for rank in record["ranks_stats"]]
    # the case: every piece written from the alignments, none by searching again
    assert record["alignments"] in ("store", "tasks")
    assert sum(t["rendered"] for t in tasks) == record["pieces"] >= 1
    assert sum(t["render_fallbacks"] for t in tasks) == 0
    # and the alignments came from several fragments, past the first volume (ids that needed the offset)
    assert record["fragments"] >= 3


def test_fragments_of_many_volumes_cross_volume_boundaries_in_order(site: Path, tmp_path: Path) -> None:
    """More than 100 volumes: BLAST+ numbers `db.100` before `db.11`; a global id is the volume's first id
    in that order plus the local id, so every hit keeps its place (and the tie rule its order)."""
    report, _ = _compare(site, tmp_path, "v5-over-100/db", "--strategy", "fragments")
    subjects = {line.split("\t")[1] for line in report.splitlines()}
    assert len(subjects) >= 20


def test_an_alias_over_two_databases_and_two_names_in_one_db(site: Path, tmp_path: Path) -> None:
    for db in ("both", 'v5-one/db "two parts/b"'):
        for strategy in ("fragments", "queries"):
            _compare(site, tmp_path, db, "--strategy", strategy)


def test_an_alias_whose_databases_interleave_keeps_blast_numbering(site: Path, tmp_path: Path) -> None:
    """BLAST+ numbers the volumes under an alias by their base names sorted as strings, across the
    databases it lists: `m.00`, then another database's `m.005`, then `m.01`."""
    from paramedic.db.blastdb import open_blastdb

    order = [Path(v.path).name for v in open_blastdb("inter", site / "dbs", "prot").volumes]
    assert order[:3] == ["m.00", "m.005", "m.01"], order
    for strategy in ("fragments", "queries"):
        _compare(site, tmp_path, "inter", "--strategy", strategy)


def test_metadata_from_a_database_in_place_regenerates_at_a_site_whose_replica_lies_elsewhere(
    site: Path, tmp_path: Path
) -> None:
    """ParaMEDIC on databases users hold: the compute site ships metadata (ordinal ids) of a search of its
    database in place, with and without -parse_seqids; the storage site's replica is a copy at another
    path, searched in place too, and regenerates BLAST+'s bytes."""
    import shutil

    from tests.support.site import StorageSite

    paramedic("keys", "--out", str(tmp_path / "keys"), "--server", "localhost", "--client", "compute-a")
    for name in ("v5-seqids-several", "v4-several"):
        replica = tmp_path / "replica" / name
        shutil.copytree(site / "dbs" / name, replica)
        root = tmp_path / f"root-{name}"
        root.mkdir()
        server = StorageSite(replica / "db", root, tmp_path / "keys" / "server", tmp_path / f"{name}.log")
        server.start()
        try:
            common = ["-query", str(site / "q.fasta"), "-db", f"{name}/db", "-evalue", "1e-3", "-outfmt", "0"]
            blast("blastp", *common, "-out", str(tmp_path / "ref.txt"), cwd=site / "dbs")
            proc = paramedic(
                "search", "blastp", *common, "-out", "hits.txt", "--site", server.url,
                "--keys", str(tmp_path / "keys" / "compute-a"), "--ship", "metadata",
                "--record", str(tmp_path / f"{name}.run.json"), cwd=site / "dbs",
            )  # fmt: skip
            assert "shipped (metadata)" in proc.stderr, proc.stderr
            assert (root / "hits.txt").read_bytes() == (tmp_path / "ref.txt").read_bytes()
        finally:
            server.stop()


def test_ids_in_more_than_100_volumes_are_never_looked_up(site: Path, tmp_path: Path) -> None:
    """makeblastdb writes `db.99` before `db.100`; BLAST+ reads `db.100` before `db.11`, so its own id
    lookups go wrong there (2 of 4 ids found, one of them wrongly, measured). Searches that need no id
    are exact (auto: whole-database searches; traceback once); those that would look ids up are refused."""
    # (BLAST+ itself crashes printing sseqid of such a database: the pairwise report)
    _compare(site, tmp_path, "seqids-over-100/db", outfmt="0")  # auto
    _compare(
        site, tmp_path, "seqids-over-100/db", "--strategy", "fragments", "--traceback", "once", outfmt="0"
    )
    ids = tmp_path / "ids.txt"
    ids.write_text("A0A0D3AM21\n")
    for extra in (["--strategy", "fragments"], ["-seqidlist", str(ids)]):
        proc = paramedic(
            "search", "blastp", "-query", str(site / "q.fasta"), "-db", "seqids-over-100/db",
            "-out", str(tmp_path / "o.tsv"), *extra, cwd=site / "dbs", check=False,
        )  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "past 99" in proc.stderr, proc.stderr
        assert not (tmp_path / "o.tsv").exists()


@pytest.mark.parametrize(
    "db, says",
    [
        ("nowhere/db", "not found"),
        ("v5-one", "not found"),  # a directory
    ],
)
def test_a_database_that_is_not_there_is_one_line(site: Path, tmp_path: Path, db: str, says: str) -> None:
    proc = paramedic(
        "search", "blastp", "-query", str(site / "q.fasta"), "-db", db, "-out", str(tmp_path / "o.tsv"),
        cwd=site / "dbs", check=False,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())


def test_a_torn_database_and_a_restricting_alias_are_refused(
    site: Path, tmp_path: Path, data_dir: Path
) -> None:
    """Volumes of two makeblastdb runs (an update half done) and an alias with an OIDLIST: refused, one line."""
    fasta = take_fasta(data_dir / "mmseqs2" / "DB.fasta", tmp_path / "p.fasta", 2400)
    first, second = tmp_path / "one", tmp_path / "two"
    _makeblastdb(fasta, first / "db", "prot", "-max_file_sz", "400KB")
    _makeblastdb(fasta, second / "db", "prot", "-max_file_sz", "400KB")
    pin = second / "db.01.pin"  # its build date made another (same length): an update of another day
    date = read_header(pin).date.encode()
    data = pin.read_bytes()
    assert data.count(date) == 1
    pin.write_bytes(data.replace(date, date.replace(b"20", b"19", 1)))
    for suffix in ("pin", "phr", "psq"):
        (first / f"db.01.{suffix}").write_bytes((second / f"db.01.{suffix}").read_bytes())
    proc = paramedic(
        "search", "blastp", "-query", str(site / "q.fasta"), "-db", str(first / "db"),
        "-out", str(tmp_path / "o.tsv"), check=False,
    )  # fmt: skip
    assert proc.returncode == 4 and "builds" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    (tmp_path / "mask.msk").write_bytes(b"\0\0\0\1\x80")
    (tmp_path / "sub.pal").write_text(f"DBLIST {second / 'db'}\nOIDLIST {tmp_path / 'mask.msk'}\n")
    proc = paramedic(
        "search", "blastp", "-query", str(site / "q.fasta"), "-db", str(tmp_path / "sub"),
        "-out", str(tmp_path / "o.tsv"), check=False,
    )  # fmt: skip
    assert proc.returncode == 4 and "OIDLIST" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "o.tsv").exists()


@pytest.fixture(scope="module")
def genomes(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Path]:
    """H. pylori's contigs and reference genomes as read-only nucleotide databases of several volumes,
    and DNA queries cut from them (reverse complemented every other one)."""
    from tests.integration.equality import cut_dna_queries, read_gz_fasta

    base = tmp_path_factory.mktemp("inplace-dna")
    sources = sorted((data_dir / "ragout" / "H.Pylori").rglob("*.fasta.gz"))
    records = [r for path in sources for r in read_gz_fasta(path)]
    fasta = base / "genomes.fasta"
    fasta.write_text("".join(f">{h}\n{s}\n" for h, s in records))
    cut_dna_queries([r for r in records if len(r[1]) > 10_000], 6, seed=42, out=base / "q.fasta")
    dbs = base / "dbs"
    for name, extra in {"plain": [], "seqids": ["-parse_seqids"]}.items():
        _makeblastdb(fasta, dbs / name / "dna", "nucl", "-max_file_sz", "300KB", *extra)
        assert len(list((dbs / name).glob("*.nin"))) >= 3
    _read_only(dbs)
    yield base
    _writable(dbs)


@pytest.mark.parametrize("name", ["plain", "seqids"])
@pytest.mark.parametrize("strategy", ["fragments", "queries"])
def test_blastn_on_a_nucleotide_database_in_place(
    genomes: Path, tmp_path: Path, name: str, strategy: str
) -> None:
    engine = ["--strategy", strategy] + (
        ["--traceback", "once"] if strategy == "fragments" and name == "seqids" else []
    )
    _compare(genomes, tmp_path, f"{name}/dna", *engine, program="blastn", evalue="1e-10")


def test_a_database_changed_between_two_runs_of_a_resume_is_refused(
    site: Path, tmp_path: Path, data_dir: Path
) -> None:
    """A killed search continues from its journal only on the very database it began with: a volume
    rewritten in place (same size, times put back) is another database (its digest), so the journal is
    refused; unchanged, the same command continues and equals BLAST+."""
    from tests.integration.test_resume import ENGINE, kill_every_rank_when, records, searches_done

    db = tmp_path / "db"
    _makeblastdb(site / "proteins.fasta", db / "p", "prot", "-max_file_sz", "400KB")
    queries = take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", tmp_path / "q.fasta", 60)
    out, journal = tmp_path / "hits.txt", tmp_path / ".hits.txt.journal"
    command = ["search", "blastp", "-query", str(queries), "-db", str(db / "p"), "-out", str(out), *ENGINE]
    blast(
        "blastp",
        "-query",
        str(queries),
        "-db",
        str(db / "p"),
        "-out",
        str(tmp_path / "ref.txt"),
        cwd=tmp_path,
    )

    kill_every_rank_when(command, tmp_path, journal, searches_done(2))
    volume = db / "p.01.psq"
    info = volume.stat()
    original = volume.read_bytes()
    volume.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
    os.utime(volume, ns=(info.st_atime_ns, info.st_mtime_ns))
    proc = paramedic(*command, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "(different database)" in proc.stderr, proc.stderr
    assert records(journal, "search") and not out.exists()

    volume.write_bytes(original)
    paramedic(*command, cwd=tmp_path)
    assert out.read_bytes() == (tmp_path / "ref.txt").read_bytes()


def test_fasta_that_parse_seqids_refuses_is_said_and_searched_in_place(
    tmp_path: Path, data_dir: Path
) -> None:
    """Galaxy's `ENA|...` headers and local ids over 50 characters: makeblastdb -parse_seqids refuses them
    (`paramedic format` keeps ids): one line of makeblastdb's own reason, exit 3, nothing left; the
    database makeblastdb makes of them by default is searched in place, byte for byte as blastn."""
    from tests.integration.equality import read_gz_fasta

    (genome,) = read_gz_fasta(data_dir / "ragout" / "H.Pylori" / "references" / "SJM180.fasta.gz")[:1]
    fasta = tmp_path / "galaxy.fasta"
    pieces = [genome[1][i : i + 40_000] for i in range(0, 400_000, 40_000)]
    headers = [f"ENA|MN90894{i}|MN90894{i}.3 piece {i}" for i in range(5)]
    headers += [f"a_local_identifier_longer_than_fifty_characters_number_{i} piece" for i in range(5)]
    fasta.write_text("".join(f">{h}\n{p}\n" for h, p in zip(headers, pieces, strict=True)))
    for kept in (0, 5):  # ENA ids, then the long ids alone
        part = tmp_path / f"part{kept}.fasta"
        part.write_text(
            "".join(f">{h}\n{p}\n" for h, p in list(zip(headers, pieces, strict=True))[kept : kept + 5])
        )
        proc = paramedic(
            "format", "--in", str(part), "--dbtype", "nucl", "--fragments", "2", "--out",
            str(tmp_path / "fmt" / f"db{kept}"), check=False,
        )  # fmt: skip
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 3 and lines[-1].startswith("paramedic: error: makeblastdb -parse_seqids"), (
            lines
        )
        assert "C++" not in proc.stderr and "ncbidiag" not in proc.stderr
        assert not (tmp_path / "fmt").exists() or not any((tmp_path / "fmt").iterdir())
    _makeblastdb(fasta, tmp_path / "mk" / "db", "nucl")
    (tmp_path / "q.fasta").write_text(f">q1\n{pieces[2][1000:2500]}\n>q2\n{pieces[7][500:1800]}\n")
    common = ["-query", str(tmp_path / "q.fasta"), "-db", "mk/db", "-outfmt", "6 std stitle"]
    blast("blastn", *common, "-out", str(tmp_path / "ref.tsv"), cwd=tmp_path)
    paramedic(
        "search",
        "blastn",
        *common,
        "-out",
        str(tmp_path / "out.tsv"),
        "--strategy",
        "fragments",
        cwd=tmp_path,
    )
    reference = (tmp_path / "ref.tsv").read_text()
    assert "ENA|" in reference and "longer_than_fifty" in reference
    assert (tmp_path / "out.tsv").read_text() == reference


def test_a_replica_in_place_rewritten_while_serve_runs_regenerates_nothing(
    site: Path, tmp_path: Path
) -> None:
    """The storage site's replica searched in place is checked by its digests before every job (remembered
    while its files keep their stamps): a volume rewritten in place with its times put back is another
    database, and the job is refused rather than regenerated from it."""
    import shutil

    from tests.support.site import StorageSite

    paramedic("keys", "--out", str(tmp_path / "keys"), "--server", "localhost", "--client", "compute-a")
    replica = tmp_path / "replica"
    shutil.copytree(site / "dbs" / "v4-several", replica)
    root = tmp_path / "root"
    root.mkdir()
    server = StorageSite(replica / "db", root, tmp_path / "keys" / "server", tmp_path / "serve.log")
    server.start()
    try:
        common = ["-query", str(site / "q.fasta"), "-db", "v4-several/db", "-evalue", "1e-3", "-outfmt", "6"]
        ship = ["--site", server.url, "--keys", str(tmp_path / "keys" / "compute-a"), "--ship", "metadata"]
        for n in (1, 2):
            record = ["--record", str(tmp_path / f"{n}.run.json")]
            if n == 2:
                volume = replica / "db.01.psq"
                info = volume.stat()
                data = volume.read_bytes()
                volume.write_bytes(data[:50] + bytes([data[50] ^ 1]) + data[51:])
                os.utime(volume, ns=(info.st_atime_ns, info.st_mtime_ns))
            proc = paramedic(
                "search",
                "blastp",
                *common,
                "-out",
                f"hits{n}.tsv",
                *ship,
                *record,
                cwd=site / "dbs",
                check=False,
            )
            if n == 1:
                assert proc.returncode == 0 and (root / "hits1.tsv").exists(), proc.stderr
            else:
                assert proc.returncode == 8 and "replica" in proc.stderr, proc.stderr
                assert not (root / "hits2.tsv").exists()
    finally:
        server.stop()


def test_a_database_found_through_blastdb(site: Path, tmp_path: Path) -> None:
    """-db looked up as BLAST+ does: not in the current directory, then in BLASTDB."""
    common = [
        "-query",
        str(site / "q.fasta"),
        "-db",
        "v5-seqids-several/db",
        "-evalue",
        "1e-3",
        "-outfmt",
        "6",
    ]
    env = {"BLASTDB": str(site / "dbs")}
    subprocess.run(
        ["blastp", *common, "-out", "ref.tsv"], cwd=tmp_path, env={**os.environ, **env}, check=True
    )
    paramedic(
        "search", "blastp", *common, "-out", "out.tsv", "--strategy", "fragments", cwd=tmp_path, env=env
    )
    assert (tmp_path / "out.tsv").read_bytes() == (tmp_path / "ref.tsv").read_bytes()
    assert (tmp_path / "ref.tsv").stat().st_size > 0


@pytest.mark.parametrize("program", ["blastx", "tblastn", "tblastx"])
@pytest.mark.parametrize("strategy", ["fragments", "queries"])
def test_every_program_on_databases_in_place(
    site: Path, genomes: Path, tmp_path: Path, program: str, strategy: str
) -> None:
    """The translated programs on databases with ids in several volumes (per fragment: ids looked up)."""
    query = {"blastx": genomes, "tblastn": site, "tblastx": genomes}[program] / "q.fasta"
    db = (
        site / "dbs" / "v5-seqids-several" / "db"
        if program == "blastx"
        else genomes / "dbs" / "seqids" / "dna"
    )
    evalue = "10" if program == "blastx" else "1e-3"  # the genomes' pieces hit few of 2,400 proteins
    common = ["-query", str(query), "-db", str(db), "-evalue", evalue, "-outfmt", "6 std sseqid"]
    blast(program, *common, "-out", str(tmp_path / "ref.tsv"), cwd=tmp_path)
    proc = paramedic("search", program, *common, "-out", str(tmp_path / "out.tsv"), "--strategy", strategy)
    assert (tmp_path / "out.tsv").read_bytes() == (tmp_path / "ref.tsv").read_bytes(), proc.stderr
    assert (tmp_path / "ref.tsv").read_text().count("\n") >= 5
