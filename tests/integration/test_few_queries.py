"""Few queries against a database many times their preliminary lists: the job database segmentation
exists for (issue 21). Of the engine's plans the defaults must choose the fragments strategy (on one
node auto runs one BLAST+ instead: issue 44), with the traceback done once, say why in the run record,
and write BLAST+'s bytes; `--traceback per-fragment` (the other path, by
name) too. Real BLAST+, real ranks (`--np 2`), 80,000 real and mutated proteins in 4 fragments.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance import datasets
from tests.conftest import blast, paramedic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def proteins(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conformance matrix's saturating set (80,000 proteins in families of four) in 4 fragments, and
    one query that fills BLAST+'s preliminary list on it: 1 x 1,050 subjects are 1.3% of the database."""
    data = datasets.saturating(data_dir, tmp_path_factory.mktemp("few"), (4,))
    one = data.root / "one.fasta"
    one.write_text("".join(data.queries["prot"].read_text().split("\n>", 1)[0].strip() + "\n"))
    return data.root


def search(root: Path, out: Path, *engine: str, outfmt: str = "6", env: dict[str, str] | None = None) -> dict:
    paramedic(
        "search", "blastp", "-query", str(root / "one.fasta"), "-db", "saturating", "-outfmt",
        outfmt, "-out", str(out), "--np", "2", "--quiet", *engine, cwd=root / "p4", env=env,
    )  # fmt: skip
    return json.loads(out.with_name(out.name + ".run.json").read_text())


def reference(root: Path) -> Path:
    expected = root / "ref.6"
    if not expected.exists():
        blast(
            "blastp", "-query", "../one.fasta", "-db", "saturating", "-outfmt", "6", "-out", str(expected),
            cwd=root / "ref",
        )  # fmt: skip
    return expected


def given(record: dict) -> int:
    """BLAST+ batches of pieces that aligned the fragment searches' lists as given, without a scan."""
    return sum(r["tasks"]["injected"] for r in record["ranks_stats"])


@pytest.mark.parametrize("outfmt", ["6", "7"])
def test_defaults_choose_fragments_and_one_traceback(proteins: Path, outfmt: str) -> None:
    expected, out = proteins / f"ref.{outfmt}", proteins / f"auto.{outfmt}"
    blast(
        "blastp", "-query", "../one.fasta", "-db", "saturating", "-outfmt", outfmt, "-out", str(expected),
        cwd=proteins / "ref",
    )  # fmt: skip
    record = search(proteins, out, outfmt=outfmt)
    assert out.read_bytes() == expected.read_bytes()
    # of the engine's plans auto's rule would take fragments (both are candidates: the database fits each
    # worker); on one node one BLAST+ run is predicted cheaper (issue 44)
    assert record["strategy"] == "blast"
    reason = record["strategy_reason"]["reason"]
    assert "query segmentation would make 1 task for 2 workers" in reason and "2.00x" in reason
    assert {p["plan"] for p in record["strategy_reason"]["plans"] if p["candidate"]} == {
        "blast",
        "queries",
        "fragments",
    }
    out.unlink()
    record = search(proteins, out, "--strategy", "fragments", outfmt=outfmt)  # its traceback's default
    assert out.read_bytes() == expected.read_bytes()
    assert record["strategy"] == "fragments" and record["traceback"] == "once"
    assert (
        "1 query x 1,050 subjects) are 1.3% of the database's 80,000 sequences" in record["traceback_reason"]
    )
    # every fragment search stopped after the preliminary stage: the one report piece aligned it all
    searches = [c for r in record["ranks_stats"] for c in r["task_costs"] if c[0] == "search"]
    assert len(searches) == (record["fragment_groups"] or record["fragments"]) and record["pieces"] == 1
    # a small database: a BLAST+ start is over 5% of a search, so one search per worker thread
    assert record["fragment_groups"] == 2


def test_the_data_fills_the_preliminary_list(proteins: Path) -> None:
    """The query exists for the case where the whole database's list is the top N of the fragments':
    more than N candidates over the fragments (else this file tests nothing the plain merge does not)."""
    record = search(proteins, proteins / "filled.tsv", "--strategy", "fragments")
    assert record["metadata_pairs"] == 1050  # the whole list, N for blastp with composition statistics


def test_per_fragment_traceback_by_name_is_exact_too(proteins: Path) -> None:
    expected, out = reference(proteins), proteins / "per-fragment.6"
    record = search(proteins, out, "--strategy", "fragments", "--traceback", "per-fragment")
    assert out.read_bytes() == expected.read_bytes()
    assert record["traceback"] == "per-fragment"
    assert record["traceback_reason"] == "--traceback per-fragment was asked"


def test_traceback_with_query_segmentation_is_refused(proteins: Path) -> None:
    out = proteins / "refused.6"
    proc = paramedic(
        "search", "blastp", "-query", str(proteins / "one.fasta"), "-db", "saturating", "-out", str(out),
        "--strategy", "queries", "--traceback", "once", cwd=proteins / "p4", check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--traceback once" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("engine", [("--no-journal",), ("--runner", "mpi")], ids=["threads", "ranks"])
def test_the_piece_aligns_the_searches_lists_without_scanning(
    proteins: Path, engine: tuple[str, ...]
) -> None:
    """Traceback once: the one piece aligns the whole database's list handed back to BLAST+ (no scan for
    it), without a journal (the job's own store) and on MPI ranks; scanning for it writes the same bytes."""
    expected, out = reference(proteins), proteins / f"given-{engine[-1]}.6"
    record = search(proteins, out, "--strategy", "fragments", "--traceback", "once", *engine)
    assert out.read_bytes() == expected.read_bytes()
    assert given(record) == 1 and record["pieces"] == 1
    scanned = search(
        proteins, out, "--strategy", "fragments", "--traceback", "once", *engine,
        env={"PARAMEDIC_PIECE_LISTS": "scan"},
    )  # fmt: skip
    assert out.read_bytes() == expected.read_bytes() and given(scanned) == 0
