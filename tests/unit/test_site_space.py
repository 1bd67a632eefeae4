"""The storage site's space bounds (site.space), on this machine's real file system under tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paramedic.ship.wire import ProtocolError
from paramedic.site.space import DEFAULT_PEER_SHARE, Quota, Space


def free_bytes(path: Path) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def test_a_job_may_hold_up_to_its_quota_and_not_a_byte_more(tmp_path: Path) -> None:
    space = Space(Quota(job_bytes=1000, reserve_bytes=0), (tmp_path,))
    assert space.job_problem(1000) is None
    assert "per-job quota (1000 bytes)" in (space.job_problem(1001) or "")
    assert Space(Quota(reserve_bytes=0), (tmp_path,)).job_problem(10**15) is None  # no per-job bound


def test_a_compute_sites_quota_binds_before_its_default_share(tmp_path: Path) -> None:
    space = Space(Quota(peer_bytes=5000, reserve_bytes=0), (tmp_path,))
    assert space.peer_problem(5000, 10) is None
    assert "more than its quota (5000 bytes," in (space.peer_problem(5001, 10) or "")


def test_without_a_quota_a_compute_site_may_hold_half_of_what_it_could_use(tmp_path: Path) -> None:
    space = Space(Quota(reserve_bytes=0), (tmp_path,))
    free = free_bytes(tmp_path)
    assert space.default_share(0) == pytest.approx(free * DEFAULT_PEER_SHARE, rel=0.01)
    # what it holds already counts on its side: holding `held`, it could use free + held
    held = free // 4
    assert space.default_share(held) == pytest.approx((free + held) * DEFAULT_PEER_SHARE, rel=0.01)
    # so it may hold as much as is still free, and no more (held > (free + held) / 2 when held > free)
    over = space.peer_problem(2 * free, 1)
    assert over is not None and "default share" in over and "--site-quota" in over
    assert space.peer_problem(int(free * 0.9), 1) is None


def test_the_reserve_of_free_space_is_kept(tmp_path: Path) -> None:
    free = free_bytes(tmp_path)
    space = Space(Quota(peer_bytes=2**62, reserve_bytes=free // 2), (tmp_path,))
    space.check_free(free // 4)
    with pytest.raises(ProtocolError, match="nearly full"):
        space.check_free(free - free // 4)
    assert "nearly full" in (space.peer_problem(0, free - free // 4) or "")
    # a path that cannot be read binds nothing
    Space(Quota(reserve_bytes=2**62), (tmp_path / "missing",)).check_free(1)


def test_writes_under_way_count_against_the_free_space_until_they_end(tmp_path: Path) -> None:
    """Two concurrent writes (a chunk, another chunk's decoded range) each fit the free space alone; the
    second used to pass the same check and meet a full disk. Inside `coming`, a write is counted."""
    free = free_bytes(tmp_path)
    space = Space(Quota(reserve_bytes=0), (tmp_path,))
    half = free // 2 + free // 8  # each fits alone, two do not
    with space.coming(half):
        with pytest.raises(ProtocolError, match="nearly full"), space.coming(half):
            pass
        with pytest.raises(ProtocolError, match="nearly full"):
            space.check_free(half)  # a job's own check (site.store) sees the write under way too
    with space.coming(half):  # counted only while it is under way
        pass


def test_published_outputs_count_while_they_are_there_and_a_damaged_ledger_counts_nothing(
    tmp_path: Path,
) -> None:
    from paramedic.site.space import Published

    root = tmp_path / "root"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (root / "a.bin").write_bytes(b"a" * 700)
        (root / "b.bin").write_bytes(b"b" * 300)
        ledger = Published(tmp_path / "published.json", fd)
        ledger.add("tls:a", "a.bin")
        ledger.add("tls:a", "b.bin")
        ledger.add("tls:b", "missing.bin")  # not there: nothing counted
        assert ledger.held("tls:a") == 1000 and ledger.held("tls:b") == 0
        assert Published(tmp_path / "published.json", fd).held("tls:a") == 1000  # read back
        (root / "b.bin").unlink()
        assert ledger.held("tls:a") == 1000  # counted a moment ago: not looked at again yet
        ledger._counted.clear()
        (root / "b.bin").write_bytes(b"c" * 200)  # another file at the same name: not its output
        assert ledger.held("tls:a") == 700
        (tmp_path / "published.json").write_text('{"tls:a": [[[[')
        assert Published(tmp_path / "published.json", fd).held("tls:a") == 0
    finally:
        os.close(fd)
