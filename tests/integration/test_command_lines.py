"""BLAST+ command lines as users and front ends write them (issue 43, item 3, the command line): the
query from standard input (`-query -`, or no -query at all), from a pipe or a process substitution
(read once), the report on standard output when -out is absent, and a quoted -db (Galaxy's wrappers
render `-db '"path"'`). Each runs the real `paramedic search` and plain `blastp` the same way, on the same
database, and compares their bytes."""

from __future__ import annotations

import gzip
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN
from tests.support.databases import Databases

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def work(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("command-lines")
    databases.place(root, 600, fragments=2)
    databases.queries(root / "q.fasta", 5)
    (root / "q.fasta.gz").write_bytes(gzip.compress((root / "q.fasta").read_bytes()))
    return root


def run(
    argv: list[str], cwd: Path, tmp: Path, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`argv` with `stdin` on a pipe (None: /dev/null), its own TMPDIR (to see what it leaves there)."""
    tmp.mkdir(exist_ok=True)
    return subprocess.run(
        argv,
        cwd=cwd,
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp)},
    )


def both(
    work: Path, tmp_path: Path, args: list[str], stdin: bytes | None = None, runner: str = "auto"
) -> tuple[bytes, bytes]:
    """Standard output of `blastp ARGS` and of `paramedic search blastp ARGS` (each must succeed, and
    paramedic must leave nothing in its TMPDIR)."""
    expected = run(["blastp", *args], work, tmp_path / "blast-tmp", stdin)
    assert expected.returncode == 0, expected.stderr
    engine = ["--np", "2", "--quiet", "--runner", runner]
    got = run([str(BIN / "paramedic"), "search", "blastp", *args, *engine], work, tmp_path / "tmp", stdin)
    assert got.returncode == 0, got.stderr.decode()
    assert list((tmp_path / "tmp").iterdir()) == []
    return expected.stdout, got.stdout


def in_bash(work: Path, tmp_path: Path, command: str, runner: str = "auto") -> tuple[bytes, bytes]:
    """`command` run by bash (process substitution), once as `blastp`, once as `paramedic search blastp`."""
    runs = []
    paramedic = f"{shlex.quote(str(BIN / 'paramedic'))} search blastp --np 2 --quiet --runner {runner}"
    for program in ("blastp", paramedic):
        done = run(["bash", "-c", command.format(program=program)], work, tmp_path / "tmp")
        assert done.returncode == 0, done.stderr.decode()
        runs.append(done.stdout)
    assert list((tmp_path / "tmp").iterdir()) == []
    return runs[0], runs[1]


@pytest.mark.parametrize("runner", ["local", "mpi"])
def test_query_dash_reads_standard_input(work: Path, tmp_path: Path, runner: str) -> None:
    """Was: "/…/-: no such file". Under MPI ranks mpiexec forwards standard input to rank 0."""
    expected, got = both(work, tmp_path, ["-query", "-", "-db", "db/uni", "-outfmt", "6"],
                         stdin=(work / "q.fasta").read_bytes(), runner=runner)  # fmt: skip
    assert expected and got == expected


def test_no_query_reads_standard_input(work: Path, tmp_path: Path) -> None:
    """Was: "-query is required"; BLAST+ reads standard input."""
    expected, got = both(work, tmp_path, ["-db", "db/uni"], stdin=(work / "q.fasta").read_bytes())
    assert expected and got == expected


@pytest.mark.parametrize("runner", ["local", "mpi"])
def test_process_substitution_is_read_once(work: Path, tmp_path: Path, runner: str) -> None:
    """A gzipped query through `-query <(gunzip -c q.fasta.gz)`: /dev/fd/63 is a pipe, read once. Was:
    "/dev/fd/63: empty FASTA file" (the pipe was opened twice); under MPI ranks "no such file" (mpiexec
    passes no descriptor but standard input)."""
    expected, got = in_bash(
        work, tmp_path, "{program} -query <(gunzip -c q.fasta.gz) -db db/uni -outfmt '6 std qlen'", runner
    )
    assert expected and got == expected


def test_named_fifo_query_is_read_once(work: Path, tmp_path: Path) -> None:
    expected, got = in_bash(
        work, tmp_path, f"mkfifo {tmp_path}/q.fifo; (cat q.fasta > {tmp_path}/q.fifo &); "
        f"{{program}} -query {tmp_path}/q.fifo -db db/uni -outfmt 7; rm {tmp_path}/q.fifo",
    )  # fmt: skip
    assert expected and got == expected


@pytest.mark.parametrize("outfmt", ["0", "6", "7", "5", "15"])
def test_no_out_writes_standard_output(work: Path, tmp_path: Path, outfmt: str) -> None:
    expected, got = both(work, tmp_path, ["-query", "q.fasta", "-db", "db/uni", "-outfmt", outfmt])
    assert expected and got == expected


def test_no_out_through_mpi_ranks_writes_standard_output(work: Path, tmp_path: Path) -> None:
    """Rank 0 writes standard output through the launcher's relay."""
    args = ["-query", "q.fasta", "-db", "db/uni"]
    expected = run(["blastp", *args], work, tmp_path / "blast-tmp").stdout
    got = run(
        [str(BIN / "paramedic"), "search", "blastp", *args, "--np", "2", "--runner", "mpi", "--quiet"],
        work, tmp_path / "tmp",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr.decode()
    assert expected and got.stdout == expected


@pytest.mark.parametrize("outfmt", ["6", "0", "7", "5", "15", "16", "11"])
def test_quoted_db_as_galaxy_renders_it(work: Path, tmp_path: Path, outfmt: str) -> None:
    """`-db '"db/uni"'`: BLAST+ strips the quotes to open it, and prints the string as given (outfmt 7,
    5, 15). Was: "database '"db/uni"' not found"."""
    expected, got = both(work, tmp_path, ["-query", "q.fasta", "-db", '"db/uni"', "-outfmt", outfmt])
    assert expected and got == expected


def test_empty_standard_input_is_one_line(work: Path, tmp_path: Path) -> None:
    """Bad input from standard input: one line naming it, exit 3, no output and nothing left."""
    done = run(
        [str(BIN / "paramedic"), "search", "blastp", "-query", "-", "-db", "db/uni", "-out",
         str(tmp_path / "o.txt"), "--np", "2"],
        work, tmp_path / "tmp", stdin=b"",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.decode() == "paramedic: error: standard input: empty FASTA file (no sequences)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"] and list((tmp_path / "tmp").iterdir()) == []
