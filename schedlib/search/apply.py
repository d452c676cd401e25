"""``sl.search.apply_best``: the best recorded schedule for this exact workload, with no search.

It refuses rather than guesses: no record for this shape, device and schedlib version means an error that
lists what *is* recorded, never the best config of a neighbouring shape (tilelang issue #1250: a config
tuned for one shape silently reused for another).
"""

from __future__ import annotations

import logging
from typing import Any

import optuna

from schedlib.hw import HardwareProfile, resolve
from schedlib.ir.func import Func, require_func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Rule
from schedlib.search.checks import pick_rule
from schedlib.search.database import (
    NoRecordError,
    Record,
    find_studies,
    func_mismatch,
    ranked_records,
    resolve_storage,
    signature,
    space_digest,
    storage_errors,
    storage_label,
)

log = logging.getLogger("schedlib.search")


def build_best(rule: Rule, func: Func, profile: HardwareProfile, ranked: list[Record], where: str
               ) -> tuple[Record, Schedule | None] | None:
    """The first of ``ranked`` (ok records, fastest first) whose config ``rule`` can build, with its schedule.

    Why a fallback: backends that need no schedule (estimate, replay) never build one while searching, so a
    record can be fast and unbuildable.  Each such record is skipped with a warning naming it; a finished
    trial cannot be re-marked in Optuna, so the skip is repeated (it is cheap) on every call.
    """
    for record in ranked:
        try:
            return record, rule.apply(func, profile, record.config)
        except Exception as exc:
            log.warning("%s: the rule %s cannot build the recorded config %s of trial %d (%.3f us; %s: %s); "
                        "falling back to the next best record", where, rule.name, record.config, record.number,
                        record.time_us, type(exc).__name__, exc)
    return None


def apply_best(func: Func, target: Any = "h100", storage: Any = None, *, rule: Rule | str | None = None,
               backend: str | None = None) -> Schedule:
    """The recorded best Schedule of ``func`` on ``target``; :class:`NoRecordError` when there is none.

    backend: restrict to one backend (``"gpu"``, ``"estimate"``, a key like ``"replay-..."``); by default GPU
    measurements are preferred over replayed ones, and those over estimates.
    """
    require_func(func, "apply_best")
    profile = resolve(target)
    chosen = pick_rule(func, profile, rule)
    space = chosen.space(func, profile)
    store, _ = resolve_storage(storage, create=False)
    label = storage_label(store)
    matches, others = find_studies(store, func, profile, chosen.name, space_digest(space))
    if backend is not None:  # "estimate" names every estimate study; only this profile's numbers match
        matches = [k for k in matches if backend in (k.backend, k.backend_kind())]
    if not matches:
        listing = "; ".join(others[:8]) + (f"; ... ({len(others) - 8} more)" if len(others) > 8 else "")
        raise NoRecordError(
            f"apply_best: no tuning record for {signature(func)} on {profile.key} with schedlib "
            f"{_version()}{f' from backend {backend}' if backend else ''} "
            f"in {storage or 'the default storage'}; a record for another shape, target or schedlib version is "
            f"never reused. Recorded for rule {chosen.name}: {listing or 'nothing'}. Run sl.search.tune(...) "
            f"for this shape and target.")
    mismatches: dict[str, str] = {}  # study name -> why it records another func
    for key in matches:
        with storage_errors(label):
            study = optuna.load_study(study_name=key.study_name, storage=store)
            mismatch = func_mismatch(study, func, label)
        if mismatch is not None:  # a hash collision: never reuse another func's record, and say so as tune does
            mismatches[key.study_name] = mismatch
            continue
        ranked = ranked_records(study, space)  # records outside the current space are skipped, with a warning
        built = build_best(chosen, func, profile, ranked, f"apply_best ({key.backend} records in {label})")
        if built is not None:
            if built[1] is None:
                raise NoRecordError(f"apply_best: rule {chosen.name} no longer applies to {func.name}")
            return built[1]
    usable = [k.backend for k in matches if k.study_name not in mismatches]
    if not usable:  # every study found is another func's: that, not "nothing buildable", is the reason
        raise NoRecordError(f"apply_best: {next(iter(mismatches.values()))}")
    raise NoRecordError(f"apply_best: {signature(func)} on {profile.key} has records in {label} "
                        f"({', '.join(usable)}) but none succeeded that rule {chosen.name} can build"
                        + "".join(f"; {m}" for m in mismatches.values()))


def _version() -> str:
    import schedlib

    return schedlib.__version__
