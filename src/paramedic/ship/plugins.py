"""The one registry pattern of the framework's plugins: codecs (ship.codecs), applications (ship.apps) and
transports (ship.transport) are each a `Registry` filled by their modules' registrations at import.

A name registered twice is a programming error (two plugins claiming one name), refused at import rather
than one silently replacing the other; a name looked up and not found says which names are known.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    """Plugins of one kind by name (a dict: tests may set an entry for the time of a test)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def add(self, name: str, plugin: T) -> T:
        if name in self and self[name] is not plugin:
            raise ValueError(f"two {self.kind}s named {name!r}")
        self[name] = plugin
        return plugin

    def named(self, name: str) -> T:
        """The plugin called `name`; KeyError naming the known ones."""
        if name not in self:
            raise KeyError(f"unknown {self.kind} {name!r} (known: {', '.join(self) or 'none'})")
        return self[name]
