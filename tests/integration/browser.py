"""A real browser on a page: Debian's headless Chromium loads a file with its scripts, and the test reads
the DOM they built (charts drawn or not) and the errors they threw, and takes a screenshot.

Errors are caught by a listener put first in a copy of the page: it writes every uncaught error and
unhandled rejection into an attribute of <html>, which --dump-dom prints once the scripts ran.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

CATCHER = (
    "<script>window.addEventListener('error',function(e){var h=document.documentElement;"
    "h.setAttribute('data-js-errors',(h.getAttribute('data-js-errors')||'')+(e.message||'error')+';')});"
    "window.addEventListener('unhandledrejection',function(e){var h=document.documentElement;"
    "h.setAttribute('data-js-errors',(h.getAttribute('data-js-errors')||'')+String(e.reason)+';')});"
    "</script>"
)
ERRORS = re.compile(r'data-js-errors="([^"]*)"')
# What a drawn Plotly chart has in its SVG: a bar or marker (point), a line (js-line), a pie slice
DRAWN = re.compile(r'class="(point|js-line|slice)"')


@dataclass
class Loaded:
    dom: str
    errors: list[str]
    charts: dict[str, bool]  # chart div id -> something drawn in it


def chromium() -> str:
    """Debian's chromium (`make chromium`); in CI its absence fails, locally it skips."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: run `make chromium`")
        pytest.skip("chromium is missing: run `make chromium`")
    return path


def load(page: Path, work: Path, screenshot: Path | None = None) -> Loaded:
    """Load `page` in headless Chromium (its scripts run, the network is not used), return what it built."""
    work.mkdir(parents=True, exist_ok=True)
    copy = work / "checked.html"
    text = page.read_text()
    head = text.index("<head>") + len("<head>") if "<head>" in text else 0
    copy.write_text(text[:head] + CATCHER + text[head:])
    dom = _run(["--dump-dom", copy.as_uri()], work).stdout
    if screenshot is not None:
        _run(
            [f"--screenshot={screenshot}", "--window-size=1200,2400", "--hide-scrollbars", page.as_uri()],
            work,
        )
    found = ERRORS.search(dom)
    errors = [e for e in (found.group(1) if found else "").split(";") if e]
    parts = re.split(r'<div id="(chart-\d+)"', dom)
    charts = {parts[i]: bool(DRAWN.search(parts[i + 1])) for i in range(1, len(parts), 2)}
    return Loaded(dom, errors, charts)


def _run(args: list[str], work: Path) -> subprocess.CompletedProcess[str]:
    """One headless Chromium, in a profile of its own under `work`, every process of it ended after."""
    command = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-extensions", "--disable-background-networking", f"--user-data-dir={work / 'profile'}",
        "--virtual-time-budget=10000", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        command,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "HOME": str(work)},
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its renderer and helpers too
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {err[-2000:]}"
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
