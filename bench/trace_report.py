"""Report time and page size against trace size: `paramedic report TRACE.clog2 -o PAGE.html` on each trace
given (issue 46, item 1), each in a fresh process under /usr/bin/time (wall seconds, peak RSS), and the page
written by trace.timeline.write alone (which `paramedic report` calls: both stream the file 32 MB at a
time), each with its peak RSS. Traces: make them with `paramedic trace` (bench/traces.py, or the section's
command);
`--synthetic N` adds a synthetic 4-rank trace of N periods (8 records each; tests/unit/test_trace_overview.py).
Appends a section to bench/RESULTS.md (`--no-append`: print only).

    .venv/bin/python bench/trace_report.py [--synthetic 1000000] TRACE.clog2 ...
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STREAM = "import sys; from pathlib import Path; from paramedic.trace.timeline import write; write(Path(sys.argv[1]), Path(sys.argv[2]))"


def timed(command: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of `command`, from /usr/bin/time."""
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%e %M", *command], check=True, capture_output=True, text=True, cwd=ROOT
    )
    wall, kib = done.stderr.strip().splitlines()[-1].split()
    return float(wall), int(kib) * 1024


def records(trace: Path) -> int:
    from paramedic.trace import overview

    with trace.open("rb") as fh:
        return sum(len(rec) for _, rec, _ in overview.chunks(fh))


def synthetic_file(path: Path, ranks: int, periods: int, segment: int = 50_000) -> None:
    """A synthetic CLOG2 file (tests/unit/test_trace_overview.py's run) written a segment of periods at a
    time, so a 1 GB file takes no more memory than a segment: each segment's blocks as clog2.write packs
    them, its closing ENDLOG made an ENDBLOCK unless it is the last."""
    import numpy as np

    from paramedic.trace import clog2, overview
    from tests.unit.test_trace_overview import synthetic_records

    bs = clog2.DEFAULT_BLOCK_SIZE
    with path.open("wb") as fh:
        fh.write(bytes(clog2.PREAMBLE_SIZE))
        for first in range(0, periods, segment):
            rec = synthetic_records(ranks, min(segment, periods - first), first, periods)
            head = clog2.make_preamble(ranks, clog2.PREAMBLE_SIZE, bs)
            blocks = bytearray(
                clog2.write(clog2.Trace(head, True, bs, rec, (0, 0, 0), [], b""))[clog2.PREAMBLE_SIZE :]
            )
            if first + segment < periods:
                last = len(blocks) - bs
                words = np.frombuffer(bytes(blocks[last:]), ">i4").astype(np.int32)
                slots = overview._walk_chunk(words[5::2], 1, bs // 8, True, 0)
                end = int(slots[-1] + clog2.SLOT_SIZES[words[2 * slots[-1] + 5]]) if len(slots) else 0
                at = last + 8 * end
                blocks[at : at + 8] = np.asarray([(first + segment) * 1e-3], ">f8").tobytes()
                blocks[at + 20 : at + 24] = (clog2.REC_ENDBLOCK).to_bytes(4, "big")
            fh.write(blocks)
        fptr = fh.tell()
        fh.write(clog2.world_comm_table())
        fh.seek(0)
        fh.write(clog2.make_preamble(ranks, fptr, bs))


def measure(trace: Path, work: Path) -> dict[str, float]:
    page = work / (trace.stem + ".html")
    wall, rss = timed([str(BIN / "paramedic"), "report", str(trace), "-o", str(page)])
    streamed, stream_rss = timed([sys.executable, "-c", STREAM, str(trace), str(work / "streamed.html")])
    return {
        "trace_mb": trace.stat().st_size / 1e6,
        "records": records(trace),
        "seconds": wall,
        "page_mb": page.stat().st_size / 1e6,
        "rss_mb": rss / 1e6,
        "stream_seconds": streamed,
        "stream_rss_mb": stream_rss / 1e6,
    }


def table(rows: list[tuple[str, dict[str, float]]]) -> str:
    lines = [
        "| trace | CLOG2 MB | records | `paramedic report` s | page MB | peak RSS MB | streamed s | streamed peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['trace_mb']:,.1f} | {r['records']:,} | {r['seconds']:.2f} | {r['page_mb']:.2f} | "
            f"{r['rss_mb']:,.0f} | {r['stream_seconds']:.2f} | {r['stream_rss_mb']:,.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument(
        "--synthetic", type=int, action="append", default=[], help="periods of a synthetic trace"
    )
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        traces = [(t.name, t) for t in args.traces]
        for periods in args.synthetic:
            sys.path.insert(0, str(ROOT))
            path = work / f"synthetic-{periods}.clog2"
            synthetic_file(path, 4, periods)
            traces.append((f"synthetic, 4 ranks, {periods:,} periods", path))
        for name, trace in traces:
            rows.append((name, measure(trace, work)))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    if not args.no_append:
        section = (
            f"\n## Trace report page: time and size against trace size ({datetime.now(UTC):%Y-%m-%d})\n\n"
            "`.venv/bin/python bench/trace_report.py "
            + " ".join(sys.argv[1:])
            + "` on a 2-core machine shared "
            "with other jobs. `paramedic report` (cli/report.py) streams the file as `trace.timeline.write` does, "
            '32 MB at a time; "streamed" is that function alone, without the command\'s start.\n\n'
            + text
            + "\n"
        )
        with (ROOT / "bench" / "RESULTS.md").open("a") as fh:
            fh.write(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
