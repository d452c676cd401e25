"""Generated CUDA computes what the reference executor computes for integer expressions.

The IR's ``//`` and ``%`` floor, and integer arithmetic keeps the dtype the IR gives it (int8 wraps
around); C truncates and promotes to int.  The kernels run on the CPU emulator against run_reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.expr import Expr


def _kernel_and_reference(func: sl.Func, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Run ``func`` (one output stage over 8 elements, one CUDA block of 8 threads) both ways."""
    (out,) = func.outputs
    s = sl.Schedule(func)
    outer, inner = s.split(s.get_loops(out)[0], [None, 8])
    s.bind(outer, "blockIdx.x")
    s.bind(inner, "threadIdx.x")
    expected = sl.run_reference(s, inputs)[out]
    got = sl.build(s, "sm_90").run_cpu(*(inputs[name] for name in func.inputs), bounds_check=True)
    return np.asarray(got), expected


def _gather(index: Callable[[Expr], Expr]) -> sl.Func:
    X = sl.placeholder((8,), "float32", "X")
    return sl.func([X, sl.compute((8,), lambda i: X[index(i)], "Y")])


GATHERS: list[tuple[str, Callable[[Expr], Expr], list[int]]] = [
    # Regression: C's truncating '/' gave [1, 1, 1, 1, 1, 1, 1, 2] for the first one.
    ("floordiv", lambda i: (i - 3) // 4 + 1, [0, 0, 0, 1, 1, 1, 1, 2]),
    ("floormod", lambda i: (i - 3) % 4, [1, 2, 3, 0, 1, 2, 3, 0]),
    ("negative-divisor", lambda i: 7 - i // -2 - 4, [3, 4, 4, 5, 5, 6, 6, 7]),
]


@pytest.mark.emulator
@pytest.mark.parametrize(("label", "index", "want"), GATHERS, ids=[g[0] for g in GATHERS])
def test_index_division_floors_with_negative_operands(label: str, index: Callable[[Expr], Expr],
                                                      want: list[int]) -> None:
    x = np.arange(8, dtype=np.float32)
    got, expected = _kernel_and_reference(_gather(index), {"X": x})
    np.testing.assert_array_equal(expected, want)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_data_division_floors_for_every_sign(dtype: str) -> None:
    # Regression: sl_floordiv stepped the quotient the wrong way for a negative divisor (7 // -2 gave -3).
    A = sl.placeholder((8,), dtype, "A")
    B = sl.placeholder((8,), dtype, "B")
    Q = sl.compute((8,), lambda i: A[i] // B[i] * 100 + A[i] % B[i], "Q")
    a = np.array([-7, 7, -7, 7, 6, -6, 0, 5], dtype=dtype)
    b = np.array([2, -2, -2, 2, 3, -3, 5, -1], dtype=dtype)
    got, expected = _kernel_and_reference(sl.func([A, B, Q]), {"A": a, "B": b})
    np.testing.assert_array_equal(expected, (a // b) * 100 + a % b)
    np.testing.assert_array_equal(got, expected)


INT8_OPS: list[tuple[str, Callable[[Any, Any], Any], int, int]] = [
    # Regression: C computed 100 * 100 in int (10000); int8 arithmetic wraps to 16.
    ("mul", lambda x, y: x * y, 100, 100),
    ("add", lambda x, y: x + y, 100, 100),
    ("sub", lambda x, y: x - y, -100, 100),
    ("neg", lambda x, y: -x - y, -128, 0),
    ("floordiv", lambda x, y: x // y, -128, -1),
]


@pytest.mark.emulator
@pytest.mark.parametrize(("label", "body", "a", "b"), INT8_OPS, ids=[op[0] for op in INT8_OPS])
def test_int8_arithmetic_wraps_like_the_reference(label: str, body: Callable[[Any, Any], Any], a: int,
                                                  b: int) -> None:
    A = sl.placeholder((8,), "int8", "A")
    B = sl.placeholder((8,), "int8", "B")
    C = sl.compute((8,), lambda i: body(A[i], B[i]).astype("int32"), "C")
    x = {"A": np.full(8, a, np.int8), "B": np.full(8, b, np.int8)}
    got, expected = _kernel_and_reference(sl.func([A, B, C]), x)
    with np.errstate(over="ignore"):  # the wraparound is the point
        want = body(np.full(8, a, np.int8), np.full(8, b, np.int8)).astype(np.int32)
    np.testing.assert_array_equal(expected, want)
    np.testing.assert_array_equal(got, expected)


def test_non_negative_index_arithmetic_stays_plain_c() -> None:
    """Loop variables and positive constants divide with C's '/' and '%': no helper calls in the kernel.  A fused
    index taken apart and put back together (the flat address of a row-major read) is the fused index again."""
    def fused_kernel_source(f: sl.Func, block: str) -> str:
        s = sl.Schedule(f)
        fused = s.fuse(*s.get_loops(block))
        outer, inner = s.split(fused, [None, 32])
        s.bind(outer, "blockIdx.x")
        s.bind(inner, "threadIdx.x")
        return sl.build(s, "sm_90").source

    source = fused_kernel_source(sl.workloads.transpose(12, 10), "Y")  # X[i, j] over Y's (j, i): nothing folds
    assert " / 12)" in source and " % 12)" in source
    assert "sl_floor" not in source
    source = fused_kernel_source(sl.workloads.elementwise((12, 10), ("add",)), "E0")
    body = source[source.index('extern "C"'):]
    assert " / 10)" not in body and " % 10)" not in body, body


def test_the_smallest_ints_are_literals_of_their_own_type() -> None:
    from schedlib.codegen.cuda_expr import literal

    assert literal(-(2**31), "int32") == "(-2147483647 - 1)" and literal(-(2**31) + 1, "int32") == "-2147483647"
    assert literal(-(2**63), "int64") == "(-9223372036854775807LL - 1)" and literal(5, "int64") == "5LL"


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["int32", "int8"])
def test_integer_division_by_zero_or_minus_one_matches_the_reference(dtype: str) -> None:
    """C leaves x / 0 and INT_MIN / -1 undefined and x86 traps (the emulator died with SIGFPE); the kernels
    answer as numpy and the reference executor do: 0 for a zero divisor, INT_MIN // -1 wraps."""
    X = sl.placeholder((6,), dtype, "X")
    D = sl.placeholder((6,), dtype, "D")
    Q = sl.compute((6,), lambda i: X[i] // D[i], "Q")
    R = sl.compute((6,), lambda i: X[i] % D[i], "R")
    func = sl.func([X, D, Q, R], "divide")
    low = np.iinfo(dtype).min
    x = np.array([7, low, 5, -7, low, 9], dtype)
    d = np.array([0, -1, -1, 2, 0, -4], dtype)
    with np.errstate(divide="ignore", over="ignore"):
        want = sl.run_reference(func, {"X": x, "D": d})
    q, r = sl.build(func, "h100").run_cpu(x, d)
    np.testing.assert_array_equal(q, want["Q"])
    np.testing.assert_array_equal(r, want["R"])
    assert q[0] == 0 and q[1] == low and r[4] == 0
