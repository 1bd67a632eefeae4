"""A partitioned `--site` search killed after the storage site published its output, run again (issue 45,
item 4): rank 0 asks the site about the journal's job and finds the output there, as one master does
(test_resume.py). Before, only one master asked: the supermaster opened a new site job for a path the site
already holds, and the run again was refused for ever ("a file is already there", exit 8). Real mpiexec
ranks killed with SIGKILL, real BLAST+, a real `paramedic serve` over TLS."""

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
    storage,
)

# alone: the kill's MPICH files are found by a before/after look at /dev/shm and /tmp (test_resume.py)
pytestmark = [pytest.mark.integration, pytest.mark.alone]


@pytest.mark.parametrize("mode", ["metadata", "auto"])
def test_partitions_killed_after_the_site_published_finish_when_run_again(
    data: Data,  # noqa: F811
    storage,  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    site, keys = storage
    for attempt in range(10):  # the kill must land between the site's publishing and the journal's end
        out = f"partitioned-{mode}-{attempt}.txt"
        journal = tmp_path / f".{out}.journal"
        command = [
            "search", "blastp", *blast_args(data.queries, data.db, out), *ENGINE,
            "--site", site.url, "--keys", str(keys), "--ship", mode, "--partition-size", "2",
        ]  # fmt: skip
        target = site.root / out
        try:
            kill_every_rank_when(command, tmp_path, journal, lambda _, t=target: t.exists(), ranks=5)
        except AssertionError:
            continue  # the search heard in time and finished: try again
        if journal.exists():
            break
    else:
        pytest.fail("no kill landed after the site published and before the search ended")
    assert (journal / "site-job").exists()

    proc = paramedic(*[a for a in command if a != "--quiet"], "--np", "4", cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "already holds" in proc.stderr
    assert (site.root / out).read_bytes() == data.reference
    record = json.loads((tmp_path / f"{out}.run.json").read_text())
    assert record["partitions"] == 2
    assert record["ship"]["site_sha256"] and record["ship"]["chunks"] == 0  # nothing sent again
    assert not journal.exists()
