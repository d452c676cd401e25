"""Integer and bool dtypes end to end, checked against numpy directly.

``check_schedule`` compares a kernel with ``run_reference`` of the same func, so a meaning the workload and the
reference share (an int8 dot product wrapped to int8) passes there; these tests state numpy's answer instead.
"""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.errors import IRError
from schedlib.ir.func import Func
from schedlib.ir.tensor import identity


def run(func: Func, rule: str, *arrays: np.ndarray) -> np.ndarray:
    """The default schedule of ``func`` on the CPU emulator (bounds checked), after checking that ``rule``
    made it (so the rule's template is what is tested, not the serial fallback)."""
    sch = rules.apply_default(func, "h100")
    assert sch.rule == rule, rules.explain(func, "h100")
    return sl.build(sch, "h100").run_cpu(*arrays, bounds_check=True)


# ---- max / min over bool --------------------------------------------------------------------------------------

def test_bool_identities_are_any_and_all() -> None:
    """max over bool is "any" (starts False), min is "all" (starts True)."""
    assert identity("max", "bool").value is False and identity("min", "bool").value is True
    assert identity("max", "bool").dtype == identity("min", "bool").dtype == "bool"


def test_a_reduction_without_an_identity_names_op_and_dtype() -> None:
    with pytest.raises(IRError, match=r"no identity for a max reduction over 'uint16'"):
        identity("max", "uint16")
    with pytest.raises(IRError, match=r"no identity for reduction 'prod'"):
        identity("prod", "float32")


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("rows, cols, axis", [(10, 33, -1), (10, 33, 0), (4, 300, -1)])
def test_bool_max_and_min_reduce_like_numpy_any_and_all(op: str, rows: int, cols: int, axis: int,
                                                         rng: np.random.Generator, toolchain: None) -> None:
    f = wl.reduce(rows, cols, op, axis=axis, dtype="bool")
    assert f.buffer(f.outputs[0]).dtype == "bool"
    # mostly False for any, mostly True for all, so that both answers occur
    x = rng.random((rows, cols)) < (0.03 if op == "max" else 0.97)
    want = x.max(axis=axis) if op == "max" else x.min(axis=axis)
    got = run(f, "reduction", x)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sl.run_reference(f, {"X": x})["R"], want)


def test_bool_max_through_the_compute_api(rng: np.random.Generator, toolchain: None) -> None:
    X = sl.placeholder((4, 40), "bool", "Xb")
    r = sl.reduce_axis(40, "r")
    Y = sl.compute((4,), lambda i: sl.max(X[i, r], axis=r), "Y")
    f = sl.func([X, Y], "bool_any")
    x = np.zeros((4, 40), bool)
    x[1, 39] = x[3, 0] = True
    np.testing.assert_array_equal(run(f, "reduction", x), x.any(axis=1))


# ---- GEMV over integers ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("trans", [False, True])
def test_int8_gemv_keeps_the_int32_dot_product_like_matmul(trans: bool, rng: np.random.Generator,
                                                             toolchain: None) -> None:
    f = wl.gemv(100, 257, "int8", trans=trans, batch=2)
    assert f.buffer(f.outputs[0]).dtype == "int32" == wl.matmul(100, 100, 257, "int8").buffer("C").dtype
    x = rng.integers(-128, 128, (2, 257), dtype=np.int8)
    w = rng.integers(-128, 128, (257, 100) if trans else (100, 257), dtype=np.int8)
    got = run(f, "gemv", x, w)
    want = x.astype(np.int32) @ (w.astype(np.int32) if trans else w.astype(np.int32).T)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).max() > 127  # the case an int8 result would wrap


def test_int8_gemv_epilogue_and_explicit_out_dtype(rng: np.random.Generator, toolchain: None) -> None:
    f = wl.gemv(64, 96, "int8", epilogue="bias_relu")
    assert f.buffer("bias").dtype == f.buffer(f.outputs[0]).dtype == "int32"  # the bias is in the output dtype
    x = rng.integers(-128, 128, (1, 96), dtype=np.int8)
    w = rng.integers(-128, 128, (64, 96), dtype=np.int8)
    b = rng.integers(-5000, 5000, 64, dtype=np.int32)
    np.testing.assert_array_equal(run(f, "gemv", x, w, b), np.maximum(x.astype(np.int32) @ w.astype(np.int32).T + b, 0))
    assert wl.gemv(64, 96, "int8", out_dtype="int8").buffer("D").dtype == "int8"  # a narrowing only on request
    assert wl.gemv(64, 96, "float16").buffer("D").dtype == "float16"  # float GEMVs are unchanged


@pytest.mark.parametrize("kind", ["matmul", "gemv"])
def test_a_float_bias_on_an_int8_product_is_added_as_a_float(kind: str, rng: np.random.Generator,
                                                              toolchain: None) -> None:
    """int8 inputs with a float32 output: the int32 product is converted first, and the bias added unrounded
    (it used to be truncated to the int32 accumulator)."""
    if kind == "matmul":
        f = wl.matmul(16, 24, 40, "int8", out_dtype="float32", epilogue="bias")
        x, w = rng.integers(-128, 128, (16, 40), dtype=np.int8), rng.integers(-128, 128, (40, 24), dtype=np.int8)
        product = x.astype(np.int32) @ w.astype(np.int32)
    else:
        f = wl.gemv(24, 40, "int8", out_dtype="float32", epilogue="bias")
        x, w = rng.integers(-128, 128, (1, 40), dtype=np.int8), rng.integers(-128, 128, (24, 40), dtype=np.int8)
        product = x.astype(np.int32) @ w.astype(np.int32).T
    b = (rng.standard_normal(24) * 10).astype(np.float32)
    want = product.astype(np.float32) + b
    np.testing.assert_allclose(sl.run_reference(f, {"A" if kind == "matmul" else "X": x,
                                                    "B" if kind == "matmul" else "W": w, "bias": b})["D"], want,
                               rtol=1e-6)
    np.testing.assert_allclose(run(f, kind, x, w, b), want, rtol=1e-6)


# ---- element-wise chains --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int8", "float16", "float32"])
def test_scale_keeps_the_chain_dtype_wherever_it_sits(dtype: str) -> None:
    for chain in (("relu", "scale"), ("scale", "relu"), ("scale",), ("add", "scale", "exp")):
        f = wl.elementwise((4, 9), chain, dtype)
        assert f.buffer(f.outputs[0]).dtype == dtype, chain


@pytest.mark.parametrize("chain", [("relu", "scale"), ("scale", "relu")])
def test_int8_scale_truncates_like_a_cast_back(chain: tuple[str, ...], rng: np.random.Generator,
                                               toolchain: None) -> None:
    f = wl.elementwise((4, 33), chain, "int8", scale=0.5)
    x = rng.integers(-128, 128, (4, 33), dtype=np.int8)
    y = x.astype(np.float32)
    for op in chain:  # each stage computes in float32 and casts back to int8 (C truncates toward zero)
        y = np.trunc(np.maximum(y, 0) if op == "relu" else y * 0.5)
    got = run(f, "elementwise", x)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, y.astype(np.int8))


# ---- int64 sums keep their high bits --------------------------------------------------------------------------

def test_int64_sums_accumulate_in_int64() -> None:
    """Regression: every integer sum accumulated in int32, so int64 elements of 2**40 summed to 0."""
    big = np.full((2, 4), 2**40, np.int64)
    out = run(wl.reduce(2, 4, "sum", dtype="int64"), "reduction", big)
    assert out.dtype == np.int64 and (out == big.sum(axis=1)).all()
    a = np.full((16, 16), 2**20, np.int64) * np.arange(1, 17, dtype=np.int64)[:, None]
    out = run(wl.matmul(16, 16, 16, "int64"), "matmul", a, a)
    assert out.dtype == np.int64 and (out == a @ a).all()
    x, w = np.arange(1, 33, dtype=np.int64)[None, :], np.full((64, 32), 2**33, np.int64)
    out = run(wl.gemv(64, 32, "int64"), "gemv", x, w)
    assert out.dtype == np.int64 and (out == x @ w.T).all()
    assert wl.reduce(2, 4, "sum", dtype="int8").buffer("R").dtype == "int32"  # narrower types: int32 as before
