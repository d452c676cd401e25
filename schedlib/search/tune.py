"""``sl.search.tune``: measured search over a rule's knob space, resumable and shareable between workers.

One loop for every strategy.  Each step, under the study lock: refresh what all workers recorded, stop if
the study holds ``trials`` records (or the space is exhausted), ask the strategy for a config through the
study, and claim it (its key goes on the running trial, so no other worker proposes it).  Then, without
the lock, build and measure it and record the outcome on the trial.  Why the study is the only state: a
process killed with SIGKILL loses at most the trial it was measuring, a rerun of the same call continues
where it stopped, and any number of processes can tune one study through a shared storage.

``trials`` is the size the study should reach (records that used the budget: successes and measured
failures, over all sessions and workers), not the number of new measurements of this call.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState
from tqdm.auto import tqdm

from schedlib.hw import HardwareProfile, resolve
from schedlib.ir.func import Func, require_func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Rule
from schedlib.search.backends import Backend, make_backend
from schedlib.search.checks import pick_rule
from schedlib.search.codec import SpaceCodec
from schedlib.search.cost_model import CostModel, Featurizer, informative, with_rule
from schedlib.search.database import (
    ATTR,
    RecordIndex,
    StudyLock,
    TuningKey,
    best_record,
    open_study,
    reap_interrupted,
    rebench_times,
    resolve_storage,
    space_digest,
    storage_errors,
    storage_label,
    worker_id,
)
from schedlib.search.records import (
    CACHED,
    DUPLICATE,
    ILLEGAL,
    INTERRUPTED,
    OK,
    Measurement,
    history_series,
    records_frame,
    trial_rows,
)
from schedlib.search.strategies import STRATEGIES, GuidedSampler, SearchContext, Strategy, make_strategy

log = logging.getLogger("schedlib.search")
DEFAULT_TIMEOUT_S = 30.0  # per measurement, compile included (subprocess backends only)
MODEL_MIN_TRAIN = 4  # records before the cost model starts screening (see benchmarks/search_strategies.py)
STUCK_LIMIT = 25  # non-measuring proposals in a row before the tuner injects a random untried config


@dataclass
class TuneResult:
    """What a tuning call found.  ``records`` has one row per measured (or illegal) config of the whole
    study, ``history`` the best-so-far time by budget-counting trial, ``cost_model`` the trained model."""

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

    @property
    def trials(self) -> pd.DataFrame:
        """Every trial of the study, bookkeeping ones (cached, duplicate, interrupted) included."""
        return pd.DataFrame(trial_rows(self.study.get_trials(deepcopy=False), self.knobs))

    def summary(self) -> str:
        ok = int((self.records["status"] == OK).sum()) if len(self.records) else 0
        return (f"{self.key.rule} {self.key.workload[:8]} on {self.key.device} [{self.strategy}, "
                f"{self.key.backend}]: best {self.best_time_us:.3f} us with {self.best_config} "
                f"({ok} ok of {len(self.records)} records, {self.measured_now} measured now)")


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


class _Tuner:
    """One tuning call's state; ``run`` is the loop described in the module docstring."""

    def __init__(self, func: Func, profile: HardwareProfile, rule: Rule, backend: Backend, strategy: Strategy,
                 study: optuna.Study, codec: SpaceCodec, model: CostModel, lock: StudyLock, seed: int,
                 stale_s: float) -> None:
        self.func, self.profile, self.rule, self.backend = func, profile, rule, backend
        self.strategy, self.study, self.codec, self.model, self.lock = strategy, study, codec, model, lock
        self.index = RecordIndex(study, codec.space)
        self.ctx = SearchContext(codec, self.index, model if strategy.uses_model else None, random.Random(seed))
        strategy.bind(self.ctx)
        self.worker = worker_id()
        self.stale_s = stale_s
        self.legal_keys = {codec.key(c) for c in codec.legal()} if codec.enumerable else None
        self.measured_now = 0
        self._claims: dict[int, dict[str, Any]] = {}
        self._current: optuna.trial.Trial | None = None

    def _tell(self, trial: optuna.trial.Trial, attrs: dict[str, Any], value: float | None) -> None:
        self._current = None
        try:
            trial.set_user_attr(ATTR, {**self._claims.pop(trial.number, {}), **attrs})
            if value is not None and math.isfinite(value):
                self.study.tell(trial, value)
            else:
                self.study.tell(trial, state=TrialState.FAIL)
        except (RuntimeError, ValueError) as exc:  # another worker judged the trial stale and closed it
            log.warning("trial %d was closed by another worker before it finished (%s); its result is dropped",
                        trial.number, exc)

    def _claim(self, trials: int, stop_below_us: float | None) -> tuple[optuna.trial.Trial, Config] | None:
        """Under the lock: None when done, else the asked trial with its claimed config."""
        index = self.index
        index.refresh()
        if index.counted + index.n_running() >= trials:
            return None
        if self.legal_keys is not None and self.legal_keys <= index.taken():
            return None
        best = index.best()
        if stop_below_us is not None and best is not None and best.time_us <= stop_below_us:
            return None
        trial = self.study.ask(self.codec.distributions)
        self._current = trial
        config = self.codec.decode(trial.params)
        source = trial.user_attrs.get("source") or self.ctx.sources.pop(trial.number, self.strategy.name)
        claim = {"config": config, "config_key": self.codec.key(config), "source": source, "worker": self.worker,
                 "backend": self.backend.key}
        self._claims[trial.number] = claim
        trial.set_user_attr(ATTR, claim)  # the key is now visible to every worker: the config is claimed
        return trial, config

    def _settle_known(self, trial: optuna.trial.Trial, config: Config) -> bool:
        """Close a trial that needs no measurement (illegal, recorded, claimed elsewhere); True if closed."""
        key = self.codec.key(config)
        known = self.index.by_key.get(key)
        if known is not None:
            self._tell(trial, {"status": CACHED, "time_us": known.time_us if known.status == OK else None},
                       known.time_us if known.status == OK else None)
            return True
        why = self.codec.space.reason(config)
        if why is not None:
            self._tell(trial, {"status": ILLEGAL, "error_type": "IllegalConfig", "error": why}, None)
            return True
        if self.lock.cross_process:
            return False  # claims are made under an flock: nobody can have claimed this key meanwhile
        self.index.refresh()  # no lock across processes (a remote database): the lower trial number wins
        if any(k == key and n < trial.number for n, k in self.index.running.items()):
            self._tell(trial, {"status": DUPLICATE}, None)
            return True
        return False

    def _measure(self, config: Config) -> Measurement:
        schedule = None
        if self.backend.needs_schedule:
            start = time.perf_counter()
            try:
                schedule = self.rule.apply(self.func, self.profile, config)
            except Exception as exc:  # a rule that cannot build a legal config is a typed failure
                return Measurement.failure("schedule_error", type(exc).__name__, str(exc),
                                           time.perf_counter() - start)
        return self.backend.measure(config, schedule)

    def run(self, trials: int, pbar: Any, stop_below_us: float | None) -> None:
        stuck, step_start = 0, time.perf_counter()
        while True:
            if self.strategy.uses_model:
                self.model.update(self.index.measured())
            with self.lock.hold():
                claimed = self._claim(trials, stop_below_us)
                if claimed is None:
                    return
                trial, config = claimed
                settled = self._settle_known(trial, config)
            if settled:
                stuck += 1
                if stuck >= STUCK_LIMIT:
                    self.ctx.force_fill, stuck = True, 0
                continue
            stuck = 0
            measure_start = time.perf_counter()
            m = self._measure(config)  # building the schedule and kernel counts as measuring
            measure_end = time.perf_counter()
            attrs = m.user_attrs()
            attrs["wall_s"] = round(measure_end - measure_start, 6)
            attrs["overhead_s"] = round(measure_start - step_start, 6)
            self._tell(trial, attrs, m.time_us if m.ok else None)
            self.index.note(trial.number, m.status, m.time_us, config, self.codec.key(config))
            self.measured_now += 1
            step_start = time.perf_counter()
            best = self.index.best()
            pbar.update(max(0, min(self.index.counted, trials) - pbar.n))
            pbar.set_postfix_str(f"best {best.time_us:.2f} us" if best else f"last {m.status}")

    def abandon_current(self) -> None:
        """Mark the trial being measured as interrupted (Ctrl-C, an exception): it may be measured again."""
        if self._current is not None:
            with contextlib.suppress(Exception):
                self._tell(self._current, {"status": INTERRUPTED}, None)

    def rebenchmark(self, top: int) -> None:
        best = sorted((r for r in self.index.by_key.values() if r.status == OK), key=lambda r: r.time_us)[:top]
        if not best:
            return
        items = []
        for r in best:
            schedule = self.rule.apply(self.func, self.profile, r.config) if self.backend.needs_schedule else None
            items.append((r.config, schedule))
        results = self.backend.rebenchmark(items)
        for (config, _), m in zip(items, results or []):
            self.study.set_user_attr(f"rebench:{self.codec.key(config)}", m.user_attrs())


def _check_counts(**counts: Any) -> None:
    """Counts that may be 0 (``topk=0``: no carver warm start; ``screen=0``: no screening), or None where the
    default applies: a bool, a float or a negative number is a mistake, not a request."""
    for name, value in counts.items():
        if value is None and name == "screen":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"tune: {name}={value!r}; expected an int >= 0")


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
    timeout_per_trial: seconds before a measurement counts as hung (worker backends; default 30).
    screen: candidates drawn per trial for cost-model screening (tpe/nsga2 default 16; 0 turns it off).
    features: ``"auto"`` (knobs, tiling and carver figures when importable) or ``"knobs"`` (no carver).
    stop_below_us: stop as soon as a config this fast is recorded.
    model_objective: the cost model's XGBoost objective, ``"rank"`` (pairwise ranking; the default, because
        the search only ever asks the model which candidate is fastest) or ``"regression"`` (log-time, for
        a model whose predictions you want to read as times).
    """
    require_func(func, "tune")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"tune: trials={trials!r}; expected an int >= 1")
    if timeout_per_trial is not None and (isinstance(timeout_per_trial, bool)
                                          or not isinstance(timeout_per_trial, (int, float))
                                          or not 0 < timeout_per_trial < math.inf):
        raise ValueError(f"tune: timeout_per_trial={timeout_per_trial!r}; expected a finite number of seconds > 0")
    if strategy not in STRATEGIES:
        raise ValueError(f"tune: unknown strategy {strategy!r}; expected one of {list(STRATEGIES)}")
    _check_counts(topk=topk, screen=screen, seed=seed, rebenchmark_top=rebenchmark_top)
    if stop_below_us is not None and (isinstance(stop_below_us, bool) or not isinstance(stop_below_us, (int, float))
                                      or not 0 < stop_below_us < math.inf):
        raise ValueError(f"tune: stop_below_us={stop_below_us!r}; expected a finite time in microseconds > 0")
    if model_objective not in ("rank", "regression"):
        raise ValueError(f"tune: model_objective={model_objective!r}; expected 'rank' or 'regression'")
    if features not in ("auto", "knobs"):
        raise ValueError(f"tune: features={features!r}; expected 'auto' or 'knobs'")
    profile = resolve(target)
    chosen = pick_rule(func, profile, rule)
    codec = SpaceCodec(chosen.space(func, profile))
    if replay is not None:
        if backend not in ("replay", "estimate"):  # "estimate" is the default: replay= alone is enough
            raise ValueError(f"tune: replay={os.fspath(replay)!r} goes with backend='replay', not {backend!r}")
        backend = f"replay:{os.fspath(replay)}"
    be = make_backend(backend, DEFAULT_TIMEOUT_S if timeout_per_trial is None else timeout_per_trial)
    if timeout_per_trial is not None and hasattr(be, "timeout_s"):
        be.timeout_s = float(timeout_per_trial)  # an explicit limit also applies to a backend instance
    key = TuningKey.for_workload(func, profile.key, chosen.name, be.study_key(profile), space_digest(codec.space))
    store, lock_path = resolve_storage(storage)
    strat = make_strategy(strategy, seed, screen)
    # The model starts screening after MODEL_MIN_TRAIN records: a rough ranking beats none so early.
    model = CostModel(Featurizer(func, profile, chosen, codec.space, carver="auto" if features == "auto" else False),
                      objective=model_objective, min_train=MODEL_MIN_TRAIN, seed=seed)
    with _quiet_optuna():
        study = open_study(store, key, func, GuidedSampler(strat))
        tuner = _Tuner(func, profile, chosen, be, strat, study, codec, model, StudyLock(lock_path), seed,
                       stale_s=max(3600.0, 20 * float(getattr(be, "timeout_s", DEFAULT_TIMEOUT_S))))
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


def _result(tuner: _Tuner, strategy: str, key: TuningKey) -> TuneResult:
    study, codec = tuner.study, tuner.codec
    tuner.index.refresh()
    measured = informative(tuner.index.measured())
    if measured and tuner.model.n_train != len(measured):
        tuner.model.fit([r.config for r in measured],
                        [r.time_us if r.status == OK else math.inf for r in measured])
    records = records_frame(study.get_trials(deepcopy=False), codec.names)
    best = best_record(study, codec.space)
    best_config = dict(best.config) if best else None
    best_time = rebench_times(study).get(codec.key(best.config), best.time_us) if best else math.inf
    schedule = tuner.rule.apply(tuner.func, tuner.profile, best_config) if best_config else None
    if best is None:
        log.warning("tune: no config of %s succeeded (%d records)", tuner.func.name, len(records))
    return TuneResult(best_config, schedule, best_time, records, history_series(records),
                      tuner.model if tuner.model.trained else None, key, strategy, study, list(codec.names),
                      tuner.measured_now)
