"""Issue 23 at the storage site (a real `paramedic serve`, real TLS, real mpiexec ranks, real files).

A replica changed while `serve` runs (bytes rewritten in place, times kept) must not regenerate a report:
the job is refused with a clear error.
"""

from __future__ import annotations

import os
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
    databases.place(compute, 800, fragments=2, layout="fragments")
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


@pytest.mark.parametrize("flip", ["residues", "everything"])
def test_a_replica_changed_while_a_job_regenerates_publishes_nothing(
    databases: Databases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flip: str
) -> None:
    """Item 1 probed again: the replica rewritten in place (times kept) after the job's digest, while
    the site regenerates from it (residues changed, not sentinels: BLAST+ reads it without crashing).
    Made deterministic with the site's own BLAST+ as the moment: the first
    blastp the site starts for the job rewrites whole.psq, then runs the real blastp. The site published
    another report and the search exited 0; now the job fails when it finishes (exit 8, one line, and
    the line saying the compute site's journal keeps its work), and nothing is published."""
    import shutil

    compute, storage = tmp_path / "compute", tmp_path / "storage"
    for d in (compute, storage / "root"):
        d.mkdir(parents=True)
    databases.place(compute, 800, fragments=2, layout="fragments")
    databases.queries(compute / "q.fasta", 8)
    subprocess.run(["cp", "-r", str(compute / "db"), str(storage / "replica")], check=True)
    databases.keys(tmp_path / "keys")
    log = tmp_path / "serve.log"
    site_tmp = log.with_name(log.name + ".tmp")  # the site's TMPDIR (tests.support.site)
    shims = tmp_path / "shims"
    shims.mkdir()
    mark = tmp_path / "flip-once"
    real = shutil.which("blastp")
    assert real is not None
    change = (
        "[d.__setitem__(i, d[i] ^ 1) for i in range(len(d)//2, len(d), 997) if d[i] > 1]"  # residues only
        if flip == "residues"  # BLAST+ reads it: another report
        else "[d.__setitem__(i, d[i] ^ 0x5A) for i in range(len(d)//2, len(d), 97)]"  # BLAST+ crashes
    )
    script = (
        "import os,sys; p=sys.argv[1]; st=os.stat(p); d=bytearray(open(p,'rb').read()); "
        f"{change}; open(p,'r+b').write(d); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))"
    )
    (shims / "blastp").write_text(
        "#!/bin/sh\n"
        f'if [ "$TMPDIR" = "{site_tmp}" ] && mv "{mark}" "{mark}.taken" 2>/dev/null; then\n'
        f'  python3 -c "{script}" "{storage / "replica" / "uni" / "whole.psq"}"\n'
        "fi\n"
        f'exec "{real}" "$@"\n'
    )
    (shims / "blastp").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    monkeypatch.setenv("PARAMEDIC_FORKSERVER", "0")  # each BLAST+ run started by its path: the shim runs
    server = StorageSite(storage / "replica" / "uni", storage / "root", tmp_path / "keys" / "server", log)
    server.start()
    try:
        sites = Sites(tmp_path, compute, tmp_path / "keys", server)
        local = sites.local()
        sites.search("first.out")  # the shim passes through: BLAST+'s bytes
        assert (server.root / "first.out").read_bytes() == local
        mark.write_text("")
        proc = sites.search("second.out", check=False)
        assert mark.with_name("flip-once.taken").exists(), "the site started no BLAST+ for the job"
        assert proc.returncode == 8, proc.stderr
        first, *rest = proc.stderr.splitlines()
        assert "replica changed while this job regenerated" in first, proc.stderr
        assert all("finished work is kept" in line for line in rest), proc.stderr  # the search's own
        assert not (server.root / "second.out").exists()
    finally:
        server.stop()


def test_a_site_started_while_its_replica_is_damaged_starts_and_refuses_only_regenerations(
    sites: Sites,
) -> None:
    """An unlucky operator: the site restarted (by its service manager) while the replica is being
    rewritten, or is damaged. `serve` exited 4 at every restart, so the site was down for plain output
    and traces too. Now it starts and says so; a job that regenerates is refused while the replica
    differs (exit 8, one line), and the next one, once the replica is whole again, is BLAST+'s bytes."""
    whole = sites.server.replica / "whole.psq"
    original = whole.read_bytes()
    st = whole.stat()
    sites.server.stop()
    flip_keeping_times(whole)
    sites.server.start()  # exit 4 "corrupt database" here before
    assert "jobs that regenerate are refused until it is whole" in sites.server.log()
    proc = sites.search("damaged.out", "--no-journal", check=False)
    assert proc.returncode == 8, proc.stderr
    assert "replica is damaged" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (sites.server.root / "damaged.out").exists()
    with open(whole, "r+b") as fh:
        fh.write(original)
    os.utime(whole, ns=(st.st_atime_ns, st.st_mtime_ns))
    sites.search("whole.out")
    assert (sites.server.root / "whole.out").read_bytes() == sites.local()
