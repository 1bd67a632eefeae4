"""Issue 23 at the storage site (a real `paramedic serve`, real TLS, real mpiexec ranks, real files).

A replica changed while `serve` runs (bytes rewritten in place, times kept) must not regenerate a report:
the job is refused with a clear error.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import paramedic
from tests.integration.test_trust import flip_keeping_times
from tests.support.databases import Databases
from tests.support.site import StorageSite

pytestmark = pytest.mark.integration


@dataclass
class Sites:
    base: Path
    compute: Path
    keys: Path
    server: StorageSite

    def search(self, out: str, *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return paramedic(
            "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-outfmt", "0", "-out", out,
            "--site", self.server.url, "--keys", str(self.keys / "compute-a"), "--ship", "metadata",
            "--strategy", "fragments", "--quiet", "--ship-timeout", "60", "--record",
            str(self.base / f"{out}.run.json"), *extra, cwd=self.compute, check=check,
        )  # fmt: skip

    def local(self) -> bytes:
        paramedic(
            "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-outfmt", "0", "-out", "local.out",
            "--strategy", "fragments", "--quiet", cwd=self.compute,
        )  # fmt: skip
        return (self.compute / "local.out").read_bytes()


@pytest.fixture
def sites(databases: Databases, tmp_path: Path) -> Iterator[Sites]:
    compute, storage = tmp_path / "compute", tmp_path / "storage"
    for d in (compute, storage / "root"):
        d.mkdir(parents=True)
    databases.place(compute, 800, fragments=2)
    databases.queries(compute / "q.fasta", 8)
    subprocess.run(["cp", "-r", str(compute / "db"), str(storage / "replica")], check=True)
    databases.keys(tmp_path / "keys")
    server = StorageSite(
        storage / "replica" / "uni", storage / "root", tmp_path / "keys" / "server", tmp_path / "serve.log"
    )
    server.start()
    try:
        yield Sites(tmp_path, compute, tmp_path / "keys", server)
    finally:
        server.stop()


def test_a_replica_changed_while_serve_runs_regenerates_nothing(sites: Sites) -> None:
    """Item 1: the site's replica is rewritten in place (times kept) after `serve` verified it."""
    sites.search("first.out")
    assert (sites.server.root / "first.out").read_bytes() == sites.local()
    flip_keeping_times(sites.server.replica / "whole.psq")  # the whole database: reports regenerate from it
    proc = sites.search("second.out", check=False)
    assert proc.returncode == 8, proc.stderr
    assert "replica is damaged" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (sites.server.root / "second.out").exists()


def test_a_journal_site_job_naming_another_finished_job_is_not_believed(
    databases: Databases, tmp_path: Path
) -> None:
    """Item 4: a killed --site search's journal whose `site-job` record is changed to name another job
    that finished (another output): the run again must not say "the storage site already holds" and exit 0
    with nothing stored. The record is not this journal's (its tag): the killed run's job, which still
    holds the output path, cannot be named, so the run is refused, clearly, until that job expires."""
    from tests.integration import test_resume as resume
    from tests.integration.test_trust import _Factory

    data = resume.data.__wrapped__(databases, _Factory(tmp_path / "data"))  # type: ignore[attr-defined]
    (tmp_path / "root").mkdir()
    subprocess.run(["cp", "-r", str(data.db.parent), str(tmp_path / "replica")], check=True)
    paramedic("keys", "--out", str(tmp_path / "keys"), "--server", "localhost", "--client", "compute-a")
    server = StorageSite(
        tmp_path / "replica" / "uni", tmp_path / "root", tmp_path / "keys" / "server", tmp_path / "serve.log"
    )
    server.start()
    try:
        work = tmp_path / "work"
        work.mkdir()

        def command(out: str) -> list[str]:
            return [
                "search", "blastp", *resume.blast_args(data.queries, data.db, out), *resume.ENGINE,
                "--site", server.url, "--keys", str(tmp_path / "keys" / "compute-a"), "--ship", "metadata",
            ]  # fmt: skip

        paramedic(*command("a.out"), "--np", "2", cwd=work)
        (finished,) = [p.name for p in server.state.iterdir() if (p / "done.json").exists()]
        journal = work / ".b.out.journal"
        resume.kill_every_rank_when(command("b.out"), work, journal, resume.searches_done(3))
        assert (journal / "site-job").exists()
        (journal / "site-job").write_text(finished)
        proc = paramedic(*[a for a in command("b.out") if a != "--quiet"], "--np", "2", cwd=work, check=False)
        assert "already holds" not in proc.stderr
        assert proc.returncode == 8, proc.stderr
        assert "journal record site-job dropped" in proc.stderr and "another job is writing it" in proc.stderr
        assert not (server.root / "b.out").exists()
    finally:
        server.stop()
