"""Random legal points of every rule's knob space compile with nvcc and match numpy on the emulator.

Hypothesis draws a workload of the rule and one point from the legal points of its space (so a failure
shrinks to, and prints, the offending config), applies it with ``rule.apply(func, "h100", config)``,
checks that the carver's view of the config (``rule.tiling``) describes the launched kernel, then builds,
compile-checks (sm_90; spills are allowed off the default) and runs the emulator against the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.ir.func import Func

from .helpers import check_schedule, thread_count


def _scaled_dot() -> Func:
    """``O[i] = sum_k exp(A[i, k]) * B[i, k] * s[i]``: two operands, a per-row scale, a stage before."""
    A, B = (sl.placeholder((6, 333), "float32", n) for n in "AB")
    s = sl.placeholder((6,), "float32", "s")
    E = sl.compute((6, 333), lambda i, j: sl.exp(A[i, j] * 0.1), "E")
    k = sl.reduce_axis(333, "k")
    O = sl.compute((6,), lambda i: sl.sum(E[i, k] * B[i, k] * s[i], axis=k), "O")
    return sl.func([A, B, s, O], "scaled_dot")


def _total() -> Func:
    """``S = sum(X)`` over a matrix, to one value."""
    X = sl.placeholder((40, 123), "float16", "X")
    i, j = sl.reduce_axis(40, "i"), sl.reduce_axis(123, "j")
    S = sl.compute((), lambda: sl.sum(X[i, j].astype("float32"), axis=[i, j]), "S")
    return sl.func([X, S], "total")


# rule -> (workloads drawn from, examples)
CASES: dict[str, tuple[str, list[Callable[[], Func]], int]] = {
    "matmul": ("matmul", [lambda: wl.matmul(37, 45, 29, epilogue="bias_relu"),
                          lambda: wl.matmul(20, 33, 40, dtype="float16", trans_a=True, batch=2)], 4),
    "gemv-inner": ("gemv", [lambda: wl.gemv(70, 100, "float16", batch=2, epilogue="bias")], 2),
    "gemv-outer": ("gemv", [lambda: wl.gemv(70, 100, "float32", batch=3, trans=True, epilogue="gelu")], 2),
    "reduction-inner": ("reduction", [lambda: wl.reduce(9, 300, "sumsq"), lambda: wl.reduce(5, 40, "mean")], 3),
    "reduction-outer": ("reduction", [lambda: wl.reduce(100, 40, "max", axis=0)], 2),
    # several operands, an inlined stage before, a single value: every knob, blocks_per_row included
    "reduction-operands": ("reduction", [lambda: _scaled_dot(), lambda: _total()], 2),
    "general_reduction": ("general_reduction", [lambda: wl.softmax(5, 300),
                                                lambda: wl.layernorm(3, 129, "float16")], 2),
    "transpose": ("transpose", [lambda: wl.transpose(70, 45, "float16")], 2),
    "elementwise": ("elementwise", [lambda: wl.elementwise((33, 17), ("add", "gelu")),
                                    lambda: wl.elementwise((3, 50), ("mul", "exp"), "bfloat16")], 2),
    "fallback": ("fallback", [lambda: wl.softmax(3, 40), lambda: wl.matmul(20, 17, 9, epilogue="gelu")], 2),
}


def _random_point_test(key: str) -> Callable[..., None]:
    rule_name, makers, examples = CASES[key]

    @settings(max_examples=examples, deadline=None, database=None)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        func = makers[data.draw(st.integers(0, len(makers) - 1), label="workload")]()
        rule = rules.get_rule(rule_name)
        profile = sl.hw.load("h100")
        assert rule.applies(func, profile) is None, rule.applies(func, profile)
        space = rule.space(func, profile)
        config = data.draw(st.sampled_from(list(space.enumerate())), label="config")
        note(f"{func.name}: {config}")
        sch = rule.apply(func, "h100", config)
        assert sch.rule == rule_name and sch.config == config
        kernel = sl.build(sch, "h100")
        tiling = rule.tiling(func, profile, config)
        if tiling is not None:
            # the kernel doing the main block's work: its partials' kernel where a reduction runs in two stages
            names = {s.name for s in kernel.launch}
            wanted = f"{func.name}_{tiling.main_block}"
            wanted = f"{wanted}_rf" if f"{wanted}_rf" in names else wanted
            main = [s for s in kernel.launch if s.name == wanted]
            assert len(main) == 1, [s.name for s in kernel.launch]
            assert thread_count(main[0].block) == tiling.threads, (main[0].block, tiling)
        seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
        check_schedule(func, sch, np.random.default_rng(seed), spills_allowed=True, archs=("sm_90",),
                       kernel=kernel)

    return run


@pytest.mark.parametrize("key", list(CASES))
def test_random_legal_point(key: str, toolchain: None) -> None:
    _random_point_test(key)()
