"""After a refusal, "the same command continues the search" is said only of work this command can
continue (issue 41, item 10). Real BLAST+, real signals, the local runner."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN
from tests.integration.test_faults_compute import env_with_tmp, site, start_long_search  # noqa: F401

pytestmark = pytest.mark.integration


def test_a_refused_command_is_not_told_that_it_continues(site: Path, tmp_path: Path) -> None:  # noqa: F811
    """A search stopped with its work in the journal; another search of the same output (a different
    -evalue) is refused ("from another search ... run the same command as before"), and then was told
    "finished work is kept ...: the same command continues the search", which it does not."""
    proc, out = start_long_search(site, tmp_path)
    journal = tmp_path / f".{out.name}.journal"
    deadline = time.monotonic() + 60
    while not any((journal / "search").iterdir()) and not any((journal / "piece").iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert b"finished work is kept in" in stderr  # the stopped search's own: true
    other = subprocess.run(
        [str(BIN / "paramedic"), "search", "blastp", "-query", str(tmp_path / "q300.fasta"), "-db",
         str(site / "dbs/db"), "-out", str(out), "-evalue", "1e-3", "--np", "2", "--strategy", "fragments",
         "--runner", "local", "--fragment-groups", "off"],
        cwd=tmp_path, env=env_with_tmp(tmp_path / "tmp"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert other.returncode == 2, other.stderr
    lines = other.stderr.strip().splitlines()
    assert len(lines) == 1 and "is from another search" in lines[0], other.stderr
    assert journal.is_dir()  # kept for the search that made it
