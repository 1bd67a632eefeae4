"""SAM's @PG line names the user's command line, as one BLAST+ run prints it (paramedic.blast.run)."""

from __future__ import annotations

from paramedic.blast.options import BlastOptions
from paramedic.blast.run import sam_command_line

REPORT = (
    b"@HD\tVN:1.2\tSO:unsorted\n"
    b"@PG\tID:0\tVN:2.12.0+\tCL:blastn -outfmt 17 -query /tmp/run/queries.fasta -db g -out /tmp/run/r.out \tPN:blastn\n"
    b"q1\t0\ts1\t1\t255\t10M\t*\t0\t0\tACGTACGTAC\t*\n"
)


def test_the_pg_line_shows_the_users_command() -> None:
    options = BlastOptions.parse(
        "blastn", ["-query", "q.fa", "-db", "g", "-outfmt", "17", "-out", "hits.sam"]
    )
    out = sam_command_line(REPORT, "blastn", options)
    assert b"CL:blastn -query q.fa -db g -outfmt 17 -out hits.sam \tPN:blastn\n" in out
    assert out.replace(b"CL:blastn -query q.fa -db g -outfmt 17 -out hits.sam ", b"") == REPORT.replace(
        b"CL:blastn -outfmt 17 -query /tmp/run/queries.fasta -db g -out /tmp/run/r.out ", b""
    )
