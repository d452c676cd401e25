"""``sl.report.compare``: rule, carver, search and the vendor library side by side, one row per
workload x method, as a flat pandas DataFrame.

With a GPU every time is *measured* (CUDA events, L2 flush, median of repetitions, correctness checked
against the vendor result first).  Without one, times come from the carver's model and every such row says
``source == "estimated"``; the vendor row then has no time.  The two are never mixed in one table.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from schedlib.hw import HardwareProfile, resolve
from schedlib.ir.dtype import numpy_dtype
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.report.stats import Work, work
from schedlib.runtime.gpu import gpu_available
from schedlib.suites import WorkloadSpec, as_specs

METHODS = ("rule", "carver", "search", "vendor")
COLUMNS = ["workload", "shape", "dtype", "method", "rule", "config", "time_us", "p20_us", "p80_us", "tflops",
           "gbs", "pct_roofline", "speedup_vs_vendor", "tuning_s", "trials", "measured", "source"]


def _shape(func: Func) -> str:
    parts = []
    for name in func.inputs:
        buf = func.buffer(name)
        parts.append(f"{name}[{'x'.join(str(d) for d in buf.shape)}]")
    return " ".join(parts)


def _peak(profile: HardwareProfile, dtype: str, ceilings: dict[str, float] | None) -> tuple[float, float]:
    """(peak FLOP/s for the dtype's best unit, DRAM bytes/s), measured ceilings taking precedence."""
    c = ceilings or {}
    if dtype in ("float16", "bfloat16"):
        flops = c.get("fp16_flops") or profile.peak_flops(dtype, True)
    else:
        flops = c.get("fp32_flops") or profile.peak_flops("float32", False)
    return float(flops), float(c.get("bandwidth") or profile.dram_bytes_per_s)


class _Timer:
    """Measures schedules on the GPU, or estimates them with the carver's model."""

    def __init__(self, profile: HardwareProfile, measured: bool) -> None:
        self.profile = profile
        self.measured = measured
        self._inputs: dict[str, Any] = {}
        self._flush = None

    def prepare(self, func: Func, spec: WorkloadSpec | None) -> None:
        self.func, self.spec, self.reference = func, spec, None
        if not self.measured:
            return
        import cupy as cp

        from schedlib.report.vendor import vendor_fn
        from schedlib.runtime.timing import l2_flush_buffer

        rng = np.random.default_rng(0)
        self._inputs = {}
        for name in func.inputs:
            buf = func.buffer(name)
            shape = tuple(int(d.value) for d in buf.shape)  # type: ignore[attr-defined]
            host = rng.standard_normal(shape).astype(np.float32)
            self._inputs[name] = cp.asarray(host.astype(numpy_dtype(buf.dtype)))
        self._flush = self._flush if self._flush is not None else l2_flush_buffer(self.profile.l2_bytes)
        self.vendor = vendor_fn(spec, self._inputs) if spec is not None else None
        self.reference = self.vendor() if self.vendor is not None else None

    def schedule(self, sch: Schedule, rule: Any, config: dict[str, Any]) -> dict[str, float]:
        if not self.measured:
            from schedlib.carver import estimate

            t = float(estimate(self.func, self.profile, config, rule=rule)["est_time_us"])
            return {"median_us": t, "p20_us": t, "p80_us": t}
        from schedlib.runtime.kernel import build
        from schedlib.runtime.timing import benchmark

        kernel = build(sch, self.profile)
        args = [self._inputs[n] for n in self.func.inputs]
        out = kernel(*args)
        if self.reference is not None:
            got = out[0] if isinstance(out, tuple) else out
            err = float(abs(got.astype("float32") - self.reference.astype("float32")).max())
            scale = float(abs(self.reference.astype("float32")).max()) or 1.0
            if not err <= 2e-2 * scale:
                raise RuntimeError(f"{self.func.name}: kernel result differs from the vendor result by {err:.3g}")
        return benchmark(lambda: kernel(*args), flush=self._flush)

    def vendor_time(self) -> dict[str, float] | None:
        if not self.measured or self.vendor is None:
            return None
        from schedlib.runtime.timing import benchmark

        return benchmark(self.vendor, flush=self._flush)


def compare(workloads: Iterable[Any], target: Any = "auto", methods: Sequence[str] = METHODS, *, topk: int = 5,
            trials: int = 16, strategy: str = "tpe", storage: str | None = None, backend: str | None = None,
            ceilings: dict[str, float] | None = None, quiet: bool = True) -> pd.DataFrame:
    """One row per workload x method (``carver`` gives a top-1 and a best-of-top-k row).

    ``backend`` is ``"gpu"`` or ``"estimate"``; by default ``gpu`` when a device is visible.
    """
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; choose from {METHODS}")
    measured = (backend or ("gpu" if gpu_available() else "estimate")) == "gpu"
    profile = resolve(target if target != "auto" or measured else "h100")
    timer = _Timer(profile, measured)
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[float]] = {}
    for item in as_specs(workloads):
        spec = item if isinstance(item, WorkloadSpec) else None
        func = spec.build() if spec else item
        label = spec.name if spec else func.name
        w = work(func)
        peak, bw = _peak(profile, w.dtype, ceilings)
        timer.prepare(func, spec)
        base = {"workload": label, "shape": _shape(func), "dtype": w.dtype}
        found = _run_methods(func, profile, methods, timer, topk, trials, strategy, storage, quiet)
        for _method, info in found:
            if "history" in info:
                histories[label] = info.pop("history")
        vendor_us = None
        for method, info in found:
            row = {**base, "method": method, **info}
            rows.append(_finish(row, w, peak, bw, measured))
            if method == "vendor":
                vendor_us = row["time_us"]
        for row in rows:
            if row["workload"] == label:
                t = row["time_us"]
                row["speedup_vs_vendor"] = (vendor_us / t) if vendor_us and t == t and t else float("nan")
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update({"target": profile.key, "measured": measured, "histories": histories,
                     "roofline": "measured ceilings" if ceilings else f"profile {profile.key}"})
    return df


def _finish(row: dict[str, Any], w: Work, peak: float, bw: float, measured: bool) -> dict[str, Any]:
    t = row.get("time_us", float("nan"))
    ok = t == t and t > 0
    row["tflops"] = w.flops / (t * 1e-6) / 1e12 if ok else float("nan")
    row["gbs"] = w.bytes / (t * 1e-6) / 1e9 if ok else float("nan")
    row["pct_roofline"] = 100 * w.roofline_s(peak, bw) / (t * 1e-6) if ok else float("nan")
    row["measured"] = measured and ok
    row.setdefault("source", "measured" if measured else "estimated")
    return row


def _timed(timer: _Timer, sch: Schedule, rule: Any, config: dict[str, Any]) -> dict[str, float]:
    t = timer.schedule(sch, rule, config)
    return {"time_us": t["median_us"], "p20_us": t["p20_us"], "p80_us": t["p80_us"]}


def _run_methods(func: Func, profile: HardwareProfile, methods: Sequence[str], timer: _Timer, topk: int,
                 trials: int, strategy: str, storage: str | None, quiet: bool) -> list[tuple[str, dict[str, Any]]]:
    from schedlib.rules import apply_default, get_rule

    out: list[tuple[str, dict[str, Any]]] = []
    if "rule" in methods:
        t0 = time.perf_counter()
        sch = apply_default(func, profile)
        cost = time.perf_counter() - t0
        rule = get_rule(sch.rule)
        out.append(("rule", {"rule": sch.rule, "config": sch.config, "tuning_s": cost, "trials": 0,
                             **_timed(timer, sch, rule, sch.config)}))
    if "carver" in methods:
        from schedlib.carver import carve

        t0 = time.perf_counter()
        ranked = carve(func, profile, topk=topk)
        cost = time.perf_counter() - t0
        rule = get_rule(ranked["rule"].iloc[0])
        timings = []
        for config in ranked["config"]:
            timings.append((config, _timed(timer, rule.apply(func, profile, config), rule, config)))
            if not timer.measured:
                break  # the model already ranked them: its top-1 is its best
        top = timings[0]
        best = min(timings, key=lambda ct: ct[1]["time_us"])
        info = {"rule": rule.name, "tuning_s": cost, "trials": len(timings)}
        out.append(("carver", {**info, "config": top[0], **top[1]}))
        out.append(("carver_best_of_k", {**info, "config": best[0], **best[1]}))
    if "search" in methods:
        from schedlib.search import tune

        t0 = time.perf_counter()
        res = tune(func, profile, trials=trials, strategy=strategy, storage=storage,
                   backend="gpu" if timer.measured else "estimate", quiet=quiet)
        cost = time.perf_counter() - t0
        rule = get_rule(res.best_schedule.rule) if res.best_schedule.rule else None
        info = {"rule": rule.name if rule else None, "config": res.best_config, "tuning_s": cost,
                "trials": len(res.records), "history": [float(v) for v in res.history]}
        out.append(("search", {**info, **_timed(timer, res.best_schedule, rule, res.best_config)}))
    if "vendor" in methods:
        t = timer.vendor_time()
        if t is None:
            out.append(("vendor", {"rule": None, "config": None, "time_us": float("nan"), "p20_us": float("nan"),
                                   "p80_us": float("nan"), "tuning_s": 0.0, "trials": 0,
                                   "source": "needs a GPU" if not timer.measured else "no vendor equivalent"}))
        else:
            out.append(("vendor", {"rule": None, "config": None, "time_us": t["median_us"], "p20_us": t["p20_us"],
                                   "p80_us": t["p80_us"], "tuning_s": 0.0, "trials": 0}))
    return out
