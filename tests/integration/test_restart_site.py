"""`--restart` after a killed `--site` search (issue 41, item 7): the killed run's site job, which still
holds the output path at the storage site, is cancelled as a plain rerun cancels it, and the search starts
afresh. Real mpiexec ranks killed with SIGKILL, real BLAST+, a real `paramedic serve` over TLS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import paramedic
from tests.integration.test_resume import (  # noqa: F401 (fixtures)
    ENGINE,
    Data,
    blast_args,
    data,
    kill_every_rank_when,
    searches_done,
    storage,
    total_searches,
)

# alone: the kill's MPICH files are found by a before/after look at /dev/shm and /tmp (test_resume.py)
pytestmark = [pytest.mark.integration, pytest.mark.alone]


@pytest.mark.parametrize("mode", ["direct", "metadata"])
def test_restart_after_a_killed_site_search_supersedes_its_job(
    data: Data,  # noqa: F811
    storage,  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    """Before: the killed run's job held the output path at the site, and `--restart` (which discarded the
    journal naming that job) was refused for up to an hour, exit 8, "another job is writing it now";
    the same command without --restart cancelled the job and went on."""
    site, keys = storage
    out = f"restarted-{mode}.txt"
    journal = tmp_path / f".{out}.journal"
    command = [
        "search", "blastp", *blast_args(data.queries, data.db, out), *ENGINE,
        "--site", site.url, "--keys", str(keys), "--ship", mode,
    ]  # fmt: skip
    kill_every_rank_when(command, tmp_path, journal, searches_done(3))
    assert (journal / "site-job").exists()
    killed = (journal / "site-job").read_text().split()[0]

    proc = paramedic(*command, "--np", "1", "--restart", cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (site.root / out).read_bytes() == data.reference
    record = json.loads((tmp_path / f"{out}.run.json").read_text())
    assert not record.get("resumed", {}).get("searches")  # afresh: nothing of the killed run's work
    assert total_searches(record) == record["batches"] * 6
    assert not journal.exists()
    assert f"job {killed}: failed: cancelled by the compute site" in site.log()
