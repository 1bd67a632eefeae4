"""The report page: one self-contained HTML file drawn from a run record (`paramedic report`).

Charts are Plotly figures with plotly.js embedded once in the page (no network: the file opens from a
disk, a mail or an archive years later). Every chart is made from the record alone; a chart whose data
the record lacks (an older record, a run without --site or --stage) is left out with a line saying why.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paramedic.durable import write_output
from paramedic.errors import InputError, OutputError
from paramedic.report.record import MAX_RECORD_BYTES, PHASES, RankStats, RunRecord, load_json_file

# One colour per kind of work, the same in every chart
COLOURS = {
    "search": "#4C78A8",
    "piece": "#F58518",
    "regenerate": "#F58518",
    "whole": "#54A24B",
    "merge": "#B279A2",
    "write": "#E45756",
    "idle": "#D8D8D8",
    "staging": "#72B7B2",
}
KIND_NAMES = {
    "search": "fragment search",
    "piece": "regenerate (report piece)",
    "whole": "whole-database search",
}


@dataclass
class Page:
    """The page being built: sections of HTML, each a heading, a sentence and a chart or a table."""

    title: str
    sections: list[str] = field(default_factory=list)
    charts: int = 0

    def add(self, heading: str, text: str, body: str, half: bool = False) -> None:
        """A section; `half`: two of them side by side on a wide screen."""
        css = ' class="half"' if half else ""
        self.sections.append(
            f'<section{css}><h2>{html.escape(heading)}</h2><p class="note">{text}</p>{body}</section>'
        )

    def figure(self, fig: Any) -> str:
        """A chart's div and script; plotly.js itself is embedded once, with the first chart."""
        self.charts += 1
        fig.update_layout(
            template="plotly_white",
            margin={"l": 60, "r": 20, "t": 30, "b": 50},
            font={"family": "system-ui, sans-serif", "size": 13},
            legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
        )
        return str(
            fig.to_html(
                full_html=False,
                include_plotlyjs=self.charts == 1,
                div_id=f"chart-{self.charts}",
                config={"displaylogo": False, "responsive": True},
            )
        )


def load_record(path: Path) -> RunRecord:
    """The run record at `path`; InputError (one line) for a missing or malformed file."""
    try:
        return RunRecord.load(path)
    except OSError as exc:
        raise InputError(f"cannot read the run record {path}: {exc.strerror}") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(f"{path} is not a paramedic run record: {exc}") from None


def load_prediction(path: Path) -> dict[str, Any]:
    """`paramedic simulate --json` output; InputError for anything else."""
    try:
        data = load_json_file(path, MAX_RECORD_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read the prediction {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise InputError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not {"wall_seconds", "efficiency", "roles"} <= set(data):
        raise InputError(f"{path} is not the output of `paramedic simulate --json`")
    return data


def write_report(record_path: Path, out: Path, prediction_path: Path | None = None) -> int:
    """Write the page for the record at `record_path` to `out`; returns its size in bytes."""
    record = load_record(record_path)
    prediction = load_prediction(prediction_path) if prediction_path is not None else None
    return write_page(record, out, str(record_path), prediction)


def write_page(
    record: RunRecord, out: Path, source: str = "", prediction: dict[str, Any] | None = None
) -> int:
    """Write the page for `record` to `out` (OutputError when it cannot be); returns its size in bytes."""
    data = render(record, prediction, source).encode()
    try:
        write_output(out, data)  # a device or a FIFO is written through
    except OSError as exc:
        raise OutputError(f"cannot write the report page {out}: {exc.strerror}") from None
    return len(data)


def render(record: RunRecord, prediction: dict[str, Any] | None = None, source: str = "") -> str:
    """The whole page as one HTML string."""
    page = Page(f"paramedic: {record.program}, {record.queries:,} queries, {record.wall_seconds:.1f} s")
    _timeline(page, record)
    _phases(page, record)  # the two half-width sections, side by side
    _bytes(page, record)
    _balance(page, record)
    _eq3(page, record)
    _staging(page, record)
    _prediction(page, record, prediction)
    return _document(page, record, source)


def _rank_label(stats: RankStats) -> str:
    return f"rank {stats.rank} ({stats.role})"


def _timeline(page: Page, record: RunRecord) -> None:
    import plotly.graph_objects as go

    ranks = [r for r in record.ranks_stats if r.task_costs]
    if not ranks or any(len(r.task_starts) != len(r.task_costs) for r in ranks):
        page.add("Timeline", "This record has no task start times (written by an older paramedic).", "")
        return
    origin = min(
        [s for r in ranks for s in r.task_starts] + [e[1] for r in record.ranks_stats for e in r.events]
    )
    end = max(s + c[6] for r in ranks for s, c in zip(r.task_starts, r.task_costs, strict=True)) - origin
    end = max([end] + [e[1] + e[2] - origin for r in record.ranks_stats for e in r.events])
    fig = go.Figure()
    labels = [_rank_label(r) for r in record.ranks_stats]
    for kind in ("search", "piece", "whole"):
        xs, bases, ys, texts = [], [], [], []
        for r in ranks:
            for start, cost in zip(r.task_starts, r.costs(), strict=True):
                if cost.kind != kind:
                    continue
                bases.append(round(start - origin, 3))
                xs.append(round(cost.seconds, 3))
                ys.append(_rank_label(r))
                what = (
                    f"batch {cost.number}, fragment {cost.fragment}"
                    if kind == "search"
                    else f"piece {cost.number}"
                )
                texts.append(f"{what}<br>{cost.queries} queries<br>{cost.seconds:.2f} s")
        if xs:
            fig.add_bar(
                x=xs, base=bases, y=ys, orientation="h", name=KIND_NAMES[kind],
                marker={"color": COLOURS[kind], "line": {"color": "white", "width": 1}},
                hovertext=texts, hoverinfo="text",
            )  # fmt: skip
    waits = _waits(ranks, origin)
    if waits:
        fig.add_bar(
            x=[w[2] for w in waits], base=[w[1] for w in waits], y=[w[0] for w in waits], orientation="h",
            name="waiting", marker={"color": COLOURS["idle"]}, hovertext=[f"waited {w[2]:.2f} s" for w in waits],
            hoverinfo="text",
        )  # fmt: skip
    for phase in ("merge", "write", "stage"):  # the masters' spans, the workers' staging
        spans = [(r, e) for r in record.ranks_stats for e in r.events if e[0] == phase]
        if spans:
            fig.add_bar(
                x=[round(e[2], 3) for _, e in spans], base=[round(e[1] - origin, 3) for _, e in spans],
                y=[_rank_label(r) for r, _ in spans], orientation="h",
                name="staging (copy or wait for a fragment)" if phase == "stage" else phase,
                marker={"color": COLOURS["staging" if phase == "stage" else phase]},
                hovertext=[f"{phase} {e[2]:.3f} s" for _, e in spans],
                hoverinfo="text",
            )  # fmt: skip
    for r in record.ranks_stats:  # partitions marked: a line above each partition master
        if r.role == "partition master":
            above = len(labels) - 1 - labels.index(_rank_label(r)) + 0.5  # categories run top down
            fig.add_hline(y=above, line={"dash": "dot", "color": "#888"})
    fig.update_layout(
        barmode="overlay",
        height=max(220, 60 + 34 * len(labels)),
        xaxis={"title": "seconds since the first task began", "range": [0, max(end, 0.1) * 1.02]},
        yaxis={"categoryorder": "array", "categoryarray": labels[::-1], "type": "category"},
    )
    partitions = (
        f" Dotted lines separate the {record.partitions} partitions." if record.partitions > 1 else ""
    )
    page.add(
        "Timeline",
        "Every BLAST+ task each rank ran, from its start to its end, and the master's merging and writing; "
        "grey is a worker waiting between tasks (for work, a fragment copy or the other ranks). Hover "
        f"over a bar for the task.{partitions}",
        page.figure(fig),
    )


def _waits(ranks: list[RankStats], origin: float) -> list[tuple[str, float, float]]:
    """Each worker's gaps between its tasks (label, start, seconds): waiting for a task, a fragment copy
    or the other ranks. Gaps under 20 ms are the hand-over itself and are not drawn."""
    out = []
    for r in ranks:
        spans = sorted(
            (s - origin, s - origin + c[6]) for s, c in zip(r.task_starts, r.task_costs, strict=True)
        )
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            if start - end >= 0.02:
                out.append((_rank_label(r), round(end, 3), round(start - end, 3)))
    return out


def _phases(page: Page, record: RunRecord) -> None:
    import plotly.graph_objects as go

    totals = record.phase_totals()
    if not any(totals.values()):
        return
    site = "regenerate at the storage site"
    if record.ship is not None and record.ship["g_site_decode_seconds"]:
        totals[site] = record.ship["g_site_decode_seconds"]  # g: the site's BLAST+ runs, off this job's ranks
        COLOURS.setdefault(site, "#FFBF79")
    shown = [p for p in totals if totals[p] >= 0.005 * sum(totals.values())]  # a 0.0 s slice is clutter
    fig = go.Figure(
        go.Pie(
            labels=shown,
            values=[totals[p] for p in shown],
            hole=0.45,
            marker={"colors": [COLOURS[p] for p in shown]},
            sort=False,
            texttemplate="%{label}<br>%{value:.1f} s (%{percent})",
        )
    )
    fig.update_layout(height=320, showlegend=False)
    page.add(
        "Phase split",
        "Time spent in each phase, summed over all ranks: searching the fragments, merging their hit "
        "lists into the exact top hits, regenerating the report for each query group, writing the file.",
        page.figure(fig),
        half=True,
    )


def _balance(page: Page, record: RunRecord) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [_rank_label(r) for r in record.ranks_stats]
    for phase in PHASES:
        values = [round(r.seconds[phase], 3) for r in record.ranks_stats]
        if any(values):
            fig.add_bar(y=labels, x=values, orientation="h", name=phase, marker={"color": COLOURS[phase]})
    idle = [round(max(0.0, record.wall_seconds - sum(r.seconds.values())), 3) for r in record.ranks_stats]
    fig.add_bar(y=labels, x=idle, orientation="h", name="not in a phase", marker={"color": COLOURS["idle"]})
    fig.update_layout(
        barmode="stack",
        height=max(220, 60 + 34 * len(labels)),
        xaxis={"title": "seconds (the run's wall time across)"},
        yaxis={"categoryorder": "array", "categoryarray": labels[::-1]},
    )
    workers = [r for r in record.ranks_stats if r.role in ("worker", "master+worker")]
    busy = [r.seconds["search"] + r.seconds["regenerate"] for r in workers]
    spread = (
        f" Workers' busy time ranges from {min(busy):.1f} s to {max(busy):.1f} s "
        f"({100 * (min(busy) / max(busy) if max(busy) else 1):.0f}% of the busiest)."
        if busy
        else ""
    )
    page.add("Load balance", f"Each rank's time per phase; grey is waiting.{spread}", page.figure(fig))


def _bytes(page: Page, record: RunRecord) -> None:
    import plotly.graph_objects as go

    bars: list[tuple[str, int, str]] = [
        (
            "search results (workers)",
            sum(r.search_output_bytes for r in record.ranks_stats),
            COLOURS["search"],
        ),
        (
            "MPI messages to rank 0",
            record.ranks_stats[0].received_bytes if record.ranks_stats else 0,
            "#9D755D",
        ),
        ("report file", record.output_bytes, COLOURS["write"]),
    ]
    ship = record.ship
    text = "Bytes the run moved between its processes and wrote."
    if ship is not None:
        saved = ship["output_bytes"] - ship["shipped_payload_bytes"]
        bars += [
            (f"shipped ({ship['mode']})", ship["shipped_payload_bytes"], COLOURS["whole"]),
            ("on the wire (TLS, framing)", ship["wire_bytes"], "#88D27A"),
            ("saved by shipping " + ship["mode"], max(0, saved), "#BAB0AC"),
        ]
        ratio = ship["ratio_output_to_payload"]
        text += (
            f" To the storage site {html.escape(ship['site'])}: {ship['shipped_payload_bytes']:,} bytes shipped "
            f"for a {ship['output_bytes']:,}-byte report"
            + (f" ({ratio}x less)" if ratio else "")
            + (f"; the site's copy has sha256 {html.escape(str(ship['site_sha256'])[:16])}..." if ship["site_sha256"] else "")
            + "."
        )  # fmt: skip
    fig = go.Figure(
        go.Bar(
            x=[b[0] for b in bars],
            y=[b[1] for b in bars],
            marker={"color": [b[2] for b in bars]},
            text=[_mb(b[1]) for b in bars],
            textposition="outside",
        )
    )
    # log scale: metadata thousands of times smaller than the output still shows as a bar
    fig.update_layout(height=340, yaxis={"title": "bytes (log scale)", "type": "log"}, showlegend=False)
    page.add("Bytes moved and saved", text, page.figure(fig), half=True)


def _eq3(page: Page, record: RunRecord) -> None:
    """The run on the paper's Eq. 3: metadata wins when D - x > B (f + g)."""
    import plotly.graph_objects as go

    ship = record.ship
    point: tuple[float, float] | None = None
    if ship is not None and ship["mode"] in ("metadata", "auto") or (ship and ship.get("auto_decision")):
        assert ship is not None
        decision = ship.get("auto_decision") or {}
        D = float(decision.get("D_compressed_bytes") or ship["output_bytes"])  # noqa: N806 (the paper's names)
        x = float(decision.get("x_metadata_bytes") or ship["shipped_payload_bytes"])
        f = float(decision.get("f_seconds") or ship["f_encode_seconds"])
        g = float(decision.get("g_seconds") or ship["g_site_decode_seconds"] or 0.0)
        link = decision.get("link") or {}
        B = link.get("bandwidth_bytes_per_second")  # noqa: N806
        where = "measured with this run's storage site"
        if B:  # --ship auto measured the link; a forced mode did not, so the run is a line, not a point
            point = (float(B), f + g)
        else:
            where += " (the link was not measured: --ship auto measures it and places the run on the chart)"
    else:
        D = float(record.output_bytes)  # noqa: N806
        x = float(record.metadata_pairs or 0) * 8  # two ids per pair, about what the metadata codec ships
        f, g = 0.0, record.phase_totals()["regenerate"]
        where = "estimated from this local run (no link crossed: f + g is its regeneration time)"
    if record.strategy == "queries" and ship is None:
        page.add(
            "Data or metadata (the paper's Eq. 3)",
            "This run searched by queries (the whole database per task): it merges nothing, so it makes no "
            "metadata to ship instead of its output. The fragments strategy makes it (--strategy fragments).",
            "",
        )
        return
    if D <= x or f + g <= 0:
        page.add("Data or metadata (the paper's Eq. 3)", "Not enough in this record to place the run.", "")
        return
    breakeven = (D - x) / (f + g)
    marks = [breakeven] + ([point[0]] if point else [])
    lo_e, hi_e = math.floor(math.log10(min(marks))) - 2, math.ceil(math.log10(max(marks))) + 2
    lo, hi = 10.0**lo_e, 10.0**hi_e
    bandwidths = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    costs = [(D - x) / b for b in bandwidths]
    ymin, ymax = (f + g) / 1e3, (f + g) * 1e3
    fig = go.Figure()
    fig.add_scatter(
        x=bandwidths, y=costs, mode="lines", name="D - x = B (f + g): break-even",
        line={"color": "#333", "width": 2}, fill="tozeroy", fillcolor="rgba(84,162,75,0.18)",
    )  # fmt: skip
    fig.add_scatter(
        x=bandwidths, y=[ymax] * len(bandwidths), mode="lines", line={"width": 0}, showlegend=False,
        fill="tonexty", fillcolor="rgba(245,133,24,0.14)", hoverinfo="skip",
    )  # fmt: skip
    if point is not None:
        fig.add_scatter(
            x=[point[0]], y=[point[1]], mode="markers+text", name="this run",
            marker={"size": 14, "color": COLOURS["write"], "symbol": "diamond"},
            text=["this run"], textposition="top center",
        )  # fmt: skip
    fig.add_vline(x=breakeven, line={"dash": "dot", "color": "#666"})
    fig.add_hline(
        y=f + g, line={"dash": "dot", "color": "#666"},
        annotation_text=f"this job's f + g = {f + g:.2f} s", annotation_position="bottom right",
    )  # fmt: skip
    fig.add_annotation(x=0.02, y=0.05, xref="paper", yref="paper", text="ship metadata", showarrow=False,
                       font={"color": "#2E7D32", "size": 15}, xanchor="left")  # fmt: skip
    fig.add_annotation(x=0.98, y=0.95, xref="paper", yref="paper", text="ship the data", showarrow=False,
                       font={"color": "#B35C00", "size": 15}, xanchor="right")  # fmt: skip
    fig.update_layout(
        height=420,
        xaxis={
            "type": "log",
            "title": "link bandwidth B",
            "range": [lo_e, hi_e],
            "tickvals": [10.0**e for e in range(lo_e, hi_e + 1)],
            "ticktext": [_mb(10.0**e) + "/s" for e in range(lo_e, hi_e + 1)],
        },  # fmt: skip
        yaxis={"type": "log", "title": "f + g: metadata cost (s)", "range": [_log10(ymin), _log10(ymax)]},
    )
    page.add(
        "Data or metadata (the paper's Eq. 3)",
        f"ParaMEDIC ships metadata when D - x &gt; B (f + g): the transfer time saved exceeds the computation "
        f"added. Here D = {_mb(D)} of output, x = {_mb(x)} of metadata, f + g = {f + g:.2f} s, {where}. "
        f"Below the line (green) metadata wins; on any link slower than {_mb(breakeven)}/s it does for this "
        "job.",
        page.figure(fig),
    )


def _staging(page: Page, record: RunRecord) -> None:
    import plotly.graph_objects as go

    staged = [r for r in record.ranks_stats if r.stage]
    if record.stage is None or not staged:
        return
    fig = go.Figure()
    labels = [_rank_label(r) for r in staged]
    replicas = sorted({rep["replica"] for r in staged for rep in (r.stage or {}).get("replicas", [])})
    for i, replica in enumerate(replicas):
        values = [
            sum(rep["bytes"] for rep in (r.stage or {}).get("replicas", []) if rep["replica"] == replica)
            for r in staged
        ]
        fig.add_bar(y=labels, x=values, orientation="h", name=replica, marker={"color": _PALETTE[i % 8]})
    fig.update_layout(
        barmode="stack", height=max(220, 80 + 34 * len(labels)), xaxis={"title": "bytes copied"}
    )
    st = record.stage
    dropped = [
        f"{html.escape(rep['replica'])}: {html.escape(str(rep['dropped']))}"
        for r in staged
        for rep in (r.stage or {}).get("replicas", [])
        if rep.get("dropped")
    ]
    text = (
        f"Fragments copied to the node-local cache {html.escape(st['directory'])}: {st['copies']} copies "
        f"({_mb(st['copied_bytes'])} in {st['copy_seconds']:.1f} s, {st['wait_seconds']:.1f} s waiting), "
        f"{st['hits']} cache hits, {st['evictions']} evictions"
        + (f", searched in place: {html.escape(', '.join(st['in_place']))}" if st["in_place"] else "")
        + ". Bytes each rank read from each replica:"
        + ("<br><b>Replicas dropped:</b> " + "; ".join(dropped) if dropped else "")
    )
    page.add("Staging and mirrors", text, page.figure(fig))


def _prediction(page: Page, record: RunRecord, prediction: dict[str, Any] | None) -> None:
    import plotly.graph_objects as go

    if prediction is None:
        return
    # simulate predicts the search, not the link: a shipping run's wall also holds its wait for the
    # storage site after the last search (the demo's: 2.7 s of 11.8, which read as a 26% miss)
    wait = float(record.ship["finish_wait_seconds"] or 0.0) if record.ship is not None else 0.0
    measured = _measured(record, wait)
    names = ["wall time (s)", "worker busy (s, per worker)", "worker idle (s, per worker)"]
    workers = prediction["roles"].get("workers", {})
    predicted = [
        prediction["wall_seconds"],
        workers.get("busy_seconds", 0.0) / max(1, workers.get("ranks", 1)),
        workers.get("idle_seconds_per_rank", 0.0),
    ]
    fig = go.Figure()
    fig.add_bar(x=names, y=[round(v, 2) for v in measured], name="measured", marker={"color": "#4C78A8"})
    fig.add_bar(x=names, y=[round(v, 2) for v in predicted], name="simulate", marker={"color": "#F58518"})
    fig.update_layout(barmode="group", height=340, yaxis={"title": "seconds"})
    same = prediction.get("queries") == record.queries and prediction.get("workers") == record.workers
    page.add(
        "Prediction beside the measured run",
        f"<code>paramedic simulate</code> predicted {prediction['wall_seconds']:.1f} s and efficiency "
        f"{prediction['efficiency']:.2f} for {prediction.get('queries', '?')} queries on "
        f"{prediction.get('workers', '?')} workers; this run took {record.wall_seconds:.1f} s"
        + (
            f", {record.wall_seconds - wait:.1f} s of it before it waited {wait:.1f} s for the storage "
            "site (the prediction is of the search, not the link: the bars leave the wait out)"
            if wait
            else ""
        )
        + ("." if same else " (a different job: compare with care)."),
        page.figure(fig),
    )


def _measured(record: RunRecord, wait: float = 0.0) -> list[float]:
    """Wall, busy and idle seconds per worker, without `wait` (the wait for the storage site at the end)."""
    workers = [r for r in record.ranks_stats if r.role in ("worker", "master+worker")] or record.ranks_stats
    busy = sum(r.seconds["search"] + r.seconds["regenerate"] for r in workers) / len(workers)
    wall = max(busy, record.wall_seconds - wait)
    return [wall, busy, max(0.0, wall - busy)]


_PALETTE = ["#4C78A8", "#72B7B2", "#F58518", "#54A24B", "#EECA3B", "#B279A2", "#FF9DA6", "#9D755D"]


def _mb(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.{0 if n / size >= 100 or (n / size).is_integer() else 1}f} {unit}"
    return f"{n:,.0f} bytes"


def _log10(v: float) -> float:
    return math.log10(max(v, 1e-9))


def _facts(record: RunRecord) -> str:
    reason = record.strategy_reason
    rows = [
        ("program", record.program),
        ("queries", f"{record.queries:,}"),
        ("database", f"{record.database} ({record.fragments} fragments)"),
        ("ranks", f"{record.ranks} ({record.workers} workers, {record.partitions} partition(s))"),
        ("wall time", f"{record.wall_seconds:.1f} s"),
        ("strategy", record.strategy + (f": {reason['reason']}" if reason else "")),
        ("output", f"{record.output} ({record.output_bytes:,} bytes), written by {record.output_strategy}"),
    ]
    if record.metadata_pairs is not None:
        rows.append(
            (
                "hits",
                f"{record.metadata_pairs:,} query-subject pairs, {record.queries_with_hits} queries with hits",
            )
        )
    if record.ship is not None:
        rows.append(("shipped", f"{record.ship['mode']} to {record.ship['site']}"))
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f'<table class="facts">{cells}</table>'


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;background:#f4f5f7;color:#222}
header{background:#1f3b57;color:#fff;padding:18px 32px}
header h1{margin:0 0 4px;font-size:22px;font-weight:600} header code{color:#cfe3f7;font-size:12px}
main{max-width:1100px;margin:0 auto;padding:16px 24px 40px;display:grid;grid-template-columns:1fr 1fr;
column-gap:16px} main>*{grid-column:1/-1;min-width:0} main>section.half{grid-column:auto}
@media (max-width:800px){main>section.half{grid-column:1/-1}}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);padding:14px 20px;margin:8px 0}
h2{font-size:17px;margin:4px 0 6px} .note{color:#555;font-size:14px;margin:0 0 8px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);padding:10px 18px;min-width:120px}
.card .big{font-size:24px;font-weight:600;color:#1f3b57} .card .what{font-size:13px;color:#666}
summary{cursor:pointer;font-size:15px}
table.facts{border-collapse:collapse;font-size:14px} .facts th{text-align:left;color:#666;padding:3px 16px 3px 0;
font-weight:500;vertical-align:top} .facts td{padding:3px 0}
"""


def _figures(record: RunRecord) -> str:
    """The headline: a few big numbers a reader takes in at a glance."""
    cards = [
        (f"{record.wall_seconds:,.1f} s", "wall time"),
        (f"{record.queries:,}", f"queries ({record.queries / max(record.wall_seconds, 1e-9):,.1f}/s)"),
        (
            f"{record.workers:,}",
            "workers" + (f" in {record.partitions} partitions" if record.partitions > 1 else ""),
        ),
        (
            f"{record.fragments}",
            "fragments" if record.strategy == "fragments" else "fragments (searched whole)",
        ),
        (_mb(record.output_bytes), "of output"),
    ]
    if record.metadata_pairs is not None:
        cards.append((f"{record.metadata_pairs:,}", "query-subject hits merged"))
    if record.ship is not None:
        ship = record.ship
        cards.append((_mb(ship["shipped_payload_bytes"]), f"shipped ({ship['mode']})"))
        if ship["ratio_output_to_payload"]:
            cards.append((f"{ship['ratio_output_to_payload']:,.0f}x", "smaller than the output"))
    if record.stage is not None:
        cards.append((_mb(record.stage["copied_bytes"]), "staged to node-local disk"))
    body = "".join(
        f'<div class="card"><div class="big">{html.escape(v)}</div><div class="what">{html.escape(w)}</div></div>'
        for v, w in cards
    )
    return f'<div class="cards">{body}</div>'


def _document(page: Page, record: RunRecord, source: str) -> str:
    command = html.escape(" ".join(record.command))
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(page.title)}</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>{html.escape(page.title)}</h1><code>{command}</code></header><main>"
        + _figures(record)
        + f"<section><details><summary><b>The run in detail</b></summary>{_facts(record)}"
        + (f'<p class="note">From {html.escape(source)}.</p>' if source else "")
        + "</details></section>"
        + "".join(page.sections)
        + "</main></body></html>\n"
    )
