"""Rank 0's job: the checked job, its shell, its output sinks, its run record, the one-BLAST+ plan."""
