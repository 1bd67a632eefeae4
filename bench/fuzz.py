"""Fuzzing (issue 11): every decoder that takes untrusted bytes at the storage site, for a bounded number of
executions per target; the bar is 0 crashes and 0 hangs, with memory bounded.

    .venv/bin/python bench/fuzz.py [--executions 30000] [--seconds 75] [--seed 11] [--targets ...]

In-process targets, coverage-guided (atheris: libFuzzer driving the real Python code, instrumented), with a
structure-aware mutator that starts from valid inputs made by the real encoders and mutates them: bit
flips, truncation, splicing, JSON fields swapped for other types, giant numbers and strings, unicode, path
traversal, deep nesting, wrong lengths, re-sealed checksums and signatures (so that mutations get past the
integrity checks into the parsers behind them):

    frame     `wire.recv_frame` on a byte stream: both lengths, the JSON header (nesting, types), truncation,
              a stream handed over in pieces of 1 byte to 1 MiB, with and without the server's deadlines
    requests  `SiteServer._handle` on each frame of a fuzzed session (hello, ping, open, chunk, keepalive,
              cancel, finish and unknown ops), against a real JobStore writing real files: every JSON field
              of every request; each reply must also fit in a frame
    inbox     `InboxWatcher._look_into` on a fuzzed job directory: open.json, setup.bin, chunk-N.json/.bin,
              finish.json, cancel.json, reply names; symbolic links, FIFOs, directories, oversized sparse
              files; unsigned, and signed with the site's keys (mutated envelopes, and bodies re-signed)
    setup     `BlastMetadataCodec.prepare`: a BlastJobSetup's fields, its BLAST+ options and its
              zstd-compressed query list (bombs of up to 512 MiB among the seeds)
    chunk     the codecs' chunk decoders: direct, compressed (zstd, bombs), blast-metadata (the id
              container of `idcodec`, re-sealed after mutation) with the job's id history
    journal   a journal's search record (`Store.keys` with alignments, `Store.alignments`) and report
              piece (`Journal._read_piece`), sometimes re-tagged with the journal's key after mutation,
              and its header (`job.json` through `Journal.open`, sometimes with its sha256 recomputed so
              that mutations reach the fields behind it): read, dropped as damaged, or refused (exit 2),
              never an exception, and never read when its bytes fail their digest (issue 23)
    metadata  `load_metadata` on a metadata file, sometimes re-sealed (its plain SHA-256 recomputed, as a
              forger can; only the user's key seals: a changed file accepted is a finding) (issue 23)
    replica   a storage site's replies to a mirror (`TlsReplica.manifest`, `volume_files`, `read`, then
              `volume_listings.check_listing` under a --stage-limit) (issue 23)
    stage     a published copy in a --stage cache (`StageCache.use`, in a new process or in the one that
              made and digested the copy): one of its files (volume or alias)
              rewritten in place, its size, inode and times kept, and its seal kept or replaced by mutated
              bytes; the copy used must be the manifest's bytes, whatever the seal says (issue 23)
    prelim    the preliminary-list shim's records as the engine reads them (`prelim.read_dump` against
              BLAST+'s batch model, `prelim.whole_lists`): batches, lists, split and skipped records (a
              batch BLAST+ did not search, issue 23); anything malformed must be a BlastError

    tracemeta trace metadata as a storage site weighs and rebuilds it (`trace.codec.decode_memory`, then
              `decode` within a budget): the header's JSON, each zstd column, and the sizes the columns'
              frames declare, rewritten in their headers (0 to 2^64; a 1 GiB bomb among the seeds) (issue 41)
    values    `codecs.check_json_values`, the count of a setup's JSON values before it is parsed (object
              bombs `[[],[],...]`, brackets and commas inside strings, escapes): a text it passes must
              parse into at most twice its bound of objects (issue 41)

Out of process:

    server    mutated sessions against a real `paramedic serve` over TLS 1.3 on loopback; after every batch
              a valid client must still get its file, byte for byte, and the log must hold no traceback and
              no "internal error"; every reply within a time bound

A crash is an exception that is not one of the errors the project declares for that input path (what the
server or the watcher turns into a refusal): ProtocolError for frames, ProtocolError or JobFailed from a
request, ProtocolError from a setup, ProtocolError/ParamedicError/OSError/ValueError from a chunk decode
(what the store's I/O workers catch), and for the inbox and the store any "internal error" they log. Also
a crash: a reply too large for a frame, and any file written outside the site's root and state. A hang is
one execution over --hang-seconds (2 s); libFuzzer also kills an execution after --kill-seconds. Memory:
libFuzzer's peak RSS per target, bounded by --rss-mb. Crashing and hanging inputs are kept under --out.

BLAST+ runs only in the `server` target: in process, the report regeneration is a stub (its output comes
from the site's own BLAST+, not from the network), so that tens of thousands of executions take minutes.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
IN_PROCESS = (
    "frame",
    "requests",
    "inbox",
    "setup",
    "chunk",
    "journal",
    "metadata",
    "replica",
    "stage",
    "prelim",
    "tracemeta",
    "values",
)
TARGETS = (*IN_PROCESS, "server")
JOB = "0123456789abcdef0123456789abcdef"
JOB2 = "fedcba9876543210fedcba9876543210"
MAX_LEN = 256 * 1024
_LENGTHS = struct.Struct(">II")
PROTEIN = "ACDEFGHIKLMNPQRSTVWY"

# -- the world: a small replica, keys, valid inputs made by the real encoders -----------------------------


def make_world(base: Path, seed: int) -> dict[str, Path]:
    """A 40-sequence protein database (synthetic, from the seed) formatted by `paramedic format`, queries
    taken from it, and keys for the site and two compute sites (`paramedic keys`)."""
    rng = random.Random(seed)
    base.mkdir(parents=True, exist_ok=True)
    sequences = ["".join(rng.choice(PROTEIN) for _ in range(rng.randint(60, 160))) for _ in range(40)]
    fasta = base / "db.fasta"
    fasta.write_text(
        "".join(f">sp|P{i:05d}|FUZZ{i} synthetic protein {i}\n{s}\n" for i, s in enumerate(sequences))
    )
    # the earlier layout (a volume per fragment, its manifest.json), still served and mirrored: the replica
    # and stage targets fuzz its protocol (a database in place is checked by BLAKE3 per volume instead)
    run = [str(BIN / "paramedic"), "format", "--in", str(fasta), "--dbtype", "prot", "--fragments", "2",
           "--layout", "fragments", "--out", str(base / "db" / "fuzz"), "--quiet"]  # fmt: skip
    subprocess.run(run, check=True, capture_output=True, timeout=300)
    keys = [str(BIN / "paramedic"), "keys", "--out", str(base / "keys"), "--server", "localhost",
            "--client", "compute-a", "--client", "compute-b"]  # fmt: skip
    subprocess.run(keys, check=True, capture_output=True, timeout=300)
    queries = [(f"q{i} piece of protein {i}", sequences[i][10:70]) for i in (3, 17, 29)]
    (base / "queries.json").write_text(json.dumps(queries))
    bombs = [
        _zstd_bomb(16 * 2**20 + 1),
        _zstd_bomb(512 * 2**20, json_like=True),
        _zstd_bomb(4 * 2**20 + 1),
        _zstd_bomb(2**30),
    ]
    for i, bomb in enumerate(bombs):
        (base / f"bomb-{i}.zst").write_bytes(bomb)
    return {"base": base, "replica": base / "db" / "fuzz", "keys": base / "keys"}


def frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return _LENGTHS.pack(len(head), len(payload)) + head + payload


def split_frames(data: bytes) -> list[tuple[bytes, bytes]] | None:
    """The frames of a stream, or None when it is not a clean sequence of whole frames."""
    frames = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 8:
            return None
        head_len, payload_len = _LENGTHS.unpack_from(data, pos)
        end = pos + 8 + head_len + payload_len
        if end > len(data) or head_len > MAX_LEN:
            return None
        frames.append((data[pos + 8 : pos + 8 + head_len], data[pos + 8 + head_len : end]))
        pos = end
    return frames


def join_frames(frames: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(_LENGTHS.pack(len(h), len(p)) + h + p for h, p in frames)


def pack_parts(parts: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in parts)


def unpack_parts(data: bytes) -> list[bytes]:
    """Lenient: a part whose length runs past the end takes what is left."""
    parts = []
    pos = 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        parts.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return parts


class Seeds:
    """Valid inputs for every target, made by the project's own encoders."""

    def __init__(self, world: dict[str, Path]):
        from paramedic.db.locate import resolve_database
        from paramedic.ship.blast_codec import BlastJobSetup, BlastMetadataCodec
        from paramedic.ship.codecs import CompressedCodec, DirectCodec

        database, manifest = resolve_database(str(world["replica"]), Path.cwd())
        self.database = database
        self.manifest_sha256 = manifest.checksum()
        queries = [tuple(q) for q in json.loads((world["base"] / "queries.json").read_text())]
        setup = BlastJobSetup(
            program="blastp",
            options=["-outfmt", "6", "-evalue", "10"],
            db_arg="db/fuzz",
            manifest_sha256=self.manifest_sha256,
            pieces=(range(0, 2), range(2, 3)),
            queries=queries,
        )
        self.blast_setup, self.blast_payload = setup.encode()
        self.blast_setup["out"] = "res/hits.tsv"
        codec = BlastMetadataCodec()
        self.meta_chunks = [
            codec.encode((0, [[3, 5, 9], [17, 3]], database.nseq)),
            codec.encode((2, [[29, 3, 17]], database.nseq)),
        ]
        text = b"".join(b"query%d\tsubject%d\t99.5\t60\n" % (i, i * 7) for i in range(200))
        self.direct_chunks = [
            DirectCodec().encode((0, text[:3000])),
            DirectCodec().encode((3000, text[3000:])),
        ]
        self.compressed_chunks = [
            CompressedCodec().encode((0, text[:5000])),
            CompressedCodec().encode((5000, text[5000:])),
        ]
        self.text = text
        self.bombs = [(world["base"] / f"bomb-{i}.zst").read_bytes() for i in range(4)]

    # -- sessions of frames (targets frame, requests, server) -------------------------------------------
    def sessions(self) -> list[bytes]:
        sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
        out = [frame({"op": "hello", "version": 1}) + frame({"op": "ping"}, b"x" * 1000)]
        for codec, chunks, name in (
            ("direct", self.direct_chunks, "out/a.txt"),
            ("compressed", self.compressed_chunks, "out/sub/b.txt"),
        ):
            frames = [frame({"op": "open", "job": JOB, "codec": codec, "setup": {"out": name}})]
            for i, (header, payload) in enumerate(chunks):
                frames.append(
                    frame({**header, "op": "chunk", "job": JOB, "index": i, "sha256": sha(payload)}, payload)
                )
            frames.append(frame({"op": "keepalive", "job": JOB}))
            frames.append(
                frame(
                    {
                        "op": "finish",
                        "job": JOB,
                        "chunks": len(chunks),
                        "size": len(self.text),
                        "sha256": sha(self.text),
                    }
                )
            )
            out.append(b"".join(frames))
        open_blast = {"op": "open", "job": JOB2, "codec": "blast-metadata", "setup": self.blast_setup}
        frames = [frame(open_blast), frame({**open_blast, "with_setup": True}, self.blast_payload)]
        for i, (header, payload) in enumerate(self.meta_chunks):
            frames.append(
                frame({**header, "op": "chunk", "job": JOB2, "index": i, "sha256": sha(payload)}, payload)
            )
        frames.append(frame({"op": "finish", "job": JOB2, "chunks": 2}))
        out.append(b"".join(frames))
        out.append(
            frame({"op": "open", "job": JOB, "codec": "direct", "setup": {"out": "out/c.txt"}})
            + frame({"op": "cancel", "job": JOB})
        )
        out.append(  # a request the site does not know, for an open job
            frame({"op": "open", "job": JOB, "codec": "direct", "setup": {"out": "out/e.txt"}})
            + frame({"op": "status", "job": JOB, "chunks": 1})
        )
        bomb = self.bombs[3]  # 1 GiB of zeros in 32 KB, declared as a 530-byte chunk
        out.append(
            frame({"op": "open", "job": JOB, "codec": "compressed", "setup": {"out": "out/d.txt"}})
            + frame(
                {"op": "chunk", "job": JOB, "index": 0, "offset": 0, "length": 530, "sha256": sha(bomb)}, bomb
            )
            + frame({"op": "finish", "job": JOB, "chunks": 1, "size": 530})
        )
        return out

    # -- target setup: [setup JSON, payload] --------------------------------------------------------------
    def setups(self) -> list[bytes]:
        out = [pack_parts([json.dumps(self.blast_setup).encode(), self.blast_payload])]
        for bomb in self.bombs:
            out.append(pack_parts([json.dumps(self.blast_setup).encode(), bomb]))
        other = {
            **self.blast_setup,
            "options": ["-outfmt", "7 qseqid sseqid evalue", "-max_target_seqs", "5"],
        }
        out.append(pack_parts([json.dumps(other).encode(), self.blast_payload]))
        return out

    # -- target chunk: [codec name, header JSON, payload] ------------------------------------------------
    def chunks(self) -> list[bytes]:
        out = []
        for name, chunks in (
            ("direct", self.direct_chunks),
            ("compressed", self.compressed_chunks),
            ("blast-metadata", self.meta_chunks),
        ):
            for header, payload in chunks:
                out.append(pack_parts([name.encode(), json.dumps(header).encode(), payload]))
        out.append(
            pack_parts(
                [b"compressed", json.dumps({"offset": 0, "length": 4 * 2**20}).encode(), self.bombs[2]]
            )
        )
        out.append(
            pack_parts([b"compressed", json.dumps({"offset": 0, "length": 530}).encode(), self.bombs[3]])
        )
        return out

    # -- target inbox: [mode, entries...]; an entry is kind byte + name length byte + name + content ---------
    def inboxes(self, signer: Any) -> list[bytes]:
        sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
        out = []
        for signed in (False, True):

            def body(kind: str, fields: dict[str, Any], signed: bool = signed) -> bytes:
                if not signed:
                    return json.dumps(fields).encode()
                return signer.envelope({**fields, "kind": kind, "job": JOB})

            for codec, chunks, setup, payload in (
                ("direct", self.direct_chunks, {"out": "in/a.txt"}, b""),
                ("blast-metadata", self.meta_chunks, self.blast_setup, self.blast_payload),
            ):
                opening = {"job": JOB, "codec": codec, "setup": setup, "setup_sha256": sha(payload)}
                entries = [entry(0, "open.json", body("open", opening)), entry(0, "setup.bin", payload)]
                for i, (header, chunk) in enumerate(chunks):
                    full = {**header, "index": i, "sha256": sha(chunk)}
                    entries += [
                        entry(0, f"chunk-{i}.bin", chunk),
                        entry(0, f"chunk-{i}.json", body("chunk", full)),
                    ]
                final = {"chunks": len(chunks)}
                if codec == "direct":
                    final.update(size=len(self.text), sha256=sha(self.text))
                entries.append(entry(0, "finish.json", body("finish", final)))
                out.append(pack_parts([b"S" if signed else b"U", *entries]))
            out.append(
                pack_parts(
                    [
                        b"S" if signed else b"U",
                        entry(
                            0,
                            "open.json",
                            body("open", {"job": JOB, "codec": "direct", "setup": {"out": "x"}}),
                        ),
                        entry(0, "setup.bin", b""),
                        entry(0, "cancel.json", body("cancel", {})),
                    ]
                )
            )
        out.append(
            pack_parts(
                [
                    b"U",
                    entry(2, "open.json", b""),
                    entry(1, "setup.bin", b"/etc/passwd"),
                    entry(3, "chunk-0.json", b""),
                    entry(4, "finish.json", b"99999999"),
                ]
            )
        )
        return out


def entry(kind: int, name: str, content: bytes) -> bytes:
    raw = name.encode(errors="surrogatepass")[:255]
    return bytes([kind, len(raw)]) + raw + content


def _zstd_bomb(size: int, json_like: bool = False) -> bytes:
    """A small zstd frame that inflates to `size` bytes (zeros, or a JSON query list of that size)."""
    import zstandard

    prefix, suffix = (b'[["q","', b'"]]') if json_like else (b"", b"")
    body = size - len(prefix) - len(suffix)
    chunk = (b"A" if json_like else b"\0") * (1 << 20)
    obj = zstandard.ZstdCompressor(level=3).compressobj(size=size)
    pieces = [obj.compress(prefix)]
    while body > 0:
        pieces.append(obj.compress(chunk[: min(body, len(chunk))]))
        body -= len(chunk)
    pieces += [obj.compress(suffix), obj.flush()]
    return b"".join(pieces)


def declare_sizes(blobs: list[bytes], plan: bytes) -> list[bytes]:
    """`plan` as 9-byte records (column index, declared size): each column's zstd frame rewritten to
    declare that size in an 8-byte field, its blocks kept (how a forger makes a bomb of any size)."""
    blobs = list(blobs)
    for at in range(0, len(plan) - 8, 9):
        index, size = struct.unpack_from("<BQ", plan, at)
        if blobs:
            i = index % len(blobs)
            blobs[i] = with_declared_size(blobs[i], size)
    return blobs


def with_declared_size(frame: bytes, size: int) -> bytes:
    """A zstd frame's header replaced by one declaring `size` (single segment, 8-byte field); not a frame:
    unchanged."""
    if len(frame) < 6 or frame[:4] != b"\x28\xb5\x2f\xfd":
        return frame
    descriptor = frame[4]
    fcs = {0: 1 if descriptor & 0x20 else 0, 1: 2, 2: 4, 3: 8}[descriptor >> 6]
    window = 0 if descriptor & 0x20 else 1
    dictionary = {0: 0, 1: 1, 2: 2, 3: 4}[descriptor & 3]
    blocks = frame[5 + window + dictionary + fcs :]
    keep = descriptor & 0x04  # the content checksum flag
    return frame[:4] + bytes([0xC0 | 0x20 | keep]) + struct.pack("<Q", size) + blocks


def json_objects(value: Any) -> int:
    """Every value a parse made (containers and scalars), counted without recursion."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


# -- the structure-aware mutator --------------------------------------------------------------------------

INTS = [0, 1, -1, 2, 3, 31, 32, 33, 255, 256, 4095, 65535, 65536, 999_999, 1_000_000, 2**20, 2**31 - 1, 2**31,
        2**32, 2**50, 2**53 + 1, 2**62, 2**63, 2**64, -(2**63), 10**30]  # fmt: skip
STRINGS = ["", "a", ".", "..", "../x", "../../outside/pwned", "/etc/passwd", "a/../b", "a//b", "./a", ".hidden",
           "a/.b", "a/", "/", "x" * 255, "x" * 212, "y" * 300, "é" * 200, "\x00", "a\x00b", "a\nb", "a\\b", "\ud800",
           "\udcff.txt", "💥" * 64, "con", "out/" * 300, "-outfmt", "-out", "-query", "-db", "6", "0", "5", "11",
           "13", "abc", "1e-5", "-1", "blastp", "blastn", "tblastx", "direct", "compressed", "blast-metadata",
           "open", "chunk", "finish", "cancel", "keepalive", "hello", "ping", JOB, JOB.upper(), JOB[:-1], "0" * 64,
           "q" * 70000]  # fmt: skip
KEYS = ["op", "job", "codec", "setup", "with_setup", "index", "sha256", "offset", "length", "chunks", "size",
        "first_query", "n_queries", "program", "options", "db_arg", "manifest_sha256", "pieces", "out", "kind",
        "setup_sha256", "message", "version", "body", "sig", "cert"]  # fmt: skip
OPTIONS = ["-outfmt", "6", "-outfmt", "5", "-outfmt", "0", "-outfmt", "7 qseqid sseqid", "-outfmt", "abc",
           "-outfmt", "", "-outfmt", "13", "-evalue", "1e-5", "-evalue", "abc", "-max_target_seqs", "0",
           "-max_target_seqs", "99999999999999999999", "-num_threads", "100000", "-out", "/tmp/x", "-query",
           "/etc/passwd", "-html", "-seg", "yes", "-export_search_strategy", "/tmp/s", "-subject", "x",
           "-num_descriptions", "-1", "-num_alignments", "x", "-remote", "--", "-", "-outfmt 6"]  # fmt: skip


def random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.05:  # giant strings: as UTF-8 they fit in a header, JSON-escaped in a reply they may not
        return rng.choice(["é", "\u2603", "x", "\U0001f4a5", "\x00"]) * rng.choice(
            [1000, 11000, 20000, 40000]
        )
    if roll < 0.3:
        return rng.choice(INTS)
    if roll < 0.6:
        return rng.choice(STRINGS)
    if roll < 0.65:
        return rng.choice([True, False, None, 0.5, -0.0, 1e308, float("inf"), float("nan")])
    if roll < 0.72:
        return "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(1, 20)))
    if depth > 3 or roll < 0.8:
        return [] if rng.random() < 0.5 else {}
    if roll < 0.9:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(1, 4))]
    return {rng.choice(KEYS): random_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}


def _nodes(value: Any) -> list[tuple[Any, Any]]:
    """(container, key) for every element inside `value` (iteratively: values may be deep)."""
    found = []
    stack = [value]
    while stack and len(found) < 2000:
        item = stack.pop()
        keys = list(item) if isinstance(item, dict) else range(len(item)) if isinstance(item, list) else ()
        for k in keys:
            found.append((item, k))
            if isinstance(item[k], dict | list):
                stack.append(item[k])
    return found


def mutate_json_value(value: Any, rng: random.Random) -> Any:
    """One structural change to a parsed JSON value (in place where possible)."""
    nodes = _nodes(value)
    roll = rng.random()
    if not nodes or roll < 0.04:
        return random_value(rng)
    if roll < 0.1:  # deep nesting around the whole, just within and beyond the decoders' bound
        depth = rng.choice([30, 31, 32, 33, 60, 500])
        for _ in range(depth):
            value = [value] if rng.random() < 0.5 else {"setup": value}
        return value
    strings = [(c, k) for c, k in nodes if isinstance(c[k], str)]
    if roll < 0.16 and strings:  # a string field made giant (non-ASCII: JSON escapes multiply it)
        container, key = rng.choice(strings)
        container[key] = rng.choice(["é", "\u2603", "\U0001f4a5"]) * rng.choice([11000, 15000, 20000])
        return value
    container, key = rng.choice(nodes)
    old = container[key]
    if roll < 0.55:
        container[key] = random_value(rng)
    elif roll < 0.62:  # the same value as another type
        container[key] = {int: str, str: lambda v: [v], bool: int, type(None): str, float: int}.get(
            type(old), lambda v: None
        )(old)
    elif roll < 0.7:
        if isinstance(container, dict):
            del container[key]
        else:
            container.pop(key)
    elif roll < 0.78 and isinstance(container, dict):
        container[rng.choice(KEYS)] = random_value(rng)
    elif roll < 0.84 and isinstance(old, int) and not isinstance(old, bool):
        container[key] = old + rng.choice([-1, 1, -(2**31), 2**32, -old - 1, old * 1000])
    elif roll < 0.88 and isinstance(old, list):
        container[key] = old * rng.randint(2, 50) if old else [random_value(rng)]
    elif roll < 0.93 and isinstance(old, str):
        container[key] = (
            old + rng.choice(STRINGS)[:100] if rng.random() < 0.5 else old[: rng.randint(0, len(old))]
        )
    elif isinstance(container, list) and container is not value and rng.random() < 0.5:
        container.insert(rng.randint(0, len(container)), rng.choice(OPTIONS))
    else:
        other_container, other_key = rng.choice(nodes)
        container[key] = other_container[other_key]  # a value from elsewhere (may be an ancestor: cut)
        if container[key] is container:
            container[key] = None
    return value


def dump_json(value: Any, rng: random.Random) -> bytes:
    try:
        text = json.dumps(
            value, ensure_ascii=rng.random() < 0.5, separators=(",", ":") if rng.random() < 0.8 else None
        )
    except (RecursionError, ValueError, TypeError):
        text = "null"
    return text.encode("utf-8", errors="surrogatepass")


def mutate_json_text(data: bytes, rng: random.Random) -> bytes:
    """A change to a JSON document: structural when it parses, textual otherwise (or sometimes anyway)."""
    if rng.random() < 0.85:
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            value = None
        else:
            return dump_json(mutate_json_value(value, rng), rng)
    roll = rng.random()
    if roll < 0.2:  # nested far beyond any bound, as raw text
        n = rng.choice([33, 1000, 30000, 100000])
        opener, closer = (b"[", b"]") if rng.random() < 0.5 else (b'{"a":', b"}")
        return opener * n + data + closer * n
    if roll < 0.35:
        pos = rng.randint(0, len(data))
        token = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-0", b"1" * 5000, b'"\\ud800"',
                            b'"\\u0000"', b"\xef\xbb\xbf", b",", b":", b"{", b"}", b"[", b"]", b'"', b"\xff\xfe",
                            b'"op":"open",', b'"job":"' + JOB.encode() + b'",'])  # fmt: skip
        return data[:pos] + token + data[pos:]
    return mutate_bytes(data, rng)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4])):
        roll = rng.random()
        if roll < 0.3 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif roll < 0.45 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif roll < 0.6:
            del buf[rng.randint(0, len(buf)) :]
        elif roll < 0.7 and buf:
            i = rng.randrange(len(buf))
            del buf[i : i + rng.randint(1, 64)]
        elif roll < 0.8 and buf:
            i = rng.randrange(len(buf))
            j = rng.randrange(len(buf))
            buf[i:i] = buf[j : j + rng.randint(1, 256)]
        elif roll < 0.9:
            i = rng.randint(0, len(buf))
            buf[i:i] = bytes([rng.randrange(256)]) * rng.choice([1, 4, 100, 5000])
        elif len(buf) >= 4:
            i = rng.randrange(len(buf) - 3)
            buf[i : i + 4] = struct.pack(">I", rng.choice(INTS) & 0xFFFFFFFF)
    return bytes(buf)


def mutate_payload(payload: bytes, rng: random.Random) -> bytes:
    """A chunk or setup payload: zstd frames are inflated, changed and compressed again; metadata containers
    are re-sealed (SHA-256 trailer) after a change, so the parsers behind the checks are reached."""
    import zstandard

    roll = rng.random()
    if payload[:4] == b"(\xb5/\xfd" and roll < 0.4:  # a zstd frame
        raw = None
        try:  # only small frames: the mutator must not inflate the bombs itself
            if 0 <= zstandard.frame_content_size(payload) <= 1 << 20:
                raw = zstandard.ZstdDecompressor().decompress(payload, max_output_size=1 << 20)
        except zstandard.ZstdError:
            pass
        if raw is not None:
            changed = mutate_json_text(raw, rng) if raw[:1] in (b"[", b"{") else mutate_bytes(raw, rng)
            return zstandard.ZstdCompressor(level=rng.choice([1, 3, 19])).compress(changed)
    if payload[:4] == b"PMDS" and len(payload) > 32 and roll < 0.6:
        body = mutate_bytes(payload[:-32], rng)
        return body + hashlib.sha256(body).digest()
    return mutate_bytes(payload, rng)


def reseal_chunk(header: Any, payload: bytes) -> Any:
    if isinstance(header, dict) and "sha256" in header:
        header["sha256"] = hashlib.sha256(payload).hexdigest()
    return header


def mutate_frames(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    frames = split_frames(data)
    if not frames:
        frames = split_frames(rng.choice(pool)) or []
        if rng.random() < 0.3:
            return mutate_bytes(data, rng)
    roll = rng.random()
    if roll < 0.45 and frames:  # a header's fields
        i = rng.randrange(len(frames))
        head, payload = frames[i]
        frames[i] = (mutate_json_text(head, rng), payload)
    elif roll < 0.65 and frames:  # a payload, usually re-sealed in its header
        i = rng.randrange(len(frames))
        head, payload = frames[i]
        payload = mutate_payload(payload, rng)
        if rng.random() < 0.8:
            try:
                head = json.dumps(reseal_chunk(json.loads(head), payload)).encode()
            except (ValueError, RecursionError):
                pass
        frames[i] = (head, payload)
    elif roll < 0.75 and frames:  # drop, repeat or reorder frames
        i = rng.randrange(len(frames))
        what = rng.random()
        if what < 0.4:
            frames.pop(i)
        elif what < 0.7:
            frames.insert(i, frames[i])
        else:
            j = rng.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
    elif roll < 0.82:  # a frame from another session
        other = split_frames(rng.choice(pool)) or []
        if other:
            frames.insert(rng.randint(0, len(frames)), rng.choice(other))
    elif roll < 0.92:  # a length field that lies
        stream = bytearray(join_frames(frames))
        starts, pos = [], 0
        for head, payload in frames:
            starts.append(pos)
            pos += 8 + len(head) + len(payload)
        if starts:
            at = rng.choice(starts) + rng.choice([0, 4])
            stream[at : at + 4] = struct.pack(
                ">I", rng.choice([0, 1, 7, 65536, 65537, 2**25, 2**25 + 1, 2**32 - 1, rng.randrange(2**16)])
            )
        return bytes(stream)
    else:  # truncated anywhere
        stream = join_frames(frames)
        return stream[: rng.randint(0, len(stream))]
    return join_frames(frames)


def mutate_parts(data: bytes, rng: random.Random, pool: list[bytes], kinds: list[str]) -> bytes:
    """Inputs made of parts (setup, chunk, inbox): mutate one part according to its kind."""
    parts = unpack_parts(data)
    if not parts or rng.random() < 0.03:
        parts = unpack_parts(rng.choice(pool))
    i = rng.randrange(len(parts))
    kind = kinds[min(i, len(kinds) - 1)]
    if kind == "json":
        parts[i] = mutate_json_text(parts[i], rng)
    elif kind == "payload":
        parts[i] = mutate_payload(parts[i], rng)
    elif kind == "codec":
        parts[i] = rng.choice([b"direct", b"compressed", b"blast-metadata", b"?x", b"?"])
    elif kind == "entry":
        parts = mutate_entries(parts, rng, pool)
    else:
        parts[i] = mutate_bytes(parts[i], rng)
    if rng.random() < 0.05:  # splice a part from another input
        other = unpack_parts(rng.choice(pool))
        if other:
            j = rng.randrange(len(other))
            if j < len(parts):
                parts[j] = other[j]
    return pack_parts(parts)


INBOX_NAMES = ["open.json", "setup.bin", "chunk-0.json", "chunk-0.bin", "chunk-1.json", "chunk-1.bin",
               "chunk-9999999.json", "chunk-00.json", "finish.json", "cancel.json", "done.json", "error.json",
               "ack-0", "progress.json", ".open.json.tmp", "chunk-1.json.tmp", "x" * 255]  # fmt: skip


def mutate_entries(parts: list[bytes], rng: random.Random, pool: list[bytes]) -> list[bytes]:
    """The files of an inbox job directory: change a file's content (JSON bodies structurally, signed
    bodies re-signed by the caller's hook), its kind (link, FIFO, directory, huge file) or its name."""
    mode, entries = parts[0], parts[1:]
    roll = rng.random()
    if not entries or roll < 0.05:
        entries.append(
            entry(rng.randrange(5), rng.choice(INBOX_NAMES), rng.choice([b"", b"{}", b"[]", b"/etc"]))
        )
    elif roll < 0.1:
        mode = b"U" if mode == b"S" else b"S"
    else:
        i = rng.randrange(len(entries))
        raw = entries[i]
        kind, name, content = (
            (raw[0], raw[2 : 2 + raw[1]], raw[2 + raw[1] :]) if len(raw) >= 2 else (0, b"x", b"")
        )
        what = rng.random()
        if what < 0.55:
            if name.endswith(b".json"):
                content = (
                    _mutate_signed(content, rng)
                    if mode == b"S" and rng.random() < 0.7
                    else mutate_json_text(content, rng)
                )
            else:
                content = mutate_payload(content, rng)
        elif what < 0.7:
            kind = rng.randrange(5)
            if kind == 4:
                content = str(rng.choice([0, 65536, 65537, 2**25, 2**25 + 1, 2**33])).encode()
        elif what < 0.8:
            name = rng.choice(INBOX_NAMES).encode()
        elif what < 0.9:
            entries.pop(i)
            return [mode, *entries]
        else:
            entries.insert(i, raw)
        entries[i] = bytes([kind % 256, len(name[:255])]) + name[:255] + content
    return [mode, *entries]


RESIGN: Any = None  # set by the inbox target: re-signs a mutated body with a compute site's key


def _mutate_signed(content: bytes, rng: random.Random) -> bytes:
    try:
        outer = json.loads(content)
        body = json.loads(outer["body"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return mutate_json_text(content, rng)
    roll = rng.random()
    if roll < 0.6 and RESIGN is not None:  # a valid signature over a hostile body
        changed = mutate_json_value(body, rng)
        if not isinstance(changed, dict) or rng.random() < 0.2:
            return RESIGN(changed)
        return RESIGN(changed)
    if roll < 0.8:  # the envelope itself: signature, certificate
        key = rng.choice(["sig", "cert", "body"])
        value = outer.get(key, "")
        if isinstance(value, str) and value:
            pos = rng.randrange(len(value))
            outer[key] = (
                value[:pos]
                + rng.choice(["A", "=", "-----END CERTIFICATE-----\n", "\n", "é", ""])
                + value[pos + 1 :]
            )
        return json.dumps(outer).encode()
    return dump_json(mutate_json_value(outer, rng), rng)


# -- in-process harness ------------------------------------------------------------------------------------


class FakeSocket:
    """A socket that hands out a byte stream in pieces of at most `piece` bytes, then EOF."""

    def __init__(self, data: bytes, piece: int):
        self.data = memoryview(data)
        self.pos = 0
        self.piece = piece

    def recv(self, n: int) -> bytes:
        part = self.data[self.pos : self.pos + min(n, self.piece)].tobytes()
        self.pos += len(part)
        return part

    def settimeout(self, _: float | None) -> None:
        pass


class InlinePool:
    """The store's I/O workers, run at once in the caller (deterministic; errors show where they happen)."""

    def submit(self, owner: str, call: Any) -> Future:
        """As site.fair.FairPool.submit (a call per compute site), run now."""
        future: Future = Future()
        try:
            future.set_result(call())
        except BaseException as exc:  # noqa: BLE001 (handed to the future, as the pool would)
            future.set_exception(exc)
        return future

    def running(self, owner: str) -> int:
        return 0

    def shutdown(self, **_: Any) -> None:
        pass


class Finding(Exception):
    """An execution broke a rule (a crash)."""


class Harness:
    def __init__(
        self,
        target: str,
        world: dict[str, Path],
        work: Path,
        out: Path,
        hang_seconds: float,
        executions: int = 0,
    ):
        self.target = target
        self.executions = executions  # libFuzzer exits after the last one, without a word to Python
        self.work = work
        self.out = out
        self.hang_seconds = hang_seconds
        self.stats = {"target": target, "executions": 0, "crashes": 0, "hangs": 0, "slowest_seconds": 0.0,
                      "outcomes": {}, "findings": []}  # fmt: skip
        self.signatures: set[str] = set()
        self.last_write = 0.0
        self.log_lines: list[str] = []
        self.seeds = Seeds(world)
        self.world = world
        getattr(self, f"_setup_{target}")()

    # -- per target set-up ----------------------------------------------------------------------------
    def _setup_frame(self) -> None:
        self.pool = self.seeds.sessions()
        self.kinds = None

    def _make_store(self) -> None:
        from paramedic.ship import blast_codec
        from paramedic.site import server as server_module
        from paramedic.site.server import ServeSettings, SiteServer

        def stub_regenerate(program, options, db, queries, subjects, workdir):
            from paramedic.blast.run import RunStats

            lines = b"".join(
                b"%s\tsubject%d\t100.0\n" % (q[0].split()[0].encode(), s)
                for q, ids in zip(queries, subjects, strict=True)
                for s in ids
            )
            return lines, RunStats(0.0, len(lines))

        blast_codec.regenerate = stub_regenerate
        server_module.log = self.log_lines.append
        self.site = self.work / "site"
        self.root = self.site / "root"
        self.state = self.site / "state"
        self.outside = self.site / "outside"
        for d in (self.root, self.state, self.outside):
            d.mkdir(parents=True, exist_ok=True)
        settings = ServeSettings(self.world["replica"], self.root, "127.0.0.1:0", None, state=self.state)
        self.server = SiteServer(settings)
        self.store = self.server.store
        self.store.log = self.log_lines.append
        self.store.pool.shutdown()  # site.fair.FairPool: its threads end
        self.store.pool = InlinePool()

    def _setup_requests(self) -> None:
        from paramedic.ship.wire import ProtocolError
        from paramedic.site.store import JobFailed

        self._make_store()
        handle = self.server._handle
        self.escaped: BaseException | None = None

        def traced(*args: Any) -> dict[str, Any]:  # keeps what the server would log as an internal error
            try:
                return handle(*args)
            except (ProtocolError, JobFailed, OSError):
                raise
            except Exception as exc:
                self.escaped = exc
                raise

        self.server._handle = traced
        self.pool = self.seeds.sessions()
        self.kinds = None

    def _setup_inbox(self) -> None:
        global RESIGN
        from paramedic.ship.signing import Signer
        from paramedic.site.inbox import InboxWatcher

        self._make_store()
        self.inbox = self.site / "inbox"
        self.inbox.mkdir()
        keys = self.world["keys"]
        self.watchers = {
            b"U": InboxWatcher(self.inbox, self.store, self.log_lines.append),
            b"S": InboxWatcher(self.inbox, self.store, self.log_lines.append, keys / "server"),
        }
        client = Signer(keys / "compute-a")

        def resign(body: Any) -> bytes:
            text = json.dumps(body, separators=(",", ":"), sort_keys=True)
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.asymmetric import ec

            signature = client.key.sign(text.encode(), ec.ECDSA(hashes.SHA256()))
            return json.dumps(
                {"body": text, "sig": base64.b64encode(signature).decode(), "cert": client.cert_pem}
            ).encode()

        RESIGN = resign
        self.pool = self.seeds.inboxes(client)
        self.kinds = ["mode", "entry"]

    def _setup_setup(self) -> None:
        from paramedic.ship.blast_codec import BlastMetadataCodec
        from paramedic.site.store import Replica

        self.replica = Replica(self.seeds.database, self.seeds.manifest_sha256, self.work)
        self.codec = BlastMetadataCodec()
        self.pool = self.seeds.setups()
        self.kinds = ["json", "payload"]

    def _setup_chunk(self) -> None:
        self._setup_setup()
        from paramedic.ship import blast_codec

        blast_codec.regenerate = lambda *a: (b"", None)
        self.context = self.codec.prepare(self.seeds.blast_setup, self.seeds.blast_payload, self.replica)
        self.pool = self.seeds.chunks()
        self.kinds = ["codec", "json", "payload"]

    def _setup_journal(self) -> None:
        from paramedic.blast.hits import FragmentSearch, Hit
        from paramedic.engine.rank.journal import PIECE_MAGIC, Journal
        from paramedic.engine.rank.store import Store

        self.jstore = Store(self.work / "search", durable=False, key=b"k" * 32)
        self.jstore.path.mkdir()
        self.journal = Journal.__new__(Journal)
        self.journal.path, self.journal.key = self.work, b"k" * 32
        (self.work / "piece").mkdir()
        pool = []
        for n in range(3):
            hits = [
                [Hit(1e-5 * (i + 1), 50 - i, 7 * q + i, b"aln %d" % i) for i in range(n + q)]
                for q in range(3)
            ]
            self.jstore.put(0, 0, FragmentSearch(hits, [None] * 3))
            record = self.jstore.record(0, 0).read_bytes()
            piece = PIECE_MAGIC + self.journal._piece_tag(0, b"report %d" % n) + b"report %d" % n
            pool.append(pack_parts([record, piece, b"", b"reseal"]))
        # a real journal's header and a piece tagged with its key: each execution opens a journal made
        # of them, its job.json mutated (the identity and plan it was made with are this search's)
        from paramedic.engine.core.scheduler import Plan
        from paramedic.engine.rank import journal as journal_module

        journal_module._warn = lambda text: None  # a dropped header says so on stderr: not here
        self.jplan = Plan(batches=(range(0, 2),), n_fragments=2, pieces=(range(0, 2),), hitlist_size=5)
        self.jidentity = {"program": "blastp", "options": ["-evalue", "1e-5"], "queries": "ab" * 32}
        made = self.work / "made" / ".out.journal"
        made.parent.mkdir()
        journal, _, _ = Journal.open(made, self.jidentity, self.jplan, restart=False)
        journal.piece_done(0, b"report")
        journal.close(complete=False)
        self.jpiece = (made / "piece" / "0").read_bytes()
        header = (made / "job.json").read_bytes()
        pool += [pack_parts([b"", b"", header, b"reseal"]), pack_parts([b"", b"", header, b""])]
        self.pool = pool
        self.kinds = ["bytes", "bytes", "json", "bytes"]

    def _setup_metadata(self) -> None:
        from paramedic.engine.rank.metadata import SearchIdentity, save_metadata

        self.identity = SearchIdentity("blastp", ["-evalue", "1e-5"], 500, "a" * 64, "b" * 64)
        os.environ["PARAMEDIC_METADATA_KEY"] = str(self.work / "metadata.key")  # the user's key: not ~'s
        self.sealed = [[[1, 2, 3][: n + 1], [], [4]] for n in range(3)]
        pool = []
        for n in range(3):
            save_metadata(self.work / "m.json", self.identity, self.sealed[n])
            pool.append(pack_parts([(self.work / "m.json").read_bytes(), b"reseal" if n else b""]))
        self.pool = pool
        self.kinds = ["json", "bytes"]

    def _setup_replica(self) -> None:
        from paramedic.db.manifest import load_manifest
        from paramedic.ship.replica_client import TlsReplica

        manifest = load_manifest(self.world["replica"])
        self.tls_replica = TlsReplica.__new__(TlsReplica)
        self.tls_replica._label = "tls://fuzz:7700/db"
        self.volume = manifest.fragments[0].volume
        text = manifest.to_json().encode()
        self.pool = [
            pack_parts([json.dumps({"op": "replica_manifest", "manifest_sha256": manifest.checksum()}).encode(),
                        text, b"manifest"]),
            pack_parts([json.dumps({"op": "volume_files", "files": [[f"{self.volume}.psq", 4096],
                        [f"{self.volume}.pin", 300]]}).encode(), b"", b"files"]),
            pack_parts([json.dumps({"op": "data", "name": f"{self.volume}.psq", "offset": 0, "length": 5}).encode(),
                        b"abcde", b"read"]),
        ]  # fmt: skip
        self.kinds = ["json", "bytes", "bytes"]

    def _setup_stage(self) -> None:
        from paramedic.db.manifest import load_manifest
        from paramedic.db.replicas import LocalReplica
        from paramedic.db.stripes import ReplicaSet

        self.stage_manifest = load_manifest(self.world["replica"])
        self.stage_replicas = lambda: ReplicaSet([LocalReplica(self.world["replica"])])
        self.stage_root = self.work / "stage"
        self._stage_build()
        place = self.stage_root / self.stage_place
        files = sorted(p.name for p in place.iterdir() if p.name != ".seal")
        seal = (place / ".seal").read_bytes()
        self.stage_files = files
        self.pool = [pack_parts([b"", name.encode(), (place / name).read_bytes()]) for name in files]
        self.pool += [pack_parts([seal, b"", b""]), pack_parts([b"", b"", b""])]
        self.pool += [
            pack_parts([b"", name.encode(), (place / name).read_bytes(), b"warm"]) for name in files
        ]
        self.kinds = ["json", "bytes", "bytes"]

    def _setup_prelim(self) -> None:
        """Valid shim records for queries of 60, 6000, 6000 and 60 residues (blastp batches [0-2], [3])."""

        def batch(magic: int, queries: int, lists: list[tuple[int, list[tuple[int, int, float]]]]) -> bytes:
            out = struct.pack("=Iii", magic, queries, len(lists))
            for q, entries in lists:
                out += struct.pack("=iii", q, 1050, len(entries))
                out += b"".join(struct.pack("=iid", *e) for e in entries)
            return out

        def lists(queries: int, heads: list[tuple[int, int, int]]) -> bytes:
            out = struct.pack("=Iiii", 0x50524C48, queries, len(heads), 0)
            for q, oid, hsps in heads:
                out += struct.pack("=iiii", q, oid, 10, hsps) + bytes(72 * hsps)
            return out

        found = batch(0x50524C31, 3, [(0, [(3, 50, 1e-5), (7, 40, 0.1)]), (2, [(9, 30, 2.0)])])
        skipped = struct.pack("=Iii", 0x50524C4B, 1, 0)
        self.pool = [
            pack_parts([found + skipped, lists(3, [(0, 3, 1), (2, 9, 2)]) + lists(1, [])]),
            pack_parts([struct.pack("=Iii", 0x50524C4B, 3, 0) + batch(0x50524C31, 1, []), lists(3, [])]),
            pack_parts([struct.pack("=Iii", 0x50524C53, 0, 0) + found, b""]),
        ]
        self.kinds = ["bytes", "bytes"]

    def _setup_tracemeta(self) -> None:
        """Real metadata of small traces (periodic and general), as [header JSON, declared sizes, columns...]."""
        sys.path.insert(0, str(REPO))
        from paramedic.trace import codec
        from tests.unit.test_trace_codec import make_trace, periodic_kinds

        traces = [
            make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)], period=9),
            make_trace([periodic_kinds(0, 40)], period=5),
        ]
        self.pool = []
        for data in traces:
            header, blobs = codec.parse_header(codec.encode(data, check=False).data, len(data))
            self.pool.append(pack_parts([json.dumps(header).encode(), b"", *blobs]))
            # the bomb: the first column declares 1 GiB (its frame rewritten, its blocks kept)
            self.pool.append(
                pack_parts([json.dumps(header).encode(), struct.pack("<BQ", 0, 1 << 30), *blobs])
            )
        self.kinds = ["json", "bytes", "payload"]

    # tracemeta: metadata weighed as the site weighs it, then rebuilt within that weight
    def _run_tracemeta(self, data: bytes) -> str:
        from paramedic.errors import ParamedicError
        from paramedic.ship.wire import ProtocolError, loads_json
        from paramedic.trace import codec

        parts = unpack_parts(data)
        if len(parts) < 3:
            return "too few parts"
        try:
            header = loads_json(parts[0], "header")
        except ProtocolError:
            return "header not JSON"
        if not isinstance(header, dict):
            return "header not an object"
        blobs = declare_sizes(parts[2:], parts[1])
        meta = codec._frame(header, blobs)
        try:
            need = codec.decode_memory(meta, max_size=1 << 24)
            if need > 256 << 20:  # the site's --trace-memory would refuse it
                return "over the budget"
            rebuilt = codec.decode(meta, max_size=1 << 24, deadline=time.monotonic() + self.hang_seconds)
        except ParamedicError as exc:  # what the site's trace codec turns into a refusal (ship/trace_codec)
            return (
                "refused: "
                + re.sub(r"\d+|'[^']*'|\(.*\)", "N", str(exc).removeprefix("trace metadata: "))[:50]
            )
        if len(rebuilt) != header.get("size"):
            raise Finding(f"decode returned {len(rebuilt)} bytes for a file of {header.get('size')!r}")
        return "rebuilt"

    def _setup_values(self) -> None:
        """Setups' query lists, object bombs, and texts whose strings hold brackets and commas."""
        queries = json.loads((self.world["base"] / "queries.json").read_text())
        self.pool = [
            pack_parts([json.dumps(queries).encode()]),
            pack_parts([b"[" + b"[]," * 2000 + b"[]]"]),
            pack_parts([b'[["q[1],{2}","MKV"],["q\\"[,","AC"]]']),
            pack_parts([b'{"a":[{"b":[1,2,3]},"[[[,,,"],"c":{}}']),
            pack_parts([b"[" * 500 + b"]" * 500]),
        ]
        self.kinds = ["json"]

    # values: the count must bound the parse it lets through
    def _run_values(self, data: bytes) -> str:
        from paramedic.ship.codecs import check_json_values
        from paramedic.ship.wire import ProtocolError

        text = (unpack_parts(data) or [b""])[0]
        bound = 1000
        try:
            check_json_values(text, bound, "fuzz")
        except ProtocolError:
            return "refused"
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return "passed, not JSON"
        objects = json_objects(value)
        if objects > 2 * bound + 1:
            raise Finding(f"a text passed at {bound} values parsed into {objects} objects")
        return "parsed"

    # -- mutation ------------------------------------------------------------------------------------
    def mutate(self, data: bytes, max_size: int, seed: int) -> bytes:
        import atheris

        rng = random.Random(seed)
        try:
            roll = rng.random()
            if roll < 0.05:  # libFuzzer's own mutations, on the whole input
                return atheris.Mutate(data, max_size)
            if roll < 0.2:  # ... on one part of it (a frame's header or payload, a file), the rest kept
                pieces = split_frames(data) if self.kinds is None else unpack_parts(data)
                if pieces:
                    i = rng.randrange(len(pieces))
                    if self.kinds is None:
                        head, payload = pieces[i]
                        if rng.random() < 0.6:
                            pieces[i] = (atheris.Mutate(head, 2 * len(head) + 64), payload)
                        else:
                            pieces[i] = (head, atheris.Mutate(payload, 2 * len(payload) + 64))
                        return join_frames(pieces)[:max_size]
                    pieces[i] = atheris.Mutate(pieces[i], 2 * len(pieces[i]) + 64)
                    return pack_parts(pieces)[:max_size]
            if self.kinds is None:
                out = mutate_frames(data, rng, self.pool)
            else:
                out = mutate_parts(data, rng, self.pool, self.kinds)
        except Exception:  # noqa: BLE001 (a mutator bug must not stop the run: fall back to libFuzzer's)
            return atheris.Mutate(data, max_size)
        return out[:max_size]

    def crossover(self, data1: bytes, data2: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if self.kinds is None:
            a, b = split_frames(data1) or [], split_frames(data2) or []
            if a or b:
                return join_frames(a[: rng.randint(0, len(a))] + b[rng.randint(0, len(b)) :])[:max_size]
        else:
            a, b = unpack_parts(data1), unpack_parts(data2)
            if a and b:
                cut = rng.randint(1, max(1, min(len(a), len(b))))
                return pack_parts(a[:cut] + b[cut:])[:max_size]
        cut1, cut2 = rng.randint(0, len(data1)), rng.randint(0, len(data2))
        return (data1[:cut1] + data2[cut2:])[:max_size]

    # -- one execution -------------------------------------------------------------------------------
    def one(self, data: bytes) -> None:
        start = time.perf_counter()
        outcome = "?"
        try:
            outcome = getattr(self, f"_run_{self.target}")(data)
        except Finding as exc:
            self._record("crash", data, str(exc))
        except Exception as exc:  # noqa: BLE001 (not one of the declared errors: a crash)
            self._record("crash", data, f"{type(exc).__name__}: {exc}", exc)
        finally:
            elapsed = time.perf_counter() - start
            self.stats["executions"] += 1
            self.stats["slowest_seconds"] = max(self.stats["slowest_seconds"], round(elapsed, 4))
            outcomes = self.stats["outcomes"]
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if elapsed > self.hang_seconds:
                self._record("hang", data, f"one execution took {elapsed:.2f} s")
            n = self.stats["executions"]
            if n == self.executions or n % 500 == 0 or time.monotonic() - self.last_write > 1.0:
                self.write_stats()

    def _record(self, kind: str, data: bytes, message: str, exc: BaseException | None = None) -> None:
        where = ""
        if exc is not None:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if "paramedic" in f.filename]
            if frames:
                where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}"
        signature = f"{kind}: {re.sub(r'[0-9]+', 'N', message.split(':')[0])[:80]}{where}"
        self.stats["crashes" if kind == "crash" else "hangs"] += 1
        if signature not in self.signatures:
            self.signatures.add(signature)
            name = f"{kind}-{self.target}-{hashlib.sha1(data).hexdigest()[:12]}"
            (self.out / name).write_bytes(data)
            detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
            self.stats["findings"].append(
                {"signature": signature, "message": message[:500], "input": name, "traceback": detail[-3000:]}
            )
        self.write_stats()

    def write_stats(self) -> None:
        self.last_write = time.monotonic()
        path = self.out / f"stats-{self.target}.json"
        path.with_suffix(".tmp").write_text(json.dumps(self.stats, indent=1))
        os.replace(path.with_suffix(".tmp"), path)

    # frame: the parser alone
    def _run_frame(self, data: bytes) -> str:
        from paramedic.ship.wire import MAX_PAYLOAD_BYTES, FrameDeadlines, ProtocolError, recv_frame

        digest = hashlib.sha1(data).digest()
        pieces = [1, 3, 8, 1000, 1 << 20] if len(data) < 4096 else [1000, 1 << 20]
        sock = FakeSocket(data, pieces[digest[0] % len(pieces)])
        deadlines = FrameDeadlines(idle=5, frame=5) if digest[1] % 2 else None
        n = 0
        while True:
            try:
                header, payload = recv_frame(sock, deadlines)  # type: ignore[arg-type]
            except ProtocolError as exc:
                return f"{n} frames, then {type(exc).__name__}"
            if not isinstance(header, dict) or not isinstance(header.get("op"), str):
                raise Finding("recv_frame returned a header that is not an object with an op")
            if len(payload) > MAX_PAYLOAD_BYTES:
                raise Finding("recv_frame returned a payload over its bound")
            n += 1

    # requests: each frame of a session through the server's request handler
    def _run_requests(self, data: bytes) -> str:
        from paramedic.ship.wire import MAX_HEADER_BYTES, ProtocolError, recv_frame

        sock = FakeSocket(data, 1 << 20)
        replies = []
        self.escaped = None
        try:
            for _ in range(16):
                try:
                    header, payload = recv_frame(sock)  # type: ignore[arg-type]
                except ProtocolError:
                    break
                reply = self.server._answer("compute-a", header, payload)  # as the server answers
                if self.escaped is not None:  # not a refusal: raised again here, with its traceback
                    escaped, self.escaped = self.escaped, None
                    raise escaped
                encoded = json.dumps(reply, separators=(",", ":")).encode()
                if len(encoded) > MAX_HEADER_BYTES:
                    raise Finding(
                        f"reply of {len(encoded)} bytes does not fit in a frame (op {str(header.get('op'))[:20]!r})"
                    )
                replies.append(reply["op"])
                if reply["op"] == "error":
                    break
            self._check_site()
        finally:
            self._reset_site()
        return "+".join(replies[-3:]) or "no frame"

    def _check_site(self) -> None:
        bad = [line for line in self.log_lines if "internal error" in line or "Traceback" in line]
        if bad:
            raise Finding(f"logged: {bad[0][:300]}")
        if any(self.outside.iterdir()) or any(
            p.name not in ("root", "state", "outside", "inbox") for p in self.site.iterdir()
        ):
            raise Finding("a file was written outside the site's root and state")

    def _reset_site(self) -> None:
        self.log_lines.clear()
        store = self.store
        with store.lock:
            store.jobs.clear()
        with store.targets_lock:
            store.targets.clear()
        for directory in (self.root, self.state, self.outside):
            for path in directory.iterdir():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()

    # inbox: a job directory as the watcher finds it
    def _run_inbox(self, data: bytes) -> str:
        parts = unpack_parts(data)
        if not parts:
            return "empty"
        watcher = self.watchers.get(parts[0], self.watchers[b"U"])
        job_dir = self.inbox / JOB
        try:
            job_dir.mkdir()
            for raw in parts[1:9]:
                if len(raw) < 2:
                    continue
                kind, name, content = raw[0], raw[2 : 2 + raw[1]], raw[2 + raw[1] :]
                if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
                    continue
                path = os.path.join(os.fsencode(job_dir), name)
                if os.path.lexists(path):
                    continue
                if kind % 5 == 0:
                    with open(path, "wb") as fh:
                        fh.write(content)
                elif kind % 5 == 1:
                    os.symlink(content[:200].replace(b"\0", b"") or b"x", path)
                elif kind % 5 == 2:
                    os.mkfifo(path)
                elif kind % 5 == 3:
                    os.mkdir(path)
                else:  # a sparse file of the given size (up to 8 GiB)
                    with open(path, "wb") as fh:
                        digits = re.match(rb"\d{1,10}", content)
                        fh.truncate(min(int(digits.group()) if digits else 0, 2**33))
            done = watcher._look_into(JOB)
            self._check_site()
            if any(p.name != JOB for p in self.inbox.iterdir()):
                raise Finding("the watcher wrote outside the job's directory")
            if not job_dir.exists():
                return "ended: removed (cancelled)"
            names = os.listdir(job_dir)
            if "done.json" in names:
                return "ended: done"
            said = [
                line.split(": ", 1)[-1] for line in self.log_lines if line.startswith(f"inbox job {JOB}: ")
            ]
            if "error.json" in names:  # why, without the variable parts
                return "ended: error: " + re.sub(r"\d+|'[^']*'", "N", said[-1] if said else "?")[:50]
            acks = sum(n.startswith("ack-") for n in names)
            return f"{'pending' if done else 'ended'}: {acks} acks" + (
                ", progress" if "progress.json" in names else ""
            )
        finally:
            for name in ("finished", "waiting"):
                getattr(watcher, name).clear()
            watcher.progress.clear()
            shutil.rmtree(job_dir, ignore_errors=True)
            self._reset_site()

    # setup: a BlastJobSetup as the storage site decodes it
    def _run_setup(self, data: bytes) -> str:
        from paramedic.ship.wire import ProtocolError, loads_json

        parts = unpack_parts(data) + [b"", b""]
        try:
            setup = loads_json(parts[0], "setup")
            if not isinstance(setup, dict):
                return "setup not an object"
            context = self.codec.prepare(setup, parts[1], self.replica)
        except ProtocolError as exc:
            return "refused: " + re.sub(r"\d+|'[^']*'", "N", str(exc).removeprefix("setup: "))[:50]
        if len(context.queries) < 1 or context.pieces[-1].stop != len(context.queries):
            raise Finding("prepare accepted a setup whose pieces do not cover its queries")
        return "accepted"

    # chunk: one chunk through its codec's unpack and decode
    def _run_chunk(self, data: bytes) -> str:
        import dataclasses

        from paramedic.errors import ParamedicError
        from paramedic.ship.codecs import RANGE_CHUNK_BYTES
        from paramedic.ship.idcodec import IdHistory
        from paramedic.ship.registry import make_codec
        from paramedic.ship.wire import ProtocolError, loads_json

        parts = unpack_parts(data) + [b"", b"", b""]
        name = "?"
        try:
            # a known name; junk names only behind "?" (otherwise most inputs would test make_codec alone)
            wanted = parts[0].decode(errors="replace")
            known = ("direct", "compressed", "blast-metadata")
            if wanted not in known and not wanted.startswith("?"):
                wanted = known[sum(parts[0]) % len(known)]
            codec = make_codec(wanted)
            name = codec.name
            header = loads_json(parts[1], "chunk header")
            if not isinstance(header, dict):
                return "header not an object"
            context = None
            if codec.name == "blast-metadata":
                history = IdHistory()
                context = dataclasses.replace(self.context, history=history)
                if header.get("first_query") == 2:  # the second chunk of the job: the first one's ids first
                    codec.unpack({}, self.seeds.meta_chunks[0][1], context)
            unpacked = codec.unpack(header, parts[2], context)
            segments = codec.decode(header, unpacked, context)
        except (ProtocolError, ParamedicError, OSError, ValueError) as exc:
            return f"{name} refused: " + re.sub(r"\d+|'[^']*'", "N", str(exc))[:40]
        for seg in segments:
            if codec.layout == "ranges" and len(seg.data) > RANGE_CHUNK_BYTES:
                raise Finding("a range decoded beyond its bound")
        return f"{codec.name} decoded"

    # journal: a search record and a report piece, as a resumed run reads them back
    def _run_journal(self, data: bytes) -> str:
        import hashlib as hashlib_
        import hmac

        from paramedic.engine.rank.store import MAGIC, TAG_BYTES, RecordError

        parts = unpack_parts(data) + [b"", b"", b"", b""]
        record, piece = parts[0], parts[1]
        if parts[3] == b"reseal" and record.startswith(MAGIC) and len(record) >= len(MAGIC) + TAG_BYTES + 8:
            at = len(MAGIC) + TAG_BYTES
            length = int.from_bytes(record[at : at + 8], "big")
            head = record[at + 8 : at + 8 + length]
            mac = hmac.new(self.jstore.key, b"0-0\0", hashlib_.sha256)
            mac.update(head)
            record = record[: len(MAGIC)] + mac.digest() + record[at:]
        self.jstore.record(0, 0).write_bytes(record)
        (self.work / "piece" / "0").write_bytes(piece)
        outcome = []
        try:
            found = self.jstore.keys(0, 0, 3, alignments=True)
            self.jstore.alignments((range(0, 3),), 1, 0, [[h.gid for h in q] for q in found.hits])
            outcome.append("record read")
        except RecordError as exc:
            outcome.append("record refused: " + re.sub(r"\d+|'[^']*'", "N", str(exc))[:30])
        try:
            self.journal._read_piece(0)
            outcome.append("piece read")
        except (ValueError, OSError):
            outcome.append("piece refused")
        if parts[2]:
            outcome.append(self._open_journal(parts[2], reseal=parts[3] == b"reseal"))
        return ", ".join(outcome)

    def _open_journal(self, header: bytes, reseal: bool) -> str:
        """`Journal.open` on a journal whose job.json is `header` (its piece 0 tagged with the key of the
        header it was mutated from): read (the piece replays), dropped, or refused with a UsageError."""
        import hashlib as hashlib_
        import shutil

        from paramedic.engine.rank.journal import CHECK_FIELD, Journal, _header_bytes
        from paramedic.errors import UsageError

        if reseal:
            try:
                fields = json.loads(header)
                if isinstance(fields, dict):
                    fields.pop(CHECK_FIELD, None)
                    header = _header_bytes(fields)
            except (ValueError, RecursionError, TypeError):
                pass
        path = self.work / "open" / ".out.journal"
        shutil.rmtree(path.parent, ignore_errors=True)
        for part in ("search", "piece"):
            (path / part).mkdir(parents=True, mode=0o700)
        path.chmod(0o700)
        (path / "piece" / "0").write_bytes(self.jpiece)
        (path / "job.json").write_bytes(header)
        try:
            journal, _, replay = Journal.open(path, self.jidentity, self.jplan, restart=False)
        except UsageError as exc:
            said = str(exc)
            why = next((w for w in ("another search", "another paramedic version", "not a paramedic journal",
                                    "does not fit") if w in said), said[:40])  # fmt: skip
            return f"header refused ({why})"
        journal.close(complete=True)
        if replay.empty:
            return "header dropped, or read with another key (its piece not replayed)"
        try:  # read: then its bytes are the ones its own digest names
            fields = json.loads(header)
            check = fields.pop(CHECK_FIELD)
            canonical = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        except (ValueError, RecursionError, TypeError, KeyError, AttributeError) as exc:
            raise Finding(f"a journal header that does not parse or has no digest was read ({exc})") from None
        if check != hashlib_.sha256(canonical).hexdigest():
            raise Finding("a journal header whose bytes fail their digest was read")
        return "header read"

    # prelim: the shim's records of a fragment search, read back (issue 23: skipped batches)
    def _run_prelim(self, data: bytes) -> str:
        from paramedic.blast.prelim import read_dump, whole_lists
        from paramedic.errors import BlastError

        parts = unpack_parts(data) + [b"", b""]
        outcome = []
        try:
            read = read_dump(parts[0], [60, 6000, 6000, 60], 10000, range(50))
            if len(read) != 4 or any(
                p is not None and not all(0 <= c.gid < 50 for c in p.candidates) for p in read
            ):
                raise Finding("a list outside the queries or the database")
            outcome.append("dump read")
        except BlastError as exc:
            outcome.append("dump refused: " + re.sub(r"\d+", "N", str(exc))[:40])
        try:
            whole_lists(parts[1], 4, range(50), "blastp")
            outcome.append("lists read")
        except BlastError:
            outcome.append("lists refused")
        return ", ".join(outcome)

    # metadata: a metadata file as --from-metadata reads it
    def _run_metadata(self, data: bytes) -> str:
        from paramedic.engine.rank.metadata import DIGEST, _digest, load_metadata
        from paramedic.errors import ParamedicError

        parts = unpack_parts(data) + [b"", b""]
        text = parts[0]
        if parts[1] == b"reseal":
            try:
                value = json.loads(text)
                if isinstance(value, dict):
                    value[DIGEST] = _digest(value)
                    text = json.dumps(value).encode()
            except (ValueError, RecursionError, TypeError):
                pass
        path = self.work / "m.json"
        path.write_bytes(text)
        try:
            subjects = load_metadata(path, self.identity, 3, 10)
        except ParamedicError as exc:
            return "refused: " + re.sub(r"\d+|'[^']*'|/\S+", "N", str(exc))[:40]
        if not all(type(g) is int and 0 <= g < 10 for s in subjects for g in s):
            raise Finding("a metadata file's ids out of range accepted")
        if subjects not in self.sealed:  # changed (and its SHA-256 recomputed) without the user's key
            raise Finding("a metadata file not sealed by the user's key accepted")
        return "accepted"

    # replica: a storage site's replies, as a mirroring compute site parses them
    def _run_replica(self, data: bytes) -> str:
        from paramedic.db.replicas import ReplicaError
        from paramedic.db.volume_listings import check_listing
        from paramedic.ship.wire import ProtocolError, loads_json

        parts = unpack_parts(data) + [b"", b"", b""]
        try:
            header = loads_json(parts[0], "reply")
        except ProtocolError:
            return "reply not JSON"
        if not isinstance(header, dict):
            return "reply not an object"
        replica = self.tls_replica
        replica._request = lambda _request: (header, parts[1])  # type: ignore[method-assign]
        op = parts[2].decode(errors="replace")
        try:
            if op == "manifest":
                replica.manifest()
            elif op == "files":
                listing = replica.volume_files(self.volume)
                check_listing(self.volume, listing, 10_000)
            else:
                got = replica.read(f"{self.volume}.psq", 0, 5)
                if len(got) != 5:
                    raise Finding("a read of the wrong length accepted")
        except ReplicaError as exc:
            return f"{op[:10]} refused: " + re.sub(r"\d+|'[^']*'", "N", str(exc))[:30]
        return f"{op[:10]} accepted"

    # stage: a published copy in a --stage cache, rewritten (times kept) before a search uses it
    def _run_stage(self, data: bytes) -> str:
        from paramedic.db.stage import SEAL_NAME, StageCache
        from paramedic.errors import ParamedicError

        parts = unpack_parts(data) + [b"", b"", b"", b""]
        place = self.stage_root / self.stage_place
        name = parts[1].decode(errors="replace")
        try:
            if name in self.stage_files:  # one file's bytes replaced in place: same inode, times put back
                target = place / name
                st = target.stat()
                with open(target, "r+b") as fh:
                    fh.write(parts[2])
                    fh.truncate()
                os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
            if parts[0]:  # else the seal stays as the cache wrote it (a file changed with its times kept)
                (place / SEAL_NAME).write_bytes(parts[0])
            try:
                # a new process (nothing digested yet), or, with a fourth part, the process that made the
                # copy and digested it: a change after that digest must be seen all the same (issue 23)
                cache = self.stage_warm if parts[3] else StageCache(self.stage_root)
                cache.stats.copies = 0
                with cache.use(self.stage_manifest, 0, self.world["replica"], self.stage_replicas) as used:
                    if used is None:
                        return "searched in place"
                    good = self._stage_good(used)
            except ParamedicError as exc:
                return "refused: " + re.sub(r"\d+|'[^']*'|/\S+", "N", str(exc))[:40]
            if not good:
                raise Finding("a staged copy that is not the manifest's was used")
            return "copy used" if cache.stats.copies == 0 else "copied again, then used"
        finally:
            if not self._stage_good(place) or not _sealed_copy(place):
                self._stage_build()

    def _stage_good(self, place: Path) -> bool:
        from paramedic.blast.alias import alias_bytes
        from paramedic.db.manifest import volume_sha256
        from paramedic.errors import ParamedicError

        m, info = self.stage_manifest, self.stage_manifest.fragments[0]
        try:
            alias = (place / f"{info.name}.pal").read_bytes()
            digest = volume_sha256(place, info.volume)
        except (OSError, ValueError, ParamedicError):
            return False
        return digest == info.sha256 and alias == alias_bytes(
            [info.volume], title=m.title, nseq=m.nseq, length=m.length
        )

    def _stage_build(self) -> None:
        """A cache holding fragment 0's published copy, made by a real copy."""
        from paramedic.db.stage import StageCache

        shutil.rmtree(self.stage_root, ignore_errors=True)
        cache = StageCache(self.stage_root)
        with cache.use(self.stage_manifest, 0, self.world["replica"], self.stage_replicas) as place:
            assert place is not None
            self.stage_place = place.relative_to(self.stage_root)
        self.stage_warm = cache  # it digested the copy it made: trusts it from now on, seal permitting


def _sealed_copy(place: Path) -> bool:
    from paramedic.db.stage import _sealed

    return _sealed(place)


def worker(args: argparse.Namespace) -> None:
    """One target under libFuzzer (this process exits when libFuzzer is done)."""
    import atheris

    with atheris.instrument_imports(include=["paramedic"]):
        import paramedic.blast.options  # noqa: F401
        import paramedic.blast.prelim  # noqa: F401
        import paramedic.db.stage  # noqa: F401
        import paramedic.db.stripes  # noqa: F401
        import paramedic.engine.rank.journal  # noqa: F401
        import paramedic.engine.rank.metadata  # noqa: F401
        import paramedic.engine.rank.store  # noqa: F401
        import paramedic.ship.blast_codec  # noqa: F401
        import paramedic.ship.codecs  # noqa: F401
        import paramedic.ship.idcodec  # noqa: F401
        import paramedic.ship.replica_client  # noqa: F401
        import paramedic.ship.signing  # noqa: F401
        import paramedic.ship.wire  # noqa: F401
        import paramedic.site.inbox  # noqa: F401
        import paramedic.site.safefs  # noqa: F401
        import paramedic.site.server  # noqa: F401
        import paramedic.site.store  # noqa: F401
        import paramedic.trace.codec  # noqa: F401
    world = {"base": args.world, "replica": args.world / "db" / "fuzz", "keys": args.world / "keys"}
    work = Path(tempfile.mkdtemp(prefix=f"fuzz-{args.worker}-", dir=args.scratch))
    harness = Harness(args.worker, world, work, args.out, args.hang_seconds, args.executions)
    corpus = work / "corpus"
    corpus.mkdir()
    for i, data in enumerate(harness.pool):
        (corpus / f"seed-{i}").write_bytes(data)
    harness.write_stats()
    libfuzzer = [sys.argv[0], f"-runs={args.executions}", f"-seed={args.seed}", f"-max_total_time={int(args.seconds)}",
                 f"-timeout={int(args.kill_seconds)}", f"-rss_limit_mb={args.rss_mb}", f"-max_len={MAX_LEN}",
                 "-print_final_stats=1", "-print_pcs=0", f"-artifact_prefix={args.out}/libfuzzer-{args.worker}-",
                 str(corpus)]  # fmt: skip
    atheris.Setup(libfuzzer, harness.one, custom_mutator=harness.mutate, custom_crossover=harness.crossover)
    atheris.Fuzz()


# -- the real server -------------------------------------------------------------------------------------


def run_server_target(args: argparse.Namespace, world: dict[str, Path]) -> dict[str, Any]:
    """Mutated sessions against a real `paramedic serve` over TLS 1.3; checks after every batch."""
    from paramedic.ship.client import SiteAddress, TlsShipper
    from paramedic.ship.codecs import DirectCodec

    rng = random.Random(args.seed)
    seeds = Seeds(world)
    pool = seeds.sessions()
    base = Path(tempfile.mkdtemp(prefix="fuzz-server-", dir=args.scratch))
    root = base / "root"
    root.mkdir()
    log_path = args.out / "server.log"
    argv = [str(BIN / "paramedic"), "serve", "--replica", str(world["replica"]), "--root", str(root),
            "--listen", "127.0.0.1:0", "--keys", str(world["keys"] / "server"), "--io-workers", "2"]  # fmt: skip
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, cwd=world["base"]
    )
    stats: dict[str, Any] = {"target": "server", "executions": 0, "crashes": 0, "hangs": 0, "frames": 0,
                             "slowest_reply_seconds": 0.0, "checks": 0, "outcomes": {}, "findings": []}  # fmt: skip
    start = time.monotonic()
    try:
        port = None
        while port is None and time.monotonic() - start < 60:
            match = re.search(r"listening on [^ ]*:(\d+) ", log_path.read_text(errors="replace"))
            port = int(match.group(1)) if match else None
            if proc.poll() is not None:
                raise SystemExit(f"paramedic serve exited {proc.returncode}: {log_path.read_text()}")
            time.sleep(0.05)
        assert port is not None, "paramedic serve did not listen"
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client = world["keys"] / "compute-a"
        ctx.load_verify_locations(cafile=str(client / "ca.pem"))
        ctx.load_cert_chain(client / "cert.pem", client / "key.pem")

        def session(data: bytes) -> tuple[str, float]:
            """Send a stream; read one reply per whole frame sent, until an error reply or the close."""
            frames = 0
            pos = 0
            while pos + 8 <= len(data):
                h, p = _LENGTHS.unpack_from(data, pos)
                if h == 0 or h > 65536 or p > 32 * 2**20 or pos + 8 + h + p > len(data):
                    break
                frames += 1
                pos += 8 + h + p
            slowest = 0.0
            replies = []
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                    tls.settimeout(args.reply_seconds)
                    sender = threading.Thread(target=_send_quietly, args=(tls, data), daemon=True)
                    sender.start()
                    from paramedic.ship.wire import ProtocolError, recv_frame

                    for _ in range(frames):
                        t0 = time.monotonic()
                        try:
                            reply, _ = recv_frame(tls)
                        except TimeoutError:
                            raise Finding(f"no reply within {args.reply_seconds} s") from None
                        except (ProtocolError, OSError):
                            replies.append("closed")
                            break
                        slowest = max(slowest, time.monotonic() - t0)
                        replies.append(str(reply.get("op")))
                        if reply.get("op") == "error":
                            break
                    sender.join(timeout=5)
            return "+".join(replies[-2:]) or "none", slowest

        def cancel(jobs: set[str]) -> None:
            from paramedic.ship.wire import recv_frame, send_frame

            for job in jobs:  # one connection each: an unknown job's refusal closes the connection
                with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                    with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                        send_frame(tls, {"op": "cancel", "job": job})
                        recv_frame(tls)

        def check(n: int) -> None:
            text = log_path.read_text(errors="replace")
            bad = [line for line in text.splitlines() if "Traceback" in line or "internal error" in line]
            if bad:
                raise Finding(f"server logged: {bad[0][:300]}")
            if proc.poll() is not None:
                raise Finding(f"server exited {proc.returncode}")
            data = seeds.text + str(n).encode()
            shipper = TlsShipper(
                SiteAddress("tls", "localhost", port),
                client,
                "direct",
                {"out": f"check/{n}.txt"},
                b"",
                timeout=20.0,
                streams=1,
            )
            try:
                shipper.start()
                shipper.send(*DirectCodec().encode((0, data)))
                done = shipper.finish({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            finally:
                shipper.close()
            if (
                done.get("sha256") != hashlib.sha256(data).hexdigest()
                or (root / "check" / f"{n}.txt").read_bytes() != data
            ):
                raise Finding("a valid client did not get its file after a batch")
            stats["checks"] += 1

        deadline = time.monotonic() + args.server_seconds
        n = 0
        while n < args.server_sessions and time.monotonic() < deadline:
            data = rng.choice(pool)
            for _ in range(rng.choice([1, 1, 2, 3])):
                data = mutate_frames(data, rng, pool)
            # each session its own jobs and output paths (same lengths: the frames stay as they are)
            suffix = f"{n:04x}"
            prefix = f'"{n:03x}/'.encode()
            for old, new in (
                (JOB, JOB[:-4] + suffix),
                (JOB2, JOB2[:-4] + suffix),
                ('"out/', prefix),
                ('"res/', prefix),
            ):
                data = data.replace(old.encode(), new if isinstance(new, bytes) else new.encode())
            try:
                outcome, slowest = session(data)
                stats["slowest_reply_seconds"] = max(stats["slowest_reply_seconds"], round(slowest, 3))
                stats["outcomes"][outcome] = stats["outcomes"].get(outcome, 0) + 1
                cancel({JOB[:-4] + suffix, JOB2[:-4] + suffix})
            except Finding as exc:
                kind = "hangs" if "no reply" in str(exc) else "crashes"
                stats[kind] += 1
                name = f"{kind[:-1]}-server-{hashlib.sha1(data).hexdigest()[:12]}"
                (args.out / name).write_bytes(data)
                stats["findings"].append({"signature": str(exc)[:200], "input": name})
            except (OSError, ssl.SSLError) as exc:
                stats["outcomes"][f"client side: {type(exc).__name__}"] = (
                    stats["outcomes"].get(f"client side: {type(exc).__name__}", 0) + 1
                )
            n += 1
            stats["executions"] = n
            if n % args.server_batch == 0:
                try:
                    check(n)
                except Finding as exc:
                    stats["crashes"] += 1
                    stats["findings"].append(
                        {"signature": str(exc)[:300], "input": f"batch ending at session {n}"}
                    )
                    break
        if n % args.server_batch:
            try:
                check(n)
            except Finding as exc:
                stats["crashes"] += 1
                stats["findings"].append(
                    {"signature": str(exc)[:300], "input": f"batch ending at session {n}"}
                )
        status = Path(f"/proc/{proc.pid}/status").read_text()
        stats["peak_rss_mb"] = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) // 1024
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(base, ignore_errors=True)
    stats["seconds"] = round(time.monotonic() - start, 1)
    return stats


def _send_quietly(tls: ssl.SSLSocket, data: bytes) -> None:
    try:
        tls.sendall(data)
    except OSError:
        pass  # the server closed the connection first: what it does with a bad frame


# -- the run -------------------------------------------------------------------------------------------------


def run_in_process(args: argparse.Namespace, target: str) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--worker", target, "--world", str(args.world), "--out", str(args.out),
            "--scratch", str(args.scratch), "--executions", str(args.executions), "--seconds", str(args.seconds),
            "--seed", str(args.seed), "--hang-seconds", str(args.hang_seconds), "--kill-seconds",
            str(args.kill_seconds), "--rss-mb", str(args.rss_mb)]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.seconds + 300, cwd=args.world)
    (args.out / f"libfuzzer-{target}.log").write_text(proc.stdout + proc.stderr)
    stats_path = args.out / f"stats-{target}.json"
    stats = (
        json.loads(stats_path.read_text())
        if stats_path.exists()
        else {"target": target, "crashes": 0, "hangs": 0, "findings": []}
    )
    text = proc.stderr
    done = re.search(r"Done (\d+) runs in (\d+) second", text)
    stats["executions"] = int(done.group(1)) if done else stats.get("executions", 0)
    peak = re.search(r"stat::peak_rss_mb:\s+(\d+)", text)
    stats["peak_rss_mb"] = int(peak.group(1)) if peak else None
    stats["seconds"] = round(time.monotonic() - start, 1)
    cov = re.findall(r"cov: (\d+) ft: (\d+)", text)
    stats["coverage"] = {"edges": int(cov[-1][0]), "features": int(cov[-1][1])} if cov else None
    if proc.returncode != 0:
        if "ALARM" in text or "timeout" in text.lower():
            stats["hangs"] += 1
            stats["findings"].append({"signature": "libFuzzer: execution killed after --kill-seconds"})
        else:
            stats["crashes"] += 1
            tail = "\n".join(text.splitlines()[-15:])
            stats["findings"].append({"signature": f"worker exited {proc.returncode}", "message": tail})
    return stats


WHAT = {
    "frame": (
        "`wire.recv_frame`",
        "executions that parsed at least one frame",
        lambda k: not k.startswith("0 frames"),
    ),
    "requests": (
        "`SiteServer._answer`, real JobStore",
        "sessions that reached `done`",
        lambda k: "done" in k,
    ),
    "inbox": ("`InboxWatcher._look_into`", "job directories that reached `done.json`", lambda k: "done" in k),
    "setup": ("`BlastMetadataCodec.prepare`", "setups accepted", lambda k: k == "accepted"),
    "chunk": ("codecs' `unpack` + `decode`", "chunks decoded", lambda k: k.endswith("decoded")),
    "journal": (
        "`Store.keys`/`alignments`, `_read_piece`, `Journal.open`",
        "records read",
        lambda k: "record read" in k,
    ),
    "metadata": ("`load_metadata`", "files accepted", lambda k: k == "accepted"),
    "replica": (
        "`TlsReplica` replies, `check_listing`",
        "replies accepted",
        lambda k: k.endswith("accepted"),
    ),
    "stage": ("`StageCache.use` on a rewritten copy", "copies used as they were", lambda k: k == "copy used"),
    "prelim": ("`prelim.read_dump`, `whole_lists`", "dumps read", lambda k: k.startswith("dump read")),
    "tracemeta": ("`trace.codec.decode_memory` + `decode`", "traces rebuilt", lambda k: k == "rebuilt"),
    "values": ("`codecs.check_json_values`", "texts passed and parsed", lambda k: k.startswith("parsed")),
    "server": ("real `paramedic serve`, TLS", "sessions that reached `done`", lambda k: "done" in k),
}


def record(summary: dict[str, Any], args: argparse.Namespace) -> None:
    """Append the run to bench/RESULTS.md with the command that produced it."""
    from importlib.metadata import version

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["bench/fuzz.py", *sys.argv[1:]])
    lines = [
        "",
        f"## Fuzzing (issue 11): the storage site's decoders of untrusted bytes ({when})",
        "",
        f"`.venv/bin/python {command}` (`make fuzz`): seed {summary['seed']}, atheris {version('atheris')} "
        f"(libFuzzer), Python {sys.version.split()[0]}, {summary['seconds']:.0f} s in all on this shared 2-core "
        f"machine; in-process targets capped at {args.executions} executions or {args.seconds:g} s each, hang "
        f"bound {args.hang_seconds:g} s per execution, memory bound {args.rss_mb} MiB; the server target "
        f"{args.server_sessions} mutated sessions, a valid client and the log checked every {args.server_batch}.",
        "",
        "| target | decoder | executions | crashes | hangs | slowest execution | peak RSS | coverage (edges) | deepest path |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["targets"]:
        what, deep, is_deep = WHAT[r["target"]]
        reached = sum(n for k, n in r.get("outcomes", {}).items() if is_deep(k))
        slowest = r.get("slowest_seconds", r.get("slowest_reply_seconds"))
        coverage = (r.get("coverage") or {}).get("edges", "-")
        checks = f"; {r['checks']} checks passed" if "checks" in r else ""
        lines.append(
            f"| {r['target']} | {what} | {r['executions']} | {r['crashes']} | {r['hangs']} | {slowest} s "
            f"| {r.get('peak_rss_mb')} MiB | {coverage} | {reached} {deep}{checks} |"
        )
    for r in summary["targets"]:
        for finding in r["findings"]:
            lines.append(f"- {r['target']}: {finding['signature'][:200]}")
    with open(REPO / "bench" / "RESULTS.md", "a") as fh:
        fh.write("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--executions", type=int, default=30000, help="executions per in-process target (default 30000)"
    )
    parser.add_argument(
        "--seconds", type=float, default=90, help="time cap per in-process target (default 90)"
    )
    parser.add_argument(
        "--seed", type=int, default=11, help="libFuzzer's and the mutator's seed (default 11)"
    )
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help=f"comma-separated, of {','.join(TARGETS)}"
    )
    parser.add_argument(
        "--hang-seconds", type=float, default=2.0, help="an execution slower than this is a hang"
    )
    parser.add_argument(
        "--kill-seconds", type=float, default=20.0, help="libFuzzer kills an execution after this"
    )
    parser.add_argument("--rss-mb", type=int, default=2048, help="libFuzzer's memory bound per target")
    parser.add_argument(
        "--server-sessions", type=int, default=300, help="mutated sessions against the real server"
    )
    parser.add_argument(
        "--server-batch", type=int, default=25, help="sessions between two checks of the server"
    )
    parser.add_argument("--server-seconds", type=float, default=120, help="time cap for the server target")
    parser.add_argument(
        "--reply-seconds", type=float, default=5.0, help="the server's time bound for a reply"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="findings, logs and stats (default: a temporary directory)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    try:
        import atheris  # noqa: F401
    except ImportError:
        print(
            "fuzz: error: atheris is not installed (pip install -e '.[fuzz]', or `make fuzz`)",
            file=sys.stderr,
        )
        return 2
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        print(f"fuzz: error: unknown target {unknown[0]!r} (targets: {', '.join(TARGETS)})", file=sys.stderr)
        return 2
    scratch_parent = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    args.scratch = Path(tempfile.mkdtemp(prefix="paramedic-fuzz-", dir=scratch_parent))
    keep_out = args.out is not None
    args.out = (args.out or Path(tempfile.mkdtemp(prefix="paramedic-fuzz-out-"))).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    began = time.monotonic()
    try:
        args.world = args.scratch / "world"
        world = make_world(args.world, args.seed)
        print(
            f"fuzz: seed {args.seed}, up to {args.executions} executions or {args.seconds:g} s per in-process target; findings in {args.out}",
            flush=True,
        )
        for target in targets:
            stats = run_server_target(args, world) if target == "server" else run_in_process(args, target)
            results.append(stats)
            print(
                f"  {target:9} {stats['executions']:>7} executions  {stats['crashes']} crashes  {stats['hangs']} hangs  "
                f"peak RSS {stats.get('peak_rss_mb')} MiB  {stats['seconds']:>6.1f} s",
                flush=True,
            )
            for finding in stats["findings"][:5]:
                print(f"      {finding['signature']}", flush=True)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)
    summary = {"seed": args.seed, "seconds": round(time.monotonic() - began, 1), "targets": results}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    failed = sum(r["crashes"] + r["hangs"] for r in results)
    if not args.no_record:
        record(summary, args)
    print(
        f"fuzz: {sum(r['executions'] for r in results)} executions, {failed} crashes or hangs, {summary['seconds']:.0f} s"
    )
    if not failed and not keep_out:
        shutil.rmtree(args.out, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
