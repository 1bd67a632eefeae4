"""Writing the report in query order, atomically, to a local file or to a remote storage site.

Pieces arrive in any order (regeneration runs finish when they finish); the OrderedWriter keeps the ones
that are early and passes each to the format's stitcher in order, then hands the bytes to a sink:
`LocalFile` (a temporary file beside the target, then fsync and rename; a device, a FIFO or a
/proc/self/fd link is written through, as BLAST+ writes it) or a remote sink that ships the
bytes to a storage site (`ship.destination`). A failed job aborts the sink, so a user never finds a
partial report under the name they asked for.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

from paramedic.durable import fsync_dir, note_partial, open_stream, stream_target
from paramedic.errors import OutputError
from paramedic.output.stitch import Stitcher


class ByteSink(Protocol):
    def write(self, data: bytes) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


class OrderedWriter:
    def __init__(self, sink: ByteSink, outfmt: str, pieces: tuple[range, ...]):
        self.sink = sink
        self.pieces = pieces
        self.total_queries = pieces[-1].stop
        self.stitcher = Stitcher(outfmt, len(pieces))
        self.waiting: dict[int, bytes] = {}
        self.next = 0
        self.bytes_written = 0

    def add(self, index: int, data: bytes) -> int:
        """Accept piece `index`; return how many queries became written because of it."""
        self.waiting[index] = data
        written = 0
        while self.next in self.waiting:
            piece = self.pieces[self.next]
            chunk = self.stitcher.piece(
                self.next, self.waiting.pop(self.next), piece.start, self.total_queries
            )
            self.sink.write(chunk)
            self.bytes_written += len(chunk)
            written += len(piece)
            self.next += 1
        return written

    @property
    def complete(self) -> bool:
        return self.next == len(self.pieces)

    def commit(self) -> None:
        if not self.complete:
            raise OutputError(f"internal: only {self.next} of {len(self.pieces)} pieces written")
        self.sink.commit()

    def abort(self) -> None:
        self.sink.abort()


class LocalFile:
    """A report file made durable under its final name only when complete (fsync, rename, fsync dir);
    a stream (/dev/null, a FIFO, /dev/stdout: `durable.stream_target`) is written through instead, as
    BLAST+ writes it: a rename would replace the device or the pipe with a regular file."""

    def __init__(self, out: Path | None, partial: Path | None = None):
        """`partial`: where the file is written until it is complete (in the same directory as `out`);
        by default named after the job when paramedic launched it, so the launcher removes it after a
        kill."""
        self.out = out
        self.tmp: Path | None = None
        self.fh: BinaryIO
        if out is None:
            self.fh = sys.stdout.buffer
        elif stream_target(out):
            self.fh = _open_stream(out)
        else:
            job = os.environ.get("PARAMEDIC_JOB_ID") or str(os.getpid())
            self.tmp = partial or out.with_name(f".{out.name}.partial-{job}")
            if partial is None:  # named after the job: noted before it exists, so that a later run
                note_partial(self.tmp)  # removes it should the launcher be killed outright
            try:  # made afresh, never written through a link or a file planted at its name (a name
                # made of a pid can be guessed beside an output in a shared directory)
                self.tmp.unlink(missing_ok=True)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                self.fh = os.fdopen(os.open(self.tmp, flags, 0o666), "wb")
            except OSError as exc:
                raise OutputError(f"cannot write {out}: {exc.strerror}") from exc

    def write(self, data: bytes) -> None:
        self._guarded(self.fh.write, data)

    def _guarded(self, call: Callable[..., object], *args: bytes) -> None:
        """`call` on the file, its failure one line (a broken pipe of standard output stays quiet)."""
        try:
            call(*args)
        except BrokenPipeError:
            if self.out is None:  # the reader of standard output went away (`| head -1`): 141, quietly
                raise
            raise OutputError(f"cannot write {self.out}: broken pipe") from None
        except OSError as exc:
            raise OutputError(f"cannot write {self.out or 'standard output'}: {exc.strerror}") from exc

    def commit(self) -> None:
        if self.tmp is None:  # standard output or a stream: written through, nothing to rename
            self._guarded(self.fh.flush)
            if self.out is not None:
                self.fh.close()
            return
        assert self.out is not None  # a temporary file is made for a named output only
        self.fh.flush()
        try:
            os.fsync(self.fh.fileno())
            self.fh.close()
            os.replace(self.tmp, self.out)
            fsync_dir(self.out.parent)
        except OSError as exc:
            raise OutputError(f"cannot write {self.out}: {exc.strerror}") from exc

    def abort(self) -> None:
        if self.tmp is None and self.out is not None:  # a stream: what was written cannot be taken back
            with contextlib.suppress(OSError):
                self.fh.close()
        if self.tmp is not None:
            try:
                self.fh.close()
            finally:
                self.tmp.unlink(missing_ok=True)


def _open_stream(out: Path) -> BinaryIO:
    try:
        return os.fdopen(open_stream(out), "wb")
    except OSError as exc:
        raise OutputError(f"cannot write {out}: {exc.strerror}") from exc
