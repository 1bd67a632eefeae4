"""Saving and loading a search's metadata: per query, the merged global subject ids.

With the metadata, any output format can be regenerated later without searching again (`paramedic
search ... --from-metadata FILE`): the ParaMEDIC idea in its simplest, local form. The file records what
the subjects depend on (database manifest, queries, search options) and loading refuses a mismatch, so a
regeneration can never silently produce output for another search. A SHA-256 of the rest of the file is
sealed into it (`sha256`), checked before regenerating: a file edited or damaged since it was written (a
subject id removed) is refused, never regenerated into another report.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from paramedic.blast.options import FORMATTING_ONLY, BlastOptions
from paramedic.durable import write_durably
from paramedic.errors import InputError, UsageError

KIND = "paramedic-metadata"
VERSION = 2  # 2: the file's own SHA-256 sealed in it
DIGEST = "sha256"


@dataclass(frozen=True)
class SearchIdentity:
    """Everything the merged subjects depend on."""

    program: str
    search_options: list[str]  # options that shape the search, without formatting, -query, -db, -out
    hitlist_size: int
    manifest_sha256: str
    queries_sha256: str

    @classmethod
    def of(
        cls, program: str, options: BlastOptions, manifest_sha256: str, queries: list[tuple[str, str]]
    ) -> SearchIdentity:
        digest = hashlib.sha256()
        for header, sequence in queries:
            digest.update(f">{header}\n{sequence}\n".encode())
        shaping = options.without(*FORMATTING_ONLY, "query", "db", "max_target_seqs", "num_threads")
        return cls(program, shaping.argv(), options.hitlist_size(), manifest_sha256, digest.hexdigest())


def _digest(data: dict[str, object]) -> str:
    """SHA-256 of the file's fields but the digest itself, in one canonical JSON form."""
    rest = {k: v for k, v in data.items() if k != DIGEST}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def save_metadata(path: Path, identity: SearchIdentity, subjects: list[list[int]]) -> None:
    data: dict[str, object] = {"kind": KIND, "version": VERSION, **asdict(identity), "subjects": subjects}
    data[DIGEST] = _digest(data)
    write_durably(path, (json.dumps(data, separators=(",", ":")) + "\n").encode())


def max_metadata_bytes(n_queries: int, hitlist_size: int, nseq: int) -> int:
    """The most a metadata file of this search can hold: each query's list of at most `hitlist_size`
    ids below `nseq`, with room for the header and for whitespace (a file printed prettily is still the
    same file: the seal is over its contents)."""
    per_id = len(str(max(nseq, 1))) + 2
    return (1 << 20) + 4 * n_queries * (8 + min(max(hitlist_size, 1), max(nseq, 1)) * per_id)


def _read_bounded(path: Path, limit: int) -> str:
    """A regular file's text, refused past `limit` bytes: a FIFO blocked the search for ever, /dev/zero
    or a file of gigabytes was read whole (exit 1, MemoryError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        data = fh.read(limit + 1) if st.st_size <= limit else b""
    if st.st_size > limit or len(data) > limit:
        raise ValueError(f"larger than this search's metadata can be ({limit:,} bytes)")
    return data.decode()


def load_metadata(path: Path, expected: SearchIdentity, n_queries: int, nseq: int) -> list[list[int]]:
    try:
        data = json.loads(_read_bounded(path, max_metadata_bytes(n_queries, expected.hitlist_size, nseq)))
    except FileNotFoundError as exc:
        raise InputError(f"--from-metadata {path}: no such file") from exc
    except OSError as exc:
        raise InputError(f"--from-metadata {path}: not a metadata file ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise InputError(f"--from-metadata {path}: not a metadata file ({exc})") from exc
    except RecursionError as exc:  # JSON nested thousands deep
        raise InputError(f"--from-metadata {path}: not a metadata file (nested too deeply)") from exc
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise InputError(f"--from-metadata {path}: not a paramedic metadata file")
    if data.get("version") != VERSION:
        raise InputError(
            f"--from-metadata {path}: not a version {VERSION} paramedic metadata file (files of earlier "
            "versions carry no digest of their own: search again with --metadata)"
        )
    if data.get(DIGEST) != _digest(data):
        raise InputError(
            f"--from-metadata {path}: its contents do not match the SHA-256 sealed in it (changed or "
            "damaged since it was written)"
        )
    for name, value in asdict(expected).items():
        if data.get(name) != value:
            raise UsageError(f"--from-metadata {path}: made with a different {name.replace('_', ' ')}")
    subjects = data.get("subjects")
    if (
        not isinstance(subjects, list)
        or len(subjects) != n_queries
        or not all(isinstance(s, list) and all(type(g) is int and 0 <= g < nseq for g in s) for s in subjects)
    ):
        raise InputError(f"--from-metadata {path}: malformed subject lists")
    return subjects
