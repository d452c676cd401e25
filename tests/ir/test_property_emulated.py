"""Property test: random primitive sequences are built for h100 and run on the CPU emulator.

``test_property.py`` checks that an accepted sequence keeps the reference result; it never builds the kernel.
Here the same drawn workloads and steps (mostly the GPU-style skeleton, so that most kernels bind threads)
are built with ``sl.build``: a schedule may be refused with a ``BuildError`` (no other exception), and a
kernel that builds must give the unscheduled func's result on the emulator with bounds checks, at the drawn
symbolic sizes and at other ones.  Deterministic: one fixed hypothesis seed, no example database.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import schedlib as sl
from schedlib.ir.func import Func
from schedlib.runtime.emulator import find_gxx

from .helpers import outputs_match, random_inputs
from .test_property import MAX_STEPS, MAX_VOLUME, RECIPE, apply_step, draw_step, draw_workload, loop_volume

EXAMPLES = 80
OTHER_SIZES = (1, 5)  # every symbol set to each of these in turn, for a second and third run of one kernel


def _emulate(kernel: sl.Kernel, func: Func, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = kernel.run_cpu(*[inputs[name] for name in func.inputs], bounds_check=True)
    return dict(zip(func.outputs, out if isinstance(out, tuple) else (out,)))


def build_and_emulate(data: Any, stats: Counter) -> None:
    func, symbols = draw_workload(data)
    rng_seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    s = sl.Schedule(func)
    plan: list[str | None] = [None] * data.draw(st.integers(1, MAX_STEPS), label="steps")
    if data.draw(st.integers(0, 3), label="recipe?") > 0:
        plan = [*RECIPE, *plan[: len(plan) // 2]]
    log: list[str] = []
    for forced in plan:
        if loop_volume(s.func, symbols) > MAX_VOLUME:
            break
        prim, args = draw_step(data, s.func, symbols, forced)
        try:
            apply_step(s, prim, args)
        except sl.ScheduleError:
            continue
        log.append(f"{prim}({args})")
    where = "\n".join(log) + f"\n{s.func}"
    stats["sequences"] += 1
    try:
        kernel = sl.build(s, "h100")
    except sl.BuildError:
        stats["refused"] += 1
        return
    except Exception as exc:
        raise AssertionError(f"build raised {type(exc).__name__}: {exc}\n{where}") from exc
    stats["built"] += 1
    runs = [symbols] + [dict.fromkeys(symbols, v) for v in OTHER_SIZES if symbols]
    for k, values in enumerate(runs):
        inputs = random_inputs(func, np.random.default_rng(rng_seed + k), values)
        problem = outputs_match(func, sl.run_reference(func, inputs), _emulate(kernel, func, inputs))
        assert problem is None, f"emulated result differs at {values} ({problem}) after\n{where}"
        stats["emulated"] += 1


@pytest.mark.emulator
@pytest.mark.skipif(find_gxx() is None, reason="the CUDA emulator needs g++")
def test_random_schedules_build_and_emulate() -> None:
    stats: Counter = Counter()

    @seed(20261128)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def check(data: Any) -> None:
        build_and_emulate(data, stats)

    check()
    print(f"\nrandom schedules built and emulated: {dict(stats)}")
    # the draws reach kernels, not only refusals: a third of the sequences build and run
    assert stats["sequences"] >= EXAMPLES
    assert stats["built"] >= EXAMPLES // 3, dict(stats)
    assert stats["emulated"] >= stats["built"], dict(stats)
