"""BLAST+ command-line options, spelled and validated as BLAST+ itself does.

The set of valid options and which of them take a value is read from the program's own `-help`, so a
BLAST+ command line works unchanged after `paramedic search`, and an unknown option is refused up front
instead of failing on every worker.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from paramedic.blast.tools import require_tool
from paramedic.cache import file_key, read_cached, write_cached
from paramedic.errors import BlastError, UsageError

_OPTION_LINE = re.compile(r"^ -([A-Za-z0-9_]+)(\s+<.*)?$")

# Options that restrict or replace the database, or talk to NCBI: they would make fragment searches
# disagree with the whole database, so the engine refuses them instead of giving subtly wrong output.
UNSUPPORTED = {
    "subject": "the engine searches a formatted database (-db); use plain BLAST+ for -subject",
    "subject_loc": "the engine searches a formatted database (-db)",
    "remote": "the engine runs BLAST+ locally",
    "gilist": "database subsets are not supported yet",
    "negative_gilist": "database subsets are not supported yet",
    "ipglist": "database subsets are not supported yet",
    "negative_ipglist": "database subsets are not supported yet",
    "entrez_query": "database subsets are not supported yet",
    "db_soft_mask": "database masks are not kept by `paramedic format`",
    "db_hard_mask": "database masks are not kept by `paramedic format`",
    "import_search_strategy": "give the options on the command line instead",
    "export_search_strategy": "not supported by the parallel engine",
    "query_loc": "not supported by the parallel engine",
    "mt_mode": "-mt_mode 1 changes the output framing; the engine parallelises itself",
}

# Options that only shape the report: dropped from fragment searches, kept for regeneration.
FORMATTING_ONLY = (
    "outfmt",
    "out",
    "html",
    "show_gis",
    "num_descriptions",
    "num_alignments",
    "line_length",
    "sorthits",
    "sorthsps",
    "parse_deflines",
)


@functools.cache
def known_options(program: str) -> dict[str, bool]:
    """Map option name -> takes a value, read from `<program> -help`.

    The help text is cached per executable (path, size, mtime): running `-help` costs 0.1 s, paid
    before any rank can start work.
    """
    exe = require_tool(program)
    name = f"{program}-{file_key(exe)}.help"
    cached = read_cached("blast-help", name)
    options = _parse_help(cached.decode(errors="replace")) if cached is not None else {}
    if "db" in options and "query" in options:
        return options
    try:
        text = subprocess.run([exe, "-help"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BlastError(f"cannot run `{program} -help`: {exc}") from exc
    options = _parse_help(text)
    if "db" not in options or "query" not in options:
        raise BlastError(f"`{program} -help` did not list -query and -db: unexpected BLAST+ version?")
    write_cached("blast-help", name, text.encode())
    return options


def _parse_help(text: str) -> dict[str, bool]:
    options: dict[str, bool] = {}
    for line in text.splitlines():
        m = _OPTION_LINE.match(line)
        if m:
            options[m.group(1)] = m.group(2) is not None
    return options


def typed_value(argv: list[str], name: str) -> str | None:
    """The value the user gave BLAST+'s `-name` in `argv` (its first), before the options are parsed
    against the program's own list: what the launcher needs before any BLAST+ runs (-out, -db)."""
    flag = f"-{name}"
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag), None)


@dataclass
class BlastOptions:
    """An ordered BLAST+ option list: name -> value (None for flags)."""

    items: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, program: str, argv: list[str]) -> BlastOptions:
        """Parse single-dash BLAST+ options; refuse unknown, repeated, value-less and unsupported ones."""
        known = known_options(program)
        items: dict[str, str | None] = {}
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("-") or arg.startswith("--") or len(arg) == 1:
                raise UsageError(f"unexpected argument {arg!r} (BLAST+ options look like -evalue 1e-5)")
            name = arg[1:]
            if name not in known:
                raise UsageError(f"unknown {program} option -{name} (see `{program} -help`)")
            if name in UNSUPPORTED:
                raise UsageError(f"-{name} is not supported: {UNSUPPORTED[name]}")
            if name in items:
                raise UsageError(f"option -{name} given twice")
            if known[name]:
                if i + 1 >= len(argv):
                    raise UsageError(f"option -{name} needs a value")
                items[name] = argv[i + 1]
                i += 2
            else:
                items[name] = None
                i += 1
        return cls(items)

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.items.get(name, default)

    def has(self, name: str) -> bool:
        return name in self.items

    def without(self, *names: str) -> BlastOptions:
        return BlastOptions({k: v for k, v in self.items.items() if k not in names})

    def with_(self, **values: str | None) -> BlastOptions:
        items = dict(self.items)
        items.update(values)
        return BlastOptions(items)

    def argv(self) -> list[str]:
        out: list[str] = []
        for name, value in self.items.items():
            out.append(f"-{name}")
            if value is not None:
                out.append(value)
        return out

    def outfmt(self) -> str:
        return (self.get("outfmt") or "0").strip()

    def outfmt_number(self) -> int:
        token = self.outfmt().split()[0] if self.outfmt() else "0"
        try:
            return int(token)
        except ValueError as exc:
            raise UsageError(f"-outfmt must start with a format number, got {self.outfmt()!r}") from exc

    def hitlist_size(self) -> int:
        """How many subjects BLAST+ keeps per query, as BLAST+ decides it.

        -max_target_seqs when given; for the report formats (outfmt 0-4) without it, the larger of
        -num_descriptions (default 500) and -num_alignments (default 250); otherwise 500.
        """
        value = self.get("max_target_seqs")
        if value is not None:
            return _positive_int("max_target_seqs", value)
        if self.outfmt_number() <= 4 and (self.has("num_descriptions") or self.has("num_alignments")):
            desc = _positive_int("num_descriptions", self.get("num_descriptions") or "500", allow_zero=True)
            aln = _positive_int("num_alignments", self.get("num_alignments") or "250", allow_zero=True)
            return max(desc, aln, 1)
        return 500


def _positive_int(name: str, value: str, allow_zero: bool = False) -> int:
    try:
        number = int(value)
    except ValueError as exc:
        raise UsageError(f"-{name} must be an integer, got {value!r}") from exc
    if number < (0 if allow_zero else 1):
        raise UsageError(f"-{name} must be {'>= 0' if allow_zero else '>= 1'}, got {value}")
    return number


# Set (to "1") by the launching process once check_values passed, so rank 0 does not check again.
CHECKED_VARIABLE = "PARAMEDIC_OPTIONS_CHECKED"
_ARGUMENT_ERROR = re.compile(r'Argument "(\w+)"\. (.*?):\s+`(.*)\'$')


def check_values(program: str, options: BlastOptions, db: str, db_identity: str | None = None) -> None:
    """Let BLAST+ itself check the option values before any rank starts: the user's options with an
    empty query file, against the database, writing nothing. BLAST+ parses and checks every option (types,
    ranges, permissible values, matrices, incompatible options) and stops at the empty query: about
    0.08 s (0.25 s on a 300 Mbp nucleotide database), a third of a small search's start. Anything it
    refuses is a usage error, one line. A pass is remembered per BLAST+ executable, option values and
    database (`db_identity`: its manifest's checksum) when the values name no file (`_pure`): the same
    command again does not pay for the check."""
    if os.environ.get(CHECKED_VARIABLE) == "1" or not _values_to_check(options):
        return
    exe = require_tool(program)
    argv = options.without("query", "db", "out").argv()
    key = _check_key(exe, argv, db_identity) if db_identity is not None and _pure(options) else None
    if key is not None and read_cached("option-check", key) == b"ok\n":
        return
    with tempfile.TemporaryDirectory(prefix="paramedic-check-") as tmp:
        empty = Path(tmp) / "empty.fasta"
        empty.write_bytes(b"")
        command = [exe, *argv, "-query", str(empty), "-db", db, "-out", os.devnull]
        try:
            proc = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BlastError(f"cannot run {program} to check the options: {exc}") from exc
    if proc.returncode != 0:
        raise UsageError(f"{program} refuses the options: {_refusal(proc.stderr)}")
    if key is not None:
        write_cached("option-check", key, b"ok\n")


# Options whose values BLAST+ checks by themselves: numbers, names of its own tables and modes. Any other
# option given (a file such as -window_masker_db, whose contents the check reads) makes the check run
# every time.
_PURE_VALUES = frozenset(
    """evalue word_size gapopen gapextend penalty reward task matrix max_target_seqs max_hsps
    num_alignments num_descriptions outfmt dust seg soft_masking xdrop_ungap xdrop_gap xdrop_gap_final
    threshold comp_based_stats perc_identity qcov_hsp_perc culling_limit best_hit_overhang
    best_hit_score_edge strand searchsp sum_stats window_size query_gencode db_gencode template_type
    template_length min_raw_gapped_score num_threads line_length sorthits sorthsps max_intron_length
    dbsize off_diagonal_range frame_shift_penalty""".split()
)


def _pure(options: BlastOptions) -> bool:
    rest = options.without("query", "db", "out")
    return all(value is None or name in _PURE_VALUES for name, value in rest.items.items())


def _check_key(exe: str, argv: list[str], db_identity: str) -> str:
    """The executable (path, size, mtime), the option values and the database's content; the matrix
    directory BLAST+ reads (-matrix names a file there) is part of it."""
    parts = [file_key(exe), db_identity, os.environ.get("BLASTMAT", ""), "\0".join(argv)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _values_to_check(options: BlastOptions) -> bool:
    """Whether BLAST+ has option values to check: not when only -query, -db, -out and a bare -outfmt
    number are given (the engine checks those itself), which saves a search of a few tenths of a second
    a BLAST+ start (0.05-0.08 s)."""
    rest = options.without("query", "db", "out", "outfmt")
    return bool(rest.items) or not (options.get("outfmt") or "0").strip().isdigit()


def _refusal(stderr: str) -> str:
    """BLAST+'s reason in one line: `-evalue abc: Argument cannot be converted`."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        m = _ARGUMENT_ERROR.search(ln)
        if m:
            return f"-{m.group(1)} {m.group(3)}: {m.group(2).strip()}"
    for i, ln in enumerate(lines):
        if "error:" in ln.lower():
            text = " ".join([ln.split(":", 1)[1].strip(), *lines[i + 1 : i + 12]])
            return text if len(text) <= 300 else text[:297] + "..."
    return lines[-1] if lines else "no message"
