"""How the ``schedlib`` command reports on stderr: notes, the library's warnings and log records, and errors,
each as ``schedlib: KIND: message`` with further lines indented under the first (apart from
:mod:`schedlib.cli` only to keep that file short)."""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["compare_table", "foreign_error", "library_messages", "lines", "no_best", "not_no_best", "note",
           "reader_may_leave"]


def lines(prefix: str, text: str) -> str:
    """``prefix`` and the first line of ``text``, further lines indented under it."""
    first, *rest = text.strip("\n").splitlines() or [""]
    return "\n".join([prefix + first, *("  " + ln if ln.strip() else "" for ln in rest)])


def note(message: str) -> None:
    print(f"schedlib: note: {message}", file=sys.stderr)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None, *, fallback: Any = None) -> None:
    """The library's own warnings as ``schedlib: warning: ...`` lines; others as Python shows them (a
    numpy or pandas warning with its file and line is a lead to a bug, which a prefix would hide)."""
    if category.__module__.split(".")[0] == "schedlib":
        print(lines("schedlib: warning: ", str(message)), file=sys.stderr)
    elif fallback is not None:
        fallback(message, category, filename, lineno, file, line)


class _LogLines(logging.Handler):
    """The library's log records (the search's "space is exhausted", a rule that raised) as prefixed lines:
    without a handler Python prints just the message, which reads as output of the command."""

    def emit(self, record: logging.LogRecord) -> None:
        kind = "error" if record.levelno >= logging.ERROR else "warning"
        try:
            text = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: logging's own report of it
            self.handleError(record)
            return
        print(lines(f"schedlib: {kind}: ", text), file=sys.stderr)  # sys.stderr now, as a test may swap it


@contextmanager
def library_messages() -> Iterator[None]:
    """While the command runs: warnings and log records of the library as ``schedlib: warning: ...`` lines."""
    logger = logging.getLogger("schedlib")
    handler = _LogLines(logging.WARNING)
    with warnings.catch_warnings():
        fallback = warnings.showwarning
        warnings.showwarning = lambda *a, **k: _show_warning(*a, **k, fallback=fallback)
        logger.addHandler(handler)
        try:
            yield
        finally:
            logger.removeHandler(handler)


class _StdoutWhoseReaderMayLeave:
    """``sys.stdout`` for a command whose output may be piped into ``head`` or a pager that quits early: once
    the reader is gone, further output is dropped and the command finishes its work (``schedlib demo | head``
    still writes its report) instead of stopping at the next print."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        self.reader_gone = True
        # Python flushes stdout once more at exit: send what is left in its buffer nowhere instead
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # a stream with no descriptor (captured output)
            pass

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno, ...
        return getattr(self._stream, name)


@contextmanager
def reader_may_leave() -> Iterator[None]:
    """While the command runs, output to a reader that has gone is dropped (:class:`_StdoutWhoseReaderMayLeave`)."""
    saved = sys.stdout
    sys.stdout = _StdoutWhoseReaderMayLeave(saved)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = saved


# Errors of the packages behind a tuning storage (a database locked, gone, full or of another schema): the
# user's setup, not a bug in schedlib, so one line rather than a traceback.  Looked up only when already
# imported, since an error of a package that was never imported cannot have been raised.
_FOREIGN = {"optuna.exceptions": ("OptunaError", "optuna (the search library)"),
            "sqlalchemy.exc": ("SQLAlchemyError", "the tuning storage's database")}


def foreign_error(exc: BaseException, storage: str | None = None) -> str | None:
    """The one-line message for an error of optuna, SQLAlchemy or SQLite reaching the command (naming the
    ``--storage`` given, the likely source), else None: Python's own exceptions (TypeError, AttributeError,
    ...) are programming errors and keep their traceback."""
    what = "the tuning storage's database" if isinstance(exc, sqlite3.Error) else None
    for module, (name, label) in _FOREIGN.items():
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            what = label
    if what is None:
        return None
    # SQLAlchemy wraps the driver's error, whose message is the useful part; its own adds the SQL and a URL
    inner = getattr(exc, "orig", None)
    shown = inner if isinstance(inner, BaseException) else exc
    first = next((ln.strip() for ln in str(shown).splitlines() if ln.strip()), "")
    where = f" (with --storage {storage})" if storage else ""
    return f"{what} raised {type(shown).__name__}{where}" + (f": {first}" if first else "")


# tune's error when no config has a time (here, as the rest of this file, to keep schedlib.cli short)


def not_no_best(record: logging.LogRecord) -> bool:
    """Drops tune's "no config ... succeeded" log line: cmd_tune reports that itself, with the counts."""
    return not record.getMessage().startswith("tune: no config of ")


def no_best(res: Any, name: str) -> str:
    """Why a tuning run has no best config: the failures by status (most frequent first) and the first error."""
    from schedlib.search.records import OK

    records = res.records
    statuses = records["status"].value_counts() if len(records) else None
    if statuses is None:
        return f"tune: no config of {name} ran (nothing was recorded)"
    counts = ", ".join(f"{n} {status}" for status, n in statuses.items() if status != OK)
    if OK in statuses:  # measured, but the rule refuses to build what it measured
        ok = int(statuses[OK])
        built = "cannot build it" if ok == 1 else "builds none of them"
        return (f"tune: {ok} config{'' if ok == 1 else 's'} of {name} ran, but the rule {res.key.rule} {built}"
                + (f" (the others: {counts})" if counts else ""))
    errors = records["error"].dropna().astype(str) if "error" in records else []
    first = next((e.strip().splitlines()[0] for e in errors if e.strip()), "")
    return f"tune: no config of {name} ran successfully ({counts})" + (f"; the first error: {first[:160]}"
                                                                        if first else "")


# compare's table on stdout

SOURCE_WIDTH = 100  # characters of a row's source shown; a failure's whole message is in report.csv


def compare_table(df: Any) -> str:
    """compare's summary as demo and the report show it: times to 3 figures, n/a for no time (not NaN), and a
    long source (a failure's message, up to 400 characters) cut short: pandas pads every row to the longest
    cell, so one failed method made each line of the table some 500 characters wide."""
    shown = df[["workload", "method", "time_us", "pct_roofline", "source"]].copy()
    for c in ("time_us", "pct_roofline"):
        shown[c] = shown[c].map(lambda v: f"{v:.3g}" if v == v else "n/a")
    cut = shown["source"].astype(str).str.len() > SOURCE_WIDTH
    shown["source"] = shown["source"].astype(str).map(lambda t: t if len(t) <= SOURCE_WIDTH
                                                      else t[:SOURCE_WIDTH - 3] + "...")
    note = "\n(a source cut short with ... is whole in report.csv)" if cut.any() else ""
    return shown.to_string(index=False) + note

