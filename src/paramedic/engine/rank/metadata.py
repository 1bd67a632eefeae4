"""Saving and loading a search's metadata: per query, the merged global subject ids.

With the metadata, any output format can be regenerated later without searching again (`paramedic
search ... --from-metadata FILE`): the ParaMEDIC idea in its simplest, local form. The file records what
the subjects depend on (database manifest, queries, search options) and loading refuses a mismatch, so a
regeneration can never silently produce output for another search.

Two digests of the rest of the file are sealed into it, both checked before regenerating:

- `sha256`, a plain SHA-256: a file damaged since it was written is refused, and said to be damaged;
- `seal`, an HMAC-SHA256 keyed by the user's own metadata key (`metadata_key`: a random 32-byte key in
  `~/.config/paramedic/metadata.key`, or the file `PARAMEDIC_METADATA_KEY` names): anyone can recompute a
  plain SHA-256 after removing a subject id, only the holder of the key can seal. A file sealed with
  another key (another user's, another machine's, or a forger's) regenerates nothing. The key is treated
  as ssh treats a private key: created 0600 in a 0700 directory, refused when another user owns it or
  others can read or write it, opened without following a link.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from paramedic.blast.options import FORMATTING_ONLY, BlastOptions
from paramedic.durable import write_output
from paramedic.errors import InputError, OutputError, ParamedicError, UsageError

KIND = "paramedic-metadata"
VERSION = 3  # 2: the file's own SHA-256 sealed in it; 3: and an HMAC keyed by the user's metadata key
DIGEST = "sha256"
SEAL = "seal"
KEY_VARIABLE = "PARAMEDIC_METADATA_KEY"  # the key file's path, when not the default
KEY_BYTES = 32


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


def _canonical(data: dict[str, object]) -> bytes:
    """The file's fields but its two digests, in one canonical JSON form."""
    rest = {k: v for k, v in data.items() if k not in (DIGEST, SEAL)}
    return json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: dict[str, object], canonical: bytes | None = None) -> str:
    """SHA-256 of the file's fields but its digests (`canonical`: their `_canonical` form, if made)."""
    return hashlib.sha256(_canonical(data) if canonical is None else canonical).hexdigest()


def _seal(key: bytes, data: dict[str, object], canonical: bytes | None = None) -> str:
    """HMAC-SHA256, keyed by the user's metadata key, of the file's fields but its digests."""
    body = _canonical(data) if canonical is None else canonical
    return hmac.new(key, KIND.encode() + b"\0" + body, hashlib.sha256).hexdigest()


def key_path() -> Path:
    """Where the user's metadata key is: `$PARAMEDIC_METADATA_KEY`, else under the user's config
    directory (`$XDG_CONFIG_HOME`, default ~/.config)."""
    named = os.environ.get(KEY_VARIABLE)
    if named:
        return Path(named).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "paramedic" / "metadata.key"


def metadata_key(create: bool, option: str) -> bytes:
    """The user's metadata key, made when `create` and there is none yet (a search with --metadata).
    Refused, with one line naming `option`, when it is not a regular file of the user's own that only
    the user can read and write, or does not hold a key."""
    error: type[ParamedicError] = OutputError if create else InputError
    path = key_path()
    if create:
        try:
            _make_key(path)
        except OSError as exc:
            raise error(
                f"{option}: cannot make the metadata key {path} ({exc.strerror or exc}); set "
                f"{KEY_VARIABLE} to a file of your own for it"
            ) from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise error(
            f"{option}: no metadata key at {path} (files are sealed with the key of the user who made "
            f"them: copy that key here, or set {KEY_VARIABLE} to it)"
        ) from exc
    except OSError as exc:
        reason = "a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise error(f"{option}: the metadata key {path} cannot be used ({reason})") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"{option}: the metadata key {path} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        if st.st_uid != os.geteuid():
            raise error(f"{option}: the metadata key {path} is owned by another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            raise error(
                f"{option}: others can read or write the metadata key {path} (mode "
                f"{stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`"
            )
        text = fh.read(4 * KEY_BYTES)
    try:
        key = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise error(f"{option}: the metadata key {path} does not hold a key ({2 * KEY_BYTES} hex digits)")
    return key


def _make_key(path: Path) -> None:
    """Make a new random key at `path` unless one is there, whole or not at all (written under a
    temporary name, then linked: two searches making it at once keep the first)."""
    if os.path.lexists(path):
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(KEY_BYTES).hex().encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_metadata(path: Path, identity: SearchIdentity, subjects: list[list[int]]) -> None:
    key = metadata_key(create=True, option="--metadata")
    data: dict[str, object] = {"kind": KIND, "version": VERSION, **asdict(identity), "subjects": subjects}
    canonical = _canonical(data)  # made once for both digests (a file of 250,000 ids: 0.18 s)
    data[DIGEST] = _digest(data, canonical)
    data[SEAL] = _seal(key, data, canonical)
    write_output(path, (json.dumps(data, separators=(",", ":")) + "\n").encode(), shared=False)


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
            "versions are not sealed with your metadata key: search again with --metadata)"
        )
    canonical = _canonical(data)
    if data.get(DIGEST) != _digest(data, canonical):
        raise InputError(
            f"--from-metadata {path}: its contents do not match the SHA-256 sealed in it (changed or "
            "damaged since it was written)"
        )
    seal = data.get(SEAL)
    if not isinstance(seal, str) or not hmac.compare_digest(
        seal.encode(errors="replace"),  # a lone surrogate from the file is no seal (fuzzed)
        _seal(metadata_key(create=False, option="--from-metadata"), data, canonical).encode(),
    ):
        raise InputError(
            f"--from-metadata {path}: not sealed with your metadata key {key_path()} (made by another "
            "user or with another key, or changed and sealed again): search again with --metadata"
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
