"""What every ``jetspec`` subcommand's parser shares, without torch (``jetspec --help`` imports
only this): the program name, the one-line usage error and the int option type."""
from __future__ import annotations

import argparse
import sys

__all__ = ["PROG", "Parser", "UsageError", "int_at_least", "report"]

PROG = "jetspec"


class UsageError(Exception):
    """Bad command-line input: reported as one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise :class:`UsageError` instead of printing the usage."""

    def error(self, message):
        raise UsageError(message)


def report(message: str) -> int:
    """Print ``jetspec: error: message`` to stderr; returns the exit status 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def int_at_least(lo: int, hi: int | None = None):
    """An argparse type: an int >= ``lo`` (and <= ``hi`` when given)."""
    want = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {want}, got {value}")
        return value
    return parse
