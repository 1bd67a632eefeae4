"""What one rank reads and writes: the journal, the search store, metadata, --stage, MPI-IO."""
