"""BLAST+'s own messages on a run that succeeded, passed on to the user (issue 23, item 18).

BLAST+ warns on stderr and still exits 0: an all-N or all-X query ("Could not calculate ungapped
Karlin-Altschul parameters ..."), a residue it replaced. A search split into batches and fragments runs
BLAST+ many times, so each message is said once per process (each worker rank), with BLAST+'s
batch-local "Query_N" numbering removed (the query's own id follows it), and at most MAX_MESSAGES.
"""

from __future__ import annotations

import re
import sys
import threading

MAX_MESSAGES = 100
_BATCH_LOCAL = re.compile(r"\bQuery_\d+ ")
_seen: set[str] = set()
_lock = threading.Lock()


def pass_on(program: str, stderr: bytes) -> None:
    """Print each message of `stderr` not said before by this process, as a paramedic warning."""
    for line in stderr.decode(errors="replace").splitlines():
        text = _BATCH_LOCAL.sub("", line.strip())
        if not text:
            continue
        with _lock:
            if text in _seen or len(_seen) > MAX_MESSAGES:
                continue
            _seen.add(text)
            last = len(_seen) > MAX_MESSAGES
        note = "further BLAST+ messages not shown" if last else f"{program}: {text}"
        print(f"paramedic: warning: {note}", file=sys.stderr, flush=True)
