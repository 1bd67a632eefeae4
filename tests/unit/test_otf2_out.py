"""`paramedic convert --otf2` (trace/otf2_out.py) on small CLOG2 files made here, read back with the otf2
wheel's reader: events and definitions, a damaged but readable trace mended as the closing line says, bad
input refused in one line with nothing left at DIR or beside it, an interrupted conversion leaving nothing."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from paramedic import cli
from paramedic.trace import clog2, otf2_out
from tests.unit.test_trace_overview import synthetic

otf2 = pytest.importorskip("otf2")

STATES = {10: "MPI_Send", 16: "MPI_Recv", 33: "MPI_Allreduce"}


def _words(text: str, n: int) -> list[int]:
    return np.frombuffer(text.encode().ljust(4 * n, b"\0"), ">i4").astype(np.int32).tolist()


def clog2_file(records: list[tuple[float, int, int, int, list[int]]], ranks: int) -> bytes:
    """A CLOG2 file (MPE2's layout) of the state definitions at time 0, then `records` in this order: (time,
    rank, thread, rectype, body words)."""
    rows = [
        (0.0, 0, 0, 2, [s, 2 * s, 2 * s + 1, 0, *_words("1 2 3", 6), *_words(n, 8)])
        for s, n in STATES.items()
    ]
    rows += records
    body = np.zeros((len(rows), clog2.BODY_WORDS), np.int32)
    for i, row in enumerate(rows):
        body[i, : len(row[4])] = row[4]
    rec = clog2.Records(
        np.asarray([r[0] for r in rows], np.float64).view(np.uint64),
        np.asarray([[0, r[1], r[2], r[3]] for r in rows], np.int32),
        body,
    )
    table = clog2.world_comm_table()

    def file(fptr: int) -> bytes:
        pre = clog2.make_preamble(ranks, fptr)
        return clog2.write(clog2.Trace(pre, True, clog2.DEFAULT_BLOCK_SIZE, rec, (0, 0, 0), [], table))

    return file(len(file(clog2.PREAMBLE_SIZE)) - len(table))


def enter(t: float, rank: int, state: int, thread: int = 0) -> tuple:
    return (t, rank, thread, 5, [2 * state])


def leave(t: float, rank: int, state: int, thread: int = 0) -> tuple:
    return (t, rank, thread, 5, [2 * state + 1])


def read(archive: Path) -> tuple[dict[str, list[tuple]], object]:
    """Per location name, its events as tuples (kind, tick, what), and the definitions."""
    out: dict[str, list[tuple]] = defaultdict(list)
    with otf2.reader.open(str(archive / "traces.otf2")) as trace:
        for location, ev in trace.events:
            kind = type(ev).__name__
            if kind in ("Enter", "Leave"):
                out[location.name].append((kind, ev.time, ev.region.name))
            elif kind in ("MpiSend", "MpiRecv"):
                peer = ev.receiver if kind == "MpiSend" else ev.sender
                out[location.name].append((kind, ev.time, peer, ev.msg_tag, ev.msg_length))
            elif kind == "MpiCollectiveEnd":
                out[location.name].append(
                    (kind, ev.time, str(ev.collective_op).rsplit(".", 1)[-1], ev.root, ev.size_sent)
                )
            else:
                out[location.name].append((kind, ev.time))
        return dict(out), trace.definitions


def test_events_and_mending(tmp_path: Path) -> None:
    us = 1e-6
    data = clog2_file(
        [
            enter(1 * us, 0, 10), enter(1 * us, 1, 16),
            (2 * us, 0, 0, 7, [-101, 0, 1, 7, 800]),
            leave(3 * us, 0, 10),
            (3 * us, 1, 0, 7, [-102, 0, 0, 7, 800]),
            leave(3.5 * us, 1, 16),
            (3.6 * us, 1, 0, 7, [-101, 0, 7, 1, 8]),  # a message to rank 7 of 2: left out
            leave(4 * us, 0, 16),  # a final event with no start: left out
            enter(5 * us, 0, 33),
            (5.5 * us, 0, 0, 8, [66, -1, 64]),  # Allreduce's collective event
            enter(4.5 * us, 0, 10),  # back in time: moved up to 5.5 us
            leave(7 * us, 0, 10),  # ... and the Allreduce never ends: closed at 7 us
            enter(8 * us, 1, 10, thread=2), leave(9 * us, 1, 10, thread=2),  # a second thread of rank 1
        ],
        2,
    )  # fmt: skip
    (tmp_path / "t.clog2").write_bytes(data)
    counts = otf2_out.convert(tmp_path / "t.clog2", tmp_path / "out")
    assert (counts.moved, counts.unmatched, counts.closed, counts.no_peer) == (1, 1, 1, 1)
    assert (counts.enters, counts.leaves, counts.sends, counts.receives, counts.collectives) == (
        5,
        5,
        1,
        1,
        1,
    )
    events, defs = read(tmp_path / "out")
    assert events["rank 0 thread 0"] == [
        ("Enter", 1000, "MPI_Send"),
        ("MpiSend", 2000, 1, 7, 800),
        ("Leave", 3000, "MPI_Send"),
        ("Enter", 5000, "MPI_Allreduce"),
        ("MpiCollectiveBegin", 5500),
        ("Enter", 5500, "MPI_Send"),
        ("Leave", 7000, "MPI_Send"),
        ("MpiCollectiveEnd", 7000, "ALLREDUCE", otf2_out.UNDEFINED, 64),
        ("Leave", 7000, "MPI_Allreduce"),
    ]
    assert events["rank 1 thread 0"] == [
        ("Enter", 1000, "MPI_Recv"),
        ("MpiRecv", 3000, 0, 7, 800),
        ("Leave", 3500, "MPI_Recv"),
    ]
    assert events["rank 1 thread 2"] == [("Enter", 8000, "MPI_Send"), ("Leave", 9000, "MPI_Send")]
    assert defs.clock_properties.timer_resolution == 10**9  # type: ignore[attr-defined]
    groups = {loc.name: loc.group.name for loc in defs.locations}  # type: ignore[attr-defined]
    assert groups == {"rank 0 thread 0": "rank 0", "rank 1 thread 0": "rank 1", "rank 1 thread 2": "rank 1"}
    regions = {r.name: str(r.region_role).rsplit(".", 1)[-1] for r in defs.regions}  # type: ignore[attr-defined]
    assert regions == {"MPI_Send": "POINT2POINT", "MPI_Recv": "POINT2POINT", "MPI_Allreduce": "COLL_ALL2ALL"}
    line = otf2_out.summary_line(counts)
    assert "1 times moved up" in line and "1 final events with no start left out" in line
    assert "1 calls left open closed" in line and "1 messages with no rank of the file as peer" in line


def convert(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["convert", *args])
    return code, capsys.readouterr().err


def leftovers(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name.startswith("."))


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = clog2_file([enter(1e-6, 0, 10), leave(2e-6, 0, 10)], 1)
    (tmp_path / "not.clog2").write_bytes(b"hello, not a trace\n" * 100)
    (tmp_path / "cut.clog2").write_bytes(good[: len(good) // 2 + 100])
    (tmp_path / "good.clog2").write_bytes(good)
    (tmp_path / "dir.clog2").mkdir()
    for name, code in (("not.clog2", 3), ("cut.clog2", 3), ("missing.clog2", 3), ("dir.clog2", 3)):
        got, err = convert(capsys, str(tmp_path / name), "--otf2", str(tmp_path / "out"))
        assert got == code, (name, err)
        assert err.startswith("paramedic: error: ") and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    (tmp_path / "dir.clog2").rmdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    got, err = convert(capsys, str(tmp_path / "good.clog2"), "--otf2", str(tmp_path / "full"))
    assert (
        got == 6
        and "already exists" in err
        and sorted(p.name for p in (tmp_path / "full").iterdir()) == ["x"]
    )
    (tmp_path / "file").write_text("x")
    got, err = convert(capsys, str(tmp_path / "good.clog2"), "--otf2", str(tmp_path / "file"))
    assert got == 6 and (tmp_path / "file").read_text() == "x" and leftovers(tmp_path) == []
    got, err = convert(capsys, str(tmp_path / "good.clog2"), "--otf2", str(tmp_path / "no" / "out"))
    assert got == 6 and err.count("\n") == 1
    got, err = convert(capsys, str(tmp_path / "good.clog2"))
    assert got == 2 and "--otf2" in err
    (tmp_path / "empty").mkdir()  # an empty directory is taken
    got, err = convert(capsys, str(tmp_path / "good.clog2"), "--otf2", str(tmp_path / "empty"))
    assert got == 0 and "2 events on 1 locations" in err, err
    assert (tmp_path / "empty" / "traces.otf2").is_file() and leftovers(tmp_path) == []


def test_a_failed_conversion_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.clog2").write_bytes(clog2_file([enter(1e-6, 0, 10), leave(2e-6, 0, 10)], 1))

    def broken(self: object, *args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(otf2_out.Writer, "write", broken)
    with pytest.raises(KeyboardInterrupt):
        otf2_out.convert(tmp_path / "t.clog2", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.clog2"]


def test_ranks_and_threads_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(clog2_file([enter(1e-6, 0, 10), leave(2e-6, 0, 10, thread=5000)], 1))
    (tmp_path / "t.clog2").write_bytes(data)
    got, err = convert(capsys, str(tmp_path / "t.clog2"), "--otf2", str(tmp_path / "out"))
    assert got == 3 and "thread 5000" in err and leftovers(tmp_path) == []


def test_buffers_written_as_they_fill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With OTF2's smallest chunks, one a location, its buffer is written to its file many times during the
    conversion: every event still comes back, in order, with its time (the memory callbacks' path)."""
    monkeypatch.setattr(otf2_out, "CHUNK_SIZE", 256 << 10)
    monkeypatch.setattr(otf2_out, "CHUNKS", 1)
    data = synthetic(2, 5000)
    (tmp_path / "t.clog2").write_bytes(data)
    counts = otf2_out.convert(tmp_path / "t.clog2", tmp_path / "out")
    rec = clog2.read(data).records
    ticks = np.rint(rec.seconds() * 1e9).astype(np.int64) - int(np.rint(rec.seconds().min() * 1e9))
    events, _ = read(tmp_path / "out")
    for rank in range(2):
        mine = np.flatnonzero((rec.head[:, 1] == rank) & np.isin(rec.head[:, 3], [5, 7]))
        kinds = np.where(
            rec.head[mine, 3] == 5,
            np.where(rec.body[mine, 0] % 2 == 0, "Enter", "Leave"),
            np.where(rec.body[mine, 0] == -101, "MpiSend", "MpiRecv"),
        )
        got = events[f"rank {rank} thread 0"]
        assert [(k, t) for k, t, *_ in got] == list(zip(kinds.tolist(), ticks[mine].tolist(), strict=True))
    assert counts.events == 2 * len(mine) and counts.events > 70_000
    sizes = [p.stat().st_size for p in (tmp_path / "out" / "traces").glob("*.evt")]
    assert len(sizes) == 2 and min(sizes) > 256 << 10  # more than the one chunk a location holds
    assert counts.flushes >= 2


def test_without_the_bindings_says_how_to_install_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "t.clog2").write_bytes(clog2_file([enter(1e-6, 0, 10), leave(2e-6, 0, 10)], 1))
    monkeypatch.setitem(sys.modules, "_otf2", None)  # import _otf2 fails
    got, err = convert(capsys, str(tmp_path / "t.clog2"), "--otf2", str(tmp_path / "out"))
    assert got == 2 and "pip install 'paramedic[otf2]'" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.clog2"]
