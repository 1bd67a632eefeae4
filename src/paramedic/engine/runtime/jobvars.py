"""The variables the launcher sets for its ranks: that they were launched by it, and where the job's files are."""

from __future__ import annotations

LAUNCHED_VARIABLE = "PARAMEDIC_LAUNCHED"
# Where a failing rank leaves its one-line message for the launching process: mpiexec may tear the job
# down before it forwards the rank's stderr, and the user must still see why the job failed.
ERROR_FILE_VARIABLE = "PARAMEDIC_ERROR_FILE"
# Where rank 0 writes "<queries written> <queries>" for the launcher's progress bar.
PROGRESS_FILE_VARIABLE = "PARAMEDIC_PROGRESS_FILE"
# Names this job's hidden partial output (output.writer.LocalFile), so the launcher can remove it.
JOB_ID_VARIABLE = "PARAMEDIC_JOB_ID"
# Where each rank notes its process id, so the launcher can wait for (or end) stragglers.
RANKS_DIR_VARIABLE = "PARAMEDIC_RANKS_DIR"
