"""Softmax and norms over an axis that is not the contiguous one: the GeneralReduction rule's column layout.

Each case is built, emulated against the reference and compile-checked (sm_80, sm_90).  The analysis follows
the indices, not the extents: a square softmax over columns has the extents of one over rows, and was taken
for one (every block then recomputed every column's max and sum).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib import carver
from schedlib.ir.expr import Expr
from schedlib.ir.func import Func
from schedlib.rules.general_reduction_facts import analyze_general_reduction

from .helpers import check_schedule

RULE = rules.get_rule("general_reduction")


def softmax_over(shape: tuple, axis: int, dtype: str = "float32", divide: bool = False) -> Func:
    """``softmax(X, dim=axis)`` of any rank, in float32 (``divide``: by the sum, not times its reciprocal)."""
    X = sl.placeholder(shape, dtype, "X")
    kept = tuple(e for d, e in enumerate(shape) if d != axis)

    def at(idx: tuple[Expr, ...], k: Expr) -> tuple[Expr, ...]:
        return (*idx[:axis], k, *idx[axis:])

    def line(idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(v for d, v in enumerate(idx) if d != axis)

    k1, k2 = sl.reduce_axis(shape[axis], "k"), sl.reduce_axis(shape[axis], "k")
    mx = sl.compute(kept, lambda *i: sl.max(X[at(i, k1)].astype("float32"), axis=k1), "T_max")
    ex = sl.compute(shape, lambda *i: sl.exp(X[i].astype("float32") - mx[line(i)]), "T_exp")
    sm = sl.compute(kept, lambda *i: sl.sum(ex[at(i, k2)], axis=k2), "T_sum")
    Y = sl.compute(shape, lambda *i: ((ex[i] / sm[line(i)]) if divide else (ex[i] * (1.0 / sm[line(i)])))
                   .astype(dtype), "Y")
    return sl.func([X, Y], "softmax_over")


n, m = sl.var("n"), sl.var("m")
CASES: list[tuple[str, Callable[[], Func], tuple[dict[str, int], ...]]] = [
    ("softmax 33x7", lambda: sl.workloads.softmax(33, 7, axis=0), ({},)),
    ("softmax 7x33 fp16", lambda: sl.workloads.softmax(7, 33, "float16", axis=0), ({},)),
    ("softmax 1x40", lambda: sl.workloads.softmax(1, 40, axis=0), ({},)),
    ("softmax 64x64", lambda: sl.workloads.softmax(64, 64, axis=0), ({},)),
    ("softmax n x m", lambda: sl.workloads.softmax(n, m, axis=0), ({"n": 37, "m": 70}, {"n": 1, "m": 3})),
    ("rmsnorm 130x36 bf16", lambda: sl.workloads.rmsnorm(130, 36, "bfloat16", axis=0), ({},)),
    ("layernorm 45x33", lambda: sl.workloads.layernorm(45, 33, axis=0), ({},)),
    ("layernorm n x 40 fp16", lambda: sl.workloads.layernorm(n, 40, "float16", axis=0), ({"n": 77},)),
    ("softmax 5x9x13 over 1", lambda: softmax_over((5, 9, 13), 1), ({},)),
    ("softmax 3x4x5x6 over 0", lambda: softmax_over((3, 4, 5, 6), 0), ({},)),
    ("softmax n x 5 x m over 1", lambda: softmax_over((n, 5, m), 1), ({"n": 3, "m": 35},)),
    # two steps of a column, the second partial, dividing: ptxas spilled 12 B when it unrolled the steps
    ("softmax 3x40x5 over 1 divided", lambda: softmax_over((3, 40, 5), 1, divide=True), ({},)),
    ("softmax 3x300x5 over 1 divided", lambda: softmax_over((3, 300, 5), 1, divide=True), ({},)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_columns_default_and_sampled_configs_match_the_reference(case: tuple, rng: np.random.Generator,
                                                                  toolchain: None) -> None:
    _, make, sizes = case
    func = make()
    assert rules.find_rule(func, "h100").name == "general_reduction", rules.explain(func, "h100")
    space = RULE.space(func, sl.hw.load("h100"))
    assert space.names == ["threads_n", "threads_k", "unroll"]
    check_schedule(func, RULE.apply(func, "h100"), rng, sizes=sizes)
    picked = random.Random(str(func)).choice(list(space.enumerate()))  # one other point, compiled for sm_90
    check_schedule(func, RULE.apply(func, "h100", picked), rng, sizes=sizes, archs=("sm_90",))


def test_a_square_softmax_over_columns_is_not_taken_for_rows(toolchain: None) -> None:
    """Equal extents: only the indices say which axis is reduced.  The column layout gives a block per 32
    columns (two blocks for 64 columns); taken for rows, it was a block per row, each walking all columns."""
    func = sl.workloads.softmax(64, 64, axis=0)
    facts = analyze_general_reduction(func)
    assert not isinstance(facts, str) and facts.axis == 0 and facts.column
    rows = analyze_general_reduction(sl.workloads.softmax(64, 64))
    assert not isinstance(rows, str) and rows.axis == -1 and not rows.column
    kernel = sl.build(rules.apply_default(func, "h100"), "h100")
    assert [spec.grid_for({}) for spec in kernel.launch] == [(2, 1, 1)]
    x = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    e = np.exp(x - x.max(axis=0))
    np.testing.assert_allclose(kernel.run_cpu(x, bounds_check=True), e / e.sum(axis=0), rtol=1e-5, atol=1e-7)


def mixed_axes() -> Func:
    """A max over columns and a sum over rows of one square matrix: no one layout serves both."""
    X = sl.placeholder((16, 16), "float32", "X")
    k1, k2 = sl.reduce_axis(16, "k"), sl.reduce_axis(16, "k")
    mx = sl.compute((16,), lambda j: sl.max(X[k1, j], axis=k1), "T_max")
    sm = sl.compute((16,), lambda i: sl.sum(X[i, k2], axis=k2), "T_sum")
    Y = sl.compute((16, 16), lambda i, j: X[i, j] - mx[j] + sm[i], "Y")
    return sl.func([X, Y], "mixed_axes")


def wrong_broadcast() -> Func:
    """Column maxima subtracted along the rows (``X[i, j] - max_k X[k, i]``): not a softmax of either axis."""
    X = sl.placeholder((16, 16), "float32", "X")
    k = sl.reduce_axis(16, "k")
    mx = sl.compute((16,), lambda j: sl.max(X[k, j], axis=k), "T_max")
    Y = sl.compute((16, 16), lambda i, j: X[i, j] - mx[i], "Y")
    return sl.func([X, Y], "wrong_broadcast")


def swapped_kept_axes() -> Func:
    """A reduction reading ``X[b, k, a]`` for its result ``[a, b]``: the kept axes out of order."""
    X = sl.placeholder((4, 8, 4), "float32", "X")
    k = sl.reduce_axis(8, "k")
    mx = sl.compute((4, 4), lambda a, b: sl.max(X[b, k, a], axis=k), "T_max")
    Y = sl.compute((4, 8, 4), lambda a, r, b: X[a, r, b] - mx[a, b], "Y")
    return sl.func([X, Y], "swapped_kept_axes")


@pytest.mark.parametrize(("make", "why"), [
    (mixed_axes, "the reductions reduce different axes of the output ([0, 1])"),
    (wrong_broadcast, "block Y reads the reduction result T_max at [i], not at the kept axes [j]"),
    (swapped_kept_axes, "reduction T_max reads X[b, k, a]"),
], ids=["mixed axes", "wrong broadcast", "swapped kept axes"])
def test_funcs_that_are_no_row_or_column_reduction_are_declined_with_the_reason(make: Callable[[], Func],
                                                                               why: str) -> None:
    func = make()
    assert why in str(analyze_general_reduction(func))
    assert rules.find_rule(func, "h100").name == "fallback"
    assert why in rules.explain(func, "h100")


def test_the_carver_ranks_column_configs_that_build(rng: np.random.Generator, toolchain: None) -> None:
    func = sl.workloads.softmax(300, 100, axis=0)
    ranked = carver.carve(func, "h100", 3)
    space = RULE.space(func, sl.hw.load("h100"))
    assert len(ranked) == 3
    for config in ranked["config"]:
        assert space.is_legal(config), config
        check_schedule(func, RULE.apply(func, "h100", config), rng, archs=("sm_90",))
    big = sl.workloads.softmax(4096, 4096, axis=0)
    estimate = carver.estimate(big, "h100", RULE.default_config(big, sl.hw.load("h100")))
    assert estimate["bound"] == "dram"


def test_the_workloads_check_their_axis() -> None:
    for make in (sl.workloads.softmax, sl.workloads.rmsnorm, sl.workloads.layernorm):
        for bad in (2, -2, True, "0"):
            with pytest.raises(sl.IRError, match=rf"axis={bad!r}; expected -1/1 \(last\) or 0 \(first\)"):
                make(8, 8, axis=bad)
        assert str(make(8, 8, axis=1)) == str(make(8, 8))
