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


@pytest.mark.parametrize(("make", "target", "rule"), [
    (lambda: matmul_with_column_bias("float32", 40, 36, 24), "h100", "matmul"),
    (lambda: matmul_with_column_bias("float16", 128, 128, 64), "a100", "matmul"),  # mma.sync's fragment epilogue
    (elementwise_keepdims, "h100", "elementwise"),
], ids=["matmul-simt", "matmul-mma", "elementwise"])
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
