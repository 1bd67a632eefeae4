"""Removing an inbox job's directory without anyone seeing it half-removed.

A job directory's name is its job id, and `paramedic ship`'s ids are deterministic: the same command run
again at once makes a directory of the same name. Whoever removes a job directory (the compute site once it
has the answer, the storage site for an idle or cancelled job) first renames it out of the job-name pattern
(`.<job>.gone-<random>`, which the watcher never reads as a job) and only then deletes it; the rename is
atomic, so under the job's name there is the whole old directory, nothing, or a new one. A remover killed
between the two steps leaves a `.gone` directory, which the storage site deletes once it has been idle for
a while (a remover that is not dead is deleting it itself).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

GONE = re.compile(r"^\.[0-9a-f]{32}\.gone-[0-9a-f]{32}$")


def remove_job_directory(directory: Path) -> None:
    """Rename `directory` out of the job-name pattern, then delete it (never follows a symbolic link)."""
    if GONE.match(directory.name):  # already out of the pattern
        shutil.rmtree(directory, ignore_errors=True)
        return
    gone = directory.with_name(f".{directory.name}.gone-{uuid.uuid4().hex}")
    try:
        os.rename(directory, gone)
    except FileNotFoundError:
        return
    except OSError:  # not renameable (say, the inbox became read-only): delete it in place
        gone = directory
    shutil.rmtree(gone, ignore_errors=True)
