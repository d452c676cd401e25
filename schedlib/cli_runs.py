"""How the ``schedlib`` command's long runs behave: a report folder the run created is removed again when the run
stops before writing into it, and ``carve --compiled`` says how far its compiling has got (apart from
:mod:`schedlib.cli` only to keep that file short)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["CompileProgress", "removed_if_stopped"]


def _missing(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first (what ``mkdir -p`` would create)."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


@contextmanager
def removed_if_stopped(out: str | Path) -> Iterator[None]:
    """Around a run that creates the report folder ``out`` before its work (so that a bad ``--out`` fails at
    once): if the run stops (an error, Ctrl-C) the folders it created are removed again while still empty,
    rather than left behind as an empty report folder.  A folder that was there before, or one that holds
    anything by then, is kept."""
    created = _missing(Path(out))
    try:
        yield
    except BaseException:
        for folder in created:  # deepest first: a parent is empty only once its child is gone
            try:
                folder.rmdir()
            except OSError:  # not empty (or gone already): keep it, and so every folder above it
                break
        raise


class CompileProgress:
    """``compiled_resources(...)`` for ``carve --compiled`` that redraws one line on stderr after each config,
    when stderr is a terminal: compiling the pool takes seconds per config (20 s and more for ``--topk 20``),
    and nothing else is printed until the ranking.  Off a terminal it prints nothing, so that a log holds no
    carriage returns.  The carver reads ``profile`` and ``arch`` of what it is given: passed through."""

    def __init__(self, resources: Any, pool: int) -> None:
        self.resources, self.pool = resources, pool
        self.compiled = self.failed = 0
        self._open = False  # a redrawn line is on the terminal, not yet ended
        self.profile = getattr(resources, "profile", None)
        self.arch = getattr(resources, "arch", None)

    def __call__(self, schedule: Any) -> Any:
        try:
            usage = self.resources(schedule)
        except Exception:  # the carver warns of it next: that warning goes on a line of its own
            self.failed += 1
            self._draw()
            self.done()
            raise
        self.compiled += 1
        self._draw()
        return usage

    def _draw(self) -> None:
        if not sys.stderr.isatty():
            return
        failed = f", {self.failed} failed" if self.failed else ""
        print(f"\rcompiling for {self.arch}: {self.compiled}/{self.pool} compiled{failed}", end="",
              file=sys.stderr, flush=True)
        self._open = True

    def done(self) -> None:
        """Ends the redrawn line (before the summary, an error or a warning is printed on a line of its own)."""
        if self._open:
            print(file=sys.stderr, flush=True)
            self._open = False
