"""A job's queries kept on disk at the storage site, not in memory (issue 23, item 14).

A site holds a job for hours; its queries (up to the site's --max-setup) are written once, beside the
job's regeneration scratch, and each regeneration reads back only its piece. What stays in memory is
one offset per query (8 bytes).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import overload


class StoredQueries(Sequence[tuple[str, str]]):
    """(header, sequence) pairs in a file of two lines each, read back by index or slice."""

    def __init__(self, path: Path, queries: Iterable[tuple[str, str]]):
        self.path = path
        self.offsets = array("q", [0])
        with open(path, "wb") as out:
            for header, sequence in queries:
                out.write(_encode(header) + b"\n" + _encode(sequence) + b"\n")
                self.offsets.append(out.tell())

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, str]]: ...
    def __getitem__(self, index: int | slice) -> tuple[str, str] | list[tuple[str, str]]:
        if isinstance(index, int):
            if not -len(self) <= index < len(self):
                raise IndexError(index)
            return self[index % len(self) : index % len(self) + 1][0]
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("StoredQueries: slices with a step are not supported")
        if start >= stop:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offsets[start])
            lines = f.read(self.offsets[stop] - self.offsets[start]).split(b"\n")
        return [(_decode(lines[i]), _decode(lines[i + 1])) for i in range(0, 2 * (stop - start), 2)]


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # JSON may carry lone surrogates: kept as they came


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")
