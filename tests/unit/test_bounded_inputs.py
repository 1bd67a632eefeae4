"""Issue 23, item 18 probed again: files a user names (`--from-metadata`, `simulate --record`, `report
RECORD --prediction`) are read with bounds: a FIFO blocked for ever, /dev/zero or a file of gigabytes was
read whole (exit 1, MemoryError), JSON nested thousands deep was exit 1 (RecursionError). Real files;
each refusal is an InputError (exit 3), in well under a second."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from paramedic.engine.rank.metadata import SearchIdentity, load_metadata, max_metadata_bytes, save_metadata
from paramedic.errors import InputError

IDENTITY = SearchIdentity("blastp", ["-evalue", "10"], 500, "0" * 64, "1" * 64)


def _load(path: Path) -> list[list[int]]:
    return load_metadata(path, IDENTITY, n_queries=3, nseq=1000)


def test_a_metadata_file_as_written_loads(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    save_metadata(path, IDENTITY, [[1, 2], [], [999]])
    assert _load(path) == [[1, 2], [], [999]]
    assert path.stat().st_size < max_metadata_bytes(3, 500, 1000)


def _not_a_file(tmp_path: Path, kind: str, huge: int) -> Path:
    path = tmp_path / "m.json"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it: reading it whole waited for ever
    elif kind == "dev-zero":
        path = Path("/dev/zero")
    elif kind == "huge":
        with open(path, "wb") as fh:  # sparse: the bytes are zeros, never written
            fh.truncate(huge)
    elif kind == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        path.mkdir()
    return path


KINDS = ["fifo", "dev-zero", "huge", "directory", "nested"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_metadata_file_that_is_not_one_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    path = _not_a_file(tmp_path, kind, max_metadata_bytes(3, 500, 1000) + 1)
    begun = time.monotonic()
    with pytest.raises(InputError, match=r"--from-metadata .*: not a metadata file \("):
        _load(path)
    assert time.monotonic() - begun < 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_record_or_prediction_that_is_not_one_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    from paramedic.engine.predict.simulate import SimulateSettings, simulate
    from paramedic.report.html import load_prediction, load_record
    from paramedic.report.record import MAX_RECORD_BYTES

    path = _not_a_file(tmp_path, kind, MAX_RECORD_BYTES + 1)
    begun = time.monotonic()
    for load in (
        load_record,
        load_prediction,
        lambda p: simulate(SimulateSettings(record=p, queries=10, workers=2)),
    ):
        with pytest.raises(InputError):
            load(path)
    assert time.monotonic() - begun < 3
