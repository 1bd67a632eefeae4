"""The search engine, in subpackages by kind: core (pure decisions), predict (virtual time), rank (what
one rank reads and writes), job (rank 0's job), runtime (launching and running ranks and processes)."""
