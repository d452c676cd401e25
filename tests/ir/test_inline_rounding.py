"""fp16/bf16 arithmetic runs in float and rounds where it is stored or cast.  Inlining a stage removes its
store, so the inlined value carries the store's rounding as a cast; a cast of such arithmetic to its own
type is that rounding and is kept (a cast of a load, or of a max of loads, changes nothing and is dropped)."""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.expr import Cast, Load, cast
from schedlib.ir.rounding import rounded


def offset_and_back(dtype: str) -> sl.Func:
    """``C = (X + 1000) - 1000`` in two stages of ``dtype``, then doubled in a third."""
    X = sl.placeholder((4,), dtype, "X")
    A = sl.compute((4,), lambda i: X[i] + 1000.0, "A")
    B = sl.compute((4,), lambda i: A[i] - 1000.0, "B")
    return sl.func([X, sl.compute((4,), lambda i: B[i] * 2.0, "C")], "offset_and_back")


def _run(f: sl.Func | sl.Schedule, dtype: str) -> np.ndarray:
    X = np.full(4, 0.3, dtype=np.float16 if dtype == "float16" else np.float32)
    return np.asarray(sl.run_reference(f, {"X": X})["C"], dtype=np.float32)


@pytest.mark.parametrize(("dtype", "expected"), [("float16", 1.0), ("bfloat16", 0.0)])
def test_inlined_stages_round_as_their_stores_did(dtype: str, expected: float) -> None:
    """0.3 + 1000 is 1000.5 in fp16 and 1000 in bf16; inlined without the rounding, C was 0.6 for both."""
    f = offset_and_back(dtype)
    assert _run(f, dtype)[0] == expected
    s = sl.Schedule(f)
    s.compute_inline("B")
    s.compute_inline("A")
    assert _run(s, dtype)[0] == expected
    kernel = sl.build(sl.rules.apply_default(f, "h100"), "h100")
    X = np.full(4, 0.3, dtype=np.float16 if dtype == "float16" else np.float32)
    assert np.asarray(kernel.run_cpu(X), dtype=np.float32)[0] == expected


def test_reverse_compute_inline_keeps_the_producers_rounding() -> None:
    f = offset_and_back("float16")
    s = sl.Schedule(f)
    s.reverse_compute_inline("C")  # C's value takes B's, which rounded where B was stored
    s.compute_inline("A")
    assert _run(s, "float16")[0] == 1.0


def test_which_casts_to_a_narrow_type_round() -> None:
    X = sl.placeholder((4,), "float16", "X")
    x = X[0]
    assert isinstance((x + 1000.0).astype("float16"), Cast)  # arithmetic: the explicit cast is its rounding
    assert isinstance(rounded("bfloat16", sl.exp(x.astype("bfloat16"))), Cast)  # exp runs in float too
    assert isinstance(x.astype("float16"), Load)  # a load holds an fp16 value already
    assert not isinstance(rounded("float16", sl.maximum(x, 0.0)), Cast)  # max returns one of its operands
    assert cast("float16", x + 1000.0) == x + 1000.0  # type promotion inside an expression does not round
    f32 = sl.placeholder((4,), "float32", "Y")[0] + 1.0
    assert f32.astype("float32") is f32  # fp32 arithmetic rounds as it goes


def test_an_explicit_cast_of_fp16_arithmetic_rounds_in_the_reference_and_the_kernel() -> None:
    X = sl.placeholder((4,), "float16", "X")
    f = sl.func([X, sl.compute((4,), lambda i: ((X[i] + 1000.0).astype("float16") - 1000.0) * 2.0, "C")])
    x = np.full(4, 0.3, dtype=np.float16)
    assert sl.run_reference(f, {"X": x})["C"][0] == 1.0
    assert sl.build(sl.rules.apply_default(f, "h100"), "h100").run_cpu(x)[0] == 1.0


def test_a_constant_the_type_cannot_hold_is_rounded_where_the_stage_stored_it() -> None:
    """fp16 constants stay the float literals they were written as: ``max(x, 0.1)`` stored holds fp16's
    0.09998, and a fill of 1e5 is inf in fp16.  Inlined, both were taken unrounded (a kernel gave 0 for
    (A - 0.1) * 1e4 at x = -1, where the func gives -0.244, and 0 where it gives inf)."""
    X = sl.placeholder((4,), "float16", "X")
    A = sl.compute((4,), lambda i: sl.maximum(X[i], 0.1), "A")
    B = sl.compute((4,), lambda i: sl.if_then_else(X[i] > 0.0, X[i], 1e5), "B")
    C = sl.compute((4,), lambda i: ((A[i] - 0.1) * 1e4 + (B[i] - 1e5)).astype("float32"), "C")
    f = sl.func([X, C], "held_constants")
    x = np.array([-1.0, -1.0, 2.0, 2.0], dtype=np.float16)
    want = sl.run_reference(f, {"X": x})["C"]
    assert np.isposinf(want[0]) and np.isfinite(want[2])  # 1e5 became inf where B stored it
    got = sl.build(sl.rules.apply_default(f, "h100"), "h100").run_cpu(x)
    np.testing.assert_array_equal(got, want)
    assert not isinstance(rounded("float16", sl.maximum(X[0], 0.5)), Cast)  # 0.5 is an fp16 value
