"""`paramedic search`'s options: its parser, each engine option declared once, and the split of a command
line into the engine's double-dash options and BLAST+'s own."""

from __future__ import annotations

import argparse
from pathlib import Path

from paramedic.cli.parsing import command_parser

SEARCH_USAGE = "paramedic search PROGRAM -query FILE -db NAME [BLAST+ options] [engine options]"


def search_parser() -> argparse.ArgumentParser:
    from paramedic.engine.core.settings import FRAGMENT_GROUP_CHOICES, RUNNER_CHOICES, TRACEBACK_CHOICES
    from paramedic.output.strategies import MASTER, OUTPUT_STRATEGIES, output_strategy_names

    parser = command_parser(
        "search",
        "Search with BLAST+ in parallel over any BLAST+ database, searched where it lies (or one made by "
        "`paramedic format`). BLAST+ options keep their own single-dash spelling and meaning (PROGRAM is "
        "blastn, blastp, blastx, tblastn or tblastx; `paramedic search PROGRAM -help` shows them); the "
        "engine's options below use double dashes.",
        usage=SEARCH_USAGE,
    )
    parser.add_argument(
        "--np",
        type=int,
        help="worker processes when paramedic starts MPI itself (default: all local cores); "
        "ignored under mpiexec/srun, which give the ranks",
    )
    parser.add_argument(
        "--strategy",
        choices=["auto", "fragments", "queries"],
        default="auto",
        help="fragments: search fragments, merge, regenerate; queries: whole database per task; "
        "auto (default): queries when the whole database fits in half the memory per worker and no "
        "metadata is asked, else fragments; on one node, one BLAST+ run with a thread per core instead "
        "when its cost model predicts it faster and nothing asks for the engine (the run record's "
        "strategy_reason says why, with each plan's predicted seconds)",
    )
    parser.add_argument(
        "--traceback",
        choices=list(TRACEBACK_CHOICES),
        default="auto",
        help="fragments strategy: once: fragment searches stop after BLAST+'s preliminary stage and each "
        "query is aligned once, against the whole database's list; per-fragment: every fragment search "
        "aligns its own hits; auto (default): once when the lists are a small share of the database "
        "(large databases) and no metadata is asked",
    )
    parser.add_argument(
        "--fragment-groups",
        choices=list(FRAGMENT_GROUP_CHOICES),
        default="auto",
        help="fragments strategy: auto (default): when the whole database fits in each worker's memory, "
        "consecutive fragments are searched together in one BLAST+ run (as few runs as keep every worker "
        "busy; each run costs a BLAST+ start and a lookup table); off: one BLAST+ run per fragment",
    )
    parser.add_argument(
        "--runner",
        choices=list(RUNNER_CHOICES),
        default="auto",
        help="without an MPI launcher: local: the workers are threads of this process, each running "
        "BLAST+ (no MPI start-up); mpi: start mpiexec with one rank per worker; auto (default): local "
        "unless --partition-size, a worker --output-strategy or --stage needs MPI ranks. Under mpiexec "
        "or srun the ranks given are used",
    )
    parser.add_argument(
        "--partition-size",
        type=int,
        help="ranks per partition: rank 0 hands query segments to partition masters, each with its own "
        "workers (mpiBLAST's hierarchical scheduling, for many ranks; default: one master for all)",
    )
    parser.add_argument(
        "--replica-group-size",
        type=int,
        help="workers that together hold one copy of the database: each prefers its share of the "
        "fragments (default: any worker any fragment, by cache affinity)",
    )
    parser.add_argument(
        "--output-strategy",
        choices=output_strategy_names(),
        default=MASTER,
        help="who writes the report file: "
        + "; ".join(f"{cls.name}: {cls.help}" for cls in OUTPUT_STRATEGIES.values())
        + " (default master; the others write a file on a filesystem every rank sees: not with -out - "
        "or --site)",
    )
    parser.add_argument("--batch", type=int, help="queries per search task (default: sized automatically)")
    parser.add_argument(
        "--regen-batch",
        type=int,
        help="queries per regeneration run (default: half a search batch when the report is written "
        "from the search's alignments, else 10)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        help="run record path (default: <out>.run.json; with --site, "
        "<out>.run.json under the current directory)",
    )
    parser.add_argument("--metadata", type=Path, help="also save the merged subjects per query (JSON)")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="PAGE.html",
        help="also draw the run record as a self-contained HTML page (as `paramedic report`)",
    )
    parser.add_argument(
        "--from-metadata", type=Path, help="do not search: regenerate the output from saved --metadata"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="discard the finished work an interrupted run of this search kept (its journal, "
        ".<out>.journal) and start afresh; by default the same command continues where it stopped",
    )
    parser.add_argument(
        "--no-journal",
        action="store_true",
        help="keep no journal of finished work (saves its disk space; a stopped run then starts afresh)",
    )
    parser.add_argument(
        "--site",
        help="storage site: tls://HOST:PORT or file:///shared/inbox; -out is then a path under the "
        "site's --root and the run record is written here at that same relative path",
    )
    parser.add_argument(
        "--ship",
        metavar="MODE",
        # checked against the codecs' registry when --site is given (ShipSettings.build): a search
        # without --site imports none of the shipping side
        help="what crosses the link to --site: metadata, compressed or direct (the codecs' modes), or "
        "auto (default: measured choice by the ParaMEDIC rule; only with --site)",
    )
    parser.add_argument("--streams", type=int, default=4, help="parallel TLS streams with --site (default 4)")
    parser.add_argument(
        "--ship-timeout", type=float, default=300.0, help="seconds to keep retrying a lost site (default 300)"
    )
    parser.add_argument(
        "--keys",
        type=Path,
        help="this compute site's keys (from paramedic keys): the TLS client certificate for tls://, "
        "and for file:// the key that signs the inbox jobs (needed when the site's inbox uses --keys)",
    )
    parser.add_argument(
        "--stage",
        type=Path,
        help="node-local cache directory: each fragment is copied there from -db (or a --mirror) the first "
        "time a worker on the node needs it, verified, and reused by later runs (fragments strategy)",
    )
    parser.add_argument(
        "--stage-limit",
        help="bound of the --stage cache, e.g. 500M or 200G: least recently used fragments are evicted; "
        "one that does not fit is searched in place (default: unbounded)",
    )
    parser.add_argument(
        "--stage-copies",
        type=int,
        help="fragment copies from shared storage in flight at once, over the job (each partition's with "
        "--partition-size; default 2), as mpiBLAST's --concurrent",
    )
    parser.add_argument(
        "--mirror",
        action="append",
        default=[],
        help="another replica of the -db database to copy fragments from with --stage: a directory or a "
        "storage site URL (repeatable; its manifest must equal -db's). For a makeblastdb database, the "
        "directory holds it under -db's name (or give its -db path): the same volumes, digests equal",
    )
    return parser


def split_engine_options(
    argv: list[str], parser: argparse.ArgumentParser | None = None
) -> tuple[list[str], list[str]]:
    """Double-dash options are the engine's, everything else is BLAST+'s (order kept). Which engine
    options take a value is read from the search parser, where each option is declared once."""
    parser = parser or search_parser()
    takes_value = {name for action in parser._actions if action.nargs != 0 for name in action.option_strings}
    engine: list[str] = []
    blast: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            engine.append(arg)
            if name in takes_value and "=" not in arg and i + 1 < len(argv):
                engine.append(argv[i + 1])
                i += 1
        else:
            blast.append(arg)
        i += 1
    return engine, blast
