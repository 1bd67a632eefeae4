"""The user's cache directory for things paramedic derives once and reuses (compiled shim, BLAST+ -help)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def cache_dir(kind: str) -> Path:
    """~/.cache/paramedic/<kind> (or under $XDG_CACHE_HOME); not created here."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "paramedic" / kind


def file_key(path: str) -> str:
    """A key that changes when the file is replaced (an upgraded BLAST+): its path, size and mtime."""
    stat = os.stat(path)
    identity = f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def read_cached(kind: str, name: str) -> bytes | None:
    try:
        return (cache_dir(kind) / name).read_bytes()
    except OSError:
        return None


def write_cached(kind: str, name: str, data: bytes) -> None:
    """Whole or not at all: a temporary name unique to this process (several jobs may write the same
    entry at once; `durable.write_durably` names it per thread only), then a rename. A cache that cannot
    be written is skipped."""
    directory = cache_dir(kind)
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, directory / name)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
