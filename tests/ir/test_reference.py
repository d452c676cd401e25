"""The numpy reference executor: built-in workloads against independent numpy formulas, input checks."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.dtype import round_to_dtype
from schedlib.ir.expr import Binary, Const, Var

from .helpers import random_inputs, vector_func

_erf = np.vectorize(math.erf)


def gelu(x: np.ndarray) -> np.ndarray:
    return x * 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))


def epilogue(x: np.ndarray, name: str | None, extra: dict[str, np.ndarray]) -> np.ndarray:
    if name in ("bias", "bias_relu"):
        x = x + extra["bias"].astype(np.float64)
    if name == "residual":
        x = x + extra["residual"].astype(np.float64)
    if name in ("relu", "bias_relu"):
        x = np.maximum(x, 0.0)
    if name == "gelu":
        x = gelu(x)
    return x


def run(f: sl.Func, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    inputs = random_inputs(f, np.random.default_rng(seed))
    return inputs, sl.run_reference(f, inputs)


@pytest.mark.parametrize("epi", sl.workloads.EPILOGUES)
@pytest.mark.parametrize("trans_a,trans_b,batch", [(False, False, None), (True, False, None), (False, True, 3),
                                                   (True, True, 2)])
def test_matmul_float(epi: str | None, trans_a: bool, trans_b: bool, batch: int | None) -> None:
    f = sl.workloads.matmul(7, 5, 33, trans_a=trans_a, trans_b=trans_b, batch=batch, epilogue=epi)
    x, out = run(f, seed=1)
    a = np.swapaxes(x["A"], -1, -2) if trans_a else x["A"]
    b = np.swapaxes(x["B"], -1, -2) if trans_b else x["B"]
    want = epilogue(np.matmul(a.astype(np.float64), b.astype(np.float64)), epi, x)
    (name,) = f.outputs
    assert out[name].shape == want.shape and out[name].dtype == np.float32
    np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epi", [None, "bias", "relu", "bias_relu", "residual"])
def test_matmul_int8_is_exact(epi: str | None) -> None:
    f = sl.workloads.matmul(9, 7, 33, dtype="int8", epilogue=epi, batch=2, trans_b=True)
    x, out = run(f, seed=2)
    acc = np.matmul(x["A"].astype(np.int64), np.swapaxes(x["B"], -1, -2).astype(np.int64))
    want = epilogue(acc.astype(np.float64), epi, x) if epi else acc
    (name,) = f.outputs
    assert out[name].dtype == np.int32
    np.testing.assert_array_equal(out[name], np.trunc(want).astype(np.int32))


def test_matmul_float16_accumulates_in_float32() -> None:
    f = sl.workloads.matmul(5, 6, 33, dtype="float16")
    x, out = run(f, seed=3)
    want = (x["A"].astype(np.float32) @ x["B"].astype(np.float32)).astype(np.float16)
    assert out["D"].dtype == np.float16
    np.testing.assert_allclose(out["D"].astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("epi", [None, "bias", "relu", "bias_relu", "gelu"])
def test_gemv(trans: bool, epi: str | None) -> None:
    f = sl.workloads.gemv(7, 33, dtype="float32", trans=trans, batch=3, epilogue=epi)
    x, out = run(f, seed=4)
    w = x["W"].T if trans else x["W"]  # as N x K
    want = epilogue(x["X"].astype(np.float64) @ w.T.astype(np.float64), epi, x)
    (name,) = f.outputs
    np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5)


def test_gemv_int8_is_exact() -> None:
    f = sl.workloads.gemv(7, 33, dtype="int8", trans=True)
    x, out = run(f, seed=5)
    want = x["X"].astype(np.int64) @ x["W"].astype(np.int64)
    assert out["C"].dtype == np.int32  # the int32 accumulator is the output, not wrapped to int8
    np.testing.assert_array_equal(out["C"], want)


REDUCERS = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean,
            "sumsq": lambda v, axis: np.sum(v * v, axis=axis)}


@pytest.mark.parametrize("op", sl.workloads.REDUCE_OPS)
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_reduce(op: str, axis: int, dtype: str) -> None:
    f = sl.workloads.reduce(7, 33, op, axis=axis, dtype=dtype)
    x, out = run(f, seed=6)
    want = REDUCERS[op](x["X"].astype(np.float64 if dtype == "float32" else np.int64), axis=0 if axis == 0 else 1)
    (name,) = f.outputs
    if dtype == "int32" and op != "mean":
        np.testing.assert_array_equal(out[name], want.astype(np.int32))
    else:
        np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_softmax(dtype: str) -> None:
    f = sl.workloads.softmax(7, 33, dtype=dtype)
    x, out = run(f, seed=7)
    v = x["X"].astype(np.float64)
    e = np.exp(v - v.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    tol = 1e-5 if dtype == "float32" else 2e-3
    assert out["Y"].dtype == np.dtype(dtype)
    np.testing.assert_allclose(out["Y"].astype(np.float64), want, rtol=tol, atol=tol)


def test_rmsnorm() -> None:
    f = sl.workloads.rmsnorm(7, 33, eps=1e-6)
    x, out = run(f, seed=8)
    v = x["X"].astype(np.float64)
    want = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + 1e-6) * x["W"]
    np.testing.assert_allclose(out["Y"], want, rtol=1e-5, atol=1e-5)


def test_layernorm() -> None:
    f = sl.workloads.layernorm(7, 33, eps=1e-5)
    x, out = run(f, seed=9)
    v = x["X"].astype(np.float64)
    want = (v - v.mean(axis=1, keepdims=True)) / np.sqrt(v.var(axis=1, keepdims=True) + 1e-5) * x["gamma"] \
        + x["beta"]
    np.testing.assert_allclose(out["Y"], want, rtol=1e-4, atol=1e-4)


ELEMENTWISE = {
    "relu": lambda a, y: np.maximum(a, 0.0), "gelu": lambda a, y: gelu(a), "exp": lambda a, y: np.exp(a),
    "sigmoid": lambda a, y: 1.0 / (1.0 + np.exp(-a)), "tanh": lambda a, y: np.tanh(a),
    "scale": lambda a, y: a * 0.5, "add": lambda a, y: a + y, "mul": lambda a, y: a * y,
}


@pytest.mark.parametrize("chain", [("add", "relu"), ("mul", "gelu", "scale"), ("exp", "sigmoid", "tanh")])
@pytest.mark.parametrize("shape", [(33,), (3, 7), (1, 3, 7)])
def test_elementwise(chain: tuple[str, ...], shape: tuple[int, ...]) -> None:
    f = sl.workloads.elementwise(shape, chain)
    x, out = run(f, seed=10)
    v = x["X"].astype(np.float64)
    for op in chain:
        v = ELEMENTWISE[op](v, x.get("Y"))
    np.testing.assert_allclose(out[f.outputs[0]], v, rtol=1e-5, atol=1e-6)


def test_elementwise_int_is_exact() -> None:
    f = sl.workloads.elementwise((3, 7), ("add", "mul", "relu"), dtype="int32")
    x, out = run(f, seed=11)
    want = np.maximum((x["X"] + x["Y"]) * x["Y"], 0)
    np.testing.assert_array_equal(out["E2"], want.astype(np.int32))


@pytest.mark.parametrize("dtype", ["float32", "int8", "bfloat16"])
def test_transpose(dtype: str) -> None:
    f = sl.workloads.transpose(7, 33, dtype=dtype)
    x, out = run(f, seed=12)
    want = round_to_dtype(x["X"].T, dtype)  # bfloat16 inputs are held as float32, rounded on entry
    np.testing.assert_array_equal(out["Y"], want)


def test_bfloat16_values_are_rounded_to_nearest_even() -> None:
    values = np.array([1.0, 1.00390625, 1.01171875, 3.14159265, -2.7182817, np.nan], np.float32)
    rounded = round_to_dtype(values, "bfloat16")
    bits = rounded[:-1].view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)  # only the top 16 bits remain
    assert rounded[1] == 1.0 and rounded[2] == 1.015625  # ties go to even, above-half rounds up
    assert np.isnan(rounded[-1])
    f = sl.workloads.elementwise((6,), ("scale",), dtype="bfloat16")
    out = sl.run_reference(f, {"X": values})["E0"]
    np.testing.assert_array_equal(out[:-1], round_to_dtype(rounded[:-1] * 0.5, "bfloat16"))


def test_run_reference_accepts_a_schedule_and_returns_outputs_only() -> None:
    s = sl.Schedule(sl.workloads.matmul(3, 4, 5, epilogue="relu"))
    x = random_inputs(s.func, np.random.default_rng(0))
    assert set(sl.run_reference(s, x)) == {"D"}
    with pytest.raises(sl.ExecutionError, match="needs a Func or Schedule"):
        sl.run_reference("matmul", x)


def test_unwritten_output_elements_stay_poisoned() -> None:
    f = vector_func(4)
    c = f.block("C")
    guarded = f.with_block(dataclasses.replace(c, predicate=Binary("<", Var("C.i"), Const(2), "bool")))
    out = sl.run_reference(guarded, {"A": np.ones(4, np.float32)})["C"]
    assert out[:2].tolist() == [2.0, 2.0] and np.isnan(out[2:]).all()


def test_out_of_bounds_access_is_an_execution_error() -> None:
    f = vector_func(4)
    c = f.block("C")
    shifted = f.with_block(dataclasses.replace(c, bindings=(Binary("+", Var("C.i"), Const(1), "int32"),)))
    with pytest.raises(sl.ExecutionError, match=r"block C writes C out of bounds: dim 0 index 4 not in \[0, 4\)"):
        sl.run_reference(shifted, {"A": np.ones(4, np.float32)})
    reads = f.with_block(dataclasses.replace(c, value=sl.placeholder((4,), "float32", "A")[Var("i") * 2] * 2.0))
    with pytest.raises(sl.ExecutionError, match="block C reads A out of bounds: dim 0 index 4"):
        sl.run_reference(reads, {"A": np.ones(4, np.float32)})


# bad inputs -------------------------------------------------------------------------------------

def _matmul_sym() -> sl.Func:
    return sl.workloads.matmul(sl.var("M"), sl.var("N"), 5, epilogue="bias")


def _ok() -> dict[str, np.ndarray]:
    return {"A": np.zeros((3, 5), np.float32), "B": np.zeros((5, 4), np.float32), "bias": np.zeros(4, np.float32)}


BAD_INPUTS = [
    ("missing", lambda x: x.pop("bias"), "missing input(s) ['bias']"),
    ("unknown", lambda x: x.update(C=np.zeros(1)), "unknown input(s) ['C']"),
    ("rank", lambda x: x.update(bias=np.zeros((1, 4), np.float32)), "input bias has rank 2, expected 1"),
    ("dtype", lambda x: x.update(A=np.zeros((3, 5), np.float64)), "input A has dtype float64, expected float32"),
    ("python-list", lambda x: x.update(bias=[0.0] * 4), "input bias has dtype float64"),
    ("fixed-dim", lambda x: x.update(A=np.zeros((3, 6), np.float32)), "input A dim 1 is 6, expected 5"),
    ("inconsistent-symbol", lambda x: x.update(bias=np.zeros(7, np.float32)), "input bias dim 0 is 7, but N=4"),
]


@pytest.mark.parametrize("change,message", [(c, m) for _, c, m in BAD_INPUTS], ids=[i for i, _, _ in BAD_INPUTS])
def test_bad_inputs_raise_shape_error(change, message: str) -> None:
    inputs = _ok()
    change(inputs)
    with pytest.raises(sl.ShapeError) as info:
        sl.run_reference(_matmul_sym(), inputs)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, sl.SchedlibError)


def test_good_inputs_bind_symbols() -> None:
    out = sl.run_reference(_matmul_sym(), _ok())["D"]
    assert out.shape == (3, 4) and not out.any()


def test_symbol_only_in_a_non_affine_dim_is_a_shape_error() -> None:
    # Regression: evaluating the expected size with n unbound raised ExecutionError, not ShapeError.  n // 2
    # of size 4 is n = 8 or 9: not inverted, refused with the reason.
    n = sl.var("n")
    A = sl.placeholder((n // 2,), "float32", "A")
    B = sl.compute((n // 2,), lambda i: A[i] + 1.0, "B")
    with pytest.raises(sl.ShapeError, match="dimension n cannot be inferred"):
        sl.run_reference(sl.func([A, B]), {"A": np.zeros(4, np.float32)})


def test_symbol_only_in_affine_dims_is_solved_from_them() -> None:
    # Regression: an input of N + 1 entries (a CSR row pointer, the points of N intervals) or 2 * N values
    # built, then every call was refused: "dimension N cannot be inferred from the input shapes".
    n = sl.var("N")
    P = sl.placeholder((n + 1,), "float32", "P")
    Z = sl.placeholder((2 * n + 1,), "float32", "Z")
    D = sl.compute((n,), lambda i: P[i + 1] - P[i] + Z[2 * i + 1], "D")
    f = sl.func([P, Z, D])
    p = np.arange(8, dtype=np.float32) ** 2
    z = np.arange(15, dtype=np.float32)
    np.testing.assert_array_equal(sl.run_reference(f, {"P": p, "Z": z})["D"], np.diff(p) + z[1::2])
    # a size no N gives, and two inputs that disagree, are refused with the dimension
    odd = sl.func([Z, sl.compute((n,), lambda i: Z[2 * i], "E")])
    with pytest.raises(sl.ShapeError, match=r"input Z dim 0 is 14, which no N >= 0 gives for 2 \* N \+ 1"):
        sl.run_reference(odd, {"Z": np.zeros(14, np.float32)})
    with pytest.raises(sl.ShapeError, match=r"input Z dim 0 is 13, expected 15 \(2 \* N \+ 1\)"):
        sl.run_reference(f, {"P": p, "Z": np.zeros(13, np.float32)})


def test_bfloat16_inputs_may_be_float32_arrays() -> None:
    f = sl.workloads.transpose(2, 3, dtype="bfloat16")
    out = sl.run_reference(f, {"X": np.full((2, 3), 1.00390625, np.float32)})["Y"]
    assert out.dtype == np.float32 and (out == 1.0).all()
    with pytest.raises(sl.ShapeError, match="expected bfloat16"):
        sl.run_reference(f, {"X": np.zeros((2, 3), np.float16)})


@pytest.mark.parametrize("op", ["sum", "max"])
def test_empty_reduction_with_outputs_is_a_shape_error(op: str) -> None:
    """Rows to write but nothing to reduce: refused, naming the axis (the kernels would leave the rows
    unwritten, and the max of nothing has no value)."""
    f = sl.workloads.reduce(4, sl.var("K"), op)
    with pytest.raises(sl.ShapeError, match="block R reduces over axis r of extent K = 0"):
        sl.run_reference(f, {"X": np.zeros((4, 0), np.float32)})
    assert sl.run_reference(f, {"X": np.ones((4, 1), np.float32)})["R"].tolist() == [1.0] * 4


def test_empty_reduction_without_outputs_is_empty() -> None:
    """No rows and nothing to reduce: an empty result, not an error."""
    K = sl.var("K")
    f = sl.workloads.reduce(sl.var("M"), K)
    assert sl.run_reference(f, {"X": np.zeros((0, 0), np.float32)})["R"].shape == (0,)


def test_a_single_value_output_is_reduced_and_written() -> None:
    """0-d outputs: a reduction of everything and an element-wise stage after it."""
    X = sl.placeholder((5, 7), "float32", "X")
    i, j = sl.reduce_axis(5, "i"), sl.reduce_axis(7, "j")
    S = sl.compute((), lambda: sl.max(X[i, j], axis=[i, j]), "S")
    T = sl.compute((), lambda: S[()] * 2.0, "T")
    x = np.arange(35, dtype=np.float32).reshape(5, 7)
    out = sl.run_reference(sl.func([X, T]), {"X": x})["T"]
    assert out.shape == () and float(out) == 68.0
