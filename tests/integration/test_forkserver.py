"""The BLAST+ fork server gives what a freshly started BLAST+ gives: same bytes, same exit codes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from paramedic.blast.forkserver import ForkServer, shim_path
from tests.conftest import take_fasta

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(data_dir: Path):
    shim = shim_path()
    if shim is None:
        pytest.skip("no C compiler: the engine starts BLAST+ normally")
    fs = ForkServer(shutil.which("blastp"), shim)
    yield fs
    fs.close()


def test_same_output_as_a_fresh_process(server: ForkServer, data_dir: Path, tmp_path: Path) -> None:
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", tmp_path / "db.fasta", 300)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", tmp_path / "q.fasta", 4)
    subprocess.run(
        ["makeblastdb", "-in", "db.fasta", "-dbtype", "prot", "-out", "db"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    for outfmt in ("0", "5", "6"):
        argv = ["blastp", "-query", "q.fasta", "-db", "db", "-outfmt", outfmt, "-evalue", "10"]
        fresh = subprocess.run(argv, cwd=tmp_path, capture_output=True, check=True).stdout
        code = server.run(argv, str(tmp_path), str(tmp_path / "forked.out"), str(tmp_path / "forked.err"))
        assert code == 0
        assert (tmp_path / "forked.out").read_bytes() == fresh
    # Many runs in a row stay correct (no state leaks from one child to the next).
    for _ in range(20):
        assert server.run(argv, str(tmp_path), str(tmp_path / "again.out"), "") == 0
    assert (tmp_path / "again.out").read_bytes() == fresh


def test_failures_keep_their_exit_code_and_message(server: ForkServer, tmp_path: Path) -> None:
    argv = ["blastp", "-query", "missing.fasta", "-db", "nodb"]
    fresh = subprocess.run(argv, cwd=tmp_path, capture_output=True)
    code = server.run(argv, str(tmp_path), str(tmp_path / "o"), str(tmp_path / "e"))
    assert code == fresh.returncode != 0
    assert (tmp_path / "e").read_bytes() == fresh.stderr
