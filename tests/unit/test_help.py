"""Every command's help (issue 45, item 3) and `paramedic --version`: what a new user types first.

The help is asked in-process (`cli.main`: 9 commands, two spellings, in well under a second) and once more
through the installed `paramedic` command for the exit code a shell sees."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from paramedic import __version__, cli
from tests.conftest import BIN

COMMANDS = sorted(cli.commands())


def help_of(command: str, flag: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The exit code and the text of `paramedic COMMAND FLAG` (argparse ends help with SystemExit(0))."""
    try:
        code = cli.main([command, flag])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_dispatch_knows_every_command_of_the_usage() -> None:
    """The table the help test walks is the dispatch's own, and the usage lists every entry of it."""
    listed = re.findall(r"^  (\w+) ", cli.USAGE, re.M)
    assert sorted(listed) == COMMANDS and len(COMMANDS) >= 9


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_options_and_an_example(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = help_of(command, flag, capsys)
    assert code == 0, text
    assert text.startswith(f"usage: paramedic {command}"), text
    assert "options:" in text and "-h, --help" in text, text
    examples = text.split("example", 1)[-1]
    assert "example" in text and f"paramedic {command}" in examples, text


def test_trace_help_documents_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    """Before, `trace --help` refused ("give the MPI command after --", exit 2) and these options were
    documented in the README only."""
    code, text = help_of("trace", "--help", capsys)
    assert code == 0
    for option in ("-out", "--buffer", "--site", "--keys", "--record", "--ship", "--trace-precision", "-- "):
        assert option in text, option


def test_trace_without_the_command_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trace", "-out", "x.clog2"]) == 2
    assert "give the MPI command after --" in capsys.readouterr().err


def test_help_exit_code_through_the_command() -> None:
    for argv in (["trace", "--help"], ["trace", "-h"], ["search", "-h"]):
        proc = subprocess.run([str(BIN / "paramedic"), *argv], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "example" in proc.stdout, (argv, proc.stderr)


def run_version(path: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=path)
    return subprocess.run(
        [str(BIN / "paramedic"), "--version"], capture_output=True, text=True, timeout=60, env=env
    )


def test_version_names_blast() -> None:
    proc = run_version(os.environ["PATH"])
    blast = subprocess.run(["blastn", "-version"], capture_output=True, text=True).stdout.split()[1]
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"paramedic {__version__} (BLAST+ {blast})\n"


def test_version_without_blast(tmp_path: Path) -> None:
    """An install on a machine without BLAST+ still says its own version, and that BLAST+ is missing."""
    proc = run_version(str(tmp_path))
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"paramedic {__version__} (BLAST+ not found)\n"


def test_citation_and_license_match_the_package() -> None:
    """CITATION.cff's version is the package's, and the license it and pyproject.toml name is LICENSE's."""
    root = Path(__file__).resolve().parents[2]
    citation = (root / "CITATION.cff").read_text()
    assert re.search(r"^version: (\S+)$", citation, re.M)[1] == __version__  # type: ignore[index]
    assert "\nlicense: BSD-3-Clause\n" in citation
    assert 'license = "BSD-3-Clause"' in (root / "pyproject.toml").read_text()
    assert (root / "LICENSE").read_text().startswith("BSD 3-Clause License\n")
