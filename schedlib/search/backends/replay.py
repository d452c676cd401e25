"""The ``replay`` backend: look measurements up in a recording (Kernel Tuner's simulation mode).

Why: comparing strategies or tuning the cost model needs many full search runs; on a recorded space each
"measurement" is a dictionary lookup, so a run takes seconds and needs no GPU, and every strategy sees the
very same times.  A recording is JSON or CSV and is only ever parsed as data.

JSON: ``{"format": "schedlib-replay", "workload_hash": ..., "signature": ..., "device": ..., "origin": ...,
"records": [{"config": {...}, "time_us": 12.5, "status": "ok"}, ...]}`` (or just the list of records).
CSV: one column per knob plus ``time_us`` (or ``time``) and optionally ``status``.  A recording that names
its workload refuses to replay for a different one.

A status is ``ok`` or one of the failures a trial can record (:data:`STATUSES`); anything else is refused,
naming the allowed ones.  A config recorded twice with the same outcome (a recording concatenated twice)
counts once; twice with different outcomes, the recording is refused, naming both records: no rule could
say which one is the measurement to replay, and "the last one wins" would silently change every comparison
made on it.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from schedlib.cache import content_hash
from schedlib.errors import SchedlibError
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Rule
from schedlib.search.backends import Backend
from schedlib.search.database import signature, workload_hash
from schedlib.search.records import ILLEGAL, MEASURED_FAILURES, OK, Measurement, config_key, plain_config

FORMAT = "schedlib-replay"
STATUSES = frozenset({OK, ILLEGAL, *MEASURED_FAILURES})  # what tune records, hence what a recording may hold


def _number(value: Any) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.inf
    out = float(value)
    return out if math.isfinite(out) and out > 0 else math.inf


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip())


def _scalar(value: Any) -> Any:
    """One knob value as the plain Python value it spells: CSV columns with a gap are read as floats
    (16.0) and text columns as strings ("16", "true"), but a config's identity is its exact JSON text."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                continue
        else:
            return text
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _field_number(rec: Mapping[str, Any], name: str, default: float, where: str, i: int, config: Config) -> float:
    """``rec[name]`` as a time (``default`` when absent); an error naming the field when it is no number."""
    if name not in rec:
        return default
    try:
        return _number(rec[name])
    except (TypeError, ValueError):  # each field on its own: the message names the one that is bad
        raise SchedlibError(f"replay recording {where}: record {i} ({config}): {name}={rec[name]!r} is not a "
                            f"number") from None


def _outcome(rec: Mapping[str, Any]) -> str:
    return f"ok, {rec['time_us']:g} us" if rec["status"] == OK else str(rec["status"])


def _same_outcome(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a[f] == b[f] for f in ("status", "time_us", "p20_us", "p80_us"))


def _conflict(where: str, first: str, second: str, key: str, a: Mapping[str, Any], b: Mapping[str, Any]
              ) -> SchedlibError:
    return SchedlibError(f"replay recording {where}: {first} and {second} are the same config {key} with "
                         f"different outcomes ({_outcome(a)} vs {_outcome(b)}); keep only the one to replay")


def _check_status(status: Any, where: str, i: int) -> None:
    if not isinstance(status, str):
        raise SchedlibError(f"replay recording {where}: record {i}: status={status!r} is not a string")
    if status not in STATUSES:
        raise SchedlibError(f"replay recording {where}: record {i}: status={status!r} is not a known status; "
                            f"expected one of {sorted(STATUSES)}")


def _normalize(records: Sequence[Mapping[str, Any]], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    first: dict[str, tuple[int, dict[str, Any]]] = {}  # config key -> the first record of that config
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping) or not isinstance(rec.get("config"), Mapping):
            raise SchedlibError(f"replay recording {where}: record {i} has no 'config' object")
        config = {str(k): v for k, v in rec["config"].items()}
        gaps = [k for k, v in config.items() if _blank(v)]
        if gaps:
            raise SchedlibError(f"replay recording {where}: record {i} has no value for knob(s) {gaps}")
        time_field = "time_us" if "time_us" in rec else "time"
        t = _field_number(rec, time_field, math.inf, where, i, config)
        p20 = _field_number(rec, "p20_us", t, where, i, config)  # a recording without percentiles: the median
        p80 = _field_number(rec, "p80_us", t, where, i, config)
        status = rec.get("status") or (OK if math.isfinite(t) else "error")
        _check_status(status, where, i)
        if status == OK and not math.isfinite(t):
            raise SchedlibError(f"replay recording {where}: record {i} is ok but has no positive time")
        entry = {"config": {k: _scalar(v) for k, v in config.items()}, "time_us": t, "status": status,
                 "p20_us": p20, "p80_us": p80}
        key = config_key(entry["config"])
        if key in first:
            j, earlier = first[key]
            if not _same_outcome(earlier, entry):
                raise _conflict(where, f"records {j}", f"{i}", key, earlier, entry)
            continue  # the same measurement twice: one record
        first[key] = (i, entry)
        out.append(entry)
    return out


def _read_csv(path: Path) -> list[dict[str, Any]]:
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)  # text in: each row is typed on its own
    except pd.errors.EmptyDataError:
        raise SchedlibError(f"replay recording {path} is empty (expected a header row and records)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
        raise SchedlibError(f"replay recording {path} is not a readable CSV file "
                            f"({type(exc).__name__}: {str(exc).strip()[:200]})") from None
    time_col = "time_us" if "time_us" in frame else "time" if "time" in frame else None
    if time_col is None:
        raise SchedlibError(f"replay recording {path}: CSV needs a time_us (or time) column")
    knobs = [c for c in frame.columns if c not in ("time_us", "time", "status", "p20_us", "p80_us")]
    records = []
    for row in frame.to_dict("records"):
        if all(_blank(row[k]) for k in knobs):
            continue  # a blank line (or one with nothing but a time) is no record
        status = row.get("status", "").strip() or None
        records.append({"config": {k: row[k] for k in knobs}, "time_us": row[time_col], "status": status})
    if not records:
        raise SchedlibError(f"replay recording {path} holds no records")
    return records


def read_recording(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a JSON or CSV recording into ``{"meta": {...}, "records": [...]}`` (never unpickles)."""
    path = Path(path)
    if path.is_dir():
        raise SchedlibError(f"replay recording {path} is a directory; give a .json or .csv recording file")
    if not path.is_file():
        raise SchedlibError(f"replay recording {path} does not exist")
    if path.suffix.lower() == ".csv":
        return {"meta": {}, "records": _normalize(_read_csv(path), str(path))}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SchedlibError(f"replay recording {path} is not valid JSON ({exc})") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise SchedlibError(f"replay recording {path} cannot be read as UTF-8 JSON ({exc})") from None
    except RecursionError:  # brackets nested thousands deep exhaust json's recursion before any record is read
        raise SchedlibError(f"replay recording {path} is not a usable JSON recording: it is nested too deeply "
                            f"to read (records are objects a few levels deep)") from None
    if isinstance(data, list):
        return {"meta": {}, "records": _normalize(data, str(path))}
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise SchedlibError(f"replay recording {path}: expected a list of records or an object with 'records'")
    meta = {k: v for k, v in data.items() if k != "records"}
    return {"meta": meta, "records": _normalize(data["records"], str(path))}


def write_recording(path: str | os.PathLike[str], records: Sequence[Mapping[str, Any]], *,
                    func: Func | None = None, device: str | None = None, origin: str = "") -> Path:
    """Save ``[{"config", "time_us", "status"}, ...]`` (or the ``records`` frame ``tune`` returns) as a JSON
    recording tied to ``func`` (when given)."""
    if isinstance(records, pd.DataFrame):
        records = records.to_dict("records")
    path = Path(path)
    meta: dict[str, Any] = {"format": FORMAT, "origin": origin}
    if func is not None:
        meta.update(workload_hash=workload_hash(func), signature=signature(func))
    if device is not None:
        meta["device"] = device
    rows = []
    for i, r in enumerate(records):
        t = _number(r.get("time_us"))
        status = r.get("status") or (OK if math.isfinite(t) else "error")
        if status not in STATUSES:  # read_recording would refuse the file: refuse to write it
            raise ValueError(f"write_recording: record {i}: status={status!r} is not a known status; expected one "
                             f"of {sorted(STATUSES)}")
        if status == OK and not math.isfinite(t):
            raise ValueError(f"write_recording: record {i} is ok but has no finite positive time_us")
        rows.append({"config": plain_config(r["config"]), "time_us": t if math.isfinite(t) else None,
                     "status": status})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "records": rows}, indent=None, separators=(",", ":")))
    return path


class ReplayBackend(Backend):
    """Answers each config with its recorded time; a config the recording lacks is a ``not_recorded`` failure.

    ``source`` is a path, or records in memory (``[{"config", "time_us"}]`` or a frame with those columns);
    ``delay_s`` sleeps per measurement to simulate measuring time (for kill/resume and concurrency tests).
    """

    name = "replay"

    def __init__(self, source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | pd.DataFrame, *,
                 delay_s: float = 0.0) -> None:
        if isinstance(source, (str, os.PathLike)):
            loaded = read_recording(source)
            self.where = str(source)
        else:
            rows = source.to_dict("records") if isinstance(source, pd.DataFrame) else list(source)
            loaded = {"meta": {}, "records": _normalize(rows, "<in memory>")}
            self.where = "<in memory>"
        self.meta: dict[str, Any] = loaded["meta"]
        self.table = {config_key(r["config"]): r for r in loaded["records"]}
        self.delay_s = delay_s
        digest = content_hash(*sorted(f"{k}={r['time_us']}:{r['status']}" for k, r in self.table.items()))
        self._key = f"replay-{digest[:12]}"

    @property
    def key(self) -> str:
        return self._key

    @property
    def best(self) -> tuple[Config, float]:
        """The recording's fastest ok config and its time (the known optimum of the recorded space)."""
        ok = [r for r in self.table.values() if r["status"] == OK]
        if not ok:
            raise SchedlibError(f"replay recording {self.where} has no successful record")
        best = min(ok, key=lambda r: r["time_us"])
        return dict(best["config"]), float(best["time_us"])

    def open(self, func: Func, target: Any, rule: Rule) -> None:
        recorded = self.meta.get("workload_hash")
        if recorded is not None and recorded != workload_hash(func):
            raise SchedlibError(f"replay recording {self.where} was made for "
                                f"{self.meta.get('signature', recorded)}, not for {signature(func)}")
        device = self.meta.get("device")
        known = {str(n).lower() for n in (getattr(target, "key", None), getattr(target, "name", None),
                                          *getattr(target, "aliases", ())) if n}
        if device is not None and known and str(device).lower() not in known:
            # times from one card are not the timings of another: the study is keyed by the target
            raise SchedlibError(f"replay recording {self.where} was measured on {device}, not on "
                                f"{getattr(target, 'key', target)}; tune with --target {device} (target={device!r})")
        space = rule.space(func, target)
        names = set(space.names)
        some = next(iter(self.table.values()), None)
        if some is not None and set(some["config"]) != names:
            raise SchedlibError(f"replay recording {self.where} has knobs {sorted(some['config'])}; the "
                                f"{rule.name} space has {sorted(names)}")
        # text knobs whose values look like numbers ("4") were read as numbers: give them the space's values
        spelled = {k.name: {str(v): v for v in k.values} for k in space.knobs}
        table: dict[str, dict[str, Any]] = {}
        read_as: dict[str, str] = {}  # config key in the space's spelling -> the key as read
        for old_key, rec in self.table.items():
            rec["config"] = {k: v if v in spelled.get(k, {}).values() else spelled.get(k, {}).get(str(v), v)
                             for k, v in rec["config"].items()}
            key = config_key(rec["config"])
            if key in table:  # e.g. a tuple knob spelled [1, 2] and "(1, 2)": two configs as read, one here
                if not _same_outcome(table[key], rec):
                    raise _conflict(self.where, f"the records of {read_as[key]}", old_key, key, table[key], rec)
                continue
            table[key], read_as[key] = rec, old_key
        self.table = table

    def measure(self, config: Config, schedule: Schedule | None) -> Measurement:
        start = time.perf_counter()
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        rec = self.table.get(config_key(config))
        wall = time.perf_counter() - start
        if rec is None:
            return Measurement.failure("not_recorded", None, f"{self.where} has no record of {config}", wall)
        if rec["status"] != OK:
            status = rec["status"] if rec["status"] in MEASURED_FAILURES else "error"
            return Measurement.failure(status, None, f"recorded as {rec['status']}", wall)
        return Measurement(OK, rec["time_us"], rec["p20_us"], rec["p80_us"], wall_s=wall)
