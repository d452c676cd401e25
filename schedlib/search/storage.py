"""Opening a tuning storage, and turning its failures into errors that name it.

``None`` is an SQLite file in the per-user cache (``cache_dir("tuning")``); a path ending in
``.log``/``.journal`` is an Optuna JournalStorage file; any string with ``://`` is an SQLAlchemy URL (``sqlite://``,
``sqlite:///`` and ``sqlite:///:memory:`` are an in-memory SQLite database, gone when the process ends); any
other path is an SQLite file; ``"memory"`` is a throw-away in-memory storage; an Optuna storage object is
used as is.

Why the wrapping: SQLAlchemy and Optuna report a damaged or mistyped storage as ``DatabaseError: file is not
a database`` or ``Expecting ':' delimiter``, naming neither the file nor what to do.  Everything that can go
wrong while opening or reading a storage comes out as :class:`StorageError` with the storage spelled out.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

from schedlib.cache import cache_dir
from schedlib.errors import SchedlibError

JOURNAL_SUFFIXES = (".log", ".journal")
TAIL_BLOCK = 1 << 16  # bytes read at a time when looking for a journal's last newline from its end
log = logging.getLogger("schedlib.search")


class NoRecordError(SchedlibError, LookupError):
    """The database holds no usable record for this exact workload, device and schedlib version."""


class StorageError(SchedlibError):
    """A tuning storage cannot be opened or read (missing directory, not a database, corrupt journal)."""


def default_storage_path() -> Path:
    return cache_dir("tuning") / "tuning.sqlite3"


def lock_path(path: Path) -> Path:
    # not "<path>.lock": Optuna's journal backend uses that name for its own symlink lock
    return path.with_name(path.name + ".schedlib-lock")


def storage_label(storage: Any) -> str:
    """A human name for a storage object: its file or URL (password hidden)."""
    if isinstance(storage, JournalStorage):  # checked first: its _backend is the file, not a wrapped storage
        path = getattr(storage._backend, "_file_path", None)
        return str(path) if path else "journal storage"
    inner = getattr(storage, "_backend", storage)  # Optuna wraps an RDBStorage in a caching layer
    if isinstance(inner, RDBStorage):
        return _safe_url(inner.url)
    if isinstance(inner, InMemoryStorage):
        return "in-memory storage"
    return type(storage).__name__


def _safe_url(url: str) -> str:
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL carries no password we could hide
        return url


def _read_errors() -> tuple[type[BaseException], ...]:
    """What SQLAlchemy and Optuna raise for unreadable data (a bad row's JSON is decoded by Optuna)."""
    import sqlalchemy

    # RecursionError: json.loads on a value nested thousands deep (a hand edit, or garbage that happens to be
    # brackets) exhausts the stack; it is the stored value that is at fault, not a bug of ours
    return (sqlalchemy.exc.SQLAlchemyError, json.JSONDecodeError, UnicodeDecodeError, RecursionError)


# What Optuna's journal replay raises for a line that is JSON but not an operation: ``[1, 2]`` (TypeError), an
# unknown op_code (AssertionError), a known one missing its fields (KeyError).  Only caught around storage calls.
JOURNAL_SHAPE_ERRORS = (TypeError, KeyError, AssertionError, AttributeError, IndexError)


@contextlib.contextmanager
def storage_errors(label: str) -> Iterator[None]:
    """Re-raise failures of reading the storage ``label`` as :class:`StorageError` naming it."""
    try:
        yield
    except _read_errors() as exc:
        raise StorageError(f"tuning storage {label} cannot be read: {_reason(exc)}; repair it, or delete it "
                           f"(its records are lost) and tune again") from exc
    except JOURNAL_SHAPE_ERRORS as exc:
        if not label.lower().endswith(JOURNAL_SUFFIXES):
            raise  # not a journal replay: a bug to report as is, not a damaged file
        raise StorageError(f"tuning storage {label} cannot be read: {_first_bad_journal_line(Path(label), exc)}; "
                           f"repair or delete the file") from exc


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)  # SQLAlchemy's wrapper: the driver's message is the useful part
    text = str(orig if orig is not None else exc).strip().splitlines()
    what = text[0] if text else ""
    if isinstance(exc, json.JSONDecodeError):
        return f"a stored value is not valid JSON ({what})"
    if isinstance(exc, RecursionError):
        return "a stored value is nested too deeply to decode"
    return f"{type(orig or exc).__name__}: {what}"


def _sqlite_storage(url: str) -> RDBStorage:
    """SQLite in WAL mode with ``synchronous=NORMAL``: a commit costs a few ms instead of tens (a trial is
    about ten commits), readers never block the writer, and a killed process loses nothing it committed."""
    import sqlalchemy

    storage = _create_rdb(url, sqlalchemy)
    if _in_memory(url):
        # the database lives only in the connection that created the tables: disposing of it would drop them
        # (every later call: "no such table"), and WAL and fsync settings mean nothing without a file
        return storage

    @sqlalchemy.event.listens_for(storage.engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    storage.engine.dispose()  # connections opened before the listener existed are dropped
    return storage


def _in_memory(url: str) -> bool:
    """Whether an SQLite URL names an in-memory database: ``sqlite://``, ``sqlite:///``,
    ``sqlite:///:memory:``, or a ``file:...?mode=memory`` URI."""
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return False  # not a URL at all: opening it reports that, naming it
    database = parsed.database or ""
    return database in ("", ":memory:") or parsed.query.get("mode") == "memory"


SCHEMA_RACE_TRIES = 5


def _create_rdb(url: str, sqlalchemy: Any) -> RDBStorage:
    """``RDBStorage(url)``, tried again when another process was creating the same new database at that moment:
    both then insert the schema's version row, and the loser's insert fails on its unique key.  On the next try
    the schema is there and is only read."""
    engine_kwargs = {"connect_args": {"timeout": 120}}
    for attempt in range(SCHEMA_RACE_TRIES - 1):
        try:
            return RDBStorage(url, engine_kwargs=engine_kwargs)
        except sqlalchemy.exc.IntegrityError:
            time.sleep(0.1 * (attempt + 1))
    return RDBStorage(url, engine_kwargs=engine_kwargs)


def _check_file(path: Path, create: bool, label: str) -> None:
    if path.is_dir():
        raise StorageError(f"tuning storage {label} is a directory; give a file path (e.g. {path / 'tuning.db'})")
    if not create and not path.exists():
        raise NoRecordError(f"tuning storage {label} does not exist (nothing has been tuned into it)")


# Tables only Optuna's schema has ("trials" alone is too common a name).  Optuna creates "studies" first (the
# other tables refer to it), so a database another process is setting up right now never looks foreign.
OPTUNA_TABLES = frozenset({"studies", "version_info", "alembic_version", "study_directions", "trial_values",
                           "trial_params", "trial_user_attributes", "study_user_attributes"})


def _check_sqlite_tables(path: Path, create: bool, label: str) -> None:
    """Refuse an SQLite file that holds another program's tables, and (``create=False``) one with no tables.

    Why: RDBStorage creates Optuna's tables in whatever database it is given.  An application's database that
    happened to have a ``trials`` table was altered by apply_best (which must never write) and then failed in
    tune with Optuna's StorageInternalError; an empty file got a schema from apply_best."""
    import sqlite3

    if not path.is_file() or path.stat().st_size == 0:
        tables: set[str] = set()
    else:
        try:
            with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
                tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.Error:
            return  # not a database, locked, unreadable: opening it reports that, naming the file
    if tables and not tables & OPTUNA_TABLES:
        shown = ", ".join(sorted(tables)[:6]) + (", ..." if len(tables) > 6 else "")
        raise StorageError(f"tuning storage {label} is an SQLite database of something else (tables: {shown}), "
                           f"not a tuning database; give another file")
    if not create and not tables:
        raise NoRecordError(f"tuning storage {label} is empty (nothing has been tuned into it)")


def _first_bad_journal_line(path: Path, exc: BaseException) -> str:
    """Where a journal stops being operations, for the message (Optuna's error names no line): the first
    line that is not JSON, or not an object with a known ``op_code``."""
    from optuna.storages.journal._storage import JournalOperation

    known = {op.value for op in JournalOperation}
    with contextlib.suppress(OSError), open(path, "rb") as fh:
        for n, line in enumerate(fh, start=1):
            try:
                op = json.loads(line)
            except RecursionError:
                return f"line {n} is nested too deeply to decode: {line[:80]!r}"
            except ValueError:
                return f"line {n} is not a JSON record: {line[:80]!r} ({type(exc).__name__}: {exc})"
            code = op.get("op_code") if isinstance(op, dict) else None
            if isinstance(code, bool) or code not in known:
                return f"line {n} is not a journal operation (an object with a known op_code): {line[:80]!r}"
    return f"an operation in it is malformed ({type(exc).__name__}: {exc})"


def _ends_complete(path: Path) -> bool:
    """Whether the journal is empty or ends with a newline (every line a whole operation)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return True
        fh.seek(size - 1)
        return fh.read(1) == b"\n"


def _complete_length(fh: BinaryIO, size: int) -> int:
    """The length of the file up to and including its last newline (0: there is none), read from the end."""
    end = size
    while end > 0:
        start = max(0, end - TAIL_BLOCK)
        fh.seek(start)
        at = fh.read(end - start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def _side_file(path: Path, tail: bytes) -> Path:
    """Write ``tail`` to the first free ``<journal>.partial-<n>`` (never over an earlier one)."""
    for n in itertools.count(1):
        side = path.with_name(f"{path.name}.partial-{n}")
        try:
            with open(side, "xb") as out:
                out.write(tail)
                out.flush()
                os.fsync(out.fileno())
        except FileExistsError:
            continue
        return side
    raise AssertionError("unreachable")  # itertools.count never ends


def set_aside_partial_line(path: Path) -> None:
    """Move a last line cut short (a process killed mid-append) out of the journal before anything appends.

    Why: Optuna reads such a journal (it stops before the partial line), but its next append lands on the end
    of that line, which becomes one invalid line in the middle of the file: from then on no read gets past it
    and every record is lost.  The partial bytes are kept in ``<journal>.partial-<n>`` (they are the user's
    data, and tell what was being written), and the journal is cut back to its last complete line.  This runs
    under Optuna's own journal lock, which every append holds: a line another live worker is still writing is
    waited for, never taken for a cut-short one.
    """
    if _ends_complete(path):
        return  # the common case, answered without taking the lock
    try:
        cut = _cut_partial_line(path)
    except OSError as exc:
        raise StorageError(f"tuning storage {path}: its last line is cut short (a crash mid-write) and cannot be "
                           f"set aside before appending ({exc.strerror or exc}); remove the incomplete last line "
                           f"by hand") from exc
    if cut is not None:
        side, n_bytes = cut
        log.warning("tuning storage %s: its last line was cut short (a crash mid-write); set aside its %d byte(s) "
                    "in %s and resumed from the last complete line", path, n_bytes, side)


def _cut_partial_line(path: Path) -> tuple[Path, int] | None:
    """Under the journal lock: the side file the partial last line went to and its size (None: no partial)."""
    lock = JournalFileSymlinkLock(str(path))  # the lock JournalFileBackend takes by default (<journal>.lock)
    lock.acquire()
    try:
        with open(path, "r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            keep = _complete_length(fh, size)
            if keep == size:
                return None  # the writer we waited for finished its line
            fh.seek(keep)
            tail = fh.read()
            if not tail.startswith(b"{"):  # every operation Optuna writes is a JSON object
                raise StorageError(f"tuning storage {path}: its last line {tail[:80]!r} has no line end and is "
                                   f"not the start of a journal operation; repair or delete the file")
            side = _side_file(path, tail)
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
            return side, size - keep
    finally:
        lock.release()


def _open_journal(path: Path, repair: bool) -> JournalStorage:
    """The journal at ``path``; ``repair`` (tune, which appends): first set aside a last line cut short."""
    try:
        # read first: a journal damaged elsewhere is reported before anything in it is moved
        storage = JournalStorage(JournalFileBackend(str(path)))
        if repair:
            set_aside_partial_line(path)  # Optuna read only the complete lines: what it holds stays valid
        return storage
    # JSONDecodeError is a ValueError; RecursionError: a line nested too deeply for json.loads
    except (ValueError, UnicodeDecodeError, RecursionError, *JOURNAL_SHAPE_ERRORS) as exc:
        raise StorageError(f"tuning storage {path} cannot be read: {_first_bad_journal_line(path, exc)}; "
                           f"repair or delete the file") from exc
    except OSError as exc:
        raise StorageError(f"tuning storage {path} cannot be opened: {exc.strerror or exc}") from exc


def _open_url(text: str, create: bool) -> tuple[BaseStorage, Path | None]:
    label = _safe_url(text)
    path = None
    # an in-memory database has no file to check, and no lock file: it is private to this process
    if text.startswith("sqlite:///") and not _in_memory(text):
        path = Path(text.split(":///", 1)[1])
        _check_file(path, create, label)
        _check_sqlite_tables(path, create, label)
    try:
        storage = _sqlite_storage(text) if text.startswith("sqlite:") else RDBStorage(text)
    except _read_errors() as exc:
        raise StorageError(f"tuning storage {label} cannot be opened: {_reason(exc)}") from exc
    except RuntimeError as exc:
        if not _is_schema_error(exc):
            raise
        raise StorageError(_schema_message(label, text, exc)) from exc
    except (ImportError, ValueError) as exc:  # a missing database driver, a malformed URL
        raise StorageError(f"tuning storage {label} cannot be opened: {type(exc).__name__}: {exc}") from exc
    return storage, lock_path(path) if path is not None else None


def resolve_storage(storage: Any, create: bool = True) -> tuple[BaseStorage, Path | None]:
    """The Optuna storage for ``storage`` and the path of its lock file (None: not file-based).

    ``create=False`` (apply_best) never creates a file: a missing one is a :class:`NoRecordError`.
    """
    if isinstance(storage, BaseStorage):
        return storage, None
    if storage is None:
        path = default_storage_path()
    elif isinstance(storage, (str, os.PathLike)):
        text = os.fspath(storage)
        if not text.strip():
            raise ValueError(f"storage={storage!r} is empty; give None (the default database), a path, "
                             f"an SQLAlchemy URL or 'memory'")
        if text in ("memory", ":memory:"):
            return InMemoryStorage(), None
        if "://" in text:
            return _open_url(text, create)
        path = Path(text).expanduser()
    else:
        raise TypeError(f"storage={storage!r}: expected None, a path, an SQLAlchemy URL, 'memory' or an "
                        f"Optuna storage")
    _check_file(path, create, str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"tuning storage {path}: cannot create its directory {path.parent} "
                           f"({exc.strerror or exc})") from exc
    if path.suffix.lower() in JOURNAL_SUFFIXES:
        return _open_journal(path, repair=create), lock_path(path)
    _check_sqlite_tables(path, create, str(path))
    try:
        return _sqlite_storage(f"sqlite:///{path}"), lock_path(path)
    except _read_errors() as exc:
        raise StorageError(f"tuning storage {path} cannot be opened as an SQLite database: {_reason(exc)}"
                           ) from exc
    except RuntimeError as exc:
        if not _is_schema_error(exc):
            raise
        raise StorageError(_schema_message(str(path), f"sqlite:///{path}", exc)) from exc


def _is_schema_error(exc: RuntimeError) -> bool:
    """Optuna refuses tables that another Optuna version set up with a bare RuntimeError naming neither the
    file nor where to look; other RuntimeErrors are not ours to reword."""
    return "table schema" in str(exc)


def _schema_message(label: str, url: str, exc: RuntimeError) -> str:
    first = str(exc).strip().splitlines()[0]
    return (f"tuning storage {label} was set up by another Optuna version ({first}); if the file is older, "
            f"upgrade it with `optuna storage upgrade --storage {_safe_url(url)}`; if it is newer, upgrade Optuna "
            f"(pip install -U optuna); or tune into another file")
