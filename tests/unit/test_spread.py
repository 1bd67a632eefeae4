"""The first job's digest spread over nodes (paramedic.db.spread): shares, digests taken by stamp."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paramedic.db import trust
from paramedic.db.spread import accept, assign, digest_share, leaders
from paramedic.db.trust import DigestStore, digests, file_digest


def test_one_leader_per_host_the_lowest_rank() -> None:
    assert leaders(["n1", "n1", "n2", "n2", "n3", "n1"]) == [0, 2, 4]
    assert leaders(["only"] * 4) == [0]


def test_shares_are_balanced_by_bytes_largest_first() -> None:
    files = [(Path(f"v{i}"), size) for i, size in enumerate([100, 90, 60, 50, 40, 10])]
    shares = assign(files, [0, 2, 4])
    loads = {
        rank: sum(dict((str(p), s) for p, s in files)[n] for n in names) for rank, names in shares.items()
    }
    assert sorted(n for names in shares.values() for n in names) == sorted(str(p) for p, _ in files)
    # largest first to the least loaded: 100+10 | 90+40 | 60+50 (one rank taking all: 350)
    assert sorted(loads.values()) == [110, 110, 130], loads
    assert assign([], [0, 1]) == {} and assign(files[:1], [0, 5]) == {0: ["v0"]}


@pytest.fixture()
def volumes(tmp_path: Path) -> list[Path]:
    paths = []
    for i in range(3):
        path = tmp_path / f"db.0{i}.psq"
        path.write_bytes(os.urandom(200_000 + i))
        paths.append(path)
    return paths


def test_digests_handed_over_are_used_without_reading_again(
    volumes: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = digest_share([str(p) for p in volumes])
    assert [r.digest for r in results] == [file_digest(p) for p in volumes]
    store = DigestStore(tmp_path / "store")
    assert accept(results, store) == (3, sum(p.stat().st_size for p in volumes))
    monkeypatch.setattr(trust, "file_digest", _never)  # what was handed is not digested again
    assert digests(volumes, store) == {p: r.digest for p, r in zip(volumes, results, strict=True)}


def test_a_file_changed_after_its_digest_is_digested_here(volumes: list[Path], tmp_path: Path) -> None:
    results = digest_share([str(p) for p in volumes])
    with open(volumes[1], "r+b") as fh:  # one byte, same size
        fh.write(b"\0" if fh.read(1) != b"\0" else b"\1")
    store = DigestStore(tmp_path / "store")
    assert accept(results, store)[0] == 2
    assert digests(volumes, store)[volumes[1]] == file_digest(volumes[1]) != results[1].digest


def test_a_share_that_fails_is_left_to_this_rank(volumes: list[Path], tmp_path: Path) -> None:
    missing = tmp_path / "gone.psq"
    results = digest_share([str(missing), str(volumes[0])])
    assert results[0].failure and not results[0].digest
    assert accept(results, DigestStore(tmp_path / "store")) == (1, volumes[0].stat().st_size)


def _never(path: Path) -> str:
    raise AssertionError(f"{path} digested again")
