"""Where a fork-served BLAST+ run keeps its files (its stdout and stderr): in the run's own working
directory when it has one. Issue 23: a storage site killed with -9 during its regenerations left those
directories in TMPDIR for good; in the job's scratch, the site's restart empties them with it."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from paramedic.blast import tools


class _Recorder:
    """Stands in for the fork server (pure path logic): notes where the run's files were to go."""

    def __init__(self) -> None:
        self.stderr_paths: list[Path] = []

    def run(
        self, argv: list[str], cwd: str, stdout_path: str, stderr_path: str, env: Mapping[str, str]
    ) -> int:
        self.stderr_paths.append(Path(stderr_path))
        Path(stderr_path).write_bytes(b"a warning\n")
        return 0


def test_a_runs_files_live_in_its_working_directory_and_go_with_the_run(tmp_path: Path) -> None:
    server = _Recorder()
    proc = tools._run_forked(server, ["blastp", "-version"], tmp_path, None, {})  # type: ignore[arg-type]
    (stderr,) = server.stderr_paths
    assert stderr.parent.parent == tmp_path and stderr.parent.name.startswith("paramedic-run-")
    assert proc.stderr == b"a warning\n" and proc.returncode == 0
    assert list(tmp_path.iterdir()) == []  # removed once the run is read


def test_a_run_without_a_working_directory_uses_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    server = _Recorder()
    tools._run_forked(server, ["blastp", "-version"], None, None, {})  # type: ignore[arg-type]
    (stderr,) = server.stderr_paths
    assert stderr.parent.parent == tmp_path
