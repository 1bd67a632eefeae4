"""The database-segmented engine (`--strategy fragments`) on options built to break it. Saturation of
BLAST+'s preliminary list is tested by the conformance slice (tests/integration/test_conformance.py),
on data it checks still saturates.

- -culling_limit is refused by the engine up front (exit 2, one line, no output); `auto` honours it
  exactly by query segmentation.
- A -db path with `..` keeps regeneration's alias files inside its own directory.
- tblastx's answer for a query depends on the other queries of its BLAST+ batch: the engine's search
  batches start where BLAST+'s do, even with --batch 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import blast, paramedic, take_fasta
from tests.integration.equality import cut_dna_queries, write_ragout_genomes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def small(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small")
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", root / "db.fasta", 3000)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", root / "queries.fasta", 20)
    (root / "ref").mkdir()
    (root / "work").mkdir()
    blast(
        "makeblastdb", "-in", str(root / "db.fasta"), "-dbtype", "prot", "-parse_seqids", "-out", "small",
        cwd=root / "ref",
    )  # fmt: skip
    paramedic(
        "format", "--in", str(root / "db.fasta"), "--dbtype", "prot", "--fragments", "4",
        "--out", str(root / "p4" / "small"), "--quiet",
    )  # fmt: skip
    return root


def test_culling_limit_is_refused_by_the_engine_up_front(small: Path) -> None:
    out = small / "culled.tsv"
    proc = paramedic(
        "search", "blastp", "-query", "../queries.fasta", "-db", "small", "-culling_limit", "1",
        "-outfmt", "6", "-out", str(out), "--strategy", "fragments", cwd=small / "p4", check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "-culling_limit" in proc.stderr
    assert not out.exists()


def test_culling_limit_is_exact_with_the_default_strategy(small: Path) -> None:
    expected, out = small / "culled-ref.tsv", small / "culled-auto.tsv"
    args = ["-query", "../queries.fasta", "-db", "small", "-culling_limit", "1", "-outfmt", "6"]
    blast("blastp", *args, "-out", str(expected), cwd=small / "ref")
    paramedic("search", "blastp", *args, "-out", str(out), "--np", "2", "--quiet", cwd=small / "p4")
    assert out.read_bytes() == expected.read_bytes()


def test_a_db_path_with_dotdot_writes_nothing_outside_the_run(small: Path) -> None:
    """Regeneration places an alias named by the user's -db string; `../p4/small` must not escape."""
    before = sorted(p.name for p in (small / "p4").iterdir())
    expected, out = small / "dotdot-ref.out", small / "dotdot.out"
    blast(
        "blastp",
        "-query",
        "../queries.fasta",
        "-db",
        "small",
        "-outfmt",
        "7",
        "-out",
        str(expected),
        cwd=small / "ref",
    )
    paramedic(
        "search", "blastp", "-query", "../queries.fasta", "-db", "../p4/small", "-outfmt", "7",
        "-out", str(out), "--np", "2", "--strategy", "fragments", "--quiet",
        cwd=small / "work",
    )  # fmt: skip
    assert sorted(p.name for p in (small / "p4").iterdir()) == before
    assert out.read_bytes().replace(b"../p4/small", b"small") == expected.read_bytes()


# tblastx: the 9th of these genome pieces (cut_dna_queries(genomes, 30, seed 7)) finds a subject
# (NODE_186, e-value 3.9) when BLAST+ searches it in one query batch with the 10th, and not when it is
# searched alone. The engine once searched it alone (a search batch of one query) and lost that subject.
# (The batch of the first 12 shows it too, at 4x the cost; the first 9 do not: the test checks the case.)
BATCH_QUERY = 8  # 0-based index of that query


@pytest.fixture(scope="module")
def batched(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tblastx-batch")
    records = write_ragout_genomes(data_dir, root / "genomes.fasta")
    cut_dna_queries([r for r in records if len(r[1]) > 1_000_000], 30, 7, root / "all.fasta")
    take_fasta(root / "all.fasta", root / "queries.fasta", 2, start=BATCH_QUERY)
    take_fasta(root / "all.fasta", root / "alone.fasta", 1, start=BATCH_QUERY)
    (root / "ref").mkdir()
    blast(
        "makeblastdb", "-in", "../genomes.fasta", "-dbtype", "nucl", "-parse_seqids", "-out", "genomes",
        cwd=root / "ref",
    )  # fmt: skip
    paramedic(
        "format", "--in", str(root / "genomes.fasta"), "--dbtype", "nucl", "--fragments", "8",
        "--out", str(root / "p8" / "genomes"), "--quiet",
    )  # fmt: skip
    return root


def test_tblastx_answers_depend_on_the_query_batch_and_the_engine_keeps_blasts_batches(batched: Path) -> None:
    in_batch, alone, out = batched / "batch.tsv", batched / "alone.tsv", batched / "engine.tsv"
    args = ["-db", "genomes", "-outfmt", "6"]
    blast("tblastx", "-query", "../queries.fasta", *args, "-out", str(in_batch), cwd=batched / "ref")
    blast("tblastx", "-query", "../alone.fasta", *args, "-out", str(alone), cwd=batched / "ref")
    name = (batched / "alone.fasta").read_text().split()[0][1:]
    with_batch = [ln for ln in in_batch.read_text().splitlines() if ln.split("\t")[0] == name]
    assert sorted(with_batch) != sorted(alone.read_text().splitlines()), "the data no longer shows the case"
    paramedic(
        "search", "tblastx", "-query", "../queries.fasta", *args, "-out", str(out), "--batch", "1",
        "--np", "2", "--strategy", "fragments", "--quiet", cwd=batched / "p8",
    )  # fmt: skip
    assert out.read_bytes() == in_batch.read_bytes()
