"""What both ends of the link know, found by name: importing this module registers every codec and every
application (ship.apps, which imports each application's codec module).

`ship.plugins` holds the registry pattern; `ship.codecs` the codec plugin interface, its registry
(`CODECS`, `@register_codec`) and the generic codecs; `ship.apps` the applications and the one mapping
from a `--ship` choice to a codec (`Application.codec_for`). The functions here answer for `paramedic
search --ship` (the BLAST application, `apps.SEARCH`), which the engine asks; the storage site looks a
job's codec up by the name in the job's header (`make_codec`).
"""

from __future__ import annotations

from paramedic.ship.apps import SEARCH
from paramedic.ship.codecs import CODECS, Codec
from paramedic.ship.wire import ProtocolError


def ship_modes() -> tuple[str, ...]:
    """The `paramedic search --ship` choices (`auto` chooses among them)."""
    return SEARCH.ship_modes


def ships_pieces(mode: str) -> bool:
    """Whether the `--ship` choice `mode` ships the merged subjects of pieces (the storage site writes the
    output) rather than output bytes: such a job needs the fragments strategy, which merges."""
    return mode in SEARCH.ship_modes and SEARCH.codec_class(mode).layout == "pieces"


def codec_for_mode(mode: str) -> Codec:
    """A new codec for the `paramedic search --ship` choice `mode`."""
    return SEARCH.codec_for(mode)


def make_codec(name: str) -> Codec:
    """The codec registered under `name` (ProtocolError for an unknown one: names come off the wire)."""
    if name not in CODECS:
        raise ProtocolError(f"unknown codec {name!r}")
    return CODECS[name]()
