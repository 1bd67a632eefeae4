"""The trace codec: ship a CLOG2 trace as its period metadata (trace.codec), regenerate it at the storage site.

A unit is a whole trace (offset 0, the file's bytes); the payload is its metadata, whose SHA-256 of the
regenerated file the storage site checks before it writes anything. The file comes back as ranges of at
most RANGE_CHUNK_BYTES, so the site writes it as it writes any "ranges" codec's output. Payloads larger than
the wire's MAX_PAYLOAD_BYTES (32 MiB of metadata: traces of hundreds of millions of events) are not
supported yet.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from paramedic.errors import ParamedicError
from paramedic.ship.codecs import RANGE_CHUNK_BYTES, Codec, Segment, register_codec
from paramedic.ship.wire import ProtocolError

# The largest trace a storage site regenerates from one metadata payload.
MAX_TRACE_BYTES = 1 << 34


@register_codec
class TraceMetadataCodec(Codec):
    """The MPE plugin of the framework paper: first period in full, differences for the others."""

    name = "trace-metadata"
    layout = "ranges"
    ship_mode = None  # its `--ship` mode is the application's (ship.apps: "metadata" of trace)

    precision = "lossless"  # the precision of the files it is given (trace.precision), recorded

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

    def decode(self, header: dict[str, Any], payload: bytes, context: Any) -> list[Segment]:
        size = header.get("size")
        offset = header.get("offset")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_TRACE_BYTES:
            raise ProtocolError("trace chunk: bad size")
        if offset != 0:
            raise ProtocolError("trace chunk: a trace ships whole, at offset 0")
        try:
            data = _trace().decode(payload, max_size=size)
        except ParamedicError as exc:
            raise ProtocolError(f"trace chunk: {exc}") from exc
        if len(data) != size:
            raise ProtocolError("trace chunk: regenerated size differs from the header")
        return [Segment(s, data[s : s + RANGE_CHUNK_BYTES]) for s in range(0, size, RANGE_CHUNK_BYTES)]


def _trace() -> ModuleType:
    """paramedic.trace.codec, imported when a trace is first encoded or decoded: it brings numpy, which a
    search (whose --ship choices come from the same registry) does not need at start."""
    from paramedic.trace import codec

    return codec
