"""Codecs: how a job's output crosses the link. The plugin interface of ParaMEDIC's framework.

A codec has two halves. At the compute site, `encode` turns a unit of results into a payload; at the
storage site, `decode` turns the payload back into output. Another application plugs in by writing one
class with these methods, decorated with `@register_codec`, in a module that `ship.registry` imports
(the storage site finds codecs by name there, `make_codec`):

* `layout = "ranges"`: a payload decodes to bytes of the final file at an explicit offset (the
  generic codecs: the output itself, plain or zstd-compressed; no knowledge of the application);
* `layout = "pieces"`: a payload decodes to numbered pieces of output that `assemble` joins at the
  end (the BLAST codec: subject ids in, BLAST+ reports regenerated from the replica out).

At the compute site, `job_setup` turns the search's description (`JobSpec`) into the setup the storage
site needs (nothing for the generic codecs; the BLAST codec sends the program, options and queries). The
storage site calls `prepare` once per job with the job's setup (untrusted: validate it) and hands the
returned context to every `unpack` and `decode`. A codec whose payloads depend on the ones before them (the
BLAST codec codes a query's ids against earlier queries' ids) sets `ordered`: the site then runs `unpack`
on a job's chunks strictly in the order they were encoded, replaying them after a restart, and `decode`
on what it returns, in any order, on its I/O workers.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import zstandard

from paramedic.ship.plugins import Registry
from paramedic.ship.wire import ProtocolError

# The largest output range one chunk carries (the generic codecs split bigger pieces).
RANGE_CHUNK_BYTES = 4 * 2**20
# The largest zstd window the storage site accepts: a frame may ask for 128 MiB (or more) of buffer; what
# the compute site makes (levels 3 and 9) needs at most 4 MiB.
MAX_WINDOW_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Segment:
    """Decoded output: bytes at a byte offset ("ranges") or the report of piece `position` ("pieces")."""

    position: int
    data: bytes


@dataclass(frozen=True)
class JobSpec:
    """The search, as a codec may describe it to the storage site (`Codec.job_setup`)."""

    program: str
    options: list[str]  # the search's options, without -query, -db and -out
    db_arg: str  # -db as the user gave it
    manifest_sha256: str  # the database's identity: the site's replica must be the same
    pieces: tuple[range, ...]  # the output's pieces, as query index ranges
    queries: list[tuple[str, str]]  # (id and description, sequence)
    nseq: int  # sequences in the database
    subset: Any = None  # a restricted search's resolved subset (paramedic.blast.run.Subset), or None


class BinaryWriter(Protocol):
    """Where `assemble` writes the final file: anything with a binary `write`."""

    def write(self, data: bytes, /) -> object: ...


class Codec(ABC):
    name: ClassVar[str]
    layout: ClassVar[Literal["ranges", "pieces"]]
    # The `paramedic search --ship` choice that selects this codec (None: not offered there). A "pieces"
    # codec ships the merged subjects of released pieces: the units are (first query, subjects per
    # query, database sequences), and the output is made at the storage site.
    ship_mode: ClassVar[str | None] = None
    ordered: ClassVar[bool] = False  # unpack chunks in encoding order (encode keeps state across units)
    # The storage site's decoding as a share of the encoding's time here: `paramedic ship --ship auto`
    # estimates g, the site's regeneration, as this times f (it does not decode here only to time it).
    decode_per_encode: ClassVar[float] = 1.0

    # -- compute site ----------------------------------------------------------------------------------
    def job_setup(self, job: JobSpec) -> tuple[dict[str, Any], bytes]:
        """Header fields and payload of the job's opening: what `prepare` gets at the storage site."""
        return {}, b""

    @abstractmethod
    def encode(self, unit: Any) -> tuple[dict[str, Any], bytes]:
        """Header fields and payload for one unit of results."""

    # -- storage site ----------------------------------------------------------------------------------
    def prepare(self, setup: dict[str, Any], payload: bytes, site: Any) -> Any:
        """Validate a job's setup and build what `decode` needs (nothing for the generic codecs)."""
        return None

    def unpack(self, header: dict[str, Any], payload: bytes, context: Any) -> Any:
        """The cheap first step of decoding, the one that runs in order for an `ordered` codec; its result
        goes to `decode`. ProtocolError when the payload is malformed."""
        return payload

    @abstractmethod
    def decode(self, header: dict[str, Any], payload: Any, context: Any) -> list[Segment]:
        """Output for one unpacked payload; ProtocolError (or a ParamedicError) when it is malformed."""

    def assemble(self, pieces: Iterator[tuple[int, bytes]], context: Any, out: BinaryWriter) -> None:
        """Write the final file from all pieces in order ("pieces" layout only)."""
        raise NotImplementedError


CODECS: Registry[type[Codec]] = Registry("codec")


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Make a codec known to both sites by its `name` (a class decorator)."""
    return CODECS.add(cls.name, cls)


@register_codec
class DirectCodec(Codec):
    """The output bytes as they are: SEMPLAR's remote writes at explicit offsets."""

    name = "direct"
    layout = "ranges"
    ship_mode = "direct"

    def encode(self, unit: tuple[int, bytes]) -> tuple[dict[str, Any], bytes]:
        offset, data = unit
        return {"offset": offset, "length": len(data)}, data

    def decode(self, header: dict[str, Any], payload: bytes, context: Any) -> list[Segment]:
        return [Segment(_offset(header, len(payload)), payload)]


@register_codec
class CompressedCodec(Codec):
    """The paper's generic plugin: the same bytes, zstd-compressed, no application knowledge."""

    name = "compressed"
    layout = "ranges"
    ship_mode = "compressed"
    level = 3

    def encode(self, unit: tuple[int, bytes]) -> tuple[dict[str, Any], bytes]:
        offset, data = unit
        packed = zstandard.ZstdCompressor(level=self.level).compress(data)
        return {"offset": offset, "length": len(data)}, packed

    def decode(self, header: dict[str, Any], payload: bytes, context: Any) -> list[Segment]:
        length = header.get("length")
        if not isinstance(length, int) or not 0 <= length <= RANGE_CHUNK_BYTES:
            raise ProtocolError("compressed chunk: bad length")
        try:
            # max_output_size binds only a frame without a content size: one that declares its size is
            # inflated to that size (a 32 KB chunk to 1 GiB), so a declared size is checked first.
            if zstandard.frame_content_size(payload) > length:
                raise ProtocolError("compressed chunk: inflates beyond the length in its header")
            data = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES).decompress(
                payload, max_output_size=length
            )
        except zstandard.ZstdError as exc:
            raise ProtocolError(f"compressed chunk: {exc}") from exc
        if len(data) != length:
            raise ProtocolError("compressed chunk: length differs from the header")
        return [Segment(_offset(header, length), data)]


def _offset(header: dict[str, Any], length: int) -> int:
    offset = header.get("offset")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or offset > 2**50:
        raise ProtocolError("chunk: bad offset")
    if header.get("length") != length or length > RANGE_CHUNK_BYTES:
        raise ProtocolError("chunk: bad length")
    return offset


def split_range(offset: int, data: bytes) -> Iterator[tuple[int, bytes]]:
    """Consecutive ranges of at most RANGE_CHUNK_BYTES covering `data` placed at `offset`."""
    for start in range(0, max(len(data), 1), RANGE_CHUNK_BYTES):  # an empty piece still ships
        yield offset + start, data[start : start + RANGE_CHUNK_BYTES]


def pack_json(value: Any) -> bytes:
    """A setup document, zstd-compressed JSON."""
    return zstandard.ZstdCompressor(level=9).compress(json.dumps(value, separators=(",", ":")).encode())


# A setup may inflate to at most this many times its compressed size (or SETUP_INFLATE_FLOOR bytes, whichever
# is larger): real query sets compress 2x (mmseqs2's 500 queries: 1.9x), a decompression bomb 10,000x.
SETUP_INFLATE_RATIO = 64
SETUP_INFLATE_FLOOR = 16 * 2**20


def inflate_bounded(payload: bytes, max_bytes: int, what: str = "setup") -> bytes:
    """zstd-decompress `payload`, streaming, stopping as soon as the output passes its bound: `max_bytes`,
    and SETUP_INFLATE_RATIO times the payload (so a small payload cannot make the site hold much)."""
    limit = min(max_bytes, max(SETUP_INFLATE_FLOOR, SETUP_INFLATE_RATIO * len(payload)))
    out = bytearray()
    try:
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        with decompressor.stream_reader(payload, read_across_frames=True) as reader:
            while block := reader.read(1 << 20):
                out += block
                if len(out) > limit:
                    raise ProtocolError(
                        f"{what} inflates beyond {limit} bytes ({len(payload)} compressed): refused"
                    )
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"{what} is not zstd-compressed: {exc}") from exc
    return bytes(out)


def unpack_json(payload: bytes, max_bytes: int, max_values: int | None = None) -> Any:
    """A setup document: inflated within `max_bytes`, and with `max_values` its values counted before it
    is parsed (bytes alone do not bound a parse: 64 MiB of `[],` are 21 million lists, 3.2 GiB)."""
    from paramedic.ship.wire import loads_json

    data = inflate_bounded(payload, max_bytes)
    if max_values is not None:
        check_json_values(data, max_values, "setup")
    return loads_json(data, "setup")


# A JSON string: what lies between its quotes may hold any bracket or comma
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _json_separators(data: bytes) -> int:
    return data.count(b"[") + data.count(b"{") + data.count(b",")


def check_json_values(data: bytes, max_values: int, what: str) -> None:
    """ProtocolError when JSON text holds more than `max_values` arrays, objects and separators (outside
    its strings): a parse makes at most twice as many objects. Counted in C, before anything is parsed;
    the strings are set aside only when the plain count passes the bound (a title may hold brackets)."""
    if _json_separators(data) <= max_values:
        return
    if _json_separators(_JSON_STRING.sub(b'""', data)) > max_values:
        raise ProtocolError(f"{what} holds more than {max_values} values: refused before parsing it")


def piece_ranges(value: Any, n_queries: int) -> tuple[range, ...]:
    """Validate a list of [start, stop] query ranges that cover 0..n_queries consecutively."""
    if not isinstance(value, list) or not value or len(value) > n_queries:
        raise ProtocolError("setup: bad piece list")
    pieces = []
    expected = 0
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            or item[0] != expected
            or item[1] <= item[0]
        ):
            raise ProtocolError("setup: pieces must be consecutive query ranges")
        pieces.append(range(item[0], item[1]))
        expected = item[1]
    if expected != n_queries:
        raise ProtocolError("setup: pieces do not cover the queries")
    return tuple(pieces)


def validate_queries(value: Any, max_queries: int) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not 0 < len(value) <= max_queries:
        raise ProtocolError("setup: bad query list")
    queries = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, str) and v and "\n" not in v and "\r" not in v for v in item)
            or item[1].startswith(">")
        ):
            raise ProtocolError("setup: a query must be [header, sequence] on one line each")
        queries.append((item[0], item[1]))
    return queries


def sequence_of_ranges(pieces: Sequence[range]) -> list[list[int]]:
    return [[p.start, p.stop] for p in pieces]
