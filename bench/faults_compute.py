"""bench/faults_compute: the soak's compute-side faults (issue 23), beside bench/faults.py's site clients.

A local client searches over and over, as a user on a compute node does: `--stage` on a small disk of
its own (an ext4 image or a tmpfs, as root) with a `--stage-limit` of about one fragment and a half, so
that most runs copy a volume; two `--mirror`s, a directory and the soak's storage site's replica over TLS
(through a proxy of its own); the report on stdout, into a pipe that the reader sometimes closes after a
few bytes (`| head -c N`). Meanwhile its chaos thread, at random times:

  - fills the stage disk (a copy hits ENOSPC or sees no room: the volume is searched where it lies);
  - makes the TLS mirror trickle (50 B/s, as the probe that found a 3 s search taking 57-119 s, or a few
    KB/s) or die (connections cut, new ones refused);
  - makes the directory mirror dead (moved away, then back);
  - changes a volume file of the directory mirror in place, size and times kept, then puts it back: its
    stripes do not verify, it is blamed and dropped, the search is BLAST+'s (issue 23, item 1);
  - changes a published copy in the stage cache in place, size and mtime kept (left so: the cache must
    find it): copied again before a use, or, changed during one, the run refuses (exit 4) (item 1).

The soak's own chaos adds stuck regenerations: the site's BLAST+ processes are stopped (SIGSTOP) for
longer than the site's --regen-timeout, then continued (`Soak.stop_regeneration`).

Checks (violations, as the soak's): a run read whole exits 0 with the reference's bytes (sha256); a run
whose reader closed the pipe exits 141 (or 0 if it had finished) and says nothing of it (warnings said
before, such as a mirror dropped, are fine); no other exit; no run
hangs; nothing left in its TMPDIR, no process of it left, no `.fill-` copy left in the stage directory,
and the stage directory within its limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

DOCUMENTED = "docs/ERRORS.md, 'Exit codes'"
FAULTS = (
    "stage disk full",
    "mirror trickle",
    "mirror dead",
    "directory mirror dead",
    "directory mirror flipped",
    "stage copy flipped",
)


class MirrorLink:
    """The tests' CuttingProxy in front of the site, for the TLS mirror only: trickle or dead at will."""

    def __init__(self, repo: Path, site_port: int):
        sys.path.insert(0, str(repo))
        from tests.support.site import CuttingProxy

        self.site_port = site_port
        self.proxy = CuttingProxy(site_port).__enter__()
        self.port = self.proxy.port

    def trickle(self, rate: float | None) -> None:
        self.proxy.down_rate = rate

    def dead(self, on: bool) -> None:
        """Dead: every connection closed, new ones forwarded to a port nobody listens on."""
        if on:
            with socket_free() as unused:
                self.proxy.target = unused
            with self.proxy.lock:
                sockets, self.proxy.sockets = self.proxy.sockets, []
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        else:
            self.proxy.target = self.site_port

    def close(self) -> None:
        self.proxy.__exit__(None, None, None)


@contextlib.contextmanager
def socket_free():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


class ComputeFaults:
    """The local client and its chaos; `soak` is bench/faults.py's Soak (its kinds, site, marks, checks)."""

    def __init__(self, soak: Any, tools: Any):
        """`tools`: bench/faults.py's module (SmallDisk, PARAMEDIC, MARK, marked, kill_marked, REPO)."""
        self.soak = soak
        self.tools = tools
        self.args = soak.args
        self.work: Path = soak.work / "compute-side"
        self.work.mkdir()
        self.rng = random.Random(self.args.seed * 7 + 1)
        self.counts: Counter[str] = Counter()
        self.exits: Counter[str] = Counter()
        self.stage_disk = tools.SmallDisk(
            self.work / "stage-disk", self.work / "stage.img", self.args.stage_disk_mib
        )
        self.stage = self.stage_disk.mountpoint / "cache"
        db = soak.work / "compute" / "db" / "uni"
        self.db = db
        sizes = [sum(p.stat().st_size for p in db.glob(f"f{i:03d}.*")) for i in range(self.args.fragments)]
        self.limit = max(sizes) * 3 // 2
        self.mirror = self.work / "mirror" / "uni"
        shutil.copytree(db, self.mirror)
        self.link = MirrorLink(tools.REPO, soak.site.port)
        self.stop = threading.Event()

    # -- the client -------------------------------------------------------------------------------------
    def client_loop(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.one_run(n)
            except Exception as exc:  # the harness itself
                self.soak.violation("harness error (compute side)", error=f"{type(exc).__name__}: {exc}")
                return
            self.stop.wait(self.rng.uniform(0.2, 1.5))

    def one_run(self, n: int) -> None:
        soak, a, tools = self.soak, self.args, self.tools
        kind = self.rng.choice(soak.kinds)
        aid = f"local{n:04d}"
        directory = self.work / "runs" / aid
        tmp = directory / "tmp"
        tmp.mkdir(parents=True)
        argv = [
            tools.PARAMEDIC, "search", "blastp", "-query", str(kind.queries), "-db", str(self.db), "-out", "-",
            "-outfmt", kind.outfmt, "--np", str(a.np), "--stage", str(self.stage), "--stage-limit", str(self.limit),
            "--mirror", str(self.mirror), "--mirror", f"tls://localhost:{self.link.port}/uni",
            "--keys", str(soak.work / "keys" / "compute-0"), "--quiet",
        ]  # fmt: skip
        close_after = self.rng.choice([None, None, 1, 100, 5000])  # bytes read before the reader goes
        env = {**os.environ, "TMPDIR": str(tmp), tools.MARK: f"{soak.run_id}:job:{aid}:"}
        env.pop("PARAMEDIC_DEBUG", None)
        started = time.monotonic()
        with open(directory / "stderr", "wb") as err:
            proc = subprocess.Popen(argv, cwd=directory, env=env, stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        assert proc.stdout is not None
        digest, size, code = hashlib.sha256(), 0, None
        reader_closed = False
        # the reader blocks in read1 while a hung run says nothing: a watchdog says it hung at its time,
        # with what each of its processes waits in (the kernel's wchan, the threads), and kills it
        ended, hung = threading.Event(), threading.Event()

        def watchdog() -> None:
            if ended.wait(a.hang_seconds):
                return
            hung.set()
            prefix = f"{soak.run_id}:job:{aid}:"
            soak.violation("hang (compute side)", job=aid, seconds=a.hang_seconds,
                           processes=_process_states(tools.marked(prefix)))  # fmt: skip
            tools.kill_marked(prefix)

        threading.Thread(target=watchdog, daemon=True, name=f"watchdog-{aid}").start()
        try:
            deadline = started + a.hang_seconds
            while True:
                chunk = proc.stdout.read1(65536) if close_after is None else proc.stdout.read1(close_after)
                if not chunk:
                    break
                digest.update(chunk)
                size += len(chunk)
                if close_after is not None and size >= close_after:
                    proc.stdout.close()  # the reader goes, as `head -c N` does
                    reader_closed = True
                    break
                if time.monotonic() > deadline:
                    break
            left = max(1.0, deadline - time.monotonic())
            code = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            if not hung.is_set():
                soak.violation("hang (compute side)", job=aid, seconds=a.hang_seconds)
            tools.kill_marked(f"{soak.run_id}:job:{aid}:")
            code = proc.wait()
        finally:
            ended.set()
            with contextlib.suppress(OSError):
                proc.stdout.close()
        seconds = time.monotonic() - started
        self.exits[str(code)] += 1
        self.counts["runs"] += 1
        stderr = (directory / "stderr").read_text(errors="replace")
        where = {"job": aid, "exit": code, "reader_closed_after": close_after if reader_closed else None,
                 "seconds": round(seconds, 1)}  # fmt: skip
        if "Traceback" in stderr or "internal" in stderr:
            soak.violation("traceback or internal error (compute side)", **where, stderr=stderr[-600:])
        if reader_closed:
            said = [line for line in stderr.splitlines() if line.strip()]
            refused = code == 4 and (  # the flip came first (session 17)
                _refused_damaged_db(stderr, self.db) or _refused_changed_copy(stderr, self.stage)
            )
            if not refused and (
                code not in (0, 141) or not all(line.startswith("paramedic: warning: ") for line in said)
            ):
                soak.violation("closed pipe: not 141 quietly", **where, stderr=stderr[-600:])
            self.counts["pipes closed by the reader"] += 1
        elif code == 4 and _refused_damaged_db(stderr, self.db):
            self.counts["refused: the -db changed in place (the soak's bit flips)"] += 1
        elif code == 4 and _refused_changed_copy(stderr, self.stage):
            self.counts["refused: a stage copy changed during its use (the soak's bit flips)"] += 1
        elif hung.is_set():
            pass  # said by the watchdog, with its processes' states
        elif code != 0:
            soak.violation("compute-side run failed", **where, stderr=stderr[-600:])
        elif digest.hexdigest() != kind.sha256:
            soak.violation("compute-side output differs from the reference", **where, size=size)
        else:
            self.counts["outputs verified"] += 1
        time.sleep(0.2)
        wait_until = time.monotonic() + 15
        while (left_pids := tools.marked(f"{soak.run_id}:job:{aid}:")) and time.monotonic() < wait_until:
            time.sleep(0.2)
        if left_pids:
            soak.violation("processes left behind (compute side)", **where, pids=left_pids)
            tools.kill_marked(f"{soak.run_id}:job:{aid}:")
        tmp_left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
        if tmp_left and not hung.is_set():  # a hung run killed with -9 could not clean up
            soak.violation("left behind in TMPDIR (compute side)", **where, files=tmp_left[:10])
        fills = (
            [str(p.relative_to(self.stage)) for p in self.stage.glob("*/.fill-*")]
            if self.stage.exists()
            else []
        )
        if fills:  # another run may be copying now: only this client uses the cache, and it ran alone
            soak.violation("a copy left half-made in the stage directory", **where, files=fills[:5])
        staged = _published_bytes(self.stage)
        if staged > self.limit:
            soak.violation("stage directory over --stage-limit", **where, bytes=staged, limit=self.limit)
        self.counts["seconds"] += int(seconds)
        shutil.rmtree(directory, ignore_errors=True)

    # -- its chaos --------------------------------------------------------------------------------------
    def chaos(self) -> None:
        a = self.args
        while not self.stop.wait(self.rng.uniform(*a.compute_fault_every)):
            what = self.rng.choice(FAULTS)
            seconds = self.rng.uniform(5.0, 20.0)
            self.soak.event(what, seconds=round(seconds, 1))
            self.tools.log(f"compute side: {what} for {seconds:.1f} s")
            self.counts[what] += 1
            if what == "stage disk full":
                if not self.stage_disk.can_fill:
                    continue
                self.stage_disk.fill(0)
                try:
                    self.stop.wait(seconds)
                finally:
                    self.stage_disk.release()
            elif what == "stage copy flipped":
                copies = (
                    sorted(p for p in self.stage.glob("*/f*/f[0-9]*.*") if p.is_file())
                    if self.stage.exists()
                    else []
                )
                if copies:
                    with contextlib.suppress(OSError):  # evicted or discarded meanwhile: nothing to flip
                        _flip_keeping_times(self.rng.choice(copies), self.rng)
            elif what == "directory mirror flipped":
                volumes = sorted(self.mirror.glob("f[0-9]*.*"))
                target = self.rng.choice(volumes)
                original = _flip_keeping_times(target, self.rng)
                try:
                    self.stop.wait(seconds)
                finally:
                    _put_back(target, original)
            elif what == "mirror trickle":
                self.link.trickle(self.rng.choice([50.0, 500.0, 4000.0, 20000.0]))
                try:
                    self.stop.wait(seconds)
                finally:
                    self.link.trickle(None)
            elif what == "mirror dead":
                self.link.dead(True)
                try:
                    self.stop.wait(seconds)
                finally:
                    self.link.dead(False)
            else:
                away = self.mirror.with_name("uni.away")
                os.rename(self.mirror, away)
                try:
                    self.stop.wait(seconds)
                finally:
                    os.rename(away, self.mirror)

    def start(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self.client_loop, daemon=True, name="compute-client"),
            threading.Thread(target=self.chaos, daemon=True, name="compute-chaos"),
        ]
        for thread in threads:
            thread.start()
        return threads

    def result(self) -> dict[str, Any]:
        return {
            "stage": {"disk": self.stage_disk.kind, "limit_bytes": self.limit},
            "runs": self.counts["runs"],
            "exits": dict(sorted(self.exits.items())),
            "outputs_verified_sha256": self.counts["outputs verified"],
            "pipes_closed_by_the_reader": self.counts["pipes closed by the reader"],
            "refused_damaged_db": self.counts["refused: the -db changed in place (the soak's bit flips)"],
            "refused_changed_stage_copy": self.counts[
                "refused: a stage copy changed during its use (the soak's bit flips)"
            ],
            "faults": {k: self.counts[k] for k in FAULTS},
        }

    def close(self) -> None:
        self.stop.set()
        self.link.close()
        self.stage_disk.close()


def _refused_damaged_db(stderr: str, db: Path) -> bool:
    """The one line that refuses a -db whose volume (or alias) the soak's chaos changed in place (not a mirror's
    fault: the -db is what the manifest is checked against, and a damaged one is refused, exit 4)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    digest = (
        last.startswith(f"paramedic: error: {db}: corrupt database: volume ") and "does not match the" in last
    ) or (  # a fragment alias rewritten to name another volume (session 17)
        last.startswith(f"paramedic: error: {db}: corrupt database: alias ")
        and "is not the one the manifest describes" in last
    )
    midway = last.startswith(f"paramedic: error: {db}: the database changed while this search ran (")
    return (digest or midway) and all(line.startswith("paramedic: warning: ") for line in lines[:-1])


def _process_states(pids: list[int]) -> list[dict[str, Any]]:
    """What each process waits in: its state, the kernel function it sleeps in, its threads' wchans."""
    states = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            threads = Counter(
                Path(f"/proc/{pid}/task/{task}/wchan").read_text() or "running"
                for task in os.listdir(f"/proc/{pid}/task")
            )
        except OSError:
            continue
        states.append({"pid": pid, "cmd": cmdline[:160], "state": state, "threads_by_wchan": dict(threads)})
    return states


def _refused_changed_copy(stderr: str, stage: Path) -> bool:
    """The one line that refuses a search whose stage copy the soak's chaos changed while it was read."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return (
        last.startswith(f"paramedic: error: --stage {stage}: the copy of ")
        and "changed while it was searched" in last
        and all(line.startswith("paramedic: warning: ") for line in lines[:-1])
    )


def _flip_keeping_times(path: Path, rng: random.Random) -> tuple[bytes, int, int]:
    """Change a few bytes of `path` in place (same inode and size) and put its times back; returns what
    `_put_back` needs."""
    st = path.stat()
    data = path.read_bytes()
    changed = bytearray(data)
    for _ in range(max(1, len(changed) // 4096)):
        if changed:
            changed[rng.randrange(len(changed))] ^= 0x5A
    with open(path, "r+b") as fh:
        fh.write(changed)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return data, st.st_atime_ns, st.st_mtime_ns


def _put_back(path: Path, original: tuple[bytes, int, int]) -> None:
    data, atime, mtime = original
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(atime, mtime))


def _published_bytes(stage: Path) -> int:
    """The published copies' bytes (what --stage-limit bounds; copies under way are reserved apart)."""
    if not stage.exists():
        return 0
    total = 0
    for path in stage.glob("*/*/*"):
        if path.is_file() and not path.parent.name.startswith("."):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
    return total
