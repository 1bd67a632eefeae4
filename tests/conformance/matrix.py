"""The cells of the conformance matrix, and how one cell is judged.

A cell is (data set, program, BLAST+ options, outfmt, fragment count, strategy). Its verdict:
- identical: paramedic's output equals BLAST+'s on the unsplit database, byte for byte (the text
  reports' "Posted date" line, the database's build time, aside);
- refused: paramedic exited 2 before searching, with one line on stderr and no output file;
- differs / error: anything else (the harness fails on these);
- n/a: BLAST+ itself rejects the combination (no reference to compare with).

The matrix varies one axis at a time around the defaults: every program at 1, 4, 16 and 64 fragments;
each option family at 4 fragments; each outfmt at 4 fragments; the saturating set at every count; and
the options and formats of held-out runs (-seg/-dust yes, -qcov_hsp_perc, -max_target_seqs 5 x outfmt 0,
5, 7) crossed at 12 fragments.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from paramedic.blast.prelim import DUMP_NAME, shim
from tests.conformance.datasets import DataSet
from tests.conftest import BIN, without_posted_date

# program -> (database set, query molecule)
PROGRAMS = {
    "blastp": ("proteins", "prot"),
    "blastx": ("proteins", "nucl"),
    "blastn": ("genomes", "nucl"),
    "tblastn": ("genomes", "prot"),
    "tblastx": ("genomes", "nucl"),
}
FRAGMENT_COUNTS = (1, 4, 16, 64)
# The options and report formats held-out runs use, crossed at 12 fragments.
CROSSED_OPTIONS = [("-seg", "yes"), ("-qcov_hsp_perc", "50"), ("-max_target_seqs", "5")]
CROSSED_OUTFMTS = ["0", "5", "7"]
CAPS = [("-max_target_seqs", n) for n in ("1", "5", "500", "5000")]
COMMON = [
    (),
    ("-evalue", "1e-5"),
    *CAPS,
    ("-culling_limit", "2"),
    ("-best_hit_overhang", "0.1"),
    ("-qcov_hsp_perc", "50"),
    ("-max_hsps", "1"),
]
PROTEIN_QUERY = [("-seg", "yes"), ("-soft_masking", "true"), ("-matrix", "BLOSUM45"), ("-word_size", "2")]
CBS = [("-comp_based_stats", str(n)) for n in range(4)]
OPTIONS = {
    "blastp": COMMON + PROTEIN_QUERY + CBS,
    "tblastn": COMMON + PROTEIN_QUERY + CBS,
    "blastx": COMMON + [("-seg", "yes"), ("-matrix", "BLOSUM45"), ("-word_size", "2")] + CBS,
    "blastn": COMMON
    + [("-dust", "no"), ("-soft_masking", "false"), ("-word_size", "16")]
    + [("-task", t) for t in ("blastn", "blastn-short", "dc-megablast")],
    "tblastx": COMMON + [("-seg", "no"), ("-matrix", "BLOSUM45")],
}
OUTFMTS = [str(n) for n in range(19) if n != 17] + ["6 qseqid sseqid evalue bitscore staxid", "17"]
TEXT = {"0", "1", "2", "3", "4"}


@dataclass(frozen=True)
class Cell:
    dataset: str
    program: str
    options: tuple[str, ...]
    outfmt: str
    fragments: int
    strategy: str  # "fragments" (the engine) or "auto" (the default)
    saturates: bool = False  # exists to fill BLAST+'s preliminary list: checked on the unsplit database
    # --traceback: "auto" (the default), or the fragments engine's path by name: "once" (fragment
    # searches stop after the preliminary stage, each query aligned once) or "per-fragment"
    traceback: str = "auto"
    # --runner: "auto" (the default: worker threads of one process) or "mpi" (ranks under mpiexec)
    runner: str = "auto"
    # --fragment-groups with --strategy fragments: "off" (every fragment its own search, so the merge
    # meets `fragments` lists per query) or "auto" (the default: consecutive fragments searched together
    # when the database fits in memory, as few searches as keep the workers busy)
    groups: str = "off"

    def label(self) -> str:
        return " ".join(self.options) or "defaults"

    def engine_args(self) -> list[str]:
        return (
            ["--strategy", self.strategy]
            + (["--traceback", self.traceback] if self.traceback != "auto" else [])
            + (["--runner", self.runner] if self.runner != "auto" else [])
            + (
                ["--fragment-groups", self.groups]
                if self.strategy == "fragments" and self.groups != "auto"
                else []
            )
        )


def cells(full: bool) -> Iterator[Cell]:
    """The whole matrix (`full`) or the slice `make test` runs."""
    if not full:
        for program, (dataset, _) in PROGRAMS.items():  # MPI ranks; the other cells run as threads
            yield Cell(dataset, program, (), "6", 4, "fragments", runner="mpi")
        yield Cell("genomes", "blastn", ("-max_target_seqs", "5"), "6", 16, "fragments", saturates=True)
        yield Cell("genomes", "tblastx", ("-max_target_seqs", "5"), "6", 4, "fragments", saturates=True)
        yield Cell("genomes", "tblastn", (), "0", 4, "fragments")
        yield Cell("proteins", "blastp", ("-culling_limit", "2"), "6", 4, "fragments")
        yield Cell("proteins", "blastp", ("-culling_limit", "2"), "6", 4, "auto")
        yield Cell("saturating", "blastp", (), "6", 16, "fragments", saturates=True)
        yield Cell("saturating", "blastp", ("-max_target_seqs", "5"), "6", 4, "fragments", saturates=True)
        # the traceback-once path by name: every program (its fragments searched in groups), a text
        # report, the saturating set, a cap
        for program, (dataset, _) in PROGRAMS.items():
            yield Cell(dataset, program, (), "6", 16, "fragments", traceback="once", groups="auto")
        yield Cell("proteins", "blastp", (), "0", 16, "fragments", traceback="once")
        yield Cell("saturating", "blastp", (), "6", 16, "fragments", saturates=True, traceback="once")
        yield Cell("saturating", "blastp", ("-max_target_seqs", "5"), "7", 4, "fragments", True, "once")
        yield Cell("genomes", "blastn", ("-max_target_seqs", "5"), "6", 16, "fragments", True, "once")
        return
    for program, (dataset, _) in PROGRAMS.items():
        for n in FRAGMENT_COUNTS:
            yield Cell(dataset, program, (), "6", n, "fragments")
        yield Cell(dataset, program, (), "6", 4, "auto")
        for options in OPTIONS[program][1:]:
            for strategy in ("fragments", "auto"):
                yield Cell(dataset, program, options, "6", 4, strategy)
        yield Cell(dataset, program, ("-html",), "0", 4, "fragments")
        for options in CROSSED_OPTIONS:
            if options[0] == "-seg" and program == "blastn":
                options = ("-dust", "yes")
            for outfmt in CROSSED_OUTFMTS:
                yield Cell(dataset, program, options, outfmt, 12, "fragments")
        for outfmt in OUTFMTS:
            if outfmt != "6":
                yield Cell(dataset, program, (), outfmt, 4, "fragments")
    for n in FRAGMENT_COUNTS:
        yield Cell("saturating", "blastp", (), "6", n, "fragments", saturates=True)
        yield Cell("saturating", "blastp", ("-max_target_seqs", "5"), "6", n, "fragments", saturates=True)
        yield Cell("saturating", "blastx", (), "6", n, "fragments", saturates=True)
    yield Cell("saturating", "blastp", (), "0", 16, "fragments", saturates=True)
    # the traceback-once path by name: every program at every fragment count (searched one by one and
    # in groups), every option family, the crossed formats, the saturating set at every count
    for program, (dataset, _) in PROGRAMS.items():
        for n in FRAGMENT_COUNTS:
            yield Cell(dataset, program, (), "6", n, "fragments", traceback="once")
            yield Cell(dataset, program, (), "6", n, "fragments", traceback="once", groups="auto")
        for options in OPTIONS[program][1:]:
            yield Cell(dataset, program, options, "6", 4, "fragments", traceback="once")
        for outfmt in CROSSED_OUTFMTS:
            yield Cell(dataset, program, ("-max_target_seqs", "5"), outfmt, 12, "fragments", False, "once")
    for n in FRAGMENT_COUNTS:
        for caps in ((), ("-max_target_seqs", "5")):
            yield Cell("saturating", "blastp", caps, "6", n, "fragments", True, "once")
    for program in ("blastn", "tblastn", "tblastx"):
        for n in (4, 64):
            caps = ("-max_target_seqs", "5", "-comp_based_stats", "0") if program == "tblastn" else CAPS[1]
            yield Cell(PROGRAMS[program][0], program, caps, "6", n, "fragments", saturates=True)


@dataclass(frozen=True)
class Verdict:
    cell: Cell
    result: str  # identical, refused, differs, error, n/a
    detail: str = ""


class Judge:
    """Runs cells against data sets, caching BLAST+'s reference output per (set, program, options, outfmt)."""

    def __init__(self, sets: dict[str, DataSet], workdir: Path) -> None:
        self.sets = sets
        self.workdir = workdir
        self._references: dict[tuple, bytes | None] = {}
        self._full_lists: dict[tuple, int] = {}
        self._count = 0

    def reference(self, cell: Cell) -> bytes | None:
        key = (cell.dataset, cell.program, cell.options, cell.outfmt)
        if key not in self._references:
            data = self.sets[cell.dataset]
            out = self._out("ref")
            proc = subprocess.run(
                [cell.program, *self._args(cell, data, out)],
                cwd=data.reference_dir(), capture_output=True, timeout=1800,
            )  # fmt: skip
            self._references[key] = self._read(out, cell) if proc.returncode == 0 else None
        return self._references[key]

    def full_lists(self, cell: Cell) -> int:
        """How many queries fill BLAST+'s preliminary list on the unsplit database (read by the shim),
        cached as the reference is: the count depends on the BLAST+ command alone, which cells that differ
        only in their engine settings (fragments, traceback, runner, groups) share."""
        key = (cell.dataset, cell.program, cell.options, cell.outfmt)
        if key not in self._full_lists:
            self._full_lists[key] = self._count_full_lists(cell)
        return self._full_lists[key]

    def _count_full_lists(self, cell: Cell) -> int:
        library = shim()
        assert library is not None, "the preliminary-list shim needs a C compiler"
        data = self.sets[cell.dataset]
        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            args = self._args(cell, data, Path(os.devnull))
            args[args.index("-db") + 1] = str(data.reference_dir() / data.db)
            env = {**os.environ, "LD_PRELOAD": str(library), "PARAMEDIC_PRELIM": "1"}
            subprocess.run([cell.program, *args], cwd=tmp, env=env, check=True, capture_output=True)
            dump = Path(tmp, DUMP_NAME).read_bytes()
        full = at = 0
        while at < len(dump):
            _, _, lists = struct.unpack_from("=Iii", dump, at)
            at += 12
            for _ in range(lists):
                _, limit, count = struct.unpack_from("=iii", dump, at)
                at += 12 + 16 * count
                full += count == limit
        return full

    def judge(self, cell: Cell) -> Verdict:
        expected = self.reference(cell)
        if expected is None:
            return Verdict(cell, "n/a", "BLAST+ rejects it")
        full = self.full_lists(cell) if cell.saturates else 0
        if cell.saturates and not full:
            return Verdict(cell, "error", "the data no longer fills BLAST+'s preliminary list")
        data = self.sets[cell.dataset]
        out = self._out("paramedic")
        proc = subprocess.run(
            [str(BIN / "paramedic"), "search", cell.program, *self._args(cell, data, out),
             *cell.engine_args(), "--quiet"],
            cwd=data.fragments_dir(cell.fragments), capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if proc.returncode == 2:
            lines = proc.stderr.strip().splitlines()
            if len(lines) == 1 and not out.exists():
                return Verdict(cell, "refused", lines[0].removeprefix("paramedic: error: "))
            return Verdict(cell, "error", f"exit 2 without a clean refusal: {proc.stderr.strip()[:200]}")
        if proc.returncode != 0:
            return Verdict(cell, "error", f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
        given = _batches_given(out)
        actual = self._read(out, cell)
        if actual == expected:
            notes = [f"{full} queries fill the preliminary list" if full else "", given]
            return Verdict(cell, "identical", "; ".join(n for n in notes if n))
        return Verdict(cell, "differs", _first_difference(expected, actual))

    def _args(self, cell: Cell, data: DataSet, out: Path) -> list[str]:
        molecule = PROGRAMS[cell.program][1]
        return ["-query", str(data.queries[molecule]), "-db", data.db, *cell.options,
                "-outfmt", cell.outfmt, "-out", str(out)]  # fmt: skip

    def _out(self, who: str) -> Path:
        self._count += 1
        return self.workdir / f"{who}-{self._count}.out"

    def _read(self, out: Path, cell: Cell) -> bytes:
        """The output, with multi-file formats (13, 14: -out names a prefix) read file by file."""
        parts = [out, *sorted(out.parent.glob(out.name + "_*"))] if cell.outfmt in ("13", "14") else [out]
        data = b"".join(p.name.encode() + b"\n" + p.read_bytes() for p in parts if p.exists())
        for p in [*parts, out.with_name(out.name + ".run.json")]:
            p.unlink(missing_ok=True)
        if cell.outfmt.split()[0] in TEXT:
            data = without_posted_date(data, cell.outfmt) if b"Posted date" in data else data
        return data.replace(str(out).encode(), b"<out>").replace(out.name.encode(), b"<out>")


def _batches_given(out: Path) -> str:
    """How many BLAST+ batches of the traceback-once pieces aligned the searches' lists as given, without
    scanning for them (the run record's `injected` tasks), as a verdict's note; "" for none."""
    try:
        record = json.loads(out.with_name(out.name + ".run.json").read_text())
    except (OSError, ValueError):
        return ""
    given = sum(r["tasks"].get("injected", 0) for r in record.get("ranks_stats", []))
    notes = [f"{given} piece batches aligned as given" if given else ""]
    if record.get("fragment_groups"):
        notes.append(f"{record['fragments']} fragments in {record['fragment_groups']} searches per batch")
    return "; ".join(n for n in notes if n)


def _first_difference(expected: bytes, actual: bytes) -> str:
    a, b = expected.splitlines(), actual.splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"line {i + 1}: BLAST+ {x[:80]!r}, paramedic {y[:80]!r}"
    return f"BLAST+ {len(a)} lines, paramedic {len(b)} lines"


def environment_note() -> str:
    return f"{os.uname().sysname} {os.uname().machine}, {os.cpu_count()} cores"
