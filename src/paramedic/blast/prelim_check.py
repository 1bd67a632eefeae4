"""Checks, once per BLAST+ installation, that the preliminary-list shim reads this BLAST+ right.

The shim (native/prelim.c) reads BLAST+ 2.12's structures by their layout. Every fragment search is
checked as it runs (paramedic.blast.prelim.read_dump), but a BLAST+ with other internals should be
found before the job starts, not by its first search: a three-protein search whose preliminary list is
known is run with the shim, and the result is cached per BLAST+ executable (path, size, modification
time) and shim build.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import subprocess
import tempfile
from pathlib import Path

from paramedic.blast.options import BlastOptions
from paramedic.blast.prelim import (
    DUMP_NAME,
    INJECT_NAME,
    INJECT_NOTE,
    LISTS_NAME,
    environment,
    expected_limit,
    inject_environment,
    injected,
    injection,
    piece_batch_residues,
    query_batches,
    read_dump,
    whole_lists,
)
from paramedic.blast.tools import require_tool
from paramedic.cache import file_key, read_cached, write_cached
from paramedic.errors import BlastError

# Three unrelated made-up proteins; the queries are the first two, so each query's list holds its own
# subject first (best e-value), the third protein nowhere.
_PROTEINS = (
    "MSTNPKPQRKTKRNTNRRPQDVKFPGGGQIVGGVYLLPRRGPRLGVRATRKTSERSQPRGRRQPIPKARRPEGRTWAQPGYPWPLYGNEG",
    "MKVLAAGIVGLLLAQGCSSDEKKEEVKTEAPKAEETTPAAEETAPAAEEKPAEEKPAEEQKPAEETKSEEKPAAAEKPAEEKPAAEEPKA",
    "MWHRTLLLSGFAVLAYAQNLTETCDRYLGEHNHCLIGPCHDWSTFSPQANGTRDYHFWVNLTKIGEFYQAYNETVLRAKCLPAGTWQSS",
)


@functools.cache
def check_shim() -> None:
    """Raise BlastError unless the shim reads this BLAST+'s preliminary list as 2.12's."""
    blastp = require_tool("blastp")
    env = environment()
    key = hashlib.sha256(f"{file_key(blastp)}:{env['LD_PRELOAD']}".encode()).hexdigest()[:16]
    if read_cached("prelim-check", key) == b"ok\n":
        return
    with tempfile.TemporaryDirectory(prefix="paramedic-prelim-check-") as tmp:
        work = Path(tmp)
        (work / "db.fasta").write_text("".join(f">s{i}\n{p}\n" for i, p in enumerate(_PROTEINS)))
        (work / "q.fasta").write_text("".join(f">q{i}\n{p}\n" for i, p in enumerate(_PROTEINS[:2])))
        try:
            subprocess.run(
                [require_tool("makeblastdb"), "-in", "db.fasta", "-dbtype", "prot", "-out", "db"],
                cwd=work, check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            subprocess.run(
                [blastp, "-query", "q.fasta", "-db", "db", "-outfmt", "6", "-out", os.devnull],
                cwd=work, check=True, capture_output=True, timeout=60, env=_check_env(env),
            )  # fmt: skip
            dump = (work / DUMP_NAME).read_bytes()
        except (OSError, subprocess.SubprocessError) as exc:
            raise _refused(f"the check search failed: {exc}") from None
    lengths = [len(p) for p in _PROTEINS[:2]]
    lists = read_dump(dump, lengths, 10000, range(len(_PROTEINS)))
    limit = expected_limit(BlastOptions({}), "blastp")
    for query, found in enumerate(lists):
        if found is None or found.limit != limit or not found.candidates:
            raise _refused(f"query {query + 1} of the check has no list of size {limit}")
        best = min(found.candidates, key=lambda c: c.key())
        if best.gid != query or any(c.gid == 2 for c in found.candidates):
            raise _refused(f"query {query + 1} of the check has another list than BLAST+ 2.12 keeps")
    write_cached("prelim-check", key, b"ok\n")


def _check_env(extra: dict[str, str]) -> dict[str, str]:
    """The check searches' environment: the user's, without a BATCH_SIZE (the check models BLAST+'s own
    batches; the user's variable made the first search after an installation refuse the shim, exit 5,
    or cache "no" for pieces handed their lists), plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if k != "BATCH_SIZE"}, **extra}


def _refused(why: str) -> BlastError:
    return BlastError(
        f"BLAST+'s preliminary hit list cannot be read from this BLAST+ ({why}); the fragments strategy "
        "is built for BLAST+ 2.12: use --strategy queries"
    )


@functools.cache
def injection_works(program: str = "blastp") -> bool:
    """Whether `program` aligns given preliminary lists as the scan that found them would (the
    "Traceback once" pieces): the check's lists, written whole by a search stopped after its
    preliminary stage, aligned by a search that does not scan, must give the plain search's report.
    blastp checks the programs of protein databases' layout, blastn its own (megablast, and a batch
    size it is given). False (pieces then scan for their lists) when they do not; cached as
    `check_shim` is."""
    tool = "blastn" if program == "blastn" else "blastp"
    executable = require_tool(tool)
    preload = inject_environment(tool, BlastOptions({}))["LD_PRELOAD"]
    key = hashlib.sha256(f"{file_key(executable)}:{preload}".encode()).hexdigest()[:16]
    cached = read_cached(f"inject-check-{tool}", key)
    if cached in (b"yes\n", b"no\n"):
        return cached == b"yes\n"
    works = _injection_check(tool, executable)
    write_cached(f"inject-check-{tool}", key, b"yes\n" if works else b"no\n")
    return works


def _check_set(tool: str) -> tuple[list[str], list[str], str]:
    """The check's queries, its database's subjects and their kind. For blastn: made-up DNA; the queries
    are the first two subjects as they were before each got a substitution every 50 bases and a
    deletion, so that their alignments are gapped."""
    if tool == "blastp":
        return list(_PROTEINS[:2]), list(_PROTEINS), "prot"
    rng = random.Random(21)
    subjects = ["".join(rng.choice("ACGT") for _ in range(600)) for _ in range(6)]
    queries = subjects[:2]
    for i in (0, 1):
        bases = list(subjects[i])
        for at in range(25, len(bases), 50):
            bases[at] = "A" if bases[at] != "A" else "C"
        subjects[i] = "".join(bases[:300] + bases[303:])
    return queries, subjects, "nucl"


def _injection_check(tool: str, executable: str) -> bool:
    queries, subjects, dbtype = _check_set(tool)
    options = BlastOptions({})
    with tempfile.TemporaryDirectory(prefix="paramedic-inject-check-") as tmp:
        work = Path(tmp)
        (work / "db.fasta").write_text("".join(f">s{i}\n{p}\n" for i, p in enumerate(subjects)))
        (work / "q.fasta").write_text("".join(f">q{i}\n{p}\n" for i, p in enumerate(queries)))
        lengths = [len(p) for p in queries]
        # BLAST+'s own blastp batches (a user's BATCH_SIZE is not passed to the check), blastn's forced
        batches = query_batches(lengths, 10000 if tool == "blastp" else piece_batch_residues(tool, options))

        def search(out: str, env: dict[str, str]) -> bytes:
            subprocess.run(
                [executable, "-query", "q.fasta", "-db", "db", "-outfmt", "0", "-out", out],
                cwd=work, check=True, capture_output=True, timeout=60, env=_check_env(env),
            )  # fmt: skip
            return (work / out).read_bytes()

        try:
            subprocess.run(
                [require_tool("makeblastdb"), "-in", "db.fasta", "-dbtype", dbtype, "-out", "db"],
                cwd=work, check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            plain = search("plain.out", {})
            search("prelim.out", environment(prelim_only=True, whole_lists=True, program=tool))
            gids = range(len(subjects))
            lists = whole_lists((work / LISTS_NAME).read_bytes(), len(queries), gids, tool)
            residues = 10000 if tool == "blastp" else None  # blastn's app sizes its own batches
            dump = read_dump((work / DUMP_NAME).read_bytes(), lengths, residues, gids)
            found = [[c.gid for c in (p.candidates if p else ())] for p in dump]
            if lists is None:
                return False
            given = injection([(0, lists)], 0, found, batches, tool)
            if given is None or not all(found):
                return False
            (work / INJECT_NAME).write_bytes(given)
            aligned = search("inject.out", inject_environment(tool, options))
            note = (work / INJECT_NOTE).read_text()
        except (OSError, subprocess.SubprocessError, BlastError):
            return False
    return injected(note) == len(batches) and aligned == plain
