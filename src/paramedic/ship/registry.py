"""The codecs both ends of the link know, found by name: importing this module registers every one.

`ship.codecs` holds the plugin interface, the registry itself (`CODECS`, `@register_codec`) and the generic
codecs; an application's codec is a module of its own that registers itself when imported and imports
`ship.codecs` (never the reverse). The storage site looks a job's codec up here by the name in the job's
header, so a new codec is one module plus its import below.
"""

from __future__ import annotations

import paramedic.ship.blast_codec  # noqa: F401  (registers BlastMetadataCodec)
from paramedic.ship.codecs import CODECS, Codec
from paramedic.ship.wire import ProtocolError


def ship_modes() -> tuple[str, ...]:
    """The `--ship` choices the codecs offer, in registration order (`auto` chooses among them)."""
    return tuple(c.ship_mode for c in CODECS.values() if c.ship_mode is not None)


def ships_pieces(mode: str) -> bool:
    """Whether the `--ship` choice `mode` ships the merged subjects of pieces (the storage site writes the
    output) rather than output bytes: such a job needs the fragments strategy, which merges."""
    return any(c.ship_mode == mode and c.layout == "pieces" for c in CODECS.values())


def codec_for_mode(mode: str) -> Codec:
    """A new codec for the `--ship` choice `mode`."""
    for cls in CODECS.values():
        if cls.ship_mode == mode:
            return cls()
    raise ValueError(f"no codec ships {mode!r}")


def make_codec(name: str) -> Codec:
    """The codec registered under `name` (ProtocolError for an unknown one: names come off the wire)."""
    if name not in CODECS:
        raise ProtocolError(f"unknown codec {name!r}")
    return CODECS[name]()
