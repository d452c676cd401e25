"""The learned cost model: XGBoost on log-time, trained on measured records, used to screen candidates.

Why a model on top of the carver: the carver ranks configs by first principles and is good at the coarse
picture (traffic, waves, occupancy), but real times carry effects it does not model (instruction mix,
bank conflicts, compiler choices).  A tree model fed both the knob values and the carver's figures learns
the correction from a few dozen measurements, and predicting is ~1000x cheaper than measuring - so a
strategy can look at hundreds of candidates and measure only the most promising.

Features of a config: its knob values (ordered values as numbers), what the rule's :class:`Tiling` says it
means (threads, shared memory, registers, tile sizes, number of blocks) and, when ``schedlib.carver`` is
importable, every numeric figure of ``carver.estimate`` (traffic, intensity, occupancy, waves, est time).
Failed measurements train as "twice slower than the slowest success", so the model learns to avoid them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from schedlib.ir.func import Func, const_extent
from schedlib.rules.base import Config, Rule, Space
from schedlib.search.records import OK, config_key

log = logging.getLogger("schedlib.search")

TILING_FEATURES = ("threads", "shared_bytes", "registers", "vector", "stages", "split_k", "tensor_core",
                   "tile_elems", "thread_elems", "step_elems", "blocks", "blocks_per_sm", "wave_efficiency")
UNINFORMATIVE = frozenset({"not_recorded"})
FAILURE_PENALTY = math.log(2.0)  # a failure trains as this much (in log time) slower than the slowest success


def load_estimate(rule: Rule | None = None) -> Any:
    """``schedlib.carver.estimate`` as ``fn(func, target, config)`` (bound to ``rule`` when the carver takes
    a ``rule`` argument), or None when the carver is not importable (yet)."""
    try:
        from schedlib.carver import estimate
    except ImportError:
        return None
    return with_rule(estimate, rule)


def with_rule(fn: Any, rule: Rule | None) -> Any:
    """``fn`` with ``rule=rule`` bound if it accepts that keyword (the carver prices the rule we tune)."""
    import functools
    import inspect

    try:
        takes_rule = "rule" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_rule = False
    return functools.partial(fn, rule=rule) if rule is not None and takes_rule else fn


class Featurizer:
    """Config -> feature vector, cached per config (the carver is called at most once per config)."""

    def __init__(self, func: Func, target: Any, rule: Rule, space: Space, carver: bool | str = "auto") -> None:
        self.func, self.target, self.rule, self.space = func, target, rule, space
        self.knobs = [k for k in space.knobs if len(k.values) > 1]
        self._cache: dict[str, np.ndarray] = {}
        self._estimate = load_estimate(rule) if carver in (True, "auto") else None
        if carver is True and self._estimate is None:
            raise ImportError("features with carver=True need schedlib.carver.estimate, which is not importable")
        main = self._main_axes()
        self._spatial = {a.name: a.extent for a in main if a.kind == "S"} if main else {}
        self.carver_names: list[str] = []
        if self._estimate is not None:
            self.carver_names = self._probe_carver()
        self.names = [*(f"knob:{k.name}" for k in self.knobs), *(f"tiling:{n}" for n in TILING_FEATURES),
                      *(f"carver:{n}" for n in self.carver_names)]

    def _main_axes(self) -> list[Any] | None:
        try:
            default = self.rule.default_config(self.func, self.target)
            tiling = self.rule.tiling(self.func, self.target, default)
            return list(self.func.block(tiling.main_block).axes) if tiling is not None else None
        except Exception:  # a rule without a tiling model simply contributes no tiling features
            return None

    def _probe_carver(self) -> list[str]:
        try:
            figures = self._estimate(self.func, self.target, self.rule.default_config(self.func, self.target))
        except Exception as exc:
            log.warning("carver.estimate failed on the default config (%s: %s); the cost model uses knob and "
                        "tiling features only", type(exc).__name__, exc)
            self._estimate = None
            return []
        return sorted(k for k, v in figures.items() if isinstance(v, (int, float, np.number)))

    def _knob_values(self, config: Mapping[str, Any]) -> list[float]:
        out = []
        for knob in self.knobs:
            value = config[knob.name]
            if isinstance(value, (bool, np.bool_)):
                out.append(float(value))
            elif isinstance(value, (int, float, np.number)):
                out.append(float(value))
            elif value in knob.values:
                out.append(float(knob.values.index(value)))
            else:  # a text value outside the knob's list has no position to encode
                raise ValueError(f"CostModel: knob {knob.name}={value!r} is not one of {list(knob.values)}")
        return out

    def _tiling_values(self, config: Mapping[str, Any]) -> list[float]:
        try:
            t = self.rule.tiling(self.func, self.target, dict(config))
        except Exception:
            t = None
        if t is None:
            return [math.nan] * len(TILING_FEATURES)
        tile = [t.block_tile.get(a, 1) for a in self._spatial]
        blocks = 1.0
        for axis, extent in self._spatial.items():
            size = const_extent(extent)
            blocks *= math.ceil(size / max(t.block_tile.get(axis, 1), 1)) if size is not None else math.nan
        thread_elems = float(np.prod(list(t.thread_tile.values())))
        sms = float(getattr(self.target, "sm_count", 0) or math.nan)
        per_sm = blocks / sms  # blocks per SM over the whole grid; its ceiling is the number of waves
        wave_eff = per_sm / math.ceil(per_sm) if per_sm > 0 else math.nan  # 1.0: the last wave is full
        return [float(t.threads), float(t.shared_bytes), float(t.registers), float(t.vector), float(t.stages),
                float(t.split_k), float(t.tensor_core), float(np.prod(tile)), thread_elems,
                float(np.prod(list(t.step.values()))), blocks, per_sm, wave_eff]

    def _carver_values(self, config: Mapping[str, Any]) -> list[float]:
        if self._estimate is None:
            return []
        try:
            figures = self._estimate(self.func, self.target, dict(config))
        except Exception:
            return [math.nan] * len(self.carver_names)
        return [float(figures[n]) if isinstance(figures.get(n), (int, float, np.number)) else math.nan
                for n in self.carver_names]

    def vector(self, config: Mapping[str, Any]) -> np.ndarray:
        key = config_key(config)
        vec = self._cache.get(key)
        if vec is None:
            vec = np.asarray(self._knob_values(config) + self._tiling_values(config)
                             + self._carver_values(config), dtype=np.float64)
            vec[~np.isfinite(vec)] = np.nan  # XGBoost takes NaN as "missing"; inf would be rejected
            vec = vec.astype(np.float32)
            self._cache[key] = vec
        return vec

    def matrix(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        if not configs:
            return np.zeros((0, len(self.names)), dtype=np.float32)
        return np.stack([self.vector(c) for c in configs])


def informative(records: Sequence[Any]) -> list[Any]:
    """Records that say something about their config (a replay gap, ``not_recorded``, does not)."""
    return [r for r in records if r.status not in UNINFORMATIVE]


def _targets(times_us: Sequence[float]) -> np.ndarray | None:
    t = np.asarray(times_us, dtype=float)
    ok = np.isfinite(t) & (t > 0)
    if not ok.any():
        return None
    y = np.full(t.shape, np.log(t[ok]).max() + FAILURE_PENALTY)
    y[ok] = np.log(t[ok])
    return y


class CostModel:
    """XGBoost on log-time.  ``objective="regression"`` fits log-time (squared error); ``"rank"`` fits a
    pairwise ranking of the same targets.  Lower predictions mean faster configs either way."""

    def __init__(self, featurizer: Featurizer, *, objective: str = "regression", min_train: int = 8,
                 seed: int = 0, n_estimators: int = 100, max_depth: int = 5) -> None:
        if objective not in ("regression", "rank"):
            raise ValueError(f"objective={objective!r}; expected 'regression' or 'rank'")
        self.featurizer, self.objective, self.min_train, self.seed = featurizer, objective, min_train, seed
        # One thread: the data is small (hundreds of rows), and OpenMP threads on a busy machine cost far
        # more in spinning than they save.  64 bins: knob values are few and discrete anyway.
        self.params = {"n_estimators": n_estimators, "max_depth": max_depth, "learning_rate": 0.1,
                       "subsample": 1.0, "min_child_weight": 1.0, "tree_method": "hist", "max_bin": 64,
                       "random_state": seed, "n_jobs": 1}
        self._booster: Any = None
        self.n_train = 0
        self.fits = 0

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def fit(self, configs: Sequence[Mapping[str, Any]], times_us: Sequence[float]) -> CostModel:
        """Train from scratch on measured configs (``inf`` times are failures)."""
        import xgboost

        y = _targets(times_us)
        if y is None or len(configs) < 2:
            return self
        X = self.featurizer.matrix(configs)
        with interrupt_after():
            if self.objective == "regression":
                model = xgboost.XGBRegressor(objective="reg:squarederror", **self.params)
                model.fit(X, y)
            else:
                # "mean" pairs: every record is compared with random others, not only its top-k neighbours
                model = xgboost.XGBRanker(objective="rank:pairwise", lambdarank_pair_method="mean",
                                          lambdarank_num_pair_per_sample=8, **self.params)
                model.fit(X, -y, qid=np.zeros(len(y), dtype=np.int32))
            self._booster, self.n_train = model, len(configs)
            self.fits += 1
        return self

    def update(self, records: Sequence[Any]) -> bool:
        """Retrain when the measured data grew enough since the last fit (amortizes the training cost)."""
        records = informative(records)
        n = len(records)
        if n < self.min_train or (self.trained and n < self.n_train + max(4, 0.15 * self.n_train)):
            return False
        self.fit([r.config for r in records], [r.time_us if r.status == OK else math.inf for r in records])
        return self.trained

    def predict(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Predicted cost per config (log microseconds for ``regression``; lower is better either way)."""
        if self._booster is None:
            raise RuntimeError("the cost model has not been trained yet (needs at least "
                               f"{self.min_train} measured records)")
        if not configs:
            return np.zeros(0)
        self._check_configs(configs)
        with interrupt_after():
            score = self._booster.get_booster().inplace_predict(self.featurizer.matrix(configs))
        return np.asarray(score, dtype=float) if self.objective == "regression" else -np.asarray(score, float)

    def _check_configs(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """A ValueError naming the first config the featurizer cannot read (it would raise a bare KeyError).
        Only the shape is checked: an illegal point of the space is a fine candidate to predict for."""
        space = self.featurizer.space
        for i, config in enumerate(configs):
            if not isinstance(config, Mapping):
                raise ValueError(f"CostModel.predict: config {i} is a {type(config).__name__}, not a mapping of "
                                 f"knob values")
            missing = [k.name for k in space.knobs if k.name not in config]
            if missing:
                extra = sorted(set(map(str, config)) - set(space.names))
                also = f" (it has unknown knob(s) {extra})" if extra else ""
                raise ValueError(f"CostModel.predict: config {i} {dict(config)} lacks knob(s) {missing} of this "
                                 f"model's {space.rule} space{also}")

    def rank_correlation(self, configs: Sequence[Config], times_us: Sequence[float]) -> dict[str, float]:
        """Spearman's rho and Kendall's tau between predictions and measured times (finite, positive ones),
        and ``n``, the number of records compared.  Both are always numbers in [-1, 1], never NaN.

        Raises ValueError when a correlation is undefined rather than returning NaN: fewer than 3 records,
        every record with the same time (the data cannot tell a good model from a bad one), or the model
        predicting the same cost for every record (it cannot rank them at all; typically it was trained on
        records whose times were all the same, or the records all fall on one of its predictions).
        """
        from scipy.stats import kendalltau, spearmanr

        t = np.asarray(times_us, dtype=float)
        keep = np.isfinite(t) & (t > 0)
        configs = [c for c, k in zip(configs, keep) if k]
        if len(configs) < 3:
            raise ValueError(f"rank correlation needs at least 3 records with a positive time, got {len(configs)}")
        if np.all(t[keep] == t[keep][0]):
            raise ValueError("every record has the same time: a rank correlation is undefined")
        space = self.featurizer.space
        for c in configs:
            why = space.reason(c) if isinstance(c, Mapping) else f"a config is a mapping, got {type(c).__name__}"
            if why is not None:
                raise ValueError(f"a record is not a point of this model's {space.rule} space: {why}")
        pred = self.predict(configs)
        if np.all(pred == pred[0]):  # scipy would answer NaN, which reads as a broken computation
            raise ValueError(f"the cost model predicts the same cost for all {len(configs)} records, so it cannot "
                             f"rank them and a rank correlation is undefined (it was trained on {self.n_train} "
                             f"records; train it on more, with different times)")
        return {"spearman": float(spearmanr(pred, t[keep]).statistic),
                "kendall": float(kendalltau(pred, t[keep]).statistic), "n": len(configs)}

    def evaluate(self, records: pd.DataFrame) -> dict[str, float]:
        """Rank correlation on held-out records (a frame with ``config`` and ``time_us`` columns, such as
        ``TuneResult.records`` of another run or a replay recording): ``{"spearman", "kendall", "n"}``, only
        the ``ok`` rows when there is a ``status`` column.  Where a correlation is undefined (constant times or
        constant predictions) it raises ValueError saying which: see :meth:`rank_correlation`."""
        missing = [c for c in ("config", "time_us") if not isinstance(records, pd.DataFrame) or c not in records]
        if missing:
            raise ValueError(f"evaluate needs a DataFrame with 'config' and 'time_us' columns (missing {missing})")
        rows = records[records["status"] == OK] if "status" in records else records
        return self.rank_correlation(list(rows["config"]), list(rows["time_us"]))

    def __repr__(self) -> str:
        state = f"trained on {self.n_train}" if self.trained else "untrained"
        return f"<CostModel {self.objective}, {len(self.featurizer.names)} features, {state}>"


@contextlib.contextmanager
def interrupt_after() -> Iterator[None]:
    """Hold Ctrl-C until the block ends, then deliver it.  XGBoost trains in native code that calls back into
    Python: an interrupt landing there was lost, or surfaced as an XGBoostError with a C++ backtrace, or left
    a half-built booster.  Held, it stops the search cleanly one fit (well under a second) later."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if previous is signal.default_int_handler:
            raise KeyboardInterrupt
        if callable(previous):
            previous(signal.SIGINT, None)
