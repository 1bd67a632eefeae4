"""`paramedic trace` onto a full disk (issue 41, item 10): the ranks' logs and the merged file fail to be
written, and the run ends with exit 7 and "no space left on device", as a search says it, leaving nothing
(before: exit 3, "did every rank reach MPI_Finalize?"). A real 1 MiB tmpfs, real Open MPI ranks."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import paramedic
from tests.integration.test_trace import OMPI_ENV, RANDOM_COMM, need

pytestmark = pytest.mark.integration


@pytest.fixture
def full(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB filesystem of the test's own (a tmpfs: mounting needs root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_said_as_such(tmp_path: Path, full: Path) -> None:
    need("mpicc.openmpi", "mpiexec.openmpi")
    program = tmp_path / "random_comm"
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(program), str(RANDOM_COMM)], check=True)
    proc = paramedic("trace", "-out", str(full / "run.clog2"), "--", "mpiexec.openmpi", "-n", "2", str(program),
                     "3000", "3", check=False, env=OMPI_ENV)  # fmt: skip
    assert proc.returncode == 7, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paramedic: error: no space left on device"), proc.stderr
    assert "MPI_Finalize" not in proc.stderr
    assert list(full.iterdir()) == []  # the partial logs removed
