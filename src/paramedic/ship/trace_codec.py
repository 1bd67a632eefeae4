"""The trace codec: ship a CLOG2 trace as its period metadata (trace.codec), regenerate it at the storage site.

A unit is a whole trace (offset 0, the file's bytes), or, for a trace of at least two trace.units.UNIT_BYTES,
one of its ranges of whole blocks (`units`, `encode_unit`: each the metadata of a standalone CLOG2 file, and
the header fields that turn it back into the range, `unit`): the compute site encodes the next range while
the one before is on the link, and the storage site regenerates each range as it arrives, so the encoding
and the regeneration hide behind the transfer (issue 22). The payload is metadata whose regenerated file's
SHA-256 the storage site checks, and then the range's own, before it writes anything; the whole file's is
checked when the job finishes. The file comes back as ranges of at most RANGE_CHUNK_BYTES, so the site
writes it as it writes any "ranges" codec's output. Payloads larger than the wire's MAX_PAYLOAD_BYTES (32
MiB of metadata: traces of hundreds of millions of events) are not supported yet.

Regenerating holds the whole file and its records in memory, about ten times the file (trace.codec
DECODE_MEMORY_PER_BYTE), and 32 MiB of metadata can claim a file of up to MAX_TRACE_BYTES: the site's
decodes share one memory budget (`serve --trace-memory`, half the machine's memory by default); metadata
whose regeneration would need more than the whole budget is refused before anything is allocated, and a
decode that fits waits until the others have returned theirs.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from paramedic.errors import ParamedicError
from paramedic.ship.codecs import RANGE_CHUNK_BYTES, Codec, Segment, register_codec
from paramedic.ship.wire import ProtocolError

if TYPE_CHECKING:
    from paramedic.trace.units import Unit  # (imported when used: it brings numpy, as _trace does)

# What the site's refusal of a trace over its memory budget says (the compute site reads it: the file is
# sound, the site cannot hold its regeneration; `auto` then ships it compressed).
OVER_MEMORY = "over this storage site's memory for traces"

# The largest trace a storage site regenerates from one metadata payload.
MAX_TRACE_BYTES = 1 << 34


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


class MemoryBudget:
    """Bytes of memory the site's trace regenerations may hold at once (all jobs, all I/O workers)."""

    def __init__(self, limit: int, wait_seconds: float | None = None) -> None:
        self.limit = limit
        # the most a decode may take, its wait for its share included (serve --regen-timeout; None: no
        # bound): a decode holds an I/O worker, and one waiting for good held it for good (issue 41, item 4)
        self.wait_seconds = wait_seconds
        self.held = 0
        self._cond = threading.Condition()

    def deadline(self) -> float | None:
        """When a decode starting now must end (time.monotonic), or None."""
        return None if self.wait_seconds is None else time.monotonic() + self.wait_seconds

    @contextmanager
    def take(self, need: int, deadline: float | None = None) -> Iterator[None]:
        """Hold `need` bytes of the budget while the block runs (waiting for others to return theirs, until
        `deadline`); ProtocolError at once if `need` is over the whole budget, or when the wait ends
        without it."""
        if need > self.limit:
            raise ProtocolError(
                f"trace chunk: regenerating this trace takes about {_mib(need)} of memory, {OVER_MEMORY} "
                f"({_mib(self.limit)}, serve --trace-memory): ship it compressed"
            )
        start = time.monotonic()
        left = None if deadline is None else max(deadline - start, 0.0)
        with self._cond:
            if not self._cond.wait_for(lambda: self.held + need <= self.limit, left):
                raise ProtocolError(
                    f"trace chunk: waited {time.monotonic() - start:.1f} s for {_mib(need)} of this "
                    "storage site's memory for traces (serve --regen-timeout); other regenerations held it"
                )
            self.held += need
        try:
            yield
        finally:
            with self._cond:
                self.held -= need
                self._cond.notify_all()


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


# The storage site's budget; `paramedic serve` sets its limit (site.server.SiteServer, --trace-memory).
MEMORY = MemoryBudget(physical_memory() // 2)


@register_codec
class TraceMetadataCodec(Codec):
    """The MPE plugin of the framework paper: first period in full, differences for the others."""

    name = "trace-metadata"
    layout = "ranges"
    ship_mode = None  # its `--ship` mode is the application's (ship.apps: "metadata" of trace)

    precision = "lossless"  # the precision of the files it is given (trace.precision), recorded
    # Decoding a trace (unpacking columns, two sorts, writing the file) costs 0.3-0.55 of encoding it
    # (reading the file, the periods, four zstd packs): 0.014 / 0.047 s of CPU for LAMMPS melt, 0.256 /
    # 0.462 s for flow.pois (bench/RESULTS.md, "Trace codec CPU, session 18"). Taken as 0.6: a little high,
    # so that `auto` errs towards shipping the file. As 1.0 it picked compressed for melt at 10 Mbit/s,
    # 0.74 s against metadata's 0.6 s.
    decode_per_encode = 0.6
    unit_bytes: int | None = None  # the bytes of trace per unit (None: trace.units.UNIT_BYTES)

    def encode(self, unit: tuple[int, bytes]) -> tuple[dict[str, Any], bytes]:
        offset, data = unit
        encoded = _trace().encode(data, precision=self.precision)
        return {"offset": offset, "size": len(data), "mode": encoded.mode}, encoded.data

    def encode_unchecked(
        self, unit: tuple[int, bytes]
    ) -> tuple[tuple[dict[str, Any], bytes], Callable[[], tuple[dict[str, Any], bytes] | None]]:
        """`encode` without its rebuild check, and the check, to run if the site refuses the file the
        metadata regenerates: None when the metadata rebuilds the file (the refusal is another matter),
        else the general codec's metadata to ship instead."""
        offset, data = unit
        made = _trace().encode(data, check=False, precision=self.precision)

        def check() -> tuple[dict[str, Any], bytes] | None:
            final = _trace().checked(made, data)
            if final is made:
                return None
            return {"offset": offset, "size": len(data), "mode": final.mode}, final.data

        return ({"offset": offset, "size": len(data), "mode": made.mode}, made.data), check

    def unit_count(self, data: bytes) -> int | None:
        """How many units `units` cuts the file into, from its preamble alone (None: it ships whole)."""
        units = _units()
        return units.count(data, self.unit_bytes or units.UNIT_BYTES)

    def units(self, data: bytes) -> list[Unit] | None:
        """The file's ranges, shipped one chunk each (`encode_unit`); None: it ships whole (`encode`)."""
        units = _units()
        return units.cut(data, self.unit_bytes or units.UNIT_BYTES)

    def encode_unit(self, unit: Unit) -> tuple[dict[str, Any], bytes]:
        """A range's chunk: the metadata of its standalone file, not checked here (the site checks the
        range's SHA-256 before it writes it; `check_units` runs only if the site refuses)."""
        made = _trace().encode(unit.standalone, check=False, precision=self.precision)
        header = {"offset": unit.offset, "size": len(unit.data), "mode": made.mode, "unit": unit.header()}
        return header, made.data

    def check_units(self, units: list[Unit], data: bytes) -> tuple[dict[str, Any], bytes] | None:
        """After the site refused a file shipped in `units`: None when every range's metadata rebuilds it
        here (the refusal is another matter), else the whole file's checked metadata to ship instead."""
        for unit in units:
            header, payload = self.encode_unit(unit)
            try:
                rebuilt = _units().restore(
                    _trace().decode(payload, max_size=len(unit.standalone)),
                    header["unit"],
                    unit.offset,
                    len(unit.data),
                )
            except ParamedicError:
                rebuilt = b""
            if rebuilt != unit.data:
                return self.encode((0, data))
        return None

    def decode(self, header: dict[str, Any], payload: bytes, context: Any) -> list[Segment]:
        size = header.get("size")
        offset = header.get("offset")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_TRACE_BYTES:
            raise ProtocolError("trace chunk: bad size")
        unit = header.get("unit")
        if unit is None:
            if offset != 0:
                raise ProtocolError("trace chunk: a trace shipped whole is at offset 0")
            standalone = size
        else:
            if (
                not isinstance(unit, dict)
                or not isinstance(offset, int)
                or isinstance(offset, bool)
                or not 0 <= offset <= MAX_TRACE_BYTES
            ):
                raise ProtocolError("trace chunk: bad unit or offset")
            # the standalone file: the range, a preamble unless it has the file's, an empty table unless
            # it has the file's (trace.units)
            standalone = size + (0 if offset == 0 else 1024) + (0 if unit.get("last") is True else 4)
        deadline = MEMORY.deadline()  # (serve --regen-timeout: the wait for memory and the rebuild)
        try:
            need = _trace().decode_memory(payload, max_size=standalone)
            with MEMORY.take(need, deadline):
                data = _trace().decode(payload, max_size=standalone, deadline=deadline)
                if unit is not None:
                    data = _units().restore(data, unit, offset, size)
        except ParamedicError as exc:
            raise ProtocolError(f"trace chunk: {exc}") from exc
        if len(data) != size:
            raise ProtocolError("trace chunk: regenerated size differs from the header")
        return [
            Segment(offset + s, data[s : s + RANGE_CHUNK_BYTES]) for s in range(0, size, RANGE_CHUNK_BYTES)
        ]


def _trace() -> ModuleType:
    """paramedic.trace.codec, imported when a trace is first encoded or decoded: it brings numpy, which a
    search (whose --ship choices come from the same registry) does not need at start."""
    from paramedic.trace import codec

    return codec


def _units() -> ModuleType:
    from paramedic.trace import units

    return units
