"""Every job digests its database's volumes against the manifest: with BLAKE3 where the manifest has it
(databases formatted now), with SHA-256 where it has not (formatted before). Either way a byte changed
with the file's size and times kept is refused."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import blake3
import pytest

from paramedic.blast.alias import write_alias
from paramedic.db.manifest import (
    FRAGMENT_DIGESTS,
    Fragment,
    Manifest,
    verify_volumes,
    volume_blake3,
    volume_sha256,
)
from paramedic.errors import DatabaseError


def database(root: Path) -> Manifest:
    for volume in ("whole", "f000", "f001"):
        for ext in ("psq", "phr", "pin"):
            (root / f"{volume}.{ext}").write_bytes(os.urandom(3000) + volume.encode())
    fragments = [
        Fragment(f"frag{i:03d}", f"f{i:03d}", 1, 1, volume_sha256(root, f"f{i:03d}")) for i in range(2)
    ]
    for i in range(2):  # each fragment's alias, as `paramedic format` writes it
        write_alias(root / f"frag{i:03d}.pal", [f"f{i:03d}"], title="t", nseq=2, length=2)
    return Manifest(
        format_version=1,
        dbtype="prot",
        title="t",
        nseq=2,
        length=2,
        whole="whole",
        whole_sha256=volume_sha256(root, "whole"),
        fragments=fragments,
        input_path="in.fasta",
        content_sha256="0" * 64,
        tools={"digests": FRAGMENT_DIGESTS},
        volume_blake3={v: volume_blake3(root, v) for v in ("whole", "f000", "f001")},
    )


def flip_keeping_times(path: Path) -> None:
    info = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_blake3_digest_is_of_the_same_bytes_as_sha256(tmp_path: Path) -> None:
    database(tmp_path)
    stream = b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in sorted(tmp_path.glob("f000.*")))
    assert volume_blake3(tmp_path, "f000") == blake3.blake3(stream).hexdigest()
    assert volume_sha256(tmp_path, "f000") == hashlib.sha256(stream).hexdigest()


@pytest.mark.parametrize("with_blake3", [True, False])
@pytest.mark.parametrize("changed", ["whole.psq", "f001.phr"])
def test_a_changed_volume_is_refused(tmp_path: Path, with_blake3: bool, changed: str) -> None:
    manifest = database(tmp_path)
    if not with_blake3:  # a database formatted before: SHA-256 only
        manifest = dataclasses.replace(manifest, volume_blake3={})
    verify_volumes(tmp_path, manifest)
    flip_keeping_times(tmp_path / changed)
    with pytest.raises(DatabaseError, match=f"volume {changed.split('.')[0]} does not match"):
        verify_volumes(tmp_path, manifest)


def test_a_manifest_missing_a_volumes_blake3_is_refused(tmp_path: Path) -> None:
    manifest = database(tmp_path)
    partial = dataclasses.replace(manifest, volume_blake3={"whole": manifest.volume_blake3["whole"]})
    with pytest.raises(DatabaseError, match="does not match"):
        verify_volumes(tmp_path, partial)


def test_members_file_gives_each_fragments_ids_in_order_and_is_checked(tmp_path: Path) -> None:
    from paramedic.db.manifest import MEMBERS_NAME, fragment_members, global_ids, members_bytes

    fragment_of = [2, 0, 1, 0, 2, 2, 1]
    data = members_bytes(fragment_of, 3)
    (tmp_path / MEMBERS_NAME).write_bytes(data)
    digest = blake3.blake3(data).hexdigest()
    members = fragment_members(tmp_path, 3, digest)
    assert [list(ids) for ids in members] == [[1, 3], [2, 6], [0, 4, 5]]
    assert list(global_ids(members, [0, 1])) == [1, 3, 2, 6] and list(global_ids(members, [2])) == [0, 4, 5]
    bad = bytearray(data)
    bad[-1] ^= 1  # a changed id: the digest no longer matches
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / MEMBERS_NAME).write_bytes(bytes(bad))
    with pytest.raises(DatabaseError, match="members.bin does not match"):
        fragment_members(tmp_path / "other", 3, digest)


@pytest.mark.parametrize("change", ["another volume", "missing", "a byte"])
def test_a_fragment_alias_other_than_the_manifests_is_refused(tmp_path: Path, change: str) -> None:
    """A fragment search names its alias as -db: one rewritten to name another volume (times kept) had
    the search read bytes other than its fragment's, every digest passing."""
    manifest = database(tmp_path)
    verify_volumes(tmp_path, manifest)
    alias = tmp_path / "frag001.pal"
    if change == "another volume":
        info = alias.stat()
        alias.write_bytes(alias.read_bytes().replace(b"f001", b"f000"))
        os.utime(alias, ns=(info.st_atime_ns, info.st_mtime_ns))
    elif change == "missing":
        alias.unlink()
    else:
        flip_keeping_times(alias)
    with pytest.raises(DatabaseError, match="alias frag001.pal"):
        verify_volumes(tmp_path, manifest)
