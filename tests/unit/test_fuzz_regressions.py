"""Inputs that `bench/fuzz.py` (`make fuzz`) found to break a rule of the storage site: each is refused
now with one of the errors the site turns into a clear refusal, and not as an "internal error"."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
import zstandard

from paramedic.ship.blast_codec import BlastMetadataCodec
from paramedic.ship.codecs import CompressedCodec, pack_json
from paramedic.ship.wire import ProtocolError


def _setup(options: list[str]) -> dict:
    return {
        "program": "blastp",
        "options": options,
        "db_arg": "db/x",
        "manifest_sha256": "0" * 64,
        "n_queries": 1,
        "pieces": [[0, 1]],
    }


@pytest.mark.parametrize("outfmt", ["abc", "\ue5b7x", "-1x"])
def test_setup_with_an_outfmt_that_is_not_a_number_is_a_refusal(outfmt: str) -> None:
    """A UsageError from -outfmt's number escaped `prepare`: the server answered "internal error"."""
    site = SimpleNamespace(manifest_sha256="0" * 64, database=SimpleNamespace(dbtype="prot"))
    with pytest.raises(ProtocolError, match="-outfmt must start with a format number"):
        BlastMetadataCodec().prepare(_setup(["-outfmt", outfmt]), pack_json([["q", "MKV"]]), site)


def _declaring(size: int, data: bytes = b"x" * 530) -> bytes:
    """A zstd frame of `data` whose header declares `size` bytes of content (8-byte size field)."""
    frame = zstandard.ZstdCompressor(level=3).compress(data)
    assert frame[4] == 0x60  # single segment, 2-byte content size: the blocks start at byte 7
    return frame[:4] + bytes([0xE0]) + struct.pack("<Q", size) + frame[7:]


@pytest.mark.parametrize("declared", [2**40, 2**62])
def test_compressed_chunk_declaring_a_huge_size_is_refused_before_inflating(declared: int) -> None:
    """python-zstandard ignores max_output_size for a frame that declares its content size: a chunk
    declaring 1 TiB raised MemoryError (an internal error on the I/O worker), one declaring 1 GiB of zeros
    (32 KB on the wire) was inflated to 1 GiB in memory."""
    with pytest.raises(ProtocolError, match="inflates beyond the length in its header"):
        CompressedCodec().decode({"offset": 0, "length": 530}, _declaring(declared), None)


def test_compressed_chunk_bomb_is_refused_before_inflating() -> None:
    obj = zstandard.ZstdCompressor(level=3).compressobj(size=64 * 2**20)
    bomb = b"".join(obj.compress(b"\0" * 2**20) for _ in range(64)) + obj.flush()
    assert len(bomb) < 4096
    with pytest.raises(ProtocolError, match="inflates beyond the length in its header"):
        CompressedCodec().decode({"offset": 0, "length": 4 * 2**20}, bomb, None)


def test_compressed_chunk_still_decodes() -> None:
    data = b"abc" * 1000
    header, payload = CompressedCodec().encode((7, data))
    assert CompressedCodec().decode(header, payload, None)[0].data == data
