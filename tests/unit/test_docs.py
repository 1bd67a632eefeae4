"""The docs stay true where a machine can check them (issue 45): README.md is the front door and docs/ the
manual, and what they say of the command line, the exit codes and each other is checked against the code.

- every relative link (and its #anchor) in README.md and docs/ resolves;
- every `paramedic COMMAND` shown in code (a fenced block or a `span`) is a command of `cli.commands()`;
- every option shown on such a command line is one that command's `--help` lists (BLAST+'s single-dash
  options of `search` are BLAST+'s own, checked by BLAST+ itself at run time, and not here);
- every option of docs/OPTIONS.md is one some command's `--help` lists, and every option `search --help`
  lists is in docs/OPTIONS.md;
- every option the other commands' `--help` lists is on the command's page of docs/ (PAGE_OF);
- every `make TARGET` shown is a target of the Makefile;
- docs/LAYOUT.md ("Every module") names every module of src/paramedic, and only modules that exist;
- the exit codes of the README's line, docs/ERRORS.md's table and CHANGELOG.md's table are the codes the
  code exits with;
- the README stays the front door: at most 200 lines, with the two set-up commands .ci/run relies on.

Each check reads text only and asks `--help` in process (`cli.main`, as tests/unit/test_help.py does)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

from paramedic import cli, errors, pipes
from paramedic.engine.runtime import stopped
from paramedic.ship.transport import SiteError

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# `paramedic WORD` where paramedic is the command (start, after a blank, a path's / or a parenthesis)
COMMAND = re.compile(r"(?:^|(?<=[\s/(]))paramedic[ \t]+([a-z][a-z-]*)\b")
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
# where a command line ends and another program's begins: a pipe, a list, a comment, `--` (trace's MPI command)
END = re.compile(r"\s(?:\||;|&&|\|\||#|--)(?=\s|$)|\s\\\|")


# options of other programs that docs/OPTIONS.md names on their own: srun's (`--mpi=pmi2`), mpiBLAST's
FOREIGN = {"--mpi", "--concurrent"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def text_outside_code(text: str) -> str:
    return SPAN.sub("", FENCE.sub("", text))


def code_of(text: str) -> list[str]:
    """The code a page shows: each line of its fenced blocks, and each inline span (one line, even when the
    span wraps), with a block's continued lines (`\\` at the end) joined."""
    lines: list[str] = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += [" ".join(span.split()) for span in SPAN.findall(FENCE.sub("", text))]
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, blanks to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)}


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """The relative links of a page (its text, or `text` as if it were the page's) that lead nowhere."""
    broken = []
    for target in LINK.findall(text_outside_code(page.read_text() if text is None else text)):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto: ...: not this tree's
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            broken.append(f"{rel(page)}: {target} (no {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{rel(page)}: {target} (no heading #{anchor} in {rel(dest)})")
    return broken


@cache
def help_text(command: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli.main([command, "--help"])
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    assert code == 0, out.getvalue()
    return out.getvalue()


@cache
def options_of(command: str) -> frozenset[str]:
    """The options `paramedic COMMAND --help` lists: each entry of its option list, every spelling
    (`-o OUT, -out OUT, --out OUT`), not the options its descriptions mention."""
    options = set()
    for line in help_text(command).splitlines():
        entry = re.match(r"  (-\S.*?)(?: {2,}|$)", line)
        if entry:
            options |= {part.split()[0] for part in entry[1].split(", ")}
    return frozenset(options)


def command_lines() -> list[tuple[str, str, str]]:
    """(page, command, what follows it up to the end of its command line) for every `paramedic COMMAND`
    shown in code in README.md and docs/."""
    found = []
    for page in PAGES:
        for line in code_of(page.read_text()):
            for m in COMMAND.finditer(line):
                rest = END.split(line[m.end() :], maxsplit=1)[0]
                found.append((rel(page), m.group(1), rest))
    return found


def test_every_relative_link_resolves() -> None:
    broken = [b for page in PAGES for b in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_every_command_shown_exists() -> None:
    known = cli.commands()
    shown = command_lines()
    unknown = sorted({f"{page}: paramedic {command}" for page, command, _ in shown if command not in known})
    assert not unknown, unknown
    # the manual shows every command at least once
    assert {command for _, command, _ in shown} >= set(known), set(known) - {c for _, c, _ in shown}


def test_every_option_shown_is_the_commands() -> None:
    wrong = []
    for page, command, rest in command_lines():
        if command not in cli.commands():
            continue  # the test above names it
        for option in OPTION.findall(rest):
            if command == "search" and not option.startswith("--"):
                continue  # BLAST+'s own options: BLAST+ checks them against its -help at run time
            if option not in options_of(command):
                wrong.append(f"{page}: paramedic {command} ... {option}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_options_page_and_search_help_agree() -> None:
    """docs/OPTIONS.md names only options that exist, and every option of `search --help` is in it."""
    page = (ROOT / "docs" / "OPTIONS.md").read_text()
    named = {o for line in code_of(page) for o in OPTION.findall(line) if o.startswith("--")} - FOREIGN
    everyone = frozenset().union(*(options_of(c) for c in cli.commands()))
    assert not named - everyone, sorted(named - everyone)
    missing = {o for o in options_of("search") if o.startswith("--") and o not in named} - {"--help"}
    assert not missing, sorted(missing)


# the page of the manual that documents each command's options (search's: OPTIONS.md, above)
PAGE_OF = {
    "format": ["DATABASES.md"],
    "serve": ["SITE.md"],
    "keys": ["SITE.md"],
    "trace": ["TRACE.md"],
    "ship": ["TRACE.md"],
    "simulate": ["SIMULATE.md"],
    "verify": ["DATABASES.md"],
    "report": ["SEARCH.md", "TRACE.md"],
    "convert": ["TRACE.md"],
}


@pytest.mark.parametrize("command", sorted(PAGE_OF))
def test_every_option_of_a_command_is_on_its_page(command: str) -> None:
    text = "\n".join((ROOT / "docs" / page).read_text() for page in PAGE_OF[command])
    named = {option for line in code_of(text) for option in OPTION.findall(line)}
    missing = options_of(command) - named - {"-h", "--help"}
    assert not missing, f"paramedic {command}: {sorted(missing)} not in docs/{' or '.join(PAGE_OF[command])}"


def layout_modules() -> set[str]:
    """The modules docs/LAYOUT.md lists under "Every module", one `- `path.py`: ...` line each."""
    section = (ROOT / "docs" / "LAYOUT.md").read_text().split("## Every module", 1)[1]
    return set(re.findall(r"^- `([\w/]+\.py)`", section, re.M))


def source_modules() -> set[str]:
    source = ROOT / "src" / "paramedic"
    return {str(p.relative_to(source)) for p in source.rglob("*.py") if p.name != "__init__.py"}


def test_every_module_in_the_layout_exists() -> None:
    gone = layout_modules() - source_modules()
    assert not gone, f"docs/LAYOUT.md lists modules that are not in src/paramedic: {sorted(gone)}"


def test_every_module_is_in_the_layout() -> None:
    unlisted = source_modules() - layout_modules()
    assert not unlisted, f"give each a line in docs/LAYOUT.md, 'Every module': {sorted(unlisted)}"


def code_exit_codes() -> set[int]:
    """What paramedic exits with: success, each error class's code, an interrupt, a closed stdout."""
    classes: list[type[errors.ParamedicError]] = [
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ParamedicError)
    ]
    assert len(classes) >= 8
    return {0, SiteError.exit_code, stopped.EXIT_CODE, pipes.CLOSED_PIPE_EXIT} | {
        c.exit_code for c in classes
    }


def table_codes(text: str) -> set[int]:
    """The codes in the first column of the `| code | meaning |` table of a page."""
    table = text.split("| code | meaning |", 1)[1]
    return {int(code) for code in re.findall(r"^\| (\d+) \|", table.split("\n\n", 1)[0], re.M)}


def test_exit_codes_documented_are_the_codes() -> None:
    codes = code_exit_codes()
    assert codes == {0, 1, 2, 3, 4, 5, 6, 7, 8, 130, 141}
    assert table_codes((ROOT / "docs" / "ERRORS.md").read_text()) == codes
    assert table_codes((ROOT / "CHANGELOG.md").read_text()) == codes
    # the README's line: "0 success, 1 internal error, ..., 141 standard output closed"
    section = README.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert {int(c) for c in re.findall(r"(?<![\w.-])(\d+) [a-zA-Z+]", section)} == codes


def test_every_exit_code_in_the_source_is_documented() -> None:
    """An error class added anywhere under src/ with a code of its own is in the table too."""
    source = ROOT / "src" / "paramedic"
    declared = {
        int(c)
        for p in source.rglob("*.py")
        for c in re.findall(r"^\s+exit_code = (\d+)$", p.read_text(), re.M)
    }
    assert declared <= table_codes((ROOT / "docs" / "ERRORS.md").read_text()), declared


def test_every_make_target_shown_exists() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    shown = {
        (rel(page), m[1])
        for page in PAGES
        for line in code_of(page.read_text())
        for m in re.finditer(r"(?:^|(?<=[\s(]))make[ \t]+([a-z][\w-]*)", line)
    }
    unknown = sorted(f"{page}: make {target}" for page, target in shown if target not in targets)
    assert not unknown, unknown
    assert {"demo", "test", "setup", "lint"} <= {target for _, target in shown}


def test_readme_is_the_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    # the two set-up commands, as .ci/run and the stop hook read them
    assert re.search(r"^make demo\s+#", text, re.M) and re.search(r"^make test\s+#", text, re.M)
    assert "\nmake test\n" in (ROOT / ".ci" / "run").read_text()
    # and the manual's contents page names every page of docs/
    contents = (ROOT / "docs" / "README.md").read_text()
    unnamed = [p.name for p in DOCS if p.name != "README.md" and f"]({p.name})" not in contents]
    assert not unnamed, unnamed


@pytest.mark.parametrize(
    ("page", "bad"),
    [
        ("[x](docs/NOPE.md)", "docs/NOPE.md"),
        ("[x](docs/SEARCH.md#no-such-heading)", "#no-such-heading"),
    ],
)
def test_a_broken_link_is_found(page: str, bad: str) -> None:
    """The link check can fail: the README with a link that leads nowhere."""
    assert any(bad in b for b in broken_links(README, README.read_text() + page + "\n"))


def test_a_wrong_option_is_found() -> None:
    """The option check can fail: an option `format` does not have, and one it has."""
    assert "--fragments" in options_of("format") and "--np" not in options_of("format")
    assert COMMAND.search("x paramedic format --np 3") and not COMMAND.search("paramedic-rank3")
