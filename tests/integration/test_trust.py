"""Issue 23: nothing unverified reaches an output (real BLAST+, real mpiexec ranks, real files).

Bytes are changed the way a careless copy or an attacker changes them: rewritten in place, so the size and
the inode stay, and with the modification time put back. Each run must either write BLAST+'s bytes or
refuse with a clear one-line error.

800 of the mmseqs2 proteins in 3 fragments, 12 queries.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from paramedic.engine.rank.metadata import _digest
from tests.conftest import paramedic, take_fasta
from tests.integration.equality import Site
from tests.support.databases import Databases

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def site(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("trust")
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", root / "queries.fasta", 12)
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", root / "db.fasta", 800)
    site = Site(root, "blastp", "uniprot", "prot", "mmseqs2 part", {})
    site.build(root / "db.fasta", fragment_counts=(3,), layout="fragments")
    return site


def flip_keeping_times(path: Path, every: int = 97) -> None:
    """Rewrite `path` in place (same inode, same size) with bytes changed, and put its times back."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data), every):
        data[i] ^= 0x5A
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


def search(
    site: Site, name: str, *flags: str, db_dir: str = "p3", check: bool = True, quiet_ok: bool = False
):
    out = site.root / f"{name}.out"
    proc = paramedic(
        "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot", "-outfmt", "0",
        "-out", str(out), "--np", "2", "--batch", "6", "--quiet", *flags, cwd=site.root / db_dir, check=check,
    )  # fmt: skip
    if check:
        site.assert_matches(out, None, "0")
        assert quiet_ok or proc.stderr == "", proc.stderr
    return proc, out


def copy_db(site: Site, name: str) -> None:
    import shutil

    shutil.copytree(site.root / "p3", site.root / name, symlinks=True)


def test_a_volume_changed_with_its_times_kept_is_refused(site: Site) -> None:
    """Item 1: a database volume rewritten in place after a search verified it."""
    copy_db(site, "changed")
    search(site, "before", db_dir="changed")  # verified once (and, before issue 23, remembered)
    flip_keeping_times(site.root / "changed" / "uniprot" / "f001.psq")
    proc, out = search(site, "after", db_dir="changed", check=False)
    assert proc.returncode == 4, proc.stderr
    assert "corrupt database" in proc.stderr and "f001" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize("traceback", ["once", "per-fragment"])
def test_a_fragment_alias_naming_another_volume_is_refused(site: Site, traceback: str) -> None:
    """Item 1 probed again: a fragment's alias (what its searches name as -db) rewritten to name another
    fragment's volume, same size, times kept. Every volume still matched its digest: with traceback once
    the report was another one, exit 0 (388 lines differ); per fragment, exit 5 "unexpected BLAST+" and a
    journal of that work kept for the next run. Now: exit 4, one line, no output, no journal."""
    name = f"alias-{traceback}"
    copy_db(site, name)
    alias = site.root / name / "uniprot" / "frag001.pal"
    st = alias.stat()
    text = alias.read_bytes()
    assert b"DBLIST f001\n" in text
    with open(alias, "r+b") as fh:
        fh.write(text.replace(b"DBLIST f001\n", b"DBLIST f000\n"))
    os.utime(alias, ns=(st.st_atime_ns, st.st_mtime_ns))
    flags = ("--strategy", "fragments", "--traceback", traceback)
    proc, out = search(site, name, *flags, db_dir=name, check=False)
    assert proc.returncode == 4, proc.stderr
    assert "corrupt database: alias frag001.pal" in proc.stderr and proc.stderr.count("\n") == 1
    assert not out.exists() and not out.with_name(f".{out.name}.journal").exists()


def test_a_volume_changed_during_the_search_is_refused_and_its_work_not_kept(site: Site) -> None:
    """Item 1, probed again: the volume rewritten in place (times kept) while the search runs, after the
    job's digest: exit 0 with another report before. The volumes' inodes, sizes and times (ctime, which
    no user sets back) are taken before the digest and compared before the output is made final: exit
    4, no output, and no journal (its work was done on other bytes); also when BLAST+ failed on the bytes
    (exit 5 before, "NCBI C++ Exception")."""
    import time

    from tests.conftest import BIN

    copy_db(site, "midway")
    out = site.root / "midway.out"
    journal = site.root / ".midway.out.journal"
    argv = [str(BIN / "paramedic"), "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db",
            "uniprot", "-out", str(out), "--np", "2", "--quiet", "--strategy", "fragments", "--batch", "1",
            "--fragment-groups", "off"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=site.root / "midway", stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(journal.glob("search/[0-9]*-[0-9]*")):  # a search has ended: the digest is long done
        assert proc.poll() is None and time.monotonic() < deadline, "the search ended first"
        time.sleep(0.01)
    # bytes changed in place, times kept: BLAST+ may search them (another report) or fail on them (exit
    # 139 or 255): either way the refusal names the database
    flip_keeping_times(site.root / "midway" / "uniprot" / "f001.psq")
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 4, stderr
    assert "the database changed while this search ran (f001.psq" in stderr and "Traceback" not in stderr
    assert not out.exists() and not journal.exists()


def test_a_staged_copy_changed_with_its_times_kept_is_copied_again(site: Site, tmp_path: Path) -> None:
    """Item 1: a copy in the stage cache rewritten in place after it was sealed: never searched."""
    cache = tmp_path / "cache"
    search(site, "cold", "--stage", str(cache))
    copies = sorted(cache.glob("*/f00*/f00*.psq"))
    assert len(copies) == 3
    for copy in copies:
        flip_keeping_times(copy)
    proc, out = search(site, "warm", "--stage", str(cache))  # BLAST+'s bytes: the copies were not used
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    assert record["stage"]["discarded"] == 3 and record["stage"]["copies"] == 3


def test_a_staged_copy_changed_within_a_job_is_never_searched_unseen(site: Site, tmp_path: Path) -> None:
    """Item 3, probed again: a worker digests a copy the first time it uses it; a copy rewritten in place
    (times kept) after that, in the same job, passed its seal (sizes, mtimes, inodes) and was searched:
    exit 0 with another report. The seal holds ctimes too, and is checked again when a search ends."""
    from paramedic.db.locate import resolve_database
    from paramedic.engine.core.settings import StageSettings
    from paramedic.engine.rank.staging import Stager
    from paramedic.errors import DatabaseError

    db, _ = resolve_database("uniprot", site.root / "p3")
    stager = Stager(StageSettings(tmp_path / "cache"), db)
    with stager.fragment(1) as copy:  # copied, verified: this process trusts it from now on
        psq = copy.directory / "f001.psq"
    flip_keeping_times(psq)
    with stager.fragment(1) as again:  # between two uses: discarded and copied afresh, never used
        assert (again.directory / "f001.psq").read_bytes() == (db.directory / "f001.psq").read_bytes()
    assert (stager.cache.stats.discarded, stager.cache.stats.copies) == (1, 2)
    with pytest.raises(DatabaseError, match="the copy of f001 changed while it was searched"):
        with stager.fragment(1) as during:  # during a use: that search read unverified bytes
            flip_keeping_times(during.directory / "f001.psq")
    with stager.fragment(1) as after:  # the next use copies it afresh
        assert (after.directory / "f001.psq").read_bytes() == (db.directory / "f001.psq").read_bytes()
    assert stager.cache.stats.discarded == 2


def test_a_killed_search_with_damaged_or_foreign_journal_records_redoes_them(
    databases: Databases, tmp_path: Path
) -> None:
    """Items 1 and 10: after a kill, a journal piece with one byte flipped (times kept), a truncated one, a
    garbage one, a garbage search record, and search records copied in from a killed search with another
    -evalue (valid records, other hits: records are bound to their journal, like pieces) are dropped and
    their work done again: BLAST+'s bytes. (One test for both: they shared the data, the reference and a
    kill, 24 s as two tests.)"""
    from tests.integration import test_resume as resume

    data = resume.data.__wrapped__(databases, _Factory(tmp_path / "data"))  # type: ignore[attr-defined]
    journals = []
    for name, evalue, ready in (
        ("ours", "1e-5", resume.pieces_done(3)),
        ("theirs", "10", resume.searches_done(4)),
    ):
        work = tmp_path / name
        work.mkdir()
        out = work / "hits.txt"
        args = [*resume.blast_args(data.queries, data.db, out)[:-1], evalue]
        command = ["search", "blastp", *args, *resume.ENGINE]
        resume.kill_every_rank_when(command, work, work / ".hits.txt.journal", ready)
        journals.append((work, command))
    (ours, command), (theirs, _) = journals
    journal = ours / ".hits.txt.journal"
    pieces = sorted(journal.glob("piece/[0-9]*"), key=lambda p: int(p.name))
    flip_keeping_times(pieces[0], every=1 << 30)
    pieces[1].write_bytes(pieces[1].read_bytes()[:30])
    pieces[2].write_bytes(b"garbage")
    records = sorted(journal.glob("search/[0-9]*-[0-9]*"))
    records[0].write_bytes(b"\x00garbage")
    copied = 0
    for record in records[1:]:
        foreign = theirs / ".hits.txt.journal" / "search" / record.name
        if foreign.exists():
            record.write_bytes(foreign.read_bytes())
            copied += 1
    assert copied > 0
    proc = resume.paramedic(*command, "--np", "1", cwd=ours, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (ours / "hits.txt").read_bytes() == data.reference
    assert "dropped" in proc.stderr and "Traceback" not in proc.stderr


def test_a_journal_another_user_planted_beside_the_output_is_never_resumed(
    databases: Databases, tmp_path: Path
) -> None:
    """Rule of items 1 and 4: the output in a shared directory (sticky and world-writable, as /tmp).
    Another user who can run the same search kills it and plants its journal as `.hits.txt.journal`
    there, with a piece of their own bytes tagged with their job.json's key: the victim's search resumed
    from it, exit 0, the planted bytes in its output. Now a journal another user owns is dropped, or
    refused when it cannot be removed (exit 6, one line); one of the user's own that others can write is
    dropped and its work done again."""
    import hashlib
    import hmac
    import shutil

    from paramedic.engine.rank.journal import PIECE_MAGIC
    from tests.integration import test_resume as resume

    data = resume.data.__wrapped__(databases, _Factory(tmp_path / "data"))  # type: ignore[attr-defined]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    their_command = ["search", "blastp", *resume.blast_args(data.queries, data.db, theirs / "hits.txt"),
                     *resume.ENGINE]  # fmt: skip
    resume.kill_every_rank_when(their_command, theirs, theirs / ".hits.txt.journal", resume.pieces_done(2))
    planted = theirs / ".hits.txt.journal"
    key = bytes.fromhex(json.loads((planted / "job.json").read_text())["key"])
    piece = (planted / "piece" / "0").read_bytes()[len(PIECE_MAGIC) + 32 :]
    forged = piece.replace(b"Length=", b"Length=1forged", 1)  # still a report, with words of their choosing
    assert forged != piece
    tag = hmac.new(key, b"piece/0\0" + forged, hashlib.sha256).digest()
    (planted / "piece" / "0").write_bytes(PIECE_MAGIC + tag + forged)

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    journal = shared / ".hits.txt.journal"
    out = shared / "hits.txt"
    command = ["search", "blastp", *resume.blast_args(data.queries, data.db, out), *resume.ENGINE]

    def plant(owner: int, mode: int) -> None:
        shutil.rmtree(journal, ignore_errors=True)
        shutil.copytree(planted, journal)
        for path in [journal, *journal.rglob("*")]:
            os.chown(path, owner, owner)
            path.chmod(mode if path.is_dir() else 0o666)

    # another user's journal they left open to all: removed, searched afresh
    plant(65534, 0o777)
    proc = resume.paramedic(*command, "--np", "2", cwd=shared, check=False)
    assert proc.returncode == 0, proc.stderr
    assert b"1forged" not in out.read_bytes(), proc.stderr
    assert out.read_bytes() == data.reference
    assert "owned by another user" in proc.stderr and "dropped" in proc.stderr
    out.unlink()
    # the user's own journal that others can write: dropped, searched afresh
    plant(os.geteuid(), 0o777)
    proc = resume.paramedic(*command, "--np", "2", cwd=shared, check=False)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == data.reference
    assert "others can write" in proc.stderr and "Traceback" not in proc.stderr
    assert not journal.exists()


def test_blast_warnings_are_passed_on_not_swallowed(site: Site, tmp_path: Path) -> None:
    """Item 18: BLAST+ warns about an all-X query and exits 0; the user sees its warning (once per worker
    rank, not once per fragment and batch), and the search still ends in its report."""
    queries = tmp_path / "with-all-x.fasta"
    queries.write_text(
        (site.root / "queries.fasta").read_text() + ">allx nothing to align\n" + "X" * 60 + "\n"
    )
    out = tmp_path / "hits.txt"
    proc = paramedic(
        "search", "blastp", "-query", str(queries), "-db", "uniprot", "-outfmt", "0", "-out", str(out),
        "--np", "2", "--batch", "6", "--quiet", cwd=site.root / "p3", check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warned = [ln for ln in proc.stderr.splitlines() if "Karlin-Altschul" in ln]
    assert 1 <= len(warned) <= 2, proc.stderr  # one per worker rank at most
    assert all(ln.startswith("paramedic: warning: blastp: ") and "allx" in ln for ln in warned), warned
    assert "Query_" not in proc.stderr and out.stat().st_size > 0


def test_queries_blast_searches_are_searched_and_its_warnings_said_in_a_tabular_report(
    site: Site, tmp_path: Path
) -> None:
    """Item 18, tabular: BLAST+ itself warns on stderr about the all-X query (checked here) although its
    report lists nothing for it. The fragments' searches (outfmt 11) say nothing, and the report is written
    by blast_formatter from the kept alignments: the query without hits is set up once more, and BLAST+'s
    warning reaches the user. Item 16, queries: blastp searches a query of only A, C, G, T and N
    (asparagine) without a word; paramedic refused it (exit 3, "looks like nucleotide"): now a warning.
    The bytes are BLAST+'s."""
    outfmt = "6"
    queries = tmp_path / "odd-queries.fasta"
    queries.write_text(
        (site.root / "queries.fasta").read_text()
        + ">polyN asparagine repeat\n" + "N" * 60 + "\n"
        + ">allx nothing to align\n" + "X" * 60 + "\n"
    )  # fmt: skip
    expected = tmp_path / "blast.out"
    theirs = subprocess.run(
        ["blastp", "-query", str(queries), "-db", site.db, "-outfmt", outfmt, "-out", str(expected)],
        cwd=site.root / "ref", capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert theirs.stderr.count("\n") == 1  # about the all-X query only
    assert "allx nothing to align: Could not calculate ungapped Karlin-Altschul" in theirs.stderr
    out = tmp_path / "hits.txt"
    proc = paramedic(
        "search", "blastp", "-query", str(queries), "-db", "uniprot", "-outfmt", outfmt, "-out", str(out),
        "--np", "2", "--strategy", "fragments", "--traceback", "per-fragment", "--quiet",
        cwd=site.root / "p3", check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == expected.read_bytes()
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    assert sum(r["tasks"]["rendered"] for r in record["ranks_stats"]) >= 1  # the path that said nothing
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr  # one warning each: said once
    assert lines[0].startswith("paramedic: warning: ") and "'polyN': looks like nucleotide" in lines[0]
    assert lines[1].startswith("paramedic: warning: blastp: Warning: [blastp] allx nothing to align: ")


class _Factory:
    """The one method of pytest's TempPathFactory the resume fixture uses."""

    def __init__(self, base: Path):
        self.base = base

    def mktemp(self, name: str) -> Path:
        path = self.base / name
        path.mkdir(parents=True)
        return path


def test_a_metadata_file_with_a_subject_removed_is_refused(site: Site) -> None:
    """Item 2: a metadata file edited after it was written (one subject id removed, with its SHA-256
    recomputed or not, one read as `true`, JSON nested thousands deep) regenerates nothing: one line,
    exit 3."""
    metadata = site.root / "meta.json"
    search(site, "with-metadata", "--metadata", str(metadata))
    data = json.loads(metadata.read_text())
    query = next(i for i, s in enumerate(data["subjects"]) if len(s) > 1)
    removed = {**data, "subjects": [s[:-1] if i == query else s for i, s in enumerate(data["subjects"])]}
    as_true = json.loads(metadata.read_text().replace(f"[{data['subjects'][query][0]},", "[true,", 1))
    assert as_true != data
    # a forger recomputes the plain SHA-256 (it was exit 0 and another report: only the user's key seals)
    resealed = {**removed, "sha256": _digest(removed)}
    for name, text in [
        ("removed", json.dumps(removed)),
        ("removed-resealed", json.dumps(resealed)),
        ("as-true", json.dumps(as_true)),
        ("nested", "[" * 100_000 + "]" * 100_000),
    ]:
        edited = site.root / f"meta-{name}.json"
        edited.write_text(text)
        proc, out = search(site, f"from-{name}", "--from-metadata", str(edited), check=False)
        assert proc.returncode == 3, (name, proc.stderr)
        assert proc.stderr.startswith("paramedic: error: --from-metadata") and proc.stderr.count("\n") == 1
        assert not out.exists()
    search(site, "from-metadata", "--from-metadata", str(metadata))  # the file as written: BLAST+'s bytes


def test_a_stage_cache_others_can_write_or_own_is_refused(site: Site, tmp_path: Path) -> None:
    """Item 3: as ssh treats ~/.ssh. Item 11: a regular file where the cache should be."""
    fresh = tmp_path / "fresh" / "cache"
    search(site, "fresh", "--stage", str(fresh))
    assert fresh.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # as /tmp
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a cache\n")
    for cache, says in [
        (shared, "others can write it"),
        (foreign, "owned by another user"),
        (a_file, "not a directory"),
    ]:
        proc, out = search(site, f"refused-{cache.name}", "--stage", str(cache), check=False)
        assert proc.returncode == 6, proc.stderr
        assert says in proc.stderr and proc.stderr.count("\n") == 1 and not out.exists()
        assert cache == a_file or os.listdir(cache) == []  # nothing made in it


def test_links_and_files_planted_in_the_cache_are_never_followed(site: Site, tmp_path: Path) -> None:
    """Items 3 and 11: links at the lock names (pointing outside the cache) and a regular file where a
    fragment's copy belongs: no file is made outside the cache, the output is BLAST+'s."""
    cache = tmp_path / "cache"
    search(site, "cold", "--stage", str(cache))
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil_rmtree(entry / "f000")
    (entry / "f000").write_text("a file where a copy's directory belongs\n")
    for name in ("f001.lock", "f002.lock"):
        (entry / name).unlink()
        (entry / name).symlink_to(outside / name)
    (cache / ".lock").unlink()
    (cache / ".lock").symlink_to(outside / "cache.lock")
    search(site, "planted", "--stage", str(cache))
    assert os.listdir(outside) == []
    assert (entry / "f000").is_dir() and not (entry / "f001.lock").is_symlink()


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def with_stdout_closed(argv: list[str], cwd: Path) -> tuple[int, str]:
    """`argv | head -0`: a real pipe whose reader is gone before anything is written (deterministic: the
    first write fails, however small the output)."""
    import subprocess

    from tests.conftest import BIN

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.Popen(
            [str(BIN / "paramedic"), *argv], cwd=cwd, stdout=write, stderr=subprocess.PIPE
        )
    finally:
        os.close(write)
    try:
        _, err = proc.communicate(timeout=60)  # BLAST+ ends at once; this search takes seconds
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("still running 60 s after its stdout was closed")
    return proc.returncode, err.decode()


def test_a_closed_stdout_ends_search_and_simulate_quietly(site: Site, tmp_path: Path) -> None:
    """Item 9: `paramedic search ... | head -1` and `paramedic simulate ... | head -1` end as BLAST+ does
    (141, killed by SIGPIPE), with nothing on stderr: no traceback, no hang, nothing left behind."""
    query = site.root / "queries.fasta"
    code, err = with_stdout_closed(
        ["search", "blastp", "-query", str(query), "-db", "uniprot", "--np", "2", "--quiet"], site.root / "p3"
    )
    assert (code, err) == (141, "")
    _, out = search(site, "for-simulate")
    record = out.with_name(out.name + ".run.json")
    simulate = ["simulate", "--record", str(record), "--workers", "4", "--queries", "100"]
    code, err = with_stdout_closed(simulate, tmp_path)
    assert (code, err) == (141, "")


def test_format_accepts_a_protein_made_of_nucleotide_letters(site: Site, tmp_path: Path) -> None:
    """Item 16: A, C, G and T are amino acids; makeblastdb -dbtype prot accepts such a protein, so
    `paramedic format --dbtype prot` does too (a warning at most), and the search equals BLAST+'s."""
    import subprocess

    fasta = tmp_path / "db.fasta"
    fasta.write_text(
        (site.root / "db.fasta").read_text()
        + ">acgt_protein only the letters A C G T\n"
        + "GATTACA" * 9
        + "\n"
    )
    made = subprocess.run(
        ["makeblastdb", "-in", str(fasta), "-dbtype", "prot", "-out", str(tmp_path / "ref" / "db")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    for layout in ("blastdb", "fragments"):
        proc = paramedic("format", "--in", str(fasta), "--dbtype", "prot", "--fragments", "2", "--out",
                         str(tmp_path / layout / "db"), "--layout", layout, "--quiet", check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert nseq_and_length(tmp_path / layout / "db")[0] == 801


def test_format_accepts_what_makeblastdb_accepts_whatever_a_fragment_begins_with(tmp_path: Path) -> None:
    """Item 16, probed again: makeblastdb guesses a named file's format from its first bytes; it took this
    file whole, and refused the fragment file that began with the short protein of rare letters
    (`paramedic format` exit 5). Volumes are now made from standard input."""
    import subprocess

    fasta = tmp_path / "rare.fasta"
    fasta.write_text(">p1 rare letters\nMKUOLLXBZJ*\n>p2\nacgtacgtacgt\n>p3 gaps\nMK-LL--AV\n>p4\nmkvl\n")
    made = subprocess.run(
        ["makeblastdb", "-in", str(fasta), "-dbtype", "prot", "-out", str(tmp_path / "ref" / "db")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    for fragments, layout in (("2", "fragments"), ("3", "fragments"), ("3", "blastdb")):
        out = tmp_path / f"p{fragments}{layout}" / "db"
        proc = paramedic("format", "--in", str(fasta), "--dbtype", "prot", "--fragments", fragments, "--out",
                         str(out), "--layout", layout, "--quiet", check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert nseq_and_length(out) == (4, 11 + 12 + 9 + 4)


def nseq_and_length(db: Path) -> tuple[int, int]:
    """A database's sequences and letters as BLAST+ counts them (`blastdbcmd -info`)."""
    import subprocess

    info = subprocess.run(["blastdbcmd", "-db", str(db), "-info"], capture_output=True, text=True, check=True)
    line = next(x for x in info.stdout.splitlines() if "sequences;" in x)
    parts = line.replace(",", "").split()
    return int(parts[0]), int(parts[2])


def run_bounded(
    argv: list[str], cwd: Path, seconds: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI with a bound on its time: a hang is a failure, not a stuck test (the launcher is told to
    stop its job, as a terminal's Ctrl-C would)."""
    import signal

    from tests.conftest import BIN

    proc = subprocess.Popen(
        [str(BIN / "paramedic"), *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=env,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the launcher stops its MPI job (a session of its own)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        pytest.fail(f"paramedic {' '.join(argv[:2])} still running after {seconds:.0f} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real file system that fills: a tmpfs of 300 KiB (mounting needs root; elsewhere the test is
    skipped, with the reason)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300k,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_stage_disk_that_fills_during_a_copy_searches_in_place(site: Site, small_disk: Path) -> None:
    """Item 5: the stage cache's disk fills while a volume is copied (the stripes' writers fail with
    ENOSPC): no hang, no traceback; the volumes that do not fit are searched where they lie."""
    sizes = [
        sum(p.stat().st_size for p in (site.root / "p3" / "uniprot").glob(f"f{i:03d}.*")) for i in range(3)
    ]
    assert max(sizes) < 300 << 10 < sum(sizes)  # one fits, not all
    out = site.root / "disk-full.out"
    proc = run_bounded(
        ["search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot", "-outfmt", "0",
         "-out", str(out), "--np", "2", "--batch", "6", "--quiet", "--stage", str(small_disk / "cache")],
        site.root / "p3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    site.assert_matches(out, None, "0")
    stage = json.loads(out.with_name(out.name + ".run.json").read_text())["stage"]
    assert stage["in_place"] and stage["write_failures"]
    assert not list(small_disk.glob("cache/*/.fill-*"))


def test_a_stage_disk_out_of_inodes_searches_in_place(site: Site, tmp_path: Path) -> None:
    """Item 5, probed again: a stage disk with bytes to spare but no inodes left (for the cache, its lock,
    the database's entry, a volume's lock or its copy's directory) ended the search: exit 6 "cannot use
    it", or exit 1 "internal error: OSError" when the copy's directory could not be made. Every volume is
    now searched where it lies, as on a disk out of bytes."""
    import subprocess

    from paramedic.db.locate import resolve_database
    from paramedic.engine.core.settings import StageSettings
    from paramedic.engine.rank.staging import Stager

    db, _ = resolve_database("uniprot", site.root / "p3")
    for inodes in range(1, 7):  # the file system's root takes one
        disk = tmp_path / f"inodes-{inodes}"
        disk.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=20m,nr_inodes={inodes}", "tmpfs", str(disk)],
                              capture_output=True, text=True)  # fmt: skip
        if made.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
        try:
            stager = Stager(StageSettings(disk / "cache"), db)
            for fragment in range(3):
                with stager.fragment(fragment) as where:
                    assert where == db  # searched where it lies
            assert stager.cache.stats.in_place == ["f000", "f001", "f002"]
            assert all("No space left" in w for w in stager.cache.stats.write_failures)
            if inodes == 5:  # the copy's directory: exit 1 before
                _, out = search(site, "no-inodes", "--stage", str(disk / "cache"), db_dir="p3")
                stage = json.loads(out.with_name(out.name + ".run.json").read_text())["stage"]
                assert stage["in_place"] == ["f000", "f001", "f002"]
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def test_mirrors_down_or_serving_no_reads_are_extra_sources_lost(site: Site, tmp_path: Path) -> None:
    """Item 12: a mirror that is down (nothing listens), one whose site serves no replica reads, and a
    directory mirror that is not there: the -db is complete, so the search is BLAST+'s, each mirror said
    once and listed as dropped in the record."""
    import socket

    from tests.support.site import StorageSite

    paramedic("keys", "--out", str(tmp_path / "keys"), "--server", "localhost", "--client", "compute-a")
    (tmp_path / "root").mkdir()
    no_reads = StorageSite(site.root / "p3" / "uniprot", tmp_path / "root", tmp_path / "keys/server",
                           tmp_path / "serve.log", extra=("--no-replica-reads",))  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]  # closed again: connections are refused
    no_reads.start()
    try:
        proc, out = search(
            site, "mirrors-down", "--stage", str(tmp_path / "cache"), "--keys", str(tmp_path / "keys/compute-a"),
            "--mirror", f"tls://localhost:{dead}/uniprot", "--mirror", f"{no_reads.url}/uniprot",
            "--mirror", str(tmp_path / "not-mounted" / "uniprot"), quiet_ok=True,
        )  # fmt: skip
    finally:
        no_reads.stop()
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 3 and all(w.startswith("paramedic: warning: --mirror ") for w in warnings)
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    replicas = [r for rank in record["ranks_stats"] if rank["stage"] for r in rank["stage"]["replicas"]]
    mirrors = {r["replica"] for r in replicas if r["dropped"]}
    assert f"tls://localhost:{dead}/uniprot" in mirrors and f"{no_reads.url}/uniprot" in mirrors
    assert record["stage"]["copies"] == 3
    # the job's check dropped each once: no rank opened one again
    assert len(record["stage"]["mirrors_dropped_at_start"]) == 3, record["stage"]
    assert all(r["dropped"].startswith("dropped at the job's start") for r in replicas if r["dropped"]), (
        replicas
    )


def test_a_trickling_mirror_and_a_damaged_volume_end_in_bounded_time(site: Site, tmp_path: Path) -> None:
    """Item 6: a mirror that trickles (200 bytes/s) while the -db's own volume is damaged (times kept):
    a one-line refusal in seconds (was: a hang until killed)."""
    from tests.support.site import CuttingProxy, StorageSite

    copy_db(site, "damaged-for-trickle")
    paramedic("keys", "--out", str(tmp_path / "keys"), "--server", "localhost", "--client", "compute-a")
    (tmp_path / "root").mkdir()
    remote = StorageSite(site.root / "p3" / "uniprot", tmp_path / "root", tmp_path / "keys/server",
                         tmp_path / "serve.log")  # fmt: skip
    search(
        site, "before-trickle", db_dir="damaged-for-trickle"
    )  # verified once (before issue 23: remembered)
    flip_keeping_times(site.root / "damaged-for-trickle" / "uniprot" / "f002.psq")
    remote.start()
    try:
        with CuttingProxy(remote.port, down_rate=200) as slow:
            proc = run_bounded(
                ["search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot", "-out",
                 str(tmp_path / "x.out"), "--np", "2", "--quiet", "--stage", str(tmp_path / "cache"), "--keys",
                 str(tmp_path / "keys/compute-a"), "--mirror", f"tls://localhost:{slow.port}/uniprot"],
                site.root / "damaged-for-trickle", seconds=60,
            )  # fmt: skip
    finally:
        remote.stop()
    assert proc.returncode == 4, proc.stderr
    # one error; before it, at most the mirror's warning (dropped when it did not open in time)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("paramedic: error:")]
    assert len(errors) == 1 and "corrupt database" in errors[0], proc.stderr
    assert proc.stderr.count("\n") - 1 == proc.stderr.count("paramedic: warning: --mirror ") <= 1, proc.stderr


def test_a_trickling_mirror_costs_a_healthy_search_seconds_not_minutes(site: Site, tmp_path: Path) -> None:
    """Found probing item 6 again: a mirror whose link trickles (50 bytes/s from it, so that even its TLS
    handshake takes minutes) beside a complete -db. Its search took 57-119 s instead of 3: the mirrors were
    opened one after another, each waiting out its own connection's timeout. Now an extra mirror that has
    not opened within MIRROR_OPEN_SECONDS is dropped, said once, and the search is BLAST+'s.

    It still cost the job that bound two or three times: the job's check dropped it, then each rank opened
    it again (MIRROR_OPEN_SECONDS more) before copying. Now the check's verdict reaches the ranks: the
    mirror is connected to once in the whole job (the check's connection), and every rank lists it as
    dropped at the job's start. Counted, not timed: the machine's load does not change a count."""
    import time

    from paramedic.db.stripes import MIRROR_OPEN_SECONDS
    from tests.support.site import CuttingProxy, StorageSite

    paramedic("keys", "--out", str(tmp_path / "keys"), "--server", "localhost", "--client", "compute-a")
    (tmp_path / "root").mkdir()
    remote = StorageSite(site.root / "p3" / "uniprot", tmp_path / "root", tmp_path / "keys/server",
                         tmp_path / "serve.log")  # fmt: skip
    remote.start()
    try:
        begun = time.monotonic()
        search(site, "no-mirror", "--stage", str(tmp_path / "plain-cache"))
        alone = time.monotonic() - begun
        with CuttingProxy(remote.port, down_rate=50) as slow:
            begun = time.monotonic()
            proc, out = search(
                site, "trickling-mirror", "--stage", str(tmp_path / "cache"), "--keys",
                str(tmp_path / "keys/compute-a"), "--mirror", f"tls://localhost:{slow.port}/uniprot",
                quiet_ok=True,
            )  # fmt: skip
            took = time.monotonic() - begun
            connections = slow.connections
    finally:
        remote.stop()
    assert took < alone + MIRROR_OPEN_SECONDS + 20, (took, alone)  # before: 57-119 s against 3
    assert connections == 1, connections  # the check's; before: one more per rank that copied
    assert proc.stderr.count("paramedic: warning: --mirror ") == 1, proc.stderr
    assert f"did not open within {MIRROR_OPEN_SECONDS:g} s" in proc.stderr, proc.stderr
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    replicas = [r for rank in record["ranks_stats"] if rank["stage"] for r in rank["stage"]["replicas"]]
    mirror = [r for r in replicas if r["replica"].startswith("tls://")]
    assert mirror and all(r["bytes"] == 0 for r in mirror), replicas  # each copying worker's row
    assert all(r["dropped"].startswith("dropped at the job's start, not opened again (") for r in mirror)
    assert list(record["stage"]["mirrors_dropped_at_start"]) == [f"tls://localhost:{slow.port}/uniprot"]


@pytest.mark.alone  # looks at all of /dev/shm before and after
def test_what_a_launcher_killed_outright_left_is_removed_by_the_next_run(site: Site, tmp_path: Path) -> None:
    """Item 17: a launcher SIGKILLed (as a batch system does after its grace period), with its mpiexec
    and ranks, leaves its paramedic-job-* directory (and MPICH's shared memory): the next run removes them,
    and leaves a directory whose launcher is alive alone."""
    import signal
    import time

    from tests.conftest import BIN

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    argv = [str(BIN / "paramedic"), "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db",
            "uniprot", "-out", str(tmp_path / "killed.out"), "--np", "2", "--quiet", "--runner", "mpi"]  # fmt: skip
    launcher = subprocess.Popen(argv, cwd=site.root / "p3", env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    ranks: list[int] = []
    while len(ranks) < 3:
        assert launcher.poll() is None and time.monotonic() < deadline, "the search ended before the kill"
        ranks = [int(p.name) for p in tmp.glob("paramedic-job-*/ranks/*") if p.name.isdigit()]
        time.sleep(0.02)
    (job_dir,) = list(tmp.glob("paramedic-job-*"))
    shm = [p.name.removeprefix("shm.") for p in (job_dir / "ranks").glob("shm.*")]
    mpiexec = {_parent(_parent(pid)) for pid in ranks} - {None}
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    for pid in [*mpiexec, *ranks]:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)  # type: ignore[arg-type]
        except OSError:
            pass
    for pid in ranks:
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            time.sleep(0.05)
    assert job_dir.exists()
    alive = tmp / "paramedic-job-alive"  # a running launcher's (ours): kept
    alive.mkdir()
    from paramedic.engine.runtime.leftovers import note_launcher

    note_launcher(alive)
    proc = run_bounded([*argv[1:5], "-db", "uniprot", "-out", str(tmp_path / "next.out"), "--np", "2",
                        "--quiet"], site.root / "p3", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp.iterdir()) == ["paramedic-job-alive"]
    assert not any(Path("/dev/shm", name).exists() for name in shm)


# Started in every interpreter whose PYTHONPATH holds it: rank 1 of a paramedic-launched job hangs before
# MPI_Init (the first time, or always), so the job's other ranks wait in MPI_Init for it, as when MPICH's
# start hangs by itself (seen 1 run in 22: every rank spinning in PMPI_Init_thread for minutes)
HANG_IN_START = """
import os, pathlib, time
marker = os.environ.get("TEST_HANG_MARKER")
if marker and os.environ.get("PMI_RANK") == "1" and os.environ.get("PARAMEDIC_LAUNCHED"):
    if os.environ.get("TEST_HANG_ALWAYS") or not pathlib.Path(marker).exists():
        pathlib.Path(marker).touch()
        time.sleep(600)
"""


@pytest.mark.parametrize("always", [False, True], ids=["once", "always"])
@pytest.mark.alone  # looks at all of /dev/shm before and after
def test_an_mpi_start_that_hangs_is_stopped_and_started_again(
    site: Site, tmp_path: Path, always: bool
) -> None:
    """The soak's silent hang (issue 23): a job whose ranks never all come out of MPI_Init waited for
    ever. The launcher now stops it after PARAMEDIC_MPI_START_SECONDS (every process of the job, which
    answers no signal there), starts it once more with a warning, and if MPI hangs again ends with one
    line and exit 7. Nothing of either attempt is left: no process, no file in TMPDIR or /dev/shm."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(HANG_IN_START)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = tmp_path / "hung"
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(tmp_path / "inject"),
           "PARAMEDIC_MPI_START_SECONDS": "3", "TEST_HANG_MARKER": str(marker)}  # fmt: skip
    if always:
        env["TEST_HANG_ALWAYS"] = "1"
    shm_before = set(os.listdir("/dev/shm"))
    out = site.root / f"mpi-start-{always}.out"
    proc = run_bounded(["search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot",
                        "-outfmt", "0", "-out", str(out), "--np", "2", "--runner", "mpi", "--quiet"],
                       site.root / "p3", seconds=90, env=env)  # fmt: skip
    assert marker.exists()  # the case this test exists for: a rank hung before MPI started
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == (
        "paramedic: warning: MPI did not start within 3 s (a rank hung in MPI_Init); the job was stopped and "
        "is started again"
    ), proc.stderr
    if always:
        assert proc.returncode == 7 and len(lines) == 2 and not out.exists(), proc.stderr
        assert lines[1].startswith("paramedic: error: MPI did not start within 3 s, twice"), proc.stderr
    else:
        assert proc.returncode == 0 and len(lines) == 1, proc.stderr
        site.assert_matches(out, None, "0")
    left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _has_env(p, str(marker))]
    assert not left and not list(tmp.iterdir()), (left, list(tmp.iterdir()))
    # a segment of this job's is mapped by no process any more (another job's, running beside, is)
    from paramedic.engine.runtime.stopped import mapped_shared_memory

    mapped = {n for p in Path("/proc").iterdir() if p.name.isdigit() for n in mapped_shared_memory(p.name)}
    assert not [n for n in set(os.listdir("/dev/shm")) - shm_before - mapped if n.startswith("mpich")]


def _has_env(proc: Path, value: str) -> bool:
    with contextlib.suppress(OSError):
        return value.encode() in (proc / "environ").read_bytes()
    return False


def _search_under_own_mpiexec(
    site: Site, tmp_path: Path, out: str
) -> tuple[Path, dict[str, str], list[str], subprocess.Popen[str]]:
    """A search of 300 queries under the user's own `mpiexec -n 3` (no paramedic launcher), with a TMPDIR
    of its own: (that TMPDIR, the environment, the command, the mpiexec process; stderr piped). The
    engine's ranks by name: on one node `auto` would run one BLAST+ on rank 0, whose workers wait."""
    from tests.conftest import BIN

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    queries = take_fasta(site.root / "db.fasta", tmp_path / "many.fasta", 300)
    argv = [str(BIN / "paramedic"), "search", "blastp", "-query", str(queries), "-db", "uniprot", "-out",
            str(tmp_path / out), "--quiet", "--no-journal", "--strategy", "fragments"]  # fmt: skip
    mpiexec = subprocess.Popen([str(BIN / "mpiexec"), "-n", "3", *argv], cwd=site.root / "p3", env=env,
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    return tmp, env, argv, mpiexec


@pytest.mark.alone  # looks at all of /dev/shm before and after
def test_what_ranks_under_the_users_own_mpiexec_left_when_killed_is_removed_by_the_next_run(
    site: Site, tmp_path: Path
) -> None:
    """Found probing item 17 again: a job under the user's own mpiexec (no paramedic launcher) whose ranks
    were killed outright (MPI_Abort of a failing rank does that) left each rank's paramedic-rank*
    directory, the paramedic-run-* directories of its BLAST+ runs and MPICH's shared memory, for good.
    Now each rank keeps all of them in a home noting its pid and segment, and the next run removes the
    homes of ranks that are gone (here a local search), never a live rank's."""
    import signal
    import time

    from paramedic.engine.runtime.leftovers import OWNER_FILE, RANK_PREFIX

    tmp, env, argv, mpiexec = _search_under_own_mpiexec(site, tmp_path, "killed.out")
    deadline = time.monotonic() + 60
    homes: list[Path] = []
    while len(homes) < 3 or not list(tmp.glob(f"{RANK_PREFIX}*/**/paramedic-run-*")):
        assert mpiexec.poll() is None and time.monotonic() < deadline, "the search ended before the kill"
        homes = [p for p in tmp.glob(f"{RANK_PREFIX}*") if (p / OWNER_FILE).exists()]
        time.sleep(0.02)
    shm = {p.name.removeprefix("shm.") for home in homes for p in home.glob("shm.*")}
    ranks = [int((home / OWNER_FILE).read_text().split()[0]) for home in homes]
    os.killpg(mpiexec.pid, signal.SIGKILL)  # mpiexec, its proxy and the ranks: none can clean up
    mpiexec.communicate()  # its stderr read and closed
    for pid in ranks:
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            time.sleep(0.05)
    # the case this test exists for: the killed ranks left their homes, a BLAST+ run's directory among them
    assert all(home.exists() for home in homes) and list(tmp.glob(f"{RANK_PREFIX}*/**/paramedic-run-*"))
    assert shm and all(Path("/dev/shm", name).exists() for name in shm)
    alive = tmp / f"{RANK_PREFIX}9-alive"  # a running rank's (this process stands in): kept
    alive.mkdir()
    start = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    (alive / OWNER_FILE).write_text(f"{os.getpid()} {start}\n")
    proc = run_bounded([*argv[1:5], "-db", "uniprot", "-out", str(tmp_path / "next.out"), "--np", "2",
                        "--quiet"], site.root / "p3", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp.iterdir()) == [alive.name]
    assert not any(Path("/dev/shm", name).exists() for name in shm)


@pytest.mark.alone  # looks at all of /dev/shm before and after
def test_a_job_that_aborts_under_the_users_own_mpiexec_leaves_no_shared_memory(
    site: Site, tmp_path: Path
) -> None:
    """Found probing issue 23's "MPI_Abort" item (session 21): under the user's own mpiexec, a worker whose
    BLAST+ died ended the job with MPI_Abort, and MPICH's shared-memory segment (3 MiB) stayed in /dev/shm
    for good: MPICH unlinks it in MPI_Finalize only, and the ranks' notes of it went with their homes as
    they unwound. Now a rank unlinks what it maps before MPI_Abort (and when stopped): the job ends with
    its one error line, and leaves nothing in /dev/shm."""
    import signal
    import time

    from paramedic.engine.runtime.leftovers import OWNER_FILE, RANK_PREFIX

    tmp, _, _, mpiexec = _search_under_own_mpiexec(site, tmp_path, "aborted.out")
    try:
        deadline = time.monotonic() + 60
        shm: set[str] = set()
        killed: list[int] = []
        while not killed:  # a worker's BLAST+ fork server, once a search runs (this job's: its TMPDIR)
            assert mpiexec.poll() is None and time.monotonic() < deadline, "the search ended before the kill"
            homes = [p for p in tmp.glob(f"{RANK_PREFIX}*") if (p / OWNER_FILE).exists()]
            shm |= {p.name.removeprefix("shm.") for home in homes for p in home.glob("shm.*")}
            if list(tmp.glob(f"{RANK_PREFIX}*/**/paramedic-run-*")):
                for proc in Path("/proc").iterdir():
                    with contextlib.suppress(OSError):
                        if proc.name.isdigit() and (proc / "comm").read_text().strip() == "blastp":
                            if f"TMPDIR={tmp}/".encode() in (proc / "environ").read_bytes():
                                os.kill(int(proc.name), signal.SIGKILL)
                                killed.append(int(proc.name))
            time.sleep(0.02)
        _, stderr = mpiexec.communicate(timeout=60)
    finally:
        if mpiexec.poll() is None:
            os.killpg(mpiexec.pid, signal.SIGKILL)
            mpiexec.wait()
    # the case this test exists for: the job aborted, after MPI had made its segment
    assert mpiexec.returncode not in (0, None) and shm, (mpiexec.returncode, stderr)
    said = [line for line in stderr.splitlines() if line.startswith("paramedic: ")]
    assert len(said) == 1 and said[0].startswith("paramedic: error: rank "), stderr
    assert not [name for name in shm if Path("/dev/shm", name).exists()]
    # a rank that unwound removed its home; one that mpiexec killed outright first (seen 1 run in 10) left
    # its home with its owner note, which the next run removes (the test above)
    left = list(tmp.iterdir())
    assert all(p.name.startswith(RANK_PREFIX) and (p / OWNER_FILE).exists() for p in left), left
    assert not (tmp_path / "aborted.out").exists()


@pytest.mark.parametrize(
    "engine", [["--runner", "local"], ["--runner", "mpi"], ["--output-strategy", "worker-individual"]]
)
def test_a_killed_launchers_partial_output_is_removed_by_the_next_run(
    site: Site, tmp_path: Path, engine: list[str]
) -> None:
    """Item 17, probed again: with --no-journal the report is written to `.<out>.partial-<job id>` beside
    the output (by rank 0, by the local runner, or by the workers with MPI-IO): a launcher SIGKILLed with
    its whole process group left that file for good (the next run removed the job directory only), as
    large as the report had grown. The job directory notes it; the next run removes both."""
    import signal
    import time

    from tests.conftest import BIN

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    queries = take_fasta(site.root / "db.fasta", tmp_path / "many.fasta", 200)
    argv = [str(BIN / "paramedic"), "search", "blastp", "-query", str(queries), "-db", "uniprot", "-out",
            str(tmp_path / "killed.out"), "--np", "2", "--quiet", "--no-journal", *engine]  # fmt: skip
    launcher = subprocess.Popen(argv, cwd=site.root / "p3", env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".killed.out.partial-*")):
        assert launcher.poll() is None and time.monotonic() < deadline, "the search ended before the kill"
        time.sleep(0.02)
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    proc = run_bounded([*argv[1:5], "-db", "uniprot", "-out", str(tmp_path / "next.out"), "--np", "2",
                        "--quiet"], site.root / "p3", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if ".partial" in p.name) == []
    assert os.listdir(tmp) == []


def _parent(pid: int | None) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_a_launcher_killed_alone_takes_its_mpiexec_and_ranks_with_it(site: Site, tmp_path: Path) -> None:
    """Item 17, probed again: the launcher alone SIGKILLed (a user's kill -9, the OOM killer): mpiexec, a
    session of its own, ran on with its ranks, searching for nobody for as long as the search took. Here
    the ranks are stopped (SIGSTOP) first, so that they could only end by being killed: mpiexec dies with
    its launcher, and every rank with it."""
    import signal
    import time

    from tests.conftest import BIN

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    argv = [str(BIN / "paramedic"), "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db",
            "uniprot", "-out", str(tmp_path / "alone.out"), "--np", "2", "--quiet", "--runner", "mpi"]  # fmt: skip
    launcher = subprocess.Popen(argv, cwd=site.root / "p3", env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    ranks: list[int] = []
    while len(ranks) < 3:
        assert launcher.poll() is None and time.monotonic() < deadline, "the search ended before the kill"
        ranks = [int(p.name) for p in tmp.glob("paramedic-job-*/ranks/*") if p.name.isdigit()]
        time.sleep(0.02)
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    mpiexec = {_parent(_parent(pid)) for pid in ranks} - {None}
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()

    def running(pid: int | None) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while any(running(pid) for pid in [*mpiexec, *ranks]) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in [*mpiexec, *ranks] if running(pid)]
    for pid in left:  # a failure leaves nothing behind either
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)  # type: ignore[arg-type]
    assert mpiexec and not left, f"still running after their launcher was killed: {left}"
    proc = run_bounded(argv[1:], site.root / "p3", env=env)  # the next run cleans up and finishes
    assert proc.returncode == 0, proc.stderr
    site.assert_matches(tmp_path / "alone.out", None, "0")
    assert os.listdir(tmp) == []
