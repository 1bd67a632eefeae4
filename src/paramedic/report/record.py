"""The run record: per-phase time per rank, tasks, bytes and hits, written as JSON next to the output.

Phases: `search` (fragment searches and reading their hits), `merge` (master), `regenerate` (BLAST+
writing the report for a query group), `write` (master: stitching and writing pieces in order).
"""

from __future__ import annotations

import json
import os
import resource
import stat
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple, NotRequired, TypedDict

from paramedic.durable import write_output

PHASES = ("search", "merge", "regenerate", "write")
# Version of the record's layout (CHANGELOG.md): readers refuse another one. 2 added `version` itself,
# `resumed`, and the typed `ship` section. Added keys keep the version (CHANGELOG.md).
VERSION = 2


class ShipReport(TypedDict):
    """The run record's `ship` section (with --site): what crossed the link, and why (see ship.destination
    and ship.auto). f: encoding at the compute site; g: regeneration at the storage site."""

    site: str
    mode: str
    codec: str
    streams: int
    output_path: str
    output_bytes: int
    shipped_payload_bytes: int
    setup_bytes: int
    wire_bytes: int
    ratio_output_to_payload: float | None
    chunks: int
    chunks_resent: int
    reconnects: int
    f_encode_seconds: float
    transfer_seconds: float | None
    finish_wait_seconds: float
    g_site_decode_seconds: float | None
    site_sha256: str | None
    auto_decision: dict[str, Any] | None
    precision: NotRequired[str]  # a trace's time precision: "lossless" or e.g. "1us" (--trace-precision)
    already_at_site: NotRequired[bool]  # an earlier run of the same `paramedic ship` had the site publish it


class StrategyReason(TypedDict):
    """The run record's `strategy_reason`: which strategy the search used and why (see
    engine.core.strategy). Memory figures in bytes; `memory_per_worker_bytes` is the smallest of the memory
    cgroup's limit shared by the job's ranks in it and the physical memory shared by the node's workers."""

    asked: str  # --strategy: auto, fragments or queries
    chosen: str  # fragments, queries or blast (one BLAST+ run over the whole database)
    reason: str  # one sentence
    database_bytes: int  # the whole database's BLAST+ files
    largest_fragment_bytes: int
    fragments: int
    memory_share: float  # auto picks queries when the whole database fits this share of a worker's memory
    memory_per_worker_bytes: int | None
    physical_bytes: int | None
    cgroup_limit_bytes: int | None
    workers_on_node: int
    workers_on_node_from: str  # e.g. "MPI_LOCALNRANKS=3"
    cgroup: str | None  # the memory cgroup whose limit binds
    ranks_in_cgroup: int  # this job's ranks sharing that limit
    # auto: the plans the cost model weighed (paramedic.engine.core.costs), each {"plan", "predicted_seconds",
    # "candidate", and "mt_mode" for blast, "why_not" for a plan that was not a candidate}
    plans: NotRequired[list[dict[str, Any]]]


class TaskCost(NamedTuple):
    """One task a rank ran, as `RankStats.task_costs` keeps it (a JSON list in this column order): what the
    predictor (paramedic.engine.predict.costs) scales to other jobs."""

    kind: str  # "search" (a fragment search), "piece" (a report piece), "whole" (query segmentation)
    number: int  # the search batch, or the piece
    fragment: int  # the fragment searched; -1 for a piece
    queries: int
    query_residues: int
    database_residues: int  # the fragment's (search), the whole database's (whole), 0 (piece)
    seconds: float  # BLAST+'s own seconds for the task


TASK_KINDS = ("search", "piece", "whole")
# Phases whose spans RankStats.events keeps (the tasks' are in task_costs and task_starts)
EVENT_PHASES = ("merge", "write")
EVENT_MIN_SECONDS = 0.002
MAX_EVENTS = 5000


@dataclass
class RankStats:
    rank: int
    role: str
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    # regenerate = rendered (written from the search's alignments) + by search; render_fallbacks of them
    # were to be rendered but their reports did not line up (paramedic.blast.render); injected: BLAST+
    # batches of traceback-once pieces that aligned the searches' lists without scanning for them
    tasks: dict[str, int] = field(
        default_factory=lambda: {
            "search": 0,
            "regenerate": 0,
            "rendered": 0,
            "render_fallbacks": 0,
            "injected": 0,
        }
    )
    fragments: list[int] = field(default_factory=list)  # fragments searched, in order (cache affinity)
    search_output_bytes: int = 0
    report_bytes: int = 0
    peak_rss_mb: float = 0.0  # this rank's Python process
    peak_blast_rss_mb: float = 0.0  # largest BLAST+ child process of this rank
    python_cpu_seconds: float = 0.0  # this rank's own CPU time (user + system), BLAST+ runs excluded
    received_bytes: int = 0  # MPI messages received (rank 0: the workers' results, reports included)
    # Every task this rank ran, in order: TaskCost's fields as a list (compact in JSON)
    task_costs: list[list[Any]] = field(default_factory=list)
    # When each of task_costs began (seconds since the epoch, the rank's clock): the moment it was recorded
    # less its seconds. For the report page's timeline (paramedic.report.html); [] in older records
    task_starts: list[float] = field(default_factory=list)
    # A master's merging and writing, and a worker's staging of a fragment (its copy to the node-local
    # cache, or the wait for another worker's), as [kind, start (epoch seconds), seconds], for the
    # timeline: spans of at least EVENT_MIN_SECONDS, at most MAX_EVENTS of them. [] in older records
    events: list[list[Any]] = field(default_factory=list)
    # With --stage: this rank's node-local cache (paramedic.engine.rank.staging.Stager.record): node, hits,
    # copies, bytes, seconds copying and waiting, evictions, volumes searched in place, each replica's
    # bytes, seconds and why it was dropped. None: no staging, or no fragment searched
    stage: dict[str, Any] | None = None

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds
        if phase in EVENT_PHASES:
            self.add_event(phase, time.time() - seconds, seconds)

    def add_event(self, kind: str, start: float, seconds: float) -> None:
        """A span for the report's timeline (merge, write, stage: a fragment's copy or the wait for it)."""
        if seconds >= EVENT_MIN_SECONDS and len(self.events) < MAX_EVENTS:
            self.events.append([kind, round(start, 4), round(seconds, 4)])

    def add_task(self, cost: TaskCost) -> None:
        self.task_costs.append([*cost[:6], round(cost.seconds, 4)])
        self.task_starts.append(round(time.time() - cost.seconds, 4))

    def costs(self) -> list[TaskCost]:
        """`task_costs` as typed values; ValueError for an entry of another shape."""
        out = []
        for entry in self.task_costs:
            if (
                not isinstance(entry, list)
                or len(entry) != len(TaskCost._fields)
                or entry[0] not in TASK_KINDS
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry[1:6])
                or not isinstance(entry[6], (int, float))
                or isinstance(entry[6], bool)
                or entry[6] < 0
            ):
                raise ValueError(f"rank {self.rank}: malformed task cost {entry!r}")
            kind, number, fragment, queries, query_residues, database_residues, seconds = entry
            out.append(
                TaskCost(kind, number, fragment, queries, query_residues, database_residues, float(seconds))
            )
        return out

    def measure_memory(self) -> None:
        """Peak RSS of this process and of its largest BLAST+ run. Call it once the rank's BLAST+ fork
        servers are stopped (paramedic.engine.runtime.roles), so that their children count as its descendants."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.peak_rss_mb = usage.ru_maxrss / 1024
        self.python_cpu_seconds = round(usage.ru_utime + usage.ru_stime, 3)
        self.peak_blast_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


@dataclass
class RunRecord:
    program: str
    command: list[str]
    database: str
    manifest_sha256: str
    queries: int
    ranks: int
    workers: int
    batches: int
    fragments: int
    pieces: int
    # "fragments" (search fragments, merge, regenerate), "queries" (query segmentation) or "blast" (one
    # BLAST+ run over the whole database with -num_threads = `workers`: paramedic.engine.job.whole)
    strategy: str
    search_batch_queries: int  # queries per search task (the first batch)
    regen_group_queries: int  # queries per regeneration run (the first piece)
    blast_startup_seconds: float  # measured at job start; the floor of every task
    wall_seconds: float
    output: str
    output_bytes: int
    metadata_pairs: int | None  # merged (query, subject) pairs: the size of the semantic metadata
    queries_with_hits: int | None  # None with query segmentation (nothing is merged)
    searched_again: int | None  # queries whose hit list filled: report by search against their whole list
    ranks_stats: list[RankStats]
    ship: ShipReport | None = None  # with --site: shipping figures
    # Work an earlier, unfinished run of the job had finished, taken from its journal instead of being
    # done again: {"searches": fragment searches, "pieces": report pieces} (None: no journal)
    resumed: dict[str, int] | None = None
    # Where the searches' alignments went when reports are written from them: "store" (they stayed
    # with the workers, in the search store every rank reads), "tasks" (through rank 0, with the tasks:
    # some rank did not see the store), None (reports written by searching again)
    alignments: str | None = None
    # Partitions of the ranks (--partition-size): 1 is one master for all workers; more, a supermaster
    # (rank 0) handing query segments to partition masters (paramedic.engine.core.hierarchy)
    partitions: int = 1
    # Who wrote the report file (--output-strategy): "master" (rank 0) or a worker strategy
    output_strategy: str = "master"
    # What a worker strategy did: {"rounds": collective rounds} or {"segments": .., "gathered": segments
    # whose writer received pieces from other ranks}; None under master
    output_writes: dict[str, int] | None = None
    # Which strategy was used and why, with the sizes and the memory per worker it was decided from
    strategy_reason: StrategyReason | None = None
    # With --stage: the cache's settings and the job's totals over its ranks (each rank's in its
    # ranks_stats `stage`): hits, copies, bytes, seconds, evictions, volumes searched in place
    stage: dict[str, Any] | None = None
    # How the fragment searches aligned: "once" (they stopped after BLAST+'s preliminary stage; each
    # query was aligned once, against the whole database's list) or "per-fragment"; None: queries
    traceback: str | None = None
    traceback_reason: str | None = None  # why, in numbers (paramedic.engine.job.job.choose_traceback)
    # How the workers ran: "mpi" (ranks of an MPI job) or "local" (threads of one process started
    # without an MPI launcher, paramedic.engine.runtime.local)
    runner: str = "mpi"
    # Searches per batch when consecutive fragments are searched together (paramedic.engine.core.plan,
    # fragment_groups; a task's `fragment` is then its group); None: one search per fragment
    fragment_groups: int | None = None
    # A restricted search (-seqidlist, -taxids, ...): the option, with taxids how the installed BLAST+
    # matches them (its version; exact in 2.12, with descendants in 2.15+), and the subset's size when
    # it was resolved for the fragment searches (paramedic.engine.job.job.restriction_record)
    restriction: dict[str, Any] | None = None
    # The first job on a database in place, on several nodes: its files digested one share per node
    # (paramedic.db.spread): nodes, files and bytes rank 0 took, each digesting rank's files and seconds
    first_digest: dict[str, Any] | None = None
    version: int = VERSION

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        """A record as written by `write` (for bench/ and users' scripts): ValueError for anything else,
        including a record of another version."""
        data = load_json_file(path, MAX_RECORD_BYTES)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            found = data.get("version") if isinstance(data, dict) else None
            raise ValueError(f"{path}: run record version {found}, expected {VERSION}")
        data.pop("phase_totals", None)  # derived, written for readers
        data.pop("search_startup_share", None)
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{path}: unknown run record keys {sorted(unknown)}")
        data["ranks_stats"] = [RankStats(**r) for r in data["ranks_stats"]]
        return cls(**data)

    def startup_share(self) -> float:
        """Estimated share of BLAST+ process start-up in the search phase (goal: under 5%)."""
        tasks = sum(r.tasks["search"] for r in self.ranks_stats)
        search = sum(r.seconds["search"] for r in self.ranks_stats)
        return tasks * self.blast_startup_seconds / search if search else 0.0

    def _tasks_line(self) -> str:
        n = _count
        searches = sum(r.tasks["search"] for r in self.ranks_stats)
        share = f"start-up ~{100 * self.startup_share():.1f}% of search"
        if self.strategy == "blast":
            return f"  tasks: one BLAST+ run with -num_threads {self.workers}"
        if self.strategy == "queries":
            return (
                f"  tasks: {n(searches, 'whole-database search', 'es')} of "
                f"{n(self.search_batch_queries, 'query', 'ies')} ({share})"
            )
        up_to = "" if self.batches * self.search_batch_queries == self.queries else "up to "
        groups = "" if self.pieces * self.regen_group_queries == self.queries else "up to "
        return (
            f"  tasks: {n(searches, 'search', 'es')} in {n(self.batches, 'batch', 'es')} of {up_to}"
            f"{n(self.search_batch_queries, 'query', 'ies')} ({share}), "
            f"{n(self.pieces, 'regeneration')} of {groups}{n(self.regen_group_queries, 'query', 'ies')}"
            + self._batch_note()
        )

    def _batch_note(self) -> str:
        """What became of --batch N when the batches are not N queries (said, not silent)."""
        asked = next(
            (self.command[i + 1] for i, a in enumerate(self.command[:-1]) if a == "--batch"),
            next((a.split("=", 1)[1] for a in self.command if a.startswith("--batch=")), None),
        )
        if asked is None or not asked.isdigit() or int(asked) == self.search_batch_queries:
            return ""
        return (
            f"\n  --batch {asked} became {self.search_batch_queries}: a batch holds whole report pieces "
            "(--regen-batch sets their size), ends where BLAST+ starts a query batch of its own, and holds "
            "at most the queries there are"
        )

    def _strategy_line(self) -> str:
        reason = self.strategy_reason
        why = f" ({reason['asked']}: {reason['reason']})" if reason and reason["asked"] == "auto" else ""
        writer = f"; output written by {self.output_strategy}" if self.output_strategy != "master" else ""
        return f"  strategy: {self.strategy}{why}{writer}"

    def phase_totals(self) -> dict[str, float]:
        return {p: round(sum(r.seconds[p] for r in self.ranks_stats), 3) for p in PHASES}

    def write(self, path: Path) -> None:
        data = asdict(self)
        data["phase_totals"] = self.phase_totals()
        data["search_startup_share"] = round(self.startup_share(), 4)
        path.parent.mkdir(parents=True, exist_ok=True)  # a --site job's record mirrors the remote path
        write_output(path, (json.dumps(data, indent=2) + "\n").encode())

    def summary(self) -> str:
        totals = self.phase_totals()
        lines = [
            f"paramedic: {self.program} {_count(self.queries, 'query', 'ies')} x "
            + (
                "the whole database"
                if self.strategy in ("queries", "blast")
                else _count(self.fragments, "fragment")
            )
            + (
                f" in {_count(self.fragment_groups, 'search', 'es')} per batch"
                if self.fragment_groups
                else ""
            )
            + f" on {_count(self.workers, 'worker')}"
            + (f" in {self.partitions} partitions" if self.partitions > 1 else "")
            + f" in {self.wall_seconds:.1f} s",
            self._tasks_line(),
            "  CPU-side time per phase (all ranks): " + ", ".join(f"{p} {totals[p]:.1f} s" for p in PHASES),
            self._strategy_line()
            + (
                f", traceback once; {_count(self.metadata_pairs, 'subject')} aligned once (the whole "
                f"database's preliminary lists), {_count(self.queries_with_hits or 0, 'query', 'ies')} "
                "with candidates"
                if self.traceback == "once" and self.metadata_pairs is not None
                else f"; hits: {_count(self.metadata_pairs, 'query-subject pair')}, "
                f"{_count(self.queries_with_hits or 0, 'query', 'ies')} with hits, "
                f"{self.searched_again} searched again (hit list filled)"
                if self.metadata_pairs is not None
                else " (one BLAST+ run over the whole database)"
                if self.strategy == "blast"
                else " (query segmentation: whole database per task, no merge)"
            ),
            f"  output: {self.output} ({self.output_bytes:,} bytes)",
        ]
        if self.resumed and (self.resumed["searches"] or self.resumed["pieces"]):
            lines.append(
                f"  resumed: {_count(self.resumed['searches'], 'fragment search', 'es')} and "
                f"{_count(self.resumed['pieces'], 'report piece')} kept from an earlier run"
            )
        if self.ship is not None:
            ship = self.ship
            lines.append(
                f"  shipped ({ship['mode']}): {ship['shipped_payload_bytes']:,} bytes for {ship['output_bytes']:,} "
                f"bytes of output (ratio {ship['ratio_output_to_payload']}), {_count(ship['chunks'], 'chunk')}, "
                f"{ship['chunks_resent']} re-sent, {_count(ship['reconnects'], 'reconnect')}; site sha256 "
                f"{str(ship['site_sha256'])[:16]}..."
            )
        if self.stage is not None:
            st = self.stage
            lines.append(
                f"  staged in {st['directory']}: {_count(st['copies'], 'copy', 'ies')} "
                f"({st['copied_bytes'] / 2**20:,.1f} MiB in {st['copy_seconds']:.1f} s), "
                f"{_count(st['hits'], 'hit')}, {_count(st['evictions'], 'eviction')}"
                + (f", searched in place: {', '.join(st['in_place'])}" if st["in_place"] else "")
            )
        dropped = {
            str(rep.get("replica")): str(rep["dropped"])
            for r in self.ranks_stats
            for rep in (r.stage or {}).get("replicas", [])
            if isinstance(rep, dict) and rep.get("dropped")
        }
        lines += [f"  replica {name} dropped: {why}" for name, why in sorted(dropped.items())]
        peak = max((r.peak_blast_rss_mb for r in self.ranks_stats), default=0.0)
        lines.append(f"  peak memory: BLAST+ {peak:.0f} MB per process")
        return "\n".join(lines)


def _count(n: int, word: str, plural: str = "s") -> str:
    """ "1 batch", "2 batches"; plural "ies" replaces a final y ("1 query", "3 queries")."""
    if n == 1:
        return f"{n} {word}"
    return f"{n:,} {word[:-1] + 'ies' if plural == 'ies' else word + plural}"


# A record holds a few numbers per task and per rank: tens of MB for the largest jobs
MAX_RECORD_BYTES = 256 << 20


def load_json_file(path: Path, limit: int) -> Any:
    """JSON from a regular file of at most `limit` bytes; ValueError for anything else (a FIFO waited for
    ever, /dev/zero was read whole: MemoryError; JSON nested thousands deep: RecursionError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        data = fh.read(limit + 1) if st.st_size <= limit else b""
    if st.st_size > limit or len(data) > limit:
        raise ValueError(f"larger than a run record can be ({limit:,} bytes)")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
