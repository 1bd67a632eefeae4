"""`paramedic simulate`: a search's wall time and efficiency predicted at any scale from a pilot run's
record."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from paramedic.cli.parsing import command_parser
from paramedic.errors import UsageError


def simulate_command(argv: list[str]) -> int:
    from paramedic.engine.predict.costs import OUTPUT_COSTS  # importing it registers the output costs
    from paramedic.engine.predict.settings import SimulateSettings
    from paramedic.engine.predict.simulate import run_simulate
    from paramedic.engine.predict.startup import DATABASES, DatabaseShape, StartupRates, parse_bytes, profile

    parser = command_parser(
        "simulate",
        "Predict a search's wall time, efficiency and idle time per role for any number of queries and "
        "workers: the engine's own schedulers run in virtual time, with task costs from a pilot run's "
        "record (its <out>.run.json).",
    )
    parser.add_argument("--record", required=True, type=Path, help="the pilot run's record")
    parser.add_argument("--queries", type=int, help="queries of the predicted job (lengths sampled)")
    parser.add_argument(
        "--query-file", type=Path, help="or the predicted job's own queries (FASTA): their lengths"
    )
    parser.add_argument(
        "--workers", required=True, type=int, help="ranks besides rank 0, as `paramedic search --np`"
    )
    parser.add_argument(
        "--partition-size", type=int, help="ranks per partition (a partition master and its workers)"
    )
    parser.add_argument(
        "--replica-group-size", type=int, help="workers per copy of the database, as in search"
    )
    parser.add_argument(
        "--output-strategy",
        choices=sorted(OUTPUT_COSTS),
        default="master",
        help="who writes the report (default master: rank 0)",
    )
    parser.add_argument(
        "--fragments", type=int, help="cut the database into this many fragments (default: the pilot's)"
    )
    parser.add_argument(
        "--database-scale",
        type=float,
        default=1.0,
        help="a database this many times the pilot's (default 1; same cost per residue pair)",
    )
    parser.add_argument("--batch", type=int, help="queries per search task (default: as the pilot)")
    parser.add_argument(
        "--cores",
        type=int,
        help="cores the ranks share on one machine: more workers than cores slow every task in "
        "proportion (default: a core per rank)",
    )
    parser.add_argument(
        "--core-speed",
        type=float,
        default=1.0,
        help="the job's cores this many times as fast as the pilot's: its BLAST+ seconds divided by it "
        "(default 1)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the query sampling (default 1)")
    described = parser.add_argument_group(
        "a database searched in place, described by its size (its start-up and verification predicted)"
    )
    described.add_argument(
        "--database-profile",
        choices=sorted(DATABASES),
        help="one of NCBI's databases: "
        + "; ".join(f"{name} {about}" for name, (_, _, _, about) in DATABASES.items()),
    )
    described.add_argument("--db-bytes", help="or its files' size: 364G (10^9 bytes), 1.07TiB (2^40)")
    described.add_argument("--db-volumes", type=int, help="and its number of volumes")
    described.add_argument(
        "--db-residues", type=int, help="its letters (blastdbcmd -info; default: estimated from the bytes)"
    )
    described.add_argument(
        "--second-job",
        action="store_true",
        help="every digest remembered from an earlier job (default: the first job, which digests all)",
    )
    described.add_argument(
        "--stage", action="store_true", help="volumes copied to each node's disk (as search --stage)"
    )
    described.add_argument(
        "--node-ranks",
        type=int,
        default=1,
        help="ranks per node: a node copies a volume once and digests a share of a first job's files (default 1)",
    )
    described.add_argument(
        "--digest-rate", help="bytes per second a first job digests at (default 2.1G: this machine, cold)"
    )
    described.add_argument(
        "--copy-rate", help="bytes per second a stage copy reads at (default 770M: this machine's disk)"
    )
    parser.add_argument("--json", action="store_true", help="the prediction as JSON")
    args = parser.parse_args(argv)
    database = None
    if args.database_profile is not None:
        if args.db_bytes is not None or args.db_volumes is not None:
            raise UsageError("--database-profile or --db-bytes with --db-volumes: one of them")
        database = profile(args.database_profile, args.db_residues)
    elif args.db_bytes is not None or args.db_volumes is not None:
        if args.db_bytes is None or args.db_volumes is None:
            raise UsageError("--db-bytes and --db-volumes go together (the database's size and volumes)")
        size = parse_bytes(args.db_bytes)  # its molecule type: the pilot's program's
        database = DatabaseShape.of("the database", "", size, args.db_volumes, args.db_residues)
    elif args.db_residues is not None:
        raise UsageError("--db-residues describes a database given by --database-profile or --db-bytes")
    rates = StartupRates()
    if args.digest_rate is not None:
        rates = dataclasses.replace(rates, digest_rate=parse_bytes(args.digest_rate, "--digest-rate"))
    if args.copy_rate is not None:
        rates = dataclasses.replace(rates, copy_rate=parse_bytes(args.copy_rate, "--copy-rate"))
    settings = SimulateSettings(
        record=args.record,
        queries=args.queries,
        workers=args.workers,
        partition_size=args.partition_size,
        replica_group_size=args.replica_group_size,
        output_strategy=args.output_strategy,
        fragments=args.fragments,
        database_scale=args.database_scale,
        batch=args.batch,
        seed=args.seed,
        cores=args.cores,
        query_file=args.query_file,
        database=database,
        first_job=not args.second_job,
        stage=args.stage,
        node_ranks=args.node_ranks,
        rates=rates,
        core_speed=args.core_speed,
    )
    return run_simulate(settings, args.json)
