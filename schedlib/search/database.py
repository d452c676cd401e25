"""The tuning database: Optuna studies keyed by exactly what makes a measurement valid.

A record is only reusable for the same computation at the same shapes on the same device, measured the
same way by the same schedlib.  So the study name encodes a :class:`TuningKey`: rule, a digest of the rule's
knob space (a template that gained or changed a knob is another template: its old configs cannot be built),
a hash of ``str(func)`` of the *unscheduled* func (it spells out shapes, dtypes and structure), the device profile,
``schedlib.__version__``, the schema version of what we store, and the measuring backend (an estimate is not
a GPU time).  :func:`apply_best` looks up that exact key and refuses otherwise - a record for another shape
is never reused (the failure of tilelang issue #1250).

Storage (see :mod:`schedlib.search.storage`): ``None`` is an SQLite file in the per-user cache, a
``.log``/``.journal`` path a JournalStorage file, ``://`` an SQLAlchemy URL, ``"memory"`` a throw-away one.
Several processes may share one storage: proposals are made under a file lock next to a file-based storage,
so two workers never claim the same config.
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
from optuna.storages import BaseStorage
from optuna.trial import TrialState

import schedlib
from schedlib.cache import content_hash
from schedlib.errors import SchedlibError
from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func, require_func
from schedlib.rules.base import Space
from schedlib.search.checks import SkipTally, record_problem, time_problem
from schedlib.search.records import COUNTED, INTERRUPTED, OK, RECORDS, config_key
from schedlib.search.storage import (  # noqa: F401 - re-exported: the storage API predates its module
    JOURNAL_SUFFIXES,
    NoRecordError,
    StorageError,
    default_storage_path,
    resolve_storage,
    storage_errors,
    storage_label,
)

SCHEMA_VERSION = 2  # 2: the knob-space digest joined the study name
PREFIX = "schedlib"
ATTR = "sl"  # all our per-trial data lives in this one user attribute: one storage write, not fifteen
BACKEND_PREFERENCE = ("gpu", "replay", "estimate")  # apply_best's order when several backends recorded


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
        # the backend comes last and is a user's Backend.key, free text: a '|' in it belongs to it (split
        # on every '|', a study tuned with backend key "cuda|v2" was never found by apply_best)
        parts = name.split("|", 7)
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
    require_func(func, "tuning")
    return content_hash(str(func))


def space_digest(space: Space) -> str:
    """Digest of a knob space's names and values: records are valid only for the template that made them."""
    return content_hash(json.dumps([[k.name, [repr(v) for v in k.values]] for k in space.knobs]))[:12]


def profile_digest(profile: HardwareProfile) -> str:
    """Digest of a profile's numbers (not its name, aliases or sources): an estimate made from other
    numbers - an edited copy of a profile under the same key - is another measurement."""
    numbers = {k: v for k, v in profile.to_dict().items() if k not in ("name", "aliases", "source")}
    return content_hash(json.dumps(numbers, sort_keys=True, default=str))[:12]


def estimate_key(profile: HardwareProfile) -> str:
    """The backend key of the estimate backend on ``profile``: the model's input is the profile itself."""
    return f"estimate-{profile_digest(profile)}"


def signature(func: Func) -> str:
    """The func's header line (name, buffers with shapes and dtypes) for messages."""
    return str(func).splitlines()[0].rstrip(":")


# storage ----------------------------------------------------------------------------------------
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
    label = storage_label(storage)
    with storage_errors(label):
        study = optuna.create_study(storage=storage, study_name=key.study_name, sampler=sampler,
                                    direction="minimize", load_if_exists=True)
        if study.user_attrs.get("func_text") is None:
            study.set_user_attr("func_text", str(func))
            study.set_user_attr("signature", signature(func))
            study.set_user_attr("key", key.__dict__)
        mismatch = func_mismatch(study, func, label)
    if mismatch is not None:
        raise SchedlibError(mismatch)
    return study


def func_mismatch(study: optuna.Study, func: Func, label: str) -> str | None:
    """Why the study in ``label`` must not be used for ``func`` (None: it may): it records another func
    whose workload hash is the same (a collision, or a hand-edited ``func_text``)."""
    stored = study.user_attrs.get("func_text")
    if stored is None or stored == str(func):
        return None
    shown = stored.splitlines()[0] if isinstance(stored, str) and stored else stored
    return (f"study {study.study_name} in {label} records a different func with the same hash; refusing to mix "
            f"records (stored: {shown!r})")


# workers and interrupted trials ----------------------------------------------------------------
def _start_token(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def worker_id() -> str:
    """host:pid:start-time of this process (the start time tells a reused pid apart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_token(os.getpid())}"


def worker_alive(worker: Any, started: Any, stale_s: float) -> bool:
    """Whether the process that owns a RUNNING trial can still finish it.

    A claim whose ``worker`` is not ``host:pid:token`` with a positive pid (not ours, or a damaged row) is
    judged by its age, like a foreign trial: one bad row must not stop tuning (see checks.py)."""
    age = time.time() - started.timestamp() if started is not None else math.inf
    if not isinstance(worker, str) or worker.count(":") < 2:
        return age < stale_s  # asked a moment ago, its claim not written yet (or a foreign trial)
    host, pid_text, token = worker.rsplit(":", 2)
    pid = int(pid_text) if pid_text.isdigit() else 0  # kill(0) or kill(-1) would signal a whole group
    if host != socket.gethostname() or pid <= 0:
        return age < stale_s
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:  # a pid no process can have
        return False
    return token == "?" or _start_token(pid) == token


def reap_interrupted(study: optuna.Study, stale_s: float, claims_locked: bool = False) -> int:
    """Close RUNNING trials whose process died (kill -9, power loss) as ``interrupted``; returns how many.

    ``claims_locked``: the caller holds the cross-process lock under which every worker asks a trial *and*
    writes its claim, so a RUNNING trial with no claim was left by a process killed between the two.
    """
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        stored = t.user_attrs.get(ATTR)
        attrs = dict(stored) if isinstance(stored, dict) else {}
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
    """Which configs the study has recorded and which are being measured right now (any worker).

    ``space``: when given, a record whose config is not a point of it is skipped (with one warning), as is
    any record that ``tune`` could not have written (see :mod:`schedlib.search.checks`).
    """

    def __init__(self, study: optuna.Study, space: Space | None = None) -> None:
        self.study = study
        self.space = space
        self.by_key: dict[str, Record] = {}
        self.running: dict[int, str | None] = {}
        self.counted = 0
        self._scan_from = 0
        self.skipped = SkipTally(f"study {study.study_name} in {storage_label(study._storage)}")

    def refresh(self) -> None:
        with storage_errors(storage_label(self.study._storage)):
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
                attrs = t.user_attrs.get(ATTR)
                key = attrs.get("config_key") if isinstance(attrs, dict) else None
                if key is not None and not isinstance(key, str):  # a damaged claim: it still holds a budget slot
                    self.skipped.skip(f"running trial {t.number}", f"config_key={key!r} is not a string")
                    key = None
                self.running[t.number] = key
        self.skipped.report()

    def note(self, number: int, status: str, time_us: float, config: dict[str, Any], key: str) -> None:
        """Record our own just-finished trial without re-reading the storage."""
        if status in RECORDS and key not in self.by_key:
            self.by_key[key] = Record(number, status, time_us if status == OK else math.inf, dict(config))
            self.counted += status in COUNTED
        self.running.pop(number, None)

    def _add(self, t: Any) -> None:
        attrs = t.user_attrs.get(ATTR)
        if attrs is None:
            return  # not ours (or asked and never claimed)
        why = record_problem(attrs, self.space)
        if why is not None:
            self.skipped.skip(f"trial {t.number}", why)
            return
        key, status = attrs.get("config_key"), attrs.get("status")
        if status not in RECORDS or key in self.by_key:
            return
        time_us = float(attrs["time_us"]) if status == OK else math.inf
        self.by_key[key] = Record(t.number, status, time_us, dict(attrs["config"]))
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
    """config key -> re-benchmarked median time (only the GPU backend re-benchmarks); bad entries skipped."""
    out = {}
    skipped = SkipTally(f"study {study.study_name} in {storage_label(study._storage)}")
    for name, value in study.user_attrs.items():
        if not name.startswith("rebench:"):
            continue
        t = value.get("time_us") if isinstance(value, dict) else value
        if t is None:
            continue  # the re-benchmark failed: the first measurement stands
        why = time_problem(t)
        if why is None:
            out[name[len("rebench:"):]] = float(t)
        else:
            skipped.skip(f"attribute {name}", why)
    skipped.report()
    return out


def ranked_records(study: optuna.Study, space: Space | None = None) -> list[Record]:
    """The ok records whose config is in ``space``, fastest first, each with its re-benchmarked time where
    there is one (the time it is ranked by)."""
    index = RecordIndex(study, space)
    index.refresh()
    with storage_errors(storage_label(study._storage)):
        rebench = rebench_times(study)
    ok = [Record(r.number, r.status, rebench.get(config_key(r.config), r.time_us), r.config)
          for r in index.by_key.values() if r.status == OK]
    return sorted(ok, key=lambda r: (r.time_us, r.number))


def find_studies(storage: BaseStorage, func: Func, profile: HardwareProfile, rule: str,
                 space: str) -> tuple[list[TuningKey], list[str]]:
    """Keys of this exact workload and knob space in ``storage``, and one line per other recorded study of the
    rule (another shape, device, version or knob space, or estimates made from other profile numbers)."""
    want = TuningKey.for_workload(func, profile.key, rule, "*", space)
    estimate = estimate_key(profile)
    matches, others = [], []
    with storage_errors(storage_label(storage)):
        summaries = storage.get_all_studies()
    for summary in summaries:
        key = TuningKey.parse(summary.study_name)
        if key is None or key.rule != rule:
            continue
        same = (key.space, key.workload, key.device, key.version, key.schema) == (
            want.space, want.workload, want.device, want.version, want.schema)
        same_numbers = key.backend_kind() != "estimate" or key.backend == estimate
        if same and same_numbers:
            matches.append(key)
        else:
            sig = summary.user_attrs.get("signature", "?")
            space_note = "" if key.space == space else ", another knob space"
            numbers_note = "" if same_numbers else ", other profile numbers"
            others.append(f"{sig} on {key.device} (schedlib {key.version}, schema {key.schema}, {key.backend}"
                          f"{space_note}{numbers_note})")
    rank = {k: i for i, k in enumerate(BACKEND_PREFERENCE)}
    matches.sort(key=lambda k: rank.get(k.backend_kind(), len(rank)))
    return matches, others
