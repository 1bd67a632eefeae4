"""`make demo`: what paramedic is, shown on real data in about two minutes on two cores.

1. The database-segmented engine (--strategy fragments) on 20,000 UniProt proteins cut in 4 fragments,
   its output compared byte for byte with one plain BLAST+ run on the unsplit database.
2. ParaMEDIC across two sites on this machine: keys, a storage site (`paramedic serve` on 127.0.0.1,
   stopped whatever happens), a search that ships only metadata over TLS, the regenerated file checked.
3. ParaMEDIC's second application: LAMMPS traced on 2 ranks (`paramedic trace`, CLOG2), the trace
   shipped to a storage site as metadata and rebuilt there byte for byte.
4. Trust: a database volume changed behind paramedic's back (one byte, size and times kept) is refused
   before anything is written, in one line with its exit code.
5. The report page of the run, opened from a file in any browser.

Everything is written under the --out directory; nothing is left running.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
PARAMEDIC = str(BIN / "paramedic")
POSTED_DATE = re.compile(rb"^( *)Posted date: .*$", re.M)
QUERIES = 100  # about 15 s of BLAST+ on two cores, per run


def say(text: str = "") -> None:
    print(text, flush=True)


def step(n: int, title: str) -> float:
    say(f"\n\033[1m== {n}. {title}\033[0m")
    return time.monotonic()


def run(*args: str, cwd: Path, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    """A command as a user would type it (shown), its error said in one line if it fails."""
    shown = " ".join(a if a == PARAMEDIC else a.replace(str(cwd) + "/", "") for a in args)
    say(f"$ {shown.replace(PARAMEDIC, 'paramedic')}")
    child = subprocess.Popen(
        args, cwd=cwd, text=True, stderr=subprocess.PIPE if quiet else None, stdout=subprocess.PIPE
    )
    try:
        out, err = child.communicate()
    except BaseException:  # interrupted: paramedic stops its MPI job on SIGINT (a kill would orphan it)
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise
    proc = subprocess.CompletedProcess(args, child.returncode, out, err)
    if proc.returncode != 0:
        sys.exit(
            f"demo: failed: {shown} (exit {proc.returncode}){': ' + proc.stderr.strip() if proc.stderr else ''}"
        )
    return proc


def take_queries(source: Path, dest: Path, n: int) -> int:
    records = source.read_text().split("\n>")[:n]
    dest.write_text(">" + "\n>".join(r.lstrip(">") for r in records).rstrip("\n") + "\n")
    return len(records)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fragments_vs_blast(data: Path, out: Path) -> Path:
    """Step 1: the fragments engine against one BLAST+ run; returns the run's record."""
    started = step(1, "the database-segmented engine against plain BLAST+")
    queries = out / "queries.fasta"
    n = take_queries(data / "QUERY.fasta", queries, QUERIES)
    db = data / "DB.fasta"
    run(PARAMEDIC, "format", "--in", str(db), "--dbtype", "prot", "--fragments", "4", "--out", "db/uniprot",
        "--title", "uniprot", "--quiet", cwd=out)  # fmt: skip
    (out / "blast").mkdir()
    run("makeblastdb", "-in", str(db), "-dbtype", "prot", "-parse_seqids", "-title", "uniprot", "-out",
        "uniprot", cwd=out / "blast", quiet=True)  # fmt: skip
    t = time.monotonic()
    run("blastp", "-query", "../queries.fasta", "-db", "uniprot", "-outfmt", "6", "-evalue", "1e-5",
        "-num_threads", "2", "-out", "hits.tsv", cwd=out / "blast")  # fmt: skip
    blast_seconds = time.monotonic() - t
    t = time.monotonic()
    # no --stage here: on one machine it copies the fragments once more and needs MPI ranks (a node per
    # rank), about 1-2 s that a cluster's node-local disk repays and this comparison would not
    run(PARAMEDIC, "search", "blastp", "-query", "queries.fasta", "-db", "db/uniprot", "-out", "hits.tsv",
        "-outfmt", "6", "-evalue", "1e-5", "--strategy", "fragments", "--np", "2",
        "--report", "fragments.html", cwd=out)  # fmt: skip
    ours_seconds = time.monotonic() - t
    ours, theirs = (out / "hits.tsv").read_bytes(), (out / "blast" / "hits.tsv").read_bytes()
    same = ours == theirs
    say(
        f"\n{n} queries x 20,000 proteins, tabular output (-outfmt 6): paramedic over 4 fragments on 2 "
        f"workers {ours_seconds:.1f} s, BLAST+ on the whole database with 2 threads {blast_seconds:.1f} s "
        f"({ours_seconds / blast_seconds:.2f}x BLAST+'s time; one run each, so a few percent either way is "
        "this machine's noise: bench/ measures it side by side)."
    )
    verdict, hits = ("IDENTICAL" if same else "DIFFERENT"), ours.count(b"\n")
    say(
        f"verdict: {verdict}: {len(ours):,} bytes, {hits:,} hits, sha256 {sha256(out / 'hits.tsv')[:16]}"
        f" ({'byte for byte the same as' if same else 'not the same as'} BLAST+'s {len(theirs):,} bytes)"
    )
    say("proved: cutting the database and merging the fragments' hits changes nothing in the output.")
    say(f"({time.monotonic() - started:.0f} s)")
    if not same:
        sys.exit("demo: the fragments engine's output differs from BLAST+'s")
    return out / "hits.tsv.run.json"


def paramedic_two_sites(out: Path) -> Path:
    """Step 2: compute site -> metadata over TLS -> storage site regenerates; returns the run's record."""
    started = step(2, "ParaMEDIC: two sites on this machine, metadata over TLS")
    run(
        PARAMEDIC,
        "keys",
        "--out",
        "keys",
        "--server",
        "127.0.0.1",
        "--client",
        "compute",
        cwd=out,
        quiet=True,
    )
    say("keys: a private CA, the storage site's certificate (keys/server), the compute site's (keys/compute)")
    site = out / "site"
    shutil.copytree(out / "db", site / "db")  # the storage site's own replica of the database
    (site / "root").mkdir()
    log = site / "serve.log"
    command = [PARAMEDIC, "serve", "--replica", "db/uniprot", "--root", "root", "--listen", "127.0.0.1:0",
               "--keys", "../keys/server"]  # fmt: skip
    say("$ " + " ".join(command).replace(PARAMEDIC, "paramedic") + " &   (in site/, log: site/serve.log)")
    with open(log, "w") as fh:
        server = subprocess.Popen(command, cwd=site, stdout=fh, stderr=fh, start_new_session=True)
    try:
        port = _wait_for_port(log, server)
        run(PARAMEDIC, "search", "blastp", "-query", "queries.fasta", "-db", "db/uniprot",
            "-out", "shipped.txt", "-outfmt", "0", "-evalue", "1e-5", "--np", "2",
            "--site", f"tls://127.0.0.1:{port}", "--keys", "keys/compute", "--ship", "metadata",
            cwd=out)  # fmt: skip
    finally:
        _stop(server)
    say("storage site stopped.")
    say("the same search with plain BLAST+, pairwise report, to check the regenerated file against:")
    run("blastp", "-query", "../queries.fasta", "-db", "uniprot", "-outfmt", "0", "-evalue", "1e-5",
        "-num_threads", "2", "-out", "hits.txt", cwd=out / "blast")  # fmt: skip
    record = json.loads((out / "shipped.txt.run.json").read_text())
    ship = record["ship"]
    written = site / "root" / "shipped.txt"
    local = sha256(written)
    reference = POSTED_DATE.sub(rb"\1Posted date:", (out / "blast" / "hits.txt").read_bytes())
    same = POSTED_DATE.sub(rb"\1Posted date:", written.read_bytes()) == reference
    say(
        f"\nshipped {ship['shipped_payload_bytes']:,} bytes of metadata ({ship['wire_bytes']:,} on the wire) for a "
        f"{ship['output_bytes']:,}-byte report: {ship['output_bytes'] / max(1, ship['wire_bytes']):.0f}x less "
        "over the link."
    )
    say(
        f"check: the storage site regenerated site/root/shipped.txt, sha256 {local[:16]}: "
        + ("matches" if local == ship["site_sha256"] else "DOES NOT match")
        + " the sha256 the site reported to the compute site; "
        + (
            "and it is BLAST+'s own pairwise report byte for byte (but the 'Posted date' line: when each "
            "database was built)."
            if same
            else "but it DIFFERS from BLAST+'s pairwise report."
        )
    )
    say("proved: the output crossed the link as metadata and was rebuilt exactly where it is stored.")
    say(f"({time.monotonic() - started:.0f} s)")
    if local != ship["site_sha256"] or not same:
        sys.exit("demo: the regenerated file is not the expected one")
    return out / "shipped.txt.run.json"


def _wait_for_port(log: Path, server: subprocess.Popen[bytes]) -> int:
    """The port the storage site listens on, from its log (bounded: 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
        if found:
            return int(found.group(1))
        if server.poll() is not None:
            sys.exit(f"demo: the storage site stopped: {log.read_text().strip()[-500:]}")
        time.sleep(0.2)
    sys.exit("demo: the storage site did not start listening in 60 s")


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the storage site and everything it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        try:
            server.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # whatever of the group outlived its leader
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


MELT = Path("/usr/share/lammps/examples/melt/in.melt")  # Debian's lammps-examples (make mpi-trace)
OPEN_MPI = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}  # fmt: skip


def trace_step(out: Path) -> Path | None:
    """Step 3: ParaMEDIC's second application. LAMMPS (a real MPI program nobody here wrote) traced on 2
    ranks, the trace shipped to a storage site as its metadata over TLS, the site's file checked; returns
    the trace's timeline page."""
    started = step(3, "the trace application: an MPI program traced, its trace shipped as metadata")
    if shutil.which("lmp") is None or shutil.which("mpiexec.openmpi") is None or not MELT.is_file():
        say("skipped: LAMMPS and Open MPI are not installed (make mpi-trace installs them).")
        return None
    work = out / "trace"
    (work / "site" / "root").mkdir(parents=True)
    (work / "in.melt").write_text(MELT.read_text().replace("run\t\t250", "run\t\t100"))
    log = work / "site" / "serve.log"
    command = [PARAMEDIC, "serve", "--root", "root", "--listen", "127.0.0.1:0", "--keys", "../../keys/server"]
    say("$ " + " ".join(command).replace(PARAMEDIC, "paramedic") + " &   (in trace/site/: no replica needed)")
    with open(log, "w") as fh:
        server = subprocess.Popen(command, cwd=work / "site", stdout=fh, stderr=fh, start_new_session=True)
    os.environ.update(OPEN_MPI)  # Open MPI as root, 2 ranks on whatever cores there are
    try:
        port = _wait_for_port(log, server)
        run(PARAMEDIC, "trace", "-out", "melt.clog2", "--site", f"tls://127.0.0.1:{port}",
            "--keys", "../keys/compute", "--ship", "metadata", "--record", "melt.ship.json", "--",
            "mpiexec.openmpi", "-n", "2", "lmp", "-in", "in.melt", "-log", "none", "-screen", "none",
            cwd=work)  # fmt: skip
    finally:
        _stop(server)
    say("storage site stopped.")
    ship = json.loads((work / "melt.ship.json").read_text())["ship"]
    local, remote = work / "melt.clog2", work / "site" / "root" / "melt.clog2"
    same = remote.is_file() and remote.read_bytes() == local.read_bytes()
    size = local.stat().st_size
    say(
        f"\nthe CLOG2 trace (MPE2's format, the ranks' logs merged by time) is {size:,} bytes; its metadata "
        f"(each rank's period, then differences) took {ship['shipped_payload_bytes']:,}: "
        f"{size / max(1, ship['shipped_payload_bytes']):.0f}x less over the link."
    )
    say(
        "check: the storage site rebuilt trace/site/root/melt.clog2 from the metadata: "
        + ("byte for byte the trace written here." if same else "it DIFFERS from the trace written here.")
    )
    run(PARAMEDIC, "report", "melt.clog2", "-o", "melt.html", cwd=work, quiet=True)
    say("proved: ParaMEDIC is a framework: a second application's output crossed the link as metadata.")
    say(f"({time.monotonic() - started:.0f} s)")
    if not same:
        sys.exit("demo: the storage site's trace is not the one written here")
    return work / "melt.html"


def tampered_database(out: Path) -> None:
    """Step 4: a copy of the database with one byte changed in place, its size and times kept (what a bad
    disk, a half-synced copy or another user does): the storage site, whose replica is the database as
    it was, refuses to regenerate a search of it."""
    started = step(4, "trust: a database changed behind paramedic's back")
    shutil.copytree(out / "db", out / "tampered", copy_function=shutil.copy2)
    volume = out / "tampered" / "uniprot" / "uniprot.psq"
    stat = volume.stat()
    with open(volume, "r+b") as fh:  # one residue of one protein becomes another
        fh.seek(stat.st_size // 2)
        byte = fh.read(1)
        fh.seek(stat.st_size // 2)
        fh.write(bytes([byte[0] ^ 0x01]))
    os.utime(volume, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    say(f"changed one byte of {volume.relative_to(out)} in place ({stat.st_size:,} bytes, times kept)")
    site = out / "site"
    log = site / "serve-again.log"
    command = [PARAMEDIC, "serve", "--replica", "db/uniprot", "--root", "root", "--listen", "127.0.0.1:0",
               "--keys", "../keys/server"]  # fmt: skip
    with open(log, "w") as fh:
        server = subprocess.Popen(command, cwd=site, stdout=fh, stderr=fh, start_new_session=True)
    try:
        port = _wait_for_port(log, server)
        args = [PARAMEDIC, "search", "blastp", "-query", "queries.fasta", "-db", "tampered/uniprot", "-out",
                "tampered.txt", "-outfmt", "0", "-evalue", "1e-5", "--np", "2", "--site",
                f"tls://127.0.0.1:{port}", "--keys", "keys/compute", "--ship", "metadata"]  # fmt: skip
        say("$ " + " ".join(args).replace(PARAMEDIC, "paramedic"))
        proc = subprocess.run(args, cwd=out, capture_output=True, text=True)
    finally:
        _stop(server)
    lines = proc.stderr.strip().splitlines()
    for line in lines:
        say(line)
    written = (site / "root" / "tampered.txt").exists()
    say(
        f"exit {proc.returncode} (docs/ERRORS.md); output at the storage site {'WRITTEN' if written else 'not written'}"
    )
    if proc.returncode == 0 or written or "replica is not the compute site's database" not in proc.stderr:
        sys.exit("demo: a search of a changed database was regenerated at the storage site")
    say(
        "proved: a database is known by its files' digests (BLAKE3, remembered per user while the files keep "
        "their stamps), so the two sites agree on the bytes, not on a name: a changed byte is another "
        "database, and its metadata is never regenerated on the old one."
    )
    shutil.rmtree(out / "tampered")
    say(f"({time.monotonic() - started:.0f} s)")


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # so that every `finally` runs: the storage site is stopped


def main() -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupted)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the mmseqs2 data (DB.fasta, QUERY.fasta)")
    parser.add_argument(
        "--out", type=Path, required=True, help="a new directory for everything the demo writes"
    )
    args = parser.parse_args()
    out = args.out.absolute()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"  # the venv's mpiexec for paramedic
    started = time.monotonic()
    pilot = fragments_vs_blast(args.data, out)
    shipped = paramedic_two_sites(out)
    timeline = trace_step(out)
    tampered_database(out)
    step(5, "the report page")
    predicted = run(PARAMEDIC, "simulate", "--record", str(pilot), "--query-file", "queries.fasta",
                    "--workers", "2", "--json", cwd=out)  # fmt: skip
    (out / "prediction.json").write_text(predicted.stdout)
    run(PARAMEDIC, "report", str(shipped), "-o", "report.html", "--prediction", "prediction.json", cwd=out)
    say(
        f"\nthe demo took {time.monotonic() - started:.0f} s. Open the report page in a browser (no network needed):"
    )
    say(f"  {out / 'report.html'}")
    say(f"  (and the fragments run's: {out / 'fragments.html'})")
    if timeline is not None:
        say(f"  (and the LAMMPS trace's timeline: {timeline})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("demo: interrupted (the storage site, if started, was stopped)")
