"""What every command's parser shares: a usage error as one line and exit code 2 (`Parser`), the command's
examples under its help, and byte counts such as 500M (`byte_size`)."""

from __future__ import annotations

import argparse

from paramedic.cli.usage import examples
from paramedic.errors import UsageError


class Parser(argparse.ArgumentParser):
    examples: list[str] = []

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")

    def format_help(self) -> str:
        """argparse's help, then the command's examples as written (argparse would rewrap them)."""
        if not self.examples:
            return super().format_help()
        title = "examples:" if len(self.examples) > 1 else "example:"
        return super().format_help() + f"\n{title}\n" + "".join(f"  {e}\n" for e in self.examples)


def command_parser(command: str, description: str, usage: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog=f"paramedic {command}", description=description, usage=usage, allow_abbrev=False)
    parser.examples = examples(command)
    return parser


_SIZE = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def byte_size(text: str) -> int:
    """A byte count: 1000000, 500M, 50G, 2T (binary units)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in _SIZE and value[-1:] else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 500M, 50G)") from None
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 500M, 50G)")
    return int(number * _SIZE[unit])
