"""Inputs that `bench/fuzz.py` (`make fuzz`) found to break a rule of the storage site: each is refused
now with one of the errors the site turns into a clear refusal, and not as an "internal error"."""

from __future__ import annotations

import base64
import json
import struct
from types import SimpleNamespace

import pytest
import zstandard
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from paramedic.ship.blast_codec import BlastMetadataCodec
from paramedic.ship.codecs import CompressedCodec, pack_json
from paramedic.ship.signing import CLIENT, Signer
from paramedic.ship.wire import ProtocolError
from paramedic.site.keys import make_keys


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


def test_an_envelope_whose_certificate_has_a_bad_version_is_refused(tmp_path) -> None:
    """cryptography raises InvalidVersion (not a ValueError) for a certificate whose version is not 1-3:
    the inbox watcher failed the job with "internal error", and the compute side's reading of a forged
    reply would have raised it too. The certificate is refused as not the CA's now."""
    make_keys(tmp_path / "keys", "localhost", ["compute-a"])
    envelope = json.loads(Signer(tmp_path / "keys" / "compute-a").envelope({"kind": "open", "job": "x"}))
    der = x509.load_pem_x509_certificate(envelope["cert"].encode()).public_bytes(serialization.Encoding.DER)
    assert der.count(b"\xa0\x03\x02\x01\x02") == 1  # [0] EXPLICIT INTEGER 2: X.509 v3
    der = der.replace(b"\xa0\x03\x02\x01\x02", b"\xa0\x03\x02\x01\x12")  # version 18
    pem = base64.encodebytes(der).decode()
    envelope["cert"] = f"-----BEGIN CERTIFICATE-----\n{pem}-----END CERTIFICATE-----\n"
    with pytest.raises(
        ProtocolError, match="open.json: signed with a certificate not issued by this site's CA"
    ):
        Signer(tmp_path / "keys" / "server").open_envelope(json.dumps(envelope).encode(), CLIENT, "open.json")
