"""A rank stopped under srun (paramedic.engine.runtime.stopped): what it removes of its job step's on the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from paramedic.engine.runtime.stopped import mapped_shared_memory, remove_step_dirs, step_tag


def test_step_dirs_of_this_step_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert step_tag() == "9.0-"
    ours = [tmp_path / "paramedic-rank0-9.0-abc", tmp_path / "paramedic-rank1-9.0-def"]
    others = [
        tmp_path / "paramedic-rank1-19.0-x",
        tmp_path / "paramedic-rank1-9.1-y",
        tmp_path / "paramedic-rank2-z",
    ]
    for path in ours + others:
        (path / "store").mkdir(parents=True)
    remove_step_dirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in others)


def test_outside_slurm_nothing_is_tagged_or_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    assert step_tag() == ""
    (tmp_path / "paramedic-rank0-abc").mkdir()
    remove_step_dirs(tmp_path)
    assert (tmp_path / "paramedic-rank0-abc").is_dir()
    assert all("/" not in name for name in mapped_shared_memory())
