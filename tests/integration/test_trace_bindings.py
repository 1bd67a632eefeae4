"""The tracer and the ways a program reaches MPI, with real Open MPI ranks: a Fortran program (`use mpi`;
Open MPI's Fortran functions call PMPI_* directly, so only the tracer's Fortran wrappers see its calls) is
traced call by call, messages paired; a C program that takes its MPI functions from the library's handle with
dlsym (which LD_PRELOAD does not see) is traced call by call all the same, through the audit library; a
Fortran 2008 program (`use mpi_f08`) is traced, its untraced calls named; the calls of every other family
(collectives of every kind, persistent, one-sided, MPI-IO, threads) under Open MPI, the mpich wheel's and
Debian's MPICH."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from paramedic.trace import clog2, codec
from tests.conftest import BIN, paramedic
from tests.integration.test_trace import OMPI_ENV, ROOT, check_structure, need, state_counts

pytestmark = pytest.mark.integration

RING = ROOT / "examples/trace/ring.f90"
F08 = """program f08
  use mpi_f08
  integer :: rank, i
  double precision :: a(4), b(4)
  type(MPI_Status) :: st
  type(MPI_Request) :: reqs(2)
  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  a = rank
  call MPI_Barrier(MPI_COMM_WORLD)
  call MPI_Allreduce(MPI_IN_PLACE, a, 4, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  do i = 1, 3
    if (rank == 0) call MPI_Send(a, 4, MPI_DOUBLE_PRECISION, 1, i, MPI_COMM_WORLD)
    if (rank == 1) call MPI_Recv(a, 4, MPI_DOUBLE_PRECISION, 0, i, MPI_COMM_WORLD, st)
    if (rank == 1) call MPI_Send(a, 4, MPI_DOUBLE_PRECISION, 0, 10 + i, MPI_COMM_WORLD)
    if (rank == 0) call MPI_Recv(b, 4, MPI_DOUBLE_PRECISION, 1, 10 + i, MPI_COMM_WORLD, MPI_STATUS_IGNORE)
    call MPI_Irecv(b, 4, MPI_DOUBLE_PRECISION, 1 - rank, 20 + i, MPI_COMM_WORLD, reqs(1))
    call MPI_Isend(a, 4, MPI_DOUBLE_PRECISION, 1 - rank, 20 + i, MPI_COMM_WORLD, reqs(2))
    call MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE)
  end do
  call MPI_Finalize()
end program f08
"""
DLSYM = r"""#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
typedef int (*send_t)(const void *, int, MPI_Datatype, int, int, MPI_Comm);
typedef int (*recv_t)(void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Status *);
typedef int (*bcast_t)(void *, int, MPI_Datatype, int, MPI_Comm);
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*init)(int *, char ***) = (int (*)(int *, char ***))dlsym(h, "MPI_Init");
    int (*fin)(void) = (int (*)(void))dlsym(h, "MPI_Finalize");
    send_t send = (send_t)dlsym(h, "MPI_Send");
    recv_t recv = (recv_t)dlsym(h, "MPI_Recv");
    bcast_t bcast = (bcast_t)dlsym(h, "MPI_Bcast");
    if (!dlsym(h, "MPI_Comm_spawn")) return 1; /* taken, not called: the tracer does not wrap it */
    int rank, x = 7;
    init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 0; i < 5; i++) {
        if (rank == 0) send(&x, 1, MPI_INT, 1, i, MPI_COMM_WORLD);
        else if (rank == 1) recv(&x, 1, MPI_INT, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    bcast(&x, 1, MPI_INT, 0, MPI_COMM_WORLD);
    fin();
    return 0;
}
"""
# The MPIs a C program is built and traced with: Debian's Open MPI, the mpich wheel's MPICH and Debian's MPICH
# (two MPICHs: the tracer builds one library for each, in this order; before, the second used the first's).
FLAVOURS = {
    "openmpi": ("mpicc.openmpi", "mpiexec.openmpi"),
    "mpich": (str(BIN / "mpicc"), str(BIN / "mpiexec")),
    "debian-mpich": ("mpicc.mpich", "mpiexec.mpich"),
}
STATES = {"Send": 10, "Isend": 14, "Recv": 16, "Irecv": 17, "Sendrecv": 18, "Waitall": 21, "Testall": 24, "Waitsome": 27,
          "Barrier": 30, "Bcast": 31, "Allreduce": 33, "Gatherv": 40, "Alltoallv": 42, "Mprobe": 62, "Mrecv": 64,
          "Finalize": 2}  # fmt: skip


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


SOME_F90 = """program some
  use mpi
  implicit none
  integer :: rank, nranks, ierr, i, outcount, done, left, right
  integer :: reqs(2), idx(2), st(MPI_STATUS_SIZE, 2)
  double precision :: sbuf(4), rbuf(4)
  logical :: flag
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  right = mod(rank + 1, nranks)
  left = mod(rank + nranks - 1, nranks)
  sbuf = rank
  do i = 1, 5
    call MPI_Irecv(rbuf, 4, MPI_DOUBLE_PRECISION, left, i, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Isend(sbuf, 4, MPI_DOUBLE_PRECISION, right, i, MPI_COMM_WORLD, reqs(2), ierr)
    done = 0
    do while (done < 2)
      call MPI_Waitsome(2, reqs, outcount, idx, st, ierr)
      done = done + outcount
    end do
    call MPI_Irecv(rbuf, 4, MPI_DOUBLE_PRECISION, left, 100 + i, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Isend(sbuf, 4, MPI_DOUBLE_PRECISION, right, 100 + i, MPI_COMM_WORLD, reqs(2), ierr)
    flag = .false.
    do while (.not. flag)
      call MPI_Testall(2, reqs, flag, MPI_STATUSES_IGNORE, ierr)
    end do
  end do
  call MPI_Finalize(ierr)
end program some
"""


def test_fortran_completions_by_waitsome_and_testall_are_traced(tmp_path: Path) -> None:
    """Open MPI's Fortran MPI_Waitsome and MPI_Testall call PMPI_* directly: without their Fortran wrappers
    the receives they completed had no message event (and check_structure found unpaired sends)."""
    need("mpif90.openmpi", "gfortran", "mpiexec.openmpi")
    (tmp_path / "some.f90").write_text(SOME_F90)
    program = tmp_path / "some"
    subprocess.run(["mpif90.openmpi", "-O1", "-o", str(program), str(tmp_path / "some.f90")], check=True)
    out = tmp_path / "some.clog2"
    paramedic("trace", "-out", str(out), "--", "mpiexec.openmpi", "-n", "2", str(program), env=OMPI_ENV)
    trace = clog2.read(out.read_bytes())
    check_structure(trace, 2)
    for rank in range(2):
        counts = state_counts(trace, rank)
        assert counts.pop(STATES["Waitsome"]) >= 5 and counts.pop(STATES["Testall"]) >= 5
        assert counts == Counter({STATES["Isend"]: 10, STATES["Irecv"]: 10, STATES["Finalize"]: 1})
    assert int((trace.records.head[:, 3] == 7).sum()) == 2 * 2 * 10  # each rank's sends and receives


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_calls_taken_with_dlsym_are_traced(tmp_path: Path, flavour: str) -> None:
    """MPI_Init, MPI_Send, MPI_Recv, MPI_Bcast and MPI_Finalize taken with dlsym from libmpi's own handle:
    without the audit library none of them reached the tracer (the sends were silently missing from the
    trace); with its table of 256 wrappers, MPI_Bcast (past the 256th of the 303 an MPI-4 build exports)
    still missed it under MPICH. A function taken so that the tracer does not wrap is named, as imported
    ones are."""
    mpicc, mpiexec = FLAVOURS[flavour]
    need(mpicc, mpiexec)
    (tmp_path / "dl.c").write_text(DLSYM)
    program = tmp_path / "dl"
    subprocess.run([mpicc, "-o", str(program), str(tmp_path / "dl.c"), "-ldl"], check=True)
    out = tmp_path / "dl.clog2"
    soname = {"openmpi": "libmpi.so.40", "mpich": "libmpi.so.12", "debian-mpich": "libmpich.so.12"}[flavour]
    command = [mpiexec, "-n", "2", str(program), soname]
    proc = paramedic("trace", "-out", str(out), "--", *command, env=OMPI_ENV)
    assert proc.stderr.strip().endswith("absent from the trace if called): MPI_Comm_spawn")
    trace = clog2.read(out.read_bytes())
    check_structure(trace, 2)
    bcast = {STATES["Bcast"]: 1, STATES["Finalize"]: 1}
    assert state_counts(trace, 0) == Counter({STATES["Send"]: 5, **bcast})
    assert state_counts(trace, 1) == Counter({STATES["Recv"]: 5, **bcast})
    assert int((trace.records.head[:, 3] == 7).sum()) == 10  # five sends, five receives


@pytest.mark.parametrize("flavour", ["openmpi", "debian-mpich"])
def test_fortran_2008_programs_are_traced(tmp_path: Path, flavour: str) -> None:
    """`use mpi_f08` (refused before: exit 2, no trace): its calls are traced call by call, messages paired,
    under Open MPI (whose f08 functions call PMPI_*: the tracer's f08 aliases log them) and Debian's MPICH
    (its f08 calls with a buffer reach the C wrappers, the others the aliases); MPI_STATUS_IGNORE and
    MPI_STATUSES_IGNORE of mpi_f08 are told from real statuses (MPICH's are objects of their own: read as
    statuses, they made receives from rank 0 that nobody sent)."""
    mpif90, mpiexec = (
        ("mpif90.openmpi", "mpiexec.openmpi") if flavour == "openmpi" else ("mpif90.mpich", "mpiexec.mpich")
    )
    need(mpif90, mpiexec, "gfortran")
    program = tmp_path / "f08"
    (tmp_path / "f08.f90").write_text(F08)
    subprocess.run([mpif90, "-o", str(program), str(tmp_path / "f08.f90")], check=True)
    out = tmp_path / "t.clog2"
    proc = paramedic("trace", "-out", str(out), "--", mpiexec, "-n", "2", str(program), env=OMPI_ENV)
    assert "not traced" not in proc.stderr  # every call it makes is wrapped
    trace = clog2.read(out.read_bytes())
    check_structure(
        trace, 2
    )  # every receive (Recv with a status or ignoring it, Waitall's) pairs with its send
    expected = Counter({STATES["Send"]: 3, STATES["Recv"]: 3, STATES["Isend"]: 3, STATES["Irecv"]: 3,
                        STATES["Waitall"]: 3, STATES["Barrier"]: 1, STATES["Allreduce"]: 1, STATES["Finalize"]: 1})  # fmt: skip
    assert state_counts(trace, 0) == state_counts(trace, 1) == expected
    assert int((trace.records.head[:, 3] == 7).sum()) == 2 * 2 * (3 + 3)


MPI4PY = """from mpi4py import MPI
import numpy as np
c = MPI.COMM_WORLD
a = np.zeros(4)
b = np.zeros(4 * c.size)
for i in range(5):
    if c.rank == 0:
        c.Send(a, dest=1, tag=i)
        c.send(i, dest=1, tag=i)
    elif c.rank == 1:
        c.Recv(a, source=0, tag=i)
        c.recv(source=0, tag=i)
c.Allreduce(MPI.IN_PLACE, a)
reqs = [c.Irecv(b[4 * j : 4 * j + 4], source=j, tag=9) for j in range(c.size)]
reqs += [c.Isend(a, dest=j, tag=9) for j in range(c.size)]
done = 0
while done < len(reqs):
    done += len(MPI.Request.Waitsome(reqs))
c.Gatherv(a, [b, [4] * c.size], root=0)
c.Alltoallv([b, [4] * c.size], [b.copy(), [4] * c.size])
"""


def test_mpi4py_calls_are_traced(tmp_path: Path) -> None:
    """mpi4py 4 on an MPI-4 library (the mpich wheel) calls the large-count functions (MPI_Send_c,
    MPI_Recv_c, MPI_Allreduce_c, MPI_Gatherv_c, ...), receives a pickled object with MPI_Mprobe and
    MPI_Mrecv_c, and here completes its requests with MPI_Waitsome: the trace held only MPI_Finalize before
    the large-count wrappers, and no receive of a pickled object or of a Waitsome before the others."""
    (tmp_path / "p.py").write_text(MPI4PY)
    out = tmp_path / "p.clog2"
    paramedic(
        "trace",
        "-out",
        str(out),
        "--",
        str(BIN / "mpiexec"),
        "-n",
        "2",
        str(BIN / "python"),
        str(tmp_path / "p.py"),
    )
    trace = clog2.read(out.read_bytes())
    check_structure(trace, 2)  # every receive (Mrecv's and Waitsome's too) pairs with its send
    both = {STATES["Allreduce"]: 1, STATES["Isend"]: 2, STATES["Irecv"]: 2, STATES["Gatherv"]: 1,
            STATES["Alltoallv"]: 1, STATES["Finalize"]: 1}  # fmt: skip
    for rank, own in (
        (0, {STATES["Send"]: 10}),
        (1, {STATES["Recv"]: 5, STATES["Mprobe"]: 5, STATES["Mrecv"]: 5}),
    ):
        counts = state_counts(trace, rank)
        assert counts.pop(STATES["Waitsome"]) >= 1
        assert counts == Counter({**own, **both})
    assert int((trace.records.head[:, 3] == 7).sum()) == 2 * (10 + 4)  # sends and receives, each once


FAMILIES_C = ROOT / "examples/trace/families.c"
FAMILIES_F90 = ROOT / "examples/trace/families.f90"
EXT_STATES = {"Exscan": 44, "Ibcast": 71, "Iallreduce": 73, "Send_init": 90, "Recv_init": 94, "Startall": 96,
              "Request_free": 97, "Comm_split": 52, "Cart_create": 54, "Win_create": 110, "Win_free": 112,
              "Win_fence": 113, "Win_lock": 114, "Win_unlock": 115, "Put": 124, "Get": 125, "File_open": 140,
              "File_close": 141, "File_read_at": 143, "File_write_at_all": 149, "Sendrecv_replace": 19,
              "Probe": 60, "Cancel": 98, "Wait": 20}  # fmt: skip


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_collective_persistent_one_sided_and_io_calls_are_traced(tmp_path: Path, flavour: str) -> None:
    """examples/trace/families.c: nonblocking collectives, persistent requests, one-sided and MPI-IO calls
    were absent from the trace without a word; now each is a state, the persistent receives pair with their
    sends, and the one call still not wrapped (a neighbourhood collective) is named on the closing line and
    in the run record."""
    mpicc, mpiexec = FLAVOURS[flavour]
    need(mpicc, mpiexec)
    program = tmp_path / "families"
    subprocess.run([mpicc, "-o", str(program), str(FAMILIES_C)], check=True)
    out, record = tmp_path / "f.clog2", tmp_path / "f.json"
    command = [mpiexec, "-n", "3", str(program), str(tmp_path / "io.dat")]
    proc = paramedic("trace", "-out", str(out), "--record", str(record), "--", *command, env=OMPI_ENV)
    assert proc.stderr.strip().endswith("absent from the trace if called): MPI_Neighbor_allgather")
    summary = json.loads(record.read_text())["trace"]
    assert summary["untraced_communication"] == ["MPI_Neighbor_allgather"]
    assert "MPI_Comm_rank" in summary["untraced_calls"]  # listed, but local: not called out
    # one machine, one clock: no offsets "measured" from ping-pongs on busy cores (MPICH's reached 3.5 ms)
    assert all(x == 0 for pair in summary["clock_offset_ns"].values() for x in pair)
    trace = clog2.read(out.read_bytes())
    check_structure(trace, 3)  # the persistent receives (completed by Waitall) pair with the Startall sends
    s = EXT_STATES
    expected = Counter(
        {
            s["Iallreduce"]: 3,
            s["Ibcast"]: 3,
            s["Startall"]: 3,
            s["Exscan"]: 3,
            s["Win_fence"]: 6,
            s["Put"]: 3,
            s["Win_lock"]: 3,
            s["Get"]: 3,
            s["Win_unlock"]: 3,
            s["Send_init"]: 1,
            s["Recv_init"]: 1,
            s["Request_free"]: 2,
            s["Win_create"]: 1,
            s["Win_free"]: 1,
            s["Cart_create"]: 1,
            s["File_open"]: 1,
            s["File_write_at_all"]: 1,
            s["File_read_at"]: 1,
            s["File_close"]: 1,
            STATES["Waitall"]: 6,
            STATES["Barrier"]: 1,
            STATES["Finalize"]: 1,
            50: 1,
            STATES["Irecv"]: 1,
            s["Cancel"]: 1,
            s["Wait"]: 1,
        }
    )  # fmt: skip  (50: MPI_Comm_free; the Irecv cancelled, waited for, no message)
    for rank in range(3):
        assert state_counts(trace, rank) == expected
    assert int((trace.records.head[:, 3] == 7).sum()) == 2 * 3 * 3  # each persistent send and receive, once
    assert int((trace.records.head[:, 3] == 8).sum()) == 3 * (
        3 + 3 + 3 + 1
    )  # Iallreduce, Ibcast, Exscan, Barrier


def test_fortran_persistent_one_sided_io_and_v_collective_calls_are_traced(tmp_path: Path) -> None:
    """examples/trace/families.f90 (Open MPI's Fortran functions call PMPI_* directly, so only Fortran
    wrappers see them): MPI_Gatherv, MPI_Probe, MPI_Sendrecv_replace, persistent requests, one-sided and
    MPI-IO calls were absent from its trace; the one left unwrapped is named."""
    need("mpif90.openmpi", "gfortran", "mpiexec.openmpi")
    program = tmp_path / "families"
    subprocess.run(["mpif90.openmpi", "-o", str(program), str(FAMILIES_F90)], check=True)
    out = tmp_path / "f.clog2"
    proc = paramedic("trace", "-out", str(out), "--", "mpiexec.openmpi", "-n", "3", str(program), cwd=tmp_path,
                     env=OMPI_ENV)  # fmt: skip
    assert proc.stderr.strip().endswith("absent from the trace if called): mpi_neighbor_allgather_")
    trace = clog2.read(out.read_bytes())
    check_structure(trace, 3)  # Startall's sends, Sendrecv_replace's and the probed Recv pair up
    s = EXT_STATES
    both = {s["Startall"]: 3, STATES["Waitall"]: 3, STATES["Gatherv"]: 3, s["Win_fence"]: 6, s["Put"]: 3,
            s["Sendrecv_replace"]: 3, s["Send_init"]: 1, s["Recv_init"]: 1, s["Request_free"]: 2,
            s["Win_create"]: 1, s["Win_free"]: 1, s["Comm_split"]: 1, s["Cart_create"]: 1, s["File_open"]: 1,
            s["File_write_at_all"]: 1, s["File_close"]: 1, STATES["Finalize"]: 1}  # fmt: skip
    own = {0: {STATES["Send"]: 3}, 1: {s["Probe"]: 3, STATES["Recv"]: 3}, 2: {}}
    for rank in range(3):
        assert state_counts(trace, rank) == Counter({**both, **own[rank]})
    assert int((trace.records.head[:, 3] == 7).sum()) == 2 * (3 * 3 * 2 + 3)


# Not Open MPI: its MPI_THREAD_MULTIPLE ranks took 0.4-24 s for the same run, untraced too, on a loaded
# machine (2 ranks of 3 threads on 2 busy cores); the tracer's locking does not depend on the MPI.
@pytest.mark.parametrize("flavour", ["mpich", "debian-mpich"])
def test_threads_calling_mpi_at_once_are_traced_each_on_its_own(tmp_path: Path, flavour: str) -> None:
    """examples/trace/threads.c (MPI_THREAD_MULTIPLE, two threads per rank exchanging at once): the
    tracer's buffer and tables were shared unguarded and every record said thread 0, so the two threads'
    states overlapped in one row; now each thread's states open and close in order under its own CLOG2
    thread number, every message pairs with its send, and the file round-trips through its metadata."""
    mpicc, mpiexec = FLAVOURS[flavour]
    need(mpicc, mpiexec)
    program = tmp_path / "threads"
    subprocess.run(
        [mpicc, "-pthread", "-o", str(program), str(ROOT / "examples/trace/threads.c")], check=True
    )
    out = tmp_path / "t.clog2"
    paramedic("trace", "-out", str(out), "--", mpiexec, "-n", "2", str(program), "30", env=OMPI_ENV)
    data = out.read_bytes()
    assert codec.decode(codec.encode(data).data) == data
    rec = clog2.read(data).records
    sends: Counter[tuple[int, int, int]] = Counter()
    recvs: Counter[tuple[int, int, int]] = Counter()
    for rank in range(2):
        mine = rec.take(np.flatnonzero(rec.head[:, 1] == rank))
        assert np.all(np.diff(mine.seconds()) >= 0)
        threads = Counter(mine.head[:, 2].tolist())
        assert sorted(threads) == [0, 1, 2] and threads[1] == threads[2] == 30 * 12  # 3 states, 2 messages
        open_state: dict[int, int | None] = {}
        for thread, rectype, body in zip(
            mine.head[:, 2].tolist(), mine.head[:, 3].tolist(), mine.body[:, :5].tolist(), strict=True
        ):
            if rectype == 5 and body[0] % 2 == 0:
                assert open_state.get(thread) is None, "a thread's state starts inside another"
                open_state[thread] = body[0] // 2
            elif rectype == 5:
                assert open_state.get(thread) == body[0] // 2, "a thread's state ends that did not start"
                open_state[thread] = None
            elif rectype == 7:
                key = (rank, body[2], body[3]) if body[0] == -101 else (body[2], rank, body[3])
                (sends if body[0] == -101 else recvs)[key] += 1
    assert sends == recvs and sum(sends.values()) == 2 * 2 * 2 * 30
