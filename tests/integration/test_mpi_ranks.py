"""The in-rank tests (tests/mpi) under `mpiexec -n 2`, `-n 3` and `-n 4`: the test process is every rank
of the job, so the MPI runners (on_ranks, roles, ranks, partitions, mpiio) run in it, as
mpi4py tests itself. `make test-mpi` runs the same with coverage of those modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from paramedic.engine.runtime.launch import find_mpiexec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_the_in_rank_tests_pass_on_every_rank(data_dir: Path, ranks: int, tmp_path: Path) -> None:
    mpiexec = find_mpiexec()
    assert mpiexec is not None, "no mpiexec: make setup"
    env = dict(os.environ, PARAMEDIC_MPI_BASETEMP=str(tmp_path))  # a temporary root per rank (tests/mpi)
    proc = subprocess.run(
        [mpiexec, "-n", str(ranks), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/mpi"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.count(" passed") == ranks, proc.stdout[-4000:]
    assert " failed" not in proc.stdout and " error" not in proc.stdout, proc.stdout[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank{r}" for r in range(ranks)]  # roots apart
