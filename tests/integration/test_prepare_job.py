"""prepare_job's phases are each computed once: BLAST+'s query batches are cut once and handed on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from paramedic.engine.core.settings import SearchSettings
from paramedic.engine.job import job as job_module
from tests.conftest import take_fasta

pytestmark = pytest.mark.integration


def test_the_query_batches_are_cut_once(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", tmp_path / "db.fasta", 300)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", tmp_path / "q.fasta", 40)
    subprocess.run(
        ["makeblastdb", "-in", "db.fasta", "-dbtype", "prot", "-parse_seqids", "-out", "db"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    cut: list[int] = []
    original = job_module.query_batches

    def counted(lengths: list[int], residues: int) -> list[range]:
        cut.append(residues)
        return original(lengths, residues)

    monkeypatch.setattr(job_module, "query_batches", counted)
    monkeypatch.setenv("BATCH_SIZE", "2000")  # BLAST+'s own batches: a few of the 40 queries each
    settings = SearchSettings(
        program="blastp",
        blast_args=["-query", "q.fasta", "-db", "db", "-out", "hits.txt"],
        cwd=tmp_path,
        quiet=True,
    )
    job = job_module.prepare_job(settings, workers=2, one_node=True)
    assert cut == [2000]  # once, for the strategy's model and the plan's inputs alike
    batches = job.plan_inputs.blast_batches
    assert len(batches) > 1 and batches[0].start == 0 and batches[-1].stop == 40
