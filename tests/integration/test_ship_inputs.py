"""`paramedic ship` and `report` on inputs that are not a finished file (issue 41, item 10): a FIFO, a
device, a file larger than ship holds. Each is refused in one line, exit 3, in bounded time, before
anything is read or sent (before: `ship /dev/zero` read until memory ran out, `ship FIFO` hung)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from paramedic.ship.file_ship import max_file_bytes
from tests.conftest import BIN, paramedic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("input-keys")
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    return base / "keys" / "compute-a"


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO with a writer that holds it open and writes nothing (a reader waits for ever)."""
    path = tmp_path / "run.clog2"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDWR)  # a writer (and reader) of its own: opening it never blocks
    yield path
    os.close(fd)


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "paramedic"), *args], cwd=cwd, capture_output=True, text=True, timeout=30,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def ship(path: Path, keys: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # port 9 (discard): nothing is sent, so nothing needs to listen there
    return run(
        "ship", str(path), "-out", "x.clog2", "--site", "tls://localhost:9", "--keys", str(keys), cwd=cwd
    )


def refused(proc: subprocess.CompletedProcess[str], says: str) -> None:
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paramedic: error: ") and says in lines[0], proc.stderr


def test_ship_refuses_a_fifo_and_a_device(tmp_path: Path, keys: Path, fifo: Path) -> None:
    refused(ship(fifo, keys, tmp_path), "not a regular file")
    refused(ship(Path("/dev/zero"), keys, tmp_path), "not a regular file")
    os.mkfifo(tmp_path / "quiet")  # a FIFO nobody writes: refused the same way
    refused(ship(tmp_path / "quiet", keys, tmp_path), "not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quiet", "run.clog2"]


def test_ship_refuses_a_file_larger_than_it_holds(tmp_path: Path, keys: Path) -> None:
    """A sparse file one byte over the bound: refused by its size, not read."""
    big = tmp_path / "big.clog2"
    with big.open("wb") as fh:
        fh.truncate(max_file_bytes() + 1)
    refused(ship(big, keys, tmp_path), "that `paramedic ship` holds")


def test_report_refuses_a_fifo(tmp_path: Path, fifo: Path) -> None:
    proc = run("report", str(fifo), "-o", str(tmp_path / "page.html"), cwd=tmp_path)
    refused(proc, "not a regular file")
    assert not (tmp_path / "page.html").exists()
