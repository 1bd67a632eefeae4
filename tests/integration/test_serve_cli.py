"""`paramedic serve`'s bounds as a user sets them (issue 11 items 3-4): bad values are refused with one
line; --job-quota and --open-idle act on a real server (a real search over real TLS, real files). SIGTERM
stops a site as Ctrl-C does, whichever way in it has (issue 45)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from paramedic.ship.client import SiteAddress, TlsShipper
from tests.conftest import BIN, paramedic
from tests.support.databases import Databases
from tests.support.site import StorageSite

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def base(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("serve-cli")
    databases.place(base, 2000, fragments=2)
    databases.queries(base / "q.fasta", 10)
    databases.keys(base / "keys")
    return base


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--open-idle", "0"], "--open-idle must be a positive number of hours"),
        (["--expire-after", "-1"], "--expire-after must be a positive number of hours"),
        (["--io-workers", "0"], "--io-workers must be at least 1"),
        (["--job-quota", "lots"], "--job-quota"),
        (["--site-quota", "-5G"], "--site-quota"),
        (["--reserve", "1Q"], "--reserve"),
    ],
)
def test_bad_bounds_are_refused_with_one_line(
    base: Path, tmp_path: Path, flags: list[str], message: str
) -> None:
    proc = subprocess.run(
        [str(BIN / "paramedic"), "serve", "--replica", str(base / "db/uni"), "--root", str(tmp_path / "root"),
         "--keys", str(base / "keys/server"), "--listen", "127.0.0.1:0", *flags],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "root").exists()


def test_job_quota_fails_a_job_that_passes_it_and_removes_its_data(base: Path, tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    site = StorageSite(base / "db/uni", tmp_path / "root", base / "keys/server", tmp_path / "serve.log",
                       extra=("--job-quota", "64K"))  # fmt: skip
    site.start()
    try:
        proc = paramedic(
            "search", "blastp", "-query", str(base / "q.fasta"), "-db", str(base / "db/uni"), "-out", "big.txt",
            "--site", site.url, "--keys", str(base / "keys/compute-a"), "--ship", "direct", "--quiet",
            cwd=tmp_path, check=False,
        )  # fmt: skip
        assert proc.returncode == 8, proc.stderr
        assert "per-job quota (65536 bytes)" in proc.stderr.splitlines()[0], proc.stderr
        assert [p.name for p in (tmp_path / "root").iterdir()] == [".paramedic-state"]
        held = [p for p in site.state.rglob("*") if p.is_file() and p.name not in ("job.json", "failed.json")]
        assert held == []  # chunks and partial output removed; only the failed job's record stays
    finally:
        site.stop()


def test_open_idle_expires_a_silent_job(base: Path, tmp_path: Path) -> None:
    """A job opened and then left silent (its compute site gone) fails as expired after --open-idle."""
    (tmp_path / "root").mkdir()
    site = StorageSite(base / "db/uni", tmp_path / "root", base / "keys/server", tmp_path / "serve.log",
                       extra=("--open-idle", str(2 / 3600)))  # 2 s  # fmt: skip
    site.start()
    try:
        shipper = TlsShipper(SiteAddress.parse(site.url), base / "keys/compute-a", "direct",
                             {"out": "silent.txt"}, b"", streams=1, timeout=10)  # fmt: skip
        shipper.start()  # opens the job; then nothing more (no keep-alive: the streams are never fed)
        shipper.shared.closing = True
        site.wait_log(r"expired", timeout=20)
        assert not (tmp_path / "root" / "silent.txt").exists()
        assert not [p for p in (tmp_path / "root").iterdir() if p.name != ".paramedic-state"]
    finally:
        site.stop()


@pytest.mark.parametrize("way_in", ["tls", "inbox"])
def test_sigterm_stops_the_site_as_ctrl_c_does(base: Path, tmp_path: Path, way_in: str) -> None:
    """A service manager stops a daemon with SIGTERM: the site logs that it stops, stops its receivers and
    listener, and exits 0 (it used to die of the signal, its receivers never stopped). An inbox-only site
    waits on no socket: its main thread must still see the signal, whichever thread took it."""
    (tmp_path / "root").mkdir()
    keys = base / "keys/server" if way_in == "tls" else None
    inbox = tmp_path / "inbox" if way_in == "inbox" else None
    site = StorageSite(base / "db/uni", tmp_path / "root", keys, tmp_path / "serve.log", inbox=inbox)
    site.start()
    try:
        assert site.proc is not None
        site.proc.send_signal(signal.SIGTERM)
        assert site.proc.wait(timeout=20) == 0, site.log()
        assert site.log().rstrip().endswith("stopping"), site.log()
    finally:
        site.stop()
