"""The report file written by the ranks themselves (paramedic.output.strategies): MPI-IO on the temporary
file beside the output, and what a rank does with the pieces it holds.

The file is opened by every rank of the job at once (`MPI.File.Open` is collective) and truncated; a
rank writes its ranges with `Write_at` at explicit offsets (the default byte view: `Set_view` is
collective, so a rank writing on its own cannot change its view), or in a collective round with a file
view over its ranges (an hindexed type of bytes) and `Write_all`. At the end every rank calls `Sync` and
`Close` (both collective); rank 0 then checks the acknowledgements and renames the file into place
(paramedic.engine.job.sinks.WorkerSink). A rank that fails ends the job (comm.Abort): rank 0, or the launcher
after a kill, removes the temporary file; a rank whose write fails removes it itself first (under the
user's own mpiexec no launcher is there, and the abort kills rank 0 before it could).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mpi4py import MPI

from paramedic.errors import OutputError
from paramedic.output.strategies import Merge, Order, Round, Send, Write

TAG_DATA = 1  # worker-merge: a piece's bytes, on the job's duplicated communicator


class OutputFile:
    """The temporary report file, opened with MPI-IO by every rank of `comm`."""

    def __init__(self, comm: MPI.Intracomm, path: Path):
        self.path = path
        self.seconds = 0.0  # spent in MPI-IO by this rank
        start = time.perf_counter()
        try:
            self.fh = MPI.File.Open(comm, str(path), MPI.MODE_WRONLY | MPI.MODE_CREATE)
            self.fh.Set_size(0)  # a stale file of the same name (a killed run) must not leave a tail
        except MPI.Exception as exc:
            raise OutputError(f"cannot write {path}: {mpi_reason(exc)}") from exc
        self.seconds += time.perf_counter() - start

    def write_at(self, offset: int, data: bytes | bytearray) -> None:
        start = time.perf_counter()
        try:
            self.fh.Write_at(offset, data)
        except MPI.Exception as exc:
            raise self._failed(exc) from exc
        self.seconds += time.perf_counter() - start

    def write_all(self, ranges: list[tuple[int, bytes]]) -> None:
        """A collective round: this rank's ranges (offset, bytes), through a file view over them."""
        start = time.perf_counter()
        ranges = sorted((offset, data) for offset, data in ranges if data)
        filetype = None
        try:
            if ranges:
                filetype = MPI.BYTE.Create_hindexed([len(d) for _, d in ranges], [o for o, _ in ranges])
                filetype.Commit()
                self.fh.Set_view(0, MPI.BYTE, filetype)
            else:
                self.fh.Set_view(0, MPI.BYTE, MPI.BYTE)
            self.fh.Write_all(b"".join(d for _, d in ranges))
            self.fh.Set_view(0, MPI.BYTE, MPI.BYTE)
        except MPI.Exception as exc:
            raise self._failed(exc) from exc
        finally:
            if filetype is not None:
                filetype.Free()
        self.seconds += time.perf_counter() - start

    def _failed(self, exc: MPI.Exception) -> OutputError:
        """A write failed: the file goes now (a partial file must not outlive the job, nor hold the
        space that ran out); the error ends the job."""
        reason = mpi_reason(exc)
        try:
            if "(" not in reason and os.statvfs(self.path.parent).f_bavail == 0:
                reason += " (No space left on device)"  # a collective write's stack drops the errno
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        return OutputError(f"cannot write {self.path}: {reason}")

    def close(self) -> None:
        """Durable on every rank (`Sync`), then closed: both collective."""
        start = time.perf_counter()
        try:
            self.fh.Sync()
            self.fh.Close()
        except MPI.Exception as exc:
            raise self._failed(exc) from exc
        self.seconds += time.perf_counter() - start


def mpi_reason(exc: MPI.Exception) -> str:
    """MPI's error string as one line: its class ("Other I/O error") and the innermost cause from the
    last line of the error stack ("No space left on device"), without the stack's call sites."""
    text = exc.Get_error_string()
    head = text.split(", error stack:", 1)[0].strip()
    lines = text.strip().splitlines()
    detail = lines[-1].split(": ", 1)[-1].strip() if len(lines) > 1 else ""
    if detail.startswith(head):
        detail = detail[len(head) :].strip()
    return f"{head} ({detail})" if detail else head


class Holder:
    """A rank's stitched pieces until they are written, and the orders it carries out."""

    def __init__(self, file: OutputFile, data_comm: MPI.Comm):
        self.file = file
        self.data_comm = data_comm
        self.pieces: dict[int, bytes] = {}
        self.sending: list[tuple[MPI.Request, bytes]] = []
        # worker-merge, as the writer: offset, the parts (bytes, or the buffer a receive fills), requests
        self.merging: list[tuple[int, list[bytes | bytearray], list[MPI.Request]]] = []
        self.written_pieces = 0
        self.written_bytes = 0
        self.writes = 0

    def keep(self, piece: int, data: bytes) -> None:
        self.pieces[piece] = data

    def run(self, orders: list[Order]) -> None:
        for order in orders:
            if isinstance(order, Write):
                data = self.pieces.pop(order.piece)
                self.file.write_at(order.offset, data)
                self._wrote(1, len(data))
            elif isinstance(order, Send):
                data = self.pieces.pop(order.piece)
                self.sending.append((self.data_comm.Isend(data, dest=order.to, tag=TAG_DATA), data))
            elif isinstance(order, Merge):
                parts: list[bytes | bytearray] = []
                requests = []
                rank = self.data_comm.Get_rank()
                for piece, holder, size in order.parts:
                    if holder == rank:
                        parts.append(self.pieces.pop(piece))
                    else:
                        buffer = bytearray(size)
                        requests.append(self.data_comm.Irecv(buffer, source=holder, tag=TAG_DATA))
                        parts.append(buffer)
                self.merging.append((order.offset, parts, requests))
            else:
                raise TypeError(f"internal: unknown write order {order!r}")
        self.progress()

    def progress(self) -> None:
        """Without blocking: free finished sends, write the segments whose parts have all arrived."""
        self.sending = [(r, d) for r, d in self.sending if not r.Test()]
        waiting = []
        for offset, parts, requests in self.merging:
            if MPI.Request.Testall(requests):
                self._merge(offset, parts)
            else:
                waiting.append((offset, parts, requests))
        self.merging = waiting

    def round(self, share: Round) -> None:
        ranges = [(w.offset, self.pieces.pop(w.piece)) for w in share.writes]
        self.file.write_all(ranges)
        self._wrote(len(ranges), sum(len(d) for _, d in ranges))

    def drain(self) -> None:
        """At the end: every send and every segment finished (all orders are out by then)."""
        MPI.Request.Waitall([r for r, _ in self.sending])
        self.sending = []
        for offset, parts, requests in self.merging:
            MPI.Request.Waitall(requests)
            self._merge(offset, parts)
        self.merging = []
        if self.pieces:
            raise OutputError(f"internal: pieces {sorted(self.pieces)} were never written")

    def _merge(self, offset: int, parts: list[bytes | bytearray]) -> None:
        data = b"".join(parts)
        self.file.write_at(offset, data)
        self._wrote(len(parts), len(data))

    def _wrote(self, pieces: int, nbytes: int) -> None:
        self.written_pieces += pieces
        self.written_bytes += nbytes
        self.writes += 1 if pieces else 0
