"""trace/gaps.py: which untraced MPI functions communicate, whatever their binding, and the bounded read of
the ranks' list."""

from __future__ import annotations

from pathlib import Path

from paramedic.trace import gaps


def test_bindings_reduce_to_one_call() -> None:
    assert {gaps.base_call(n) for n in ("MPI_Put", "mpi_put_", "MPI_Put_c", "mpi_put_f08", "PMPI_Put")} == {
        "put"
    }


def test_communicating_calls_are_told_from_local_ones() -> None:
    names = ["MPI_Neighbor_alltoall", "mpi_ineighbor_allgather_", "MPI_Win_allocate_shared", "MPI_Comm_idup",
             "MPI_Comm_spawn", "MPI_File_iwrite_all", "MPI_Psend_init", "MPI_Allgatherv_init_c", "MPI_Cancel",
             "MPI_Comm_rank", "MPI_Type_commit", "MPI_Wtime", "MPI_Win_create_errhandler", "MPI_Comm_get_name",
             "MPI_Get_count", "MPI_Get_processor_name", "MPI_File_get_size", "MPI_Info_get"]  # fmt: skip
    assert gaps.communicating(names) == names[:9]


def test_the_closing_clause_names_only_communication(tmp_path: Path) -> None:
    assert gaps.line(["MPI_Comm_rank", "MPI_Wtime"]) == ""
    many = [f"MPI_Ineighbor_alltoall{'v' * i}" for i in range(14)]
    assert gaps.line(many).endswith("and 2 more")


def test_the_ranks_list_is_read_bounded_and_checked(tmp_path: Path) -> None:
    assert gaps.read(tmp_path) == []  # none written: every imported MPI function is wrapped
    (tmp_path / "untraced").write_bytes(
        b"MPI_Put\nMPI_Put\n../../etc\n\xff\xfe\nmpi_get_\n" + b"A" * (80 << 10)
    )
    assert gaps.read(tmp_path) == ["MPI_Put", "mpi_get_"]


def test_the_names_ranks_took_with_dlsym_are_read_too(tmp_path: Path) -> None:
    (tmp_path / "untraced").write_text("MPI_Put\n")
    (tmp_path / "untraced-4711").write_text("MPI_Comm_spawn\nMPI_Put\n")
    (tmp_path / "untraced-x").write_text("MPI_Get\n")  # not the audit library's name: not read
    assert gaps.read(tmp_path) == ["MPI_Comm_spawn", "MPI_Put"]


def test_the_closing_line_counts_ranks_in_words() -> None:
    from paramedic.trace.run import summary_line

    one = {"ranks": 1, "mpi": "openmpi", "records": {"0": 1260}, "bytes": 66604, "seconds": 0.4}
    assert summary_line(one).startswith("1 rank (openmpi), 1,260 records, 66,604 bytes")  # was "1 ranks"
    two = {**one, "ranks": 2, "records": {"0": 630, "1": 630}}
    assert summary_line(two).startswith("2 ranks (openmpi), 1,260 records")
