"""How to split a search's work, and why: `--strategy fragments|queries|auto`.

"fragments" is database segmentation (search fragments, merge, regenerate: the mpiBLAST engine, and the
source of the metadata ParaMEDIC ships); "queries" is query segmentation (each task searches the whole
database and writes its part of the report: no merge, no regeneration, no metadata). Query segmentation
does less work, but every worker reads the whole database: when the database does not fit in the memory
a worker may use, each task reads it from disk again. With fragments, a worker keeps to the fragments it
has read (the scheduler's cache affinity), so the database needs to fit only in the workers' memory
together (docs/DESIGN.md, "Memory: why segment a database").

`auto` decides from the database's size and the memory available per worker: the smallest of the
memory cgroup's limit (cgroup v1 or v2, read from /proc/self/cgroup, shared by the job's ranks in that
cgroup) and the physical memory (shared by the workers on this node). `decide` is the rule, a pure
function of those numbers; `choose_strategy` measures them. The choice and its reason go to the run
record (`strategy_reason`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paramedic.engine.core.costs import Costs, Prediction, Shape, cheapest, predict
from paramedic.engine.core.settings import LOCAL_WORKERS_VARIABLE
from paramedic.errors import UsageError
from paramedic.report.record import StrategyReason

if TYPE_CHECKING:
    from paramedic.blast.run import Database
    from paramedic.db.manifest import Manifest
    from paramedic.engine.core.settings import SearchSettings

# Query segmentation is chosen when the whole database takes at most this share of the memory available
# per worker: the rest is for the worker itself and its BLAST+ runs.
QUERIES_MEMORY_SHARE = 0.5
# A cgroup v1 limit at or above this is no limit (the kernel's "unlimited" is 2**63 rounded to pages).
_NO_LIMIT = 1 << 62
# Environment variables that say how many ranks of the job run on this node (MPICH/Hydra, Open MPI,
# Slurm's srun when --ntasks-per-node is given, MVAPICH2).
LOCAL_RANKS_VARIABLES = (
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NTASKS_PER_NODE",
    "MV2_COMM_WORLD_LOCAL_SIZE",
)
MiB = 1 << 20


@dataclass(frozen=True)
class WorkerMemory:
    """The memory one worker may use, and where the figure comes from."""

    per_worker: int | None  # bytes; None when nothing could be read
    physical: int | None  # the node's memory
    workers_on_node: int  # workers sharing the physical memory (the master holds no database)
    workers_on_node_from: str  # e.g. "MPI_LOCALNRANKS=3" or "2 cores"
    cgroup_limit: int | None = None  # the memory cgroup's limit (the smallest on its path), if any
    cgroup: str | None = None  # the cgroup directory whose limit that is
    ranks_in_cgroup: int = 1  # this job's ranks under that cgroup (they share its limit)
    node: str | None = None  # the host measured, when the job spans several (`job_memory`); else this one
    master_here: bool = True  # whether the master (rank 0, no database) is among those ranks

    def describe(self) -> str:
        if self.per_worker is None:
            return "unknown"
        text = f"{_mib(self.per_worker)} per worker: "
        by_physical = self.physical // self.workers_on_node if self.physical is not None else None
        if self.cgroup_limit is not None and (by_physical is None or self.per_worker < by_physical):
            sharing = max(1, self.ranks_in_cgroup - self.master_here)
            return text + (
                f"memory cgroup limit {_mib(self.cgroup_limit)} ({self.cgroup})"
                + (f" shared by {sharing} workers" if sharing > 1 else "")
            )
        assert self.physical is not None
        return text + (
            f"physical memory {_mib(self.physical)} shared by {self.workers_on_node} "
            f"worker{'s' if self.workers_on_node != 1 else ''} on {self.node or 'this node'} "
            f"({self.workers_on_node_from})"
        )


# Query segmentation is chosen only when its tasks keep the workers busy: its busiest worker's share of
# the query residues is at most this many times an even share. The fragments strategy spreads any
# number of queries over every worker (it splits the database), at a cost of a few percent over
# BLAST+'s own work (bench/RESULTS.md, "Big databases").
QUERIES_BALANCE_LIMIT = 1.10


@dataclass(frozen=True)
class QueryBalance:
    """How query segmentation would spread the work: its tasks (cut only where BLAST+ starts a query
    batch) placed longest first on the workers, by query residues."""

    tasks: int
    workers: int
    busiest: int  # residues on the busiest worker
    total: int  # residues of all queries

    @property
    def ratio(self) -> float:
        """The busiest worker's residues over an even share (1.0: perfectly even)."""
        return self.busiest * self.workers / max(1, self.total)

    def describe(self) -> str:
        return (
            f"query segmentation would make {self.tasks} task{'s' if self.tasks != 1 else ''} for "
            f"{self.workers} worker{'s' if self.workers != 1 else ''} (tasks start only where BLAST+ starts "
            f"a query batch): its busiest worker would search {self.ratio:.2f}x an even share of the "
            f"{self.total:,} query residues (over {QUERIES_BALANCE_LIMIT:.2f}x); the fragments strategy "
            "spreads the database over every worker"
        )


def query_balance(task_residues: list[int], workers: int) -> QueryBalance:
    """Query segmentation's tasks placed longest first on `workers` (greedy: each to the least loaded)."""
    loads = [0] * max(1, workers)
    for residues in sorted(task_residues, reverse=True):
        loads[loads.index(min(loads))] += residues
    return QueryBalance(len(task_residues), max(1, workers), max(loads), sum(task_residues))


@dataclass(frozen=True)
class StrategyChoice:
    """The strategy a search uses, and why (the run record's `strategy_reason`)."""

    strategy: str  # "fragments", "queries" or "blast" (one BLAST+ run: `weigh`)
    asked: str  # --strategy: "auto", "fragments" or "queries"
    reason: str
    database_bytes: int  # the whole database's BLAST+ files
    largest_fragment_bytes: int  # the largest fragment's BLAST+ files
    fragments: int
    memory: WorkerMemory
    # The cost model's predictions (paramedic.engine.core.costs), each with why it was not a candidate (None:
    # it was); empty when no model was weighed (a strategy asked by name)
    plans: tuple[tuple[Prediction, str | None], ...] = ()
    threads: int = 1  # blast: -num_threads
    mt_mode: int = 0  # blast: -mt_mode
    # auto: both engine plans would run this job exactly and in memory (the rule's choice between them,
    # by balance alone, is then the cost model's: `weigh`)
    both_engine_plans: bool = False

    @property
    def whole_blast(self) -> bool:
        """The search is one BLAST+ run over the whole database (the "blast" plan)."""
        return self.strategy == BLAST_PLAN

    def fits_each_worker(self) -> bool:
        """Whether the whole database fits in the share of memory each worker may use for it (the rule
        for query segmentation): only then may a worker search any fragment, or all of them at once.
        Unknown memory is taken as too little."""
        per_worker = self.memory.per_worker
        return per_worker is not None and self.database_bytes <= QUERIES_MEMORY_SHARE * per_worker

    def record(self) -> StrategyReason:
        m = self.memory
        reason = StrategyReason(
            asked=self.asked,
            chosen=self.strategy,
            reason=self.reason,
            database_bytes=self.database_bytes,
            largest_fragment_bytes=self.largest_fragment_bytes,
            fragments=self.fragments,
            memory_share=QUERIES_MEMORY_SHARE,
            memory_per_worker_bytes=m.per_worker,
            physical_bytes=m.physical,
            cgroup_limit_bytes=m.cgroup_limit,
            workers_on_node=m.workers_on_node,
            workers_on_node_from=m.workers_on_node_from,
            cgroup=m.cgroup,
            ranks_in_cgroup=m.ranks_in_cgroup,
        )
        if self.plans:
            reason["plans"] = [
                {
                    "plan": p.plan,
                    "predicted_seconds": round(p.seconds, 3),
                    **({"mt_mode": p.mt_mode} if p.mt_mode is not None else {}),
                    "candidate": why_not is None,
                    **({"why_not": why_not} if why_not is not None else {}),
                }
                for p, why_not in self.plans
            ]
        return reason


def decide(
    asked: str,
    *,
    database_bytes: int,
    fragment_bytes: list[int],
    memory: WorkerMemory,
    inexact: str | None = None,
    needs_metadata: bool = False,
    balance: QueryBalance | None = None,
) -> StrategyChoice:
    """The rule. `inexact` says why the fragments strategy would not be exact here (then auto avoids it);
    `needs_metadata`: --metadata, --from-metadata or --ship metadata/auto, which only fragments make;
    `balance`: how evenly query segmentation's tasks would spread over the workers.
    Raises UsageError for a combination that cannot run."""
    largest = max(fragment_bytes, default=0)

    def choice(strategy: str, reason: str) -> StrategyChoice:
        return StrategyChoice(strategy, asked, reason, database_bytes, largest, len(fragment_bytes), memory)

    if asked == "queries" or (asked == "auto" and inexact and not needs_metadata):
        if needs_metadata:
            raise UsageError(
                "--strategy queries merges nothing, so it cannot save, use or ship metadata "
                "(--metadata, --from-metadata, --ship metadata/auto)"
            )
        if asked == "queries":
            return choice("queries", "--strategy queries was asked")
        return choice("queries", f"the fragments strategy {inexact}")
    if asked == "fragments" or needs_metadata:
        if inexact:
            raise UsageError(f"--strategy fragments (and metadata, which it makes) {inexact}")
        if asked == "fragments":
            return choice("fragments", "--strategy fragments was asked")
        return choice(
            "fragments",
            "metadata is asked (--metadata, --from-metadata or --ship), which "
            "only the fragments strategy makes",
        )
    if memory.per_worker is None:
        return choice("fragments", "the memory available per worker could not be read")
    budget = QUERIES_MEMORY_SHARE * memory.per_worker
    whole = f"the whole database ({_mib(database_bytes)})"
    share = f"{QUERIES_MEMORY_SHARE:.0%} of the memory available per worker ({memory.describe()})"
    if database_bytes <= budget:
        if balance is not None and balance.ratio > QUERIES_BALANCE_LIMIT:
            chosen = choice("fragments", f"{whole} fits in {share}, but {balance.describe()}")
        else:
            chosen = choice("queries", f"{whole} fits in {share}: each worker searches it whole")
        return dataclasses.replace(chosen, both_engine_plans=True)
    if largest <= budget:
        return choice(
            "fragments",
            f"{whole} does not fit in {share}; its largest fragment ({_mib(largest)}) does: "
            "each worker searches fragments",
        )
    needed = -(-database_bytes // max(1, int(budget)))
    return choice(
        "fragments",
        f"{whole} does not fit in {share}, nor does its largest fragment ({_mib(largest)}): fragments "
        f"read less per worker; format it with at least {needed} fragments for one to fit",
    )


BLAST_PLAN = "blast"  # one BLAST+ process over the whole database (paramedic.engine.job.whole)


def weigh(
    choice: StrategyChoice, shape: Shape, refused: str | None, costs: Costs | None = None
) -> StrategyChoice:
    """`--strategy auto`: the plan the cost model predicts fastest (paramedic.engine.core.costs) among its
    candidates: one BLAST+ run over the whole database (unless `refused` says why its output would not be
    what the job asks for), and the engine plans `decide`'s rule admits: both where the whole database
    fits in a worker's memory and either is exact (`StrategyChoice.both_engine_plans`; the rule's own
    pick between them, by balance alone, is then only a prediction's loser or winner), else the one it
    chose. Every plan is predicted and recorded, with why it was not a candidate. A strategy asked by
    name is kept as it is."""
    if choice.asked != "auto":
        return choice
    predictions = predict(shape) if costs is None else predict(shape, costs)
    engine = choice.strategy
    other = "queries" if engine == "fragments" else "fragments"
    why_not = {
        BLAST_PLAN: refused,
        engine: None,
        other: None
        if choice.both_engine_plans
        else f"auto's rule for the engine's own plans chose {engine} (see the reason)",
    }
    order = (BLAST_PLAN, engine, other)  # ties: one BLAST+ run, then the rule's own pick
    candidates = [plan for plan in order if why_not[plan] is None]
    chosen = cheapest(predictions, candidates)
    plans = tuple((predictions[p], why_not[p]) for p in (BLAST_PLAN, "queries", "fragments"))
    blast = predictions[BLAST_PLAN]
    threads = max(1, shape.cores)
    mode = blast.mt_mode or 0
    run = f"one BLAST+ run (-num_threads {threads}, -mt_mode {mode})"
    said = {BLAST_PLAN: run, "queries": "the queries strategy", "fragments": "the fragments strategy"}
    weighed = ", ".join(
        f"{said[p]} {predictions[p].seconds:.2f} s"
        for p in sorted(candidates, key=lambda p: predictions[p].seconds)
    )
    if chosen == BLAST_PLAN:
        reason = f"the cost model predicts {weighed} (the engine's plan: {choice.reason})"
        return dataclasses.replace(
            choice, strategy=BLAST_PLAN, reason=reason, plans=plans, threads=threads, mt_mode=mode
        )
    if chosen != engine:  # the other engine plan, predicted faster than the rule's pick
        reason = f"the cost model predicts {weighed} (the rule's pick by balance: {choice.reason})"
        return dataclasses.replace(choice, strategy=chosen, reason=reason, plans=plans)
    if refused is None or len(candidates) > 1:
        reason = f"{choice.reason}; the cost model predicts {weighed}"
    else:
        reason = choice.reason
    if refused is not None:
        reason += f" (one BLAST+ run is not a candidate: {refused})"
    return dataclasses.replace(choice, reason=reason, plans=plans)


def blast_refusal(
    settings: SearchSettings,
    one_node: bool,
    journal: Path | None,
    database_bytes: int,
    memory: WorkerMemory,
    outfmt: int = 0,
) -> str | None:
    """Why one BLAST+ run over the whole database would not give what this job asks for (None: it
    would): it runs on one node only, makes no metadata, and honours none of the engine's own
    behaviours (shipping, staging, partitions, output strategies, a stopped run's journal to resume)."""
    if not one_node:
        return "the job's ranks are on several nodes"
    asked = settings.engine_asked()
    if asked is not None:
        return asked
    if outfmt == 17:  # the engine writes the user's command line there (paramedic.blast.run)
        return "-outfmt 17's @PG line holds BLAST+'s command line, which one run here would not print as the user's"
    if journal is not None and journal.exists():
        return f"a stopped run's journal ({journal.name}) is beside the output, to resume from"
    if memory.physical is not None:
        node = memory.physical
        if memory.cgroup_limit is not None:
            node = min(node, memory.cgroup_limit)
        if database_bytes > QUERIES_MEMORY_SHARE * node:
            return (
                f"the whole database ({_mib(database_bytes)}) does not fit in {QUERIES_MEMORY_SHARE:.0%} of "
                f"the node's memory ({_mib(node)}): one run would read it from disk again"
            )
    return None


def choose_strategy(
    settings: SearchSettings,
    db: Database,
    manifest: Manifest,
    inexact: str | None = None,
    balance: QueryBalance | None = None,
    memory: WorkerMemory | None = None,
) -> StrategyChoice:
    """The strategy for this search (rank 0, before the work starts); `memory`: what a worker may use on
    the job's tightest node (`job_memory`), else measured on this node."""
    memory = memory if memory is not None else worker_memory()
    ships_metadata = False
    if settings.ship is not None:
        from paramedic.ship.registry import ships_pieces  # the shipping side only when it ships

        ships_metadata = ships_pieces(settings.ship.mode) or settings.ship.mode == "auto"
    needs_metadata = (
        settings.save_metadata is not None or settings.from_metadata is not None or ships_metadata
    )
    if settings.stage is not None and settings.strategy == "auto" and not needs_metadata:
        # staging copies fragments, which only the fragments strategy searches
        if inexact:
            raise UsageError(f"--stage stages fragments, and the fragments strategy {inexact}")
        whole, parts = database_sizes(db, manifest)
        chosen = decide("fragments", database_bytes=whole, fragment_bytes=parts, memory=memory)
        reason = "--stage is asked: staging copies fragments, which only the fragments strategy searches"
        return dataclasses.replace(chosen, asked="auto", reason=reason)
    whole, parts = database_sizes(db, manifest)
    return decide(
        settings.strategy,
        database_bytes=whole,
        fragment_bytes=parts,
        memory=memory,
        inexact=inexact,
        needs_metadata=needs_metadata,
        balance=balance,
    )


def database_sizes(db: Database, manifest: Manifest) -> tuple[int, list[int]]:
    """The bytes a search of the whole database reads, at most, and of each fragment: a database in
    place shares its files' bytes among its fragments by their letters."""
    if not manifest.in_place:
        sizes = VolumeSizes(db.directory)
        return sizes.of(db.whole), [sizes.of(f.volume) for f in manifest.fragments]
    from paramedic.db.manifest import in_place_files

    whole = 0
    for path in in_place_files(manifest):
        with contextlib.suppress(OSError):
            whole += path.stat().st_size
    letters = max(1, manifest.length)
    return whole, [whole * f.length // letters for f in manifest.fragments]


class VolumeSizes:
    """The sizes of makeblastdb volumes' files (what a search of a volume reads, at most), from one
    listing of the database directory (a glob per volume read it again for each of them)."""

    def __init__(self, directory: Path):
        self.files: list[tuple[str, int]] = []
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_file() and not entry.name.endswith((".pal", ".nal")):
                    self.files.append((entry.name, entry.stat().st_size))

    def of(self, volume: str) -> int:
        prefix = volume + "."
        return sum(size for name, size in self.files if name.startswith(prefix))


# -- measuring ----------------------------------------------------------------------------------------


def worker_memory(root: Path = Path("/"), environ: dict[str, str] | None = None) -> WorkerMemory:
    """The memory one worker of this job may use on this node. Called in rank 0 (the master), which runs
    on a node with workers. `root` and `environ` are for tests (a fake /proc and /sys)."""
    env = os.environ if environ is None else environ
    physical = _physical_memory(root)
    workers, source = local_workers(env)
    limit = cgroup_limit(root)
    per_worker = physical // workers if physical is not None else None
    cgroup_path: str | None = None
    ranks = 1
    cgroup_bytes: int | None = None
    if limit is not None:
        cgroup_bytes, directory = limit
        cgroup_path = str(Path("/") / directory.relative_to(root))
        threads = env.get(LOCAL_WORKERS_VARIABLE, "")
        ranks = int(threads) + 1 if threads.isdigit() else ranks_in(directory, root)
        by_cgroup = cgroup_bytes // max(1, ranks - 1)
        per_worker = by_cgroup if per_worker is None else min(per_worker, by_cgroup)
    return WorkerMemory(per_worker, physical, workers, source, cgroup_bytes, cgroup_path, ranks)


def node_memory() -> tuple[str, WorkerMemory]:
    """This rank's host name and what a worker may use there (every rank measures its own node)."""
    import socket

    return socket.gethostname(), worker_memory()


def job_memory(measured: Sequence[tuple[str, WorkerMemory]]) -> WorkerMemory:
    """What a worker may use on the job's tightest node. `measured[r]`: rank r's host name and its
    `worker_memory()` there. On one host, rank 0's own figure. Across hosts, each worker rank's node
    counts with its own physical memory shared by the job's workers there (its ranks, less the master on
    rank 0's), and its own memory cgroup's limit shared by the job's ranks in it (less the master where
    it is one of them): a node with a smaller cgroup decides for every worker."""
    hosts = [host for host, _ in measured]
    if len(set(hosts)) <= 1:
        return measured[0][1]
    best: WorkerMemory | None = None
    for host, m in measured[1:]:
        ranks = hosts.count(host)
        here = host == hosts[0]  # the master's node: one of its ranks searches nothing
        workers = max(1, ranks - here)
        per_worker = m.physical // workers if m.physical is not None else None
        if m.cgroup_limit is not None:
            by_cgroup = m.cgroup_limit // max(1, m.ranks_in_cgroup - here)
            per_worker = by_cgroup if per_worker is None else min(per_worker, by_cgroup)
        node = dataclasses.replace(
            m,
            per_worker=per_worker,
            workers_on_node=workers,
            workers_on_node_from=f"{ranks} rank{'s' if ranks != 1 else ''} of the job on {host}",
            node=host,
            master_here=here,
        )
        if per_worker is not None and (
            best is None or best.per_worker is None or per_worker < best.per_worker
        ):
            best = node
        elif best is None:
            best = node
    assert best is not None
    return best


def local_workers(env: os._Environ[str] | dict[str, str]) -> tuple[int, str]:
    """Workers on this node: the launcher's count of local ranks less the master, else one per core
    (what `paramedic search` starts without a launcher)."""
    threads = env.get(LOCAL_WORKERS_VARIABLE, "").strip()
    if threads.isdigit() and int(threads) > 0:
        return int(threads), f"{threads} worker thread{'s' if threads != '1' else ''} of one process"
    for name in LOCAL_RANKS_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return max(1, int(value) - 1), f"{name}={value}"
    tasks = env.get("SLURM_TASKS_PER_NODE", "").split("(")[0].split(",")[0]  # e.g. "4(x2),3"
    if tasks.isdigit() and int(tasks) > 0:
        return max(1, int(tasks) - 1), f"SLURM_TASKS_PER_NODE={env['SLURM_TASKS_PER_NODE']}"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return cores, f"{cores} cores"


def _physical_memory(root: Path) -> int | None:
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_limit(root: Path = Path("/")) -> tuple[int, Path] | None:
    """The memory limit that binds this process (the smallest on its cgroup's path up to the mount), and
    the directory that sets it; None without a memory cgroup or a limit. cgroup v1 (`memory` controller,
    memory.limit_in_bytes) and v2 (memory.max)."""
    try:
        membership = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in membership:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    best: tuple[int, Path] | None = None
    for mount_root, mountpoint, fstype, options in _cgroup_mounts(mounts):
        if fstype == "cgroup" and "memory" in options and v1_path is not None:
            path, limit_file = v1_path, "memory.limit_in_bytes"
        elif fstype == "cgroup2" and v2_path is not None:
            path, limit_file = v2_path, "memory.max"
        else:
            continue
        top = root / mountpoint.lstrip("/")
        inside = path == mount_root or path.startswith(mount_root.rstrip("/") + "/")
        relative = os.path.relpath(path, mount_root) if inside else "."
        directory = Path(os.path.normpath(top / relative))
        if not directory.is_dir():
            directory = top  # a cgroup namespace: the mount shows this process's own cgroup
        while True:
            limit = _read_limit(directory / limit_file)
            if limit is not None and (best is None or limit < best[0]):
                best = (limit, directory)
            if directory == top or top not in directory.parents:
                break
            directory = directory.parent
    return best


def _cgroup_mounts(mounts: list[str]) -> list[tuple[str, str, str, set[str]]]:
    """(root inside the hierarchy, mount point, fstype, super options) of the cgroup mounts."""
    found = []
    for line in mounts:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] in ("cgroup", "cgroup2"):
            found.append((_unescape(fields[3]), _unescape(fields[4]), tail[0], set(tail[2].split(","))))
    return found


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():  # v2: "max"
        return None
    value = int(text)
    return value if value < _NO_LIMIT else None


def ranks_in(directory: Path, root: Path = Path("/")) -> int:
    """How many of this job's ranks share a cgroup's limit: processes under `directory` (its subtree)
    running this process's own command line, at least 1 (this one), less a rank's own children that
    have not exec'd yet (a fork server starting, the digest's child: same command line, their parent one
    of the ranks; counting one made a node of 2 ranks count 3, seen in `make test-cluster`). Ranks in
    cgroups of their own count one each; a batch system's job cgroup holds all the node's ranks."""
    try:
        mine = (root / "proc/self/cmdline").read_bytes()
    except OSError:
        return 1
    matching: dict[str, str | None] = {}  # pid -> its parent's pid
    for current, _, files in os.walk(directory):
        if "cgroup.procs" not in files:
            continue
        try:
            pids = Path(current, "cgroup.procs").read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                if (root / "proc" / pid / "cmdline").read_bytes() == mine:
                    matching[pid] = _parent(root, pid)
            except OSError:
                continue
    return max(1, sum(1 for parent in matching.values() if parent not in matching))


def _parent(root: Path, pid: str) -> str | None:
    """A process's parent pid from /proc/PID/stat (after the command name, which may hold spaces)."""
    try:
        return (root / "proc" / pid / "stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return None


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB" if n >= MiB else f"{n:,} bytes"
