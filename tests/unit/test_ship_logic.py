"""Pure logic of shipping: held pieces in the scheduler, output paths under --root, the auto rule, frames."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from paramedic.blast.hits import FragmentSearch, Hit
from paramedic.engine.core.scheduler import PieceTask, Plan, Scheduler, SearchTask
from paramedic.ship.auto import decide, ship_metadata
from paramedic.ship.wire import MAX_PAYLOAD_BYTES, ProtocolError, recv_frame, send_frame
from paramedic.site.admission import safe_output_path
from tests.unit.fragments import searched


def _plan() -> Plan:
    return Plan(
        batches=(range(0, 4), range(4, 8)),
        n_fragments=1,
        pieces=(range(0, 2), range(2, 4), range(4, 8)),
        hitlist_size=5,
    )


def _hits(n: int) -> FragmentSearch:
    return searched([[Hit(gid=q, evalue=1e-10, score=50)] for q in range(n)])


def test_held_pieces_are_released_for_shipping_not_as_tasks():
    scheduler = Scheduler(_plan(), hold_pieces=True)
    first = scheduler.next_task(1)
    assert first == SearchTask(0, 0)
    scheduler.search_done(first, _hits(4))
    released = scheduler.take_released()
    assert [t.piece for t in released] == [0, 1]
    assert scheduler.take_released() == []
    assert isinstance(scheduler.next_task(1), SearchTask)  # no regeneration task was queued
    scheduler.search_done(SearchTask(1, 0), _hits(4))
    assert [t.piece for t in scheduler.take_released()] == [2]
    assert scheduler.finished


def test_held_pieces_become_regeneration_tasks_when_holding_stops_except_one_done_otherwise():
    scheduler = Scheduler(_plan(), hold_pieces=True)
    scheduler.search_done(scheduler.next_task(1), _hits(4))
    scheduler.stop_holding()
    scheduler.mark_piece_done(0)  # the --ship auto probe's output is written
    tail = scheduler.next_task(1)  # the last batch's search goes first (the tail)
    assert isinstance(tail, SearchTask) and tail.batch == 1
    task = scheduler.next_task(2)
    assert isinstance(task, PieceTask) and task.piece == 1
    assert not scheduler.finished


def test_output_paths_stay_under_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    assert safe_output_path(root, "run42/hits.txt") == root / "run42" / "hits.txt"
    assert not (root / "run42").exists()  # a check of the shape only: writes make directories (site.safefs)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "link")
    for bad in [
        "../x",
        "a/../../x",
        "/etc/passwd",
        "",
        "a//b",
        "./a",
        "link/x.txt",
        ".paramedic-state/x",
        "a\\b",
    ]:
        with pytest.raises(ProtocolError):
            safe_output_path(root, bad)
    assert list(outside.iterdir()) == []


def test_auto_rule_is_the_papers():
    assert ship_metadata(D=34e6, x=22e3, B=1.25e6, f=0.01, g=20) is True  # 10 Mbit/s: 27 s saved > 20 s
    assert ship_metadata(D=34e6, x=22e3, B=12.5e6, f=0.01, g=20) is False  # 100 Mbit/s: 2.7 s saved < 20 s


def test_decide_records_its_inputs():
    mode, record = decide(None, 100, 10, b"x" * 1000, 0.5, 20, 0.001)
    assert mode == "metadata" and record["D_output_bytes"] == 10_000 and record["g_seconds"] == 5.0


def test_frames_are_bounded():
    a, b = socket.socketpair()
    with a, b:
        send_frame(a, {"op": "ping"}, b"abc")
        assert recv_frame(b) == ({"op": "ping"}, b"abc")
        a.sendall(struct.pack(">II", 10, MAX_PAYLOAD_BYTES + 1))
        with pytest.raises(ProtocolError, match="exceeds"):
            recv_frame(b)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">II", 2, 0) + b"[]")
        with pytest.raises(ProtocolError, match="op"):
            recv_frame(b)


def test_metadata_runs_are_consecutive_pieces_of_bounded_size():
    from paramedic.ship.destination import _consecutive

    def task(piece: int, ids: int) -> PieceTask:
        return PieceTask(piece, piece, 1, (tuple(range(ids)),))

    tasks = [task(5, 1), task(0, 4), task(1, 4), task(2, 3), task(3, 9), task(7, 1)]
    runs = [[t.piece for t in run] for run in _consecutive(tasks, max_ids=10)]
    # 0 and 1 hold 8 ids, 2 would make 11; 2 and 3 would make 12; pieces 4 and 6 are not there.
    assert runs == [[0, 1], [2], [3], [5], [7]]
    assert [[t.piece for t in run] for run in _consecutive(tasks, max_ids=100)] == [[0, 1, 2, 3], [5], [7]]
    assert [[t.piece for t in run] for run in _consecutive([task(0, 50)], max_ids=10)] == [[0]]
