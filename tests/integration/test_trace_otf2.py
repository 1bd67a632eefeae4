"""`paramedic convert TRACE.clog2 --otf2 DIR` (issue 46, item 2) on traces of real MPI programs (Debian's
LAMMPS, examples/trace/random_comm.c), opened with Debian's `otf2-print` (OTF2's own reader, a build other
than the wheel that wrote the archive), every event compared with the CLOG2 records it came from; then with
ViTE under Xvfb, whose window must draw the ranks' states and messages. Each check is shown to fail on an
archive that differs (a changed tag, an empty ViTE window). Bad input: one line, its exit code, nothing
left at DIR or beside it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from paramedic.trace import clog2
from tests.conftest import paramedic
from tests.integration.test_trace import MELT, OMPI_ENV, RANDOM_COMM, expected_states, need

pytestmark = pytest.mark.integration

BLOCKING = {  # the collectives paramedic writes as MpiCollectiveBegin/End (trace/otf2_out.py COLLECTIVES)
    "MPI_Barrier",
    "MPI_Bcast",
    "MPI_Reduce",
    "MPI_Allreduce",
    "MPI_Scan",
    "MPI_Allgather",
    "MPI_Gather",
    "MPI_Scatter",
    "MPI_Alltoall",
}


def need_viewers(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        message = f"missing {', '.join(missing)} (make otf2-view installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


# -- what the CLOG2 file says, and what otf2-print reads ---------------------------------------------------


def expected_events(data: bytes) -> dict[int, list[tuple]]:
    """Per rank (thread 0: these programs call MPI from one thread), the events the CLOG2 records make, in
    file order, times in nanoseconds from the file's first record: a plain loop over every record."""
    trace = clog2.read(data)
    rec = trace.records
    names = {}
    for body in rec.body[rec.head[:, 3] == 2]:
        names[int(body[0])] = body[10:18].astype(">i4").tobytes().split(b"\0")[0].decode()
    seconds = rec.seconds()
    base = int(np.rint(seconds.min() * 1e9))
    out: dict[int, list[tuple]] = defaultdict(list)
    open_coll: dict[int, str] = {}
    for t, head, body in zip(seconds.tolist(), rec.head.tolist(), rec.body[:, :5].tolist(), strict=True):
        rank, rectype, etype = head[1], head[3], body[0]
        tick = int(np.rint(t * 1e9)) - base
        if rectype == 5 and etype >= 0:
            name = names[etype // 2]
            if etype % 2 == 0:
                out[rank].append(("ENTER", tick, name))
            else:
                if rank in open_coll:
                    out[rank].append(("MPI_COLLECTIVE_END", tick, open_coll.pop(rank)))
                out[rank].append(("LEAVE", tick, name))
        elif rectype == 7 and etype in (-101, -102):
            kind = "MPI_SEND" if etype == -101 else "MPI_RECV"
            out[rank].append((kind, tick, body[2], body[3], body[4]))
        elif rectype == 8 and names[etype // 2] in BLOCKING:
            out[rank].append(("MPI_COLLECTIVE_BEGIN", tick))
            open_coll[rank] = names[etype // 2][4:].upper()
    return dict(out)


LINE = re.compile(r"^(\w+)\s+(\d+)\s+(\d+)\s*(.*)$")


def printed_events(archive: Path) -> dict[int, list[tuple]]:
    """Per location, the events `otf2-print` reads from the archive, as `expected_events` writes them."""
    text = subprocess.run(
        ["otf2-print", str(archive / "traces.otf2")], check=True, capture_output=True, text=True
    ).stdout
    out: dict[int, list[tuple]] = defaultdict(list)
    for line in text.splitlines():
        m = LINE.match(line)
        if not m or m[1] in ("Event",):
            continue
        kind, loc, tick, attrs = m[1], int(m[2]), int(m[3]), m[4]
        if kind in ("ENTER", "LEAVE"):
            out[loc].append((kind, tick, re.search(r'Region: "([^"]+)"', attrs)[1]))  # type: ignore[index]
        elif kind in ("MPI_SEND", "MPI_RECV"):
            peer = int(re.search(r"(?:Receiver|Sender): (\d+)", attrs)[1])  # type: ignore[index]
            assert 'Communicator: "MPI_COMM_WORLD"' in attrs
            tag = int(re.search(r"Tag: (\d+)", attrs)[1])  # type: ignore[index]
            length = int(re.search(r"Length: (\d+)", attrs)[1])  # type: ignore[index]
            out[loc].append((kind, tick, peer, tag, length))
        elif kind == "MPI_COLLECTIVE_BEGIN":
            out[loc].append((kind, tick))
        elif kind == "MPI_COLLECTIVE_END":
            out[loc].append((kind, tick, re.search(r"Operation: (\w+)", attrs)[1]))  # type: ignore[index]
        else:
            out[loc].append((kind, tick))
    return dict(out)


def definitions(archive: Path) -> str:
    return subprocess.run(
        ["otf2-print", "-G", str(archive / "traces.otf2")], check=True, capture_output=True, text=True
    ).stdout


def check_archive(data: bytes, archive: Path) -> None:
    """The archive holds exactly the events of the CLOG2 file, per rank, in nanoseconds; its definitions
    give the clock, a location group and location per rank, regions named by the MPI functions."""
    expected, printed = expected_events(data), printed_events(archive)
    assert sorted(printed) == sorted(expected)
    for rank in expected:
        assert printed[rank] == expected[rank], f"rank {rank}"
    defs = definitions(archive)
    assert "Ticks per Seconds: 1000000000, Global Offset: 0" in defs
    last = max(e[1] for events in expected.values() for e in events)
    assert f"Length: {last}," in defs
    for rank in expected:
        assert re.search(rf'LOCATION_GROUP\s+{rank}\s+Name: "rank {rank}" <\d+>, Type: PROCESS', defs)
        assert re.search(rf'LOCATION\s+{rank}\s+Name: "rank {rank} thread 0" <\d+>, Type: CPU_THREAD', defs)
    assert re.search(r'COMM\s+0\s+Name: "MPI_COMM_WORLD" <\d+>, Group: "" <1>', defs)
    assert re.search(r"GROUP\s+1\s+Name: \"\" <0>, Type: COMM_GROUP, Paradigm: MPI", defs)


def trace(tmp_path: Path, command: list[str]) -> Path:
    out = tmp_path / "run.clog2"
    paramedic("trace", "-out", str(out), "--", *command, env=OMPI_ENV)
    return out


def convert(source: Path, archive: Path) -> str:
    done = paramedic("convert", str(source), "--otf2", str(archive))
    assert f"written to {archive}/traces.otf2" in done.stderr
    assert sorted(p.name for p in archive.parent.iterdir() if p.name.startswith(".")) == []  # no temporary
    return done.stderr


# -- real programs -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_comm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/trace/random_comm.c built with Open MPI (as tests/integration/test_trace.py builds it)."""
    need("mpicc.openmpi", "mpiexec.openmpi")
    program = tmp_path_factory.mktemp("random-comm") / "random_comm"
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(program), str(RANDOM_COMM)], check=True)
    return program


def test_lammps_trace_opens_in_otf2_print(tmp_path: Path) -> None:
    need("lmp", "mpiexec.openmpi", str(MELT))
    need_viewers("otf2-print")
    (tmp_path / "in.melt").write_text(MELT.read_text().replace("run\t\t250", "run\t\t100"))
    source = trace(tmp_path, ["mpiexec.openmpi", "-n", "2", "lmp", "-in", str(tmp_path / "in.melt"), "-log",
                              "none", "-screen", "none"])  # fmt: skip
    data = source.read_bytes()
    said = convert(source, tmp_path / "otf2")
    check_archive(data, tmp_path / "otf2")
    events = printed_events(tmp_path / "otf2")
    assert {k for e in events.values() for k, *_ in e} >= {"ENTER", "LEAVE", "MPI_SEND", "MPI_RECV",
                                                         "MPI_COLLECTIVE_BEGIN", "MPI_COLLECTIVE_END"}  # fmt: skip
    sends = sum(e[0] == "MPI_SEND" for ev in events.values() for e in ev)
    assert sends > 100 and f"{sends:,} sends" in said
    # the messages pair up: every send (sender, receiver, tag, bytes) has its receive
    sent = Counter((loc, e[2], e[3], e[4]) for loc, ev in events.items() for e in ev if e[0] == "MPI_SEND")
    got = Counter((e[2], loc, e[3], e[4]) for loc, ev in events.items() for e in ev if e[0] == "MPI_RECV")
    assert sent == got
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "otf2").stat().st_mode & 0o777 == 0o777 & ~mask


def test_random_comm_calls_per_rank(tmp_path: Path, random_comm: Path) -> None:
    """Enters and leaves per rank and MPI function are the calls random_comm makes (its own generator)."""
    need_viewers("otf2-print")
    steps, seed, size = 200, 5, 3
    source = trace(tmp_path, ["mpiexec.openmpi", "-n", str(size), str(random_comm), str(steps), str(seed)])
    convert(source, tmp_path / "otf2")
    check_archive(source.read_bytes(), tmp_path / "otf2")
    events = printed_events(tmp_path / "otf2")
    states = {14: "MPI_Isend", 17: "MPI_Irecv", 18: "MPI_Sendrecv", 21: "MPI_Waitall", 31: "MPI_Bcast",
              33: "MPI_Allreduce", 2: "MPI_Finalize"}  # fmt: skip
    calls = Counter({states[s]: n for s, n in expected_states(steps, seed, size).items()})
    for rank in range(size):
        enters = Counter(e[2] for e in events[rank] if e[0] == "ENTER")
        leaves = Counter(e[2] for e in events[rank] if e[0] == "LEAVE")
        assert enters == leaves == calls, rank


def test_the_check_fails_on_a_changed_archive(tmp_path: Path, random_comm: Path) -> None:
    """check_archive fails when one message's tag differs from the CLOG2 file's, and when the times are not
    the trace's nanoseconds."""
    need_viewers("otf2-print")
    source = trace(tmp_path, ["mpiexec.openmpi", "-n", "2", str(random_comm), "30", "3"])
    data = bytearray(source.read_bytes())
    parsed = clog2.read(bytes(data))
    rec = parsed.records
    send = int(np.flatnonzero((rec.head[:, 3] == 7) & (rec.body[:, 0] == -101))[0])
    rec.body[send, 3] += 1
    changed = tmp_path / "changed.clog2"
    changed.write_bytes(clog2.write(parsed))
    convert(changed, tmp_path / "changed")
    check_archive(changed.read_bytes(), tmp_path / "changed")  # true to its own file
    with pytest.raises(AssertionError):
        check_archive(bytes(data), tmp_path / "changed")
    micro = clog2.read(bytes(data))  # every time one microsecond later on rank 1
    later = micro.records.head[:, 1] == 1
    micro.records.time[later] = (micro.records.seconds()[later] + 1e-6).view(np.uint64)
    (tmp_path / "later.clog2").write_bytes(clog2.write(micro))
    convert(tmp_path / "later.clog2", tmp_path / "later")
    with pytest.raises(AssertionError):
        check_archive(bytes(data), tmp_path / "later")


# -- ViTE ----------------------------------------------------------------------------------------------------

SCREEN = (1280, 800)
TIMELINE = (220, 130, 1025, 580)  # x0, y0, x1, y1: ViTE's drawing area in its window at this screen size


def read_ppm(path: Path) -> np.ndarray:
    """A binary PPM (P6, 8 bits) as an (height, width, 3) array."""
    raw = path.read_bytes()
    fields = raw.split(maxsplit=4)
    assert fields[0] == b"P6" and fields[3] in (b"255", b"65535"), fields[:4]
    width, height = int(fields[1]), int(fields[2])
    if fields[3] == b"65535":  # 16 bits a sample, most significant byte first
        wide = np.frombuffer(fields[4][: width * height * 6], ">u2").reshape(height, width, 3)
        return (wide >> 8).astype(np.uint8)
    return np.frombuffer(fields[4][: width * height * 3], np.uint8).reshape(height, width, 3)


def drawn(pixels: np.ndarray) -> dict[str, int]:
    """In ViTE's timeline: pixels of states (ViTE 1.2 colours an OTF2 region itself, not from the archive:
    black for nearly every region, a shaded blue for the second; the ranks' time outside calls is grey),
    and of message arrows (white); and the distinct colours (in steps of 16 per channel)."""
    x0, y0, x1, y1 = TIMELINE
    area = pixels[y0:y1, x0:x1].astype(np.int64)
    r, g, b = area[..., 0], area[..., 1], area[..., 2]
    return {
        "states": int(np.count_nonzero((r < 40) & (g < 40) & ((b < 10) | (b >= 120)))),
        "outside": int(np.count_nonzero((r == 128) & (g == 128) & (b == 140))),
        "arrows": int(np.count_nonzero((r > 240) & (g > 240) & (b > 240))),
        "colours": len(np.unique(area.reshape(-1, 3) // 16, axis=0)),
    }


def check_drawn(counts: dict[str, int]) -> None:
    """Not an empty window: the ranks' states and the messages between them are drawn."""
    assert counts["states"] >= 5000, counts
    assert counts["outside"] >= 1000, counts
    assert counts["arrows"] >= 1000, counts
    assert counts["colours"] >= 3, counts


def vite_screenshot(archive: Path | None, out: Path, wait: float = 60.0) -> dict[str, int]:
    """ViTE opened on `archive` (nothing when None) under an Xvfb of its own; screenshots of the whole
    screen (`import`) until the timeline is drawn or `wait` seconds pass; the last one's counts (also
    written to `out` as PNG for a person)."""
    read, write = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", f"{SCREEN[0]}x{SCREEN[1]}x24", "-nolisten", "tcp"],
        pass_fds=(write,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    viewer = None
    try:
        with os.fdopen(read) as fh:
            display = ":" + fh.readline().strip()
        env = {**os.environ, "DISPLAY": display, "XDG_RUNTIME_DIR": str(out.parent)}
        command = ["vite"] + ([str(archive / "traces.otf2")] if archive else [])
        viewer = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shot = out.with_suffix(".ppm")
        counts: dict[str, int] = {}
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(2)
            subprocess.run(["import", "-display", display, "-window", "root", "-depth", "8", str(shot)], check=True,
                           capture_output=True, timeout=60)  # fmt: skip
            counts = drawn(read_ppm(shot))
            try:
                check_drawn(counts)
                break
            except AssertionError:
                continue
        subprocess.run(["import", "-display", display, "-window", "root", str(out)], check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        assert viewer.poll() is None, f"vite exited {viewer.returncode}"
        return counts
    finally:
        for proc in (viewer, xvfb):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_vite_draws_the_trace(tmp_path: Path, random_comm: Path) -> None:
    need_viewers("vite", "Xvfb", "import", "otf2-print")
    source = trace(tmp_path, ["mpiexec.openmpi", "-n", "3", str(random_comm), "40", "11"])
    convert(source, tmp_path / "otf2")
    counts = vite_screenshot(tmp_path / "otf2", tmp_path / "vite.png")
    check_drawn(counts)
    assert (tmp_path / "vite.png").stat().st_size > 20_000
    # the check fails on ViTE's window with no trace open
    empty = vite_screenshot(None, tmp_path / "empty.png", wait=8)
    with pytest.raises(AssertionError):
        check_drawn(empty)
