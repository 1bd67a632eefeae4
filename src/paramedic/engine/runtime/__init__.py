"""How the job runs: the launcher, threads or MPI ranks, partitions, a worker's BLAST+ runs, signals, leftovers."""
