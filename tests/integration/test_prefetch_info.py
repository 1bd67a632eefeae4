"""`blastdbcmd -info` started ahead of the job's checks (issue 44: a short search's own start): what the
checks then read is what they would have asked BLAST+ themselves, a -db BLAST+ does not find, or finds as
the other molecule type, is the same one-line error, a run nobody read is stopped and reaped, and the
search on the blast plan writes BLAST+'s bytes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from paramedic.db import blastdb
from paramedic.errors import DatabaseError, UsageError
from tests.conftest import blast, paramedic, take_fasta

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("prefetch")
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", base / "db.fasta", 600)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", base / "q.fasta", 3)
    subprocess.run(
        ["makeblastdb", "-in", "db.fasta", "-dbtype", "prot", "-out", "prot", "-max_file_sz", "100KB"],
        cwd=base,
        check=True,
        capture_output=True,
    )
    yield base
    blastdb.drop_prefetched()


def test_the_prefetched_answer_is_blasts_own(work: Path) -> None:
    plain = blastdb.open_blastdb("prot", work, "prot")
    assert len(plain.volumes) > 1  # volumes listed by -info, then read from their headers
    assert blastdb.prefetch_info("prot", work, "prot")
    assert blastdb.prefetch_info("prot", work, "prot")  # asked twice: still one run
    assert len(blastdb._PREFETCHED) == 1
    assert blastdb.open_blastdb("prot", work, "prot") == plain
    assert not blastdb._PREFETCHED  # read once, then gone: the next open asks BLAST+ again


def test_errors_after_a_prefetch_are_the_same(work: Path) -> None:
    for arg, dbtype, error in (("missing", "prot", DatabaseError), ("prot", "nucl", UsageError)):
        with pytest.raises(error) as plain:
            blastdb.open_blastdb(arg, work, dbtype)
        assert blastdb.prefetch_info(arg, work, dbtype)
        with pytest.raises(error) as fetched:
            blastdb.open_blastdb(arg, work, dbtype)
        assert str(fetched.value) == str(plain.value)
        assert not blastdb._PREFETCHED


def test_an_unread_prefetch_is_stopped_and_reaped(work: Path) -> None:
    assert blastdb.prefetch_info("prot", work, "prot")
    started = next(iter(blastdb._PREFETCHED.values()))
    blastdb.drop_prefetched()
    assert not blastdb._PREFETCHED and started.returncode is not None


def test_a_search_refused_before_its_db_is_resolved_says_the_same(work: Path, tmp_path: Path) -> None:
    proc = paramedic(
        "search", "blastp", "-query", str(tmp_path / "none.fasta"), "-db", "prot", "-out", str(tmp_path / "o"),
        cwd=work, check=False,
    )  # fmt: skip
    assert (
        proc.returncode == 3 and proc.stderr == f"paramedic: error: {tmp_path / 'none.fasta'}: no such file\n"
    )
    proc = paramedic(
        "search",
        "blastp",
        "-query",
        "q.fasta",
        "-db",
        "nothere",
        "-out",
        str(tmp_path / "o"),
        cwd=work,
        check=False,
    )
    assert proc.returncode == 4 and "database 'nothere' not found" in proc.stderr


def test_the_search_on_the_blast_plan_is_blasts_bytes(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.tsv"
    paramedic(
        "search",
        "blastp",
        "-query",
        "q.fasta",
        "-db",
        "prot",
        "-outfmt",
        "6",
        "-out",
        str(out),
        "--quiet",
        cwd=work,
    )
    blast("blastp", "-query", "q.fasta", "-db", "prot", "-outfmt", "6", "-num_threads", "2", "-out", str(tmp_path / "b.tsv"), cwd=work)  # fmt: skip
    assert out.read_bytes() == (tmp_path / "b.tsv").read_bytes()
