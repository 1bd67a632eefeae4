"""Issue 23, item 2: a metadata file is sealed with the user's own key, not only with a plain SHA-256
anyone can recompute. The key is treated as ssh treats a private key. Real files, real modes and owners
(the tests run as root in CI: another owner is made with chown)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from paramedic.engine.rank.metadata import (
    KEY_VARIABLE,
    SearchIdentity,
    _digest,
    load_metadata,
    metadata_key,
    save_metadata,
)
from paramedic.errors import InputError, OutputError

IDENTITY = SearchIdentity("blastp", ["-evalue", "10"], 500, "0" * 64, "1" * 64)
SUBJECTS = [[1, 2, 3], [], [999]]


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "keys" / "metadata.key"
    monkeypatch.setenv(KEY_VARIABLE, str(path))
    return path


def _load(path: Path) -> list[list[int]]:
    return load_metadata(path, IDENTITY, n_queries=3, nseq=1000)


def test_the_key_is_made_private_once_and_seals(tmp_path: Path, key: Path) -> None:
    save_metadata(tmp_path / "m.json", IDENTITY, SUBJECTS)
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700
    first = key.read_bytes()
    save_metadata(tmp_path / "m2.json", IDENTITY, SUBJECTS)
    assert key.read_bytes() == first  # made once
    assert _load(tmp_path / "m.json") == SUBJECTS
    assert sorted(os.listdir(key.parent)) == ["metadata.key"]  # no temporary file left


def test_the_default_key_is_under_the_users_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    save_metadata(tmp_path / "m.json", IDENTITY, SUBJECTS)
    assert (tmp_path / "config" / "paramedic" / "metadata.key").stat().st_mode & 0o777 == 0o600
    assert _load(tmp_path / "m.json") == SUBJECTS


def test_a_file_resealed_by_a_forger_is_refused(tmp_path: Path, key: Path) -> None:
    """A subject id removed and the plain SHA-256 recomputed: exit 0 and another report before."""
    path = tmp_path / "m.json"
    save_metadata(path, IDENTITY, SUBJECTS)
    data = json.loads(path.read_text())
    data["subjects"][0] = data["subjects"][0][1:]
    data["sha256"] = _digest(data)
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="not sealed with your metadata key"):
        _load(path)
    del data["seal"]  # a forger who drops the keyed seal altogether
    data["sha256"] = _digest(data)
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="not sealed with your metadata key"):
        _load(path)


def test_a_seal_holding_a_lone_surrogate_is_no_seal(tmp_path: Path, key: Path) -> None:
    """Found by make fuzz (session 26): a seal of "\\udc80" raised UnicodeEncodeError ("internal error")."""
    path = tmp_path / "m.json"
    save_metadata(path, IDENTITY, SUBJECTS)
    data = json.loads(path.read_text())
    data["seal"] = "\udc80" * 64
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="not sealed with your metadata key"):
        _load(path)


def test_a_file_sealed_with_another_key_is_refused(tmp_path: Path, key: Path, monkeypatch) -> None:
    path = tmp_path / "m.json"
    monkeypatch.setenv(KEY_VARIABLE, str(tmp_path / "other" / "metadata.key"))
    save_metadata(path, IDENTITY, SUBJECTS)  # another user's (or another machine's) key
    assert _load(path) == SUBJECTS
    monkeypatch.setenv(KEY_VARIABLE, str(key))
    with pytest.raises(InputError, match="no metadata key at"):
        _load(path)  # this user has no key yet: said, not made
    assert not key.exists()
    save_metadata(tmp_path / "mine.json", IDENTITY, SUBJECTS)
    with pytest.raises(InputError, match="not sealed with your metadata key"):
        _load(path)


@pytest.mark.parametrize("kind", ["readable", "foreign", "link", "directory", "fifo", "garbage", "short"])
def test_a_key_others_could_read_or_plant_is_refused(tmp_path: Path, key: Path, kind: str) -> None:
    path = tmp_path / "m.json"
    save_metadata(path, IDENTITY, SUBJECTS)
    if kind == "readable":
        key.chmod(0o644)
        says = "others can read or write"
    elif kind == "foreign":
        os.chown(key, 65534, 65534)
        says = "owned by another user"
    elif kind == "link":
        real = tmp_path / "elsewhere.key"
        key.rename(real)
        key.symlink_to(real)
        says = "a symbolic link"
    elif kind == "directory":
        key.unlink()
        key.mkdir()
        says = "not a regular file"
    elif kind == "fifo":
        key.unlink()
        os.mkfifo(key, 0o600)  # nobody writes it: reading it must not wait
        says = "not a regular file"
    elif kind == "garbage":
        key.write_text("not a key\n")
        says = "does not hold a key"
    else:
        key.write_text("ab" * 16 + "\n")
        says = "does not hold a key"
    with pytest.raises(InputError, match=says):
        _load(path)
    with pytest.raises(OutputError, match=says):
        metadata_key(create=True, option="--metadata")


def test_a_key_that_cannot_be_made_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(KEY_VARIABLE, str(blocker / "metadata.key"))
    with pytest.raises(OutputError, match="cannot make the metadata key"):
        save_metadata(tmp_path / "m.json", IDENTITY, SUBJECTS)
    assert not (tmp_path / "m.json").exists()


def test_two_searches_making_the_key_at_once_share_one(tmp_path: Path, key: Path) -> None:
    keys: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: keys.append(metadata_key(create=True, option="--metadata")))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert sorted(os.listdir(key.parent)) == ["metadata.key"]
