"""Small durable writes: a whole file under a temporary name, fsynced, then renamed into place."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_durably(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of it; the new one survives a crash.

    The temporary name is per thread: the storage site may store a re-sent chunk on two streams at once.
    """
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
