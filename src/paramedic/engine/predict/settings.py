"""What `paramedic simulate` was asked to predict, as typed settings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from paramedic.engine.predict.costs import LATENCY_SECONDS, OUTPUT_COSTS
from paramedic.engine.predict.startup import DatabaseShape, StartupRates
from paramedic.errors import UsageError

# One MPI message handled by a master: receive and unpickle a result, or pickle and send a task (measured
# on this machine with mpi4py and the MPICH wheel between two ranks: bench/simulate.py --calibrate).
MESSAGE_SECONDS = 60e-6


@dataclass(frozen=True)
class SimulateSettings:
    """`paramedic simulate`: predict a job of `queries` queries on `workers` ranks besides rank 0 (as
    `paramedic search --np`), from the record of a pilot run."""

    record: Path
    queries: int | None  # None: the queries of `query_file`
    workers: int
    partition_size: int | None = None  # ranks per partition (its master and workers); None: one master
    replica_group_size: int | None = None  # workers per copy of the database (--replica-group-size)
    output_strategy: str = "master"
    fragments: int | None = None  # the database cut into this many equal fragments (default: the pilot's)
    database_scale: float = 1.0  # a database this many times the pilot's (same cost per residue pair)
    batch: int | None = None  # queries per search task (default: the pilot's --batch, else sized)
    message_seconds: float = MESSAGE_SECONDS
    latency_seconds: float = LATENCY_SECONDS
    seed: int = 1
    # cores the ranks share (one machine): with more workers than cores a task takes workers/cores times
    # its cost (the cores shared out evenly); None: a core per rank, as on a cluster
    cores: int | None = None
    # the job's cores this many times as fast as the pilot's (a cluster's cores, or a pilot measured on a
    # loaded machine): every BLAST+ second of the pilot's rates divided by it
    core_speed: float = 1.0
    query_file: Path | None = None  # the job's own queries: their lengths instead of sampled ones
    # a database described by its size (paramedic.engine.predict.startup), searched in place: its start-up is
    # predicted; None: the pilot's database (scaled), whose start is in the pilot's fixed cost
    database: DatabaseShape | None = None
    first_job: bool = True  # no digest remembered yet (and with --stage, empty node caches)
    stage: bool = False  # --stage: volumes copied to each node's disk
    node_ranks: int = 1  # ranks per node (a node copies a volume once)
    rates: StartupRates = StartupRates()

    def __post_init__(self) -> None:
        if (self.queries is None) == (self.query_file is None):
            raise UsageError("give --queries N or --query-file FASTA (one of them)")
        if self.queries is not None and self.queries < 1:
            raise UsageError("--queries must be at least 1")
        if self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.partition_size is not None:
            if self.partition_size < 2:
                raise UsageError("--partition-size must be at least 2 (a partition master and a worker)")
            if self.workers < self.partition_size:
                raise UsageError(
                    f"--workers {self.workers} is fewer than one partition of {self.partition_size} ranks"
                )
        if self.replica_group_size is not None and self.replica_group_size < 1:
            raise UsageError("--replica-group-size must be at least 1")
        if self.output_strategy not in OUTPUT_COSTS:
            raise UsageError(
                f"--output-strategy {self.output_strategy!r}: choose one of {', '.join(OUTPUT_COSTS)}"
            )
        if self.fragments is not None and self.fragments < 1:
            raise UsageError("--fragments must be at least 1")
        if not (self.database_scale > 0 and math.isfinite(self.database_scale)):
            raise UsageError("--database-scale must be a positive number")
        if self.batch is not None and self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.cores is not None and self.cores < 1:
            raise UsageError("--cores must be at least 1")
        if self.message_seconds < 0 or self.latency_seconds < 0:
            raise UsageError("--message-seconds and --latency-seconds must not be negative")
        self._check_database()

    def _check_database(self) -> None:
        if self.node_ranks < 1:
            raise UsageError("--node-ranks must be at least 1")
        if not (self.core_speed > 0 and math.isfinite(self.core_speed)):
            raise UsageError("--core-speed must be a positive number")
        if self.database is not None and self.database_scale != 1.0:
            raise UsageError(
                "--database-scale scales the pilot's database; --database-profile or --db-bytes describe "
                "another one: give one of them"
            )
        if self.database is None and self.stage:
            raise UsageError("--stage needs the database described: --database-profile or --db-bytes")
