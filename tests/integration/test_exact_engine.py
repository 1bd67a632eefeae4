"""The database-segmented engine (`--strategy fragments`) on data and options built to break it.

- Saturation: the 20,000 mmseqs2 proteins plus three copies with 15% random substitutions (80,000
  proteins, seeded), so that queries have more candidates than BLAST+'s preliminary list keeps (1,050).
  Each fragment keeps its own list, so merging fragments' hits alone gives hits BLAST+ never reports.
  The test checks with the shim on the unsplit database that its queries still fill the list.
- -culling_limit is refused by the engine up front (exit 2, one line, no output); `auto` honours it
  exactly by query segmentation.
- A -db path with `..` keeps regeneration's alias files inside its own directory.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
from pathlib import Path

import pytest

from paramedic.blast.prelim import shim
from tests.conftest import blast, paramedic, take_fasta

pytestmark = pytest.mark.integration

AMINO = "ACDEFGHIKLMNPQRSTVWY"
# mmseqs2 queries (0-based) whose candidates fill BLAST+'s preliminary list against the mutated database
# and whose answer the fragments' hits alone got wrong with 8 fragments (found with the engine before it
# read the preliminary list: 3 of the first 99 queries), and three that do not.
QUERIES = (6, 57, 71, 0, 1, 2)
FRAGMENTS = 8


def mutated_database(source: Path, out: Path, copies: int = 3, rate: float = 0.15, seed: int = 11) -> None:
    rng = random.Random(seed)
    records = source.read_text().split("\n>")
    records[0] = records[0].lstrip(">")
    parsed = []
    for record in records:
        header, _, body = record.partition("\n")
        parsed.append((header, body.replace("\n", "")))
    with open(out, "w") as fh:
        for header, seq in parsed:
            fh.write(f">{header}\n{seq}\n")
        for c in range(copies):
            for i, (_, seq) in enumerate(parsed):
                copy = "".join(rng.choice(AMINO) if rng.random() < rate else x for x in seq)
                fh.write(f">copy{c}_{i}\n{copy}\n")


def prelim_sizes(root: Path, *args: str) -> list[tuple[int, int]]:
    """(entries, limit) per query of a plain BLAST+ run on the unsplit database, read by the shim."""
    library = shim()
    assert library is not None, "the preliminary-list shim needs a C compiler"
    dump = root / "paramedic-prelim.bin"
    dump.unlink(missing_ok=True)
    env = {**os.environ, "LD_PRELOAD": str(library), "PARAMEDIC_PRELIM": "1"}

    subprocess.run(["blastp", *args, "-out", os.devnull], cwd=root, env=env, check=True, capture_output=True)
    data, at, sizes = dump.read_bytes(), 0, []
    dump.unlink()
    while at < len(data):
        _, _, lists = struct.unpack_from("=Iii", data, at)
        at += 12
        for _ in range(lists):
            _, limit, count = struct.unpack_from("=iii", data, at)
            at += 12 + 16 * count
            sizes.append((count, limit))
    return sizes


@pytest.fixture(scope="module")
def saturated(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("saturated")
    mutated_database(data_dir / "mmseqs2" / "DB.fasta", root / "db.fasta")
    records = (data_dir / "mmseqs2" / "QUERY.fasta").read_text().split("\n>")
    chosen = [records[i].lstrip(">").rstrip("\n") for i in QUERIES]
    (root / "queries.fasta").write_text("".join(f">{r}\n" for r in chosen))
    (root / "ref").mkdir()
    blast("makeblastdb", "-in", str(root / "db.fasta"), "-dbtype", "prot", "-out", "sat", cwd=root / "ref")
    paramedic(
        "format", "--in", str(root / "db.fasta"), "--dbtype", "prot", "--fragments", str(FRAGMENTS),
        "--out", str(root / "p" / "sat"), "--quiet",
    )  # fmt: skip
    return root


def test_the_data_fills_blasts_preliminary_list(saturated: Path) -> None:
    sizes = prelim_sizes(saturated / "ref", "-query", "../queries.fasta", "-db", "sat")
    assert sum(1 for count, limit in sizes if count == limit) >= 2, "queries no longer fill the list"


@pytest.mark.parametrize("options", [[], ["-max_target_seqs", "5"]], ids=["default", "mts5"])
def test_fragments_equal_blast_when_the_preliminary_list_saturates(
    saturated: Path, options: list[str]
) -> None:
    fmt = "6 qseqid sseqid evalue bitscore score pident qstart qend sstart send"
    expected = saturated / f"ref-{len(options)}.tsv"
    blast(
        "blastp", "-query", "../queries.fasta", "-db", "sat", "-outfmt", fmt, *options, "-out", str(expected),
        cwd=saturated / "ref",
    )  # fmt: skip
    out = saturated / f"p-{len(options)}.tsv"
    paramedic(
        "search", "blastp", "-query", "../queries.fasta", "-db", "sat", "-outfmt", fmt, *options,
        "-out", str(out), "--np", "2", "--strategy", "fragments", "--quiet", cwd=saturated / "p",
    )  # fmt: skip
    assert out.read_bytes() == expected.read_bytes()


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
