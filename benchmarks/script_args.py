"""Argument checking shared by the benchmark scripts: mistakes are one line on stderr and exit 2, found before
any work (a GPU call that fails on its options after minutes of self-checks is a wasted call)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from schedlib.errors import SchedlibError
from schedlib.report.writers import prepare_out_dir


class Parser(argparse.ArgumentParser):
    """``argparse`` without the usage dump: ``PROG: error: MESSAGE``, one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _number(kind: Callable[[str], float], name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {name}") from None
        if not 0 < value < float("inf"):  # NaN fails this too
            raise argparse.ArgumentTypeError(f"{text} must be above 0")
        return value

    return parse


positive_float = _number(float, "a number")


def writable_dir(ap: argparse.ArgumentParser, path: str | Path, option: str = "--out") -> Path:
    """Create ``path`` and prove it writable, or stop with a one-line error naming ``option``."""
    try:
        return prepare_out_dir(path)
    except SchedlibError as exc:
        ap.error(f"{option}: {exc}")
