"""Issue 23: the hidden partial report beside an output is named after the job, and under one's own
mpiexec or srun after rank 0's pid, which another user can guess: a link (or a file of theirs) planted at
that name in a shared directory must never be written through, nor become the output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paramedic.errors import OutputError
from paramedic.output.writer import LocalFile


@pytest.fixture
def named(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PARAMEDIC_JOB_ID", "guessable")
    return ".hits.txt.partial-guessable"


def test_a_link_planted_at_the_partial_name_is_not_written_through(tmp_path: Path, named: str) -> None:
    victim = tmp_path / "victims-file"
    victim.write_bytes(b"the victim's own data\n")
    (tmp_path / named).symlink_to(victim)
    out = LocalFile(tmp_path / "hits.txt")
    out.write(b"report\n")
    out.commit()
    assert victim.read_bytes() == b"the victim's own data\n"  # truncated and overwritten before
    assert (tmp_path / "hits.txt").read_bytes() == b"report\n" and not (tmp_path / "hits.txt").is_symlink()
    assert not (tmp_path / named).exists()


def test_a_file_planted_at_the_partial_name_is_made_afresh(tmp_path: Path, named: str) -> None:
    planted = tmp_path / named
    planted.write_bytes(b"theirs")
    planted.chmod(0o666)
    inode = planted.stat().st_ino
    other = tmp_path / "their-hard-link"
    os.link(planted, other)  # they keep a name for it: a report written into it would stay theirs to edit
    out = LocalFile(tmp_path / "hits.txt")
    out.write(b"report\n")
    out.commit()
    assert other.read_bytes() == b"theirs"
    assert (tmp_path / "hits.txt").stat().st_ino != inode


def test_a_partial_name_that_cannot_be_cleared_is_a_clear_error(
    tmp_path: Path, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / named).mkdir()  # not removable as a file (as another user's file in a sticky directory)
    with pytest.raises(OutputError, match="cannot write"):
        LocalFile(tmp_path / "hits.txt")
