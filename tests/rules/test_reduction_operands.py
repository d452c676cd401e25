"""The Reduction rule on reductions of several operands and of computed values.

Row-wise dot products, matrix-vector products written with a 1-D output, per-row scales, ``sum(exp(x))``
written as two stages and a dequantised weight are taken by the cross-thread template (inner or outer
layout by which axis is contiguous), each built, emulated against the reference and compile-checked.
Funcs whose operands disagree on the axis order, or whose earlier stage must be stored, are declined with
the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib.ir.func import Func

from .helpers import check_schedule


def row_dot(rows: int = 37, cols: int = 300, dtype: str = "float32") -> Func:
    """``O[i] = sum_k A[i, k] * B[i, k]``."""
    A, B = (sl.placeholder((rows, cols), dtype, n) for n in "AB")
    k = sl.reduce_axis(cols, "k")
    O = sl.compute((rows,), lambda i: sl.sum(A[i, k].astype("float32") * B[i, k].astype("float32"), axis=k), "O")
    return sl.func([A, B, O], "row_dot")


def matvec(rows: int = 45, cols: int = 200) -> Func:
    """``y[i] = sum_k W[i, k] * x[k]``: a matrix-vector product with a 1-D output (x is a broadcast)."""
    W = sl.placeholder((rows, cols), "float16", "W")
    x = sl.placeholder((cols,), "float16", "x")
    k = sl.reduce_axis(cols, "k")
    y = sl.compute((rows,), lambda i: sl.sum(W[i, k].astype("float32") * x[k].astype("float32"), axis=k), "y")
    return sl.func([W, x, y], "matvec")


def column_matvec(rows: int = 70, cols: int = 96) -> Func:
    """``y[n] = sum_k W[k, n] * x[k]``: the reduced axis is the outer one (outer layout)."""
    W = sl.placeholder((rows, cols), "float32", "W")
    x = sl.placeholder((rows,), "float32", "x")
    k = sl.reduce_axis(rows, "k")
    y = sl.compute((cols,), lambda n: sl.sum(W[k, n] * x[k], axis=k), "y")
    return sl.func([W, x, y], "column_matvec")


def scaled_rows(rows: int | sl.Expr = 19, cols: int = 130) -> Func:
    """``O[i] = sum_k X[i, k] * s[i]`` with a per-row scale, then ``+ 1`` as an epilogue."""
    X = sl.placeholder((rows, cols), "float32", "X")
    s = sl.placeholder((rows,), "float32", "s")
    k = sl.reduce_axis(cols, "k")
    O = sl.compute((rows,), lambda i: sl.sum(X[i, k] * s[i], axis=k), "O")
    P = sl.compute((rows,), lambda i: O[i] + 1.0, "P")
    return sl.func([X, s, P], "scaled_rows")


def sum_exp(rows: int = 24, cols: int = 257) -> Func:
    """``S[i] = sum_k E[i, k]`` where ``E = exp(X)`` is a stage of its own."""
    X = sl.placeholder((rows, cols), "float32", "X")
    E = sl.compute((rows, cols), lambda i, j: sl.exp(X[i, j] * 0.25), "E")
    k = sl.reduce_axis(cols, "k")
    S = sl.compute((rows,), lambda i: sl.sum(E[i, k], axis=k), "S")
    return sl.func([X, S], "sum_exp")


def dequant_matvec(rows: int = 64, cols: int = 160) -> Func:
    """``y[i] = sum_k (Wq[i, k] * scale[i]) * x[k]`` with the dequantised weight computed by two stages."""
    Wq = sl.placeholder((rows, cols), "int8", "Wq")
    scale = sl.placeholder((rows,), "float32", "scale")
    x = sl.placeholder((cols,), "float32", "x")
    Wf = sl.compute((rows, cols), lambda i, j: Wq[i, j].astype("float32"), "Wf")
    W = sl.compute((rows, cols), lambda i, j: Wf[i, j] * scale[i], "W")
    k = sl.reduce_axis(cols, "k")
    y = sl.compute((rows,), lambda i: sl.sum(W[i, k] * x[k], axis=k), "y")
    return sl.func([Wq, scale, x, y], "dequant_matvec")


TAKEN: dict[str, tuple[Callable[[], Func], bool, tuple[str, ...]]] = {
    # id: (make, inner layout, prologue stages inlined)
    "row-dot": (row_dot, True, ()),
    "row-dot-fp16": (lambda: row_dot(33, 512, "float16"), True, ()),
    "matvec": (matvec, True, ()),
    "column-matvec": (column_matvec, False, ()),
    "scaled-rows": (scaled_rows, True, ()),
    "sum-exp": (sum_exp, True, ("E",)),
    "dequant-matvec": (dequant_matvec, True, ("W", "Wf")),
}


@pytest.mark.parametrize("key", list(TAKEN))
def test_reduction_rule_takes_and_matches(key: str, rng: np.random.Generator, toolchain: None) -> None:
    make, inner, prologue = TAKEN[key]
    func = make()
    assert rules.find_rule(func, "h100").name == "reduction", rules.explain(func, "h100")
    facts = rules.get_rule("reduction").analyze(func, sl.hw.load("h100"))
    assert facts.inner is inner and facts.prologue == prologue
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "reduction"
    assert [b for b in prologue if b in sch.blocks] == []  # inlined: nothing of them is stored
    check_schedule(func, sch, rng)


def test_points_across_the_space_match(rng: np.random.Generator, toolchain: None) -> None:
    """Configs across the dequantised matrix-vector product's space (several rows per block, a vector that
    does not divide the row, split rows) build and match."""
    func = dequant_matvec(12, 72)
    rule = rules.get_rule("reduction")
    space = rule.space(func, "h100")
    for config in ({"rows_per_block": 4, "threads_k": 32, "vector": 4, "blocks_per_row": 1},
                   {"rows_per_block": 2, "threads_k": 64, "vector": 1, "blocks_per_row": 1},
                   {"rows_per_block": 1, "threads_k": 32, "vector": 2, "blocks_per_row": 2},
                   {"rows_per_block": 1, "threads_k": 32, "vector": 1, "blocks_per_row": 2}):
        assert space.is_legal(config), space.reason(config)
        check_schedule(func, rule.apply(func, "h100", config), rng, archs=("sm_90",))


def test_symbolic_rows(rng: np.random.Generator, toolchain: None) -> None:
    n = sl.var("n")
    func = scaled_rows(n)
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "reduction"
    check_schedule(func, sch, rng, sizes=({"n": 1}, {"n": 29}))


def mixed_orders() -> Func:
    """``O[i] = sum_k A[i, k] * B[k, i]``: the operands walk the axes in different orders."""
    A = sl.placeholder((20, 30), "float32", "A")
    B = sl.placeholder((30, 20), "float32", "B")
    k = sl.reduce_axis(30, "k")
    O = sl.compute((20,), lambda i: sl.sum(A[i, k] * B[k, i], axis=k), "O")
    return sl.func([A, B, O], "mixed")


def stored_prologue() -> Func:
    """``E = exp(X)`` is an output as well as the reduction's operand: it must be stored."""
    X = sl.placeholder((8, 40), "float32", "X")
    E = sl.compute((8, 40), lambda i, j: sl.exp(X[i, j]), "E")
    k = sl.reduce_axis(40, "k")
    S = sl.compute((8,), lambda i: sl.sum(E[i, k], axis=k), "S")
    return sl.func([X, E, S], "stored")


def shifted_prologue() -> Func:
    """The stage before the reduction reads a shifted element: not element-wise, so not inlined."""
    X = sl.placeholder((8, 41), "float32", "X")
    D = sl.compute((8, 40), lambda i, j: X[i, j + 1] - X[i, j], "D")
    k = sl.reduce_axis(40, "k")
    S = sl.compute((8,), lambda i: sl.sum(D[i, k], axis=k), "S")
    return sl.func([X, S], "shifted")


@pytest.mark.parametrize("make, why", [
    (mixed_orders, "block O reads its operands in different axis orders: (i, k), (k, i)"),
    (stored_prologue, "block E before S writes func output E, which must be stored"),
    (shifted_prologue, "block D before S is not element-wise"),
], ids=["mixed-orders", "stored-prologue", "shifted-prologue"])
def test_reduction_rule_declines_with_reason(make: Callable[[], Func], why: str, rng: np.random.Generator,
                                             toolchain: None) -> None:
    func = make()
    assert rules.get_rule("reduction").applies(func, "h100") == why
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "fallback"
    check_schedule(func, sch, rng, archs=("sm_90",))


def test_an_inlined_fp16_stage_rounds_as_its_store_did() -> None:
    """A row sum of ``(X + 1000) - 1000`` in two fp16 stages: each stage rounds (0.3 -> 0.5), inlined too."""
    X = sl.placeholder((2, 64), "float16", "X")
    A = sl.compute((2, 64), lambda i, c: X[i, c] + 1000.0, "A")
    B = sl.compute((2, 64), lambda i, c: A[i, c] - 1000.0, "B")
    k = sl.reduce_axis(64, "k")
    f = sl.func([X, sl.compute((2,), lambda i: sl.sum(B[i, k].astype("float32"), axis=k), "S")], "offset_sum")
    sch = sl.rules.apply_default(f, "h100")
    assert sch.rule == "reduction"
    x = np.full((2, 64), 0.3, dtype=np.float16)
    np.testing.assert_array_equal(sl.build(sch, "h100").run_cpu(x), np.full(2, 32.0, dtype=np.float32))
