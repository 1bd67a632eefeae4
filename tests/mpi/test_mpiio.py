"""engine/rank/mpiio.py under real ranks: the report file written with MPI-IO by the ranks that hold its
pieces, each way the output strategies order it (a rank writes its own piece, sends it to a writer that
merges, or writes in a collective round), checked byte for byte by rank 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from mpi4py import MPI

from paramedic.engine.rank.mpiio import Holder, OutputFile
from paramedic.errors import OutputError
from paramedic.output.strategies import Merge, Round, Send, Write


def piece(number: int) -> bytes:
    """Piece `number`'s bytes: a different length and content for each."""
    return f"<piece {number}>".encode() * (number + 3)


def layout(count: int) -> tuple[list[int], bytes]:
    """The offsets of pieces 0..count-1 laid end to end, and the whole file."""
    offsets, at = [], 0
    for n in range(count):
        offsets.append(at)
        at += len(piece(n))
    return offsets, b"".join(piece(n) for n in range(count))


def finish(comm: MPI.Intracomm, file: OutputFile, holder: Holder) -> bytes | None:
    holder.drain()
    file.close()
    comm.Barrier()
    return file.path.read_bytes() if comm.Get_rank() == 0 else None


def test_each_rank_writes_the_pieces_it_holds_at_their_offsets(comm, shared_dir: Path) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    offsets, whole = layout(2 * size)
    file = OutputFile(comm, shared_dir / "out.tmp")
    holder = Holder(file, comm)
    mine = [n for n in range(2 * size) if n % size == rank]
    for n in mine:
        holder.keep(n, piece(n))
    holder.run([Write(n, offsets[n]) for n in reversed(mine)])  # any order: explicit offsets
    got = finish(comm, file, holder)
    assert holder.written_pieces == len(mine) and holder.written_bytes == sum(len(piece(n)) for n in mine)
    if rank == 0:
        assert got == whole


def test_worker_merge_sends_every_piece_to_one_writer(comm, shared_dir: Path) -> None:
    """Each rank holds one piece; the last rank merges them all (its own included) into one write."""
    rank, size = comm.Get_rank(), comm.Get_size()
    _, whole = layout(size)
    writer = size - 1
    file = OutputFile(comm, shared_dir / "out.tmp")
    holder = Holder(file, comm)
    holder.keep(rank, piece(rank))
    if rank == writer:
        holder.run([Merge(0, tuple((n, n, len(piece(n))) for n in range(size)))])
    else:
        holder.run([Send(rank, writer)])
    holder.progress()
    got = finish(comm, file, holder)
    assert holder.writes == (1 if rank == writer else 0)
    if rank == 0:
        assert got == whole


def test_collective_rounds_with_a_rank_that_has_nothing(comm, shared_dir: Path) -> None:
    """Two rounds of Write_all through file views; rank 0 holds nothing and still takes part."""
    rank, size = comm.Get_rank(), comm.Get_size()
    workers = size - 1
    offsets, whole = layout(2 * workers)
    file = OutputFile(comm, shared_dir / "out.tmp")
    holder = Holder(file, comm)
    for number in range(2):
        n = number * workers + rank - 1
        if rank == 0:
            holder.round(Round(number, ()))
        else:
            holder.keep(n, piece(n))
            holder.round(Round(number, (Write(n, offsets[n]),)))
    got = finish(comm, file, holder)
    if rank == 0:
        assert got == whole and holder.written_pieces == 0


def test_a_longer_stale_file_of_the_same_name_leaves_no_tail(comm, shared_dir: Path) -> None:
    path = shared_dir / "out.tmp"
    if comm.Get_rank() == 0:
        path.write_bytes(b"x" * 100_000)  # a killed run's file
    comm.Barrier()
    file = OutputFile(comm, path)
    holder = Holder(file, comm)
    if comm.Get_rank() == 0:
        holder.keep(0, b"short")
        holder.run([Write(0, 0)])
    assert finish(comm, file, holder) in (None, b"short")


def test_a_file_that_cannot_be_opened_is_an_output_error_on_every_rank(comm, shared_dir: Path) -> None:
    with pytest.raises(OutputError, match="cannot write"):
        OutputFile(comm, shared_dir / "no-such-directory" / "out.tmp")


def test_a_piece_never_written_is_an_internal_error(comm, shared_dir: Path) -> None:
    file = OutputFile(comm, shared_dir / "out.tmp")
    holder = Holder(file, comm)
    holder.keep(7, b"forgotten")
    with pytest.raises(OutputError, match=r"pieces \[7\] were never written"):
        holder.drain()
    file.close()
