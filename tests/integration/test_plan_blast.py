"""The blast plan (issue 44): on one node `--strategy auto` runs BLAST+ itself over the whole database
where the cost model predicts it fastest and its output is what the job asks for. Its bytes are
BLAST+'s (blastp and blastn, pairwise and tabular, to -out and to standard output); a BLAST+ that fails
leaves nothing under -out and exits 5 with one line; jobs that ask for what only the engine does (a
strategy by name, metadata, the engine's task sizes) do not take it. Real BLAST+, small databases made
by makeblastdb and searched in place."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import blast, paramedic, take_fasta
from tests.integration.equality import read_gz_fasta

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def work(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A protein database (3,000 real proteins) and a nucleotide one (H. pylori genomes and contigs),
    each with 20 queries."""
    root = tmp_path_factory.mktemp("plan-blast")
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", root / "prot.fasta", 3000)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", root / "blastp.fasta", 20)
    blast("makeblastdb", "-in", "prot.fasta", "-dbtype", "prot", "-out", "prot", cwd=root)
    records = [
        r for p in sorted((data_dir / "ragout" / "H.Pylori").rglob("*.fasta.gz")) for r in read_gz_fasta(p)
    ]
    with open(root / "nucl.fasta", "w") as fh:
        for header, seq in records:
            fh.write(f">{header}\n{seq}\n")
    with open(root / "blastn.fasta", "w") as fh:
        for i in range(20):
            header, seq = records[i % len(records)]
            start = (i * 7919) % max(1, len(seq) - 600)
            fh.write(f">q{i + 1} {header.split()[0]}\n{seq[start : start + 600]}\n")
    blast("makeblastdb", "-in", "nucl.fasta", "-dbtype", "nucl", "-out", "nucl", cwd=root)
    return root


def reference(work: Path, program: str, outfmt: str) -> bytes:
    db = "prot" if program == "blastp" else "nucl"
    ref = work / f"ref-{program}-{outfmt}"
    if not ref.exists():
        blast(program, "-query", f"{program}.fasta", "-db", db, "-outfmt", outfmt, "-out", ref.name, cwd=work)
    return ref.read_bytes()


def search(work: Path, program: str, *args: str, check: bool = True, env: dict[str, str] | None = None):
    db = "prot" if program == "blastp" else "nucl"
    return paramedic(
        "search", program, "-query", f"{program}.fasta", "-db", db, "--np", "2", "--quiet", *args,
        cwd=work, check=check, env=env,
    )  # fmt: skip


def chose_blast(record: dict) -> None:
    assert record["strategy"] == "blast" and record["runner"] == "local"
    reason = record["strategy_reason"]
    assert (reason["asked"], reason["chosen"]) == ("auto", "blast")
    plans = {p["plan"]: p for p in reason["plans"]}
    assert set(plans) == {"blast", "queries", "fragments"} and plans["blast"]["candidate"]
    # the database fits each worker's memory and both engine plans are exact: all three are candidates,
    # and the chosen one is predicted the fastest of them
    engine = [p for p in plans.values() if p["plan"] != "blast" and p["candidate"]]
    assert len(engine) == 2 and all(
        plans["blast"]["predicted_seconds"] <= p["predicted_seconds"] for p in engine
    )
    assert f"-mt_mode {plans['blast']['mt_mode']}" in reason["reason"]


@pytest.mark.parametrize("program", ["blastp", "blastn"])
@pytest.mark.parametrize("outfmt", ["0", "6"])
@pytest.mark.parametrize("target", ["file", "stdout"])
def test_auto_on_one_node_runs_blast_and_writes_its_bytes(
    work: Path, program: str, outfmt: str, target: str
) -> None:
    expected = reference(work, program, outfmt)
    name = f"out-{program}-{outfmt}"
    if target == "file":
        search(work, program, "-outfmt", outfmt, "-out", name)
        assert (work / name).read_bytes() == expected
        record = json.loads((work / f"{name}.run.json").read_text())
        assert record["output_bytes"] == len(expected)
    else:
        done = search(work, program, "-outfmt", outfmt, "--record", f"{name}.json")
        assert done.stdout.encode() == expected
        record = json.loads((work / f"{name}.json").read_text())
    chose_blast(record)
    assert record["workers"] == 2  # -num_threads: the job's cores
    assert not list(work.glob(f".{name}.partial-*"))


def test_a_failing_blast_leaves_nothing(work: Path, tmp_path: Path) -> None:
    """A BLAST+ that fails in the run over the whole database (after the job's checks, which it passes):
    exit 5, one line, nothing under -out, no partial file beside it."""
    wrapper = tmp_path / "bin" / "blastp"
    wrapper.parent.mkdir()
    path = os.environ["PATH"]
    wrapper.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -num_threads "*) printf "half a report"; echo "BLAST fatal error: boom" >&2; exit 3;; esac\n'
        f'PATH="{path}" exec blastp "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    done = search(
        work, "blastp", "-outfmt", "6", "-out", "failed.tsv", check=False,
        env={"PATH": f"{wrapper.parent}:{path}"},
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert done.stderr.count("\n") == 1 and "blastp failed (exit 3): BLAST fatal error: boom" in done.stderr
    assert not (work / "failed.tsv").exists() and not (work / "failed.tsv.run.json").exists()
    assert not list(work.glob(".failed.tsv.partial-*"))


@pytest.mark.parametrize(
    ("args", "chosen", "why_not"),
    [
        (("--strategy", "fragments"), "fragments", None),
        (("--strategy", "queries"), "queries", None),
        (("--metadata", "meta.json"), "fragments", "--metadata"),
        (("--batch", "5"), None, "--batch"),
    ],
    ids=["fragments", "queries", "metadata", "batch"],
)
def test_jobs_that_ask_for_the_engine_do_not_take_it(
    work: Path, args: tuple[str, ...], chosen: str | None, why_not: str | None
) -> None:
    search(work, "blastp", "-outfmt", "6", "-out", "engine.tsv", *args)
    assert (work / "engine.tsv").read_bytes() == reference(work, "blastp", "6")
    record = json.loads((work / "engine.tsv.run.json").read_text())
    assert record["strategy"] in ("fragments", "queries") and record["strategy"] == (
        chosen or record["strategy"]
    )
    reason = record["strategy_reason"]
    if why_not is None:  # a strategy by name: no model weighed
        assert "plans" not in reason
        return
    blast_plan = next(p for p in reason["plans"] if p["plan"] == "blast")
    assert not blast_plan["candidate"] and why_not in blast_plan["why_not"]
    assert "one BLAST+ run is not a candidate" in reason["reason"]
