"""Operands broadcast with a kept dimension of one (numpy's keepdims: ``bias[i, 0]`` of a ``(M, 1)`` bias,
``c[0, j]`` of a ``(1, N)`` row) are element-wise reads: an element-wise func and a matmul epilogue that take
them get their rules' templates, not the serial fallback, and match the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib.ir.func import Func

from .helpers import check_schedule


def matmul_with_column_bias(dtype: str, M: int, N: int, K: int) -> Func:
    A, B = sl.placeholder((M, K), dtype, "A"), sl.placeholder((K, N), dtype, "B")
    scale, bias = sl.placeholder((M,), "float32", "s"), sl.placeholder((M, 1), "float32", "bias")
    k = sl.reduce_axis(K, "k")
    C = sl.compute((M, N), lambda i, j: sl.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C")
    D = sl.compute((M, N), lambda i, j: sl.tanh(C[i, j] * scale[i] + bias[i, 0]).astype(dtype), "D")
    return sl.func([A, B, scale, bias, D], "mm_column_bias")


def elementwise_keepdims() -> Func:
    X = sl.placeholder((64, 256), "float16", "X")
    row, col = sl.placeholder((1, 256), "float16", "row"), sl.placeholder((64, 1), "float32", "col")
    Y = sl.compute((64, 256), lambda i, j: (X[i, j].astype("float32") * row[0, j].astype("float32")
                                            + col[i, 0]).astype("float16"), "Y")
    return sl.func([X, row, col, Y], "keepdims")


def softmax_times_gain(rows: int = 32, cols: int = 700) -> Func:
    X, gain = sl.placeholder((rows, cols), "float32", "X"), sl.placeholder((1, cols), "float32", "g")
    k1, k2 = sl.reduce_axis(cols, "k"), sl.reduce_axis(cols, "k")
    mx = sl.compute((rows,), lambda i: sl.max(X[i, k1], axis=k1), "mx")
    ex = sl.compute((rows, cols), lambda i, j: sl.exp(X[i, j] - mx[i]), "ex")
    sm = sl.compute((rows,), lambda i: sl.sum(ex[i, k2], axis=k2), "sm")
    Y = sl.compute((rows, cols), lambda i, j: ex[i, j] / sm[i] * gain[0, j], "Y")
    return sl.func([X, gain, Y], "softmax_gain")


def row_sum_times_column(rows: int = 64, cols: int = 1000) -> Func:
    X, col = sl.placeholder((rows, cols), "float32", "X"), sl.placeholder((rows, 1), "float32", "col")
    k = sl.reduce_axis(cols, "k")
    s = sl.compute((rows,), lambda i: sl.sum(X[i, k], axis=k), "s")
    return sl.func([X, col, sl.compute((rows,), lambda i: s[i] * col[i, 0], "t")], "row_sum_col")


@pytest.mark.parametrize(("make", "target", "rule"), [
    (lambda: matmul_with_column_bias("float32", 40, 36, 24), "h100", "matmul"),
    (lambda: matmul_with_column_bias("float16", 128, 128, 64), "a100", "matmul"),  # mma.sync's fragment epilogue
    (elementwise_keepdims, "h100", "elementwise"),
    (softmax_times_gain, "h100", "general_reduction"),  # read [0, j]: once taken for a transpose
    (row_sum_times_column, "h100", "reduction"),
], ids=["matmul-simt", "matmul-mma", "elementwise", "softmax-gain", "row-sum-column"])
def test_keepdims_operands_take_the_rule_template(make: Callable[[], Func], target: str, rule: str,
                                                  rng: np.random.Generator) -> None:
    """Regression: a constant index made the read 'not element-wise', so both went to the serial fallback,
    and explain blamed the epilogue block."""
    f = make()
    sch = rules.apply_default(f, target)
    assert sch.rule == rule, rules.explain(f, target)
    if rule == "matmul":
        assert sch.config["tensor_core"] is (target == "a100")
    check_schedule(f, sch, rng)
