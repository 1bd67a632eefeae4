"""Small durable writes: a whole file under a temporary name, fsynced, then renamed into place.

The one way paramedic writes a file that must never be seen half-written: the run record, the metadata
file, alias files, cache entries, the journal's records, the inbox's files, the storage site's state.
(Streams that are written piece by piece, a report or the site's output, keep their own temporary file
and rename it the same way when complete: output.writer.LocalFile, site.safefs.)

A user's output path that names a stream (a character device such as /dev/null or a terminal, a FIFO,
/dev/stdout or another /proc/self/fd link, or a symlink to one) is written through, as BLAST+ writes it:
a temporary file renamed over it would replace the device or the pipe with a regular file
(`stream_target`, `write_output`).
"""

from __future__ import annotations

import os
import re
import stat
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


JOB_DIR_PREFIX = "paramedic-job-"  # a launcher's job directory (paramedic.engine.runtime.leftovers)
PARTIALS_NOTE = "partials"  # in it: the partial outputs named after the job, one absolute path a line


def note_partial(path: Path) -> None:
    """`path`, a partial output named after the job (`.<out>.partial-<job id>`), noted in the job
    directory of the paramedic that launched this process (TMPDIR is that directory's `tmp`): should
    the launcher be killed outright (SIGKILL), the next run removes the file with the directory
    (paramedic.engine.runtime.leftovers). Nothing is noted under the user's own mpiexec (no job directory)."""
    tmp = os.environ.get("TMPDIR")
    if not tmp or not os.environ.get("PARAMEDIC_JOB_ID"):
        return
    job_dir = Path(tmp).parent
    line = str(path.absolute())
    if Path(tmp).name != "tmp" or not job_dir.name.startswith(JOB_DIR_PREFIX) or "\n" in line:
        return
    try:
        with open(job_dir / PARTIALS_NOTE, "a") as fh:
            fh.write(line + "\n")
    except OSError:
        pass


# A directory of a process's open files: a link in it names whatever the descriptor is (a pipe, a file)
_FD_DIRECTORY = re.compile(r"/proc/(self|thread-self|\d+)(/task/\d+)?/fd")


def stream_target(path: Path) -> bool:
    """`path` is written through, never replaced: an existing character device or FIFO, or a name that
    reaches a descriptor through /proc/*/fd (/dev/stdout, /dev/fd/3), whatever that descriptor is. What
    BLAST+ writes through (it opens -out for writing) and a rename over it would replace."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or through_descriptor(path)


def through_descriptor(path: Path, depth: int = 40) -> bool:
    """Some link on the way to `path` is a /proc/*/fd entry (its target is a descriptor, not a name)."""
    current = os.path.abspath(path)
    for _ in range(depth):
        if _FD_DIRECTORY.fullmatch(os.path.realpath(os.path.dirname(current))):
            return True
        if not os.path.islink(current):
            return False
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return False


def refused_target(path: Path) -> str | None:
    """Why `path` cannot be an output (a block device, a socket), or None: such a target is neither a
    file to replace nor a stream BLAST+ users write to."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISBLK(mode):
        return "is a block device (give a file, a FIFO or a character device such as /dev/null)"
    if stat.S_ISSOCK(mode):
        return "is a socket (give a file, a FIFO or a character device such as /dev/null)"
    return None


def open_stream(path: Path) -> int:
    """A descriptor writing through the stream `path` (see `stream_target`): opened as BLAST+ opens -out
    (write, truncate; a FIFO waits for its reader), never created or renamed."""
    return os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)


def write_output(path: Path, data: bytes, shared: bool = True) -> None:
    """A whole output file the user named (a run record, a metadata file, a report page): written
    through when `path` is a stream (`stream_target`), else `write_durably`."""
    if not stream_target(path):
        write_durably(path, data, shared=shared)
        return
    with os.fdopen(open_stream(path), "wb") as fh:
        fh.write(data)
