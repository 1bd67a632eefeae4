"""`paramedic trace`: run an unmodified MPI program under the tracer and write one merged CLOG2 file.

The launcher's own options carry the library to every rank (Open MPI: `-x NAME=value`, MPICH's Hydra:
`-genv NAME value`), so mpiexec itself runs untraced. The ranks' logs go to a private directory next to
the output, where the ranks merge them along a binary tree inside MPI_Finalize and rank 0 writes the file
(native/clogtrace_merge.h); here it is checked, synced and renamed into place: the output appears whole or
not at all. An -out that is a device, a FIFO or /dev/stdout is written through, as BLAST+ writes its -out
(the logs then go to the temporary directory, not beside /dev/null).

The trace's size is bounded (`max_bytes`, --max-trace-size; by default DEFAULT_SHARE of the free space
where the logs go, at least DEFAULT_FLOOR): each rank logs at most its share and then stops recording,
and the summary says what each left out (native/clogtrace.c).

A signal (SIGTERM, SIGHUP, SIGINT) stops the traced job: mpiexec runs in a session of its own, and the
launcher ends it and every rank, removes their logs and what MPI made, and raises `job.Interrupted`
(paramedic.trace.job, which also says what a launcher killed outright leaves for the next one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from paramedic.durable import fsync_dir, open_stream, stream_target, umask
from paramedic.errors import JobError, OutputError, UsageError
from paramedic.orphans import dies_with_this_process
from paramedic.trace import gaps, merge, native
from paramedic.trace.job import Interrupted, TracedJob

POLL_SECONDS = 0.2  # how often the launcher looks at the job (a signal, the ranks' shared memory)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOPPED = "the traced program was stopped and its logs removed"


def inject(command: list[str], kind: str, env: dict[str, str]) -> list[str]:
    """The command with `env` passed to the ranks through the launcher's options."""
    opts: list[str] = []
    for name, value in env.items():
        opts += ["-x", f"{name}={value}"] if kind == "openmpi" else ["-genv", name, value]
    return [command[0], *opts, *command[1:]]


DEFAULT_SHARE = 0.4  # of the free space: twice it fits where the logs cannot be freed as they are merged
DEFAULT_FLOOR = 64 << 20  # a smaller disk is its own limit: a full disk is said as such (exit 7)
MIN_BYTES = 128 << 10  # the least bound: the preamble, one block, the definitions


def default_bound(logs: Path) -> int:
    """The trace's bound when none is given: DEFAULT_SHARE of the free space of the logs' filesystem, at
    least DEFAULT_FLOOR. The merge frees each log as it reads it (holes punched) where the filesystem can:
    the logs and the merged file then hold one trace between them; where it cannot, both are whole on disk
    as the merge ends."""
    try:
        info = os.statvfs(logs)
    except OSError:
        return DEFAULT_FLOOR
    return max(DEFAULT_FLOOR, int(info.f_bavail * info.f_frsize * DEFAULT_SHARE))


def trace(
    command: list[str], out: Path, buffer_bytes: int = 8 << 20, max_bytes: int | None = None
) -> dict[str, object]:
    """Run `command` (mpiexec ... PROGRAM ARGS) traced; write the merged CLOG2 file to `out`, of at most
    `max_bytes` (default: `default_bound`); a summary."""
    if max_bytes is not None and max_bytes < MIN_BYTES:
        raise UsageError(f"--max-trace-size must be at least {MIN_BYTES:,} bytes (128K)")
    if not command:
        raise UsageError("paramedic trace: no command after --")
    lib, kind = native.library(command[0])
    stream = stream_target(out)
    with _signals_noted() as signals:  # from here on a signal stops the job, never a step half-way
        logs = _logs_directory(out, stream)
        try:
            job = TracedJob.create(logs)
            bound = max_bytes if max_bytes is not None else default_bound(logs)
        except OSError as exc:
            shutil.rmtree(logs, ignore_errors=True)
            raise OutputError(f"cannot note the job in {tempfile.gettempdir()}: {exc.strerror}") from exc
        try:
            env = {
                "LD_PRELOAD": str(lib),
                "LD_AUDIT": str(native.audit_library()),
                "PARAMEDIC_TRACE_DIR": str(logs),
                "PARAMEDIC_TRACE_BUFFER": str(buffer_bytes),
                "PARAMEDIC_TRACE_MAX": str(bound),
                **job.environment(),
            }
            started = time.monotonic()
            returncode = _supervise(inject(command, kind, env), job, signals)
            elapsed = time.monotonic() - started
            summary, untraced = _merged(logs, returncode)
            if signals:
                raise Interrupted(STOPPED)
            try:
                merged = logs / "merged.clog2"
                size = _write_through(merged, out) if stream else _rename_into_place(merged, out)
            except OSError as exc:
                raise OutputError(f"-out {out}: {exc.strerror}") from exc
        finally:
            shutil.rmtree(logs, ignore_errors=True)
            job.remove()
        if signals:
            raise Interrupted(f"the trace was written to {out} as the signal came")
    summary.update({"mpi": kind, "library": str(lib), "seconds": round(elapsed, 3), "bytes": size})
    summary["max_trace_bytes"] = bound
    summary["bound"] = "given" if max_bytes is not None else "default"
    summary["buffer_bytes"] = buffer_bytes
    summary["untraced_calls"] = untraced  # linked MPI functions the tracer does not wrap (gaps.py)
    summary["untraced_communication"] = gaps.communicating(untraced)
    return summary


def _logs_directory(out: Path, stream: bool) -> Path:
    """A private directory for the ranks' logs beside `out` (in the temporary directory for a stream),
    absolute: the ranks may run elsewhere (mpiexec -wdir)."""
    try:
        if not stream:
            out.parent.mkdir(parents=True, exist_ok=True)
        logs = Path(tempfile.mkdtemp(prefix=f".{out.name}.ranks-", dir=None if stream else out.parent))
    except OSError as exc:
        raise OutputError(f"-out {out}: cannot write beside it ({exc.strerror})") from exc
    return logs.absolute()


def _merged(logs: Path, returncode: int) -> tuple[dict[str, object], list[str]]:
    """The merge's summary and the untraced calls, once the traced program ended with `returncode`; the
    reason, raised, when it wrote no trace."""
    refused = _refusal(logs)
    if refused:
        raise UsageError(refused)
    try:
        if returncode != 0:
            raise JobError(f"the traced program exited with status {returncode}; no trace written")
        if not any(
            p.name == "merged.summary" or re.fullmatch(r"rank-(\d+)\.raw", p.name) for p in logs.iterdir()
        ):
            raise JobError("the traced program logged nothing: did it call MPI_Init?")
        return merge.read_summary(logs / "merged.summary"), gaps.read(logs)
    except (JobError, merge.MergeError) as exc:
        full = _no_space(logs)
        if full:  # the logs or the merged file met a full disk: not the program's fault, nor the input's
            raise JobError(full) from exc
        raise


FULL_BYTES = 1 << 20  # free space under which a failed merge is put down to a full disk


def _no_space(logs: Path) -> str:
    """Why the trace failed when the filesystem of the ranks' logs is full ('' when it is not): the ranks'
    writes and rank 0's merged file fail there, and the merge then looked like a rank that never reached
    MPI_Finalize (exit 3, issue 41 item 10); said as a search says it, exit 7."""
    try:
        info = os.statvfs(logs)
    except OSError:
        return ""
    free = info.f_bavail * info.f_frsize
    if free >= FULL_BYTES:
        return ""
    return f"no space left on device for the ranks' logs in {logs.parent} ({free:,} bytes free): no trace written"


def _supervise(command: list[str], job: TracedJob, signals: list[int]) -> int:
    """Run mpiexec in a session of its own, killed with this process, until it ends; its exit status. A
    signal meanwhile (noted in `signals`) ends the job (`TracedJob.stop`) and raises Interrupted; so does
    any other failure here: the job never outlives its launcher's `trace`."""
    job.before_start()
    proc = subprocess.Popen(
        command,
        env=dict(os.environ, **job.environment()),
        start_new_session=True,  # a terminal's Ctrl-C reaches the launcher alone: it stops the job
        preexec_fn=dies_with_this_process(),
    )
    try:
        job.started_as(proc.pid)
        while not signals:
            try:
                return proc.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                job.note_memory(proc.pid)
    except BaseException:
        _end(job, proc)
        raise
    _end(job, proc)
    raise Interrupted(STOPPED)


def _end(job: TracedJob, proc: subprocess.Popen[bytes]) -> None:
    """The job's processes killed and mpiexec reaped (its files are removed once it is gone)."""
    job.stop(proc.pid)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


@contextmanager
def _signals_noted() -> Iterator[list[int]]:
    """SIGINT, SIGTERM and SIGHUP noted (in the list given) instead of raised while the job runs: the
    launcher's loop ends the job itself, never half-way through starting or reaping it."""
    noted: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        noted.append(signum)

    previous = {s: signal.signal(s, note) for s in STOP_SIGNALS}
    try:
        yield noted
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _rename_into_place(merged: Path, out: Path) -> int:
    """The merged file made the user's, synced and renamed to `out`; its size."""
    with merged.open("rb") as fh:
        os.fchmod(fh.fileno(), 0o666 & ~umask())  # a file of the user's (the ranks' logs are 0600)
        os.fsync(fh.fileno())
        size = os.fstat(fh.fileno()).st_size
    os.replace(merged, out)
    fsync_dir(out.parent)
    return size


def _write_through(merged: Path, out: Path) -> int:
    """The merged file copied into the stream `out` (a rename would replace the device or the pipe)."""
    with merged.open("rb") as source, os.fdopen(open_stream(out), "wb") as sink:
        shutil.copyfileobj(source, sink, 1 << 20)
        return source.tell()


def _refusal(logs: Path) -> str:
    """The tracer's reason for refusing the program (its ranks write it in `refused`), or ''."""
    try:
        with (logs / "refused").open("rb") as fh:
            text = fh.read(1000).decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"the tracer refused the program (its reason cannot be read: {exc.strerror})"
    return " ".join(text.split()) or "the tracer refused the program"


def summary_line(summary: dict[str, object]) -> str:
    """What a person reads after a trace: ranks, records, bytes, the MPI, the clocks' spread."""
    records = summary.get("records")
    offsets = summary.get("clock_offset_ns")
    dropped = summary.get("dropped_message_events")
    total = sum(int(v) for v in records.values()) if isinstance(records, dict) else 0
    spread = (
        max((abs(int(x)) for pair in offsets.values() for x in pair), default=0)
        if isinstance(offsets, dict)
        else 0
    )
    text = (
        f"{summary.get('ranks')} {'rank' if summary.get('ranks') == 1 else 'ranks'} ({summary.get('mpi')}), "
        f"{total:,} records, "
        f"{int(summary.get('bytes', 0)):,} bytes (CLOG2), "  # type: ignore[call-overload]
        + (
            f"clock offsets up to {spread:,} ns corrected, "
            if spread
            else "one clock (every rank on one kernel), "
        )
        + f"the program ran {float(summary.get('seconds', 0.0)):.1f} s traced"  # type: ignore[arg-type]
        f" (merged along a binary tree of the ranks in {float(summary.get('merge_seconds', 0.0)):.2f} s)"  # type: ignore[arg-type]
    )
    if isinstance(dropped, dict) and any(dropped.values()):
        text += f"; message events dropped: {json.dumps(dropped, sort_keys=True)}"
    text += _bytes_line(summary) + _left_out_line(summary)
    untraced = summary.get("untraced_calls")
    if isinstance(untraced, list):
        text += gaps.line([str(name) for name in untraced])
    return text


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 100_000 else f"{n:,} bytes"


def _bytes_line(summary: dict[str, object]) -> str:
    """Each rank's bytes in the file (its records), the first eight ranks and the largest."""
    per = summary.get("rank_bytes")
    if not isinstance(per, dict) or not per:
        return ""
    items = sorted(((int(r), int(b)) for r, b in per.items()), key=lambda rb: rb[0])
    shown = items if len(items) <= 8 else items[:8]
    text = "; per rank " + ", ".join(f"{r}: {_mb(b)}" for r, b in shown)
    if len(items) > 8:
        rank, most = max(items, key=lambda rb: rb[1])
        text += f", ... (largest: rank {rank}, {_mb(most)})"
    return text


def _left_out_line(summary: dict[str, object]) -> str:
    """What the trace's bound left out, per rank (from when, how many calls and events), or that it
    held everything."""
    left = summary.get("left_out")
    bound = int(summary.get("max_trace_bytes", 0) or 0)  # type: ignore[call-overload]
    if not isinstance(left, dict) or not left:
        return f"; nothing left out (bound {_mb(bound)})" if bound else ""
    calls = sum(int(v["calls"]) for v in left.values())
    parts = [
        f"rank {r}"
        + (f" from {float(v['from_seconds']):.3f} s" if v["from_seconds"] is not None else "")
        + f" ({_plural(int(v['calls']), 'call')}"
        + (f", {_plural(int(v['events']), 'message or collective event')}" if int(v["events"]) else "")
        + ")"
        for r, v in sorted(left.items(), key=lambda rv: int(rv[0]))
    ]
    shown = parts if len(parts) <= 8 else parts[:8] + [f"and {len(parts) - 8} more ranks"]
    return f"; LEFT OUT by the bound of {_mb(bound)} (--max-trace-size): {_plural(calls, 'call')}, {', '.join(shown)}"
