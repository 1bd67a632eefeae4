"""The tracer's binary-tree merge inside MPI_Finalize (native/clogtrace_merge.h), with real mpiexec ranks of
Open MPI and of the mpich wheel's MPICH: the file rank 0 writes equals, byte for byte, the reference merge
of the same logs (trace/merge.py, logs kept with PARAMEDIC_TRACE_KEEP). Five ranks make a tree of three
levels (0 <- 1, 2; 1 <- 3, 4); 4 KiB buffers and chunks make every log flush and every stream go in many
messages. A rank whose log cannot be written fails the merge with a clear error, and nothing hangs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from paramedic.trace import clog2, merge, native, run
from tests.conftest import BIN
from tests.integration.test_trace import OMPI_ENV, RANDOM_COMM, check_structure, need

pytestmark = pytest.mark.integration

FLAVOURS = {
    "openmpi": ("mpicc.openmpi", "mpiexec.openmpi"),
    "mpich": (str(BIN / "mpicc"), str(BIN / "mpiexec")),
}


def traced_run(tmp_path: Path, flavour: str, size: int, extra: dict[str, str]) -> Path:
    """random_comm run by `size` ranks under the tracer; its log directory."""
    mpicc, mpiexec = FLAVOURS[flavour]
    need(mpicc, mpiexec)
    program = tmp_path / "random_comm"
    subprocess.run([mpicc, "-O2", "-o", str(program), str(RANDOM_COMM)], check=True)
    lib, kind = native.library(mpiexec)
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    env = {"LD_PRELOAD": str(lib), "PARAMEDIC_TRACE_DIR": str(logs), **extra}
    command = run.inject([mpiexec, "-n", str(size), str(program), "150", "7"], kind, env)
    subprocess.run(command, check=True, timeout=120, env={**os.environ, **OMPI_ENV})
    return logs


@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_tree_merge_equals_the_reference(tmp_path: Path, flavour: str) -> None:
    small = {
        "PARAMEDIC_TRACE_BUFFER": "4096",
        "PARAMEDIC_TRACE_CHUNK": "4096",
        "PARAMEDIC_TRACE_KEEP": "1",
        "PARAMEDIC_TRACE_CLOCKS": "measure",  # offsets measured by ping-pong, as across nodes
    }
    logs = traced_run(tmp_path, flavour, 5, small)
    data = (logs / "merged.clog2").read_bytes()
    reference, ref_summary = merge.merge(logs, 5)
    assert data == reference
    summary = merge.read_summary(logs / "merged.summary")
    for key in ("ranks", "records", "clock_offset_ns", "dropped_message_events"):
        assert summary[key] == ref_summary[key]
    assert any(x != 0 for pair in summary["clock_offset_ns"].values() for x in pair)  # type: ignore[union-attr]
    assert all(int(n) * 32 > 4 * 4096 for n in summary["records"].values())  # type: ignore[union-attr]
    trace = clog2.read(data)
    check_structure(trace, 5)
    assert len(data) > 3 * 65536  # several blocks


def test_rank_without_log_fails_the_merge(tmp_path: Path) -> None:
    """Rank 2 cannot create its log (a directory holds its name): every rank still finishes, and the
    summary names rank 2; no merged file."""
    logs = tmp_path / "logs"
    (logs / "rank-2.raw").mkdir(parents=True)
    traced_run(tmp_path, "openmpi", 3, {})
    assert not (logs / "merged.clog2").exists()
    with pytest.raises(merge.MergeError, match=r"tree merge failed \(rank 2\): its log could not be written"):
        merge.read_summary(logs / "merged.summary")
