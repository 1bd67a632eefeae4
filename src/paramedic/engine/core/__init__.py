"""Pure decisions of a search: plan, scheduler, merge, master, strategy, costs. No MPI, no processes, no file writes."""
