"""The tracer and the ways a program reaches MPI, with real Open MPI ranks: a Fortran program (`use mpi`;
Open MPI's Fortran functions call PMPI_* directly, so only the tracer's Fortran wrappers see its calls) is
traced call by call, messages paired; a Fortran 2008 program (`use mpi_f08`, not wrapped) and a C program
that takes MPI_Init from the library's handle with dlsym are refused with one line (exit 2), no file."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from paramedic.trace import clog2
from tests.conftest import paramedic
from tests.integration.test_trace import OMPI_ENV, ROOT, check_structure, need, state_counts

pytestmark = pytest.mark.integration

RING = ROOT / "examples/trace/ring.f90"
F08 = """program f08
  use mpi_f08
  call MPI_Init()
  call MPI_Barrier(MPI_COMM_WORLD)
  call MPI_Finalize()
end program f08
"""
DLSYM = r"""#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*init)(int *, char ***) = (int (*)(int *, char ***))dlsym(h, "MPI_Init");
    int (*fin)(void) = (int (*)(void))dlsym(h, "MPI_Finalize");
    init(&argc, &argv);
    fin();
    return 0;
}
"""
STATES = {"Send": 10, "Isend": 14, "Recv": 16, "Irecv": 17, "Sendrecv": 18, "Waitall": 21, "Barrier": 30,
          "Bcast": 31, "Allreduce": 33, "Finalize": 2}  # fmt: skip


def test_fortran_program_is_traced_call_by_call(tmp_path: Path) -> None:
    need("mpif90.openmpi", "gfortran", "mpiexec.openmpi")
    program = tmp_path / "ring"
    subprocess.run(["mpif90.openmpi", "-O1", "-o", str(program), str(RING)], check=True)
    out = tmp_path / "ring.clog2"
    paramedic("trace", "-out", str(out), "--", "mpiexec.openmpi", "-n", "3", str(program), "30", env=OMPI_ENV)
    trace = clog2.read(out.read_bytes())
    check_structure(trace, 3)  # every receive (Recv with MPI_STATUS_IGNORE, Waitall's) pairs with its send
    for rank in range(3):
        expected = Counter({STATES["Sendrecv"]: 30, STATES["Irecv"]: 30, STATES["Isend"]: 30,
                            STATES["Waitall"]: 30, STATES["Allreduce"]: 3, STATES["Bcast"]: 1,
                            STATES["Barrier"]: 1, STATES["Finalize"]: 1})  # fmt: skip
        if rank == 0:
            expected[STATES["Send"]] = 1
        if rank == 1:
            expected[STATES["Recv"]] = 1
        assert state_counts(trace, rank) == expected
    messages = trace.records.head[:, 3] == 7
    assert int(messages.sum()) == 2 * (3 * (30 + 30) + 1)  # sends and receives, each logged once


@pytest.mark.parametrize("kind", ["f08", "dlsym"])
def test_unwrapped_bindings_are_refused(tmp_path: Path, kind: str) -> None:
    need("mpiexec.openmpi", "gfortran" if kind == "f08" else "cc")
    program = tmp_path / kind
    if kind == "f08":
        (tmp_path / "f08.f90").write_text(F08)
        subprocess.run(["mpif90.openmpi", "-o", str(program), str(tmp_path / "f08.f90")], check=True)
        command, reason = [str(program)], "Fortran 2008 bindings"
    else:
        (tmp_path / "dl.c").write_text(DLSYM)
        subprocess.run(["cc", "-o", str(program), str(tmp_path / "dl.c"), "-ldl"], check=True)
        command, reason = [str(program), "libmpi.so.40"], "through dlsym"
    run = tmp_path / "run"
    run.mkdir()
    proc = paramedic(
        "trace", "-out", str(run / "t.clog2"), "--", "mpiexec.openmpi", "-n", "2", *command,
        env=OMPI_ENV, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("paramedic: error: this program") and reason in last
    assert list(run.iterdir()) == []
