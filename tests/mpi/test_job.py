"""A whole search job run by the ranks of this very test process (on_ranks.run_under_mpi, roles, ranks,
partitions, mpiio), as `paramedic search` runs it under a user's own `mpiexec`: real BLAST+, a real
small database, the output checked byte for byte against one BLAST+ run on the unsplit database.

Every rank calls `paramedic.cli.main` with the same arguments; rank 0 prepares the job and masters it,
the others work. The child processes a rank starts itself (makeblastdb, blastp) get an environment
without the MPI launcher's variables, so that they are not mistaken for ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mpi4py import MPI

from paramedic.cli import main
from paramedic.engine.runtime import ranks
from tests.conftest import DATA, take_fasta
from tests.mpi.end_writes import WorkerAtEnd  # registers a third worker output strategy

WORLD = MPI.COMM_WORLD


def plain_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "MPI", "HYDRA", "OMPI"))
    }


def run(*argv: str, cwd: Path) -> None:
    subprocess.run(argv, cwd=cwd, env=plain_env(), check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    """Rank 0 builds it: 300 proteins in 3 fragments, the reference database, 4 queries, BLAST+'s
    tabular output; every rank gets its path (or the reason it could not be built)."""
    made = None
    if WORLD.Get_rank() == 0:
        tools = all(shutil.which(t) for t in ("blastp", "makeblastdb"))
        if tools and (DATA / ".complete").exists():
            import tempfile

            root = Path(tempfile.mkdtemp(prefix="paramedic-mpi-job-"))
            take_fasta(DATA / "mmseqs2" / "DB.fasta", root / "db.fasta", 300)
            take_fasta(DATA / "mmseqs2" / "QUERY.fasta", root / "q.fasta", 4)
            paramedic = str(Path(os.sys.executable).parent / "paramedic")
            run(paramedic, "format", "--in", "db.fasta", "--dbtype", "prot", "--fragments", "3", "--out",
                "db/uni", "--quiet", cwd=root)  # fmt: skip
            run(
                "makeblastdb",
                "-in",
                "db.fasta",
                "-dbtype",
                "prot",
                "-parse_seqids",
                "-out",
                "ref/db",
                cwd=root,
            )
            run("blastp", "-query", "q.fasta", "-db", "ref/db", "-outfmt", "6", "-out", "ref.tsv", cwd=root)
            made = str(root)
    path = WORLD.bcast(made, root=0)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("BLAST+ or the data missing (make setup data)")
        pytest.skip("BLAST+ or the data missing (make setup data)")
    yield Path(path)
    WORLD.Barrier()
    if WORLD.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def search(site: Path, out: str, *flags: str) -> int:
    argv = ["search", "blastp", "-query", str(site / "q.fasta"), "-db", str(site / "db/uni"), "-outfmt", "6",
            "-out", str(site / out), "--quiet", *flags]  # fmt: skip
    code = main(argv)
    WORLD.Barrier()
    return code


@pytest.mark.parametrize(
    "flags",
    [
        ("--strategy", "fragments"),
        ("--strategy", "queries"),
        ("--strategy", "fragments", "--output-strategy", "worker-individual"),
        ("--strategy", "fragments", "--output-strategy", "worker-collective"),
        ("--strategy", "fragments", "--output-strategy", "worker-merge"),
    ],
    ids=lambda flags: "-".join(f.lstrip("-") for f in flags),
)
def test_a_job_on_these_ranks_writes_what_blast_writes(site: Path, flags: tuple[str, ...]) -> None:
    out = "out-" + "-".join(f.lstrip("-") for f in flags) + f"-{WORLD.Get_size()}.tsv"
    assert search(site, out, *flags) == 0
    if WORLD.Get_rank() == 0:
        assert (site / out).read_bytes() == (site / "ref.tsv").read_bytes()
        assert not [p for p in site.iterdir() if p.name.startswith(".") and out in p.name]


def test_an_output_strategy_added_by_the_recipe_writes_what_blast_writes(site: Path) -> None:
    """docs/CONTRIBUTING.md "Add an output strategy", followed: a strategy of one module and one
    registration (tests/mpi/end_writes.py) is an `--output-strategy` choice, and the ranks carry out its
    orders. The record says it was the one used, for every piece."""
    out = f"out-at-end-{WORLD.Get_size()}.tsv"
    assert search(site, out, "--strategy", "fragments", "--output-strategy", WorkerAtEnd.name) == 0
    if WORLD.Get_rank() == 0:
        assert (site / out).read_bytes() == (site / "ref.tsv").read_bytes()
        record = json.loads((site / (out + ".run.json")).read_text())
        assert record["output_strategy"] == WorkerAtEnd.name
        assert record["output_writes"] == {"late_writes": record["pieces"]} and record["pieces"] >= 1


def test_partitions_on_these_ranks_write_what_blast_writes(site: Path) -> None:
    """A supermaster and partition masters (--partition-size 2), when there are ranks enough."""
    if WORLD.Get_size() < 4:
        pytest.skip("partitions need a supermaster and two partitions of a master and a worker")
    out = f"out-partitions-{WORLD.Get_size()}.tsv"
    assert search(site, out, "--strategy", "fragments", "--partition-size", "2") in (0,)
    if WORLD.Get_rank() == 0:
        assert (site / out).read_bytes() == (site / "ref.tsv").read_bytes()


@pytest.mark.parametrize("flags", [(), ("--partition-size", "2")], ids=["one-master", "partitions"])
def test_a_worker_rank_holds_only_its_tasks_queries(
    site: Path, flags: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: the job a worker rank receives holds no queries; each task arrives with its own, and
    those are the job's queries in the task's range (checked against the query file)."""
    if flags and WORLD.Get_size() < 4:
        pytest.skip("partitions need a supermaster and two partitions of a master and a worker")
    seen: list[tuple[int, str, list[str]]] = []
    real = ranks.execute

    def recording(task, job, plan, workdir, stats, store=None, queries=None):  # type: ignore[no-untyped-def]
        seen.append((len(job.queries), repr(task), [header for header, _ in queries or []]))
        return real(task, job, plan, workdir, stats, store, queries)

    monkeypatch.setattr(ranks, "execute", recording)
    out = f"out-held-{'-'.join(flags) or 'one'}-{WORLD.Get_size()}.tsv"
    assert search(site, out, "--strategy", "fragments", *flags) == 0
    everyone = WORLD.gather(seen, root=0)
    if WORLD.Get_rank() == 0:
        assert (site / out).read_bytes() == (site / "ref.tsv").read_bytes()
        lines = (site / "q.fasta").read_text().splitlines()
        headers = [line[1:] for line in lines if line[:1] == ">"]  # as read_fasta keeps them
        worked = [r for r in everyone[1:] if r]
        assert worked, "no worker rank ran a task"
        for ran in worked:
            for held, task, queries in ran:
                assert held == 0, f"a worker held {held} queries of the job"
                assert queries and queries == headers[headers.index(queries[0]) :][: len(queries)], task


def test_a_refused_job_is_one_exit_code_on_every_rank(site: Path) -> None:
    """A bad request is refused by rank 0 while it prepares the job: every rank returns the code, none
    hangs or aborts the others."""
    code = search(site, "never.tsv", "--strategy", "fragments", "-evalue", "not-a-number")
    assert code != 0
    assert not (site / "never.tsv").exists()


def test_partitions_ship_auto_to_an_inbox_site(site: Path) -> None:
    """--ship auto with partitions (each partition's probe answered by rank 0) to a real `paramedic serve`
    watching an inbox: no link to measure, so metadata; the site regenerates what BLAST+ writes."""
    if WORLD.Get_size() < 4:
        pytest.skip("partitions need a supermaster and two partitions of a master and a worker")
    from tests.support.site import StorageSite

    base = site / f"auto-{WORLD.Get_size()}"
    server = None
    if WORLD.Get_rank() == 0:
        (base / "root").mkdir(parents=True)
        server = StorageSite(
            site / "db/uni", base / "root", None, base / "serve.log", 1, inbox=base / "inbox"
        )
        server.start()
    WORLD.Barrier()
    try:
        out = "auto.tsv"  # under the site's root
        code = main(["search", "blastp", "-query", str(site / "q.fasta"), "-db", str(site / "db/uni"), "-outfmt",
                     "6", "-out", out, "--quiet", "--strategy", "fragments", "--partition-size", "2", "--site",
                     f"file://{base / 'inbox'}", "--ship", "auto", "--ship-timeout", "60", "--record",
                     str(base / "record.json")])  # fmt: skip
        WORLD.Barrier()
        assert code == 0
        if WORLD.Get_rank() == 0:
            assert (base / "root" / out).read_bytes() == (site / "ref.tsv").read_bytes()
            record = json.loads((base / "record.json").read_text())
            assert record["partitions"] >= 1 and record["ship"]["auto_decision"]["mode"] == "metadata"
    finally:
        if server is not None:
            server.stop()
