"""Job start-up across the emulated cluster's nodes (issue 26; tests/support/cluster.py): how long from
sbatch to the batch script, and from there to every rank past MPI_Init and a first barrier, with the ranks
on one node or spread over three (TCP through the bridge). Root; prints a Markdown table for
bench/RESULTS.md.

    .venv/bin/python -m bench.cluster --rounds 5
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

from tests.support.cluster import Cluster

BIN = Path(sys.executable).parent
# Rank 0 prints the time when every rank is past MPI_Init and a barrier (MPI over TCP between nodes).
RANKS_UP = (
    "from mpi4py import MPI; import time; MPI.COMM_WORLD.Barrier(); "
    "print('up', time.time()) if MPI.COMM_WORLD.rank == 0 else None"
)


def one_job(cluster: Cluster, nodes: int, ranks: int, work: Path) -> tuple[float, float]:
    """(seconds from sbatch to the batch script, seconds from there to every rank up)."""
    script = work / "startup.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --output=startup-%j.log\n"
        "echo batch $(date +%s.%N)\n"
        f'srun --mpi=pmi2 {sys.executable} -c "{RANKS_UP}"\n'
    )
    options = [f"--nodes={nodes}", f"--ntasks={ranks}", "--overcommit", "--exclusive", "--parsable"]
    submitted = time.time()
    job = cluster.slurm("sbatch", *options, str(script), cwd=work).stdout.strip()
    log = work / f"startup-{job}.log"
    deadline = time.monotonic() + 60
    while "up " not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} did not start its ranks in 60 s: {cluster.log_tail()}")
        time.sleep(0.05)
    text = log.read_text()
    batch = float(re.search(r"^batch (\S+)", text, re.M).group(1))  # type: ignore[union-attr]
    up = float(re.search(r"^up (\S+)", text, re.M).group(1))  # type: ignore[union-attr]
    while cluster.slurm("squeue", "-h", "-j", job, check=False).stdout.strip():
        time.sleep(0.1)
    return batch - submitted, up - batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cluster = Cluster(nodes=3, prefix="pmb", subnet="10.226.28", root=Path("/var/tmp/pmb-cluster"))
    started = time.monotonic()
    cluster.up()
    bring_up = time.monotonic() - started
    try:
        rows = []
        for nodes in (1, 3):
            times = [one_job(cluster, nodes, 6, cluster.shared) for _ in range(args.rounds)]
            to_batch = [t[0] for t in times]
            to_ranks = [t[1] for t in times]
            rows.append((nodes, statistics.median(to_batch), statistics.median(to_ranks), max(to_ranks)))
    finally:
        cluster.down()
    print(f"cluster up (3 nodes, slurmctld, munged): {bring_up:.1f} s; {args.rounds} jobs each, medians\n")
    print(
        "| nodes | ranks | sbatch -> batch script (s) | batch script -> 6 ranks past MPI_Init + barrier (s) | max (s) |"
    )
    print("|---|---|---|---|---|")
    for nodes, to_batch, to_ranks, worst in rows:
        print(f"| {nodes} | 6 | {to_batch:.2f} | {to_ranks:.2f} | {worst:.2f} |")
    return 0


if __name__ == "__main__":
    os.environ.pop("SLURM_CONF", None)
    sys.exit(main())
