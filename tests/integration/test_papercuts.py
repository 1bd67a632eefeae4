"""Papercuts a new user met (issue 24), each run as a user would: the progress bar after the summary, the
fragments bar that sat at 0, the summary's wording, --ship without --site, --site with --ship auto and an
option the fragments strategy cannot honour, '..' in -db with --site, --batch rounded silently, the run
record's mode, and the help texts."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pty
import re
import stat
import struct
import subprocess
import termios
from pathlib import Path

import pytest

from tests.conftest import BIN, paramedic
from tests.support.databases import Databases
from tests.support.site import StorageSite

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def work(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("papercuts")
    databases.place(root, 2000, fragments=3)
    databases.queries(root / "q.fasta", 30)
    return root


def on_a_terminal(argv: list[str], cwd: Path) -> bytes:
    """What a 100-column terminal receives from the command's stderr (the bar is drawn only there)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert proc.wait(timeout=300) == 0, shown
    return shown


def test_fragments_bar_counts_tasks_and_ends_before_the_summary(work: Path) -> None:
    """The bar counted queries written, so in fragments mode it sat at 0 until a batch was written; after
    the summary the launcher drew it again, and a second bogus bar (update after close)."""
    shown = on_a_terminal(
        [str(BIN / "paramedic"), "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", "bar.txt",
         "--strategy", "fragments", "--np", "2", "--batch", "10", "--metadata", "bar.json"],
        work,
    )  # fmt: skip
    summary = shown.index(b"paramedic: blastp 30 queries")
    before, after = shown[:summary], shown[summary:]
    assert b"%|" not in after, after  # no bar after the summary: neither the stale one nor a new one
    record = json.loads((work / "bar.txt.run.json").read_text())
    searches = record["fragment_groups"] or record["fragments"]  # per batch: fragments alone or grouped
    tasks = record["batches"] * searches + record["pieces"]  # searches, then report pieces
    counts = sorted({(int(d), int(t)) for d, t in re.findall(rb"\| *(\d+)/(\d+) \[", before)})
    assert counts and all(t == tasks for _, t in counts), (counts, tasks)
    assert counts[-1] == (tasks, tasks) and b"task" in before
    # (that each search moves it is tests/unit/test_report_page.py's: the launcher polls 5 times a second,
    # and a search of this small database can be quicker)
    # from saved metadata nothing is searched: the bar counts the pieces and still ends before the summary
    shown = on_a_terminal(
        [str(BIN / "paramedic"), "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", "again.txt",
         "--strategy", "fragments", "--np", "2", "--from-metadata", "bar.json"],
        work,
    )  # fmt: skip
    summary = shown.index(b"paramedic: blastp 30 queries")
    assert b"%|" not in shown[summary:] and b"100%|" in shown[:summary], shown


def test_summary_says_what_was_done(work: Path) -> None:
    done = paramedic(
        "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", "s.txt", "--np", "2",
        "--strategy", "fragments", "--batch", "25", cwd=work,
    )  # fmt: skip
    record = json.loads((work / "s.txt.run.json").read_text())
    assert record["batches"] == 2 and record["search_batch_queries"] == 26  # as the plan makes them
    assert "2 batches of up to 26 queries" in done.stderr, done.stderr
    assert "--batch 25 became 26: a batch holds whole report pieces" in done.stderr
    assert re.search(r"regenerations? of (up to )?\d+ quer", done.stderr)
    assert stat.S_IMODE((work / "s.txt.run.json").stat().st_mode) == 0o666 & ~_umask()


def test_auto_strategy_says_why(work: Path) -> None:
    done = paramedic("search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", "a.txt", "--np", "2",
                     cwd=work)  # fmt: skip
    reason = json.loads((work / "a.txt.run.json").read_text())["strategy_reason"]
    assert f"strategy: {reason['chosen']} (auto: {reason['reason']})" in done.stderr, done.stderr


def test_ship_without_site_is_refused(work: Path) -> None:
    done = paramedic("search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", "n.txt",
                     "--ship", "metadata", cwd=work, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("paramedic: error: --ship metadata says what crosses the link") and (
        "give --site" in done.stderr
    )
    assert not (work / "n.txt").exists()


def test_site_db_with_dotdot_is_explained_before_the_search(work: Path, tmp_path: Path) -> None:
    done = paramedic(
        "search", "blastp", "-query", "../q.fasta", "-db", "../db/uni", "-out", "x.txt",
        "--site", "tls://127.0.0.1:9", "--keys", "nokeys", cwd=(work / "db"), check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "with --site the -db string is sent to the storage site, which refuses '..'" in done.stderr
    assert f"-db {work / 'db' / 'uni'}" in done.stderr


def test_site_auto_with_culling_ships_the_output(work: Path, tmp_path: Path) -> None:
    """--site with --ship auto and -culling_limit was refused with advice (--strategy queries) that was
    refused again: it now ships the output compressed, and says so."""
    paramedic("keys", "--out", str(tmp_path / "keys"), "--server", "localhost", "--client", "compute")
    (tmp_path / "root").mkdir()
    site = StorageSite(
        work / "db" / "uni", tmp_path / "root", tmp_path / "keys" / "server", tmp_path / "s.log"
    )
    site.start()
    try:
        done = paramedic(
            "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", "culled.txt",
            "-culling_limit", "1", "--np", "2", "--site", site.url, "--keys", str(tmp_path / "keys" / "compute"),
            cwd=work,
        )  # fmt: skip
        advised = paramedic(  # the old advice, followed: --strategy queries with --ship auto
            "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", "advised.txt",
            "-culling_limit", "1", "--np", "2", "--strategy", "queries", "--site", site.url,
            "--keys", str(tmp_path / "keys" / "compute"), cwd=work,
        )  # fmt: skip
    finally:
        site.stop()
    assert "--ship auto: --strategy queries was asked, which makes no metadata" in advised.stderr
    assert (tmp_path / "root" / "advised.txt").read_bytes() == (tmp_path / "root" / "culled.txt").read_bytes()
    assert (
        "--ship auto: metadata needs the fragments strategy, which cannot honour -culling_limit"
        in done.stderr
    )
    record = json.loads((work / "culled.txt.run.json").read_text())
    assert record["strategy"] == "queries" and record["ship"]["mode"] == "compressed"
    written = tmp_path / "root" / "culled.txt"
    assert hashlib.sha256(written.read_bytes()).hexdigest() == record["ship"]["site_sha256"]


def test_help_texts() -> None:
    top = paramedic("--help").stdout
    assert "paramedic simulate --record pilot/hits.txt.run.json --queries 250000 \\\n" in top
    assert "paramedic report hits.txt.run.json" in top
    search = paramedic("search", "--help").stdout
    assert "quarter" not in search and "half the memory per worker" in " ".join(search.split())
    assert "--report PAGE.html" in search
    fmt = paramedic("format", "--help").stdout
    assert re.search(r"--quiet\s+no progress lines", fmt)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
