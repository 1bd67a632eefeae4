"""Reduced timestamp precision, the paper's lossy option for traces: `--trace-precision 1us`.

Lossless is the default: the storage site writes the very file traced. With a precision, every record's
time is rounded to a multiple of it (in nanoseconds, from the file's double seconds) before shipping, and
the file that ships, and that the storage site regenerates and checks byte for byte, is that reduced
file; records keep their order. Coarser times are cheaper to ship: the jitter below the precision is
what the lossless metadata spends most of its bytes on. The run record and the metadata say which
precision was used.
"""

from __future__ import annotations

import re

import numpy as np

from paramedic.errors import UsageError
from paramedic.trace import clog2

UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
MAX_QUANTUM_NS = 1_000_000_000
_FORM = re.compile(r"(\d{1,10})(ns|us|ms|s)")


def parse(text: str) -> int:
    """--trace-precision: 0 for "lossless", else the quantum in nanoseconds (1ns .. 1s)."""
    if text == "lossless":
        return 0
    match = _FORM.fullmatch(text.strip())
    quantum = int(match.group(1)) * UNITS[match.group(2)] if match else 0
    if not 1 <= quantum <= MAX_QUANTUM_NS:
        raise UsageError(
            f"--trace-precision {text!r}: lossless, or a time from 1ns to 1s such as 100ns, 1us, 10us, 1ms"
        )
    return quantum


def label(quantum_ns: int) -> str:
    """The precision as the option spells it (the largest exact unit)."""
    if quantum_ns == 0:
        return "lossless"
    for unit in ("s", "ms", "us"):
        if quantum_ns % UNITS[unit] == 0:
            return f"{quantum_ns // UNITS[unit]}{unit}"
    return f"{quantum_ns}ns"


def reduce(data: bytes, quantum_ns: int) -> bytes:
    """The CLOG2 file `data` with every record's time rounded to `quantum_ns` (the same records, in the same
    order; the blocks packed again as MPE2 packs them)."""
    trace = clog2.read(data)
    rec = trace.records
    with np.errstate(all="ignore"):
        ns = np.rint(rec.seconds() * (1e9 / quantum_ns)) * quantum_ns
    if len(ns) and not (np.all(np.isfinite(ns)) and float(np.abs(ns).max()) < 2.0**62):
        raise clog2.TraceFormatError("CLOG2 file has times that are not finite or too large to round")
    seconds = ns.astype(np.int64) / 1e9
    reduced = clog2.Trace(
        trace.preamble,
        trace.big_endian,
        trace.block_size,
        clog2.Records(seconds.view(np.uint64), rec.head, rec.body),
        trace.end_head if trace.end_head[0] != -(1 << 31) else (0, 0, 0),
        [],
        trace.commtable,
    )
    out = clog2.write(reduced)
    fptr = len(out) - len(trace.commtable)
    return _with_table_offset(out[: clog2.PREAMBLE_SIZE], fptr) + out[clog2.PREAMBLE_SIZE :]


def _with_table_offset(preamble: bytes, fptr: int) -> bytes:
    """The preamble with its communicator table offset set to `fptr` (the blocks may have moved)."""
    strings = preamble.split(b"\0")
    try:
        at = strings.index(b"commtable_fptr=")
        unit = int(strings[at + 2])
    except (ValueError, IndexError) as exc:
        raise clog2.TraceFormatError("CLOG2 preamble: bad commtable_fptr") from exc
    if unit <= 0:
        raise clog2.TraceFormatError("CLOG2 preamble: bad commtable_fptr")
    strings[at + 1] = str(fptr // unit).encode()
    strings[at + 3] = str(fptr % unit).encode()
    text = b"\0".join(strings).rstrip(b"\0") + b"\0"
    if len(text) > clog2.PREAMBLE_SIZE:
        raise clog2.TraceFormatError("CLOG2 preamble: no room for the new communicator table offset")
    return text.ljust(clog2.PREAMBLE_SIZE, b"\0")
