"""What one trial produced, and the flat tables (records, convergence history) built from a study.

Every trial ends in exactly one *status*.  ``ok`` is a measured time; the measured failures (compile error,
launch failure, illegal address, wrong result, timeout, crash, ...) are measurements too - a config that
crashed is never re-measured.  The bookkeeping statuses (``cached``, ``duplicate``, ``interrupted``) mark
trials that measured nothing new; they are kept in the study so that samplers stay consistent, but they are
not records: ``records`` holds one row per distinct config that was measured or rejected as illegal.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

OK = "ok"
ILLEGAL = "illegal"  # not a point of the space: rejected before any measurement
CACHED = "cached"  # proposed again; answered from the recorded value without measuring
DUPLICATE = "duplicate"  # another worker claimed the same config first
INTERRUPTED = "interrupted"  # the tuning process died while measuring; the config may be measured again
MEASURED_FAILURES = frozenset({
    "schedule_error",  # the rule could not build the schedule
    "build_error",  # code generation failed
    "compile_error",  # nvcc/NVRTC (or the emulator's g++) rejected the source
    "launch_error",  # the launch itself failed (too many resources, bad configuration)
    "illegal_address",  # the kernel faulted
    "wrong_result",  # ran, but the output differs from the reference
    "timeout",  # did not finish within timeout_per_trial
    "crash",  # the measuring worker process died (segfault, abort)
    "error",  # the backend raised something else
    "not_recorded",  # replay: the recording has no time for this config
})
COUNTED = frozenset({OK, *MEASURED_FAILURES})  # statuses that use up the trial budget
RECORDS = COUNTED | {ILLEGAL}

SCALAR_COLUMNS = ("trial", "number", "status", "time_us", "p20_us", "p80_us", "error_type", "error", "source",
                  "wall_s", "overhead_s", "backend", "worker", "config_key")
RESERVED_COLUMNS = frozenset({*SCALAR_COLUMNS, "config"})  # no knob may be named like these (see tune)


def config_key(config: Mapping[str, Any]) -> str:
    """Canonical text of a config: the identity used to deduplicate records across sessions and workers."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), default=_plain)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"config value {value!r} of type {type(value).__name__} is not JSON-able")


def plain_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Numpy scalars -> Python scalars, so a config survives JSON and Optuna user attributes unchanged."""
    return {str(k): (v.item() if isinstance(v, np.generic) else v) for k, v in config.items()}


@dataclass
class Measurement:
    """The outcome of measuring one config.  Failures carry ``time_us = inf`` and say what went wrong."""

    status: str
    time_us: float = math.inf
    p20_us: float = math.inf
    p80_us: float = math.inf
    error_type: str | None = None
    error: str | None = None
    wall_s: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A backend's numbers are often numpy scalars (a cupy event time is a float32, a median an int64), its
        # error an exception object.  Stored as given they broke the record: JSON storages raised TypeError
        # out of tune() (the trial became interrupted and a rerun measured it again), and in memory the ok
        # record was skipped as "not a number".  So every field is made the plain type it is stored as.
        for name in ("time_us", "p20_us", "p80_us"):
            value = getattr(self, name)
            if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
                setattr(self, name, float(value))
            elif name != "time_us" or self.status != OK:
                setattr(self, name, math.inf)  # a missing spread (None) is no spread
            else:
                raise ValueError(f"an ok measurement needs a finite positive time, got {value!r}")
        if self.error_type is not None and not isinstance(self.error_type, str):
            self.error_type = getattr(self.error_type, "__name__", None) or str(self.error_type)
        if self.error is not None and not isinstance(self.error, str):
            self.error = str(self.error)
        self.wall_s = float(self.wall_s) if isinstance(self.wall_s, numbers.Real) and math.isfinite(self.wall_s) \
            else 0.0
        self.figures = dict(self.figures) if isinstance(self.figures, Mapping) else {}
        if self.status != OK:
            self.time_us = self.p20_us = self.p80_us = math.inf
        elif not (math.isfinite(self.time_us) and self.time_us > 0):
            raise ValueError(f"an ok measurement needs a finite positive time, got {self.time_us!r}")

    @property
    def ok(self) -> bool:
        return self.status == OK

    @classmethod
    def failure(cls, status: str, error_type: str | None, error: str, wall_s: float = 0.0) -> Measurement:
        if status not in MEASURED_FAILURES and status != ILLEGAL:
            raise ValueError(f"unknown failure status {status!r}; expected one of {sorted(MEASURED_FAILURES)}")
        return cls(status, error_type=error_type, error=str(error)[:2000], wall_s=wall_s)

    @classmethod
    def from_times(cls, times_us: Sequence[float], wall_s: float = 0.0, **figures: float) -> Measurement:
        """Median and the 20th/80th percentiles of repeated timings."""
        arr = np.asarray(times_us, dtype=float)
        if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError(f"timings must be finite and positive, got {list(times_us)[:8]}")
        p20, med, p80 = np.percentile(arr, [20, 50, 80])
        return cls(OK, float(med), float(p20), float(p80), wall_s=wall_s,
                   figures={"repeats": float(arr.size), **figures})

    def user_attrs(self) -> dict[str, Any]:
        """The JSON-able attributes stored on the Optuna trial (inf is stored as None)."""
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None
        return {"status": self.status, "time_us": num(self.time_us), "p20_us": num(self.p20_us),
                "p80_us": num(self.p80_us), "error_type": self.error_type, "error": self.error,
                "wall_s": round(self.wall_s, 6),
                "figures": {str(k): float(v) for k, v in self.figures.items()
                            if isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))}}


def _num(value: Any) -> float:
    """A stored time as a float; anything but a finite positive number (a damaged row) reads as inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return math.inf
    return float(value)


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _damaged(attrs: Mapping[str, Any]) -> bool:
    """Whether a row RecordIndex skips as malformed (see checks.record_problem) would break the tables: a status
    or config key that is not a string (a hand-edited list or object is unhashable: it cannot be deduplicated),
    a record with no key or with a config its key does not name (its row would show one config's knobs under
    another's key), or an ok record without a usable time."""
    status, key = attrs["status"], attrs.get("config_key")
    if not isinstance(status, str) or (key is not None and not isinstance(key, str)):
        return True
    if status in RECORDS and (key is None or not _keyed(attrs["config"], key)):
        return True
    return status == OK and _num(attrs.get("time_us")) == math.inf


def _keyed(config: Mapping[str, Any], key: str) -> bool:
    try:
        return config_key(config) == key
    except (TypeError, ValueError):  # a value JSON cannot spell: no key names it
        return False


def trial_rows(trials: Iterable[Any], knob_names: Sequence[str]) -> list[dict[str, Any]]:
    """One flat dict per Optuna trial that carries our attributes (others - e.g. waiting ones - are skipped)."""
    rows = []
    for t in trials:
        attrs = t.user_attrs.get("sl") or {}
        if not isinstance(attrs, Mapping) or not isinstance(attrs.get("config"), Mapping) or "status" not in attrs:
            continue  # not ours, or damaged: RecordIndex skips (and reports) the same rows
        if _damaged(attrs):
            continue
        row: dict[str, Any] = {"number": t.number}
        config = attrs["config"]
        for name in knob_names:
            row[name] = config.get(name)
        for col in ("status", "error_type", "error", "source", "backend", "worker", "config_key"):
            row[col] = attrs.get(col)
        for col in ("time_us", "p20_us", "p80_us"):
            row[col] = _num(attrs.get(col))
        row["wall_s"] = _seconds(attrs.get("wall_s"))
        row["overhead_s"] = _seconds(attrs.get("overhead_s"))
        row["config"] = config
        rows.append(row)
    return rows


def records_frame(trials: Iterable[Any], knob_names: Sequence[str]) -> pd.DataFrame:
    """One row per distinct config that was measured (ok or a measured failure) or rejected as illegal,
    in trial order; ``trial`` numbers the budget-counting rows 1, 2, ... (illegal rows get NaN)."""
    rows, seen = [], set()
    for row in sorted(trial_rows(trials, knob_names), key=lambda r: r["number"]):
        if row["status"] not in RECORDS or row["config_key"] in seen:
            continue
        seen.add(row["config_key"])
        rows.append(row)
    columns = [*SCALAR_COLUMNS[:1], *knob_names, *SCALAR_COLUMNS[1:], "config"]
    frame = pd.DataFrame(rows, columns=[c for c in columns if c != "trial"])
    counted = frame["status"].isin(COUNTED)
    frame.insert(0, "trial", pd.array(np.where(counted, counted.cumsum(), 0), dtype="Int64"))
    frame.loc[~counted, "trial"] = pd.NA
    return frame.reset_index(drop=True)


def history_series(records: pd.DataFrame) -> pd.Series:
    """Convergence: budget-counting trial index (1-based) -> best time so far (inf until the first ok)."""
    counted = records[records["status"].isin(COUNTED)]
    best = counted["time_us"].astype(float).cummin()
    return pd.Series(best.to_numpy(), index=pd.Index(counted["trial"].astype(int).to_numpy(), name="trial"),
                     name="best_us")


def trials_to_reach(history: pd.Series, target_us: float) -> int | None:
    """The first trial index whose best-so-far is at most ``target_us`` (None: never)."""
    hit = history[history <= target_us]
    return None if hit.empty else int(hit.index[0])
