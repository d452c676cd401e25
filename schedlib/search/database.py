"""The tuning database: Optuna studies keyed by exactly what makes a measurement valid.

A record is only reusable for the same computation at the same shapes on the same device, measured the
same way by the same schedlib.  So the study name encodes a :class:`TuningKey`: rule, a digest of the rule's
knob space (a template that gained or changed a knob is another template: its old configs cannot be built),
a hash of ``str(func)`` of the *unscheduled* func (it spells out shapes, dtypes and structure), the device profile,
``schedlib.__version__``, the schema version of what we store, and the measuring backend (an estimate is not
a GPU time).  :func:`apply_best` looks up that exact key and refuses otherwise - a record for another shape
is never reused (the failure of tilelang issue #1250).

Storage: ``None`` is an SQLite file in the per-user cache (``cache_dir("tuning")``); a path ending in
``.log``/``.journal`` is an Optuna JournalStorage file; any string with ``://`` is an SQLAlchemy URL; any
other path is an SQLite file; ``"memory"`` is a throw-away in-memory storage; an Optuna storage object is
used as is.  Several processes may share one storage: proposals are made under a file lock next to a
file-based storage, so two workers never claim the same config.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

import schedlib
from schedlib.cache import cache_dir, content_hash
from schedlib.errors import SchedlibError
from schedlib.ir.func import Func
from schedlib.rules.base import Space
from schedlib.search.records import COUNTED, INTERRUPTED, OK, RECORDS, config_key

SCHEMA_VERSION = 2  # 2: the knob-space digest joined the study name
PREFIX = "schedlib"
ATTR = "sl"  # all our per-trial data lives in this one user attribute: one storage write, not fifteen
JOURNAL_SUFFIXES = (".log", ".journal")
BACKEND_PREFERENCE = ("gpu", "replay", "estimate")  # apply_best's order when several backends recorded


class NoRecordError(SchedlibError, LookupError):
    """The database holds no usable record for this exact workload, device and schedlib version."""


@dataclass(frozen=True)
class TuningKey:
    """Everything a measurement's validity depends on; the study name spells it out."""

    rule: str
    space: str  # space_digest of the rule's knob space for this func and target
    workload: str
    device: str
    version: str
    schema: int
    backend: str

    @classmethod
    def for_workload(cls, func: Func, device: str, rule: str, backend: str, space: str) -> TuningKey:
        return cls(rule, space, workload_hash(func), device, schedlib.__version__, SCHEMA_VERSION, backend)

    @property
    def study_name(self) -> str:
        return "|".join((PREFIX, self.rule, f"k{self.space}", self.workload, self.device, f"v{self.version}",
                         f"s{self.schema}", self.backend))

    @classmethod
    def parse(cls, name: str) -> TuningKey | None:
        parts = name.split("|")
        if (len(parts) != 8 or parts[0] != PREFIX or not parts[2].startswith("k") or not parts[5].startswith("v")
                or not parts[6].startswith("s")):
            return None  # not ours, or written by a schedlib whose keys had another layout
        try:
            schema = int(parts[6][1:])
        except ValueError:
            return None
        return cls(parts[1], parts[2][1:], parts[3], parts[4], parts[5][1:], schema, parts[7])

    def backend_kind(self) -> str:
        return self.backend.split("-", 1)[0]


def workload_hash(func: Func) -> str:
    """Structural hash of an unscheduled func: ``str(func)`` includes shapes, dtypes and the loop nest."""
    if not isinstance(func, Func):
        raise TypeError(f"tuning needs a Func (from sl.func or sl.workloads), got {type(func).__name__}")
    return content_hash(str(func))


def space_digest(space: Space) -> str:
    """Digest of a knob space's names and values: records are valid only for the template that made them."""
    return content_hash(json.dumps([[k.name, [repr(v) for v in k.values]] for k in space.knobs]))[:12]


def signature(func: Func) -> str:
    """The func's header line (name, buffers with shapes and dtypes) for messages."""
    return str(func).splitlines()[0].rstrip(":")


# storage ----------------------------------------------------------------------------------------
def default_storage_path() -> Path:
    return cache_dir("tuning") / "tuning.sqlite3"


def _sqlite_storage(url: str) -> RDBStorage:
    """SQLite in WAL mode with ``synchronous=NORMAL``: a commit costs a few ms instead of tens (a trial is
    about ten commits), readers never block the writer, and a killed process loses nothing it committed."""
    import sqlalchemy

    storage = RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 120}})

    @sqlalchemy.event.listens_for(storage.engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    storage.engine.dispose()  # connections opened before the listener existed are dropped
    return storage


def resolve_storage(storage: Any, create: bool = True) -> tuple[BaseStorage, Path | None]:
    """The Optuna storage for ``storage`` and the path of its lock file (None: not file-based)."""
    if isinstance(storage, BaseStorage):
        return storage, None
    if storage is None:
        path = default_storage_path()
    elif isinstance(storage, (str, os.PathLike)):
        text = os.fspath(storage)
        if text in ("memory", ":memory:"):
            return InMemoryStorage(), None
        if "://" in text:
            if text.startswith("sqlite:///"):
                path = Path(text.split(":///", 1)[1])
                return _sqlite_storage(text), _lock_path(path)
            return RDBStorage(text), None
        path = Path(text).expanduser()
    else:
        raise TypeError(f"storage={storage!r}: expected None, a path, an SQLAlchemy URL, 'memory' or an "
                        f"Optuna storage")
    if not create and not path.exists():
        raise NoRecordError(f"tuning storage {path} does not exist (nothing has been tuned into it)")
    lock = _lock_path(path)
    if path.suffix.lower() in JOURNAL_SUFFIXES:
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path))), lock
    path.parent.mkdir(parents=True, exist_ok=True)
    return _sqlite_storage(f"sqlite:///{path}"), lock


def _lock_path(path: Path) -> Path:
    # not "<path>.lock": Optuna's journal backend uses that name for its own symlink lock
    return path.with_name(path.name + ".schedlib-lock")


class StudyLock:
    """Mutual exclusion for proposing and claiming configs: an ``flock`` on a file next to a file-based
    storage (released by the kernel if the holder dies), else a process-local lock."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._local = threading.Lock()
        try:
            import fcntl  # noqa: F401
        except ImportError:
            self.cross_process = False
        else:
            self.cross_process = path is not None  # True: no other process can claim while we hold it

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._local:
            if self.path is None:
                yield
                return
            try:
                import fcntl
            except ImportError:  # no flock (Windows): rely on the duplicate check after each claim
                yield
                return
            with open(self.path, "a+") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def open_study(storage: BaseStorage, key: TuningKey, func: Func, sampler: optuna.samplers.BaseSampler
               ) -> optuna.Study:
    """Create or continue the study for ``key``; the func text is stored to guard against hash collisions."""
    study = optuna.create_study(storage=storage, study_name=key.study_name, sampler=sampler,
                                direction="minimize", load_if_exists=True)
    text = str(func)
    stored = study.user_attrs.get("func_text")
    if stored is None:
        study.set_user_attr("func_text", text)
        study.set_user_attr("signature", signature(func))
        study.set_user_attr("key", key.__dict__)
    elif stored != text:
        raise SchedlibError(f"study {key.study_name} records a different func with the same hash; "
                            f"refusing to mix records (stored: {stored.splitlines()[0]!r})")
    return study


# workers and interrupted trials ----------------------------------------------------------------
def _start_token(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def worker_id() -> str:
    """host:pid:start-time of this process (the start time tells a reused pid apart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_token(os.getpid())}"


def worker_alive(worker: str | None, started: Any, stale_s: float) -> bool:
    """Whether the process that owns a RUNNING trial can still finish it."""
    age = time.time() - started.timestamp() if started is not None else math.inf
    if not worker or worker.count(":") < 2:
        return age < stale_s  # asked a moment ago, its claim not written yet (or a foreign trial)
    host, pid_text, token = worker.rsplit(":", 2)
    if host == socket.gethostname():
        pid = int(pid_text)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return token == "?" or _start_token(pid) == token
    return age < stale_s


def reap_interrupted(study: optuna.Study, stale_s: float, claims_locked: bool = False) -> int:
    """Close RUNNING trials whose process died (kill -9, power loss) as ``interrupted``; returns how many.

    ``claims_locked``: the caller holds the cross-process lock under which every worker asks a trial *and*
    writes its claim, so a RUNNING trial with no claim was left by a process killed between the two.
    """
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attrs = dict(t.user_attrs.get(ATTR) or {})
        unclaimed_orphan = claims_locked and not attrs.get("worker")
        if not unclaimed_orphan and worker_alive(attrs.get("worker"), t.datetime_start, stale_s):
            continue
        with contextlib.suppress(Exception):  # another worker may have closed it a moment ago
            study._storage.set_trial_user_attr(t._trial_id, ATTR, {**attrs, "status": INTERRUPTED})
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            n += 1
    return n


# the in-memory view of a study ------------------------------------------------------------------
@dataclass
class Record:
    number: int
    status: str
    time_us: float
    config: dict[str, Any]


class RecordIndex:
    """Which configs the study has recorded and which are being measured right now (any worker)."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self.by_key: dict[str, Record] = {}
        self.running: dict[int, str | None] = {}
        self.counted = 0
        self._scan_from = 0

    def refresh(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        self.running = {}
        contiguous = True
        for t in trials[self._scan_from:]:  # trials are numbered 0, 1, ... in list order
            if t.state.is_finished():
                self._add(t)
                if contiguous:
                    self._scan_from = t.number + 1  # a finished trial never changes again
                continue
            contiguous = False
            if t.state == TrialState.RUNNING:
                self.running[t.number] = (t.user_attrs.get(ATTR) or {}).get("config_key")

    def note(self, number: int, status: str, time_us: float, config: dict[str, Any], key: str) -> None:
        """Record our own just-finished trial without re-reading the storage."""
        if status in RECORDS and key not in self.by_key:
            self.by_key[key] = Record(number, status, time_us if status == OK else math.inf, dict(config))
            self.counted += status in COUNTED
        self.running.pop(number, None)

    def _add(self, t: Any) -> None:
        attrs = t.user_attrs.get(ATTR) or {}
        key, status = attrs.get("config_key"), attrs.get("status")
        if key is None or status not in RECORDS or key in self.by_key:
            return
        time_us = float(attrs["time_us"]) if status == OK and attrs.get("time_us") is not None else math.inf
        self.by_key[key] = Record(t.number, status, time_us, attrs["config"])
        self.counted += status in COUNTED

    def taken(self, exclude: int | None = None) -> set[str]:
        """Keys recorded or claimed by a running trial (other than trial ``exclude``)."""
        running = {k for n, k in self.running.items() if k is not None and n != exclude}
        return set(self.by_key) | running

    def n_running(self, exclude: int | None = None) -> int:
        return sum(1 for n in self.running if n != exclude)

    def measured(self) -> list[Record]:
        return [r for r in self.by_key.values() if r.status in COUNTED]

    def best(self) -> Record | None:
        ok = [r for r in self.by_key.values() if r.status == OK]
        return min(ok, key=lambda r: r.time_us) if ok else None


def rebench_times(study: optuna.Study) -> dict[str, float]:
    """config key -> re-benchmarked median time (only the GPU backend re-benchmarks)."""
    out = {}
    for name, value in study.user_attrs.items():
        if name.startswith("rebench:") and isinstance(value, dict) and value.get("time_us") is not None:
            out[name[len("rebench:"):]] = float(value["time_us"])
    return out


def best_record(study: optuna.Study) -> Record | None:
    """The fastest ok record; a re-benchmarked time replaces the first measurement where there is one."""
    index = RecordIndex(study)
    index.refresh()
    rebench = rebench_times(study)
    ok = [r for r in index.by_key.values() if r.status == OK]
    if not ok:
        return None
    return min(ok, key=lambda r: rebench.get(config_key(r.config), r.time_us))


def find_studies(storage: BaseStorage, func: Func, device: str, rule: str,
                 space: str) -> tuple[list[TuningKey], list[str]]:
    """Keys of this exact workload and knob space in ``storage``, and one line per other recorded study of the
    rule (another shape, device, version or knob space)."""
    want = TuningKey.for_workload(func, device, rule, "*", space)
    matches, others = [], []
    for summary in storage.get_all_studies():
        key = TuningKey.parse(summary.study_name)
        if key is None or key.rule != rule:
            continue
        same = (key.space, key.workload, key.device, key.version, key.schema) == (
            want.space, want.workload, want.device, want.version, want.schema)
        if same:
            matches.append(key)
        else:
            sig = summary.user_attrs.get("signature", "?")
            space_note = "" if key.space == space else ", another knob space"
            others.append(f"{sig} on {key.device} (schedlib {key.version}, schema {key.schema}, {key.backend}"
                          f"{space_note})")
    rank = {k: i for i, k in enumerate(BACKEND_PREFERENCE)}
    matches.sort(key=lambda k: rank.get(k.backend_kind(), len(rank)))
    return matches, others
