"""Tests that run inside MPI ranks, as mpi4py tests itself: `mpiexec -n 2..4 python -m pytest tests/mpi`
(`make test-mpi`; tests/integration/test_mpi_ranks.py runs it for `make test`). Every rank runs every
test; a test's collective calls meet across the ranks. In a plain (one-process) pytest run they are not
collected: they need ranks to talk to."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mpi4py import MPI

if MPI.COMM_WORLD.Get_size() == 1:
    collect_ignore_glob = ["test_*.py"]

# A directory of the caller's (tests/integration/test_mpi_ranks.py: its own tmp_path) under which each rank
# gets a temporary root of its own: the ranks' pytest sessions cleaning up one shared pytest-of-<user>
# directory at once failed with "Directory not empty" at the end of the session (seen in CI).
BASETEMP_VARIABLE = "PARAMEDIC_MPI_BASETEMP"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    root = os.environ.get(BASETEMP_VARIABLE)
    if root and config.option.basetemp is None:
        config.option.basetemp = str(Path(root) / f"rank{MPI.COMM_WORLD.Get_rank()}")


@pytest.fixture
def comm() -> Iterator[MPI.Intracomm]:
    """A communicator of this test's own (a duplicate of the world), freed after it."""
    dup = MPI.COMM_WORLD.Dup()
    yield dup
    dup.Free()


@pytest.fixture
def shared_dir(comm: MPI.Intracomm) -> Iterator[Path]:
    """One directory every rank sees (made by rank 0), removed when every rank is done with it."""
    path = Path(comm.bcast(tempfile.mkdtemp(prefix="paramedic-mpi-") if comm.Get_rank() == 0 else None))
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
