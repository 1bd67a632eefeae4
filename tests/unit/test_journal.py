"""The journal's records and its replay into the scheduler (paramedic.engine.rank.journal), without MPI."""

from __future__ import annotations

import math
import shutil
import zlib
from pathlib import Path

import pytest

from paramedic.blast.hits import Candidate, FragmentSearch, Hit, PrelimList
from paramedic.engine.core.scheduler import PieceTask, Plan, Scheduler, SearchTask
from paramedic.engine.rank.journal import Journal
from paramedic.errors import UsageError

PLAN = Plan(
    batches=(range(0, 2), range(2, 3)), n_fragments=2, pieces=(range(0, 1), range(1, 3)), hitlist_size=5
)
IDENTITY = {"program": "blastp", "queries": "abc"}


def result(n_queries: int, gid: int) -> FragmentSearch:
    # e-values that differ in the last bits, as sum statistics give them: the journal must keep them exact
    evalue = 4.658239190000001e-3
    close = math.nextafter(evalue, 1)
    return FragmentSearch(
        hits=[[Hit(evalue, 50 + q, gid + q, b"Seq-align ::= {\xff\x00}")] for q in range(n_queries)],
        prelim=[
            PrelimList(500, (Candidate(evalue, 50 + q, gid + q), Candidate(close, 40, gid + 100)))
            for q in range(n_queries)
        ],
    )


def test_replay_restores_the_scheduler_and_the_plan_of_the_first_run(tmp_path: Path) -> None:
    path = tmp_path / ".out.journal"
    journal, plan, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert plan == PLAN and replay.empty
    journal.search_done(SearchTask(0, 0), result(2, 10))
    journal.search_done(SearchTask(0, 1), result(2, 20))
    journal.piece_done(0, b"piece zero")
    assert journal.close(complete=False)  # finished work: kept

    other_plan = Plan(batches=(range(0, 3),), n_fragments=2, pieces=(range(0, 3),), hitlist_size=5)
    journal, plan, replay = Journal.open(path, IDENTITY, other_plan, restart=False)
    assert plan == PLAN  # the journal's plan, not the one this run would make
    assert replay.searches == (SearchTask(0, 0), SearchTask(0, 1)) and replay.pieces == (0,)
    scheduler = Scheduler(plan)
    for task in replay.searches:
        loaded = journal.load_search(task, len(plan.batches[task.batch]), alignments=False)
        assert loaded is not None
        scheduler.restore_search(task, loaded)
    scheduler.mark_piece_done(0)
    # batch 0 is merged, piece 0 is done: only batch 1's searches remain, then piece 1
    handed = [scheduler.next_task(1), scheduler.next_task(1), scheduler.next_task(1)]
    assert handed == [SearchTask(1, 0), SearchTask(1, 1), None]
    assert set(scheduler.metadata(0) or ()) == {10, 20} and set(scheduler.metadata(1) or ()) == {11, 21}
    assert journal.kept_searches == 2
    journal.close(complete=True)
    assert not path.exists()


def test_a_record_that_does_not_decode_is_dropped_and_searched_again(tmp_path: Path) -> None:
    path = tmp_path / ".out.journal"
    journal, plan, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.search_done(SearchTask(1, 0), result(1, 3))
    (path / "search" / "1-0").write_bytes(zlib.compress(b'{"hits": [[["x", 1, 2, ""]]], "prelim": [null]}'))
    (path / "search" / ".1-1.x.tmp").write_bytes(b"half")  # a killed worker's temporary file
    (path / "search" / "9-0").write_bytes(b"")  # outside the plan
    journal.close(complete=False)
    journal, plan, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert replay.searches == (SearchTask(1, 0),)
    assert journal.load_search(SearchTask(1, 0), 1, alignments=True) is None
    assert not any((path / "search").iterdir())
    assert not journal.close(complete=False)  # nothing finished left: removed
    assert not path.exists()


@pytest.mark.parametrize("part", ["search", "piece"])
@pytest.mark.parametrize("what", ["file", "link"])
def test_a_file_or_link_where_a_journal_directory_should_be_is_dropped(
    tmp_path: Path, part: str, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23, item 11 in the journal: a file (or a link, here to a directory outside) where the journal's
    `search` or `piece` directory should be failed every run (exit 6, "File exists"); it is junk, dropped."""
    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.search_done(SearchTask(1, 0), result(1, 3))
    journal.close(complete=False)
    outside = tmp_path / "outside"
    (outside / "1-1").mkdir(parents=True)
    shutil.rmtree(path / part)
    if what == "file":
        (path / part).write_bytes(b"junk")
    else:
        (path / part).symlink_to(outside)
    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert (path / part).is_dir() and not (path / part).is_symlink()
    assert replay.searches == (() if part == "search" else (SearchTask(1, 0),))
    assert f"journal entry {part} dropped" in capsys.readouterr().err
    assert (outside / "1-1").is_dir()  # nothing outside the journal is touched
    journal.close(complete=False)


def test_a_journal_written_while_the_volumes_were_otherwise_starts_afresh(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23, item 1: a volume rewritten (and put back: its ctime moved) while a search ran that then
    failed (BLAST+ crashed on the bytes, exit 5) left records done on other bytes; the next run redid
    none of them. The journal keeps the volumes' stamps; other stamps, its work is done again."""
    path = tmp_path / ".out.journal"
    before = (("f000.psq", 1, 10, 5, 6),)
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False, volumes=before)
    journal.search_done(SearchTask(1, 0), result(1, 3))
    journal.close(complete=False)
    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False, volumes=before)
    assert replay.searches == (SearchTask(1, 0),)
    journal.close(complete=False)
    after = (("f000.psq", 1, 10, 5, 7),)  # the ctime moved
    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False, volumes=after)
    assert replay.empty and "its finished work is done again" in capsys.readouterr().err
    journal.search_done(SearchTask(1, 1), result(1, 3))
    journal.close(complete=False)
    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False, volumes=after)
    assert replay.searches == (SearchTask(1, 1),)
    journal.close(complete=True)


def test_another_search_is_refused_and_restart_discards(tmp_path: Path) -> None:
    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.piece_done(1, b"x")
    journal.close(complete=False)
    with pytest.raises(UsageError, match=r"another search \(different queries\).*--restart"):
        Journal.open(path, {**IDENTITY, "queries": "def"}, PLAN, restart=False)
    journal, _, replay = Journal.open(path, {**IDENTITY, "queries": "def"}, PLAN, restart=True)
    assert replay.empty
    journal.close(complete=True)


def test_a_piece_done_otherwise_leaves_the_queue() -> None:
    scheduler = Scheduler(Plan(batches=(range(0, 2),), n_fragments=1, pieces=(range(0, 1), range(1, 2)),
                               hitlist_size=5, query_segmentation=True))  # fmt: skip
    scheduler.mark_piece_done(0)
    task = scheduler.next_task(1)
    assert isinstance(task, PieceTask) and task.piece == 1
    assert scheduler.next_task(1) is None
    scheduler.piece_done(task)
    assert scheduler.finished


def _flip_keeping_times(path: Path, at: int) -> None:
    import os

    st = path.stat()
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_piece_changed_in_one_byte_or_taken_from_another_journal_is_dropped(tmp_path: Path) -> None:
    """Issue 23 items 1 and 10: a journal piece is bound to its journal by a keyed digest; one byte
    flipped (times kept), a truncated or garbage piece, or a piece copied from another search's journal is
    dropped (written again), never used."""
    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.piece_done(0, b"piece zero of this search\n" * 10)
    journal.piece_done(1, b"piece one of this search\n" * 10)
    assert journal.close(complete=False)
    other = tmp_path / ".other.journal"  # the same search's command with another -evalue
    journal, _, _ = Journal.open(other, {**IDENTITY, "evalue": "1e-3"}, PLAN, restart=False)
    journal.piece_done(1, b"piece one of ANOTHER search\n" * 10)
    assert journal.close(complete=False)

    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert replay.pieces == (0, 1) and journal.load_piece(0) == b"piece zero of this search\n" * 10
    journal.close(complete=False)

    _flip_keeping_times(path / "piece" / "0", at=-5)
    (path / "piece" / "1").write_bytes((other / "piece" / "1").read_bytes())
    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert replay.pieces == ()
    assert not (path / "piece" / "0").exists() and not (path / "piece" / "1").exists()
    journal.close(complete=False)

    for bad in (b"", b"garbage", (other / "piece" / "1").read_bytes()[:20]):
        journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
        journal.piece_done(0, b"kept")
        journal.close(complete=False)
        (path / "piece" / "0").write_bytes(bad)
        journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
        assert replay.pieces == ()
        journal.close(complete=False)


def test_a_journal_of_grouped_fragments_continues_with_its_own_groups(tmp_path: Path) -> None:
    """Groups follow the workers (paramedic.engine.core.plan.search_units): a run with other workers makes
    other groups, and must continue the journal's, whose records are per group, and keep their lists."""
    grouped = Plan(
        batches=(range(0, 3),), n_fragments=2, pieces=(range(0, 3),), hitlist_size=5, groups=((0, 1, 2), (3,))
    )
    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, grouped, restart=False)
    journal.search_done(SearchTask(0, 1), FragmentSearch(result(3, 10).hits, result(3, 10).prelim, b"lists"))
    assert journal.close(complete=False)
    other = Plan(batches=(range(0, 3),), n_fragments=4, pieces=(range(0, 3),), hitlist_size=5)
    journal, plan, replay = Journal.open(path, IDENTITY, other, restart=False)
    assert plan == grouped and plan.fragments_of(0) == (0, 1, 2) and replay.searches == (SearchTask(0, 1),)
    assert journal.store.lists(0, 1) == b"lists"
    journal.close(complete=True)
    fewer = Plan(batches=(range(0, 3),), n_fragments=3, pieces=(range(0, 3),), hitlist_size=5)
    journal, _, _ = Journal.open(path, IDENTITY, grouped, restart=False)
    journal.search_done(SearchTask(0, 0), result(3, 10))
    journal.close(complete=False)
    with pytest.raises(UsageError, match="does not fit this search"):
        Journal.open(path, IDENTITY, fewer, restart=False)  # another database: 3 fragments, not 4


@pytest.mark.parametrize("kind", ["directory", "fifo"])
@pytest.mark.parametrize("name", ["lock", "job.json", "output.partial", "site-job", "piece/0", "search/0-1"])
def test_what_is_not_a_file_where_a_journal_file_belongs_is_dropped(
    tmp_path: Path, name: str, kind: str
) -> None:
    """Issue 23 (items 10 and 11, probed again): a directory or a FIFO where the journal keeps a file was
    exit 1 (IsADirectoryError) or exit 6 on every run, or a hang (a FIFO at `lock` or at a record). It is
    dropped and its work done again; `tidy` (after a failed run) does not trip over it either."""
    import os

    from paramedic.engine.rank.journal import tidy

    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.search_done(SearchTask(0, 0), result(2, 10))
    journal.search_done(SearchTask(0, 1), result(2, 20))
    journal.piece_done(0, b"piece zero")
    assert journal.close(complete=False)
    entry = path / name
    if entry.exists():
        entry.unlink()
    if kind == "directory":
        (entry / "inside").mkdir(parents=True)
    else:
        os.mkfifo(entry)
    assert tidy(path)
    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert not entry.exists() or entry.is_file()
    if name == "job.json":  # a new journal: the records, tagged with the old key, do not load
        assert replay.pieces == () and all(journal.load_search(t, 2, False) is None for t in replay.searches)
    else:
        assert SearchTask(0, 0) in replay.searches
        assert (SearchTask(0, 1) in replay.searches) == (name != "search/0-1")
        assert (0 in replay.pieces) == (name != "piece/0")
    journal.close(complete=True)
    assert not path.exists()


def test_a_foreign_journal_header_is_refused_and_not_said_to_continue(tmp_path: Path) -> None:
    """Issue 23 (item 10, probed again): a job.json that parses but was made by another paramedic
    version, or is not a journal header at all, is refused ("add --restart"), and the failed run then
    said "the same command continues the search", which it never does. `tidy` says nothing of such a
    journal (and keeps it, for --restart). (An unparseable one is dropped: the test below.)"""
    import json

    from paramedic.engine.rank.journal import tidy

    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.piece_done(0, b"piece zero")
    assert journal.close(complete=False)
    assert tidy(path)
    header = json.loads((path / "job.json").read_text())
    older = {k: v for k, v in header.items() if k != "sha256"} | {"version": 3}  # an older paramedic's
    for foreign, says in (
        (older, "was made by another paramedic version (journal version 3; this paramedic reads version 4)"),
        ({"kind": "something else", "version": 4}, "is not a paramedic journal"),
    ):
        (path / "job.json").write_text(json.dumps(foreign))
        with pytest.raises(UsageError, match="--restart") as refused:
            Journal.open(path, IDENTITY, PLAN, restart=False)
        assert says in str(refused.value)
        assert not tidy(path) and (path / "piece" / "0").exists()


def _damage(raw: bytes, how: str) -> bytes:
    """job.json's bytes as a disk or a cut copy leaves them; `flip...` ones still parse as JSON."""
    import json

    if how == "truncated":
        return raw[: len(raw) // 2]
    if how == "empty":
        return b""
    if how == "garbage":
        return b"\x00\xff garbage \x89PNG"
    if how == "not-an-object":
        return b"[1, 2, 3]"
    if how == "flip-breaks-json":
        at = raw.index(b'"plan"')
        return raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1 :]  # '"' -> '#'
    assert how.startswith("flip-")
    field = how.removeprefix("flip-")
    data = json.loads(raw)
    if field == "options":  # an -evalue digit changed: parses, and as another search before
        data["identity"]["evalue"] = "1e-4"
    elif field == "version":  # 4 -> 5: parses, and as another paramedic version before
        data["version"] ^= 1
    elif field == "kind":  # "paramedic-journal" -> "paramedic-journam"
        data["kind"] = data["kind"][:-1] + chr(ord(data["kind"][-1]) ^ 1)
    elif field == "plan":  # a batch's bound changed: parses, and a plan of other batches before
        data["plan"]["batches"][0][1] ^= 1
    elif field == "key":
        data["key"] = data["key"][:-1] + chr(ord(data["key"][-1]) ^ 1)
    elif field == "digest":
        data["sha256"] = data["sha256"][:-1] + chr(ord(data["sha256"][-1]) ^ 1)
    damaged = json.dumps(data).encode()
    assert len(damaged) == len(raw) and sum(a != b for a, b in zip(damaged, raw, strict=True)) == 1
    return damaged


@pytest.mark.parametrize(
    "how",
    [
        "truncated",
        "empty",
        "garbage",
        "not-an-object",
        "flip-breaks-json",
        "flip-options",
        "flip-version",
        "flip-kind",
        "flip-plan",
        "flip-key",
        "flip-digest",
    ],  # fmt: skip
)
def test_a_damaged_journal_header_is_dropped_and_its_work_done_again(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23 (found by the fault soak): a job.json cut short, garbage, or with a byte flipped was
    refused on every rerun (exit 2, "add --restart"), or, when the flipped header still parsed, said to be
    "from another search (different options)" or of another paramedic version, blaming the user. It holds
    nothing usable: it is dropped (one line says it is damaged), with every record (they are bound to its
    key), and the same command does the work again, with a new header that the next run continues."""
    from paramedic.engine.rank.journal import tidy

    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, {**IDENTITY, "evalue": "1e-5"}, PLAN, restart=False)
    journal.search_done(SearchTask(0, 0), result(2, 10))
    journal.piece_done(0, b"piece zero")
    journal.note_site_job("job-1")
    assert journal.close(complete=False)
    (path / "job.json").write_bytes(_damage((path / "job.json").read_bytes(), how))
    assert not tidy(path)  # never said to continue: its work is done again
    capsys.readouterr()
    journal, plan, replay = Journal.open(path, {**IDENTITY, "evalue": "1e-5"}, PLAN, restart=False)
    err = capsys.readouterr().err
    assert plan == PLAN and replay.empty and journal.earlier_site_job() is None
    assert err.count("\n") == 1 and "journal header .out.journal/job.json dropped (damaged: " in err, err
    assert "its finished work is done again" in err and "another" not in err, err
    journal.piece_done(1, b"piece one")  # the new journal is continued by the next run
    assert journal.close(complete=False) and tidy(path)
    journal, plan, replay = Journal.open(path, {**IDENTITY, "evalue": "1e-5"}, PLAN, restart=False)
    assert replay.pieces == (1,) and journal.load_piece(1) == b"piece one" and capsys.readouterr().err == ""
    journal.close(complete=True)


@pytest.mark.parametrize("field", ["identity", "plan", "key", "huge-plan"])
def test_a_journal_header_whose_fields_do_not_read_is_dropped(
    tmp_path: Path, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job.json that parses, is this version's and whose digest holds, but whose fields do not read
    (a plan that is not one, no key): only a paramedic with a bug, or a hand, writes one. No command can
    continue it, so it is dropped like a damaged one (refused, the user could only add --restart)."""
    import json

    from paramedic.engine.rank.journal import _header_bytes

    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.piece_done(0, b"piece zero")
    assert journal.close(complete=False)
    data = json.loads((path / "job.json").read_text())
    del data["sha256"]
    if field == "huge-plan":  # a range longer than a size: len() raised OverflowError, exit 1 (fuzz)
        data["plan"]["batches"] = [[0, 2**70]]
    else:
        data[field] = {"identity": ["a", "list"], "plan": {"batches": "many"}, "key": None}[field]
    (path / "job.json").write_bytes(_header_bytes(data))
    journal, plan, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert plan == PLAN and replay.empty
    assert "dropped (damaged: its fields do not read: " in capsys.readouterr().err
    journal.close(complete=True)


def test_an_intact_header_of_another_search_is_still_refused(tmp_path: Path) -> None:
    """The header's own digest holds: it is another search's, and that search's command continues it."""
    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, {**IDENTITY, "evalue": "1e-5"}, PLAN, restart=False)
    journal.piece_done(0, b"piece zero")
    assert journal.close(complete=False)
    with pytest.raises(UsageError, match="is from another search .different evalue.: run the same command"):
        Journal.open(path, {**IDENTITY, "evalue": "1e-4"}, PLAN, restart=False)
    assert (path / "piece" / "0").exists()


@pytest.mark.parametrize("who", ["another user", "others can write"])
def test_a_journal_only_this_user_wrote_is_resumed(tmp_path: Path, who: str, capsys) -> None:
    """Issue 23: a journal another user owns, or one others can write, may hold records someone else
    tagged with a key of their own (they wrote job.json): its work is done again, never replayed."""
    import os

    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.piece_done(0, b"planted")
    journal.close(complete=False)
    assert path.stat().st_mode & 0o777 == 0o700
    for part in [path, *path.rglob("*")]:
        if who == "another user":
            os.chown(part, 65534, 65534)
        else:
            part.chmod(0o777 if part.is_dir() else 0o666)
    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert replay.empty
    assert (
        f"journal .out.journal dropped ({'.out.journal is owned by another user' if who == 'another user' else 'others can write .out.journal'}"
        in capsys.readouterr().err
    )
    assert path.stat().st_uid == os.geteuid() and path.stat().st_mode & 0o777 == 0o700
    journal.close(complete=True)


def test_a_journal_of_another_user_that_cannot_be_removed_is_refused(tmp_path: Path, monkeypatch) -> None:
    """As in a sticky directory (/tmp): another user's journal cannot be removed: one line, exit 6."""
    import os

    from paramedic.engine.rank import journal as journal_module
    from paramedic.errors import OutputError

    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.piece_done(0, b"planted")
    journal.close(complete=False)
    for part in [path, *path.rglob("*")]:
        os.chown(part, 65534, 65534)
    monkeypatch.setattr(journal_module, "_remove_tree", lambda _path: None)  # the sticky bit's refusal
    with pytest.raises(OutputError, match="cannot be trusted and cannot be removed .* uid 65534"):
        Journal.open(path, IDENTITY, PLAN, restart=False)


class Killed(BaseException):
    """A SIGKILL in the middle of removing a tree, as far as this process can see."""


def test_a_run_killed_while_removing_its_finished_journal_leaves_no_half_journal(
    tmp_path: Path, monkeypatch
) -> None:
    """Killed in Journal.close's rmtree, a run left part of the journal at its name without its site-job
    record: every run again began a new site job the site refused ("a file is already there", seen in
    CI). The journal leaves its name in one rename first; the tomb goes at the next open."""
    path = tmp_path / ".out.journal"
    journal, _, _ = Journal.open(path, IDENTITY, PLAN, restart=False)
    journal.search_done(SearchTask(0, 0), result(2, 10))
    real_rmtree = shutil.rmtree

    def killed_midway(tree, ignore_errors=False):
        victim = next(Path(tree).rglob("*"))  # one entry gone, then the kill
        real_rmtree(victim) if victim.is_dir() else victim.unlink()
        raise Killed

    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(Killed):
        journal.close(complete=True)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    journal._unlock()  # the kill's process exit closed it
    assert not path.exists()  # never half a journal at its name
    (tomb,) = tmp_path.iterdir()
    assert tomb.name == ".out.journal.gone" and any(tomb.rglob("*"))  # the kill left it half
    journal, _, replay = Journal.open(path, IDENTITY, PLAN, restart=False)
    assert replay.empty and not tomb.exists()
    journal.close(complete=True)
    assert not any(tmp_path.iterdir())
