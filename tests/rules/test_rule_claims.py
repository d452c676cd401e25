"""A rule claims a func only if it can schedule it, and says why not otherwise.

* A fused epilogue stage whose buffer is also a func output (the pre-activation returned next to the
  activation, as a backward pass wants) cannot be inlined, so matmul, GEMV and reduction must decline it in
  ``analyze`` instead of claiming the func and then failing in ``reverse_compute_inline``.
* ``find_rule`` refuses a non-Func like ``explain`` and ``apply_default`` do, and the element-wise rule's
  methods refuse a func it does not take like the other rules' methods do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.ir.func import Func


def matmul_and_relu() -> Func:
    """Outputs ``C = A @ B`` and ``D = relu(C)``."""
    A = sl.placeholder((32, 16), "float32", "A")
    B = sl.placeholder((16, 32), "float32", "B")
    k = sl.reduce_axis(16, "k")
    C = sl.compute((32, 32), lambda i, j: sl.sum(A[i, k] * B[k, j], axis=k), "C")
    D = sl.compute((32, 32), lambda i, j: sl.maximum(C[i, j], 0.0), "D")
    return sl.func([A, B, C, D], "mm_pre_and_post")


def gemv_and_cast() -> Func:
    """Outputs the fp32 GEMV ``C`` and its fp16 cast ``D``."""
    x = sl.placeholder((1, 64), "float16", "x")
    W = sl.placeholder((32, 64), "float16", "W")
    k = sl.reduce_axis(64, "k")
    C = sl.compute((1, 32), lambda i, j: sl.sum(x[i, k].astype("float32") * W[j, k].astype("float32"), axis=k),
                   "C")
    D = sl.compute((1, 32), lambda i, j: C[i, j].astype("float16"), "D")
    return sl.func([x, W, C, D], "gemv_and_cast")


def sum_and_mean() -> Func:
    """Outputs the row sums ``S`` and the row means ``M = S / 64``."""
    X = sl.placeholder((8, 64), "float32", "X")
    r = sl.reduce_axis(64, "r")
    S = sl.compute((8,), lambda i: sl.sum(X[i, r], axis=r), "S")
    M = sl.compute((8,), lambda i: S[i] * (1 / 64), "M")
    return sl.func([X, S, M], "sum_and_mean")


def _numpy_matmul_relu(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    c = a @ b
    return c, np.maximum(c, 0)


def _numpy_gemv_cast(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
    c = x.astype(np.float32) @ w.astype(np.float32).T
    return c, c.astype(np.float16)


def _numpy_sum_mean(x: np.ndarray) -> tuple[np.ndarray, ...]:
    return x.sum(1), x.sum(1) / 64


# (make, the rule that used to claim the func, the output that feeds the next stage, numpy's answer)
SHARED_OUTPUT = [
    (matmul_and_relu, "matmul", "C", _numpy_matmul_relu),
    (gemv_and_cast, "gemv", "C", _numpy_gemv_cast),
    (sum_and_mean, "reduction", "S", _numpy_sum_mean),
]


@pytest.mark.parametrize("make, claimer, shared, reference", SHARED_OUTPUT, ids=["matmul", "gemv", "reduction"])
def test_a_stage_that_is_also_an_output_is_declined_with_its_reason(
        make: Callable[[], Func], claimer: str, shared: str, reference: Callable[..., tuple[np.ndarray, ...]],
        rng: np.random.Generator, caplog: pytest.LogCaptureFixture, toolchain: None) -> None:
    func = make()
    rule = rules.get_rule(claimer)
    why = rule.applies(func, "h100")
    assert why is not None and f"{shared} is a func output" in why, why
    assert rule.apply(func, "h100") is None  # declines rather than raising a ScheduleError
    with pytest.raises(ValueError, match=f"{claimer} rule does not apply: {shared} is a func output"):
        rule.space(func, "h100")
    assert f"{claimer}: declined: {shared} is a func output" in rules.explain(func, "h100")
    assert rules.find_rule(func, "h100").name == "fallback"
    with caplog.at_level(logging.WARNING, logger="schedlib.rules"):
        sch = rules.apply_default(func, "h100")
    assert sch.rule == "fallback"
    # the fallback is picked because every rule declined, not because one raised (which is logged)
    assert [r.getMessage() for r in caplog.records if r.name == "schedlib.rules"] == []
    inputs = [_random(func, n, rng) for n in func.inputs]
    got = sl.build(sch, "h100").run_cpu(*inputs, bounds_check=True)  # against numpy, not run_reference
    for name, g, want in zip(func.outputs, got, reference(*inputs)):
        assert g.dtype == want.dtype, name
        np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3,
                                   err_msg=name)


def _random(func: Func, name: str, rng: np.random.Generator) -> np.ndarray:
    buf = func.buffer(name)
    shape = tuple(int(d.value) for d in buf.shape)
    return rng.standard_normal(shape).astype(np.float16 if buf.dtype == "float16" else np.float32)


def test_a_chain_whose_outputs_are_only_at_its_end_is_still_claimed() -> None:
    """The guard is about a *fused* stage being an output; the last stage is always one."""
    assert rules.find_rule(wl.matmul(64, 64, 64, epilogue="relu"), "h100").name == "matmul"
    assert rules.find_rule(wl.gemv(64, 64, "float16", epilogue="relu"), "h100").name == "gemv"
    assert rules.find_rule(wl.reduce(8, 64, "mean"), "h100").name == "reduction"


# ---- entry points and rule methods on the wrong input --------------------------------------------------------

def test_find_rule_refuses_a_non_func_like_explain_does() -> None:
    for call in (rules.find_rule, rules.explain):
        with pytest.raises(TypeError, match=rf"^{call.__name__}: expected a Func \(from sl.func or sl.workloads\), "
                                            r"got str 'x'$"):
            call("x", "h100")


@pytest.mark.parametrize("method", ["space", "default_config", "tiling"])
@pytest.mark.parametrize("name", [r.name for r in rules.RULES if r.name != "fallback"])
def test_every_rule_method_refuses_a_func_the_rule_does_not_take(name: str, method: str) -> None:
    """Regression: the element-wise rule answered with an AttributeError and the transpose rule with a bare
    assert (or a space that looked usable); every rule now says it does not apply, and why."""
    rule = rules.get_rule(name)
    f = wl.matmul(64, 64, 64) if name == "elementwise" else wl.elementwise((64, 64), ("add",))
    assert isinstance(rule.analyze(f, sl.hw.load("h100")), str)
    args = (f, sl.hw.load("h100"), {}) if method == "tiling" else (f, "h100")
    with pytest.raises(ValueError, match=rf"^{name} rule does not apply: \S"):
        getattr(rule, method)(*args)


@pytest.mark.parametrize("method", ["space", "default_config", "tiling"])
def test_the_matmul_methods_refuse_what_its_analysis_refuses(method: str) -> None:
    """Regression: a matmul with a side of 8 (a GEMV's) got a space and a default from the matmul rule, whose
    apply then refused every config of it."""
    f = wl.matmul(24, 8, 6144, "bfloat16")
    rule = rules.get_rule("matmul")
    why = rule.analyze(f, sl.hw.load("a100"))
    assert isinstance(why, str) and "GEMV rule" in why
    args = (f, "a100", {}) if method == "tiling" else (f, "a100")
    with pytest.raises(ValueError, match=r"^matmul rule does not apply: axis j has extent 8 <= 8"):
        getattr(rule, method)(*args)


def test_elementwise_methods_still_work_on_their_own_funcs() -> None:
    f = wl.elementwise((64, 64), ("add", "relu"))
    rule = rules.get_rule("elementwise")
    config = rule.default_config(f, "h100")
    assert rule.space(f, "h100").is_legal(config)
    assert rule.tiling(f, "h100", config).threads == config["threads"]
