"""Output paths that are not regular files (issue 41, item 6): a FIFO, a character device, a
/proc/self/fd link. BLAST+ writes through them; paramedic wrote a temporary file and renamed it over
them, so that `-out /dev/null` as root replaced the system's own /dev/null with a regular file.

Never tested on the real /dev/null or /dev/stdout: on a FIFO made in tmp_path (read by a thread), on a
copy of /dev/null's device node made in tmp_path (root), and on links in tmp_path."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import BIN, paramedic
from tests.support.databases import Databases

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUERY_ARGS = ["-query", "q.fasta", "-db", "db/uni", "-outfmt", "6"]


@pytest.fixture(scope="module")
def work(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("targets")
    databases.place(root, 400, fragments=2)
    databases.queries(root / "q.fasta", 3)
    return root


@contextmanager
def fifo_read(fifo: Path) -> Iterator[list[bytes]]:
    """A FIFO at `fifo` whose bytes a thread reads until every writer closed it (its list gets them).
    The test holds a writer end until the block ends, so that the reader's end of file waits for the
    command, whatever it did to the name meanwhile."""
    os.mkfifo(fifo)
    keeper = os.open(fifo, os.O_RDWR)  # a FIFO opened read-write does not wait for a peer
    reader = os.open(fifo, os.O_RDONLY)
    got: list[bytes] = []

    def read() -> None:
        chunks = []
        while chunk := os.read(reader, 1 << 16):
            chunks.append(chunk)
        got.append(b"".join(chunks))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        os.close(keeper)
        thread.join(timeout=60)
        os.close(reader)
    assert not thread.is_alive()


def null_copy(path: Path) -> os.stat_result:
    """A character device node at `path` with /dev/null's numbers (root only)."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    real = os.stat("/dev/null")
    os.mknod(path, stat.S_IFCHR | 0o666, real.st_rdev)
    return os.stat(path)


def assert_still_device(path: Path, before: os.stat_result) -> None:
    after = os.lstat(path)
    assert stat.S_ISCHR(after.st_mode), f"{path} was replaced by a {stat.filemode(after.st_mode)} file"
    assert after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


def blastp_through(work: Path, target: Path) -> None:
    subprocess.run(["blastp", *QUERY_ARGS, "-out", str(target)], cwd=work, check=True, timeout=300)


def test_search_writes_through_a_fifo_as_blast_does(work: Path, tmp_path: Path) -> None:
    with fifo_read(tmp_path / "blast.fifo") as expected:
        blastp_through(work, tmp_path / "blast.fifo")
    fifo = tmp_path / "hits.fifo"
    with fifo_read(fifo) as got:
        paramedic("search", "blastp", *QUERY_ARGS, "-out", str(fifo), "--np", "2", "--quiet", cwd=work)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert expected[0] and got[0] == expected[0]
    # written through as standard output is: no partial file, journal or record beside the FIFO
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blast.fifo", "hits.fifo"]


def test_search_metadata_and_report_write_through_a_device(work: Path, tmp_path: Path) -> None:
    """-out, --metadata and --report naming a copy of /dev/null: it stays the device; the record still
    goes where --record says."""
    node = tmp_path / "null"
    before = null_copy(node)
    done = paramedic(
        "search", "blastp", *QUERY_ARGS, "-out", str(node), "--metadata", str(node), "--report", str(node),
        "--record", str(tmp_path / "run.json"), "--strategy", "fragments", "--np", "2", "--quiet", cwd=work,
    )  # fmt: skip
    assert done.stdout == ""
    assert_still_device(node, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "run.json"]
    assert json.loads((tmp_path / "run.json").read_text())["queries"] == 3
    page = paramedic("report", str(tmp_path / "run.json"), "-o", str(node))
    assert "report page" in page.stderr
    assert_still_device(node, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "run.json"]


def test_search_writes_through_a_link_to_its_standard_output(work: Path, tmp_path: Path) -> None:
    """`-out /dev/stdout` (a link to /proc/self/fd/1): here a link of the test's own, and the
    /proc/self/fd/1 path itself, each written through to the pipe the test reads."""
    expected = subprocess.run(
        ["blastp", *QUERY_ARGS, "-out", "/proc/self/fd/1"], cwd=work, capture_output=True, check=True
    ).stdout
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    for target in (str(link), "/proc/self/fd/1"):
        done = subprocess.run(
            [str(BIN / "paramedic"), "search", "blastp", *QUERY_ARGS, "-out", target, "--np", "2", "--quiet"],
            cwd=work, capture_output=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert expected and done.stdout == expected, target
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    assert [p.name for p in tmp_path.iterdir()] == ["stdout"]


def test_trace_writes_through_a_fifo(tmp_path: Path) -> None:
    mpicc, mpiexec = BIN / "mpicc", BIN / "mpiexec"
    if not mpicc.exists() or not mpiexec.exists():
        pytest.skip("the mpich wheel's mpicc (make setup)")
    program = tmp_path / "random_comm"
    subprocess.run(
        [str(mpicc), "-O2", "-o", str(program), str(ROOT / "examples/trace/random_comm.c")],
        check=True,
        capture_output=True,
    )
    fifo = tmp_path / "trace.fifo"
    with fifo_read(fifo) as got:
        done = paramedic("trace", "-out", str(fifo), "--", str(mpiexec), "-n", "2", str(program), "50", "3")
    assert "trace written" in done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert got[0].startswith(b"CLOG-02") and f"{len(got[0]):,} bytes" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["random_comm", "trace.fifo"]  # no rank logs


def test_trace_to_a_site_through_a_fifo_is_refused_before_it_runs(
    databases: Databases, tmp_path: Path
) -> None:
    """With --site the trace is read back from -out to ship it: a FIFO written through cannot be (the
    read waited for a writer for ever). Refused before the program runs: one line, exit 2."""
    keys = databases.keys(tmp_path / "keys")
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    marker = tmp_path / "ran"
    done = subprocess.run(
        [str(BIN / "paramedic"), "trace", "-out", "trace.fifo", "--site", "tls://127.0.0.1:9",
         "--keys", str(keys / "compute-a"), "--", str(BIN / "mpiexec"), "-n", "1", "touch", str(marker)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr
        == "paramedic: error: -out trace.fifo: with --site the trace is shipped from -out, so give a file\n"
    )
    assert not marker.exists() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_block_device_is_refused_and_kept(work: Path, tmp_path: Path) -> None:
    """Neither a file to replace nor a stream a search is written to: one line, exit 6, kept."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    node = tmp_path / "disk"
    os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(7, 250))  # never opened
    done = paramedic("search", "blastp", *QUERY_ARGS, "-out", str(node), "--np", "2", cwd=work, check=False)
    assert done.returncode == 6, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "is a block device" in done.stderr
    assert stat.S_ISBLK(os.lstat(node).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["disk"]


def test_a_worker_output_strategy_into_a_fifo_is_refused(work: Path, tmp_path: Path) -> None:
    """The workers write pieces at offsets of a file; a FIFO has none: one line, exit 2, before MPI."""
    os.mkfifo(tmp_path / "out.fifo")
    done = paramedic(
        "search", "blastp", *QUERY_ARGS, "-out", str(tmp_path / "out.fifo"), "--np", "2",
        "--output-strategy", "worker-individual", cwd=work, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "writes a file at offsets" in done.stderr and "Traceback" not in done.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "out.fifo").st_mode)
