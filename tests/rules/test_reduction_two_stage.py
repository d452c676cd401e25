"""Two-stage reductions (``blocks_per_row`` > 1): a whole tensor to one value, and a few long rows.

Each is built, emulated against the reference and compile-checked: a first kernel of partial results (one
per block) and a second that combines them.  The default splits only where one block per row would leave
SMs idle and the rows are long; the carver ranks split configs ahead of one block per row there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib import carver
from schedlib.ir.func import Func

from .helpers import check_resources, check_schedule, random_inputs


def check_total(func: Func, sch: sl.Schedule, rng: np.random.Generator,
                exact: Callable[[np.ndarray], np.ndarray]) -> sl.Kernel:
    """A whole-tensor total against ``exact`` (numpy in float64) rather than the reference executor, whose own
    float32 running sum drifts over long sums (2^20 normals: 0.003-0.023 off the float64 sum, where the
    kernel's tree of partials is within 0.0003), so that sums near zero fail a relative tolerance.  The bound
    is ``exact`` applied to ``|x|``: the size of the terms, which is what rounding error scales with."""
    kernel = sl.build(sch, "h100")
    x = random_inputs(func, rng)["X"]
    got = np.asarray(kernel.run_cpu(x, bounds_check=True), dtype=np.float64)
    want = exact(x.astype(np.float64))
    assert got.shape == np.shape(want)
    assert np.all(np.abs(got - want) <= 1e-5 * exact(np.abs(x.astype(np.float64)))), (got, want)
    check_resources(kernel, archs=("sm_90",))
    return kernel


def total(n: int | sl.Expr = 70_003, dtype: str = "float32") -> Func:
    """``S = sum(X)`` over a vector, stored as a 0-d value."""
    X = sl.placeholder((n,), dtype, "X")
    i = sl.reduce_axis(n, "i")
    S = sl.compute((), lambda: sl.sum(X[i].astype("float32"), axis=i), "S")
    return sl.func([X, S], "total")


def table_mean(rows: int = 300, cols: int = 257) -> Func:
    """``M = sum(X) / size`` over a matrix into shape (1,): two reduce axes, a kept axis of extent 1, and an
    epilogue."""
    X = sl.placeholder((rows, cols), "float32", "X")
    i, j = sl.reduce_axis(rows, "i"), sl.reduce_axis(cols, "j")
    S = sl.compute((1,), lambda z: sl.sum(X[i, j], axis=[i, j]), "S")
    M = sl.compute((1,), lambda z: S[z] * (1.0 / (rows * cols)), "M")
    return sl.func([X, M], "table_mean")


def scaled_total(n: int = 50_000) -> Func:
    """``T = 0.5 * sum(X)`` as a 0-d value: a reduction to one value, then an element-wise stage."""
    X = sl.placeholder((n,), "float32", "X")
    i = sl.reduce_axis(n, "i")
    S = sl.compute((), lambda: sl.sum(X[i], axis=i), "S")
    T = sl.compute((), lambda: S[()] * 0.5, "T")
    return sl.func([X, T], "scaled_total")


CASES = {
    # id: (make, config overrides, kernels launched, the exact total in float64 or None for the reference)
    "total-default": (lambda: total(1 << 20), {}, 2, np.sum),
    "total-ragged": (total, {"blocks_per_row": 16, "threads_k": 128}, 2, np.sum),
    "total-fp16": (lambda: total(40_001, "float16"), {"blocks_per_row": 8, "threads_k": 64, "vector": 4}, 2,
                   np.sum),
    # the kept axis of extent 1 is the second stage's row loop: the epilogue is folded into its store
    "mean-two-axes": (table_mean, {"blocks_per_row": 32, "threads_k": 256}, 2, lambda x: np.mean(x).reshape(1)),
    # a 0-d result has no row loop: the epilogue runs as a kernel of its own
    "scaled-total": (lambda: scaled_total(), {"blocks_per_row": 16, "threads_k": 64}, 3, lambda x: 0.5 * np.sum(x)),
    "few-long-rows": (lambda: sl.workloads.reduce(3, 200_000, "max"), {}, 2, None),
    "rows-sumsq-epilogue": (lambda: sl.workloads.reduce(5, 30_000, "mean"), {"blocks_per_row": 4,
                                                                              "threads_k": 128}, 2, None),
}


@pytest.mark.parametrize("key", list(CASES))
def test_two_stage_reductions_match(key: str, rng: np.random.Generator, toolchain: None) -> None:
    make, overrides, kernels, exact = CASES[key]
    func = make()
    rule = rules.get_rule("reduction")
    assert rules.find_rule(func, "h100") is rule
    config = {**rule.default_config(func, "h100"), **overrides}
    assert config["blocks_per_row"] > 1, config
    sch = rule.apply(func, "h100", config)
    kernel = check_total(func, sch, rng, exact) if exact else check_schedule(func, sch, rng, archs=("sm_90",))
    assert len(kernel.launch) == kernels, [spec.name for spec in kernel.launch]


def test_a_symbolic_length_splits_at_any_size(rng: np.random.Generator, toolchain: None) -> None:
    """Blocks with no whole step (n = 1, n = 1000) contribute the identity; a long n walks many steps."""
    func = total(sl.var("n"))
    rule = rules.get_rule("reduction")
    config = {"rows_per_block": 1, "threads_k": 64, "vector": 4, "blocks_per_row": 8}
    check_schedule(func, rule.apply(func, "h100", config), rng, sizes=({"n": 1}, {"n": 1000}, {"n": 9_000}),
                   archs=("sm_90",))


def test_the_default_splits_only_few_long_rows() -> None:
    rule = rules.get_rule("reduction")
    profile = sl.hw.load("h100")
    assert rule.default_config(total(1 << 22), profile)["blocks_per_row"] >= profile.sm_count
    assert rule.default_config(sl.workloads.reduce(4, 1 << 20), profile)["blocks_per_row"] > 1
    assert rule.default_config(sl.workloads.reduce(4096, 4096), profile)["blocks_per_row"] == 1  # rows fill it
    assert rule.default_config(total(5000), profile)["blocks_per_row"] == 1  # too short to be worth a second kernel
    assert "rows_per_block 1" in rule.space(sl.workloads.reduce(64, 5000), profile).reason(
        {"rows_per_block": 2, "threads_k": 64, "vector": 4, "blocks_per_row": 4})


def test_a_split_that_leaves_blocks_empty_is_refused() -> None:
    """A 4096-long row in steps of 64 x 4 has 16 steps: 16 blocks per row each get one, 32 leave 16 idle
    (launched for nothing: on an H200 such a grid ran 100x slower than the unsplit kernel)."""
    space = rules.get_rule("reduction").space(sl.workloads.reduce(4096, 4096), sl.hw.load("h100"))
    config = {"rows_per_block": 1, "threads_k": 64, "vector": 4, "blocks_per_row": 16}
    assert space.reason(config) is None
    reason = space.reason(config | {"blocks_per_row": 32})
    assert reason is not None and "nothing to read" in reason and "4096" in reason
    assert space.reason(config | {"blocks_per_row": 32, "threads_k": 32}) is None  # 32 steps of 128
    symbolic = rules.get_rule("reduction").space(total(sl.var("n")), sl.hw.load("h100"))
    assert symbolic.reason(config | {"blocks_per_row": 1024}) is None  # the length is known only at launch


def test_the_carver_ranks_splitting_first_for_a_whole_tensor() -> None:
    ranked = carver.carve(total(1 << 24), "h100", 5)
    assert all(c["blocks_per_row"] > 1 for c in ranked["config"]), ranked["config"].tolist()
    one_block = carver.estimate(total(1 << 24), "h100", {"rows_per_block": 1, "threads_k": 512, "vector": 4,
                                                         "blocks_per_row": 1}, rule="reduction")
    assert float(one_block["est_time_us"]) > 10 * float(ranked["est_time_us"].iloc[0])


def reversed_axes(shape: tuple[int, int] = (30, 40)) -> Func:
    """``sum(X[i, j], axis=[j, i])``: the reduce axes listed in the other order than the operand's."""
    X = sl.placeholder(shape, "float32", "X")
    i, j = sl.reduce_axis(shape[0], "i"), sl.reduce_axis(shape[1], "j")
    S = sl.compute((), lambda: sl.sum(X[i, j], axis=[j, i]), "S")
    return sl.func([X, S], "reversed_axes")


@pytest.mark.parametrize("split", [1, 4])  # 1200 elements in steps of 256: at most 5 blocks per row
def test_reduce_axes_listed_out_of_order_are_walked_in_the_operands_order(split: int, rng: np.random.Generator,
                                                                          toolchain: None) -> None:
    func = reversed_axes()
    rule = rules.get_rule("reduction")
    config = {"rows_per_block": 1, "threads_k": 64, "vector": 4, "blocks_per_row": split}
    sch = rule.apply(func, "h100", config)
    kernel = check_schedule(func, sch, rng, archs=("sm_90",))
    assert "/ 40)" not in kernel.source  # one flat walk over X, no index taken apart
    assert rules.apply_default(func, "h100").rule == "reduction"


def test_an_int32_max_pads_with_the_smallest_int(rng: np.random.Generator, toolchain: None) -> None:
    """The padding of a ragged two-stage max is INT32_MIN, which C must read as an int (a bare -2147483648 is
    minus a long, and max(int, long) does not compile)."""
    func = sl.workloads.reduce(3, 5_003, "max", dtype="int32")
    rule = rules.get_rule("reduction")
    config = {"rows_per_block": 1, "threads_k": 64, "vector": 4, "blocks_per_row": 8}
    kernel = check_schedule(func, rule.apply(func, "h100", config), rng, archs=("sm_90",))
    assert "(-2147483647 - 1)" in kernel.source


def test_a_single_row_has_one_row_per_block(toolchain: None) -> None:
    rule = rules.get_rule("reduction")
    assert rule.space(total(), "h100").knob("rows_per_block").values == (1,)
    X = sl.placeholder((1, 1, 100), "float32", "X")
    k = sl.reduce_axis(100, "k")
    one_row = sl.func([X, sl.compute((1, 1), lambda a, b: sl.sum(X[a, b, k], axis=k), "S")], "one_row")
    assert rule.default_config(one_row, "h100")["rows_per_block"] == 1


def _symbolic_rows(kind: str) -> tuple[Func, dict[str, int]]:
    b, m, n = sl.var("b"), sl.var("m"), sl.var("n")
    if kind == "inner":
        X = sl.placeholder((b, m, n), "float32", "X")
        k = sl.reduce_axis(n, "k")
        O = sl.compute((b, m), lambda p, i: sl.sum(X[p, i, k], axis=k), "O")
        return sl.func([X, O], "rows3"), {"b": 3, "m": 5, "n": 700}
    if kind == "outer":
        X = sl.placeholder((b, n, m), "float32", "X")
        k = sl.reduce_axis(n, "k")
        O = sl.compute((b, m), lambda p, i: sl.sum(X[p, k, i], axis=k), "O")
        return sl.func([X, O], "cols3"), {"b": 3, "m": 40, "n": 7}
    a = sl.var("a")
    X = sl.placeholder((a, b, m, n), "float32", "X")
    k = sl.reduce_axis(n, "k")
    O = sl.compute((a, b, m), lambda q, p, i: sl.sum(X[q, p, i, k], axis=k), "O")
    return sl.func([X, O], "rows4"), {"a": 2, "b": 3, "m": 2, "n": 900}


@pytest.mark.parametrize("kind", ["inner", "outer", "four-d"])
def test_several_symbolic_row_axes_build(kind: str, rng: np.random.Generator, toolchain: None) -> None:
    """Rows of several symbolic axes: the outer ones go to blockIdx.y/z instead of one fused index whose // and
    % hid the thread's output from its register write-back (the build failed after the rule took the func)."""
    func, sizes = _symbolic_rows(kind)
    rule = rules.get_rule("reduction")
    check_schedule(func, rules.apply_default(func, "h100"), rng, sizes=(sizes,), archs=("sm_90",))
    if kind != "outer":
        config = {"rows_per_block": 1, "threads_k": 64, "vector": 4, "blocks_per_row": 4}
        kernel = check_schedule(func, rule.apply(func, "h100", config), rng, sizes=(sizes,), archs=("sm_90",))
        assert "blockIdx.y" in kernel.source
