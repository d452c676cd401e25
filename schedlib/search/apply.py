"""``sl.search.apply_best``: the best recorded schedule for this exact workload, with no search.

It refuses rather than guesses: no record for this shape, device and schedlib version means an error that
lists what *is* recorded, never the best config of a neighbouring shape (tilelang issue #1250: a config
tuned for one shape silently reused for another).
"""

from __future__ import annotations

from typing import Any

import optuna

from schedlib.hw import resolve
from schedlib.ir.func import Func, require_func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Rule
from schedlib.search.checks import pick_rule
from schedlib.search.database import (
    NoRecordError,
    best_record,
    find_studies,
    resolve_storage,
    signature,
    space_digest,
    storage_errors,
    storage_label,
)


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
    for key in matches:
        with storage_errors(label):
            study = optuna.load_study(study_name=key.study_name, storage=store)
        if study.user_attrs.get("func_text") not in (None, str(func)):
            continue  # a hash collision: never reuse another func's record
        best = best_record(study, space)  # records outside the current space are skipped, with a warning
        if best is not None:
            schedule = chosen.apply(func, profile, best.config)
            if schedule is None:
                raise NoRecordError(f"apply_best: rule {chosen.name} no longer applies to {func.name}")
            return schedule
    raise NoRecordError(f"apply_best: {signature(func)} on {profile.key} has records in {label} "
                        f"({', '.join(k.backend for k in matches)}) but none succeeded")


def _version() -> str:
    import schedlib

    return schedlib.__version__
