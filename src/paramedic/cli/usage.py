"""The user's help (`paramedic --help`): every command with its examples, the exit codes; each command's
examples are read from it (`examples`), so they are written in one place."""

from __future__ import annotations

USAGE = """\
paramedic: parallel NCBI BLAST+ on MPI, with ParaMEDIC's metadata shipping to a storage site.

usage: paramedic COMMAND [options]     (paramedic COMMAND --help for a command's options)

commands:
  format   make a BLAST+ database of a FASTA file (makeblastdb, one copy); search takes any BLAST+ database
             paramedic format --in db.fasta --dbtype prot --fragments 8 --out dbs/uniprot
  search   search with BLAST+ in parallel (BLAST+ options keep their single dash)
             paramedic search blastp -query q.fasta -db dbs/uniprot -out hits.txt -evalue 1e-5
             mpiexec -n 64 paramedic search blastp -query q.fasta -db dbs/uniprot -out hits.tsv -outfmt 6
  keys     make a private CA and TLS certificates for a storage site and its compute sites
             paramedic keys --out keys --server storage.example.org --client compute-a
  serve    storage site: receive output or metadata and write the output under --root
             paramedic serve --replica dbs/uniprot --root /data/results --keys keys/server
  simulate predict a search's wall time and efficiency at any scale from a pilot run's record
             paramedic simulate --record pilot/hits.txt.run.json --queries 250000 \\
                 --workers 32768 --partition-size 128
  trace    run an unmodified MPI program traced (PMPI); write one merged CLOG2 file (MPE2's format)
             paramedic trace -out run.clog2 -- mpiexec -n 4 lmp -in in.melt
  ship     ship a finished trace to a storage site (its metadata by default; the site regenerates it)
             paramedic ship run.clog2 -out traces/run.clog2 --site tls://storage:7700 --keys keys/compute-a
  verify   digest every file of a BLAST+ database again and remember the digests (after an update)
             paramedic verify -db nr
  report   draw a run record, or a CLOG2 trace as a timeline, as one self-contained HTML page
             paramedic report hits.txt.run.json -o hits.html
  convert  convert a CLOG2 trace to OTF2 (an archive directory) for Vampir, ViTE and Score-P's tools
             paramedic convert run.clog2 --otf2 run-otf2

exit codes: 0 success, 1 internal error, 2 usage, 3 input data, 4 database, 5 BLAST+, 6 output,
7 the parallel job failed on some rank (or a rank was killed), 8 storage site, 130 interrupted,
141 standard output closed by its reader."""


def examples(command: str) -> list[str]:
    """The command's examples, from USAGE (one place for them): the indented lines under its name, a line
    ending in a backslash joined with the next."""
    lines = USAGE.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"  {command} ")), len(lines))
    found: list[str] = []
    for line in lines[start + 1 :]:
        if not line.startswith(" " * 13):
            break
        if found and found[-1].endswith("\\"):
            found[-1] += "\n    " + line.strip()
        else:
            found.append(line.strip())
    return found
