"""The tracer's cost is bounded (issue 46, item 3): examples/trace/poll.c polls as hpcc's RandomAccess does
(MPI_Test, MPI_Testany, MPI_Iprobe failing back to back, 64 bytes of CLOG2 each), under real mpiexec ranks.

- `--max-trace-size` holds: the merged file is at most the bound, every rank stops recording at a call's
  boundary, and the closing line and the run record say, per rank, from when and how many calls were left
  out: exactly the calls the program made and the trace does not hold. The file stays valid: CLOG2 read
  back and rewritten byte for byte, every state closed, the codec's metadata regenerating it, `paramedic
  report` drawing it.
- A rank's memory is its buffer, not its trace: 24 MB of records logged through a 1 MiB buffer raise the
  ranks' peak resident memory by about that buffer.
- The run says what it wrote: each rank's bytes are the bytes of its records in the file.
- The disk is about one trace, not two: each rank frees its log on disk as the merge reads it (holes
  punched), so the logs still to merge and the merged file written so far hold about one trace between
  them, sampled all through a slowed merge.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from paramedic.trace import clog2, codec
from tests.conftest import paramedic
from tests.integration.test_trace import OMPI_ENV, ROOT, need
from tests.integration.test_trace_tree import FLAVOURS

pytestmark = pytest.mark.integration

POLL = ROOT / "examples/trace/poll.c"
FINALIZE = 2  # clogtrace_states.h


def build(tmp_path: Path, flavour: str) -> tuple[Path, str]:
    mpicc, mpiexec = FLAVOURS[flavour]
    need(mpicc, mpiexec)
    program = tmp_path / "poll"
    subprocess.run([mpicc, "-O2", "-o", str(program), str(POLL)], check=True)
    return program, mpiexec


def traced(
    tmp_path: Path, flavour: str, rounds: int, spin_us: int, *options: str
) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, object], dict[int, tuple[int, int]]]:
    """poll.c run by 2 ranks under the tracer with `options`: the run, the file, the record's trace
    section, and per rank the polls it made and its peak resident memory (kB) before MPI_Finalize."""
    tmp_path.mkdir(exist_ok=True)
    program, mpiexec = build(tmp_path, flavour)
    out, record = tmp_path / "run.clog2", tmp_path / "run.json"
    proc = paramedic("trace", "-out", str(out), "--record", str(record), *options, "--",
                     mpiexec, "-n", "2", str(program), str(rounds), str(spin_us), env=OMPI_ENV)  # fmt: skip
    printed = {
        int(m[1]): (int(m[2]), int(m[3]))
        for m in re.finditer(r"rank (\d+) polls (\d+) vmhwm_kb (\d+)", proc.stdout)
    }
    assert sorted(printed) == [0, 1], proc.stdout
    return proc, out, json.loads(record.read_text())["trace"], printed


def closing_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("paramedic: trace written")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def calls_made(rank: int, polls: int, rounds: int) -> int:
    """The traced calls poll.c makes on a rank of 2: its polls, per round MPI_Irecv and MPI_Send (rank 0)
    or MPI_Recv and MPI_Send (rank 1), and one MPI_Barrier (MPI_Finalize is not a call a bound drops)."""
    return polls + 2 * rounds + 1


def states_per_rank(trace: clog2.Trace) -> dict[int, Counter[int]]:
    """Per rank, the calls the trace holds by state, checking that each starts and ends in order."""
    rec = trace.records
    out: dict[int, Counter[int]] = {}
    for rank in np.unique(rec.head[:, 1]).tolist():
        mine = rec.take(np.flatnonzero(rec.head[:, 1] == rank))
        assert np.all(np.diff(mine.seconds()) >= 0)
        bare = mine.head[:, 3] == 5
        etypes = mine.body[bare, 0]
        assert np.all(etypes[0::2] % 2 == 0) and np.all(etypes[1::2] == etypes[0::2] + 1)  # whole states
        out[rank] = Counter((etypes[0::2] // 2).tolist())
    return out


def rank_bytes_in(trace: clog2.Trace) -> dict[str, int]:
    sizes = clog2.HEADER_SIZE + np.asarray(clog2.BODY_SIZE)[trace.records.head[:, 3]]
    ranks = trace.records.head[:, 1]
    return {str(r): int(sizes[ranks == r].sum()) for r in np.unique(ranks).tolist()}


@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_a_bound_holds_a_polling_trace_and_says_what_it_left_out(tmp_path: Path, flavour: str) -> None:
    bound, rounds = 1 << 20, 200
    proc, out, summary, printed = traced(tmp_path, flavour, rounds, 2000, "--max-trace-size", "1M")
    data = out.read_bytes()
    assert len(data) <= bound  # never more (docs/TRACE.md: no slack)
    line = closing_line(proc)
    left = summary["left_out"]
    assert isinstance(left, dict) and summary["max_trace_bytes"] == bound and summary["bound"] == "given"
    assert "LEFT OUT by the bound of 1.0 MB (--max-trace-size)" in line
    trace = clog2.read(data)
    assert clog2.write(trace) == data
    held = states_per_rank(trace)
    for rank in (0, 1):
        polls = printed[rank][0]
        kept = sum(n for state, n in held[rank].items() if state != FINALIZE)
        assert held[rank][FINALIZE] == 1
        if str(rank) not in left:  # the rank held every call it made
            assert kept == calls_made(rank, polls, rounds)
            continue
        said = left[str(rank)]
        # a rank cut used its share: half of what the preamble, the last block and the packing leave
        assert summary["rank_bytes"][str(rank)] > 0.4 * bound  # type: ignore[index]
        assert kept + said["calls"] == calls_made(rank, polls, rounds)  # exactly what the file lacks
        mine = trace.records.take(np.flatnonzero(trace.records.head[:, 1] == rank))
        last_call = mine.seconds()[mine.head[:, 3] == 5][-3]  # before MPI_Finalize's two events
        assert last_call <= said["from_seconds"] <= mine.seconds()[-1]
        assert f"rank {rank} from {said['from_seconds']:.3f} s ({said['calls']:,} calls" in line
    assert "0" in left  # rank 0 polls most: its share ran out
    assert summary["rank_bytes"] == rank_bytes_in(trace)
    assert codec.decode(codec.encode(data).data) == data
    paramedic("report", str(out), "-out", str(tmp_path / "run.html"))
    assert (tmp_path / "run.html").stat().st_size > 100_000


def test_a_ranks_memory_is_its_buffer_not_its_trace(tmp_path: Path) -> None:
    """Peak resident memory of each traced rank, a short run against one that logs 20 times its buffer."""
    buffer = 1 << 20
    options = ("--buffer", str(buffer), "--max-trace-size", "48M")
    _, _, small, short = traced(tmp_path / "short", "openmpi", 2, 200, *options)
    _, out, large, long = traced(tmp_path / "long", "openmpi", 400, 2000, *options)
    logged = large["rank_bytes"]
    assert isinstance(logged, dict) and max(logged.values()) > 10 * buffer, logged
    assert out.stat().st_size <= 48 << 20
    for rank in (0, 1):  # rank 0 polls most; rank 1's polls follow the machine's load
        grown_kb = long[rank][1] - short[rank][1]
        assert grown_kb < (buffer >> 10) + 3 * 1024, (rank, short, long)  # the buffer, and 3 MB of noise


def test_the_run_says_what_it_wrote_and_leaves_out_nothing_unbounded(tmp_path: Path) -> None:
    proc, out, summary, printed = traced(tmp_path, "openmpi", 20, 200)
    data = out.read_bytes()
    trace = clog2.read(data)
    assert summary["left_out"] == {} and summary["bound"] == "default"
    assert int(summary["max_trace_bytes"]) >= 64 << 20  # type: ignore[call-overload]
    assert summary["rank_bytes"] == rank_bytes_in(trace)
    assert summary["bytes"] == len(data)
    held = states_per_rank(trace)
    for rank in (0, 1):
        assert sum(n for s, n in held[rank].items() if s != FINALIZE) == calls_made(
            rank, printed[rank][0], 20
        )
    line = closing_line(proc)
    assert "nothing left out" in line and "LEFT OUT" not in line
    rank_bytes = summary["rank_bytes"]
    assert isinstance(rank_bytes, dict)
    assert all(
        f"{r}: {b / 1e6:,.1f} MB" in line or f"{r}: {b:,} bytes" in line for r, b in rank_bytes.items()
    )


def test_a_bound_below_the_least_trace_is_refused(tmp_path: Path) -> None:
    proc = paramedic("trace", "-out", str(tmp_path / "t.clog2"), "--max-trace-size", "64K", "--",
                     "mpiexec.openmpi", "-n", "2", "true", check=False)  # fmt: skip
    assert proc.returncode == 2 and "--max-trace-size must be at least 131,072 bytes" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_bound_holds_with_threads_calling_mpi_at_once(tmp_path: Path) -> None:
    """examples/trace/threads.c (MPI_THREAD_MULTIPLE, two threads a rank exchanging at once): the room of
    each call's final event is kept from its start, so the file stays within the bound and every thread's
    states stay whole."""
    mpicc, mpiexec = FLAVOURS["openmpi"]
    need(mpicc, mpiexec)
    program = tmp_path / "threads"
    subprocess.run(
        [mpicc, "-pthread", "-o", str(program), str(ROOT / "examples/trace/threads.c")], check=True
    )
    bound, out = 200 << 10, tmp_path / "t.clog2"
    proc = paramedic("trace", "-out", str(out), "--max-trace-size", "200K", "--", mpiexec, "-n", "2",
                     str(program), "3000", env=OMPI_ENV)  # fmt: skip
    assert "LEFT OUT" in closing_line(proc)
    data = out.read_bytes()
    assert len(data) <= bound
    rec = clog2.read(data).records
    for rank in (0, 1):
        for thread in (0, 1, 2):
            mine = rec.take(np.flatnonzero((rec.head[:, 1] == rank) & (rec.head[:, 2] == thread)))
            etypes = mine.body[mine.head[:, 3] == 5, 0]
            assert np.all(etypes[0::2] % 2 == 0) and np.all(etypes[1::2] == etypes[0::2] + 1)
    assert codec.decode(codec.encode(data).data) == data


def allocated(top: Path) -> int:
    """Bytes of disk allocated to the files under `top` (a punched hole holds none)."""
    total = 0
    for folder, _, files in os.walk(top):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def peak_disk(tmp_path: Path, *env: tuple[str, str]) -> tuple[int, int]:
    """poll.c's trace (2 ranks, tens of MB) merged in 16 KiB chunks (a merge of seconds), and the most disk
    its directory held meanwhile (sampled every few ms), with the trace's size."""
    tmp_path.mkdir()
    program, mpiexec = build(tmp_path, "openmpi")
    out = tmp_path / "out" / "run.clog2"
    out.parent.mkdir()
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], allocated(out.parent))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        paramedic("trace", "-out", str(out), "--max-trace-size", "48M", "--", mpiexec, "-n", "2",
                  str(program), "20", "2000", env={**OMPI_ENV, "PARAMEDIC_TRACE_CHUNK": "16384", **dict(env)})  # fmt: skip
    finally:
        stop.set()
        sampler.join()
    return peak[0], out.stat().st_size


def test_the_logs_are_freed_as_they_are_merged(tmp_path: Path) -> None:
    """The peak is about the trace (its logs freed 1 MiB at a time, a chunk or two in flight per rank),
    where keeping the logs (PARAMEDIC_TRACE_KEEP, as every merge did before) holds two traces."""
    peak, size = peak_disk(tmp_path / "freed")
    assert size > 16 << 20, size  # enough trace for 1 MiB steps to matter
    assert peak < 1.15 * size + (6 << 20), (peak, size)
    kept, size = peak_disk(tmp_path / "kept", ("PARAMEDIC_TRACE_KEEP", "1"))
    assert kept > 1.8 * size, (kept, size)  # the sampling sees both copies when both are there
