"""The BLAST+ fork server gives what a freshly started BLAST+ gives: same bytes, same exit codes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from paramedic.blast.forkserver import ForkServer, prelim_shim, shim_path
from paramedic.blast.prelim import DUMP_NAME
from tests.conftest import take_fasta

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(data_dir: Path):
    shim = shim_path()
    if shim is None:
        pytest.skip("no C compiler: the engine starts BLAST+ normally")
    fs = ForkServer(shutil.which("blastp"), shim)
    yield fs
    fs.close()


def test_same_output_as_a_fresh_process(server: ForkServer, data_dir: Path, tmp_path: Path) -> None:
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", tmp_path / "db.fasta", 300)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", tmp_path / "q.fasta", 4)
    subprocess.run(
        ["makeblastdb", "-in", "db.fasta", "-dbtype", "prot", "-out", "db"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    for outfmt in ("0", "5", "6"):
        argv = ["blastp", "-query", "q.fasta", "-db", "db", "-outfmt", outfmt, "-evalue", "10"]
        fresh = subprocess.run(argv, cwd=tmp_path, capture_output=True, check=True).stdout
        code = server.run(argv, str(tmp_path), str(tmp_path / "forked.out"), str(tmp_path / "forked.err"))
        assert code == 0
        assert (tmp_path / "forked.out").read_bytes() == fresh
    # Many runs in a row stay correct (no state leaks from one child to the next).
    for _ in range(20):
        assert server.run(argv, str(tmp_path), str(tmp_path / "again.out"), "") == 0
    assert (tmp_path / "again.out").read_bytes() == fresh


def test_failures_keep_their_exit_code_and_message(server: ForkServer, tmp_path: Path) -> None:
    argv = ["blastp", "-query", "missing.fasta", "-db", "nodb"]
    fresh = subprocess.run(argv, cwd=tmp_path, capture_output=True)
    code = server.run(argv, str(tmp_path), str(tmp_path / "o"), str(tmp_path / "e"))
    assert code == fresh.returncode != 0
    assert (tmp_path / "e").read_bytes() == fresh.stderr


def test_a_requests_environment_reaches_its_child_only(data_dir: Path, tmp_path: Path) -> None:
    """One server, the preliminary-list shim preloaded, runs every kind of search of a job: the mode goes
    with each request. A search asking for its lists writes them; the next, plain one, does not."""
    shim, lists = shim_path(), prelim_shim()
    if shim is None or lists is None:
        pytest.skip("no C compiler: the engine starts BLAST+ normally")
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", tmp_path / "db.fasta", 300)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", tmp_path / "q.fasta", 4)
    subprocess.run(
        ["makeblastdb", "-in", "db.fasta", "-dbtype", "prot", "-out", "db"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    argv = ["blastp", "-query", "q.fasta", "-db", "db", "-outfmt", "6"]
    fresh = subprocess.run(argv, cwd=tmp_path, capture_output=True, check=True).stdout
    server = ForkServer(shutil.which("blastp"), shim, str(lists))
    try:
        dump = tmp_path / DUMP_NAME
        assert server.run(argv, str(tmp_path), str(tmp_path / "a.out"), "", {"PARAMEDIC_PRELIM": "1"}) == 0
        assert dump.stat().st_size > 0 and (tmp_path / "a.out").read_bytes() == fresh
        dump.unlink()
        assert server.run(argv, str(tmp_path), str(tmp_path / "b.out"), "") == 0
        assert not dump.exists() and (tmp_path / "b.out").read_bytes() == fresh
        with pytest.raises(ValueError):
            server.run(argv, str(tmp_path), str(tmp_path / "c.out"), "", {"A=B": "1"})
    finally:
        server.close()


def test_prestarted_servers_go_one_to_each_thread_that_asks(tmp_path: Path) -> None:
    """`prestart` starts servers before the worker threads exist; each thread that then asks gets one of
    them (not a new one), no two threads share one, and they run BLAST+ like any other; closing stops
    the spares too."""
    import threading

    from paramedic.blast import forkserver

    if shim_path() is None:
        pytest.skip("no C compiler: the engine starts BLAST+ normally")
    blastp = shutil.which("blastp")
    assert blastp is not None
    forkserver.close_fork_servers()
    forkserver.prestart(blastp, None, 2)
    spares = list(forkserver._spares[(blastp, None)])
    got: dict[str, forkserver.ForkServer | None] = {}

    def ask(name: str) -> None:
        server = forkserver.server_for(blastp, None)
        got[name] = server
        assert server is not None
        assert server.run(["blastp", "-version"], str(tmp_path), str(tmp_path / f"{name}.out"), "") == 0

    threads = [threading.Thread(target=ask, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {id(got["a"]), id(got["b"])} == {id(s) for s in spares}
    assert not forkserver._spares[(blastp, None)]
    assert (tmp_path / "a.out").read_bytes() == subprocess.run(
        [blastp, "-version"], capture_output=True
    ).stdout
    forkserver.prestart(blastp, None, 1)
    spare = forkserver._spares[(blastp, None)][0]
    forkserver.close_fork_servers()
    assert spare._proc.poll() is not None and not forkserver._spares


def test_a_search_whose_engine_was_killed_outright_is_killed_too(tmp_path: Path) -> None:
    """Issue 23 (item 17, probed again): an engine killed with SIGKILL (the OOM killer, a user's kill -9
    of a local search) left its BLAST+ runs searching, for nobody, as long as their searches took. The
    fork server sees its request pipe hang up and kills the run. Here the run blocks (its -query is a FIFO
    nobody writes), so it could only end by being killed."""
    import os
    import signal
    import sys
    import time

    if shim_path() is None:
        pytest.skip("no C compiler: the engine starts BLAST+ normally")
    fifo = tmp_path / "q.fifo"
    os.mkfifo(fifo)
    engine = subprocess.Popen(
        [sys.executable, "-c", (
            "import shutil, sys\n"
            "from paramedic.blast.forkserver import ForkServer, shim_path\n"
            "fs = ForkServer(shutil.which('blastp'), shim_path())\n"
            "print(fs._proc.pid, flush=True)\n"
            f"fs.run(['blastp', '-query', {str(fifo)!r}, '-db', 'none'], {str(tmp_path)!r}, '', '')\n"
        )],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert engine.stdout is not None
    server = int(engine.stdout.readline())
    children = Path(f"/proc/{server}/task/{server}/children")
    deadline = time.monotonic() + 30
    while not (run := children.read_text().split()):
        assert time.monotonic() < deadline, "the fork server started no run"
        time.sleep(0.02)
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    engine.stdout.close()

    def searching(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while searching(int(run[0])) and time.monotonic() < deadline:
        time.sleep(0.02)
    alive = searching(int(run[0]))
    if alive:  # let it end: a writer opens and closes the FIFO it waits on
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not alive, "the BLAST+ run went on after its engine was killed"


def test_a_dead_or_stopped_server_is_replaced_and_a_bounded_run_is_not_waited_for(
    data_dir: Path, tmp_path: Path
) -> None:
    """Issue 23: a thread's server that died failed every later run of that thread ("fork server
    stopped"), and one stopped (SIGSTOP) held its thread for good. Now a run inside `bounded` fails at its
    deadline with the server killed, and the thread's next run gets a new server, as after a death."""
    import os
    import signal
    import threading
    import time

    from paramedic.blast import forkserver
    from paramedic.blast.tools import run_tool

    if shim_path() is None:
        pytest.skip("no C compiler: the engine starts BLAST+ normally")
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", tmp_path / "db.fasta", 50)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", tmp_path / "q.fasta", 2)
    subprocess.run(["makeblastdb", "-in", "db.fasta", "-dbtype", "prot", "-out", "db"], cwd=tmp_path, check=True,
                   capture_output=True)  # fmt: skip
    argv = ["blastp", "-query", "q.fasta", "-db", "db", "-outfmt", "6"]
    fresh = subprocess.run(argv, cwd=tmp_path, capture_output=True, check=True).stdout
    outcomes: list[object] = []

    def server() -> forkserver.ForkServer:
        (only,) = [s for k, s in forkserver._servers.items() if k[2] == threading.get_ident()]
        return only

    def thread() -> None:  # a thread of its own: its servers are its own, and end with the test
        try:
            outcomes.append(run_tool(argv, cwd=tmp_path).stdout)
            first = server()
            os.kill(first._proc.pid, signal.SIGKILL)  # died
            first._proc.wait()
            outcomes.append(run_tool(argv, cwd=tmp_path).stdout)  # before: "fork server stopped"
            second = server()
            assert second is not first
            os.kill(second._proc.pid, signal.SIGSTOP)  # stopped
            start = time.monotonic()
            with forkserver.bounded(1.0):
                try:
                    run_tool(argv, cwd=tmp_path)
                except Exception as exc:  # the run's failure, said as BLAST+ failures are
                    outcomes.append((str(exc), time.monotonic() - start, second._proc.poll()))
            outcomes.append(run_tool(argv, cwd=tmp_path).stdout)
            assert server() is not second
        except BaseException as exc:  # handed to the test
            outcomes.append(exc)

    worker = threading.Thread(target=thread, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "a run waited for a stopped fork server"
    assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
    assert outcomes[0] == outcomes[1] == outcomes[3] == fresh
    message, seconds, status = outcomes[2]  # type: ignore[misc]
    assert "fork server did not answer in time" in message and seconds < 10, outcomes[2]
    assert status == -signal.SIGKILL  # killed and reaped
