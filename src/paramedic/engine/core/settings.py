"""What `paramedic search` was asked to do, as typed settings: the CLI builds them, every rank reads them.

Kept apart from `engine.job.job` so that the process that only starts mpiexec imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from paramedic.blast.options import typed_value
from paramedic.errors import UsageError
from paramedic.output.strategies import MASTER, output_strategy_names

if TYPE_CHECKING:
    from paramedic.ship.destination import ShipSettings

# Copies from shared storage in flight at once, over the whole job (each master's: with --partition-size,
# each partition's): mpiBLAST's --concurrent. The shared storage is what they load, so the bound is
# counted there, not per node; 2 keeps a shared filesystem streaming without a crowd of readers.
DEFAULT_STAGE_COPIES = 2

# Set by the launcher for a local job: the job's workers are this many threads of one process, which
# share its node and its memory cgroup (read by paramedic.engine.core.strategy).
LOCAL_WORKERS_VARIABLE = "PARAMEDIC_LOCAL_WORKERS"


@dataclass(frozen=True)
class StageSettings:
    """--stage DIR and its companions: fragments copied to a node-local cache (paramedic.db.stage)."""

    directory: Path  # node-local cache directory (the same path on every node)
    limit: int | None = None  # --stage-limit in bytes (None: unbounded)
    mirrors: tuple[str, ...] = ()  # --mirror: other replicas of the database to copy from
    keys: Path | None = None  # --keys for tls:// mirrors
    copies: int = DEFAULT_STAGE_COPIES  # --stage-copies: copies in flight at once
    # (--mirror URL, why) for each mirror the job's check at its start dropped (down, slow, serving no
    # reads: paramedic.engine.job.job.check_stage): the ranks list it as dropped and never open it, so a
    # mirror found dead once is not waited for again (its open's bound, per rank) in the same job
    dropped_mirrors: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise UsageError("--stage-copies must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise UsageError("--stage-limit must be at least 1 byte")


TRACEBACK_CHOICES = ("auto", "once", "per-fragment")
# "auto": consecutive fragments are searched together when the whole database fits in each worker's
# memory (paramedic.engine.core.plan.fragment_groups); "off": one search per fragment
FRAGMENT_GROUP_CHOICES = ("auto", "off")
# How a search started without an MPI launcher runs (paramedic.engine.runtime.local): "local" runs the workers
# as threads of this process, each driving BLAST+; "mpi" starts mpiexec with one rank per worker; "auto"
# is local unless an option needs MPI ranks (what `needs_mpi` names).
RUNNER_CHOICES = ("auto", "local", "mpi")


@dataclass(frozen=True)
class SearchSettings:
    program: str
    blast_args: list[str]
    batch: int | None = None  # queries per search task (default: sized from start-up cost)
    piece_queries: int | None = None  # queries per regeneration run
    quiet: bool = False
    record: Path | None = None  # run record path (default: <out>.run.json)
    save_metadata: Path | None = None  # write the merged subjects per query here
    strategy: str = "auto"  # "fragments", "queries" or "auto" (see choose_strategy)
    # fragments: "once" stops each fragment search after BLAST+'s preliminary stage and aligns each
    # query once, against the whole database's list; "per-fragment" aligns in every fragment search;
    # "auto" chooses (paramedic.engine.job.job.traceback_once_pays)
    traceback: str = "auto"
    fragment_groups: str = "auto"  # --fragment-groups: see FRAGMENT_GROUP_CHOICES
    from_metadata: Path | None = None  # skip the search: regenerate from saved metadata
    ship: ShipSettings | None = None  # send the output to a storage site (--site) instead of -out here
    restart: bool = False  # discard the journal of an earlier, unfinished run instead of continuing it
    journal: bool = True  # keep finished work in a journal beside the output (paramedic.engine.rank.journal)
    # ranks per partition (a partition master and its workers) under a supermaster, rank 0
    # (paramedic.engine.core.hierarchy); None: one master for all workers
    partition_size: int | None = None
    # workers per copy of the database: each worker prefers its share of the fragments (None: any)
    replica_group_size: int | None = None
    # who writes the report file (paramedic.output.strategies): rank 0 ("master") or the workers
    output_strategy: str = MASTER
    # fragments copied to a node-local cache before they are searched (--stage; None: read in place)
    stage: StageSettings | None = None
    cwd: Path = field(default_factory=Path.cwd)
    # the report page (paramedic.report.html) rank 0 writes from the run record at the end (--report)
    report: Path | None = None
    runner: str = "auto"  # --runner: see RUNNER_CHOICES

    def __post_init__(self) -> None:
        """The settings check themselves: whoever builds them (the CLI, a test, a library user) gets the
        same one-line refusals."""
        self._check_values()
        self._check_combinations()
        self._check_output_strategy()

    def engine_asked(self) -> str | None:
        """Why these settings ask for the engine itself, so that one BLAST+ run over the whole database
        (`--strategy auto`'s "blast" plan on one node) would not do what they say (None: it may): its
        shipping, metadata, staging, partitions, output strategies or task sizes, or a plan by name. Known
        before the job is checked: the local runner starts the workers' fork servers only for a job the
        engine will run (paramedic.engine.runtime.launch)."""
        asked = [
            (self.ship is not None, "--site ships the output to a storage site"),
            (self.save_metadata is not None, "--metadata saves the merged hits, which only fragments make"),
            (self.from_metadata is not None, "--from-metadata writes the report from saved metadata"),
            (self.stage is not None, "--stage searches staged fragments"),
            (self.partition_size is not None, "--partition-size asks for partitions of ranks"),
            (self.replica_group_size is not None, "--replica-group-size places fragments on workers"),
            (self.output_strategy != MASTER, f"--output-strategy {self.output_strategy} asks the workers to write"),
            (self.traceback != "auto", f"--traceback {self.traceback} is how fragment searches align"),
            (self.fragment_groups != "auto", f"--fragment-groups {self.fragment_groups} is how fragments are searched"),
            (self.batch is not None, "--batch sizes the engine's search tasks"),
            (self.piece_queries is not None, "--regen-batch sizes the engine's report pieces"),
        ]  # fmt: skip
        return next((why for given, why in asked if given), None)

    def _check_values(self) -> None:
        """Each option alone: counts at least 1, choices among their own."""
        for flag, value in (
            ("--batch", self.batch),
            ("--regen-batch", self.piece_queries),
            ("--replica-group-size", self.replica_group_size),
        ):
            if value is not None and value < 1:
                raise UsageError(f"{flag} must be at least 1")
        if self.strategy not in ("auto", "fragments", "queries"):
            raise UsageError(f"--strategy {self.strategy}: choose auto, fragments or queries")
        for flag, choice, choices in (
            ("--traceback", self.traceback, TRACEBACK_CHOICES),
            ("--fragment-groups", self.fragment_groups, FRAGMENT_GROUP_CHOICES),
            ("--runner", self.runner, RUNNER_CHOICES),
        ):
            if choice not in choices:
                raise UsageError(f"{flag} {choice}: choose {', '.join(choices)}")
        if self.partition_size is not None and self.partition_size < 2:
            raise UsageError("--partition-size must be at least 2 (a partition master and a worker)")

    def _check_combinations(self) -> None:
        """Options that cannot go together, each refusal naming both."""
        if self.traceback != "auto" and self.strategy == "queries":
            raise UsageError(
                f"--traceback {self.traceback} is how fragment searches align, and --strategy queries "
                "searches no fragments: drop one of them"
            )
        if self.fragment_groups != "auto" and self.strategy == "queries":
            raise UsageError(
                f"--fragment-groups {self.fragment_groups} is how fragments are searched, and --strategy "
                "queries searches no fragments: drop one of them"
            )
        if self.partition_size is not None and self.from_metadata is not None:
            raise UsageError("--partition-size cannot regenerate from --from-metadata: run it without")
        if self.stage is not None:
            if self.strategy == "queries":
                raise UsageError(
                    "--stage copies fragments to each node, and --strategy queries searches the whole "
                    "database in place: use --strategy fragments (or auto) with --stage, or drop --stage"
                )
            if self.from_metadata is not None:
                raise UsageError("--from-metadata searches nothing, so there is nothing to --stage: drop it")
        if self.restart and not self.journal:
            raise UsageError("--restart discards a journal and --no-journal keeps none: choose one")
        if self.runner == "local" and self.needs_mpi:
            raise UsageError(
                f"--runner local runs one process's threads, and {self.needs_mpi} needs MPI ranks"
            )

    @property
    def needs_mpi(self) -> str | None:
        """The option that needs MPI ranks (a worker's own MPI-IO, node identities, partitions), or None."""
        if self.partition_size is not None:
            return "--partition-size"
        if self.output_strategy != MASTER:
            return f"--output-strategy {self.output_strategy}"
        if self.stage is not None:
            return "--stage"
        return None

    def _check_output_strategy(self) -> None:
        names = output_strategy_names()
        if self.output_strategy not in names:
            raise UsageError(f"--output-strategy {self.output_strategy}: choose {', '.join(names)}")
        if self.output_strategy == MASTER:
            return
        flag = f"--output-strategy {self.output_strategy}"
        args = self.blast_args
        out = typed_value(args, "out")
        if self.ship is not None:
            raise UsageError(f"{flag} writes a file here; with --site rank 0 sends the output: drop {flag}")
        if out is None or out == "-":
            raise UsageError(f"{flag} writes a file: standard output is written by rank 0 (give -out FILE)")
