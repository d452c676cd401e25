"""Integer arithmetic on loaded values wraps at its dtype's width, and a schedule must not change that: the
simplifier keeps its affine algebra to index arithmetic, and constants are checked against their dtype."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.expr import Const, binary

A8 = np.array([100, 127, -100, 3, -128, 64, 1, -1], np.int8)


def int8_func(body: Callable, dtype: str = "int8") -> sl.Func:
    A = sl.placeholder((8,), dtype, "A")
    return sl.func([A, sl.compute((8,), lambda i: body(A, i), "C")], "ints")


@pytest.mark.parametrize("body", [
    lambda A, i: A[i] * 2 // 2,
    lambda A, i: sl.if_then_else(A[i] + 1 > A[i], 1, 0),
    lambda A, i: A[i] + 100 + 100,
    lambda A, i: (A[i] * 3 - A[i] * 2) % 7,
], ids=["mul-floordiv", "compare", "two-adds", "mod"])
def test_a_schedule_keeps_int8_wraparound(body: Callable) -> None:
    func = int8_func(body)
    with np.errstate(over="ignore"):
        want = sl.run_reference(func, {"A": A8})["C"]
        s = sl.Schedule(func)
        outer, inner = s.split(s.get_loops("C")[0], [None, 3])
        s.reorder(inner, outer)
        got = sl.run_reference(s, {"A": A8})["C"]
    np.testing.assert_array_equal(got, want)


def test_an_inlined_int8_stage_keeps_its_wraparound() -> None:
    A = sl.placeholder((8,), "int8", "A")
    B = sl.compute((8,), lambda i: A[i] * 2, "B")
    C = sl.compute((8,), lambda i: B[i] // 2, "C")
    func = sl.func([A, C], "inlined")
    s = sl.Schedule(func)
    s.compute_inline("B")
    want = sl.run_reference(func, {"A": A8})["C"]
    np.testing.assert_array_equal(want[:3], [-28, -1, 28])  # 100 * 2 wraps to -56
    np.testing.assert_array_equal(sl.run_reference(s, {"A": A8})["C"], want)


def test_int32_products_of_loads_are_not_folded_into_an_out_of_range_constant() -> None:
    func = int8_func(lambda A, i: A[i] * 65536 * 65536 + 1, "int32")
    x = np.arange(8, dtype=np.int32)
    s = sl.Schedule(func)
    s.split(s.get_loops("C")[0], [None, 4])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(sl.run_reference(s, {"A": x})["C"], np.ones(8, np.int32))


def test_index_arithmetic_is_still_simplified() -> None:
    s = sl.Schedule(sl.workloads.elementwise((64,), ("relu",)))
    loop = s.get_loops(s.blocks[0])[0]
    outer, inner = s.split(loop, [None, 16])
    fused = s.fuse(outer, inner)
    assert "// 16" not in str(s) and "% 16" not in str(s), str(s)
    assert fused in str(s)


def test_an_int8_constant_out_of_range_is_refused_and_int8_folds_wrap() -> None:
    A = sl.placeholder((8,), "int8", "A")
    with pytest.raises(sl.IRError, match=r"constant 300 does not fit int8 \(-128 to 127\)"):
        sl.compute((8,), lambda i: A[i] + 300, "C")
    assert binary("*", Const(100, "int8"), Const(2, "int8")) == Const(-56, "int8")
    widened = sl.compute((8,), lambda i: A[i].astype("int32") + 300, "C")  # the way the message suggests
    out = sl.run_reference(sl.func([A, widened], "wide"), {"A": A8})["C"]
    np.testing.assert_array_equal(out, A8.astype(np.int32) + 300)


def test_int8_index_arithmetic_wraps_too() -> None:
    """``int8(i) * 2 // 2`` is i only below 64; at i = 64 the product wraps to -128 and the result is -64."""
    X = sl.placeholder((128,), "int8", "X")
    func = sl.func([X, sl.compute((128,), lambda i: X[i] + (i.astype("int8") * 2) // 2, "Y")], "index8")
    x = np.zeros(128, np.int8)
    with np.errstate(over="ignore"):
        want = sl.run_reference(func, {"X": x})["Y"]
        s = sl.Schedule(func)
        s.split(s.get_loops("Y")[0], [None, 32])
        got = sl.run_reference(s, {"X": x})["Y"]
    assert want[64] == -64 and want[63] == 63
    np.testing.assert_array_equal(got, want)


def test_a_constant_cast_to_int8_wraps_as_astype_does() -> None:
    X = sl.placeholder((4,), "int8", "X")
    func = sl.func([X, sl.compute((4,), lambda i: X[i] + sl.maximum(300, 0).astype("int8"), "Y")], "cast8")
    x = np.array([1, -1, 100, 0], np.int8)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(sl.run_reference(func, {"X": x})["Y"], x + np.int8(44))
