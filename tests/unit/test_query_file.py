"""StoredQueries: a job's queries on disk at the site, read back by piece (issue 23, item 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paramedic.ship.query_file import StoredQueries


def test_pieces_read_back_as_written(tmp_path: Path) -> None:
    queries = [("q0 first", "MKV"), ("\ud800 odd header", "ACGT"), ("q2", "W" * 10_000)]
    stored = StoredQueries(tmp_path / "q.txt", queries)
    assert len(stored) == 3
    assert stored[0:3] == queries and stored[1:2] == [queries[1]] and stored[2:9] == [queries[2]]
    assert stored[-1] == queries[2] and stored[2:1] == []
    with pytest.raises(IndexError):
        stored[3]
