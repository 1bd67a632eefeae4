"""Running makeblastdb for `paramedic format`, and saying in one line why it refused an input.

Both layouts (`paramedic.db.format`: one plain BLAST+ database; `paramedic.db.fragmented`: the layout of
earlier versions) build their volumes here, so they accept and refuse the same inputs with the same words.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

from paramedic.blast.programs import MolType
from paramedic.blast.tools import require_tool, run_tool
from paramedic.errors import BlastError, InputError

_CHUNK = 1 << 20


def refusal(message: str) -> str:
    """makeblastdb's refusal in one line of its own words, without the C++ exception's wrapping; for ids
    that -parse_seqids cannot read, the way that works (makeblastdb's default keeps them as titles)."""
    text = " ".join(message.split())
    reason = re.sub(r"^.*(?:creation error:|\(\) - |makeblastdb failed \(exit \d+\):)\s*", "", text)
    if "seq-id" in text.lower() or "ID type" in text or "too long" in text:
        return (
            f"makeblastdb -parse_seqids cannot read an id of this FASTA ({reason}); keep such ids as titles "
            "with `paramedic format --no-parse-seqids` (makeblastdb's default), or make the database with "
            "makeblastdb itself and search it in place"
        )
    return f"makeblastdb refused the input: {reason}"


def taxid_map_args(path: Path | None) -> list[str]:
    """makeblastdb's arguments for a taxid map ("id taxid" lines), checked to exist."""
    if path is None:
        return []
    if not path.is_file():
        raise InputError(f"--taxid-map {path}: no such file")
    return ["-taxid_map", str(path.resolve())]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def make_volume(cwd: Path, dbtype: MolType, stdin: Path, out: str, title: str, extra: list[str]) -> None:
    """One makeblastdb run on the FASTA file `stdin`, given on standard input (`-in -`): makeblastdb
    guesses a named file's format from its first bytes, and refused a file beginning with a short or
    unusual protein (`MKUOLLXBZJ*`, gaps) that it takes on standard input as FASTA, as told."""
    try:
        run_tool(
            ["makeblastdb", "-in", "-", "-dbtype", dbtype, "-out", out, "-title", title, *extra],
            cwd=cwd,
            stdin_path=stdin,
        )
    except BlastError as exc:
        raise InputError(refusal(str(exc))) from exc


def make_streamed(
    cwd: Path, dbtype: MolType, source: Path, out: str, title: str, extra: list[str]
) -> tuple[str, list[str]]:
    """makeblastdb on `source` as it is (gzip undone), streamed through its standard input: nothing is
    written but the database. Returns the SHA-256 of the FASTA text read and makeblastdb's warnings."""
    digest = hashlib.sha256()
    err_path = cwd / ".makeblastdb.err"
    with open(cwd / ".makeblastdb.out", "wb") as out_fh, open(err_path, "wb") as err_fh:
        argv = [
            require_tool("makeblastdb"),
            "-in",
            "-",
            "-dbtype",
            dbtype,
            "-out",
            out,
            "-title",
            title,
            *extra,
        ]
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=out_fh, stderr=err_fh)
        assert proc.stdin is not None
        try:
            with _open_fasta(source) as given:
                while chunk := given.read(_CHUNK):
                    digest.update(chunk)
                    proc.stdin.write(chunk)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # makeblastdb stopped reading: its exit status and message say why
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        code = proc.wait()
    said = (cwd / ".makeblastdb.out").read_text(errors="replace") + err_path.read_text(errors="replace")
    (cwd / ".makeblastdb.out").unlink()
    err_path.unlink()
    if code != 0:
        raise InputError(refusal(f"makeblastdb failed (exit {code}): {said.strip()[-2000:]}"))
    warnings = [" ".join(line.split()) for line in said.splitlines() if line.lstrip().startswith("Warning")]
    return digest.hexdigest(), warnings


class _Opened:
    """A FASTA file as bytes, gzip undone (detected by its magic bytes, not its name)."""

    def __init__(self, path: Path):
        import gzip

        try:
            with open(path, "rb") as probe:
                magic = probe.read(2)
            self.fh = gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")
        except FileNotFoundError as exc:
            raise InputError(f"{path}: no such file") from exc
        except IsADirectoryError as exc:
            raise InputError(f"{path}: is a directory, expected a FASTA file") from exc
        except PermissionError as exc:
            raise InputError(f"{path}: permission denied") from exc
        self.path = path

    def read(self, size: int) -> bytes:
        try:
            return self.fh.read(size)
        except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
            raise InputError(f"{self.path}: cannot be read ({exc})") from exc

    def __enter__(self) -> _Opened:
        return self

    def __exit__(self, *_: object) -> None:
        self.fh.close()


def _open_fasta(path: Path) -> _Opened:
    return _Opened(path)


def database_size(cwd: Path, name: str) -> tuple[int, int]:
    """Sequence and letter counts as BLAST+ itself counts them (authoritative for statistics)."""
    info = run_tool(["blastdbcmd", "-db", name, "-info"], cwd=cwd).stdout.decode()
    for line in info.splitlines():
        if "sequences;" in line and "total" in line:
            parts = line.replace(",", "").split()
            return int(parts[0]), int(parts[2])
    raise InputError("blastdbcmd -info printed no size line")


def warn(text: str) -> None:
    print(f"paramedic: warning: {text}", file=sys.stderr, flush=True)
