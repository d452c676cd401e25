"""How ``compare`` times a method's kernel: measured on the GPU against the vendor result, or estimated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from schedlib.hw import HardwareProfile
from schedlib.ir.dtype import numpy_dtype
from schedlib.ir.func import Func
from schedlib.ir.reference import evaluate_int
from schedlib.ir.schedule import Schedule
from schedlib.report.stats import work
from schedlib.suites import WorkloadSpec


class MethodTimer:
    """Measures schedules on the GPU, or estimates them with the carver's model.

    On the GPU, ``prepare`` draws one set of inputs per workload (and copies of it, rotated between
    repetitions, when they fit in L2), runs the vendor library once as the reference, and ``schedule`` checks
    each kernel's result against it before timing: a wrong kernel is never reported with a time."""

    def __init__(self, profile: HardwareProfile, measured: bool) -> None:
        self.profile = profile
        self.measured = measured
        self._inputs: dict[str, Any] = {}
        self._flush = None

    def prepare(self, func: Func, spec: WorkloadSpec | None, symbols: Mapping[str, int]) -> None:
        self.func, self.spec, self.reference = func, spec, None
        if not self.measured:
            return
        import cupy as cp

        from schedlib.report.vendor import vendor_fn
        from schedlib.runtime.timing import l2_flush_buffer, rotation_copies, round_robin

        rng = np.random.default_rng(0)
        self._inputs = {}
        for name in func.inputs:
            buf = func.buffer(name)
            shape = tuple(evaluate_int(d, symbols) for d in buf.shape)  # a kernel binds symbols from these
            host = rng.standard_normal(shape).astype(np.float32)
            self._inputs[name] = cp.asarray(host.astype(numpy_dtype(buf.dtype)))
        # a set of inputs and outputs smaller than the L2 is timed in turns with copies of it
        copies = rotation_copies(int(work(func, symbols).bytes), self.profile.l2_bytes)  # inputs and outputs
        self._input_sets = [self._inputs] + [{n: a.copy() for n, a in self._inputs.items()}
                                             for _ in range(copies - 1)]
        self._flush = self._flush if self._flush is not None else l2_flush_buffer(self.profile.l2_bytes)
        out = func.buffer(func.outputs[0]).dtype
        vendors = [vendor_fn(spec, s, out) for s in self._input_sets] if spec is not None else [None]
        self.vendor = vendors[0]
        self.reference = self.vendor() if self.vendor is not None else None
        self._vendor_runs = round_robin(vendors) if self.vendor is not None else None

    def schedule(self, sch: Schedule, rule: Any, config: dict[str, Any]) -> dict[str, float]:
        if not self.measured:
            from schedlib.carver import estimate

            t = float(estimate(self.func, self.profile, config, rule=rule)["est_time_us"])
            return {"median_us": t, "p20_us": t, "p80_us": t}
        from schedlib.runtime.kernel import build
        from schedlib.runtime.timing import benchmark, round_robin

        kernel = build(sch, self.profile)
        launches = [kernel.prepare(*(inputs[n] for n in self.func.inputs)) for inputs in self._input_sets]
        launch = launches[0]
        launch.launch()
        out = launch.result()
        if self.reference is not None:
            got = out[0] if isinstance(out, tuple) else out
            err = float(abs(got.astype("float32") - self.reference.astype("float32")).max())
            scale = float(abs(self.reference.astype("float32")).max()) or 1.0
            if not err <= 2e-2 * scale:
                raise RuntimeError(f"{self.func.name}: kernel result differs from the vendor result by {err:.3g}")
        # the kernels alone (no host work between the events), each repetition on the next input set
        return benchmark(round_robin([p.launch for p in launches]), flush=self._flush)

    def vendor_time(self) -> dict[str, float] | None:
        if not self.measured or self.vendor is None:
            return None
        from schedlib.runtime.timing import benchmark

        return benchmark(self._vendor_runs, flush=self._flush)
