"""Resume (issue 11 item 16): a search whose every rank is SIGKILLed, run again with the same command,
continues from its journal and writes the bytes an uninterrupted run writes; a changed search is refused,
--restart starts afresh, two runs never share a journal. Real mpiexec ranks, real BLAST+, real signals,
a real storage site over TLS."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import BIN, paramedic
from tests.support.databases import Databases
from tests.support.processes import alive
from tests.support.site import StorageSite

# alone: a killed job's MPICH files are found by a before/after look at /dev/shm and /tmp
pytestmark = [pytest.mark.integration, pytest.mark.alone]

QUERIES = 60
FRAGMENTS = 6
# Small search tasks and one query per report piece: many tasks of each kind, so a kill lands between two.
# every fragment its own search (not grouped), so that a kill falls among many journaled searches
ENGINE = [
    "--strategy",
    "fragments",
    "--fragment-groups",
    "off",
    "--batch",
    "6",
    "--regen-batch",
    "1",
    "--quiet",
]


@dataclass
class Data:
    base: Path
    queries: Path
    db: Path
    reference: bytes  # the uninterrupted run's output (outfmt 0)


@pytest.fixture(scope="module")
def data(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Data:
    base = tmp_path_factory.mktemp("resume")
    databases.place(base, 6000, fragments=FRAGMENTS)
    queries = databases.queries(base / "q.fasta", QUERIES)
    paramedic(
        "search", "blastp", *blast_args(queries, base / "db/uni", base / "ref.txt"), *ENGINE, "--np", "2"
    )
    return Data(base, queries, base / "db/uni", (base / "ref.txt").read_bytes())


def blast_args(queries: Path, db: Path, out: Path | str) -> list[str]:
    return ["-query", str(queries), "-db", str(db), "-out", str(out), "-evalue", "1e-5"]


def records(journal: Path, kind: str) -> list[str]:
    try:
        return [n for n in os.listdir(journal / kind) if not n.startswith(".")]
    except FileNotFoundError:
        return []


def kill_every_rank_when(
    command: list[str], cwd: Path, journal: Path, ready, limit: float = 120, ranks: int = 3
) -> None:
    """Run `command` under our own `mpiexec -n <ranks>` and SIGKILL mpiexec and every rank (with its BLAST+
    processes) as soon as `ready(journal)` holds: as a node loss or a batch system's hard kill would."""
    ranks_dir = cwd / "ranks"
    ranks_dir.mkdir(exist_ok=True)
    tmp = cwd / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "PARAMEDIC_RANKS_DIR": str(ranks_dir), "TMPDIR": str(tmp)}
    before = mpich_leftovers()
    mpiexec = subprocess.Popen(
        [str(BIN / "mpiexec"), "-n", str(ranks), sys.executable, "-m", "paramedic", *command],
        cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + limit
    try:
        while not ready(journal):
            assert mpiexec.poll() is None, f"the search ended before the kill: {mpiexec.stderr.read()!r}"
            assert time.monotonic() < deadline, "the search never reached the point to kill it at"
            time.sleep(0.01)
    finally:
        ranks = [int(p.name) for p in ranks_dir.iterdir() if p.name.isdigit()]
        for pid in ranks:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass
        os.killpg(mpiexec.pid, signal.SIGKILL)
        mpiexec.wait()
        mpiexec.stderr.close()  # type: ignore[union-attr]
    for pid in ranks:  # every rank is gone before the next run starts
        while alive(pid):
            time.sleep(0.05)
    for path in mpich_leftovers() - before:  # what MPICH leaves when nothing of the job could clean up
        path.unlink(missing_ok=True)


def mpich_leftovers() -> set[Path]:
    """MPICH's shared memory and hydra's topology file: a job killed outright leaves them (the launcher
    removes them after a job it supervised; here every process of the job is killed)."""
    return set(Path("/dev/shm").glob("mpich_shm_*")) | set(Path("/tmp").glob("hydra_hwloc_xmlfile_*"))


def searches_done(at_least: int):
    return lambda journal: len(records(journal, "search")) >= at_least and not records(journal, "piece")


def pieces_done(at_least: int):
    return lambda journal: len(records(journal, "piece")) >= at_least


def total_searches(record: dict) -> int:
    return sum(rank["tasks"].get("search", 0) for rank in record["ranks_stats"])


@pytest.mark.parametrize(
    "kill_at", [searches_done(3), pieces_done(1)], ids=["while searching", "while writing"]
)
def test_killed_search_run_again_continues_and_equals_an_uninterrupted_run(
    data: Data, tmp_path: Path, kill_at
) -> None:
    out = tmp_path / "hits.txt"
    journal = tmp_path / ".hits.txt.journal"
    command = ["search", "blastp", *blast_args(data.queries, data.db, out), *ENGINE]
    kill_every_rank_when(command, tmp_path, journal, kill_at)
    kept_searches, kept_pieces = len(records(journal, "search")), len(records(journal, "piece"))
    assert kill_at(journal) and not out.exists()

    # run again, by the launcher and with fewer ranks: the journal's plan is followed
    proc = paramedic(*command, "--np", "1", cwd=tmp_path)
    assert out.read_bytes() == data.reference
    record = json.loads((tmp_path / "hits.txt.run.json").read_text())
    assert record["resumed"]["searches"] >= kept_searches > 0
    assert record["resumed"]["pieces"] >= kept_pieces
    # only unfinished work was searched again: this run's searches and the kept ones make one full grid
    assert total_searches(record) + record["resumed"]["searches"] == record["batches"] * FRAGMENTS
    assert not journal.exists()  # the output is complete: the journal is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hits.txt", "hits.txt.run.json", "ranks", "tmp"]
    assert proc.stderr == ""


def test_partitions_killed_and_run_again_continue_from_the_journal(data: Data, tmp_path: Path) -> None:
    """Issue 13 with issue 11: a job of 2 partitions killed while searching resumes from its journal, in
    partitions again: the kept searches are read back from the journal's store by the partition masters."""
    out = tmp_path / "hits.txt"
    journal = tmp_path / ".hits.txt.journal"
    command = ["search", "blastp", *blast_args(data.queries, data.db, out), *ENGINE, "--partition-size", "2"]
    kill_every_rank_when(command, tmp_path, journal, searches_done(4), ranks=5)
    assert not out.exists() and len(records(journal, "search")) >= 4
    paramedic(*command, "--np", "4", cwd=tmp_path)
    assert out.read_bytes() == data.reference
    record = json.loads((tmp_path / "hits.txt.run.json").read_text())
    assert record["partitions"] == 2 and record["resumed"]["searches"] >= 4
    assert total_searches(record) + record["resumed"]["searches"] == record["batches"] * FRAGMENTS
    assert not journal.exists()


def test_a_changed_search_is_refused_and_restart_starts_afresh(data: Data, tmp_path: Path) -> None:
    out = tmp_path / "hits.txt"
    journal = tmp_path / ".hits.txt.journal"
    queries = tmp_path / "q.fasta"
    queries.write_bytes(data.queries.read_bytes())
    command = ["search", "blastp", *blast_args(queries, data.db, out), *ENGINE]
    kill_every_rank_when(command, tmp_path, journal, searches_done(2))

    queries.write_text(data.queries.read_text().replace(">", ">x", 1))  # another first query name
    proc = paramedic(*command, cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "is from another search (different queries)" in lines[0] and "--restart" in lines[0], lines
    assert records(journal, "search") and not out.exists()  # the journal is left as it was

    queries.write_bytes(data.queries.read_bytes())
    stricter = [("1e-6" if a == "1e-5" else a) for a in command]
    proc = paramedic(*stricter, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "(different options)" in proc.stderr, proc.stderr

    paramedic(*command, "--restart", cwd=tmp_path)
    assert out.read_bytes() == data.reference
    record = json.loads((tmp_path / "hits.txt.run.json").read_text())
    assert record["resumed"] == {"searches": 0, "pieces": 0}
    assert total_searches(record) == record["batches"] * FRAGMENTS
    assert not journal.exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "flipped-still-parses"])
def test_a_damaged_journal_header_is_dropped_and_the_same_command_succeeds(
    data: Data, tmp_path: Path, damage: str
) -> None:
    """Issue 23 (found by the fault soak): a killed search's job.json (the journal's header) cut short,
    garbage, or with one byte flipped: refused on every rerun, exit 2, "add --restart" (or, when the
    flipped header still parsed, "from another search (different options)"). It holds nothing usable:
    the same command drops it with one line and writes BLAST+'s bytes."""
    out = tmp_path / "hits.txt"
    journal = tmp_path / ".hits.txt.journal"
    command = ["search", "blastp", *blast_args(data.queries, data.db, out), *ENGINE]
    kill_every_rank_when(command, tmp_path, journal, pieces_done(2))
    header = (journal / "job.json").read_bytes()
    if damage == "truncated":
        damaged = header[: len(header) * 2 // 3]
    elif damage == "garbage":
        damaged = bytes((i * 151 + 7) % 256 for i in range(len(header)))
    else:  # the -evalue's digit, as the soak flipped it: parses, and named the user's options before
        at = header.index(b'"1e-5"') + 4
        damaged = header[:at] + bytes([header[at] ^ 0x01]) + header[at + 1 :]
        assert json.loads(damaged) != json.loads(header)
    (journal / "job.json").write_bytes(damaged)
    proc = paramedic(*command, "--np", "1", cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == data.reference
    (line,) = proc.stderr.splitlines()
    assert line.startswith("paramedic: journal header .hits.txt.journal/job.json dropped (damaged: "), line
    assert line.endswith("its finished work is done again"), line
    record = json.loads((tmp_path / "hits.txt.run.json").read_text())
    assert record["resumed"] == {"searches": 0, "pieces": 0} and not journal.exists()


def test_a_journal_in_use_is_not_shared(data: Data, tmp_path: Path) -> None:
    """Two runs of one search at once: the second is refused (before it writes anything)."""
    out = tmp_path / "hits.txt"
    journal = tmp_path / ".hits.txt.journal"
    journal.mkdir()
    with open(journal / "lock", "ab") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # as the first run holds it
        proc = paramedic("search", "blastp", *blast_args(data.queries, data.db, out), *ENGINE, cwd=tmp_path,
                         check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "another search is writing this output now" in proc.stderr
    assert not out.exists()
    assert sorted(os.listdir(journal)) == ["lock", "piece", "search"]  # nothing of the refused run's


@pytest.fixture(scope="module")
def storage(data: Data, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("resume-site")
    (base / "root").mkdir()
    subprocess.run(["cp", "-r", str(data.db.parent), str(base / "replica")], check=True)
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    site = StorageSite(base / "replica" / "uni", base / "root", base / "keys" / "server", base / "serve.log")
    site.start()
    try:
        yield site, base / "keys" / "compute-a"
    finally:
        site.stop()


@pytest.mark.parametrize("mode", ["direct", "metadata"])
def test_killed_site_search_run_again_continues(data: Data, storage, tmp_path: Path, mode: str) -> None:
    """With --site the journal lives beside the run record; the run again cancels the killed run's site
    job (which still holds the output path) and ships what the journal holds again."""
    site, keys = storage
    out = f"resumed-{mode}.txt"
    journal = tmp_path / f".{out}.journal"
    command = [
        "search", "blastp", *blast_args(data.queries, data.db, out), *ENGINE,
        "--site", site.url, "--keys", str(keys), "--ship", mode,
    ]  # fmt: skip
    kill_every_rank_when(command, tmp_path, journal, searches_done(3))
    assert (journal / "site-job").exists()

    paramedic(*command, "--np", "1", cwd=tmp_path)
    assert (site.root / out).read_bytes() == data.reference
    record = json.loads((tmp_path / f"{out}.run.json").read_text())
    assert record["resumed"]["searches"] >= 3
    assert total_searches(record) + record["resumed"]["searches"] == record["batches"] * FRAGMENTS
    assert not journal.exists()
    assert "superseded" not in site.log()  # the old job was cancelled, not waited out


def test_query_segmentation_resumes_from_its_pieces(data: Data, tmp_path: Path) -> None:
    """--strategy queries: each piece is a whole-database search, journaled as it is written."""
    out = tmp_path / "hits.txt"
    journal = tmp_path / ".hits.txt.journal"
    engine = ["--strategy", "queries", "--batch", "6", "--quiet"]
    command = ["search", "blastp", *blast_args(data.queries, data.db, out), *engine]
    kill_every_rank_when(command, tmp_path, journal, pieces_done(2))
    kept = len(records(journal, "piece"))
    paramedic(*command, "--np", "1", cwd=tmp_path)
    assert out.read_bytes() == data.reference  # both strategies write BLAST+'s bytes
    record = json.loads((tmp_path / "hits.txt.run.json").read_text())
    assert record["resumed"]["pieces"] >= kept >= 2
    assert total_searches(record) + record["resumed"]["pieces"] == record["pieces"]  # each piece once
    assert not journal.exists()


def test_a_site_search_killed_after_the_site_published_finishes_when_run_again(
    data: Data, storage, tmp_path: Path
) -> None:
    """Killed after the storage site published the output but before the search heard so (it asks for
    the result every 0.2 s while the site regenerates), the run again was refused for ever: the site never
    replaces a file ("a file is already there", exit 8; seen by the fault soak). It now asks the site
    about the journal's job, and finds the output there."""
    site, keys = storage
    for attempt in range(10):  # the kill must land between the site's publishing and the search hearing it
        out = f"published-{attempt}.txt"
        journal = tmp_path / f".{out}.journal"
        command = [
            "search", "blastp", *blast_args(data.queries, data.db, out), *ENGINE,
            "--site", site.url, "--keys", str(keys), "--ship", "metadata",
        ]  # fmt: skip
        try:
            target = site.root / out
            kill_every_rank_when(command, tmp_path, journal, lambda _, target=target: target.exists())
        except AssertionError:
            continue  # the search heard in time and finished: try again
        if journal.exists():
            break
    else:
        pytest.fail("no kill landed after the site published and before the search heard it")
    proc = paramedic(*[a for a in command if a != "--quiet"], cwd=tmp_path)
    assert "already holds" in proc.stderr
    assert (site.root / out).read_bytes() == data.reference
    record = json.loads((tmp_path / f"{out}.run.json").read_text())
    assert record["ship"]["site_sha256"] and record["ship"]["chunks"] == 0  # nothing sent again
    assert not journal.exists()
