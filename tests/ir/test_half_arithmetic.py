"""fp16/bf16 arithmetic in the reference is the generated CUDA's: operands widened to float32, one rounding
where a value is stored or cast.  Before, the reference rounded after every operation and differed from the
kernel by an ulp in about a quarter of the elements (501 of 2000 for ``x * x + x * 3.1`` in fp16)."""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.dtype import round_to_dtype


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reference_gives_the_kernels_bits(dtype: str) -> None:
    n = 2000
    X = sl.placeholder((n,), dtype, "X")
    Y = sl.compute((n,), lambda i: X[i] * X[i] + X[i] * 3.1 - sl.if_then_else(X[i] > 5, X[i] * 0.7, 1.5)
                   + sl.sqrt(X[i]) / 3, "Y")
    f = sl.func([X, Y])
    x = round_to_dtype((np.random.default_rng(1).random(n) * 10).astype(np.float32), dtype)
    ref = sl.run_reference(f, {"X": x})["Y"]
    got = sl.build(f, "h100").run_cpu(x)
    assert ref.dtype == got.dtype
    np.testing.assert_array_equal(ref, got)
    # the rounding happens once, at the store: the float32 result of the same expression, rounded
    x32 = x.astype(np.float32)
    once = x32 * x32 + x32 * np.float32(3.1) - np.where(x32 > 5, x32 * np.float32(0.7), np.float32(1.5)) \
        + np.sqrt(x32) / np.float32(3)
    np.testing.assert_array_equal(ref, round_to_dtype(once, dtype))


def test_an_explicit_cast_still_rounds() -> None:
    X = sl.placeholder((4,), "float32", "X")
    f = sl.func([X, sl.compute((4,), lambda i: X[i].astype("float16").astype("float32") * 3, "Y")])
    x = np.array([0.1, 1 / 3, 1000.3, 2.0 ** -20], np.float32)
    want = x.astype(np.float16).astype(np.float32) * 3
    np.testing.assert_array_equal(sl.run_reference(f, {"X": x})["Y"], want)
    np.testing.assert_array_equal(sl.build(f, "h100").run_cpu(x), want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_long_narrow_sum_is_added_in_order_when_the_grid_is_cut(dtype: str) -> None:
    """2M points, past the reference's chunk: an fp16/bf16 sum rounds at every step, so the grid is cut along
    k (each chunk one step of every row) rather than along the rows (one row, 4096 steps, per chunk: 11 s for
    the fp16 case before; well under a second now), and each row still takes its terms in order."""
    rows, depth = 512, 4096
    A = sl.placeholder((rows, depth), dtype, "A")
    B = sl.placeholder((depth,), dtype, "B")
    k = sl.reduce_axis(depth, "k")
    f = sl.func([A, B, sl.compute((rows,), lambda i: sl.sum(A[i, k] * B[k], axis=k), "S")])
    rng = np.random.default_rng(2)
    a = round_to_dtype(rng.standard_normal((rows, depth)).astype(np.float32), dtype)
    b = round_to_dtype(rng.standard_normal(depth).astype(np.float32), dtype)
    acc = round_to_dtype(np.zeros(rows, np.float32), dtype)
    for step in range(depth):  # the kernel's order: the float product added, the sum rounded, step by step
        acc = round_to_dtype(acc.astype(np.float32) + a[:, step].astype(np.float32) * np.float32(b[step]), dtype)
    np.testing.assert_array_equal(sl.run_reference(f, {"A": a, "B": b})["S"], acc)
