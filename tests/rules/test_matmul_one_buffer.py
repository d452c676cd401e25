"""One buffer read as both operands (a Gram matrix ``G = X @ X.T``) takes the matmul rule's SIMT template:
each read of X gets its own shared tile (``cache_read(..., occurrence=0)``).  It took the serial fallback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib.ir.func import Func

from .helpers import check_schedule

MATMUL = rules.get_rule("matmul")
H100 = sl.hw.load("h100")


def gram(n: int | sl.Expr, depth: int, dtype: str = "float32", transposed: bool = False,
         relu: bool = False) -> Func:
    """``G[i, j] = sum_k X[i, k] * X[j, k]`` (``X[k, i] * X[k, j]`` when ``transposed``), accumulated in fp32."""
    X = sl.placeholder((depth, n) if transposed else (n, depth), dtype, "X")
    k = sl.reduce_axis(depth, "k")

    def at(r: sl.Expr) -> sl.Expr:
        return (X[k, r] if transposed else X[r, k]).astype("float32")

    G = sl.compute((n, n), lambda i, j: sl.sum(at(i) * at(j), axis=k), "G")
    outs = [sl.compute((n, n), lambda i, j: sl.maximum(G[i, j], 0.0), "D")] if relu else [G]
    return sl.func([X, *outs], "gram")


def test_a_gram_matrix_is_a_matmul_and_tensor_cores_say_why_not() -> None:
    f = gram(64, 64, "float16")
    assert rules.find_rule(f, "h100").name == "matmul"
    space = MATMUL.space(f, H100)
    tc = {"block_m": 64, "block_n": 64, "block_k": 32, "thread_m": 4, "thread_n": 8, "vector": 1, "split_k": 1,
          "stages": 3, "tensor_core": True, "raster": 1}
    assert "X is read as both operands" in space.reason(tc)
    assert MATMUL.default_config(f, H100)["tensor_core"] is False
    # a product of one read with itself is no matmul
    X = sl.placeholder((8, 8), "float32", "X")
    k = sl.reduce_axis(8, "k")
    same = sl.func([X, sl.compute((8, 8), lambda i, j: sl.sum(X[i, k] * X[i, k] * X[j, 0], axis=k), "G")])
    assert rules.find_rule(same, "h100").name != "matmul"


@pytest.mark.parametrize(("make", "config", "spills"), [
    (lambda: gram(40, 24), None, False),
    (lambda: gram(33, 70, "float16", transposed=True), None, False),
    (lambda: gram(sl.var("N"), 96, "bfloat16"), None, False),
    (lambda: gram(64, 512, relu=True), {"block_m": 32, "block_n": 32, "block_k": 16, "thread_m": 4, "thread_n": 4,
                                        "vector": 4, "split_k": 2, "stages": 2, "tensor_core": False, "raster": 1},
     False),
    # the split-K default (32 x 32 x 32 tiles, 16 slices): ptxas spills 4 B on sm_80, 24 B on sm_90 (nvcc 13.0)
    (lambda: gram(64, 8192, relu=True), None, 24),
], ids=["fp32", "fp16-transposed", "bf16-symbolic", "split-relu", "split-default"])
def test_gram_kernels_match_the_reference(make: Callable[[], Func], config: dict[str, Any] | None,
                                          spills: bool | int, rng: np.random.Generator) -> None:
    f = make()
    sch = MATMUL.apply(f, H100, config)
    assert sch.rule == "matmul" and sch.config["tensor_core"] is False
    sizes = ({"N": 37}, {"N": 5}) if f.symbols else ({},)
    check_schedule(f, sch, rng, sizes=sizes, spills_allowed=spills)


def test_the_carver_reads_the_one_buffer_from_dram_once() -> None:
    """X is read as both operands but lies in DRAM once: its bytes count once in the compulsory traffic."""
    f = gram(1024, 1024)
    row = sl.carver.estimate(f, H100, MATMUL.default_config(f, H100))
    assert row["compulsory_bytes"] == 1024 * 1024 * 4 * 2  # X read once, G written once
