"""Small durable writes: a whole file under a temporary name, fsynced, then renamed into place.

The one way paramedic writes a file that must never be seen half-written: the run record, the metadata
file, alias files, cache entries, the journal's records, the inbox's files, the storage site's state.
(Streams that are written piece by piece, a report or the site's output, keep their own temporary file
and rename it the same way when complete: output.writer.LocalFile, site.safefs.)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_durably(path: Path, data: bytes, sync: bool = True) -> None:
    """Readers see the old file or the new one, never half of it; the new one, and its name, survive a
    crash. The temporary name is unique to the call: several processes or threads
    may write the same path at once (the storage site may store a re-sent chunk on two streams).
    `sync=False`: atomic but not durable, for scratch files that do not outlive the job."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
