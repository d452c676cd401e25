"""``sl.search.tune``: measured search over a rule's knob space, resumable and shareable between workers.

One loop for every strategy (:mod:`schedlib.search.loop`).  Each step, under the study lock: refresh what all
workers recorded, stop if the study holds ``trials`` records (or the space is exhausted: every legal config is
recorded, which ends the call with a warning), ask the strategy for a config through the study, and claim it
(its key goes on the running trial, so no other worker proposes it).  Then, without the lock, build and
measure it and record the outcome on the trial.  Why the study is the only state: a process killed with
SIGKILL loses at most the trial it was measuring, a rerun of the same call continues where it stopped, and
any number of processes can tune one study through a shared storage.

``trials`` is the size the study should reach (records that used the budget: successes and measured
failures, over all sessions and workers), not the number of new measurements of this call.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna
import pandas as pd
from tqdm.auto import tqdm

from schedlib.hw import HardwareProfile, resolve
from schedlib.ir.func import Func, require_func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Rule
from schedlib.search.apply import build_best
from schedlib.search.backends import Backend, make_backend
from schedlib.search.checks import pick_rule
from schedlib.search.codec import SpaceCodec
from schedlib.search.cost_model import CostModel, Featurizer, informative, with_rule
from schedlib.search.database import (
    StudyLock,
    TuningKey,
    open_study,
    ranked_records,
    reap_interrupted,
    resolve_storage,
    space_digest,
    storage_errors,
    storage_label,
)
from schedlib.search.loop import Tuner
from schedlib.search.records import OK, RESERVED_COLUMNS, history_series, records_frame, trial_rows
from schedlib.search.strategies import STRATEGIES, GuidedSampler, make_strategy

log = logging.getLogger("schedlib.search")
DEFAULT_TIMEOUT_S = 30.0  # per measurement, compile included (subprocess backends only)
MODEL_MIN_TRAIN = 4  # records before the cost model starts screening (see benchmarks/search_strategies.py)


@dataclass
class TuneResult:
    """What a tuning call found.  ``records`` has one row per measured (or illegal) config of the whole
    study, ``history`` the best-so-far time by budget-counting trial, ``cost_model`` the trained model (None
    while the study holds fewer than ``MODEL_MIN_TRAIN`` informative measured records)."""

    best_config: Config | None
    best_schedule: Schedule | None
    best_time_us: float
    records: pd.DataFrame
    history: pd.Series
    cost_model: CostModel | None
    key: TuningKey
    strategy: str
    study: optuna.Study = field(repr=False)
    knobs: list[str] = field(default_factory=list)
    measured_now: int = 0  # measurements made by this call
    exhausted: bool = False  # stopped short of ``trials``: every legal config of the space is recorded

    @property
    def trials(self) -> pd.DataFrame:
        """Every trial of the study, bookkeeping ones (cached, duplicate, interrupted) included."""
        return pd.DataFrame(trial_rows(self.study.get_trials(deepcopy=False), self.knobs))

    def summary(self) -> str:
        ok = int((self.records["status"] == OK).sum()) if len(self.records) else 0
        return (f"{self.key.rule} {self.key.workload[:8]} on {self.key.device} [{self.strategy}, "
                f"{self.key.backend}]: best {self.best_time_us:.3f} us with {self.best_config} "
                f"({ok} ok of {len(self.records)} records, {self.measured_now} measured now"
                f"{'; space exhausted' if self.exhausted else ''})")


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(level)


def _warm_start(study: optuna.Study, func: Func, profile: HardwareProfile, rule: Rule, codec: SpaceCodec,
                taken: set[str], topk: int) -> None:
    """Enqueue the rule's default and the carver's top-k (when importable) ahead of any strategy."""
    configs: list[tuple[Config, str]] = [(rule.default_config(func, profile), "default")]
    if topk > 0:
        try:
            from schedlib.carver import carve
        except ImportError:
            carve = None
        if carve is not None:
            try:
                table = with_rule(carve, rule)(func, profile, topk=topk)
                configs += [(dict(c), "carver") for c in list(table["config"])[:topk]]
            except Exception as exc:  # the carver is advice; tuning goes on without it
                log.warning("carver warm start failed (%s: %s); starting from the rule default only",
                            type(exc).__name__, exc)
    for config, source in configs:
        key = codec.key(config)
        if key in taken or not codec.space.is_legal(config):
            continue
        taken.add(key)
        study.enqueue_trial(codec.encode(config), user_attrs={"source": source}, skip_if_exists=True)


def _check_counts(**counts: Any) -> None:
    """Counts that may be 0 (``topk=0``: no carver warm start; ``screen=0``: no screening), or None where the
    default applies: a bool, a float or a negative number is a mistake, not a request."""
    for name, value in counts.items():
        if value is None and name == "screen":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"tune: {name}={value!r}; expected an int >= 0")
        if name == "seed" and value >= 2**32:  # numpy's (and so TPE's) limit, checked for every strategy alike
            raise ValueError(f"tune: seed={value!r}; expected an int with 0 <= seed < 2**32")



def _positive_real(value: Any, message: str) -> float:
    """``value`` as a float when it is a finite number > 0 (a numpy float or integer read from a record or a
    DataFrame included; a bool, numpy's too, is no number here), else ValueError(message)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(message)
    return float(value)

def tune(func: Func, target: Any = "h100", trials: int = 64, strategy: str = "tpe", storage: Any = None,
         backend: str | Backend = "estimate", *, seed: int = 0, quiet: bool = False, warm_start: bool = True,
         timeout_per_trial: float | None = None, rule: Rule | str | None = None, screen: int | None = None,
         topk: int = 8, features: str = "auto", stop_below_us: float | None = None,
         rebenchmark_top: int = 3, replay: str | os.PathLike[str] | None = None,
         model_objective: str = "rank") -> TuneResult:
    """Search the knob space of the rule that takes ``func`` until the study holds ``trials`` records.

    strategy: one of ``tpe``, ``cmaes``, ``nsga2``, ``random``, ``grid``, ``evolutionary``.
    storage: see :mod:`schedlib.search.database` (default: SQLite in the per-user cache).
    backend: ``"estimate"`` (carver), ``"gpu"``, ``"replay:<file>"`` (or ``"replay"`` with ``replay=<file>``)
        or a :class:`Backend`.
    warm_start: enqueue the rule default and the carver's ``topk`` first.
    timeout_per_trial: seconds before a measurement counts as hung.  A worker backend (``gpu``, any
        :class:`SubprocessBackend`; default 30 s) kills the worker, records a ``timeout`` and goes on.  Any
        other backend runs in this process, and only when this is given, under a watchdog thread: a call past
        the limit is recorded as a ``timeout`` and tuning stops with :class:`InProcessTimeoutError`, because a
        thread cannot be stopped (see :mod:`schedlib.search.guard`).
    screen: candidates drawn per trial for cost-model screening (tpe/nsga2 default 16; 0 turns it off).
    features: ``"auto"`` (knobs, tiling and carver figures when importable) or ``"knobs"`` (no carver).
    stop_below_us: stop as soon as a config this fast is recorded.
    model_objective: the cost model's XGBoost objective, ``"rank"`` (pairwise ranking; the default, because
        the search only ever asks the model which candidate is fastest) or ``"regression"`` (log-time, for
        a model whose predictions you want to read as times).
    """
    require_func(func, "tune")
    # numpy integers (a count read from a DataFrame) are the ints they hold
    trials, topk, screen, seed, rebenchmark_top = (
        int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
        for v in (trials, topk, screen, seed, rebenchmark_top))
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"tune: trials={trials!r}; expected an int >= 1")
    if timeout_per_trial is not None:
        timeout_per_trial = _positive_real(timeout_per_trial, f"tune: timeout_per_trial={timeout_per_trial!r}; "
                                                              "expected a finite number of seconds > 0")
    if strategy not in STRATEGIES:
        raise ValueError(f"tune: unknown strategy {strategy!r}; expected one of {list(STRATEGIES)}")
    _check_counts(topk=topk, screen=screen, seed=seed, rebenchmark_top=rebenchmark_top)
    if stop_below_us is not None:
        stop_below_us = _positive_real(stop_below_us, f"tune: stop_below_us={stop_below_us!r}; expected a finite "
                                                      "time in microseconds > 0")
    if model_objective not in ("rank", "regression"):
        raise ValueError(f"tune: model_objective={model_objective!r}; expected 'rank' or 'regression'")
    if features not in ("auto", "knobs"):
        raise ValueError(f"tune: features={features!r}; expected 'auto' or 'knobs'")
    profile = resolve(target)
    chosen = pick_rule(func, profile, rule)
    codec = SpaceCodec(chosen.space(func, profile))
    # records has one column per knob beside its own columns: a knob named "status" ended tune() with a
    # TypeError from pandas, one named "source" or "trial" showed the record's value in place of the knob's
    clash = [n for n in codec.names if n in RESERVED_COLUMNS]
    if clash:
        raise ValueError(f"tune: rule {chosen.name} has knob(s) {clash} named like columns of the records table "
                         f"({sorted(RESERVED_COLUMNS)}); rename the knob(s)")
    if replay is not None:
        if backend not in ("replay", "estimate"):  # "estimate" is the default: replay= alone is enough
            raise ValueError(f"tune: replay={os.fspath(replay)!r} goes with backend='replay', not {backend!r}")
        backend = f"replay:{os.fspath(replay)}"
    be = make_backend(backend, DEFAULT_TIMEOUT_S if timeout_per_trial is None else timeout_per_trial)
    if timeout_per_trial is not None and hasattr(be, "timeout_s"):
        be.timeout_s = float(timeout_per_trial)  # an explicit limit also applies to a backend instance
    # without an explicit limit an in-process backend runs inline, exactly as before: no thread per trial
    watchdog_s = float(timeout_per_trial) if timeout_per_trial is not None and not be.enforces_timeout else None
    key = TuningKey.for_workload(func, profile.key, chosen.name, be.study_key(profile), space_digest(codec.space))
    store, lock_path = resolve_storage(storage)
    strat = make_strategy(strategy, seed, screen)
    # The model starts screening after MODEL_MIN_TRAIN records: a rough ranking beats none so early.
    model = CostModel(Featurizer(func, profile, chosen, codec.space, carver="auto" if features == "auto" else False),
                      objective=model_objective, min_train=MODEL_MIN_TRAIN, seed=seed)
    with _quiet_optuna():
        study = open_study(store, key, func, GuidedSampler(strat))
        tuner = Tuner(func, profile, chosen, be, strat, study, codec, model, StudyLock(lock_path), seed,
                       stale_s=max(3600.0, 20 * float(getattr(be, "timeout_s", DEFAULT_TIMEOUT_S))),
                       watchdog_s=watchdog_s)
        with tuner.lock.hold():
            with storage_errors(storage_label(store)):  # the first full read of a study named in no error
                reap_interrupted(study, tuner.stale_s, claims_locked=tuner.lock.cross_process)
            tuner.index.refresh()
            if warm_start:
                _warm_start(study, func, profile, chosen, codec, tuner.index.taken(), topk)
        bar = tqdm(total=trials, initial=min(tuner.index.counted, trials), disable=quiet, unit="trial",
                   desc=f"tune {func.name} [{strategy}]", dynamic_ncols=True)
        try:
            tuner.index.refresh()
            if tuner.index.counted < trials:
                be.open(func, profile, chosen)
                tuner.run(trials, bar, stop_below_us)
                if rebenchmark_top > 0 and tuner.measured_now:
                    tuner.rebenchmark(rebenchmark_top)
        except BaseException:
            tuner.abandon_current()
            raise
        finally:
            be.close()
            bar.close()
        return _result(tuner, strategy, key)


def _result(tuner: Tuner, strategy: str, key: TuningKey) -> TuneResult:
    study, codec = tuner.study, tuner.codec
    tuner.index.refresh()
    measured = informative(tuner.index.measured())
    # the model counts as trained from min_train records on (CostModel.predict says so, and update never
    # trains on fewer): a fit on two records would be exposed as a model it is not
    if len(measured) >= tuner.model.min_train and tuner.model.n_train != len(measured):
        tuner.model.fit([r.config for r in measured],
                        [r.time_us if r.status == OK else math.inf for r in measured])
    records = records_frame(study.get_trials(deepcopy=False), codec.names)
    where = f"tune {tuner.func.name}"
    built = build_best(tuner.rule, tuner.func, tuner.profile, ranked_records(study, codec.space), where)
    best, schedule = built if built is not None else (None, None)
    best_config = dict(best.config) if best else None
    best_time = best.time_us if best else math.inf  # the re-benchmarked time where there is one
    if best is None:
        log.warning("tune: no config of %s succeeded that the rule %s can build (%d records)", tuner.func.name,
                    tuner.rule.name, len(records))
    return TuneResult(best_config, schedule, best_time, records, history_series(records),
                      tuner.model if tuner.model.trained else None, key, strategy, study, list(codec.names),
                      tuner.measured_now, tuner.exhausted)
