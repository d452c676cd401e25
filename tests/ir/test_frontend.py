"""The compute front end: block kinds, dtypes, casts, symbolic dims, and clear errors for bad definitions."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.expr import Binary, Cast, Const, Select, Var, cast
from schedlib.ir.func import Func
from schedlib.ir.reference import evaluate_int

from .helpers import chain_func, input_shapes, vector_func


def kinds(f: Func) -> dict[str, str]:
    return {b.name: b.kinds for b in f.blocks}


def dtypes(f: Func) -> dict[str, str]:
    return {b.name: b.dtype for b in f.buffers}


def test_block_kinds_of_the_workloads() -> None:
    assert kinds(sl.workloads.matmul(4, 4, 4)) == {"C": "SSR"}
    assert kinds(sl.workloads.matmul(4, 4, 4, batch=2, epilogue="relu")) == {"C": "SSSR", "D": "SSS"}
    assert kinds(sl.workloads.gemv(4, 4, trans=True)) == {"C": "SSR", "D": "SS"}
    assert kinds(sl.workloads.reduce(4, 4, "mean", axis=0)) == {"R": "SR", "D": "S"}
    assert kinds(sl.workloads.softmax(4, 4)) == {"T_max": "SR", "T_exp": "SS", "T_sum": "SR", "Y": "SS"}
    assert kinds(sl.workloads.layernorm(4, 4)) == {"T_sum": "SR", "T_sumsq": "SR", "Y": "SS"}
    assert kinds(sl.workloads.transpose(4, 4)) == {"Y": "SS"}
    r = sl.reduce_axis(4, "r")
    s = sl.reduce_axis(5, "s")
    X = sl.placeholder((3, 4, 5), "float32", "X")
    Z = sl.compute((3,), lambda i: sl.sum(X[i, r, s], axis=[r, s]), "Z")
    f = sl.func([X, Z])
    assert kinds(f) == {"Z": "SRR"}
    assert f.block("Z").reducer == "sum" and f.block("Z").init == Const(0.0, "float32")


def test_reduction_identities() -> None:
    X = sl.placeholder((3, 4), "int8", "X")
    r = sl.reduce_axis(4, "r")
    mx = sl.compute((3,), lambda i: sl.max(X[i, r], axis=r), "mx")
    mn = sl.compute((3,), lambda i: sl.min(X[i, r].astype("float16"), axis=r), "mn")
    f = sl.func([X, mx, mn])
    assert f.block("mx").init == Const(-128, "int8")
    assert f.block("mn").init == Const(float("inf"), "float16")


def test_dtypes_of_the_workloads() -> None:
    assert dtypes(sl.workloads.matmul(4, 4, 4, dtype="int8")) == {"A": "int8", "B": "int8", "C": "int32"}
    assert dtypes(sl.workloads.matmul(4, 4, 4, dtype="float16")) == {
        "A": "float16", "B": "float16", "C": "float32", "D": "float16"}
    assert dtypes(sl.workloads.matmul(4, 4, 4, dtype="float16", out_dtype="float32", accum_dtype="float32")) == {
        "A": "float16", "B": "float16", "C": "float32"}
    # an integer GEMV keeps its int32 accumulator as the output, as matmul does; out_dtype narrows it
    assert dtypes(sl.workloads.gemv(4, 4, dtype="int8", epilogue="bias"))["D"] == "int32"
    assert dtypes(sl.workloads.gemv(4, 4, dtype="int8", out_dtype="int8"))["D"] == "int8"
    assert dtypes(sl.workloads.reduce(4, 4, "max", dtype="float16"))["R"] == "float16"
    assert dtypes(sl.workloads.reduce(4, 4, "mean", dtype="int32")) == {"X": "int32", "R": "int32", "D": "float32"}
    assert dtypes(sl.workloads.softmax(4, 4, dtype="bfloat16"))["T_exp"] == "float32"


def test_casts_and_constant_folding() -> None:
    x = sl.placeholder((3,), "int32", "x")
    e = x[0].astype("float32")
    assert isinstance(e, Cast) and e.dtype == "float32"
    assert x[0].astype("int32") == x[0]  # a cast to the same dtype is dropped
    assert cast("int32", 2.7) == Const(2, "int32")  # C truncation
    assert cast("float16", 3) == Const(3.0, "float16")
    assert (x[0] * 2).dtype == "int32" and (x[0] * 2.0).dtype == "float32"
    assert (x[0] + 0) == x[0] and (x[0] * 1) == x[0] and (x[0] * 0) == Const(0, "int32")
    assert Const(7) // Const(2) == Const(3) and Const(-7) % Const(3) == Const(2)  # floor semantics
    sel = sl.if_then_else(x[0] > 0, x[0], 0.5)
    assert isinstance(sel, Select) and sel.dtype == "float32"
    assert sl.if_then_else(Const(True, "bool"), 1, 2) == Const(1, "int32")
    assert sl.exp(0.0) == Const(1.0, "float32")
    assert sl.maximum(x[0], x[1]) == Binary("max", x[0], x[1], "int32")
    h = sl.placeholder((3,), "float16", "h")
    b = sl.placeholder((3,), "bfloat16", "b")
    assert (h[0] + b[0]).dtype == "float32" and (h[0] * h[1]).dtype == "float16"


def test_casts_in_a_stage_execute_like_c() -> None:
    X = sl.placeholder((4,), "float32", "X")
    Y = sl.compute((4,), lambda i: X[i].astype("int8").astype("int32") * 3, "Y")
    f = sl.func([X, Y])
    out = sl.run_reference(f, {"X": np.array([2.9, -2.9, 0.4, -0.6], np.float32)})["Y"]
    assert out.dtype == np.int32 and out.tolist() == [6, -6, 0, 0]


def test_compute_axis_names_and_varargs() -> None:
    X = sl.placeholder((2, 3), "float32", "X")
    Y = sl.compute((2, 3), lambda *idx: X[idx] + 1.0, "Y")
    Z = sl.compute((3, 2), lambda col, row: Y[row, col], "Z")
    f = sl.func([X, Z], "named")
    assert [a.name for a in f.block("Y").axes] == ["i0", "i1"]
    assert [lp.name for lp in f.block("Z").loops] == ["Z.col", "Z.row"]
    assert f.inputs == ("X",) and f.outputs == ("Z",) and f.name == "named"


def test_symbolic_dims_bound_from_input_shapes() -> None:
    M, N = sl.var("M"), sl.var("N")
    f = sl.workloads.matmul(M, N, 5, epilogue="bias")
    assert f.symbols == ("M", "N")
    assert f.buffer("C").shape == (Var("M"), Var("N"))
    rng = np.random.default_rng(0)
    for m, n in [(1, 1), (3, 7), (33, 2)]:
        inputs = {"A": rng.standard_normal((m, 5), dtype=np.float32),
                  "B": rng.standard_normal((5, n), dtype=np.float32),
                  "bias": rng.standard_normal(n, dtype=np.float32)}
        out = sl.run_reference(f, inputs)["D"]
        assert out.shape == (m, n)
        np.testing.assert_allclose(out, inputs["A"] @ inputs["B"] + inputs["bias"], rtol=1e-5, atol=1e-5)
    assert input_shapes(f, {"M": 2, "N": 3}) == {"A": (2, 5), "B": (5, 3), "bias": (3,)}


def test_symbolic_expressions_in_shapes() -> None:
    n = sl.var("n")
    A = sl.placeholder((n,), "float32", "A")
    B = sl.placeholder((n * 2,), "float32", "B")
    C = sl.compute((n,), lambda i: A[i] + B[i * 2 + 1], "C")
    f = sl.func([A, B, C])
    a, b = np.arange(3, dtype=np.float32), np.arange(6, dtype=np.float32)
    assert sl.run_reference(f, {"A": a, "B": b})["C"].tolist() == [1.0, 4.0, 7.0]


def _same_axis_names() -> Func:
    A = sl.placeholder((2, 2), "float32", "A")
    r = sl.reduce_axis(2, "k")
    return sl.func([A, sl.compute((2,), lambda k: sl.sum(A[k, r], axis=r), "S")])


BAD_DEFINITIONS: list[tuple[str, Callable[[], Any], str]] = [
    ("empty-func", lambda: sl.func([]), "needs at least one output"),
    ("not-a-tensor", lambda: sl.func([3]), "is not a tensor"),
    ("only-placeholders", lambda: sl.func([sl.placeholder((2,), "float32", "A")]), "no compute tensor"),
    ("placeholder-not-passed", lambda: sl.func([sl.compute((2,), lambda i: sl.placeholder((2,), "float32", "P")[i],
                                                           "Q")]), "placeholder P, which is not among"),
    ("duplicate-names", lambda: (lambda a, b: sl.func([a, b, sl.compute((2,), lambda i: a[i] + b[i], "C")]))(
        sl.placeholder((2,), "float32", "A"), sl.placeholder((2,), "float32", "A")), "two different tensors"),
    ("axis-names-repeat", lambda: _same_axis_names(), "axis names ['k', 'k'] repeat"),
    ("foreign-axis", lambda: (lambda A, r: sl.func([A, sl.compute((2,), lambda i: A[i, r], "S")]))(
        sl.placeholder((2, 2), "float32", "A"), sl.reduce_axis(2, "r")), "uses axis r that is not one of its axes"),
    ("unknown-variable", lambda: (lambda A: sl.func([A, sl.compute((2,), lambda i: A[i] * sl.var("q").astype(
        "float32"), "S")]))(sl.placeholder((2,), "float32", "A")), "variable q that is neither an axis"),
    ("unread-input", lambda: (lambda A, U: sl.func([A, U, sl.compute((2,), lambda i: A[i] * 2.0, "C")]))(
        sl.placeholder((2,), "float32", "A"), sl.placeholder((3,), "float32", "U")), "input U is read by no stage"),
    ("input-twice", lambda: (lambda A: sl.func([A, A, sl.compute((2,), lambda i: A[i] * 2.0, "C")]))(
        sl.placeholder((2,), "float32", "A")), "A listed more than once"),
    ("output-twice", lambda: (lambda A: (lambda C: sl.func([A, C, C]))(sl.compute((2,), lambda i: A[i], "C")))(
        sl.placeholder((2,), "float32", "A")), "C listed more than once"),
    ("reduce-axis-bool", lambda: sl.workloads.reduce(4, 4, axis=True), "axis=True"),
    ("reduce-axis-float", lambda: sl.workloads.reduce(4, 4, axis=1.0), "axis=1.0"),
    ("index-rank", lambda: sl.placeholder((2, 2), "float32", "A")[0], "has 2 dimensions, indexed with 1"),
    ("float-index", lambda: sl.placeholder((2,), "float32", "A")[0.5], "must be an integer"),
    ("arity", lambda: sl.compute((2, 2), lambda i: i), "fcompute takes 1 indices, shape has 2"),
    ("nested-reduction", lambda: (lambda A, r: sl.compute((2,), lambda i: sl.sum(A[i, r], axis=r) + 1.0))(
        sl.placeholder((2, 2), "float32", "A"), sl.reduce_axis(2, "r")), "must be the whole body"),
    ("spatial-axis-as-reduce", lambda: sl.compute((2,), lambda i: sl.sum(i, axis=i)), "must come from sl.reduce_axis"),
    ("empty-reduce-axes", lambda: sl.sum(sl.var("x"), axis=[]), "at least one axis"),
    ("bad-dtype", lambda: sl.placeholder((2,), "float64"), "unknown dtype"),
    ("zero-dim", lambda: sl.placeholder((0,), "float32"), "must be >= 1"),
    ("float-dim", lambda: sl.placeholder((2.5,), "float32"), "must be an int or sl.var"),
    ("bad-var-name", lambda: sl.var("2x"), "must be an identifier"),
    ("int-true-division", lambda: sl.var("a") / 2, "use '//' for floor division"),
    ("float-floordiv", lambda: sl.placeholder((2,), "float32", "A")[0] // 2.0, "needs integer operands"),
    ("exp-of-int", lambda: sl.exp(sl.var("a")), "needs a floating-point argument"),
    ("non-bool-select", lambda: sl.if_then_else(sl.var("a"), 1, 2), "condition must be boolean"),
    ("python-if", lambda: bool(sl.var("a") < 3), "truth value of expression"),
    ("bad-scalar", lambda: sl.var("a") + "x", "cannot use 'x'"),
    ("bad-cast", lambda: sl.var("a").astype("int16"), "unknown dtype"),
    ("matmul-epilogue", lambda: sl.workloads.matmul(4, 4, 4, epilogue="tanh"), "epilogue='tanh'"),
    ("gemv-epilogue", lambda: sl.workloads.gemv(4, 4, epilogue="residual"), "epilogue='residual'"),
    ("reduce-op", lambda: sl.workloads.reduce(4, 4, "prod"), "op='prod'"),
    ("reduce-axis", lambda: sl.workloads.reduce(4, 4, axis=2), "axis=2"),
    ("elementwise-empty", lambda: sl.workloads.elementwise((4,), ()), "at least one op"),
    ("elementwise-op", lambda: sl.workloads.elementwise((4,), ("cos",)), "unknown op(s) ['cos']"),
    ("accum-dtype", lambda: sl.workloads.matmul(4, 4, 4, accum_dtype="float64"), "accum_dtype='float64'"),
]


@pytest.mark.parametrize("make,message", [(m, msg) for _, m, msg in BAD_DEFINITIONS],
                         ids=[name for name, _, _ in BAD_DEFINITIONS])
def test_bad_definitions_raise_ir_error(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(sl.IRError) as info:
        make()
    assert message in str(info.value), str(info.value)
    assert isinstance(info.value, sl.SchedlibError)


def test_tensor_repr_and_shape() -> None:
    A = sl.placeholder((sl.var("n"), 3), "float16", "A")
    assert repr(A) == "Tensor(A: float16[n, 3], placeholder)"
    B = sl.compute((2,), lambda i: A[i, 0] * 2.0, "B")
    assert repr(B) == "Tensor(B: float16[2], compute)" and B.ndim == 1 and not B.is_placeholder


def test_unscheduled_loop_nests() -> None:
    """The "before" side of the primitive goldens: one loop per axis, named <block>.<axis>."""
    assert str(vector_func(40)) == textwrap.dedent("""\
        func scale(A: float32[40]) -> (C: float32[40]):
          for C.i in range(40):
            block C S (i=C.i):
              C[i] = A[i] * 2.0""")
    assert str(chain_func(8)) == textwrap.dedent("""\
        func chain(A: float32[8]) -> (C: float32[8]):
          alloc B: float32[8] global
          for B.i in range(8):
            block B S (i=B.i):
              B[i] = A[i] * 2.0
          for C.i in range(8):
            block C S (i=C.i):
              C[i] = B[i] + 1.0""")
    assert str(sl.workloads.matmul(4, 4, 4, epilogue="relu")) == textwrap.dedent("""\
        func matmul_relu(A: float32[4, 4], B: float32[4, 4]) -> (D: float32[4, 4]):
          alloc C: float32[4, 4] global
          for C.i in range(4):
            for C.j in range(4):
              for C.k in range(4):
                block C SSR (i=C.i, j=C.j, k=C.k):
                  init C[i, j] = 0.0
                  C[i, j] += A[i, k] * B[k, j]
          for D.i0 in range(4):
            for D.i1 in range(4):
              block D SS (i0=D.i0, i1=D.i1):
                D[i0, i1] = max(C[i0, i1], 0.0)""")
    assert str(sl.workloads.reduce(4, 8)) == textwrap.dedent("""\
        func reduce_sum(X: float32[4, 8]) -> (R: float32[4]):
          for R.i in range(4):
            for R.r in range(8):
              block R SR (i=R.i, r=R.r):
                init R[i] = 0.0
                R[i] += X[i, r]""")


@pytest.mark.parametrize("make", [
    lambda: sl.workloads.matmul(sl.var("i"), 7, 5),
    lambda: sl.workloads.matmul(9, 7, sl.var("k")),
    lambda: sl.workloads.reduce(sl.var("r"), 4),
], ids=["M named i", "K named k", "rows named r"])
def test_a_dimension_may_share_its_name_with_an_axis(make: Callable[[], Func]) -> None:
    """The stage's axis is renamed (``i`` -> ``i_1``); the dimension keeps the user's name."""
    func = make()
    assert func.symbols and all(a.name not in func.symbols for b in func.blocks for a in b.axes)
    sizes = {s: 3 for s in func.symbols}
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal([evaluate_int(d, sizes) for d in func.buffer(n).shape]).astype(np.float32)
              for n in func.inputs}
    got = sl.run_reference(func, inputs)
    s = sl.Schedule(func)
    loops = s.get_loops(func.blocks[0].name)
    s.split(loops[0], [None, 2])
    for name, value in sl.run_reference(s, inputs).items():
        np.testing.assert_allclose(value, got[name], rtol=1e-6)
    if func.name == "matmul":
        np.testing.assert_allclose(got["C"], inputs["A"] @ inputs["B"], rtol=1e-5, atol=1e-5)


def test_workload_dtypes_may_be_numpy_dtypes() -> None:
    func = sl.workloads.matmul(16, 16, 16, np.float16, out_dtype=np.dtype("float32"))
    assert (func.buffer("A").dtype, func.buffer("C").dtype) == ("float16", "float32")
    assert str(sl.workloads.softmax(8, 8, np.float16)) == str(sl.workloads.softmax(8, 8, "float16"))
    with pytest.raises(sl.IRError, match=r"dtype='float64': unknown dtype"):
        sl.workloads.softmax(8, 8, np.float64)
