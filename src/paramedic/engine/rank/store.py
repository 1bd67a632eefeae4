"""The search store: fragment searches' results as files every rank reads, so alignments stay put.

A fragment search finds, besides the merge keys, every hit's alignments (archive text): 70 MB for the
500-query benchmark, also for hits the -max_target_seqs cut then drops. Rank 0 needs only the keys. So
the worker that searched writes its whole result to the store, sends rank 0 the keys alone, and the
worker that writes a piece's report reads the alignments of the piece's merged hits from the store
(`alignments`), only the sections of the piece's queries. Rank 0 never holds an alignment.

The store is the journal's `search/` directory when the search keeps a journal (a record is then the
journal's too: durable before it counts), else a directory in rank 0's temporary directory. Every worker
checks it sees the store before the first task (paramedic.engine.runtime.roles); when one does not (a node-local
temporary directory on a cluster), alignments travel through rank 0 with the tasks, as before.

A record `B-F` (fragment F's search of batch B), built so a reader takes only the queries it needs:

    MAGIC                      b"paramedic-search 4\\n"
    32 bytes                   tag: HMAC-SHA256, keyed by the store's key, of "B-F", a zero byte and
                               the K bytes below (a record changed, or copied from another store or
                               journal, is not this store's: it counts as missing and is searched again)
    8 bytes, big-endian        length K of the keys section
    K bytes                    zlib(JSON): {"hits": per query [[evalue, score, gid], ...] in BLAST order,
                               "prelim": [offset, length] of the preliminary lists' section below,
                               "prelim_digest": its SHA-256 (hex),
                               "sections": per query [offset, length] of its alignments below,
                               "digests": per query SHA-256 (hex) of its alignment section}
    the preliminary lists      binary, little-endian (a search keeps tens of thousands of candidates,
                               which JSON took 15 ms a search to write): per query int64 limit (-1:
                               no list) and int64 count; then every candidate's e-value (float64),
                               then their scores (int64), then their global ids (int64), query by query
    the alignment sections     per query zlib(JSON): its hits' alignments in the same order, as Latin-1
                               strings (which map bytes one to one)

The tag is checked whenever keys are read, a section's digest whenever it is read: every byte a record
feeds into an output is checked in the run that uses it, reading only what it uses.

Floats are written as Python writes them, which read back exactly. Records are the user's own files, read
back only by the same user's search: still validated, and one that does not decode counts as missing.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import secrets
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from paramedic.blast.hits import Candidate, FragmentSearch, Hit, PrelimList
from paramedic.durable import write_durably
from paramedic.errors import OutputError

# "tasks": the searches' results travel through rank 0 even when every rank sees the search store, as
# they must when one does not (for measuring the two side by side, and for a store on a slow filesystem)
ALIGNMENTS_VARIABLE = "PARAMEDIC_ALIGNMENTS"

MAGIC = b"paramedic-search 4\n"
LISTS_MAGIC = b"paramedic-lists 2\n"  # 2: HSP contexts relative to their query (1 was ignored)
LISTS_SUFFIX = ".lists"
TAG_BYTES = 32
_LENGTH = struct.Struct(">Q")
# A record's keys section is read whole; a larger one is not a record this code wrote.
MAX_KEYS_BYTES = 1 << 30


class RecordError(ValueError):
    """A record that is missing or does not decode."""


@dataclass(frozen=True)
class Store:
    """A directory of search records. `durable`: each record fsynced before it counts (the journal)."""

    path: Path
    durable: bool
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)  # the journal's

    def record(self, batch: int, fragment: int) -> Path:
        return self.path / f"{batch}-{fragment}"

    def put(self, batch: int, fragment: int, found: FragmentSearch) -> None:
        """Write a search's whole result; readers see the whole record or none."""
        path = self.record(batch, fragment)
        try:
            if found.lists is not None:
                lists = path.with_name(path.name + LISTS_SUFFIX)
                tag = _tag(self.key, lists.name, found.lists)
                write_durably(lists, LISTS_MAGIC + tag + found.lists, sync=False)
            write_durably(path, encode_record(found, self.key, path.name), sync=self.durable)
        except OSError as exc:
            raise OutputError(f"cannot write the search record {path}: {exc.strerror}") from exc

    def lists(self, batch: int, fragment: int) -> bytes:
        """A search's kept lists whole (paramedic.blast.prelim.whole_lists), its tag checked. RecordError
        when they are missing or not this store's: the piece then finds its lists again (a cost, not an
        error). Not made durable: a journal's resumed search loses nothing but that speed."""
        path = self.record(batch, fragment)
        path = path.with_name(path.name + LISTS_SUFFIX)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise RecordError(exc.strerror or str(exc)) from exc
        head = len(LISTS_MAGIC) + TAG_BYTES
        body = data[head:]
        if data[: len(LISTS_MAGIC)] != LISTS_MAGIC or not hmac.compare_digest(
            data[len(LISTS_MAGIC) : head], _tag(self.key, path.name, body)
        ):
            raise RecordError(f"{path.name} is not this store's")
        return body

    def keys(self, batch: int, fragment: int, queries: int, alignments: bool = False) -> FragmentSearch:
        """A record's merge keys (and with `alignments`, every hit's alignments). RecordError when it is
        missing, does not decode, or does not hold `queries` queries."""
        path = self.record(batch, fragment)
        try:
            with open(path, "rb") as fh:
                keys = _read_keys(fh, self.key, path.name)
                found = _keys_search(fh, keys)
                if len(found.hits) != queries or len(found.prelim) != queries:
                    raise RecordError(f"{len(found.hits)} queries, expected {queries}")
                if alignments:
                    found = FragmentSearch(
                        [
                            _with_alignments(hits, _read_section(fh, keys, q, len(hits)))
                            for q, hits in enumerate(found.hits)
                        ],
                        found.prelim,
                    )
        except OSError as exc:
            raise RecordError(exc.strerror or str(exc)) from exc
        except (ValueError, KeyError, TypeError, IndexError, zlib.error) as exc:
            raise RecordError(str(exc)) from exc
        return found

    def alignments(
        self,
        batches: Sequence[range],
        fragments: int,
        first_query: int,
        hits: Sequence[Sequence[int]],
    ) -> tuple[tuple[bytes, ...], ...]:
        """Per query (from global index `first_query` on), the alignments of its merged `hits` (subject ids), read
        from the records of every fragment's search of the query's batch (only the query's sections).
        RecordError when one is missing."""
        found: list[tuple[bytes, ...]] = []
        files: dict[tuple[int, int], IO[bytes]] = {}
        keys: dict[tuple[int, int], dict[str, Any]] = {}
        try:
            for offset, wanted in enumerate(hits):
                query = first_query + offset
                batch = next(b for b, r in enumerate(batches) if query in r)
                q = query - batches[batch].start
                by_subject: dict[int, bytes] = {}
                for fragment in range(fragments):
                    key = (batch, fragment)
                    if key not in files:
                        path = self.record(batch, fragment)
                        files[key] = open(path, "rb")
                        keys[key] = _read_keys(files[key], self.key, path.name)
                    gids = [_int(h[2]) for h in keys[key]["hits"][q]]
                    by_subject.update(
                        zip(gids, _read_section(files[key], keys[key], q, len(gids)), strict=True)
                    )
                missing = [gid for gid in wanted if gid not in by_subject]
                if missing:
                    raise RecordError(f"no alignment of subject {missing[0]} in the store")
                found.append(tuple(by_subject[gid] for gid in wanted))
        except StopIteration as exc:
            raise RecordError("a query outside the plan's batches") from exc
        except OSError as exc:
            raise RecordError(exc.strerror or str(exc)) from exc
        except (ValueError, KeyError, TypeError, IndexError, zlib.error) as exc:
            raise RecordError(str(exc)) from exc
        finally:
            for fh in files.values():
                fh.close()
        return tuple(found)

    def names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.path))
        except OSError:
            return []


# -- encoding ---------------------------------------------------------------------------------------
def encode_record(found: FragmentSearch, key: bytes, name: str) -> bytes:
    """Record `name` (B-F) of the store keyed by `key`."""
    prelim = _encode_prelim(found.prelim)
    sections: list[bytes] = []
    spans: list[list[int]] = []
    offset = len(prelim)
    for hits in found.hits:
        section = zlib.compress(
            json.dumps([h.alignment.decode("latin-1") for h in hits], separators=(",", ":")).encode(), 1
        )
        spans.append([offset, len(section)])
        sections.append(section)
        offset += len(section)
    keys = {
        "hits": [[[h.evalue, h.score, h.gid] for h in q] for q in found.hits],
        "prelim": [0, len(prelim)],
        "prelim_digest": hashlib.sha256(prelim).hexdigest(),
        "sections": spans,
        "digests": [hashlib.sha256(section).hexdigest() for section in sections],
    }
    head = zlib.compress(json.dumps(keys, separators=(",", ":")).encode(), 1)
    return b"".join([MAGIC, _tag(key, name, head), _LENGTH.pack(len(head)), head, prelim, *sections])


def _encode_prelim(lists: Sequence[PrelimList | None]) -> bytes:
    counts = array("q")
    evalues, scores, gids = array("d"), array("q"), array("q")
    for p in lists:
        if p is None:
            counts.extend((-1, 0))
            continue
        counts.extend((p.limit, len(p.candidates)))
        if p.candidates:
            e, s, g = zip(*p.candidates, strict=True)
            evalues.extend(e)
            scores.extend(s)
            gids.extend(g)
    if sys.byteorder != "little":
        for column in (counts, evalues, scores, gids):
            column.byteswap()
    return b"".join(column.tobytes() for column in (counts, evalues, scores, gids))


def _decode_prelim(data: bytes, queries: int) -> list[PrelimList | None]:
    counts = array("q")
    if len(data) < 16 * queries:
        raise RecordError("preliminary lists cut short")
    counts.frombytes(data[: 16 * queries])
    if sys.byteorder != "little":
        counts.byteswap()
    total = sum(counts[1::2])
    if any(c < 0 for c in counts[1::2]) or len(data) != 16 * queries + 24 * total:
        raise RecordError("preliminary lists malformed")
    columns = []
    for at, code in ((16 * queries, "d"), (16 * queries + 8 * total, "q"), (16 * queries + 16 * total, "q")):
        column = array(code)
        column.frombytes(data[at : at + 8 * total])
        if sys.byteorder != "little":
            column.byteswap()
        columns.append(column)
    evalues, scores, gids = columns
    lists: list[PrelimList | None] = []
    start = 0
    for limit, count in zip(counts[0::2], counts[1::2], strict=True):
        if limit < 0:
            if count != 0:
                raise RecordError("preliminary lists malformed")
            lists.append(None)
            continue
        stop = start + count
        lists.append(
            PrelimList(
                limit, tuple(map(Candidate, evalues[start:stop], scores[start:stop], gids[start:stop]))
            )
        )
        start = stop
    return lists


def decode_record(data: bytes, key: bytes, name: str, alignments: bool = True) -> FragmentSearch:
    """A whole record from bytes (tests and tools; the store reads from files)."""
    fh = io.BytesIO(data)
    keys = _read_keys(fh, key, name)
    found = _keys_search(fh, keys)
    if not alignments:
        return found
    return FragmentSearch(
        [_with_alignments(h, _read_section(fh, keys, q, len(h))) for q, h in enumerate(found.hits)],
        found.prelim,
    )


def keys_only(found: FragmentSearch) -> FragmentSearch:
    """The same result without alignments: what rank 0 receives when the store holds them."""
    return FragmentSearch([[Hit(h.evalue, h.score, h.gid) for h in q] for q in found.hits], found.prelim)


def _tag(key: bytes, name: str, head: bytes) -> bytes:
    mac = hmac.new(key, name.encode() + b"\0", hashlib.sha256)
    mac.update(head)
    return mac.digest()


def _read_keys(fh: IO[bytes], key: bytes, name: str) -> dict[str, Any]:
    if fh.read(len(MAGIC)) != MAGIC:
        raise RecordError("not a search record of this version")
    tag = _exactly(fh, TAG_BYTES)
    (length,) = _LENGTH.unpack(_exactly(fh, _LENGTH.size))
    if length > MAX_KEYS_BYTES:
        raise RecordError("keys section too large")
    head = _exactly(fh, length)
    if not hmac.compare_digest(tag, _tag(key, name, head)):
        raise RecordError("not a record this search wrote")
    keys = json.loads(zlib.decompress(head))
    if (
        not isinstance(keys, dict)
        or len(keys["sections"]) != len(keys["hits"])
        or len(keys["digests"]) != len(keys["hits"])
    ):
        raise RecordError("keys section malformed")
    keys["_base"] = len(MAGIC) + TAG_BYTES + _LENGTH.size + length
    return keys


def _read_section(fh: IO[bytes], keys: dict[str, Any], query: int, hits: int) -> list[bytes]:
    offset, length = (_int(v) for v in keys["sections"][query])
    if offset < 0 or length < 0 or length > MAX_KEYS_BYTES:
        raise RecordError("section out of range")
    fh.seek(keys["_base"] + offset)
    section = _exactly(fh, length)
    if hashlib.sha256(section).hexdigest() != keys["digests"][query]:
        raise RecordError(f"alignments of query {query} changed since the record was written")
    texts = json.loads(zlib.decompress(section))
    if not isinstance(texts, list) or len(texts) != hits or not all(isinstance(t, str) for t in texts):
        raise RecordError(f"alignments of query {query} malformed")
    return [t.encode("latin-1") for t in texts]


def _keys_search(fh: IO[bytes], keys: dict[str, Any]) -> FragmentSearch:
    hits = [[Hit(_float(e), _int(s), _int(g)) for e, s, g in query] for query in keys["hits"]]
    offset, length = (_int(v) for v in keys["prelim"])
    if offset < 0 or length < 0 or length > MAX_KEYS_BYTES:
        raise RecordError("preliminary lists out of range")
    fh.seek(keys["_base"] + offset)
    data = _exactly(fh, length)
    if hashlib.sha256(data).hexdigest() != keys["prelim_digest"]:
        raise RecordError("preliminary lists changed since the record was written")
    return FragmentSearch(hits, _decode_prelim(data, len(hits)))


def _with_alignments(hits: list[Hit], texts: list[bytes]) -> list[Hit]:
    return [Hit(h.evalue, h.score, h.gid, t) for h, t in zip(hits, texts, strict=True)]


def _exactly(fh: IO[bytes], n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise RecordError("record cut short")
    return data


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, found {type(value).__name__}")
    return float(value)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, found {type(value).__name__}")
    return value
