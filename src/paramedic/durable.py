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


def write_durably(path: Path, data: bytes, sync: bool = True, shared: bool = False) -> None:
    """Readers see the old file or the new one, never half of it; the new one, and its name, survive a
    crash. The temporary name is unique to the call: several processes or threads
    may write the same path at once (the storage site may store a re-sent chunk on two streams).
    `sync=False`: atomic but not durable, for scratch files that do not outlive the job. `shared`: the
    mode a new file of the user's gets (0666 less the umask, e.g. 0644), not the temporary file's 0600."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if shared:
            os.fchmod(fd, 0o666 & ~umask())
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


def umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, racing other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
