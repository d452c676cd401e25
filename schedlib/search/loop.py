"""The tuning loop of :func:`schedlib.search.tune.tune`, one call's state (see that module's docstring).

Each step, under the study lock: refresh what all workers recorded, stop if the study holds ``trials``
records (or the space is used up), ask the strategy for a config through the study and claim it; then,
without the lock, build and measure it (:mod:`schedlib.search.guard`) and record the outcome on the trial.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func
from schedlib.rules.base import Config, Rule
from schedlib.search.backends import Backend
from schedlib.search.codec import SpaceCodec
from schedlib.search.cost_model import CostModel
from schedlib.search.database import ATTR, RecordIndex, StudyLock, reap_interrupted, worker_id
from schedlib.search.guard import HUNG, InProcessTimeoutError, guarded_measure
from schedlib.search.records import CACHED, DUPLICATE, ILLEGAL, INTERRUPTED, OK, Measurement
from schedlib.search.strategies import SearchContext, Strategy

log = logging.getLogger("schedlib.search")
STUCK_LIMIT = 25  # non-measuring proposals in a row before the tuner injects a random untried config
# A space too large to list (codec.SCAN_LIMIT) is taken as used up after this many injections in a row found
# no untried config (each after 64 random legal samples that were all recorded): the loop must end somewhere.
EMPTY_FILL_LIMIT = 4


class Tuner:
    """One tuning call's state; ``run`` is the loop described in the module docstring."""

    def __init__(self, func: Func, profile: HardwareProfile, rule: Rule, backend: Backend, strategy: Strategy,
                 study: optuna.Study, codec: SpaceCodec, model: CostModel, lock: StudyLock, seed: int,
                 stale_s: float, watchdog_s: float | None = None) -> None:
        self.func, self.profile, self.rule, self.backend = func, profile, rule, backend
        self.strategy, self.study, self.codec, self.model, self.lock = strategy, study, codec, model, lock
        self.index = RecordIndex(study, codec.space)
        self.ctx = SearchContext(codec, self.index, model if strategy.uses_model else None, random.Random(seed))
        strategy.bind(self.ctx)
        self.worker = worker_id()
        self.stale_s, self.watchdog_s = stale_s, watchdog_s
        self.legal_keys = {codec.key(c) for c in codec.legal()} if codec.enumerable else None
        self.empty_fills = 0  # forced fills in a row that found nothing (spaces too large to scan)
        self.exhausted = False
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
        if index.counted + index.n_running() >= trials and (index.counted >= trials or not self._reap(trials)):
            return None
        if ((self.legal_keys is not None and self.legal_keys <= index.taken())
                or self.empty_fills >= EMPTY_FILL_LIMIT):
            self._stop_exhausted(trials)
            return None
        best = index.best()
        if stop_below_us is not None and best is not None and best.time_us <= stop_below_us:
            return None
        trial = self.study.ask(self.codec.distributions)
        self._current = trial
        config = self.codec.decode(trial.params)
        source = trial.user_attrs.get("source") or self.ctx.sources.pop(trial.number, self.strategy.name)
        # the claim keeps a copy: what the backend is handed below may be changed in place by it
        claim = {"config": dict(config), "config_key": self.codec.key(config), "source": source, "worker": self.worker,
                 "backend": self.backend.key}
        self._claims[trial.number] = claim
        trial.set_user_attr(ATTR, claim)  # the key is now visible to every worker: the config is claimed
        return trial, config

    def _reap(self, trials: int) -> bool:
        """The budget looks spent only because of running claims: close those whose worker died since the
        start (so a live worker does not stop short); True if any was closed."""
        if not reap_interrupted(self.study, self.stale_s, claims_locked=self.lock.cross_process):
            return False
        self.index.refresh()
        return self.index.counted + self.index.n_running() < trials

    def _stop_exhausted(self, trials: int) -> None:
        self.exhausted = True
        how = ("no untried config was found in repeated random draws (the space is too large to list)"
               if self.legal_keys is None else f"all {len(self.legal_keys)} legal configs are recorded or claimed")
        log.warning("tune: the %s space of %s is exhausted: %s; stopping with %d of the %d trials asked",
                    self.rule.name, self.func.name, how, self.index.counted, trials)

    def _after_stuck(self) -> None:
        """STUCK_LIMIT proposals in a row measured nothing: inject a random untried config next.  When the
        last injection found none, find out whether any is left, so that a used-up space ends the loop."""
        ctx, codec = self.ctx, self.codec
        if ctx.fill_failed and self.legal_keys is None:
            if codec.scannable:  # listed once; from now on _claim's exact check applies and fills are exact
                self.legal_keys = {codec.key(c) for c in codec.scan()}
            else:
                self.empty_fills += 1
        elif not ctx.fill_failed:
            self.empty_fills = 0
        ctx.fill_failed, ctx.force_fill = False, True

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
        # A backend (or rule) may use the config in place, e.g. pop knobs to pass the rest as kernel kwargs.
        # Handed the tuner's own dict, that rewrote the stored record, whose config then no longer matched its
        # key: every record was skipped as malformed and the configs were measured again.  Each gets a copy.
        config = dict(config)
        schedule = None
        if self.backend.needs_schedule:
            start = time.perf_counter()
            try:
                schedule = self.rule.apply(self.func, self.profile, dict(config))
            except Exception as exc:  # a rule that cannot build a legal config is a typed failure
                return Measurement.failure("schedule_error", type(exc).__name__, str(exc),
                                           time.perf_counter() - start)
        return guarded_measure(self.backend, config, schedule, self.watchdog_s)

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
                    self._after_stuck()
                    stuck = 0
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
            if m.error_type == HUNG:  # recorded; see guard.py for why the search cannot go on
                raise InProcessTimeoutError(
                    f"tune: {self.backend!r} did not return from measure({config}) within timeout_per_trial="
                    f"{self.watchdog_s:g} s.  The call runs in this process and cannot be stopped, so tuning "
                    f"stops here; the config is recorded as a timeout and a rerun skips it.  A SubprocessBackend "
                    f"kills a hung measurement and goes on.")

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
            items.append((dict(r.config), schedule))
        # The re-benchmark is a refinement of times already recorded: a user backend whose rebenchmark raises
        # or returns something that is not a Measurement used to end tune() with a traceback after the whole
        # search.  Now the first measurements stand (as for a failed re-benchmark) and a warning says why.
        try:
            results = self._rebenchmark_results(items)
        except Exception as exc:
            log.warning("tune: %r.rebenchmark raised (%s: %s); the first measurements stand", self.backend,
                        type(exc).__name__, exc)
            return
        if results is None:
            log.warning("tune: %r.rebenchmark did not return within timeout_per_trial=%g s per config; the first "
                        "measurements stand", self.backend, self.watchdog_s)
            return
        for r, m in zip(best, results):  # keyed by the record's own config: the backend had copies
            if not isinstance(m, Measurement):
                log.warning("tune: %r.rebenchmark returned %s for %s, not a Measurement; its first measurement "
                            "stands", self.backend, type(m).__name__, r.config)
                continue
            self.study.set_user_attr(f"rebench:{self.codec.key(r.config)}", m.user_attrs())

    def _rebenchmark_results(self, items: list[tuple[Config, Any]]) -> list[Any] | None:
        """``backend.rebenchmark(items)`` as a list; None when it outlived the watchdog.  Why a watchdog here
        too: timeout_per_trial promises that an in-process backend cannot hang tune(), and a rebenchmark that
        hung after the search kept the call (and its result) from ever returning."""
        if self.watchdog_s is None:
            return list(self.backend.rebenchmark(items) or [])
        box: list[Any] = []

        def call() -> None:
            try:
                box.append(list(self.backend.rebenchmark(items) or []))
            except Exception as exc:  # handed to the caller, which warns
                box.append(exc)

        thread = threading.Thread(target=call, name="schedlib-rebenchmark", daemon=True)
        thread.start()
        thread.join(self.watchdog_s * len(items))
        if thread.is_alive() or not box:
            return None
        if isinstance(box[0], Exception):
            raise box[0]
        return box[0]
