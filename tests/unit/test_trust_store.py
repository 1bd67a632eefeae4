"""Remembered digests (paramedic.db.trust): a digest is recalled only for the very file it was made of,
never for a file written since (its ctime moved), never when it was made too close to the file's last
change, and never from a store someone else can write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paramedic.db import trust
from paramedic.db.trust import DigestStore, digests, file_digest


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DigestStore:
    monkeypatch.setattr(trust, "RACY_SECONDS", 0.0)
    directory = tmp_path / "store"
    return DigestStore(directory)


def _file(tmp_path: Path, data: bytes = b"ACGT" * 1000) -> Path:
    path = tmp_path / "db.00.nsq"
    path.write_bytes(data)
    return path


def test_a_digest_is_recalled_for_the_same_file(store: DigestStore, tmp_path: Path) -> None:
    path = _file(tmp_path)
    first = digests([path], store)[path]
    assert first == file_digest(path)
    assert store.recall(path, path.stat()) == first


def test_a_file_rewritten_with_its_times_restored_is_digested_again(
    store: DigestStore, tmp_path: Path
) -> None:
    path = _file(tmp_path)
    digests([path], store)
    info = path.stat()
    with open(path, "r+b") as fh:  # same inode, same size, times put back: only ctime moves
        fh.write(b"T")
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert store.recall(path, path.stat()) is None
    assert digests([path], store)[path] == file_digest(path) != store.recall(path, info)


def test_a_digest_made_too_close_to_the_last_change_is_not_kept(tmp_path: Path) -> None:
    path = _file(tmp_path)
    store = DigestStore(tmp_path / "store")  # RACY_SECONDS as shipped: the file was written just now
    digests([path], store)
    assert store.recall(path, path.stat()) is None


def test_a_store_others_can_write_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trust, "RACY_SECONDS", 0.0)
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o777)
    directory.chmod(0o777)
    said: list[str] = []
    store = DigestStore(directory, warn=said.append)
    assert not store.usable and said and "not yours alone" in said[0]
    path = _file(tmp_path)
    digests([path], store)
    assert not list(directory.iterdir())


def test_an_entry_others_can_write_is_ignored(store: DigestStore, tmp_path: Path) -> None:
    path = _file(tmp_path)
    digests([path], store)
    (entry,) = list(store.directory.iterdir())
    entry.chmod(0o666)
    assert store.recall(path, path.stat()) is None


def test_verify_digests_again_and_names_a_file_whose_remembered_digest_is_wrong(
    store: DigestStore, tmp_path: Path
) -> None:
    """A remembered digest that no longer matches a file whose stamp did not change (root, a clock set
    back, the disk) is what `paramedic verify` exists to find; it is replaced by the fresh one."""
    import json

    from paramedic.db.trust import verify

    path = _file(tmp_path)
    digests([path], store)
    (entry,) = list(store.directory.iterdir())
    data = json.loads(entry.read_text())
    data["blake3"] = "0" * 64  # as if the bytes had changed under an unchanged stamp
    entry.write_text(json.dumps(data))
    total, wrong = verify([path], store)
    assert total == path.stat().st_size and wrong == [path]
    assert store.recall(path, path.stat()) == file_digest(path)
    assert verify([path], store) == (total, [])
