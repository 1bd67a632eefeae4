"""Writing under --root without following anything planted there after a job opened.

A path is checked when a job opens, but the directories on its way can be swapped for symbolic links
later, and a symbolic link (or a hard link to a file elsewhere) can be planted at the temporary file's
name. So every write walks again from a descriptor of --root, one component at a time with O_NOFOLLOW,
opens the temporary file with O_NOFOLLOW (and checks it is a regular file with a single link), and
publishes it with a hard link that never replaces an existing file (linkat fails with EEXIST).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from paramedic.ship.wire import ProtocolError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A failed job removes the directories made for its output once they are empty, while another job may be
# making the same directories for its own output: the removal, and a walk that creates directories until
# the file that keeps them is in them, take this lock (one `paramedic serve` per --root). Without it a job
# opened into a directory a failed job was removing got "No such file or directory".
_TREE_LOCK = threading.Lock()


class UnsafePath(ProtocolError):
    """Something on the output's way is not what the site made: a symbolic link, a non-directory."""


class TargetExists(ProtocolError):
    """A file is already at the output path: the site never replaces one."""


@dataclass(frozen=True)
class OutputLocation:
    """`<root>/<parts...>/<name>`, written through `.<name>.paramedic-<job>` beside it."""

    root_fd: int  # an O_DIRECTORY descriptor of --root, held by the store
    parts: tuple[str, ...]
    name: str
    temp_name: str
    display: str  # the relative path, for messages

    @contextmanager
    def directory(self, create: bool = False) -> Iterator[int]:
        """A descriptor of the target's directory, reached without following any symbolic link; with
        `create`, made where missing, the tree lock held until the caller is done with it."""
        if create:
            with _TREE_LOCK, self._walk(create=True) as fd:
                yield fd
        else:
            with self._walk(create=False) as fd:
                yield fd

    @contextmanager
    def _walk(self, create: bool) -> Iterator[int]:
        fd = os.dup(self.root_fd)
        try:
            for part in self.parts:
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafePath(
                            f"output path {self.display!r}: {part} is a symbolic link or not a directory"
                        ) from None
                    raise
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def check_target_free(self) -> None:
        """TargetExists when anything (a file, a link, a directory) is at the output path."""
        with self.directory(create=True) as d:
            try:
                os.stat(self.name, dir_fd=d, follow_symlinks=False)
            except FileNotFoundError:
                return
        raise TargetExists(
            f"output path {self.display!r}: a file is already there (the storage site never replaces one; "
            "remove it or choose another -out)"
        )

    @contextmanager
    def open_partial(self, create: bool = False, truncate: bool = False) -> Iterator[int]:
        """The temporary file for writing: a regular file with one link, reached without following links
        (O_NOFOLLOW refuses a symbolic link at its name even when creating it)."""
        fd = self._open_partial(create, truncate)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                raise UnsafePath(
                    f"output path {self.display!r}: its temporary file was replaced (not a regular file "
                    "with a single link)"
                )
            yield fd
        finally:
            os.close(fd)

    def _open_partial(self, create: bool, truncate: bool) -> int:
        """The temporary file's descriptor; with `create` the tree lock is held only until it exists (its
        directory then holds a file, so no failed job removes it)."""
        with self.directory(create=create) as d:
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
            flags |= (os.O_CREAT if create else 0) | (os.O_TRUNC if truncate else 0)
            try:
                return os.open(self.temp_name, flags, 0o644, dir_fd=d)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UnsafePath(
                        f"output path {self.display!r}: its temporary file is a symbolic link"
                    ) from None
                raise

    def published(self) -> bool:
        """True when the temporary file and the target are the same file (a crash after publishing)."""
        try:
            with self.directory() as d:
                temp = os.stat(self.temp_name, dir_fd=d, follow_symlinks=False)
                target = os.stat(self.name, dir_fd=d, follow_symlinks=False)
        except (FileNotFoundError, UnsafePath):
            return False
        return (temp.st_dev, temp.st_ino) == (target.st_dev, target.st_ino)

    def publish(self) -> None:
        """Give the (fsynced) temporary file its final name, durably; TargetExists if one appeared."""
        with self.directory() as d:
            if not self.published():
                try:
                    os.link(self.temp_name, self.name, src_dir_fd=d, dst_dir_fd=d, follow_symlinks=False)
                except FileExistsError:
                    raise TargetExists(
                        f"output path {self.display!r}: a file appeared there while the job ran; not replaced"
                    ) from None
            os.fsync(d)

    def drop_partial(self) -> None:
        """Remove the temporary file (after publishing, or when the job fails); never follows a link."""
        try:
            with self.directory() as d:
                os.unlink(self.temp_name, dir_fd=d)
                os.fsync(d)
        except (OSError, UnsafePath):
            pass

    def remove_empty_directories(self) -> None:
        """After a failed job: the directories on the output's way that are empty now (made for it) go,
        deepest first, never following a link; the first that is not empty stops it."""
        with _TREE_LOCK:
            for depth in range(len(self.parts), 0, -1):
                try:
                    with replace(self, parts=self.parts[: depth - 1]).directory() as d:
                        os.rmdir(self.parts[depth - 1], dir_fd=d)
                except (OSError, UnsafePath):
                    return

    def read_target(self) -> Iterator[bytes]:
        """The published file's bytes, in blocks (to digest what is really on disk)."""
        with self.directory() as d:
            fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
        with os.fdopen(fd, "rb") as fh:
            while block := fh.read(1 << 20):
                yield block
