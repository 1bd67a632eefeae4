"""A CLOG2 trace as one self-contained HTML page that shows the whole run, at any trace size.

Made from `overview.summarise` (one pass, bounded memory) and drawn by plotly.js, embedded once so the page
opens with no network:

* the overview: ranks as rows over the run's time in seconds, each cell a time bin in the colour of the
  call the rank spent most of that bin in (or outside MPI), its shares on hover, as Jumpshot's SLOG-2
  previews summarise what is too small to draw; zoom and pan; where the zoomed window is one the page
  kept single calls for (the start of each of 64 stretches of the run, marked under the rows) and holds
  at most DRAW_CALLS of them, the calls themselves are drawn over the cells;
* per rank, the seconds in each call and outside MPI; bytes and messages between each pair of ranks; the
  codec's period (its FFT on each rank's first records) and the phases (long stretches of one mix of calls,
  cut where the mix changes).

The page's size is bounded whatever the trace's: plotly.js (4.8 MB), 10 bytes per (rank, bin) cell (at
most overview.MAX_CELLS, 4.9 MB), 28 bytes per kept call (`max_records`, 20,000 by default: 0.6 MB), and per
rank and per pair of ranks a few numbers.
"""

from __future__ import annotations

import base64
import heapq
import html
import json
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from paramedic.durable import write_output
from paramedic.trace import overview

OUTSIDE = ("outside MPI", "#e4e4e4")
MAX_CATEGORIES = 250  # states with a colour of their own (one byte per cell); the rest are "other calls"
MAX_MATRIX = 256  # ranks of the pair matrix (more ranks are grouped)
CELL_BYTES = 7  # the page's bytes per (rank, bin)
DRAW_CALLS = 4000  # single calls drawn at once when zoomed in
PHASE_PARTS = 64  # a phase lasts at least 1/64 of the run
PHASE_CHANGE = 0.4  # two neighbouring phases' mixes differ by this much at least (L1: 20% of the time moved)
PHASE_OTHER = 0.1  # a category in a phase's mix, beside the first: 10% of its time at least
MAX_PHASES = 24


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def categories(
    summary: overview.Summary,
) -> tuple[list[tuple[str, str]], np.ndarray, np.ndarray, dict[int, int]]:
    """The page's categories (outside MPI first, then the states called, most time first), the seconds
    per (rank, bin, category) and per (rank, category), and each state's category."""
    bins = summary.bins
    total = bins.time.sum(axis=(0, 1))
    order = sorted(bins.states.items(), key=lambda kv: (-total[kv[1]], kv[0]))
    names = {**summary.state_names, overview.OTHER_STATE: ("other states", "#555")}
    named = [names.get(s, (f"state {s}", "#888")) for s, _ in order[:MAX_CATEGORIES]]
    cols = [c for _, c in order[:MAX_CATEGORIES]]
    cells = np.concatenate([summary.outside[:, :, None], bins.time[:, :, cols]], axis=2)
    cat_of = {s: i + 1 for i, (s, _) in enumerate(order[:MAX_CATEGORIES])}
    rest = [c for _, c in order[MAX_CATEGORIES:]]
    if rest:
        named.append(("other calls", "#555"))
        cells = np.concatenate([cells, bins.time[:, :, rest].sum(axis=2, keepdims=True)], axis=2)
        cat_of.update({s: len(named) for s, _ in order[MAX_CATEGORIES:]})
    return [OUTSIDE, *named], cells, cells.sum(axis=1), cat_of


def top_cells(cells: np.ndarray, used: int) -> np.ndarray:
    """Per (rank, bin) of the first `used` bins: the three largest categories and their percent of the
    cell's traced time, then the percent in MPI (all but category 0), as bytes (category 255: nothing
    traced in the cell)."""
    part = cells[:, :used]
    total = part.sum(axis=2, keepdims=True)
    share = np.divide(part, total, out=np.zeros_like(part), where=total > 0)
    k = min(3, part.shape[2])
    top = np.argsort(-share, axis=2, kind="stable")[:, :, :k]
    pct = np.rint(np.take_along_axis(share, top, axis=2) * 100)
    out = np.zeros(part.shape[:2] + (CELL_BYTES,), np.uint8)
    out[:, :, 0 : 2 * k : 2] = np.where(pct > 0, top, 255)
    out[:, :, 1 : 2 * k : 2] = pct
    if k < 3:
        out[:, :, 2 * k : 6 : 2] = 255
    out[:, :, 6] = np.rint((1 - share[:, :, 0]) * 100)
    out[total[:, :, 0] == 0] = 255
    return out


def phases(
    cells: np.ndarray, used: int, width: float
) -> list[tuple[float, float, int, float, list[list[Any]]]]:
    """The run's phases: long stretches of one mix of calls over all ranks (start, end, the category that
    took most of the stretch's time, its share there, and the other categories of the mix: [category,
    share] of at least PHASE_OTHER each, at most two). Each bin's mix is its shares of the time per
    category summed over the ranks; the run is cut where the mix changes, at the bins' resolution, by
    binary segmentation: the stretch whose best cut (the one that most lowers the squared spread of the
    mixes around their stretch's mean) gains most is cut first, so long as both sides last a PHASE_PARTS-th
    of the run (and 2 bins) at least and their mixes differ by PHASE_CHANGE (L1) at least, up to
    MAX_PHASES. Calls that alternate from bin to bin (a message exchange and its wait) are one phase."""
    if used == 0:
        return []
    per_bin = cells[:, :used].sum(axis=0)
    total = per_bin.sum(axis=1)
    weight = (total > 0).astype(np.float64)
    mix = np.divide(per_bin, total[:, None], out=np.zeros_like(per_bin), where=total[:, None] > 0)
    out = []
    for lo, hi in _segments(mix, weight, max(2, used // PHASE_PARTS)):
        time = per_bin[lo:hi].sum(axis=0)
        if time.sum() <= 0:
            continue
        share = time / time.sum()
        order = np.argsort(-share, kind="stable")
        others = [[int(c), float(share[c])] for c in order[1:3] if share[c] >= PHASE_OTHER]
        out.append((lo * width, hi * width, int(order[0]), float(share[order[0]]), others))
    return out


def _segments(mix: np.ndarray, weight: np.ndarray, least: int) -> list[tuple[int, int]]:
    """Stretches [lo, hi) of the bins whose mixes (rows of `mix`, bins of weight 0 not counted) change
    least within and most between (phases()); each at least `least` bins long."""
    n = len(weight)
    pw = np.r_[0.0, np.cumsum(weight)]
    px = np.vstack([np.zeros(mix.shape[1]), np.cumsum(mix * weight[:, None], axis=0)])
    pxx = np.r_[0.0, np.cumsum(weight * (mix * mix).sum(axis=1))]

    def best(lo: int, hi: int) -> tuple[float, int] | None:
        if hi - lo < 2 * least:
            return None
        k = np.arange(lo + least, hi - least + 1)
        wl, wr = pw[k] - pw[lo], pw[hi] - pw[k]
        xl, xr = px[k] - px[lo], px[hi] - px[k]
        ok = (wl > 0) & (wr > 0)
        if not ok.any():
            return None
        wl, wr = np.where(ok, wl, 1.0), np.where(ok, wr, 1.0)
        # the spread left on either side: sum of squares minus the squared sum over the weight
        spread = (
            (pxx[k] - pxx[lo]) - (xl * xl).sum(axis=1) / wl + (pxx[hi] - pxx[k]) - (xr * xr).sum(axis=1) / wr
        )
        i = int(np.argmin(np.where(ok, spread, np.inf)))
        if np.abs(xl[i] / wl[i] - xr[i] / wr[i]).sum() < PHASE_CHANGE:
            return None
        whole = pxx[hi] - pxx[lo] - float((px[hi] - px[lo]) @ (px[hi] - px[lo])) / (pw[hi] - pw[lo])
        return float(whole - spread[i]), int(k[i])

    cuts, heap = {0, n}, []
    found = best(0, n)
    if found:
        heap.append((-found[0], 0, n, found[1]))
    while heap and len(cuts) - 1 < MAX_PHASES:
        _, lo, hi, at = heapq.heappop(heap)
        cuts.add(at)
        for a, b in ((lo, at), (at, hi)):
            found = best(a, b)
            if found:
                heapq.heappush(heap, (-found[0], a, b, found[1]))
    edges = sorted(cuts)
    return list(zip(edges[:-1], edges[1:], strict=True))


def _detail(summary: overview.Summary, cat_of: dict[int, int]) -> dict[str, Any]:
    """The kept single calls, times from the page's zero, and each window's span and complete part."""
    bins, detail = summary.bins, summary.detail
    origin = bins.origin or 0.0
    wide = bins.n // detail.windows * bins.width
    rank, state, start, end = detail.kept()
    lookup = np.asarray(sorted(cat_of.items()), np.int64).reshape(-1, 2)
    at = np.minimum(np.searchsorted(lookup[:, 0], state), len(lookup) - 1)
    found = lookup[at, 0] == state  # a state past MAX_STATES is in OTHER_STATE's column
    cats = np.where(found, lookup[at, 1], cat_of.get(overview.OTHER_STATE, 0)).astype(np.uint8)
    windows = [
        [
            w * wide,
            (w + 1) * wide,
            min(float(detail.cut[w]) - origin, (w + 1) * wide),
            len(detail.calls[w][2]),
        ]
        for w in range(detail.windows)
    ]
    return {
        "start": _b64((start - origin).astype("<f8")),
        "end": _b64((end - origin).astype("<f8")),
        "rank": _b64(rank.astype("<u4")),
        "cat": _b64(cats),
        "windows": windows,
    }


def _matrix(summary: overview.Summary) -> dict[str, Any]:
    """Bytes and messages per (sender, receiver), ranks grouped beyond MAX_MATRIX."""
    n = summary.bytes.shape[0]
    if n <= MAX_MATRIX:
        return {"bytes": summary.bytes.tolist(), "messages": summary.messages.tolist(), "group": 1}
    group = -(-n // MAX_MATRIX)
    size = -(-n // group)
    pad = size * group - n
    out = {}
    for name, m in (("bytes", summary.bytes), ("messages", summary.messages)):
        m = np.pad(m, ((0, pad), (0, pad)))
        out[name] = m.reshape(size, group, size, group).sum(axis=(1, 3)).tolist()
    return {**out, "group": group}


def payload(summary: overview.Summary, title: str) -> dict[str, Any]:
    """Everything the page's script draws, as JSON (arrays of numbers base64-encoded)."""
    cats, cells, per_rank, cat_of = categories(summary)
    bins = summary.bins
    origin = bins.origin or 0.0
    used = int(min(bins.n, max(1, np.ceil((summary.end - origin) / bins.width + 1e-9))))
    return {
        "title": title,
        "records": summary.records,
        "ranks": summary.ranks,
        "span": summary.end - origin,
        "width": bins.width,
        "bins": used,
        "categories": cats,
        "top": _b64(top_cells(cells, used)),
        "per_rank": np.round(per_rank, 9).tolist(),
        "traced": np.round(summary.last - summary.first, 9).tolist(),
        "matrix": _matrix(summary),
        "detail": _detail(summary, cat_of),
        "periods": {str(r): list(p) for r, p in summary.periods.items()},
        "phases": [[a, b, c, s, o] for a, b, c, s, o in phases(cells, used, bins.width)],
        "draw_calls": DRAW_CALLS,
    }


def render(data: bytes | BinaryIO, max_records: int = 20000, title: str = "trace") -> str:
    """The page for a CLOG2 file (its bytes or an open binary file, read once in chunks); `max_records`:
    the single calls kept for zooming in, which bounds the page's size."""
    summary = overview.summarise(data, max_records)
    return page(payload(summary, title))


def write(trace: Path, out: Path, max_records: int = 20000) -> int:
    """Write the page of the trace at `trace` to `out` (the file streamed, not loaded); its size in bytes."""
    with trace.open("rb") as fh:
        text = render(fh, max_records, trace.name).encode()
    write_output(out, text)  # as `paramedic report` writes a page: durably, or through a stream
    return len(text)


def page(data: dict[str, Any]) -> str:
    """The HTML: plotly.js, the data and the script that draws it."""
    from plotly.offline import get_plotlyjs

    blob = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")  # no tag can close the script
    title = html.escape(data["title"])
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}: MPI trace</title><style>{_STYLE}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"<header><h1>{title}</h1><div id='facts'></div></header><main>"
        "<section><h2>The whole run</h2><p class='note' id='status'></p><div id='legend'></div>"
        "<label class='note'>Cells: <select id='mode'><option value='dominant'>the call the rank spent most of "
        "the bin in</option><option value='mpi'>the share of the bin in MPI</option></select></label>"
        "<div id='chart-1'></div><p class='note'>Zoom: drag over the time axis (double-click: the whole run); "
        "<label>single calls kept for <select id='windows'></select></label></p></section>"
        "<section><h2>Time per rank</h2><p class='note'>Seconds in each MPI call (the outermost call of "
        "each thread) and outside MPI, from the rank's first record to its last.</p><div id='chart-2'></div></section>"
        "<section><h2>Messages between ranks</h2><p class='note' id='matrix-note'></p><div id='chart-3'></div></section>"
        "<section><h2>Period and phases</h2><div id='period'></div></section>"
        f"</main><script id='data' type='application/json'>{blob}</script><script>{_SCRIPT}</script></body></html>\n"
    )


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;background:#f4f5f7;color:#222}
header{background:#1f3b57;color:#fff;padding:14px 32px} header h1{margin:0 0 4px;font-size:20px}
#facts{font-size:14px;color:#cfe3f7} main{padding:12px 24px 40px}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);padding:12px 20px;margin:8px 0}
h2{font-size:17px;margin:4px 0 6px} .note{color:#555;font-size:14px;margin:0 0 8px}
#legend span.key{display:inline-block;padding:1px 8px;margin:2px 6px 2px 0;border-radius:3px;font-size:13px}
table{border-collapse:collapse;font-size:14px} td,th{padding:3px 12px 3px 0;text-align:left}
tr.phase{cursor:pointer} tr.phase:hover{background:#eef3f8}
"""

_SCRIPT = r"""
(function(){
const D = JSON.parse(document.getElementById('data').textContent);
function bytes(b64){const s=atob(b64);const a=new Uint8Array(s.length);for(let i=0;i<s.length;i++)a[i]=s.charCodeAt(i);return a;}
const top = bytes(D.top), R = D.ranks, B = D.bins, W = D.width, C = D.categories.length;
const det = {start:new Float64Array(bytes(D.detail.start).buffer), end:new Float64Array(bytes(D.detail.end).buffer),
  rank:new Uint32Array(bytes(D.detail.rank).buffer), cat:bytes(D.detail.cat), windows:D.detail.windows};
const fmt = s => s >= 1 ? s.toFixed(3)+' s' : s >= 1e-3 ? (s*1e3).toFixed(3)+' ms' : (s*1e6).toFixed(2)+' us';
const ranks = Array.from({length:R}, (_, r) => r);
document.getElementById('facts').textContent = D.records.toLocaleString()+' records, '+R+' ranks, '+fmt(D.span)+
  ' from the first record to the last; time bins of '+fmt(W);
// the overview: dominant category per (rank, bin), shares on hover
const z = [], zmpi = [], text = [];
for (let r = 0; r < R; r++) {
  const zr = new Array(B), zs = new Array(B), tr = new Array(B);
  for (let b = 0; b < B; b++) {
    const o = (r*B + b)*7;
    if (top[o] === 255) { zr[b] = null; zs[b] = null; tr[b] = 'rank '+r+': not traced'; continue; }
    zr[b] = top[o]; zs[b] = top[o+6];
    let t = 'rank '+r+', '+fmt(b*W)+' - '+fmt((b+1)*W);
    for (let k = 0; k < 3; k++) if (top[o+2*k] !== 255) t += '<br>'+D.categories[top[o+2*k]][0]+' '+top[o+2*k+1]+'%';
    tr[b] = t + '<br>(in MPI: '+top[o+6]+'%)';
  }
  z.push(zr); zmpi.push(zs); text.push(tr);
}
const scale = [];
D.categories.forEach((c, i) => { scale.push([i/C, c[1]]); scale.push([(i+1)/C, c[1]]); });
const heat = {type:'heatmap', z:z, x0:W/2, dx:W, y:ranks, text:text, hoverinfo:'text', colorscale:scale,
  zmin:-0.5, zmax:C-0.5, showscale:false, xgap:0, ygap:1};
const inMpi = Object.assign({}, heat, {z:zmpi, colorscale:'YlOrRd', zmin:0, zmax:100, showscale:true,
  colorbar:{title:{text:'% in MPI'}, thickness:12}});
const mode = document.getElementById('mode');
const covered = det.windows.filter(w => w[3] > 0 && w[2] > w[0]).map(w => ({type:'rect', xref:'x', yref:'paper',
  x0:w[0], x1:Math.max(Math.min(w[2], D.span), w[0] + D.span/400), y0:0, y1:0.03, fillcolor:'#1f3b57', opacity:0.8, line:{width:0}}));
// a row per rank: 22 px up to 72 ranks, then thinner so that the whole run stays at a glance (about 1,600 px
// of rows, at least 2 px a rank), every `every`-th rank named
const rowPx = R <= 72 ? 22 : Math.max(2, Math.floor(1600 / R));
const every = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000].find(k => k*rowPx >= 14) || 10000;
const named = ranks.filter(r => r % every === 0);
heat.ygap = inMpi.ygap = rowPx >= 8 ? 1 : 0;
// the phases (table below): a dotted line where each begins, its number over the rows
const bounds = D.phases.slice(1).map(p => ({type:'line', xref:'x', yref:'paper', x0:p[0], x1:p[0], y0:0, y1:1,
  line:{color:'#1f3b57', width:1, dash:'dot'}}));
const numbers = D.phases.map((p, i) => ({x:(p[0] + Math.min(p[1], D.span))/2, y:1, xref:'x', yref:'paper', yanchor:'bottom',
  text:String(i+1), showarrow:false, font:{size:10, color:'#1f3b57'}, captureevents:false}));
const layout = {template:'plotly_white', height:Math.max(270, 90 + rowPx*R), margin:{l:70, r:20, t:20, b:50},
  xaxis:{title:{text:'seconds since the first record'}, range:[0, D.span], rangemode:'tozero'},
  yaxis:{autorange:'reversed', tickvals:named, ticktext:named.map(r => 'rank '+r), fixedrange:true},
  shapes:covered.concat(bounds), annotations:numbers, showlegend:false, uirevision:'keep', dragmode:'zoom'};
const div = document.getElementById('chart-1');
const legend = document.getElementById('legend');
function dark(css) {  // white text on a dark key
  const m = /rgb\((\d+),\s*(\d+),\s*(\d+)\)/.exec(css);
  return m ? 0.299*m[1] + 0.587*m[2] + 0.114*m[3] < 120 : css === '#555';
}
D.categories.forEach(c => { const s = document.createElement('span'); s.className = 'key'; s.style.background = c[1];
  if (dark(c[1])) s.style.color = '#fff';
  s.textContent = c[0]; legend.appendChild(s); });
const status = document.getElementById('status');
function calls(x0, x1) {
  // the kept calls in [x0, x1] when every window over it is complete there, else null
  let n = 0; const pick = [];
  for (let w = 0; w < det.windows.length; w++) {
    const win = det.windows[w];
    if (win[1] <= x0 || win[0] >= x1) continue;
    if (win[2] < Math.min(x1, win[1], D.span)) return null;
  }
  for (let i = 0; i < det.start.length; i++) if (det.end[i] >= x0 && det.start[i] <= x1) { pick.push(i); if (++n > D.draw_calls) return null; }
  return pick;
}
function traces(pick) {
  const by = new Map();
  for (const i of pick) { const c = det.cat[i]; if (!by.has(c)) by.set(c, []); by.get(c).push(i); }
  const out = [];
  for (const [c, idx] of by) out.push({type:'bar', orientation:'h', y:idx.map(i => det.rank[i]), base:idx.map(i => det.start[i]),
    x:idx.map(i => Math.max(det.end[i]-det.start[i], 0)), marker:{color:D.categories[c][1], line:{width:0.5, color:'#222'}}, width:0.7,
    name:D.categories[c][0], hoverinfo:'text', text:idx.map(i => D.categories[c][0]+' rank '+det.rank[i]+'<br>'+fmt(det.start[i])+' + '+fmt(det.end[i]-det.start[i])), textposition:'none'});
  return out;
}
let shown = -1;
function update(range) {
  const x0 = range ? range[0] : 0, x1 = range ? range[1] : D.span;
  const pick = calls(x0, x1);
  const key = (pick ? pick.length + ':' + x0 + ':' + x1 : 'bins') + mode.value;
  if (key === shown) return; shown = key;
  if (pick) status.textContent = pick.length+' single calls from '+fmt(x0)+' to '+fmt(x1)+', over the time bins.';
  else status.textContent = 'Each cell: one rank over one time bin ('+fmt(W)+') in the colour of the call it spent most of the bin in (hover: the three largest shares). Zoom into a stretch marked under the rows to see single calls.';
  const lay = Object.assign({}, layout, {xaxis:Object.assign({}, layout.xaxis, {range:[x0, x1]}), barmode:'overlay'});
  const cells = mode.value === 'mpi' ? inMpi : heat;
  Plotly.react(div, pick ? [cells, ...traces(pick)] : [cells], lay, {displaylogo:false, responsive:true});
  // what a test (or a reader of the DOM) checks: the range on the axis, the ranks with a cell drawn
  div.dataset.range = x0 + ',' + x1;
  div.dataset.ranks = z.filter(row => row.some(v => v !== null)).length;
  div.dataset.rowpx = rowPx;
  div.dataset.calls = pick ? pick.length : 0;
}
const asked = /#zoom=([0-9.e-]+),([0-9.e-]+)/.exec(location.hash);  // a link to a stretch of the run
if (/cells=mpi/.test(location.hash)) mode.value = 'mpi';  // ... and to the cells by their share in MPI
update(asked ? [+asked[1], +asked[2]] : null);
mode.addEventListener('change', () => { const r = div.layout.xaxis.range; update([+r[0], +r[1]]); });
div.on('plotly_relayout', ev => {
  if (ev['xaxis.autorange'] || ev['xaxis.range[0]'] === undefined && !ev['xaxis.range']) { if (ev['xaxis.autorange']) update(null); return; }
  const r = ev['xaxis.range'] || [ev['xaxis.range[0]'], ev['xaxis.range[1]']];
  update([Math.max(0, +r[0]), Math.min(D.span, +r[1])]);
});
const sel = document.getElementById('windows');
sel.appendChild(new Option('(choose a stretch)', ''));
det.windows.forEach((w, i) => { if (w[3] > 0 && w[2] > w[0]) sel.appendChild(new Option(fmt(w[0])+' to '+fmt(Math.min(w[2], D.span))+' ('+w[3]+' calls kept)', i)); });
sel.addEventListener('change', () => { if (sel.value === '') return; const w = det.windows[+sel.value];
  let x1 = Math.min(w[2], D.span), x0 = w[0];
  // at most draw_calls of them: shrink to the first calls of the window
  const own = []; for (let i = 0; i < det.start.length; i++) if (det.start[i] >= x0 && det.start[i] < x1) own.push(det.end[i]);
  own.sort((a, b) => a - b); if (own.length > D.draw_calls/2) x1 = Math.min(x1, own[Math.floor(D.draw_calls/2)]);
  Plotly.relayout(div, {'xaxis.range':[x0, x1]}); });
// time per rank
const per = D.per_rank, bars = [];
D.categories.forEach((c, k) => { const xs = ranks.map(r => k === 0 ? Math.max(0, D.traced[r] - per[r].slice(1).reduce((a, b) => a + b, 0)) : per[r][k]);
  if (xs.some(v => v > 0)) bars.push({type:'bar', orientation:'h', y:ranks.map(r => 'rank '+r), x:xs, name:c[0], marker:{color:c[1]},
    hovertemplate:'%{y}: '+c[0]+' %{x:.6f} s<extra></extra>'}); });
Plotly.newPlot('chart-2', bars, {template:'plotly_white', barmode:'stack', height:Math.max(240, 90 + (R <= 72 ? 26 : rowPx)*R), margin:{l:70, r:20, t:30, b:50},
  xaxis:{title:{text:'seconds'}}, yaxis:{autorange:'reversed', tickvals:named.map(r => 'rank '+r)}, legend:{orientation:'h', y:1.02, yanchor:'bottom', x:0}}, {displaylogo:false, responsive:true});
// the pair matrix
const m = D.matrix, g = m.group, labels = m.bytes.map((_, i) => g === 1 ? 'rank '+i : 'ranks '+(i*g)+'-'+(i*g+g-1));
const hover = m.bytes.map((row, i) => row.map((v, j) => labels[i]+' to '+labels[j]+': '+v.toLocaleString()+' bytes in '+m.messages[i][j].toLocaleString()+' messages'));
Plotly.newPlot('chart-3', [{type:'heatmap', z:m.bytes, x:labels, y:labels, text:hover, hoverinfo:'text', colorscale:'Blues', reversescale:true, colorbar:{title:{text:'bytes'}}}],
  {template:'plotly_white', height:Math.max(300, 120 + 24*labels.length), margin:{l:110, r:20, t:10, b:90},
   xaxis:{title:{text:'receiver'}}, yaxis:{title:{text:'sender'}, autorange:'reversed'}}, {displaylogo:false, responsive:true});
const sent = m.bytes.flat().reduce((a, b) => a + b, 0), msgs = m.messages.flat().reduce((a, b) => a + b, 0);
document.getElementById('matrix-note').textContent = msgs.toLocaleString()+' point-to-point messages, '+sent.toLocaleString()+
  ' bytes, counted at their sends (collectives are not in it).';
// period and phases
const esc = s => String(s).replace(/[&<>"']/g, c => '&#'+c.charCodeAt(0)+';');
let h = '<table><tr><th>rank</th><th>period (records)</th><th>one period lasts</th></tr>';
for (const [r, p] of Object.entries(D.periods)) h += '<tr><td>'+r+'</td><td>'+(p[0] ? p[0].toLocaleString() : 'none found')+'</td><td>'+(p[0] ? fmt(p[1]) : '')+'</td></tr>';
h += '</table><p class="note">The trace codec\'s period: an FFT autocorrelation of each rank\'s first records\' kinds (the same records repeat every period).</p>';
h += '<table><tr><th>phase</th><th>from</th><th>to</th><th>mostly</th><th>share</th><th>with</th></tr>';
D.phases.forEach((p, i) => { h += '<tr class="phase" data-phase="'+i+'" title="zoom to this phase"><td>'+(i+1)+'</td><td>'+fmt(p[0])+'</td><td>'+fmt(Math.min(p[1], D.span))+'</td><td>'+esc(D.categories[p[2]][0])+'</td><td>'+Math.round(p[3]*100)+'%</td><td>'+
  (p[4] || []).map(o => esc(D.categories[o[0]][0])+' '+Math.round(o[1]*100)+'%').join(', ')+'</td></tr>'; });
h += '</table><p class="note">Phases (numbered over the rows above; click one to zoom to it): long stretches of the run (a 64th of it at least) of one mix of calls (and time outside MPI) over all ranks, cut where the mix changes by a fifth of the time or more.</p>';
document.getElementById('period').innerHTML = h;
document.querySelectorAll('tr.phase').forEach(row => row.addEventListener('click', () => {
  const p = D.phases[+row.dataset.phase];
  Plotly.relayout(div, {'xaxis.range':[p[0], Math.min(p[1], D.span)]});
  div.scrollIntoView();
}));
})();
"""
