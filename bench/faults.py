"""bench/faults: a soak of one storage site under faults (issue 11), for a bounded time.

Several compute clients (`paramedic search ... --site`, real MPI ranks, real BLAST+) ship small jobs, one
after another, to one real `paramedic serve` (real TLS, keys from `paramedic keys`) through Toxiproxy
(the set-up of bench/wan; without it, the tests' CuttingProxy). A job that fails runs again, the same
command in the same directory, up to --retries times, as a user would (a kept journal resumes it). Each
run has a TMPDIR and (as root, through a mount namespace) a /dev/shm of its own, so whatever it leaves
there is its own. Meanwhile a chaos thread, at random times:

  - kills clients: kill -9 of every process of the job (the launcher, mpiexec, the ranks, BLAST+: as a
    lost node or a batch system's cgroup kill does), kill -9 of one rank, or SIGTERM of the launcher
    (a batch system's time limit);
  - kills the site with kill -9 and restarts it on the same port and --root;
  - cuts the link: the proxy disabled (connections closed, new ones refused) for a moment or for longer
    than --ship-timeout, TCP resets, a stall (bytes held), a connection cut after a few kilobytes;
  - fills the disk: the site's --root is a small ext4 image (loop mount; else a size-limited tmpfs), and a
    filler file grows until the free space is below the site's --reserve, or nothing at all, then goes;
  - floods the site with 200 to 3,000 unauthenticated connections, from 8 addresses or from the compute
    sites' own, half with a ClientHello begun (a real hello must get through: else a violation);
  - changes a volume file of the site's replica or of the compute database in place, size and times kept,
    then puts it back (issue 23): a search that read it mid-way must refuse (exit 4), never exit 0;
  - among the query sets, one BLAST+ cannot search at all (all-X proteins: no preliminary stage) (issue 23);
  - stops the site's BLAST+ runs (SIGSTOP) for longer than its --regen-timeout (a regeneration that never
    returns), then continues them (issue 23, item 7);
  - before a failed job runs again, changes a piece of its kept journal in place, size and times kept
    (--journal-flips of the resumes): the resume must redo that work or refuse, never publish other
    bytes (issue 23, items 1 and 10).

Issue 41's kinds (bench/faults_site.py), each bounded in count and time, against the same site: bursts of
~1,500 connections from 6 addresses closed at once (half reset); trace metadata declaring 1 GiB in a zstd
column and a setup holding 15 MiB of `[],` (an object bomb), both refused with their reason; 32 small jobs of
one compute site while another's job is timed (--fair-seconds); SIGTERM to a running `paramedic trace` and to
a running `paramedic ship` (exit 130, one line, no process, /dev/shm segment or file left, the job cancelled).

Beside the site's clients, a local client (bench/faults_compute.py; `--no-compute-side` leaves it out)
searches with --stage on a small disk of its own and two mirrors, into a pipe its reader may close early,
while the stage disk fills up and the mirrors trickle or die (issue 23, items 5, 6, 9, 12).

Checks (each failure is a violation; any violation makes the exit status 1):
  - a job that exited 0 has its output at the site byte-identical (sha256) to a local `paramedic search`
    of the same queries and options (the reference, computed once);
  - a run that failed exited with a documented code (docs/ERRORS.md, "Exit codes"; 1, an internal error, is a bug,
    as is any message that says "internal") and printed one line `paramedic: ...` (and the launcher's
    line when a journal is kept), nothing on stdout, no traceback; no run hangs (--hang-seconds);
  - nothing is left behind: no files in a finished run's TMPDIR, /dev/shm or working directory but its run
    record (or, after a failure, its journal) (a run whose every process was killed with -9 cannot clean
    up: what it leaves is counted apart, not a violation), no process of a finished run, and at the end,
    once abandoned site jobs had time to expire (--open-idle), no
    hidden partial file under the site's --root, no open job or job data in its state, no file at the site
    other than verified outputs; no traceback in the site's log;
  - the site's memory stays under a bound (see `memory_bound`), sampled twice a second.

Writes a summary and --out (JSON). Needs root for the loop mount (falls back to a plain directory, and no
disk-full episodes, without it) and `bash bench/wan/setup.sh` for Toxiproxy.

    .venv/bin/python bench/faults.py                    # ~10 minutes, then the checks (~2 more)
    .venv/bin/python bench/faults.py --minutes 2 --seed 7
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
TOOLS = Path(os.environ.get("PARAMEDIC_TOOLS", Path.home() / ".cache/paramedic/tools"))
BIN = Path(sys.executable).parent
PARAMEDIC = str(BIN / "paramedic")
MARK = "PARAMEDIC_SOAK"  # every process we start carries MARK=<run>:<label> in its environment
# docs/ERRORS.md "Exit codes"; 1 is an internal error (a bug)
DOCUMENTED_FAILURES = {2, 3, 4, 5, 6, 7, 8, 130}
LISTENING = re.compile(r"listening on [^ ]*:(\d+) ")
STATE = ".paramedic-state"
JOB_RECORD_FILES = {"job.json", "done.json", "failed.json"}
MODES = ("direct", "compressed", "metadata")
ATTACKS = ("burst", "bomb", "small", "signal")  # issue 41's kinds (bench/faults_site.py)
# the first word of the soak's counts that faults_site's events make
ATTACK_WORDS = {"connection", "trace", "object", "many", "ship", "small", "another"}
KEPT = "paramedic: finished work is kept in "  # the launcher's second line when a journal is kept
# Notes a run prints before it searches, about its journal (work it does again), not the error: a run
# that then fails says its error in one line after them (session 17: a journal of a run killed while a
# volume was flipped, resumed after it was put back, then refused by the site, was counted "not one line")
JOURNAL_NOTES = (
    "paramedic: the database's files changed since this journal was written",
    "paramedic: journal ",
    # BLAST+'s own warnings, relayed as BLAST+ prints them (issue 23 item 18: an all-X query's "nothing to
    # search"); a run that then fails still says its error in one line (session 21: counted "not one line")
    "paramedic: warning: ",
)


class Interrupted(Exception):
    """SIGTERM or SIGHUP: unwind as Ctrl-C does, so every process and the mount are cleaned up."""


def log(message: str) -> None:
    print(f"faults {time.strftime('%H:%M:%S')} {message}", flush=True)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def take_fasta(source: Path, dest: Path, count: int, start: int = 0) -> None:
    records = source.read_text().split("\n>")[start : start + count]
    text = "\n>".join(records)
    dest.write_text(("" if text.startswith(">") else ">") + text.rstrip("\n") + "\n")


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"faults: {' '.join(argv[:3])} ... exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


# ----------------------------------------------------------------------------- processes, by their mark


def marked(prefix: str) -> list[int]:
    """Processes whose environment holds MARK=<prefix>... (ours: the run id starts every prefix)."""
    needle = f"{MARK}={prefix}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                environ = fh.read()
            with open(f"/proc/{entry.name}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if any(var.startswith(needle) for var in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def kill_marked(prefix: str, rounds: int = 20) -> int:
    """SIGKILL every process with the mark, again until none is left (a child forked meanwhile too)."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = [p for p in marked(prefix) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.05)
    return len(killed)


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------- the small, nearly full disk


class SmallDisk:
    """The site's --root on a file system of its own: an ext4 image (loop mount, no blocks reserved for
    root), else a size-limited tmpfs, else (not root, or no loop devices) a plain directory."""

    def __init__(self, mountpoint: Path, image: Path, mib: int):
        self.mountpoint = mountpoint
        self.image = image
        self.kind = "directory"
        self.mounted = False
        self.filler = mountpoint / "filler.bin"  # not hidden, so the leftover check would name it
        mountpoint.mkdir(parents=True)
        if os.geteuid() == 0:
            try:
                subprocess.run(["truncate", "-s", f"{mib}M", str(image)], check=True)
                subprocess.run(
                    ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True, capture_output=True
                )
                subprocess.run(
                    ["mount", "-o", "loop", str(image), str(mountpoint)], check=True, capture_output=True
                )
                self.kind, self.mounted = "ext4 image (loop)", True
            except (OSError, subprocess.CalledProcessError):
                image.unlink(missing_ok=True)
                try:
                    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(mountpoint)],
                                   check=True, capture_output=True)  # fmt: skip
                    self.kind, self.mounted = "tmpfs", True
                except (OSError, subprocess.CalledProcessError):
                    pass

    @property
    def can_fill(self) -> bool:
        return self.mounted

    def free(self) -> int:
        info = os.statvfs(self.mountpoint)
        return info.f_bavail * info.f_frsize

    def fill(self, leave: int) -> int:
        """Grow the filler until about `leave` bytes are free (0: until the file system refuses more)."""
        grown = 0
        with open(self.filler, "ab") as fh:
            while (want := self.free() - leave) > 0:
                step = min(want, 4 << 20)
                try:
                    os.posix_fallocate(fh.fileno(), os.fstat(fh.fileno()).st_size, step)
                except OSError:  # nearly full: plain writes take the last blocks
                    try:
                        os.write(fh.fileno(), b"\0" * 4096)
                        step = 4096
                    except OSError:
                        break
                grown += step
            with contextlib.suppress(OSError):
                os.fsync(fh.fileno())
        return grown

    def release(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        self.release()
        if self.mounted:
            for _ in range(20):
                if subprocess.run(["umount", str(self.mountpoint)], capture_output=True).returncode == 0:
                    self.mounted = False
                    break
                time.sleep(0.5)
            if self.mounted:
                subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        self.image.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- the link


class ToxiLink:
    """Toxiproxy in front of the site; faults through its HTTP API, a small latency both ways always."""

    backend = "toxiproxy"

    def __init__(self, upstream: int, logfile: Path, run_id: str, base_ms: int = 5):
        binary = TOOLS / "toxiproxy-server"
        self.api_port = free_port()
        env = {**os.environ, "LOG_LEVEL": "warn", MARK: f"{run_id}:toxiproxy"}
        with open(logfile, "ab") as out:
            self.proc = subprocess.Popen([str(binary), "-host", "127.0.0.1", "-port", str(self.api_port)],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                self.version = self.api("GET", "/version")
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit("faults: toxiproxy-server did not start") from None
                time.sleep(0.1)
        stamp = TOOLS / "toxiproxy-server.version"
        if stamp.exists():
            self.version = stamp.read_text().strip()
        made = self.api("POST", "/proxies", {"name": "site", "listen": "127.0.0.1:0",
                                             "upstream": f"127.0.0.1:{upstream}", "enabled": True})  # fmt: skip
        self.port = int(made["listen"].rsplit(":", 1)[1])
        for stream in ("upstream", "downstream"):
            self.toxic({"name": f"latency_{stream}", "type": "latency", "stream": stream,
                        "attributes": {"latency": base_ms, "jitter": 0}})  # fmt: skip

    def api(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        try:
            return json.loads(text) if text else None
        except ValueError:
            return text.strip()

    def toxic(self, spec: dict) -> None:
        self.api("POST", "/proxies/site/toxics", {"toxicity": 1.0, **spec})

    def untoxic(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self.api("DELETE", f"/proxies/site/toxics/{name}")

    def enabled(self, on: bool) -> None:
        self.api("POST", "/proxies/site", {"enabled": on})

    def fault(self, kind: str, seconds: float, rng: random.Random, stop: threading.Event) -> None:
        """One fault for `seconds` (or until `stop`), then the link as it was."""
        if kind in ("cut", "outage"):
            self.enabled(False)
            stop.wait(seconds)
            self.enabled(True)
            return
        name = f"fault_{kind}"
        if kind == "reset":
            spec = {"type": "reset_peer", "stream": "upstream", "attributes": {"timeout": 0}}
        elif kind == "stall":
            spec = {
                "type": "timeout",
                "stream": rng.choice(["upstream", "downstream"]),
                "attributes": {"timeout": 0},
            }
        else:  # "slice": every connection closed after a few kilobytes
            spec = {"type": "limit_data", "stream": rng.choice(["upstream", "downstream"]),
                    "attributes": {"bytes": rng.randint(2_000, 200_000)}}  # fmt: skip
        self.toxic({"name": name, **spec})
        try:
            stop.wait(seconds)
        finally:
            self.untoxic(name)

    def heal(self) -> None:
        with contextlib.suppress(OSError):
            self.enabled(True)
            for toxic in self.api("GET", "/proxies/site/toxics") or []:
                if toxic["name"].startswith("fault_"):
                    self.untoxic(toxic["name"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class CuttingLink:
    """Without Toxiproxy: the tests' CuttingProxy, re-armed for every fault (cuts only: a connection is
    closed after a few more kilobytes; no outage, stall or reset)."""

    backend = "CuttingProxy (tests/support/site.py): Toxiproxy absent, faults are connection cuts only"
    version = "-"

    def __init__(self, upstream: int):
        sys.path.insert(0, str(REPO))
        from tests.support.site import CuttingProxy

        self.proxy = CuttingProxy(upstream, cut_after=2**62).__enter__()
        self.port = self.proxy.port

    def fault(self, kind: str, seconds: float, rng: random.Random, stop: threading.Event) -> None:
        with self.proxy.lock:
            self.proxy.cuts = 0
            self.proxy.cut_after = self.proxy.forwarded + rng.randint(1, 200_000)
        stop.wait(min(seconds, 2.0))

    def heal(self) -> None:
        with self.proxy.lock:
            self.proxy.cut_after = 2**62

    def close(self) -> None:
        self.proxy.__exit__(None, None, None)


# ----------------------------------------------------------------------------- the storage site


class Site:
    """`paramedic serve` as a user runs it; kill -9 and restart on the same port and root."""

    def __init__(self, args: argparse.Namespace, work: Path, root: Path, run_id: str):
        self.argv_base = [
            PARAMEDIC, "serve", "--replica", str(work / "site" / "replica" / "uni"), "--root", str(root),
            "--keys", str(work / "keys" / "server"), "--io-workers", "2",
            "--open-idle", str(args.open_idle_seconds / 3600), "--reserve", f"{args.reserve_mib}M",
            "--regen-timeout", str(args.regen_timeout_seconds / 3600),
        ]  # fmt: skip
        self.logfile = work / "site.log"
        self.run_id = run_id
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.lock = threading.Lock()

    def start(self, timeout: float = 60.0) -> None:
        offset = self.logfile.stat().st_size if self.logfile.exists() else 0
        argv = [*self.argv_base, "--listen", f"127.0.0.1:{self.port}"]
        env = {**os.environ, MARK: f"{self.run_id}:site"}
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=out, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.logfile.read_bytes()[offset:].decode(errors="replace")
            match = LISTENING.search(text)
            if match:
                self.port = int(match.group(1))
                self.starts += 1
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"paramedic serve exited {self.proc.returncode}: {text.strip()[-500:]}")
            time.sleep(0.05)
        raise RuntimeError(f"paramedic serve did not listen within {timeout:.0f} s")

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else 0

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill9()

    def log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""


# ----------------------------------------------------------------------------- jobs


@dataclass
class Kind:
    """A query set and its options: the reference output is a local `paramedic search` of it."""

    index: int
    queries: Path
    outfmt: str
    sha256: str = ""
    size: int = 0


@dataclass
class Attempt:
    """One run of a job's command; a job that failed runs again, the same command in the same directory
    (as a user does, so a kept journal resumes it), up to --retries times."""

    aid: str
    job: str
    attempt: int
    client: int
    kind: Kind
    mode: str
    streams: int
    directory: Path  # this run's TMPDIR, /dev/shm, stdout and stderr
    workdir: Path  # the job's working directory (its run record and journal), the same for every run
    out: str  # relative to the site's --root
    proc: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    code: int | None = None
    killed: str = ""  # "tree", "rank", "term": what the chaos did to it
    ship: dict[str, Any] = field(default_factory=dict)
    message: str = ""  # a failed run's first line

    @property
    def cwd(self) -> Path:
        return self.workdir

    @property
    def tmp(self) -> Path:
        return self.directory / "tmp"

    shm: Path | None = None  # this job's private /dev/shm (MPICH's shared memory segments land there)


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.run_id = f"soak{os.getpid()}x{args.seed}"
        self.stop_chaos = threading.Event()
        self.stop_jobs = threading.Event()
        self.cleaning = False
        self.lock = threading.Lock()
        self.kinds: list[Kind] = []
        self.attempts: list[Attempt] = []
        self.running: dict[str, Attempt] = {}
        self.violations: list[dict[str, Any]] = []
        self.messages: Counter[str] = Counter()  # failed runs' messages, numbers as N
        self.counts: Counter[str] = Counter()
        self.events: list[dict[str, Any]] = []
        self.rss_peak = 0
        self.rss_tree_peak = 0
        self.rss_baseline = 0
        self.rss_samples: list[tuple[float, int]] = []
        self.site_down = threading.Event()  # set while the site is dead (between kill and restart)
        self.disk: SmallDisk | None = None
        self.link: ToxiLink | CuttingLink | None = None
        self.site: Site | None = None
        self.expected_tmp_leftovers = 0  # files in the TMPDIR of jobs whose every process was killed
        self.published_after_failure = 0
        self.shm_leftovers_after_kill = 0  # MPICH segments of jobs whose every process was killed
        self.rss_by_life: dict[int, int] = {}  # the site's process id -> its peak RSS
        self.shm: Path | None = None  # a tmpfs: each job gets a directory of it as its /dev/shm
        self.compute: Any = None  # bench/faults_compute.ComputeFaults, with --compute-side
        self.attacks: Any = None  # bench/faults_site.SiteAttacks: issue 41's kinds

    # -- bookkeeping ------------------------------------------------------------------------------------
    def violation(self, what: str, **detail: Any) -> None:
        with self.lock:
            self.violations.append({"what": what, **detail})
        log(f"VIOLATION {what}: {json.dumps(detail)[:400]}")

    def event(self, what: str, **detail: Any) -> None:
        with self.lock:
            self.counts[what] += 1
            self.events.append({"t": round(time.monotonic() - self.t0, 1), "what": what, **detail})

    # -- set-up -----------------------------------------------------------------------------------------
    def prepare(self) -> None:
        a, w = self.args, self.work
        log(f"work directory {w}; database: {a.proteins} proteins, {a.fragments} fragments")
        take_fasta(DATA / "mmseqs2" / "DB.fasta", w / "db.fasta", a.proteins)
        run([PARAMEDIC, "format", "--in", str(w / "db.fasta"), "--dbtype", "prot", "--fragments",
             str(a.fragments), "--out", str(w / "compute" / "db" / "uni"), "--quiet"])  # fmt: skip
        (w / "site").mkdir()
        shutil.copytree(w / "compute" / "db", w / "site" / "replica")  # a replica: a byte copy
        clients = [f"compute-{i}" for i in range(a.clients)] + ["attack-a", "attack-b"]  # faults_site's
        run([PARAMEDIC, "keys", "--out", str(w / "keys"), "--server", "localhost",
             *[x for c in clients for x in ("--client", c)]])  # fmt: skip
        (w / "queries").mkdir()
        (w / "gave-up").mkdir()
        (w / "reference").mkdir()
        outfmts = ["0", "7"]
        for k in range(a.kinds):
            queries = w / "queries" / f"q{k}.fasta"
            take_fasta(DATA / "mmseqs2" / "QUERY.fasta", queries, a.queries, start=k * a.queries)
            kind = Kind(k, queries, outfmts[k % len(outfmts)])
            ref = w / "reference" / f"k{k}.out"
            run([PARAMEDIC, "search", "blastp", "-query", str(queries), "-db", str(w / "compute" / "db" / "uni"),
                 "-out", str(ref), "-outfmt", kind.outfmt, "--np", str(a.np), "--quiet"], cwd=w / "reference")  # fmt: skip
            kind.sha256, kind.size = sha256_file(ref), ref.stat().st_size
            self.kinds.append(kind)
        # a query set BLAST+ cannot search at all (one batch of all-X proteins: no preliminary stage, issue
        # 23), in the commented tabular format whose report differs when its warning is lost
        queries = w / "queries" / "unsearchable.fasta"
        queries.write_text("".join(f">allx{i} nothing to search\n{'X' * 60}\n" for i in range(2)))
        kind = Kind(len(self.kinds), queries, "7")
        ref = w / "reference" / "unsearchable.out"
        run(
            [
                "blastp",
                "-query",
                str(queries),
                "-db",
                str(w / "compute" / "db" / "uni"),
                "-out",
                str(ref),
                "-outfmt",
                kind.outfmt,
            ],
            cwd=w / "reference",
        )  # fmt: skip  (BLAST+'s own bytes)
        kind.sha256, kind.size = sha256_file(ref), ref.stat().st_size
        self.kinds.append(kind)
        shutil.rmtree(w / "reference")
        log(f"{len(self.kinds)} references: {', '.join(f'{k.size:,} B' for k in self.kinds)}")

    # -- clients ----------------------------------------------------------------------------------------
    def client_loop(self, client: int) -> None:
        rng = random.Random(self.args.seed * 1000 + client)
        n = 0
        while not self.stop_jobs.is_set():
            n += 1
            kind = rng.choice(self.kinds)
            job = f"c{client}n{n:04d}"
            mode, streams = rng.choice(MODES), rng.randint(1, 3)
            workdir = self.work / "jobs" / job / "cwd"
            workdir.mkdir(parents=True)
            with self.lock:
                self.counts["jobs started"] += 1
            for attempt in range(1 + self.args.retries):
                if attempt and self.stop_jobs.is_set():
                    break
                if attempt and rng.random() < self.args.journal_flips:
                    self.flip_journal_piece(workdir, rng)
                at = Attempt(f"{job}t{attempt}", job, attempt, client, kind, mode, streams,
                             self.work / "jobs" / job / f"t{attempt}", workdir, f"runs/{job}-k{kind.index}.out")  # fmt: skip
                try:
                    self.run_attempt(at)
                except Exception as exc:  # the harness itself: say so, keep the soak going
                    self.violation("harness error", job=at.aid, error=f"{type(exc).__name__}: {exc}")
                    break
                if at.code == 0:
                    with self.lock:
                        self.counts["jobs done"] += 1
                        self.counts[f"jobs done at run {attempt + 1}"] += 1
                    break
                self.stop_jobs.wait(rng.uniform(2.0, 8.0))
            self.end_job(workdir, kind, f"runs/{job}-k{kind.index}.out")
            self.stop_jobs.wait(rng.uniform(0, 1.0))

    def flip_journal_piece(self, workdir: Path, rng: random.Random) -> None:
        """A byte of one file of the job's kept journal changed in place, its size and times kept."""
        pieces = sorted(p for p in workdir.rglob("*") if p.is_file() and _in_journal(p) and p.stat().st_size)
        if not pieces:
            return
        path = rng.choice(pieces)
        st = path.stat()
        with open(path, "r+b") as fh:
            at = rng.randrange(st.st_size)
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ 0x5A]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.event("journal piece flipped", path=str(path.relative_to(workdir)))  # counted there

    def end_job(self, workdir: Path, kind: Kind, out: str) -> None:
        """After a job's last run: what a failed job left (a journal kept for a resume that will not come
        now; an output the site published though no run heard it) is counted and removed."""
        journals = [p for p in workdir.iterdir() if p.name.endswith(".journal")] if workdir.exists() else []
        journals += [p for p in (workdir / "runs").glob(".*.journal")] if (workdir / "runs").exists() else []
        if journals:
            with self.lock:
                self.counts["journals kept by a job that gave up"] += len(journals)
        published = self.site_root / out
        if published.is_file():
            if sha256_file(published) != kind.sha256:
                self.violation("published output differs from the local run", path=out)
            else:
                with self.lock:
                    self.published_after_failure += 1
            published.unlink()
        if self.args.keep and journals:  # for a look at what a resume would start from
            shutil.move(workdir, self.work / "gave-up" / workdir.parent.name)
        shutil.rmtree(workdir, ignore_errors=True)

    def run_attempt(self, at: Attempt) -> None:
        a = self.args
        at.tmp.mkdir(parents=True)
        argv = [
            PARAMEDIC, "search", "blastp", "-query", str(at.kind.queries), "-db", str(self.work / "compute" / "db" / "uni"),
            "-out", at.out, "-outfmt", at.kind.outfmt, "--np", str(a.np), "--site", f"tls://localhost:{self.link.port}",
            "--keys", str(self.work / "keys" / f"compute-{at.client}"), "--ship", at.mode, "--streams", str(at.streams),
            "--ship-timeout", str(a.ship_timeout), "--quiet",
        ]  # fmt: skip
        if self.shm is not None:  # a mount namespace of its own, with a private /dev/shm: what the job's
            # MPICH leaves there is its own (shm_open names are global, /dev/shm is shared by everyone)
            at.shm = self.shm / at.aid
            at.shm.mkdir()
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                    'mount --bind "$0" /dev/shm && exec "$@"', str(at.shm), *argv]  # fmt: skip
        env = {**os.environ, "TMPDIR": str(at.tmp), MARK: f"{self.run_id}:job:{at.aid}:"}
        env.pop("PARAMEDIC_DEBUG", None)
        with open(at.directory / "stdout", "wb") as out, open(at.directory / "stderr", "wb") as err:
            at.proc = subprocess.Popen(argv, cwd=at.cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                       start_new_session=True)  # fmt: skip
        at.started = time.monotonic()
        with self.lock:
            self.attempts.append(at)
            self.running[at.aid] = at
            self.counts["runs started"] += 1
        try:
            at.code = at.proc.wait(timeout=a.hang_seconds)
        except subprocess.TimeoutExpired:
            self.violation("hang", job=at.aid, mode=at.mode, seconds=a.hang_seconds)
            kill_marked(f"{self.run_id}:job:{at.aid}:")
            at.code = at.proc.wait()
        finally:
            with self.lock:
                self.running.pop(at.aid, None)
        at.seconds = time.monotonic() - at.started
        if not self.cleaning:
            self.check_attempt(at)

    def check_attempt(self, at: Attempt) -> None:
        stderr = (at.directory / "stderr").read_text(errors="replace")
        stdout = (at.directory / "stdout").read_text(errors="replace")
        lines = [line for line in stderr.splitlines() if line.strip()]
        where = {"job": at.aid, "mode": at.mode, "exit": at.code, "killed": at.killed or None}
        with self.lock:
            self.counts[f"exit {at.code}"] += 1
        if "Traceback" in stderr or "Traceback" in stdout:
            self.violation("traceback", **where, stderr=stderr[-800:])
        shm_left = sorted(p.name for p in at.shm.iterdir()) if at.shm is not None else []
        if at.killed == "tree":
            # every process was killed: nobody could clean up. Count what it left in its TMPDIR and
            # /dev/shm, then go on (its site job is cancelled by nobody: it must expire at the site).
            leftovers = list(at.tmp.iterdir())
            self.expected_tmp_leftovers += len(leftovers)
            self.shm_leftovers_after_kill += len(shm_left)
            shutil.rmtree(at.tmp, ignore_errors=True)
            at.tmp.mkdir()
        else:
            if at.code != 0 and at.code not in DOCUMENTED_FAILURES:
                self.violation("undocumented exit code", **where, stderr=stderr[-400:])
            lines = [line for line in lines if not line.startswith(JOURNAL_NOTES)]
            said = [line for line in lines if not line.startswith(KEPT)]  # a kept journal: one line more
            if at.code != 0 and (len(said) != 1 or not said[0].startswith("paramedic: ") or len(lines) > 2):
                self.violation("not one line", **where, stderr=stderr[-800:])
            if stdout.strip():
                self.violation("output on stdout", **where, stdout=stdout[-400:])
            if at.code != 0 and said:
                at.message = said[0][:300]
                if "internal" in said[0]:  # an internal error is a bug, whatever its exit code
                    self.violation("internal error", **where, stderr=stderr[-400:])
                message = re.sub(r"runs/c\d+n\d+-k\d+\.out", "runs/<job>.out", said[0])
                message = re.sub(r"\d[\d,.]*", "N", message)[:160]
                with self.lock:
                    self.messages[message] += 1
            time.sleep(0.2)
            deadline = time.monotonic() + 15
            while (left := marked(f"{self.run_id}:job:{at.aid}:")) and time.monotonic() < deadline:
                time.sleep(0.2)
            if left:
                self.violation("processes left behind", **where, pids=left)
                kill_marked(f"{self.run_id}:job:{at.aid}:")
            tmp_left = sorted(str(p.relative_to(at.tmp)) for p in at.tmp.rglob("*"))
            if tmp_left:
                self.violation("left behind in TMPDIR", **where, files=tmp_left[:10])
            if shm_left:
                self.violation("left behind in /dev/shm", **where, files=shm_left[:10])
        if at.shm is not None:
            shutil.rmtree(at.shm, ignore_errors=True)  # tmpfs pages: give them back at once
        record = at.cwd / f"{at.out}.run.json"
        cwd_left = sorted(
            str(p.relative_to(at.cwd))
            for p in at.cwd.rglob("*")
            if p.is_file() and p != record and (at.code == 0 or not _in_journal(p))
        )
        if cwd_left and at.killed != "tree":
            self.violation("left behind in the working directory", **where, files=cwd_left[:10])
        if at.code == 0:
            if record.exists():
                with contextlib.suppress(ValueError, OSError):
                    run_record = json.loads(record.read_text())
                    at.ship = run_record.get("ship") or {}
                    resumed = run_record.get("resumed") or {}
                    if any(isinstance(v, int) and v > 0 for v in resumed.values()):
                        with self.lock:
                            self.counts["runs that resumed from a journal"] += 1
            published = self.site_root / at.out
            if not published.is_file():
                self.violation("exit 0 without output at the site", **where)
            else:
                digest = sha256_file(published)
                if digest != at.kind.sha256:
                    self.violation("output differs from the local run", **where, sha256=digest,
                                   reference=at.kind.sha256, size=published.stat().st_size)  # fmt: skip
                else:
                    with self.lock:
                        self.counts["outputs verified"] += 1
                        self.counts["output bytes verified"] += at.kind.size
                published.unlink()  # the user takes it away; the small disk keeps room
            return
        published = self.site_root / at.out
        if published.is_file():  # the site finished, the client did not hear it (killed, link down)
            with self.lock:
                self.counts["runs failed after the site published the output"] += 1

    # -- chaos ------------------------------------------------------------------------------------------
    def chaos(self) -> None:
        a = self.args
        now = time.monotonic()
        due = {
            "client": now + self.rng.uniform(*a.client_kill_every),
            "site": now + self.rng.uniform(*a.site_kill_every),
            "link": now + self.rng.uniform(*a.link_fault_every),
            "disk": now + self.rng.uniform(*a.disk_fill_every) if self.disk.can_fill else float("inf"),
            "flood": now + self.rng.uniform(*a.flood_every),
            "flip": now + self.rng.uniform(*a.flip_every),
            "stuck": now + self.rng.uniform(*a.stuck_every),
            **{what: now + self.rng.uniform(*a.attack_every[what]) for what in ATTACKS},
        }
        busy: dict[str, threading.Thread] = {}
        while not self.stop_chaos.is_set():
            now = time.monotonic()
            for what, when in due.items():
                if now < when or (what in busy and busy[what].is_alive()):
                    continue
                action = {"client": self.kill_client, "site": self.kill_site, "link": self.link_fault,
                          "disk": self.fill_disk, "flood": self.flood, "flip": self.flip_replica,
                          "stuck": self.stop_regeneration, **self.attack_actions()}[what]  # fmt: skip
                busy[what] = threading.Thread(target=self.guarded, args=(action,), daemon=True)
                busy[what].start()
                every = {"client": a.client_kill_every, "site": a.site_kill_every,
                         "link": a.link_fault_every, "disk": a.disk_fill_every,
                         "flood": a.flood_every, "flip": a.flip_every, "stuck": a.stuck_every,
                         **a.attack_every}[what]  # fmt: skip
                due[what] = now + self.rng.uniform(*every)
            self.stop_chaos.wait(0.2)
        for thread in busy.values():
            thread.join(timeout=120)

    def guarded(self, action) -> None:
        try:
            action()
        except Exception as exc:
            self.violation("harness error", action=action.__name__, error=f"{type(exc).__name__}: {exc}")

    def attack_actions(self) -> dict[str, Any]:
        """Issue 41's kinds, run by the chaos as its own: each in a thread, one of a kind at a time."""
        at = self.attacks
        return {"burst": at.burst, "bomb": at.bombs, "small": at.small_jobs, "signal": at.signals}

    def kill_client(self) -> None:
        with self.lock:
            candidates = [
                at for at in self.running.values() if not at.killed and time.monotonic() - at.started > 0.5
            ]
        if not candidates:
            return
        at = self.rng.choice(candidates)
        how = self.rng.choices(["tree", "rank", "term"], weights=[6, 3, 1])[0]
        prefix = f"{self.run_id}:job:{at.aid}:"
        if how == "rank":
            ranks = [p for p in marked(prefix) if _is_rank(p)]
            if not ranks:
                return
            at.killed = how
            os.kill(self.rng.choice(ranks), signal.SIGKILL)
        elif how == "term":
            at.killed = how
            with contextlib.suppress(OSError):
                at.proc.send_signal(signal.SIGTERM)
        else:
            at.killed = how
            kill_marked(prefix)
        self.event(
            f"client kill ({how})", job=at.aid, mode=at.mode, after_s=round(time.monotonic() - at.started, 1)
        )
        log(f"killed client job {at.aid} ({how}, {at.mode})")

    def kill_site(self) -> None:
        site = self.site
        with site.lock:
            self.site_down.set()
            site.kill9()
            self.event("site kill -9")
            down = self.rng.uniform(*self.args.site_down)
            log(f"site killed (kill -9); restart in {down:.1f} s")
            self.stop_chaos.wait(down)
            self.restart_site()

    def restart_site(self) -> None:
        site = self.site
        for attempt in range(5):
            try:
                site.start()
                self.event("site restart")
                break
            except RuntimeError as exc:
                self.violation("site did not restart", attempt=attempt, error=str(exc)[-400:])
                site.kill9()
                time.sleep(2)
        self.site_down.clear()

    def link_fault(self) -> None:
        kind = self.rng.choices(["cut", "outage", "reset", "stall", "slice"], weights=[4, 1, 3, 3, 3])[0]
        seconds = (self.args.ship_timeout + self.rng.uniform(5, 15) if kind == "outage"
                   else self.rng.uniform(0.5, 10.0))  # fmt: skip
        self.event(f"link {kind}", seconds=round(seconds, 1))
        log(f"link {kind} for {seconds:.1f} s")
        self.link.fault(kind, seconds, self.rng, self.stop_chaos)

    def fill_disk(self) -> None:
        reserve = self.args.reserve_mib << 20
        leave = self.rng.choice(
            [0, reserve // 2, reserve + self.rng.randint(0, 2 * max(k.size for k in self.kinds))]
        )
        seconds = self.rng.uniform(*self.args.disk_full_for)
        grown = self.disk.fill(leave)
        self.event("disk full", leave=leave, free=self.disk.free(), filler=grown, seconds=round(seconds, 1))
        log(f"disk filled: {self.disk.free():,} bytes free (asked {leave:,}) for {seconds:.1f} s")
        self.stop_chaos.wait(seconds)
        self.disk.release()

    def flood(self) -> None:
        """Issue 23, item 13: hundreds or thousands of unauthenticated connections held at the site, from
        8 other addresses or from the compute sites' own (127.0.0.1), some with a ClientHello begun; a
        real client's hello must still get through within 5 s."""
        count = self.rng.choice([200, 1000, 3000])
        own = self.rng.random() < 0.5
        seconds = self.rng.uniform(5.0, 20.0)
        held: list[socket.socket] = []
        port = self.site.port
        try:
            for i in range(count):
                source = "127.0.0.1" if own else f"127.0.0.{2 + i % 8}"
                with contextlib.suppress(OSError):
                    sock = socket.create_connection(
                        ("127.0.0.1", port), timeout=2, source_address=(source, 0)
                    )
                    held.append(sock)
                    if i % 2:
                        with contextlib.suppress(OSError):
                            sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            self.event("handshake flood", connections=len(held), own_address=own, seconds=round(seconds, 1))
            log(f"handshake flood: {len(held)} connections from {'127.0.0.1' if own else '8 addresses'}")
            if not self.site_down.is_set():
                started = time.monotonic()
                try:
                    self.hello(port)
                except (OSError, ssl.SSLError) as exc:
                    if not self.site_down.is_set():
                        self.violation("a real hello crowded out by a handshake flood", error=str(exc)[:200])
                else:
                    self.event("hello through a flood", seconds=round(time.monotonic() - started, 2))
            self.stop_chaos.wait(seconds)
        finally:
            for sock in held:
                sock.close()

    def hello(self, port: int) -> None:
        keys = self.work / "keys" / "compute-0"
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=str(keys / "ca.pem"))
        ctx.load_cert_chain(keys / "cert.pem", keys / "key.pem")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                head = json.dumps({"op": "hello"}).encode()
                tls.sendall(len(head).to_bytes(4, "big") + (0).to_bytes(4, "big") + head)
                if not tls.recv(8):
                    raise OSError("no reply to hello")

    def flip_replica(self) -> None:
        """Issue 23, item 1: a volume file of the site's replica or of the compute sites' database rewritten
        in place (size, inode and times kept) for a while, then put back, or a fragment's alias rewritten to
        name another fragment's volume (session 17): no job may publish output made
        from the changed bytes (a search refuses it, exit 4; the site fails the job, exit 8)."""
        where = self.rng.choice(["site", "compute"])  # the site's replica, or the compute sites' -db
        directory = (
            self.work / "site" / "replica" / "uni"
            if where == "site"
            else self.work / "compute" / "db" / "uni"
        )
        volumes = sorted(directory.glob("f*.p[sh][qr]"))
        aliases = sorted(directory.glob("frag*.pal"))  # session 17: an alias naming another volume
        if not volumes:
            return
        path = self.rng.choice(volumes + aliases)
        seconds = self.rng.uniform(5.0, 15.0)
        st = path.stat()
        original = path.read_bytes()
        changed = bytearray(original)
        if path.suffix == ".pal":
            names = sorted({v.name.split(".")[0] for v in volumes})
            own = next((n for n in names if f"DBLIST {n}\n".encode() in original), None)
            other = next((n for n in names if n != own), None)
            if own is None or other is None or len(own) != len(other):
                return
            changed = bytearray(original.replace(f"DBLIST {own}\n".encode(), f"DBLIST {other}\n".encode()))
        else:
            for i in range(len(changed) // 2, len(changed), 97):
                changed[i] ^= 0x5A
        with open(path, "r+b") as fh:
            fh.write(changed)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.event("volume bit flip", where=where, volume=path.name, seconds=round(seconds, 1))
        log(f"{where} volume {path.name} changed in place (times kept) for {seconds:.1f} s")
        try:
            self.stop_chaos.wait(seconds)
        finally:
            with open(path, "r+b") as fh:
                fh.write(original)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    def stop_regeneration(self) -> None:
        """Issue 23, item 7: the site's BLAST+ runs (a regeneration's) stopped with SIGSTOP, those that start
        meanwhile too, for longer than the site's --regen-timeout, then continued: a BLAST+ that never
        returns. The site must fail the job (the client exits 8, one line) or finish it; nothing hangs."""
        seconds = self.args.regen_timeout_seconds + self.rng.uniform(2.0, 10.0)
        stopped: set[int] = set()
        self.event("regeneration stuck", seconds=round(seconds, 1))
        log(f"the site's BLAST+ runs stopped (SIGSTOP) for {seconds:.1f} s")
        end = time.monotonic() + seconds
        try:
            while not self.stop_chaos.is_set() and time.monotonic() < end:
                for pid in _blast_runs(self.site.pid) if self.site.pid else []:
                    if pid not in stopped:
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGSTOP)
                            stopped.add(pid)
                self.stop_chaos.wait(0.02)  # a regeneration of a small job takes a few tenths of a second
        finally:
            for pid in stopped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
        with self.lock:
            self.counts["BLAST+ runs stopped at the site"] += len(stopped)

    # -- memory -----------------------------------------------------------------------------------------
    def sample_memory(self) -> None:
        while not self.stop_sampling.is_set():
            pid = self.site.pid
            if pid:
                own = rss_kib(pid) * 1024
                tree = sum(rss_kib(p) for p in marked(f"{self.run_id}:site")) * 1024
                with self.lock:
                    self.rss_by_life[pid] = max(self.rss_by_life.get(pid, 0), own)
                    self.rss_peak = max(self.rss_peak, own)
                    self.rss_tree_peak = max(self.rss_tree_peak, tree)
                    self.rss_samples.append((round(time.monotonic() - self.t0, 1), own))
            self.stop_sampling.wait(0.5)

    def memory_bound(self) -> tuple[int, str]:
        """What the site's own process may hold, from its design bounds for this load: the idle process
        (measured after start), for each connection one frame in memory twice (received, and being
        written or decoded; a chunk here is at most a whole output, since outputs are below the 4 MiB
        range chunk), for each of the 2 I/O workers a decoded output three times (payload, pieces, the
        assembled report), and 64 MiB for threads' stacks, allocator slack and the replica's caches.
        Nothing in it grows with the number of jobs served: a leak shows as a breach over a long run."""
        biggest = max(k.size for k in self.kinds)
        connections = self.args.clients * 3
        bound = self.rss_baseline + connections * 2 * biggest + 2 * 3 * biggest + (64 << 20)
        why = (f"idle RSS {self.rss_baseline / 2**20:.1f} MiB + {connections} connections x 2 x "
               f"{biggest / 2**20:.2f} MiB + 2 workers x 3 x {biggest / 2**20:.2f} MiB + 64 MiB")  # fmt: skip
        if self.attacks is not None:  # an object bomb's setup inflated (and copied once) before its values
            # are counted: bounded by its size here, --max-setup at most
            bound += 2 * (16 << 20)
            why += " + 2 x 16 MiB (an object bomb's setup inflated)"
        if self.compute is not None:  # the mirror's replica reads: 8 read slots (site/replica_reads.py),
            # each a read of at most one volume file here, held as read and as the frame being sent
            largest = max(p.stat().st_size for p in (self.work / "compute" / "db" / "uni").glob("f*.p*"))
            bound += 8 * 2 * largest
            why += f" + 8 replica read slots x 2 x {largest / 2**20:.2f} MiB"
        return bound, why

    # -- the end: everything at rest, then the checks ---------------------------------------------------
    def final_checks(self) -> None:
        a = self.args
        root = self.site_root
        state = root / STATE
        # abandoned site jobs (clients killed, or failed while the link was down) expire after --open-idle
        deadline = time.monotonic() + a.open_idle_seconds + min(60, a.open_idle_seconds / 4) + 30
        while time.monotonic() < deadline:
            open_jobs = [d for d in state.iterdir() if _is_open_job(d)]
            partials = [p for p in root.rglob(".*") if p.is_file() and STATE not in p.parts]
            if not open_jobs and not partials:
                break
            time.sleep(2)
        log(f"site at rest after {time.monotonic() - self.t_end:.0f} s")
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if rel.parts[0] == STATE:
                continue
            if path.is_dir() or rel.parts[0] == "lost+found":
                continue
            if path.name.startswith("."):
                self.violation("left behind at the site (hidden partial file)", path=str(rel))
                continue
            match = re.fullmatch(r"runs/(c\d+n\d+)-k(\d+)\.out", str(rel))
            if rel.parts[0] == "small" and self.attacks is not None:  # a small job no one heard finish
                self.counts["small jobs published, not heard"] += 1
                continue
            if not match:
                self.violation("unknown file at the site", path=str(rel))
                continue
            kind = self.kinds[int(match.group(2))]
            if sha256_file(path) != kind.sha256:
                self.violation("published output differs from the local run", path=str(rel))
            else:
                self.published_after_failure += 1
        for directory in sorted(state.iterdir()):
            if directory.name == "published.json":  # each compute site's published outputs (site/space.py)
                continue
            if directory.name == "work":
                left = [str(p.relative_to(state)) for p in directory.rglob("*")]
                if left:
                    self.violation("left behind in the site's scratch directory", files=left[:10])
                continue
            if not re.fullmatch(r"[0-9a-f]{32}", directory.name):
                self.violation("left behind in the site's state", path=directory.name)
                continue
            if _is_open_job(directory):
                self.violation("site job still open after --open-idle", job=directory.name)
            data = [str(p.relative_to(directory)) for p in directory.rglob("*")
                    if p.is_file() and p.name not in JOB_RECORD_FILES and p.parent.name != "decoded"]  # fmt: skip
            if data:
                self.violation("job data left in the site's state", job=directory.name, files=data[:10])
        if "Traceback" in self.site.log():
            self.violation("traceback in the site's log")
        leftovers = [p for p in marked(f"{self.run_id}:job:")]
        if leftovers:
            self.violation("client processes still running at the end", pids=leftovers)
        self.counts["site jobs done"] = len(list(state.glob("*/done.json")))
        self.counts["site jobs failed"] = len(list(state.glob("*/failed.json")))
        reasons = Counter()
        for line in self.site.log().splitlines():
            match = re.search(r"job [0-9a-f]{32}: failed: (.*)", line)
            if match:
                reasons[re.sub(r"\d[\d,]*", "N", match.group(1))[:90]] += 1
        self.site_failures = dict(reasons.most_common())
        bound, why = self.memory_bound()
        self.bound, self.bound_why = bound, why
        if self.rss_peak > bound:
            self.violation("site memory over its bound", peak=self.rss_peak, bound=bound, why=why)

    @property
    def site_root(self) -> Path:
        return self.work / "site" / "root"

    # -- the whole soak ---------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        a, w = self.args, self.work
        self.t0 = time.monotonic()
        self.prepare()
        self.disk = SmallDisk(self.site_root, w / "site" / "disk.img", a.disk_mib)
        log(
            f"site --root: {self.disk.kind}, {self.disk.free() / 2**20:.1f} MiB free; --reserve {a.reserve_mib} MiB"
        )
        if os.geteuid() == 0 and shutil.which("unshare"):
            shm = w / "shm"
            shm.mkdir()
            if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", str(shm)]).returncode == 0:
                self.shm = shm
        log(
            f"clients' /dev/shm: {'private per job' if self.shm else 'shared (leftovers there not attributed)'}"
        )
        self.site = Site(a, w, self.site_root, self.run_id)
        self.site.start()
        time.sleep(1.0)
        self.rss_baseline = rss_kib(self.site.pid) * 1024
        if (TOOLS / "toxiproxy-server").exists():
            self.link = ToxiLink(self.site.port, w / "toxiproxy.log", self.run_id)
        else:
            self.link = CuttingLink(self.site.port)
            log("Toxiproxy is absent (bash bench/wan/setup.sh installs it): using the tests' CuttingProxy")
        log(f"site on port {self.site.port}, link through {self.link.backend} port {self.link.port}; "
            f"{a.clients} clients for {a.minutes:g} minutes")  # fmt: skip
        import faults_site

        self.attacks = faults_site.SiteAttacks(self, sys.modules[__name__])
        self.attacks.prepare_signals(str(BIN / "mpicc"), str(BIN / "mpiexec"))
        self.stop_sampling = threading.Event()
        sampler = threading.Thread(target=self.sample_memory, daemon=True)
        sampler.start()
        self.t0 = time.monotonic()
        clients = [
            threading.Thread(target=self.client_loop, args=(i,), daemon=True) for i in range(a.clients)
        ]
        for thread in clients:
            thread.start()
        chaos = threading.Thread(target=self.chaos, daemon=True)
        chaos.start()
        compute_threads: list[threading.Thread] = []
        if a.compute_side:  # issue 23's compute-side faults: stage disk, mirrors, closed pipes
            import faults_compute

            self.compute = faults_compute.ComputeFaults(self, sys.modules[__name__])
            compute_threads = self.compute.start()
            log(f"compute side: --stage on {self.compute.stage_disk.kind}, mirrors through port "
                f"{self.compute.link.port}")  # fmt: skip
        try:
            end = self.t0 + a.minutes * 60
            while time.monotonic() < end:
                time.sleep(1)
        finally:
            self.stop_chaos.set()
            self.stop_jobs.set()
        chaos.join(timeout=180)
        if self.compute is not None:
            self.compute.stop.set()
            for thread in compute_threads:
                thread.join(timeout=a.hang_seconds + 60)
        self.link.heal()
        self.disk.release()
        if not self.site.pid:
            with self.site.lock:
                self.restart_site()
        log("chaos stopped; waiting for the running jobs")
        for thread in clients:
            thread.join(timeout=a.hang_seconds + 60)
        self.t_end = time.monotonic()
        self.final_checks()
        self.stop_sampling.set()
        sampler.join(timeout=5)
        return self.report()

    def report(self) -> dict[str, Any]:
        a = self.args
        finished = [at for at in self.attempts if at.code == 0]
        failed = Counter(
            str(at.code) for at in self.attempts if at.code not in (0, None) and at.killed != "tree"
        )
        shipped = sum(int(at.ship.get("shipped_payload_bytes") or 0) for at in finished)
        wire = sum(int(at.ship.get("wire_bytes") or 0) for at in finished)
        output = sum(int(at.ship.get("output_bytes") or 0) for at in finished)
        by_mode = {m: sum(1 for at in finished if at.mode == m) for m in MODES}
        return {
            "command": " ".join([".venv/bin/python", *sys.argv]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "settings": {k: v for k, v in vars(a).items() if k != "out"},
            "site_root": self.disk.kind,
            "link": {"backend": self.link.backend, "version": self.link.version},
            "jobs": {
                "started": self.counts["jobs started"],
                "done": self.counts["jobs done"],
                "done_at_run": {
                    k.rsplit(" ", 1)[1]: v
                    for k, v in sorted(self.counts.items())
                    if k.startswith("jobs done at run")
                },  # fmt: skip
                "done_by_mode": by_mode,
                "outputs_verified_sha256": self.counts["outputs verified"],
                "gave_up_with_a_journal_kept": self.counts["journals kept by a job that gave up"],
                "published_although_no_run_heard_it_verified": self.published_after_failure,
            },
            "runs": {
                "started": len(self.attempts),
                "exit_0": len(finished),
                "failed_by_exit_code": dict(sorted(failed.items())),
                "killed_every_process": sum(1 for at in self.attempts if at.killed == "tree"),
                "resumed_from_a_journal_and_exit_0": self.counts["runs that resumed from a journal"],
                "failed_after_the_site_published": self.counts[
                    "runs failed after the site published the output"
                ],
                "failure_messages": dict(self.messages.most_common()),
            },
            "faults": {
                "client_kills": {
                    k.split("(")[1].rstrip(")"): v
                    for k, v in self.counts.items()
                    if k.startswith("client kill")
                },  # fmt: skip
                "site_kills": self.counts["site kill -9"],
                "site_restarts": self.counts["site restart"],
                "link": {k.split(" ", 1)[1]: v for k, v in self.counts.items() if k.startswith("link ")},
                "disk_full_episodes": self.counts["disk full"],
                "handshake_floods": self.counts["handshake flood"],
                "hellos_through_floods": self.counts["hello through a flood"],
                "volume_bit_flips": self.counts["volume bit flip"],
                "journal_piece_flips": self.counts["journal piece flipped"],
                "regenerations_stuck": self.counts["regeneration stuck"],
                "blast_runs_stopped_at_the_site": self.counts["BLAST+ runs stopped at the site"],
            },
            "bytes": {
                "output_verified": self.counts["output bytes verified"],
                "shipped_payload": shipped,
                "wire": wire,
                "output_by_run_records": output,
            },
            "site": {
                "jobs_done": self.counts["site jobs done"],
                "jobs_failed": self.counts["site jobs failed"],
                "failure_reasons": self.site_failures,
                "rss_baseline_bytes": self.rss_baseline,
                "rss_peak_bytes": self.rss_peak,
                "rss_bound_bytes": self.bound,
                "rss_bound": self.bound_why,
                "rss_tree_peak_bytes": self.rss_tree_peak,
                "rss_peak_per_life_bytes": list(self.rss_by_life.values()),
                "starts": self.site.starts,
            },
            "after_kill_9_of_every_process": {
                "client_tmpdir_entries": self.expected_tmp_leftovers,
                "dev_shm_segments": self.shm_leftovers_after_kill,
                "dev_shm_private_per_job": self.shm is not None,
            },
            "compute_side": self.compute.result() if self.compute is not None else None,
            "issue_41": {
                "counts": {k: v for k, v in sorted(self.counts.items()) if k.split(" ")[0] in ATTACK_WORDS},
                "figures": self.attacks.result() if self.attacks is not None else {},
            },
            "violations": self.violations,
            "run_list": [
                {
                    "run": at.aid,
                    "mode": at.mode,
                    "streams": at.streams,
                    "kind": at.kind.index,
                    "exit": at.code,
                    "killed": at.killed or None,
                    "seconds": round(at.seconds, 1),
                    "message": at.message or None,
                }
                for at in sorted(self.attempts, key=lambda at: at.started)
            ],  # fmt: skip
            "events": self.events,
        }

    def cleanup(self) -> None:
        self.cleaning = True  # the clients' threads no longer judge what the clean-up kills
        self.stop_chaos.set()
        self.stop_jobs.set()
        kill_marked(f"{self.run_id}:job:")
        kill_marked(f"{self.run_id}:attack:")
        if self.site is not None:
            self.site.stop()
        kill_marked(f"{self.run_id}:site")
        if self.compute is not None:
            self.compute.close()
        if self.link is not None:
            self.link.close()
        if self.disk is not None:
            self.disk.close()
        if self.shm is not None:
            subprocess.run(["umount", "-l", str(self.shm)], capture_output=True)


def _blast_runs(site: int) -> list[int]:
    """The site's BLAST+ runs: blastp processes forked by its fork servers (its children), or started by
    the site itself without one (a child of the site that is not a fork server: no shim preloaded)."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry.name}/stat") as fh:
                    parent[int(entry.name)] = int(fh.read().rsplit(")", 1)[1].split()[1])
    runs = []
    for pid, ppid in parent.items():
        if ppid != site and parent.get(ppid) != site:
            continue
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() != "blastp":
                continue
            if ppid == site and b"forkserver" in Path(f"/proc/{pid}/environ").read_bytes():
                continue  # a fork server: its children are the runs
            runs.append(pid)
    return runs


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _in_journal(path: Path) -> bool:
    return any(part.endswith(".journal") for part in path.parts)


def _is_rank(pid: int) -> bool:
    args = _cmdline(pid).split(" ")
    return len(args) > 2 and Path(args[0]).name.startswith("python") and args[1:3] == ["-m", "paramedic"]


def _is_open_job(directory: Path) -> bool:
    return (
        directory.is_dir()
        and (directory / "job.json").exists()
        and not (directory / "done.json").exists()
        and not (directory / "failed.json").exists()
    )


def summary(result: dict[str, Any]) -> str:
    j, r, f, b, s = result["jobs"], result["runs"], result["faults"], result["bytes"], result["site"]
    mib = 2**20
    lines = [
        f"jobs: {j['started']} started, {j['done']} done (at run {j['done_at_run']}; "
        f"{j['outputs_verified_sha256']} outputs sha256-identical to the local run; by mode {j['done_by_mode']})",
        f"runs: {r['started']} started, {r['exit_0']} exit 0 ({r['resumed_from_a_journal_and_exit_0']} resumed "
        f"from a journal), failed by exit code {r['failed_by_exit_code']}, {r['killed_every_process']} killed outright",
        f"faults: client kills {f['client_kills']}, site kill -9 {f['site_kills']} / restarts {f['site_restarts']}, "
        f"link {f['link']}, disk full {f['disk_full_episodes']}, handshake floods {f['handshake_floods']} "
        f"(a real hello through {f['hellos_through_floods']}), volume bit flips {f['volume_bit_flips']}",
        f"bytes: {b['output_verified']:,} output verified, {b['shipped_payload']:,} payload shipped, "
        f"{b['wire']:,} on the wire",
        f"site: {s['jobs_done']} jobs done, {s['jobs_failed']} failed; RSS peak {s['rss_peak_bytes'] / mib:.1f} MiB "
        f"(bound {s['rss_bound_bytes'] / mib:.1f} MiB), with its BLAST+ processes {s['rss_tree_peak_bytes'] / mib:.1f} MiB",
        f"issue 41: {result['issue_41']['counts']}",
        f"violations: {len(result['violations'])}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected (default 10)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--clients", type=int, default=3, help="concurrent compute clients (default 3)")
    p.add_argument("--np", type=int, default=1, help="workers per client (default 1: 2 ranks)")
    p.add_argument("--proteins", type=int, default=4000)
    p.add_argument("--fragments", type=int, default=2)
    p.add_argument("--kinds", type=int, default=6, help="query sets (each with its reference output)")
    p.add_argument("--queries", type=int, default=12, help="queries per set")
    p.add_argument("--disk-mib", type=int, default=64)
    p.add_argument("--reserve-mib", type=int, default=8, help="the site's --reserve")
    p.add_argument("--open-idle-seconds", type=float, default=75.0, help="the site's --open-idle (in s)")
    p.add_argument("--ship-timeout", type=float, default=30.0)
    p.add_argument("--retries", type=int, default=3, help="runs of a failed job again (default 3)")
    p.add_argument("--hang-seconds", type=float, default=300.0, help="a job running longer hangs")
    p.add_argument(
        "--regen-timeout-seconds", type=float, default=20.0, help="the site's --regen-timeout (in s)"
    )
    p.add_argument("--no-compute-side", dest="compute_side", action="store_false",
                   help="no local client with --stage and mirrors (bench/faults_compute.py)")  # fmt: skip
    p.add_argument("--stage-disk-mib", type=int, default=24, help="the local client's --stage file system")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "faults.json")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--flip-every", type=float, nargs=2, default=(45.0, 100.0), metavar=("MIN", "MAX"),
                   help="seconds between volume or alias flips (default 45 100)")  # fmt: skip
    p.add_argument("--attack-every", dest="attack_range", type=float, nargs=2, metavar=("MIN", "MAX"),
                   help="seconds between each of issue 41's kinds (default 40-110, by kind)")  # fmt: skip
    p.add_argument("--fair-seconds", type=float, default=10.0,
                   help="another compute site's small job beside 32 of one site takes at most this (default 10)")  # fmt: skip
    p.add_argument("--journal-flips", type=float, default=0.3,
                   help="share of resumes whose kept journal gets a byte changed first (default 0.3)")  # fmt: skip
    args = p.parse_args(argv)
    args.client_kill_every = (8.0, 25.0)
    args.site_kill_every = (40.0, 90.0)
    args.site_down = (0.5, 8.0)
    args.link_fault_every = (6.0, 18.0)
    args.disk_fill_every = (30.0, 70.0)
    args.disk_full_for = (4.0, 15.0)
    args.flood_every = (25.0, 60.0)
    args.stuck_every = (40.0, 90.0)
    args.compute_fault_every = (8.0, 25.0)
    args.attack_every = {"burst": (40.0, 90.0), "bomb": (45.0, 100.0), "small": (50.0, 110.0),
                         "signal": (45.0, 90.0)}  # fmt: skip
    if args.attack_range:
        args.attack_every = {what: tuple(args.attack_range) for what in ATTACKS}
    if not (DATA / "mmseqs2" / "DB.fasta").exists():
        raise SystemExit(f"faults: {DATA}/mmseqs2 is missing: run `make data`")

    def interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    work = Path(tempfile.mkdtemp(prefix="faults-soak-"))
    soak = Soak(args, work)
    try:
        result = soak.run()
    except (KeyboardInterrupt, Interrupted) as exc:
        log(f"interrupted ({type(exc).__name__} {exc}): cleaning up")
        return 130
    finally:
        soak.cleanup()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(f"written: {args.out}")
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
