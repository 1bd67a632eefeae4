"""Inputs that `bench/fuzz.py` (`make fuzz`) found to break a rule of the storage site: each is refused
now with one of the errors the site turns into a clear refusal, and not as an "internal error"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from paramedic.ship.blast_codec import BlastMetadataCodec
from paramedic.ship.codecs import pack_json
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
