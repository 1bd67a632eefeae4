"""Bad input: one clear line, a documented exit code, and no output file (real CLI, real BLAST+, MPI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import BIN, paramedic
from tests.support.databases import Databases

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def small(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("errors")
    databases.place(root, 400, fragments=2, out="dbs/small")
    databases.queries(root / "q.fasta", 3)
    return root


def assert_fails(proc, code: int, message: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert any(message in line for line in lines), proc.stderr
    assert "Traceback" not in proc.stderr


def search(root: Path, *args: str):
    return paramedic("search", *args, "--np", "2", cwd=root, check=False)


def test_missing_database(small: Path) -> None:
    proc = search(small, "blastp", "-query", "q.fasta", "-db", "dbs/nope", "-out", "o.txt")
    assert_fails(proc, 4, "not found")
    assert not (small / "o.txt").exists()


def test_protein_query_for_blastn(small: Path) -> None:
    proc = search(small, "blastn", "-query", "q.fasta", "-db", "dbs/small", "-out", "o.txt")
    assert_fails(proc, 3, "looks like protein")
    assert not (small / "o.txt").exists()


def test_nucleotide_program_on_protein_database(small: Path, tmp_path: Path) -> None:
    (tmp_path / "n.fa").write_text(">n1\nACGTACGGTACGATCGATCGTAGCTAGCTAGCTAGCATCGATCG\n")
    proc = search(small, "blastn", "-query", str(tmp_path / "n.fa"), "-db", "dbs/small", "-out", "o.txt")
    assert_fails(proc, 2, "nucleotide database")


@pytest.mark.parametrize("text,message", [("", "empty FASTA"), ("junk\n>a\nMKV\n", "not FASTA")])
def test_malformed_or_empty_query(small: Path, tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.fa").write_text(text)
    proc = search(small, "blastp", "-query", str(tmp_path / "bad.fa"), "-db", "dbs/small", "-out", "o.txt")
    assert_fails(proc, 3, message)


def test_unknown_blast_option(small: Path) -> None:
    proc = search(small, "blastp", "-query", "q.fasta", "-db", "dbs/small", "-evalu", "1")
    assert_fails(proc, 2, "unknown blastp option -evalu")


def test_unwritable_output(small: Path) -> None:
    proc = search(small, "blastp", "-query", "q.fasta", "-db", "dbs/small", "-out", "no/such/dir/o.txt")
    assert_fails(proc, 6, "does not exist")


def test_blast_not_installed(small: Path) -> None:
    env = dict(os.environ, PATH=str(BIN))  # the venv only: no BLAST+ programs
    import subprocess

    proc = subprocess.run(
        [str(BIN / "paramedic"), "search", "blastp", "-query", "q.fasta", "-db", "dbs/small", "-out", "o.txt"],
        cwd=small, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert_fails(proc, 5, "blastp not found")
    assert not (small / "o.txt").exists()


def test_duplicate_ids_in_format_input_leave_nothing(small: Path, tmp_path: Path) -> None:
    (tmp_path / "dup.fa").write_text(">a\nMKVLA\n>b\nMKKLL\n>a\nMMMMK\n")
    proc = paramedic(
        "format",
        "--in",
        "dup.fa",
        "--dbtype",
        "prot",
        "--fragments",
        "2",
        "--out",
        "out/db",
        cwd=tmp_path,
        check=False,
    )
    assert_fails(proc, 3, "makeblastdb refused the input: Error: Duplicate seq_ids are found: LCL|A")
    assert not (tmp_path / "out" / "db").exists() and not (tmp_path / "out" / "db.pal").exists()
    assert list((tmp_path / "out").iterdir()) == []  # no half-built directory left behind


def test_corrupt_database_fails_whole_job_without_hanging(small: Path, tmp_path: Path) -> None:
    paramedic(
        "format",
        "--in",
        str(small / "db.fasta"),
        "--dbtype",
        "prot",
        "--fragments",
        "2",
        "--out",
        "c/db",
        "--layout",
        "fragments",
        cwd=tmp_path,
    )
    (tmp_path / "c" / "db" / "f001.psq").write_bytes(b"garbage")  # a worker's BLAST+ run will fail
    proc = paramedic(
        "search", "blastp", "-query", str(small / "q.fasta"), "-db", "c/db", "-out", "o.txt", "--np", "2",
        "--strategy", "fragments",
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "paramedic: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.txt")]
