"""The ``estimate`` backend: the carver's analytical model stands in for the GPU.

Useful with no GPU at all, to exercise search end to end, and to build recorded spaces for the strategy
benchmark.  Its times are predictions, so its records live in their own studies (key ``estimate-<digest of
the profile's numbers>``) and never pass for GPU measurements, nor for estimates from other numbers.
"""

from __future__ import annotations

import math
import time
from typing import Any

from schedlib.errors import SchedlibError
from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Rule
from schedlib.search.backends import Backend
from schedlib.search.database import estimate_key
from schedlib.search.records import Measurement


class EstimateBackend(Backend):
    """Measures a config as ``schedlib.carver.estimate(func, target, config)["est_time_us"]``."""

    name = "estimate"

    def __init__(self) -> None:
        self._estimate: Any = None
        self._func: Func | None = None
        self._target: Any = None

    def study_key(self, target: HardwareProfile) -> str:
        # the model's input is the profile: an edited copy under the same key predicts other times
        return estimate_key(target)

    def open(self, func: Func, target: Any, rule: Rule) -> None:
        try:
            from schedlib.carver import estimate
        except ImportError as exc:
            raise SchedlibError(f"backend='estimate' needs schedlib.carver.estimate, which is not importable "
                                f"({exc}); use backend='gpu' or 'replay:<file>'") from None
        from schedlib.search.cost_model import with_rule

        self._estimate, self._func, self._target = with_rule(estimate, rule), func, target

    def measure(self, config: Config, schedule: Schedule | None) -> Measurement:
        if self._estimate is None:
            raise RuntimeError("EstimateBackend.measure called before open()")
        start = time.perf_counter()
        try:
            figures = self._estimate(self._func, self._target, dict(config))
            est = float(figures["est_time_us"])
        except Exception as exc:  # a model failure is one failed trial, not the end of tuning
            return Measurement.failure("error", type(exc).__name__, f"carver.estimate failed: {exc}",
                                       time.perf_counter() - start)
        wall = time.perf_counter() - start
        if not (math.isfinite(est) and est > 0):
            return Measurement.failure("error", "ValueError", f"carver.estimate returned est_time_us={est!r}",
                                       wall)
        numbers = {k: float(v) for k, v in figures.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        return Measurement("ok", est, est, est, wall_s=wall, figures=numbers)
