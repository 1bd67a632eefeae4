"""After a search's output is complete: its run record, the summary line, and the report page (--report)."""

from __future__ import annotations

import sys
from pathlib import Path

from paramedic.errors import ParamedicError
from paramedic.report.record import RunRecord


def finish(record: RunRecord, path: Path | None, quiet: bool, page: Path | None) -> None:
    """The run record (at `path`), the summary (unless `quiet`), and the page (--report). A page that
    cannot be written is said, and the search (whose output is whole) still succeeds."""
    if path is not None:
        record.write(path)
    if not quiet:
        print(record.summary(), file=sys.stderr)
    if page is None:
        return
    from paramedic.report.html import write_page  # the page's charts: only when a page is asked

    try:
        size = write_page(record, page, str(path or ""))
    except ParamedicError as exc:
        print(f"paramedic: warning: no report page: {exc}", file=sys.stderr)
        return
    if not quiet:
        print(f"  report page: {page} ({size / 1e6:.1f} MB, opens in a browser)", file=sys.stderr)
