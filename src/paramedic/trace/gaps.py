"""The MPI calls a traced program links but the tracer does not record (native/clogtrace_gaps.h lists them).

A call the tracer does not wrap reaches the MPI library unlogged: its state is absent from the trace. Rather
than leave that unsaid, rank 0 lists the MPI functions the program's objects import that the tracer does
not define, and `paramedic trace` puts them in its summary (and the run record) and names those that
communicate (a send, a collective, one-sided, MPI-IO, a communicator's creation) on its closing line.
Local calls (MPI_Comm_rank, MPI_Type_commit, MPI_Wtime, ...) are listed but not called out: MPE2 logs some
of them as states, but they move no data.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_BYTES = 64 << 10  # the file is the ranks' (untrusted only as far as a program can scribble): bounded
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
COMMUNICATING = re.compile(
    r"(i?(barrier|bcast|reduce|allreduce|reduce_scatter(_block)?|scan|exscan|(all)?gatherv?|scatterv?"
    r"|alltoall[vw]?)|i?neighbor_\w+|i?[bsr]?send|issend|i?recv|sendrecv(_replace)?|i?m?probe|i?mrecv"
    r"|p(send|recv)_init|pready\w*|parrived|start(all)?|\w+_init|wait\w*|test(all|any|some)?|cancel"
    r"|r?put|r?get|r?accumulate|r?get_accumulate|fetch_and_op|compare_and_swap"
    r"|win_(create(_dynamic)?|allocate(_shared)?|free|fence|lock\w*|unlock\w*|flush\w*|start|complete|post|wait|test|sync"
    r"|attach|detach)"
    r"|file_(open|close|delete|i?read\w*|i?write\w*|set_view|seek\w*|sync|set_size|preallocate)"
    r"|comm_(split(_type)?|i?dup(_with_info)?|create(_group|_from_group)?|spawn(_multiple)?|accept|connect)|intercomm_\w+|cart_(create|sub)"
    r"|graph_create|dist_graph_create\w*)"
)


MAX_FILES = 4096  # untraced-<pid>: one a process that took an unwrapped MPI function with dlsym


def read(logs: Path) -> list[str]:
    """The untraced MPI functions rank 0 listed in `logs/untraced`, and those the ranks took with dlsym
    (`logs/untraced-<pid>`, from the audit library): sorted, each once; [] when none."""
    names: set[str] = set()
    try:
        files = sorted(p for p in logs.iterdir() if re.fullmatch(r"untraced(-\d{1,10})?", p.name))[:MAX_FILES]
    except OSError:
        return []
    for path in files:
        try:
            with path.open("rb") as fh:
                text = fh.read(MAX_BYTES).decode("ascii", "replace")
        except OSError:
            continue
        names.update(line for line in text.splitlines() if NAME.fullmatch(line))
    return sorted(names)


def base_call(name: str) -> str:
    """MPI_Put, mpi_put_, MPI_Put_c, mpi_put_f08_, mpi_put_f08ts_ -> 'put': the call whatever its binding."""
    call = name.lower().removeprefix("pmpi_").removeprefix("mpi_").rstrip("_")
    for suffix in ("_f08ts", "_f08", "_c"):
        call = call.removesuffix(suffix)
    return call


def communicating(names: list[str]) -> list[str]:
    """Those of `names` that move data or synchronise ranks (their absence changes what a trace shows)."""
    return [n for n in names if COMMUNICATING.fullmatch(base_call(n))]


def line(names: list[str], limit: int = 12) -> str:
    """The closing line's clause about them, or '' when the program links no untraced communication."""
    calls = communicating(names)
    if not calls:
        return ""
    shown = ", ".join(calls[:limit]) + (f" and {len(calls) - limit} more" if len(calls) > limit else "")
    why = "the program links them; absent from the trace if called"
    if any("_f08" in name for name in calls):  # Open MPI's mpi_f08 functions call PMPI_* directly
        why = "Fortran 2008 bindings (use mpi_f08) of this MPI are not wrapped; " + why
    return f"; not traced ({why}): {shown}"
