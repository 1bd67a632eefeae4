"""BLAST+'s check of the option values (`blast.options.check_values`) is paid once per executable, option
values and database: a pass is remembered, a refusal never is, and options naming files are checked
every time (the file may change). Real BLAST+, run through a wrapper on PATH that counts its starts."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from paramedic.blast.options import BlastOptions, _pure, check_values
from paramedic.blast.tools import require_tool
from paramedic.errors import UsageError
from tests.conftest import require_real_tools
from tests.support.databases import Databases


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A `blastp` on PATH that logs each start, then runs the real one; a cache of this test's own."""
    require_real_tools()
    real = shutil.which("blastp")
    assert real is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "starts.log"
    wrapper = bin_dir / "blastp"
    wrapper.write_text(f'#!/bin/sh\necho "start $*" >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PARAMEDIC_OPTIONS_CHECKED", raising=False)
    require_tool.cache_clear()  # the path of each BLAST+ program is remembered per process
    yield log
    require_tool.cache_clear()


def _starts(log: Path) -> int:
    """Starts of BLAST+ other than `-help` (read once per executable to know its options)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if "-help" not in line)


def test_a_passed_check_is_not_paid_again(counted: Path, databases: Databases, tmp_path: Path) -> None:
    db = databases.place(tmp_path / "site", 40, 2)
    good = BlastOptions.parse("blastp", ["-evalue", "1e-5", "-max_target_seqs", "7"])
    check_values("blastp", good, str(db), "identity-a")
    assert _starts(counted) == 1
    check_values("blastp", good, str(db), "identity-a")
    assert _starts(counted) == 1, "the same options against the same database were checked again"
    check_values("blastp", good, str(db), "identity-b")  # another database's content: checked
    assert _starts(counted) == 2
    other = BlastOptions.parse("blastp", ["-evalue", "1e-6", "-max_target_seqs", "7"])
    check_values("blastp", other, str(db), "identity-a")
    assert _starts(counted) == 3
    check_values("blastp", good, str(db))  # no identity given: nothing to key a pass on
    assert _starts(counted) == 4


def test_a_refusal_is_never_remembered(counted: Path, databases: Databases, tmp_path: Path) -> None:
    db = databases.place(tmp_path / "site", 40, 2)
    bad = BlastOptions.parse("blastp", ["-evalue", "abc"])
    for expected in (1, 2):
        with pytest.raises(UsageError, match="blastp refuses the options: -evalue"):
            check_values("blastp", bad, str(db), "identity-a")
        assert _starts(counted) == expected


def test_flags_keep_a_check_remembered(counted: Path, databases: Databases, tmp_path: Path) -> None:
    db = databases.place(tmp_path / "site", 40, 2)
    options = BlastOptions.parse("blastp", ["-evalue", "1e-5", "-outfmt", "6 qseqid sseqid", "-use_sw_tback"])
    check_values("blastp", options, str(db), "identity-a")
    check_values("blastp", options, str(db), "identity-a")
    assert _starts(counted) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["-window_masker_db", "wm.counts"],
        ["-filtering_db", "repeats"],
        ["-index_name", "idx"],
        ["-window_masker_taxid", "9606"],
    ],
)
def test_options_naming_files_are_checked_every_time(argv: list[str]) -> None:
    """A file's contents may change between runs, so a pass on them is not remembered."""
    require_real_tools()
    assert not _pure(BlastOptions.parse("blastn", ["-evalue", "1", *argv]))
    assert _pure(BlastOptions.parse("blastn", ["-evalue", "1", "-task", "blastn", "-dust", "no"]))
