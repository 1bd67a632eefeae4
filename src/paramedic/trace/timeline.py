"""A CLOG2 trace drawn as a Jumpshot-like timeline: one self-contained HTML page (inline SVG, no scripts).

Ranks are rows, each MPI call a bar in its state's colour (from the file's state definitions), each
message an arrow from its send to its matching receive (sends and receives paired in order per sender,
receiver and tag, as MPI orders them). Bounded: the first `max_records` records in time are drawn and the
page says how many there were.
"""

from __future__ import annotations

import html
from collections import defaultdict, deque

import numpy as np

from paramedic.trace import clog2

ROW = 26
LEFT = 70
WIDTH = 1500
REC_STATEDEF, REC_BAREEVT, REC_MSGEVT = 2, 5, 7


def _text(words: np.ndarray) -> str:
    raw = words.astype(">i4").tobytes()
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def _states(rec: clog2.Records) -> dict[int, tuple[str, str]]:
    """stateID -> (name, CSS colour) from the STATEDEF records."""
    out: dict[int, tuple[str, str]] = {}
    for i in np.flatnonzero(rec.head[:, 3] == REC_STATEDEF).tolist():
        body = rec.body[i]
        colour = _text(body[4:10]).split()
        rgb = (
            "rgb({})".format(",".join(colour[:3]))
            if len(colour) >= 3 and all(c.isdigit() for c in colour[:3])
            else "#888"
        )
        out[int(body[0])] = (_text(body[10:18]), rgb)
    return out


def render(data: bytes, max_records: int = 20000, title: str = "trace") -> str:
    """The page for a CLOG2 file's bytes (validated by clog2.read)."""
    trace = clog2.read(data)
    rec = trace.records
    states = _states(rec)
    order = np.argsort(rec.seconds(), kind="stable")[:max_records]
    shown = rec.take(np.sort(order))
    seconds = shown.seconds()
    keep = np.isfinite(seconds)
    shown = shown.take(np.flatnonzero(keep))
    seconds = seconds[keep]
    ranks = sorted(set(shown.head[:, 1].tolist()))
    row_of = {r: k for k, r in enumerate(ranks)}
    t0 = float(seconds.min()) if len(seconds) else 0.0
    t1 = float(seconds.max()) if len(seconds) else 1.0
    span = max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * WIDTH

    bars: list[str] = []
    arrows: list[str] = []
    # per rank and thread: a threaded program's threads (CLOG2's thread field) each nest their own states
    open_states: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    sends: dict[tuple[int, int, int], deque[float]] = defaultdict(deque)
    recvs: list[tuple[int, int, int, float]] = []
    drawn: dict[int, list[float]] = defaultdict(lambda: [0, 0.0])  # state -> [bars, seconds] on the page
    for rank, thread, rectype, body, t in zip(
        shown.head[:, 1].tolist(),
        shown.head[:, 2].tolist(),
        shown.head[:, 3].tolist(),
        shown.body[:, :4].tolist(),
        seconds.tolist(),
        strict=True,
    ):
        if rectype == REC_BAREEVT:
            state, final = divmod(body[0], 2)
            stack = open_states[(rank, thread)]
            if not final:
                stack.append((state, t))
            elif stack and stack[-1][0] == state:
                _, start = stack.pop()
                drawn[state][0] += 1
                drawn[state][1] += t - start
                name, colour = states.get(state, (f"state {state}", "#888"))
                y = 10 + row_of[rank] * ROW + 4
                bars.append(
                    f'<rect x="{x(start):.2f}" y="{y}" width="{max(x(t) - x(start), 0.5):.2f}" height="{ROW - 8}" '
                    f'fill="{colour}"><title>{html.escape(name)} rank {rank} {start - t0:.6f}-{t - t0:.6f} s</title></rect>'
                )
        elif rectype == REC_MSGEVT and body[2] in row_of:
            if body[0] == -101:
                sends[(rank, body[2], body[3])].append(t)
            elif body[0] == -102:
                recvs.append((body[2], rank, body[3], t))
    for src, dst, tag, t in recvs:
        queue = sends.get((src, dst, tag))
        if queue:
            start = queue.popleft()
            y0 = 10 + row_of[src] * ROW + ROW / 2
            y1 = 10 + row_of[dst] * ROW + ROW / 2
            arrows.append(
                f'<line x1="{x(start):.2f}" y1="{y0}" x2="{x(t):.2f}" y2="{y1}" stroke="#222" '
                'stroke-width="0.6" marker-end="url(#a)"/>'
            )
    height = 30 + len(ranks) * ROW
    labels = "".join(
        f'<text x="4" y="{10 + k * ROW + ROW / 2 + 4}" font-size="12">rank {r}</text>'
        for r, k in row_of.items()
    )
    # the legend: only the states drawn (a file defines every call the tracer wraps, 132), most time first
    legend = " ".join(
        f'<span style="background:{c};padding:0 6px;margin-right:6px">{html.escape(n)}</span> '
        f"{int(drawn[s][0]):,} calls, {drawn[s][1]:.6f} s;"
        for s, (n, c) in (
            (s, states.get(s, (f"state {s}", "#888"))) for s in sorted(drawn, key=lambda s: (-drawn[s][1], s))
        )
    )
    note = (
        f"{len(shown):,} of {len(rec):,} records drawn ({t1 - t0:.6f} s from the start)"
        if len(rec) > len(shown)
        else f"{len(rec):,} records, {t1 - t0:.6f} s"
    )
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>
<body style="font-family:sans-serif">
<h3>{html.escape(title)}</h3><p>{note}; bars: MPI calls, arrows: messages.</p>
<p>{legend}</p>
<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height}">
<defs><marker id="a" markerWidth="6" markerHeight="6" refX="5" refY="3" orient="auto">
<path d="M0,0 L6,3 L0,6 z" fill="#222"/></marker></defs>
{labels}
{"".join(bars)}
{"".join(arrows)}
</svg></body></html>
"""
