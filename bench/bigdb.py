"""bench/bigdb: a large database and a few queries, the job database segmentation exists for (issue 21).

Side by side in one run, alternating the order every round, on the same cores:
  - `blastp -num_threads N` (BLAST+'s default -mt_mode 0: threads over the database);
  - `blastp -num_threads N -mt_mode 1` (threads over the queries);
  - `paramedic search` with its defaults (`auto` chooses, the run record says why);
  - `paramedic search --strategy fragments` (the engine path by name);
  - `paramedic search --strategy queries` (query segmentation by name: is auto's choice the faster?);
  - with --ablation, also `--strategy fragments` with its pieces scanning for their lists
    (PARAMEDIC_PIECE_LISTS=scan) and with `--fragment-groups off` (one search per fragment): what each
    of the two costs saved;
  - with --mpi, also `paramedic search --runner mpi` (the default's job on MPI ranks under mpiexec,
    beside the default's worker threads of one process);
and the same for blastn. Wall seconds are measured around each command; CPU seconds are every process
the command started, read from a cpuacct cgroup made for the run (as root; else the waited-for
children's rusage). Ratios are against the faster BLAST+ mode of the same round; the medians over the
rounds after a warm-up are reported, and every paramedic output is compared with BLAST+'s byte for byte.

The databases are built from the real data `make data` installs, enlarged as bench/memory.py does:
  - proteins: the 20,000 mmseqs2 proteins, 3 copies with 15% random substitutions (families: queries
    that fill BLAST+'s preliminary list), and 17 decoy copies (reversed, rotated, conservatively
    substituted): 420,000 proteins, 190 M residues;
  - nucleotides: the ragout-examples genomes (65 Mbp), 2 copies with 10% substitutions and 2 reversed
    decoy copies, cut into 1,500 bp pieces: 216,000 sequences, 325 Mbp.
Queries: 20 (or --queries) mmseqs2 queries of at least 450 residues (seeded; past the 181 such, the shorter
ones too: 500 is the whole set), and 20 pieces of 1-3 kbp
cut from the genomes (seeded, every other one reverse complemented). Kept in --work between runs.

The shape `blastn-families` (in --programs) is blastn where every query fills its preliminary list: 100
real 1,500 bp pieces of the genomes, each with 2,000 copies at 0.5-8% substitutions (a third with a
3-base deletion): 200,000 sequences, 300 Mbp, every query a family's source (2,000 subjects, more than
blastn's list of 500 keeps).

    .venv/bin/python bench/bigdb.py --queries 1,20 --rounds 3 [--programs blastp,blastn,blastn-families]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from paramedic.report.record import RunRecord

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
BIN = Path(sys.executable).parent
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
AMINO = "ACDEFGHIKLMNPQRSTVWY"
COMPLEMENT = str.maketrans("ACGTacgtN", "TGCAtgcaN")
sys.path.insert(0, str(HERE))
from memory import read_fasta, write_decoys  # noqa: E402  (bench/memory.py: the same enlargement)

# -- data -------------------------------------------------------------------------------------------


def protein_fasta(out: Path) -> None:
    proteins = read_fasta(DATA / "mmseqs2" / "DB.fasta")
    write_decoys(proteins, 17, out)
    rng = random.Random(7)
    with open(out, "a") as fh:
        for k in range(1, 4):
            for header, seq in proteins:
                mutated = "".join(rng.choice(AMINO) if rng.random() < 0.15 else c for c in seq)
                name, _, rest = header.partition(" ")
                fh.write(f">mut{k}_{name} {rest}\n{mutated}\n")


def genomes() -> list[tuple[str, str]]:
    paths = sorted((DATA / "ragout").glob("*/*.fasta.gz")) + sorted(
        (DATA / "ragout").glob("*/references/*.fasta.gz")
    )
    return [r for p in paths for r in read_fasta(p)]


def nucleotide_fasta(out: Path, piece: int = 1500) -> None:
    rng = random.Random(11)
    with open(out, "w") as fh:
        for copy in ("", "mut1_", "mut2_", "rev1_", "rev2_"):
            for index, (_, seq) in enumerate(genomes()):
                seq = seq.upper()
                if copy.startswith("rev"):
                    seq = seq[::-1]
                if copy:
                    seq = "".join(rng.choice("ACGT") if rng.random() < 0.1 else c for c in seq)
                name = f"g{index}"  # contig names repeat across the sets, and ids are at most 50 long
                for at in range(0, len(seq) - piece // 2, piece):
                    fh.write(f">{copy}{name}_{at + 1}\n{seq[at : at + piece]}\n")


def protein_queries(n: int, out: Path) -> None:
    records = read_fasta(DATA / "mmseqs2" / "QUERY.fasta")
    random.Random(21).shuffle(records)
    # the long ones first; past the 181 of them, the rest (500 queries: all of the set's)
    chosen = sorted(records, key=lambda r: len(r[1]) < 450)[:n]
    out.write_text("".join(f">{h}\n{s}\n" for h, s in chosen))


def nucleotide_queries(n: int, out: Path) -> None:
    rng = random.Random(5)
    source = [g for g in genomes() if len(g[1]) > 10_000]
    with open(out, "w") as fh:
        for i in range(n):
            header, seq = rng.choice(source)
            length = rng.randint(1000, 3000)
            start = rng.randrange(0, len(seq) - length)
            piece = seq[start : start + length].upper()
            if i % 2:
                piece = piece.translate(COMPLEMENT)[::-1]
            fh.write(f">q{i + 1} {header.split()[0]}:{start + 1}-{start + length}\n{piece}\n")


def family_sources() -> list[str]:
    rng = random.Random(3)
    big = [seq.upper() for _, seq in genomes() if len(seq) > 20_000]
    sources: list[str] = []
    while len(sources) < 100:
        seq = rng.choice(big)
        at = rng.randrange(0, len(seq) - 1500)
        piece = seq[at : at + 1500]
        if set(piece) <= set("ACGT"):
            sources.append(piece)
    return sources


def family_fasta(out: Path) -> None:
    import numpy as np  # a dependency of the trace codec; 300 M random draws in Python took minutes

    rng = np.random.default_rng(3)
    letters = np.frombuffer(b"ACGT", dtype=np.uint8)
    with open(out, "w") as fh:
        for f, source in enumerate(family_sources()):
            bases = np.frombuffer(source.encode(), dtype=np.uint8)
            for c in range(2000):
                changed = rng.random(bases.size) < rng.uniform(0.005, 0.08)
                copy = bases.copy()
                copy[changed] = letters[rng.integers(0, 4, int(changed.sum()))]
                seq = copy.tobytes().decode()
                if c % 3 == 0:
                    cut = int(rng.integers(100, 1400))
                    seq = seq[:cut] + seq[cut + 3 :]
                fh.write(f">fam{f}_c{c}\n{seq}\n")


def family_queries(n: int, out: Path) -> None:
    out.write_text("".join(f">q{i + 1} family {i}\n{s}\n" for i, s in enumerate(family_sources()[:n])))


# shape -> (BLAST+ program, database name, its FASTA, its queries)
DATABASES: dict[str, tuple[str, str, Callable[[Path], None], Callable[[int, Path], None]]] = {
    "blastp": ("blastp", "prot", protein_fasta, protein_queries),
    "blastn": ("blastn", "nucl", nucleotide_fasta, nucleotide_queries),
    "blastn-families": ("blastn", "fam", family_fasta, family_queries),
}


def database(work: Path, shape: str, fragments: int) -> Path:
    """The formatted database (built once, kept in `work`)."""
    program, name, make, _ = DATABASES[shape]
    dbtype = "prot" if program == "blastp" else "nucl"
    db = work / f"{name}-f{fragments}"
    if (db / "paramedic.json").is_file() or (db / "manifest.json").is_file():
        return db  # `paramedic format`'s database, or one of an earlier layout kept in `work`
    fasta = work / f"{name}.fasta"
    if not fasta.is_file():
        print(f"building {fasta.name} ...", file=sys.stderr, flush=True)
        make(fasta.with_suffix(".tmp"))
        fasta.with_suffix(".tmp").rename(fasta)
    subprocess.run(
        [BIN / "paramedic", "format", "--in", fasta, "--dbtype", dbtype, "--fragments", str(fragments),
         "--out", db, "--quiet"],
        check=True,
    )  # fmt: skip
    return db


# -- measuring --------------------------------------------------------------------------------------


def measured(cmd: list[str | Path], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process the command started)."""
    group = CPUACCT / f"paramedic-bench-{os.getpid()}"
    use_cgroup = os.geteuid() == 0 and CPUACCT.is_dir()
    if use_cgroup:
        group.mkdir(exist_ok=True)

    def enter() -> None:
        if use_cgroup:
            (group / "tasks").write_text(str(os.getpid()))

    before = os.times()
    start = time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, preexec_fn=enter)
    wall = time.perf_counter() - start
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(map(str, cmd))}\n{proc.stderr[-2000:]}")
    if use_cgroup:
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9
        group.rmdir()  # empty: every process of the command has ended
    else:
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu


# --only's names for the runs
RUN_KEYS = {
    "blast mt_mode 0": "blast0",
    "blast mt_mode 1": "blast1",
    "paramedic (default)": "default",
    "paramedic --strategy fragments": "fragments",
    "paramedic --strategy queries": "queries",
    "paramedic fragments, pieces scan": "scan",
    "paramedic fragments --fragment-groups off": "ungrouped",
    "paramedic --runner mpi": "mpi",
}


def run_shape(
    work: Path,
    shape: str,
    n: int,
    rounds: int,
    cores: int,
    fragments: int,
    mpi: bool = False,
    ablation: bool = False,
    only: frozenset[str] = frozenset(),
    warmup: bool = True,
) -> list[str]:
    program = DATABASES[shape][0]
    db = database(work, shape, fragments)
    queries = work / f"{shape}-q{n}.fasta"
    DATABASES[shape][3](n, queries)
    # BLAST+'s own -db: the alias `paramedic format` writes beside the database (the earlier layout's
    # whole-database volume inside it)
    whole = db / "whole" if (db / "manifest.json").is_file() else db
    blast_common: list[str | Path] = [program, "-query", queries, "-outfmt", "6", "-num_threads", str(cores)]
    paramedic: list[str | Path] = [BIN / "paramedic", "search", program, "-query", queries, "-db", db,
                                   "-outfmt", "6", "--np", str(cores), "--quiet"]  # fmt: skip
    runs: dict[str, Callable[[Path], list[str | Path]]] = {
        "blast mt_mode 0": lambda out: [*blast_common, "-db", whole, "-out", out],
        "blast mt_mode 1": lambda out: [*blast_common, "-db", whole, "-mt_mode", "1", "-out", out],
        "paramedic (default)": lambda out: [*paramedic, "-out", out],
        "paramedic --strategy fragments": lambda out: [*paramedic, "-out", out, "--strategy", "fragments"],
        # the other strategy by name, so that auto's choice is judged against both side by side
        "paramedic --strategy queries": lambda out: [*paramedic, "-out", out, "--strategy", "queries"],
    }
    if ablation:
        runs["paramedic fragments, pieces scan"] = lambda out: [
            "env", "PARAMEDIC_PIECE_LISTS=scan", *paramedic, "-out", out, "--strategy", "fragments"
        ]  # fmt: skip
        runs["paramedic fragments --fragment-groups off"] = lambda out: [
            *paramedic, "-out", out, "--strategy", "fragments", "--fragment-groups", "off"
        ]  # fmt: skip
    if mpi:
        runs["paramedic --runner mpi"] = lambda out: [*paramedic, "-out", out, "--runner", "mpi"]
    if only:
        missing = only - {RUN_KEYS[name] for name in runs}
        if missing:  # an ablation or MPI run without its flag would otherwise be skipped in silence
            raise SystemExit(
                f"--only {','.join(sorted(missing))}: add --ablation (scan, ungrouped) or --mpi (mpi)"
            )
        runs = {name: run for name, run in runs.items() if RUN_KEYS[name] in only}
    names = list(runs)
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    reasons: dict[str, str] = {}
    reference: bytes | None = None
    first = 0 if warmup else 1
    for r in range(first, rounds + 1):  # round 0 warms the page cache and is not counted
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            out = work / f"out-{shape}-{n}-{name.split()[0]}-{len(name)}.tsv"
            wall, cpu = measured(runs[name](out), work)
            data = out.read_bytes()
            if name == "blast mt_mode 0":
                if reference is not None and data != reference:
                    raise SystemExit("BLAST+ changed its own output between rounds")
                reference = data
            if name.startswith("paramedic"):
                record = RunRecord.load(out.with_name(out.name + ".run.json"))
                reasons[name] = (
                    f"{record.strategy}"
                    + (f", traceback {record.traceback}" if record.traceback else "")
                    + (f": {record.strategy_reason['reason']}" if record.strategy_reason else "")
                    + (f"; {record.traceback_reason}" if record.traceback_reason else "")
                    + (
                        f"; {record.fragments} fragments in {record.fragment_groups} searches per batch"
                        if record.fragment_groups
                        else ""
                    )
                    + f"; {sum(r.tasks.get('injected', 0) for r in record.ranks_stats)} piece batches "
                    "aligned the searches' lists as given"
                )
            if r:
                figures[name].append((wall, cpu))
            print(f"  round {r} {shape} {n}q {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr)
        for name in names:
            out = work / f"out-{shape}-{n}-{name.split()[0]}-{len(name)}.tsv"
            if name in runs and out.read_bytes() != reference and name != "blast mt_mode 1":
                raise SystemExit(f"{name}: output differs from BLAST+'s ({shape}, {n} queries)")
    med = {
        name: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for name, v in figures.items()
    }
    blast = min((med[name] for name in med if name.startswith("blast ")), key=lambda m: m[0])
    best, blast_cpu = blast
    letters = sum(len(line) for line in queries.read_text().splitlines() if not line.startswith(">"))
    n = queries.read_text().count(">")
    lines = [
        f"### {shape}, {n} quer{'y' if n == 1 else 'ies'} ({letters:,} letters), {cores} cores, "
        f"medians of {rounds} rounds",
        "",
        "| run | wall s | CPU s | wall vs faster BLAST+ | CPU vs it |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        wall, cpu = med[name]
        lines.append(f"| {name} | {wall:.1f} | {cpu:.1f} | {wall / best:.2f} | {cpu / blast_cpu:.2f} |")
    lines.append("")
    for name, reason in reasons.items():
        lines.append(f"- {name}: {reason}")
    mt1 = ""
    if "blast mt_mode 1" in runs:
        mt1_out = work / f"out-{shape}-{n}-blast-{len('blast mt_mode 1')}.tsv"
        same = "identical to" if mt1_out.read_bytes() == reference else "framed differently from"
        mt1 = f" (-mt_mode 1's output {same} -mt_mode 0's)"
    lines += [f"- every paramedic output identical to BLAST+'s{mt1}", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", default="1,20", help="query counts, comma-separated (default 1,20)")
    parser.add_argument(
        "--programs", default="blastp,blastn", help=f"shapes, comma-separated: {', '.join(DATABASES)}"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fragments", type=int, default=8)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/paramedic/bench-bigdb")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument(
        "--mpi", action="store_true", help="also the default's job on MPI ranks (--runner mpi)"
    )
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="also --strategy fragments with pieces scanning for their lists, and with --fragment-groups off",
    )
    parser.add_argument(
        "--only",
        default="",
        help=f"only these runs, comma-separated ({', '.join(RUN_KEYS.values())}); blast0 is always run, "
        "as the reference every output is compared with",
    )
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="count every round (the page cache already holds the database: long jobs, one round)",
    )
    args = parser.parse_args()
    only = frozenset(args.only.split(",")) - {""}
    if only - set(RUN_KEYS.values()):
        raise SystemExit(f"--only: choose from {', '.join(RUN_KEYS.values())}")
    if only:
        only |= {"blast0"}
    args.work.mkdir(parents=True, exist_ok=True)
    lines = [
        f"## bigdb: a large database, few queries ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Command: `.venv/bin/python bench/bigdb.py {' '.join(sys.argv[1:])}`; load average before: "
        f"{os.getloadavg()[0]:.1f}",
        "",
    ]
    for shape in args.programs.split(","):
        if shape not in DATABASES:
            raise SystemExit(f"unknown shape {shape!r}: choose from {', '.join(DATABASES)}")
        for n in (int(x) for x in args.queries.split(",")):
            lines += run_shape(
                args.work,
                shape,
                n,
                args.rounds,
                args.cores,
                args.fragments,
                args.mpi,
                args.ablation,
                only,
                not args.no_warmup,
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_results:
        with open(HERE / "RESULTS.md", "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
