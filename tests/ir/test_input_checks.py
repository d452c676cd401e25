"""Clear schedlib errors for misused front-end and executor inputs, and exact reference semantics.

Each test here pins a case that once failed with a raw Python error, hung, or gave a result that depended
on the schedule: bare tensors given to sl.func, unusable names, numpy dtypes and shapes, non-mapping
inputs, low-precision accumulation, reads out of bounds inside a select, and the printer's parentheses.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.dtype import round_to_dtype
from schedlib.ir.expr import Var, binary
from schedlib.ir.primitives import PRIMITIVES

from .helpers import loop_nest, moments_func, schedule

# sl.func and Tensor ---------------------------------------------------------------------------------

def test_func_refuses_a_bare_tensor() -> None:
    # Regression: a 1-D tensor was iterated through __getitem__ forever (out of memory); a 2-D one gave
    # "indexed with 1".
    A = sl.placeholder((8,), "float32", "A")
    B = sl.compute((8,), lambda i: A[i] * 2.0, "B")
    A2 = sl.placeholder((8, 4), "float32", "A2")
    B2 = sl.compute((8, 4), lambda i, j: A2[i, j] * 2.0, "B2")
    for tensor in (B, B2, A):
        with pytest.raises(sl.IRError, match=f"single tensor {tensor.name}; pass a list of tensors"):
            sl.func(tensor)
    with pytest.raises(sl.IRError, match="must be a list of tensors"):
        sl.func(5)  # type: ignore[arg-type]
    assert sl.func((A, B)).outputs == ("B",)  # any sequence still works


def test_tensors_cannot_be_iterated() -> None:
    A = sl.placeholder((8,), "float32", "A")
    with pytest.raises(sl.IRError, match="tensors are indexed"):
        iter(A)
    with pytest.raises(sl.IRError, match="tensors are indexed"):
        list(A)


# names ------------------------------------------------------------------------------------------------

def _stage(name: str) -> sl.Tensor:
    A = sl.placeholder((8,), "float32", "A")
    return sl.compute((8,), lambda i: A[i] * 2.0, name)


BAD_NAMES: list[tuple[str, Callable[[], Any], str]] = [
    ("var-int", lambda: sl.var(3), "var: name=3 must be a str, got int"),
    ("var-none", lambda: sl.var(None), "var: name=None must be a str"),
    ("var-keyword", lambda: sl.var("for"), "var: name='for' is a C/C++/CUDA keyword"),
    ("var-type-name", lambda: sl.var("int"), "var: name='int' is a C/C++/CUDA keyword"),
    ("var-cuda-builtin", lambda: sl.var("threadIdx"), "var: name='threadIdx' is a name CUDA"),
    ("var-reserved-prefix", lambda: sl.var("sl_floordiv"), "starts with 'sl_'"),
    ("var-double-underscore", lambda: sl.var("a__b"), "reserved by C++"),
    ("placeholder-type-name", lambda: sl.placeholder((4,), "float32", "float"),
     "placeholder: name='float' is a C/C++/CUDA keyword"),
    ("placeholder-block-index", lambda: sl.placeholder((4,), "float32", "blockIdx"), "name='blockIdx'"),
    ("placeholder-space", lambda: sl.placeholder((4,), "float32", "X y"), "name='X y' must be an identifier"),
    ("placeholder-dotted", lambda: sl.placeholder((4,), "float32", "A.b"), "no dots or spaces"),
    ("placeholder-int", lambda: sl.placeholder((4,), "float32", 5), "placeholder: name=5 must be a str"),
    ("compute-type-name", lambda: _stage("int"), "compute: name='int' is a C/C++/CUDA keyword"),
    ("compute-dotted", lambda: _stage("Z.q"), "compute: name='Z.q' must be an identifier"),
    ("compute-int", lambda: _stage(7), "compute: name=7 must be a str"),  # type: ignore[arg-type]
    ("compute-axis-name", lambda: sl.compute((4,), lambda float: float * 2, "Z"),
     "compute Z: fcompute parameter='float' is a C/C++/CUDA keyword"),
    ("reduce-axis-name", lambda: sl.reduce_axis(4, "warpSize"), "reduce_axis: name='warpSize'"),
    # CUDA vector types the generated code or the emulator spells (SL_VLOAD's uint2, the emulator's threadIdx
    # is a uint3, make_uint4): a buffer of that name failed to compile, for some configs only
    ("placeholder-vector-type", lambda: sl.placeholder((4,), "float32", "uint2"), "name='uint2' is a name CUDA"),
    ("placeholder-thread-index-type", lambda: sl.placeholder((4,), "float32", "uint3"), "name='uint3'"),
    ("placeholder-vector-maker", lambda: sl.placeholder((4,), "float32", "make_uint4"), "name='make_uint4'"),
    ("var-vector-type", lambda: sl.var("ulonglong2"), "var: name='ulonglong2' is a name CUDA"),
    ("func-name", lambda: sl.func([sl.placeholder((4,), "float32", "A"), _stage("B")], "my func"),
     "sl.func: name='my func' must be an identifier"),
]


@pytest.mark.parametrize(("label", "make", "message"), BAD_NAMES, ids=[c[0] for c in BAD_NAMES])
def test_unusable_names_are_refused(label: str, make: Callable[[], Any], message: str) -> None:
    # Regression: raw AttributeError for non-strings; keywords and CUDA names reached generated code.
    with pytest.raises(sl.IRError) as info:
        make()
    assert message in str(info.value), str(info.value)


def test_names_of_the_workloads_and_defaults_are_accepted() -> None:
    for name in ("M", "N", "K", "A", "bias", "T_max", "Z_shared", "rows", "x2", "_tmp", "gamma"):
        assert sl.var(name).name == name
    assert sl.placeholder((4,)).name.startswith("placeholder_")
    assert sl.reduce_axis(4).kind == "R"
    sl.workloads.softmax(4, 8)
    sl.workloads.matmul(sl.var("M"), 8, 8, epilogue="bias_relu")


# dtypes and shapes ------------------------------------------------------------------------------------

def _doubled(A: sl.Tensor) -> sl.Tensor:
    return sl.compute(A.shape, lambda i: A[i] * 2.0, "B")


def test_numpy_dtypes_become_dtype_names() -> None:
    # Regression: the np.dtype object was kept, and run_reference then failed with KeyError.
    for spelling in (np.dtype("float32"), np.float32):
        A = sl.placeholder((4,), spelling, "A")
        assert A.dtype == "float32"
        f = sl.func([A, _doubled(A)])
        np.testing.assert_array_equal(sl.run_reference(f, {"A": np.ones(4, np.float32)})["B"], 2.0)
    assert sl.placeholder((4,), np.int8, "A")[0].astype(np.dtype("int32")).dtype == "int32"
    with pytest.raises(sl.IRError, match="unknown dtype"):
        sl.placeholder((4,), np.float64, "A")
    with pytest.raises(sl.IRError, match="unknown dtype"):
        sl.placeholder((4,), ["float32"], "A")  # type: ignore[arg-type]


def test_numpy_shape_arrays() -> None:
    # Regression: the array's truth value raised numpy's ValueError.
    assert [int(d.value) for d in sl.placeholder(np.array([4, 3]), "float32", "A").shape] == [4, 3]
    with pytest.raises(sl.IRError, match="1-D array of integers"):
        sl.placeholder(np.array([[4, 4]]), "float32", "A")
    with pytest.raises(sl.IRError, match="1-D array of integers"):
        sl.placeholder(np.array([4.0]), "float32", "A")


def test_fcompute_must_be_callable() -> None:
    # Regression: a TypeError from inspect.
    with pytest.raises(sl.IRError, match="compute Z: fcompute=5 must be callable"):
        sl.compute((8,), 5, "Z")  # type: ignore[arg-type]


def test_truth_value_message_names_what_exists() -> None:
    # Regression: the message pointed to sl.all_of, which does not exist.
    with pytest.raises(sl.IRError) as info:
        bool(sl.var("a") < 3)
    assert "sl.all_of" not in str(info.value)
    assert "sl.if_then_else" in str(info.value) and "'&', '|', '~'" in str(info.value)
    assert str((sl.var("a") < 3) & (sl.var("b") > 0)) == "a < 3 and b > 0"


# run_reference inputs ----------------------------------------------------------------------------------

def test_run_reference_needs_a_mapping_and_a_func() -> None:
    f = sl.workloads.matmul(8, 8, 8)
    a = np.ones((8, 8), np.float32)
    with pytest.raises(sl.ShapeError, match=r"inputs must be a mapping from input name to array.*got list"):
        sl.run_reference(f, [a, a])  # type: ignore[arg-type]
    with pytest.raises(sl.ShapeError, match="got NoneType"):
        sl.run_reference(f, None)  # type: ignore[arg-type]
    with pytest.raises(sl.ExecutionError, match="needs a Func or Schedule, got str"):
        sl.run_reference("x", {})


# executor semantics --------------------------------------------------------------------------------------

def _bf16_inputs(m: int, n: int, k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"A": round_to_dtype(rng.standard_normal((m, k)).astype(np.float32), "bfloat16"),
            "B": round_to_dtype(rng.standard_normal((k, n)).astype(np.float32), "bfloat16")}


def test_bf16_accumulation_rounds_every_step_whatever_the_schedule() -> None:
    # Regression: the unscheduled grid added all 256 products in float32 and rounded once, while a
    # schedule running k one step at a time rounded every step; the kernel rounds every step.  The product
    # itself is added as computed, in float32 (it was rounded to bf16 first: a second rounding the kernel
    # does not make, 4 of 4 sums off by up to 0.125).
    f = sl.workloads.matmul(2, 2, 256, "bfloat16", accum_dtype="bfloat16")
    x = _bf16_inputs(2, 2, 256)
    acc = np.zeros((2, 2), np.float32)
    for k in range(256):
        acc = round_to_dtype(acc + x["A"][:, k:k + 1] * x["B"][k:k + 1, :], "bfloat16")
    (name,) = f.outputs
    assert name == "C"
    unscheduled = sl.run_reference(f, x)["C"]
    s = sl.Schedule(f)
    i, j, k = s.get_loops("C")
    s.reorder(k, i, j)
    s.compute_at(s.cache_read("C", "A", "local"), k)
    sequential = sl.run_reference(s, x)["C"]
    np.testing.assert_array_equal(unscheduled, acc)
    np.testing.assert_array_equal(sequential, acc)
    np.testing.assert_array_equal(sl.build(s, "h100").run_cpu(x["A"], x["B"]), acc)  # the kernel's bits


def test_select_reads_out_of_bounds_only_where_taken() -> None:
    A = sl.placeholder((8,), "float32", "A")
    x = {"A": np.arange(8, dtype=np.float32)}
    # Regression: the taken branch read A[8], which was clamped to A[7] instead of raising.
    C = sl.compute((8,), lambda i: sl.if_then_else(i < 8, A[i + 1], 0.0), "C")
    with pytest.raises(sl.ExecutionError, match="block C reads A out of bounds: dim 0 index 8 not in"):
        sl.run_reference(sl.func([A, C]), x)
    # The untaken lane may read out of range, in either branch.
    D = sl.compute((8,), lambda i: sl.if_then_else(i < 7, A[i + 1], A[i - 7]), "D")
    np.testing.assert_array_equal(sl.run_reference(sl.func([A, D]), x)["D"], [1, 2, 3, 4, 5, 6, 7, 0])
    E = sl.compute((8,), lambda i: sl.if_then_else(i > 0, A[i - 1], sl.if_then_else(i < 1, A[i], A[i + 9])),
                   "E")
    np.testing.assert_array_equal(sl.run_reference(sl.func([A, E]), x)["E"], [0, 0, 1, 2, 3, 4, 5, 6])
    F = sl.compute((8,), lambda i: sl.if_then_else(i > 3, A[i - 1], A[i + 5]), "F")
    with pytest.raises(sl.ExecutionError, match="block F reads A out of bounds: dim 0 index 8"):
        sl.run_reference(sl.func([A, F]), x)


# printer ---------------------------------------------------------------------------------------------

def test_printer_keeps_needed_parentheses() -> None:
    a, b, c = Var("a"), Var("b"), Var("c")
    # Regression: these printed as "a * b // c" and "a < b == c < a".
    assert str(a * (b // c)) == "a * (b // c)"
    assert str(a * (b % c)) == "a * (b % c)"
    assert str(a // (b * c)) == "a // (b * c)"
    assert str(a - (b + c)) == "a - (b + c)"
    assert str(binary("==", binary("<", a, b), binary("<", c, a))) == "(a < b) == (c < a)"
    assert str(binary("<", a, binary("<", b, c))) == "a < (b < c)"
    # Operators that associate keep the plain text.
    assert str(a + (b + c)) == "a + b + c"
    assert str(a + (b - c)) == "a + b - c"
    assert str(a * (b * c)) == "a * b * c"
    assert str((a * b) // c) == "a * b // c"
    assert str(binary("and", a < b, binary("and", b < c, c < a))) == "a < b and b < c and c < a"
    A = sl.placeholder((8,), "float32", "A")
    C = sl.compute((8,), lambda i: A[2 * (i // 2)] + A[3 * (i % 2)], "C")
    assert "C[i] = A[2 * (i // 2)] + A[3 * (i % 2)]" in str(sl.func([A, C]))


# docstrings --------------------------------------------------------------------------------------------

def _doc_blocks(primitive: str) -> tuple[str, str]:
    """The 'Before' and 'After' loop nests of a primitive's docstring."""
    lines = (PRIMITIVES[primitive].__doc__ or "").splitlines()
    blocks: list[str] = []
    k = 0
    while k < len(lines):
        head = lines[k].strip()
        if head.startswith(("Before", "After")) and head.endswith("::"):
            k += 2  # the blank line after '::'
            body = []
            while k < len(lines) and (not lines[k].strip() or lines[k].startswith(" " * 8)):
                body.append(lines[k])
                k += 1
            blocks.append(textwrap.dedent("\n".join(body)).strip("\n"))
            continue
        k += 1
    assert len(blocks) == 2, f"{primitive}: expected a Before and an After nest, found {len(blocks)}"
    return blocks[0], blocks[1]


def _vector(n: int) -> sl.Func:
    A = sl.placeholder((n,), "float32", "A")
    return sl.func([A, sl.compute((n,), lambda i: A[i] * 2.0, "C")])


def _plus_one() -> sl.Func:
    A = sl.placeholder((4, 8), "float32", "A")
    return sl.func([A, sl.compute((4, 8), lambda i, j: A[i, j] + 1.0, "C")])


def _row_sum(rows: int = 8, cols: int = 16) -> sl.Func:
    A = sl.placeholder((rows, cols), "float32", "A")
    k = sl.reduce_axis(cols, "k")
    return sl.func([A, sl.compute((rows,), lambda i: sl.sum(A[i, k], axis=k), "C")])


def _chain() -> sl.Func:
    A = sl.placeholder((8,), "float32", "A")
    B = sl.compute((8,), lambda i: A[i] * 2.0, "B")
    return sl.func([A, sl.compute((8,), lambda i: B[i] + 1.0, "C")])


def _relu_epilogue() -> sl.Func:
    """The output stage of a cache_write, as the reverse_compute_inline docstring shows it."""
    acc = sl.placeholder((8,), "float32", "C_local")
    bias = sl.placeholder((8,), "float32", "bias")
    C = sl.compute((8,), lambda i: acc[i], "C")
    return sl.func([acc, bias, sl.compute((8,), lambda i: sl.maximum(C[i] + bias[i], 0.0), "D")])


def _double_2d() -> sl.Func:
    A = sl.placeholder((16, 32), "float32", "A")
    return sl.func([A, sl.compute((16, 32), lambda i, j: A[i, j] * 2.0, "C")])


DOC_EXAMPLES: dict[str, tuple[Callable[[], sl.Schedule], Callable[[sl.Schedule], Any]]] = {
    "bind": (lambda: schedule(_vector(128), lambda s: s.split("C.i", [None, 32])),
             lambda s: s.bind("C.i_0", "blockIdx.x")),
    "vectorize": (lambda: schedule(_plus_one(), lambda s: s.split("C.j", [None, 4])),
                  lambda s: s.vectorize("C.j_1")),
    "reorder": (lambda: sl.Schedule(_plus_one()), lambda s: s.reorder("C.j", "C.i")),
    "unroll": (lambda: schedule(_row_sum(), lambda s: s.split("C.k", [None, 4])), lambda s: s.unroll("C.k_1")),
    "annotate": (lambda: schedule(_row_sum(), lambda s: s.split("C.k", [None, 4])),
                 lambda s: s.annotate("C.k_0", "pipeline_stages", 2)),
    "storage_align": (lambda: schedule(_double_2d(), lambda s: s.cache_read("C", "A", "shared")),
                      lambda s: s.storage_align("A_shared", 0, 32, 1)),
    "storage_permute": (lambda: schedule(sl.workloads.matmul(2, 16, 4), lambda s: s.cache_read("C", "B", "shared")),
                        lambda s: s.storage_permute("B_shared", 1, [4, 2, 2], [1, 0, 2])),
    "double_buffer": (lambda: schedule(_row_sum(), lambda s: s.split("C.k", [None, 4]),
                                       lambda s: s.cache_read("C", "A", "shared"),
                                       lambda s: s.compute_at("A_shared", "C.k_0")),
                      lambda s: s.double_buffer("A_shared")),
    "reverse_compute_at": (lambda: schedule(_vector(64), lambda s: s.cache_write("C", "local"),
                                            lambda s: s.split("C.i", [None, 16])),
                           lambda s: s.reverse_compute_at("C_local", "C.i_0")),
    "split": (lambda: sl.Schedule(_vector(40)), lambda s: s.split("C.i", [None, 16])),
    "fuse": (lambda: sl.Schedule(_plus_one()), lambda s: s.fuse("C.i", "C.j")),
    "cache_read": (lambda: sl.Schedule(_row_sum(64, 32)), lambda s: s.cache_read("C", "A", "shared")),
    "cache_write": (lambda: sl.Schedule(_row_sum(64, 32)), lambda s: s.cache_write("C", "local")),
    "compute_at": (lambda: schedule(_row_sum(64, 64), lambda s: s.cache_read("C", "A", "shared"),
                                    lambda s: s.split("C.k", [8, 8])),
                   lambda s: s.compute_at("A_shared", "C.k_0")),
    "compute_with": (lambda: sl.Schedule(moments_func(8, 16)), lambda s: s.compute_with("S", "Q.i")),
    "compute_inline": (lambda: sl.Schedule(_chain()), lambda s: s.compute_inline("B")),
    "reverse_compute_inline": (lambda: sl.Schedule(_relu_epilogue()), lambda s: s.reverse_compute_inline("D")),
    "rfactor": (lambda: schedule(_row_sum(), lambda s: s.split("C.k", [4, 4])), lambda s: s.rfactor("C.k_1")),
    "decompose_reduction": (lambda: sl.Schedule(_row_sum()), lambda s: s.decompose_reduction("C", "C.k")),
}


def test_every_primitive_has_a_checked_docstring_example() -> None:
    assert set(DOC_EXAMPLES) == set(PRIMITIVES)


@pytest.mark.parametrize("primitive", sorted(DOC_EXAMPLES))
def test_docstring_nests_are_what_the_printer_shows(primitive: str) -> None:
    # Regression: several docstrings showed no nest, cut it short with '...', or showed a wrong one.
    before, after = _doc_blocks(primitive)
    make, apply = DOC_EXAMPLES[primitive]
    s = make()
    assert loop_nest(s) == before
    apply(s)
    assert loop_nest(s) == after


def test_a_wrong_input_size_says_how_a_symbolic_one_was_computed_only() -> None:
    f = sl.workloads.matmul(4, 4, 4)
    with pytest.raises(sl.ShapeError, match=r"input A dim 1 is 5, expected 4$"):
        sl.run_reference(f, {"A": np.zeros((4, 5), "float32"), "B": np.zeros((4, 4), "float32")})
    N = sl.var("N")
    X = sl.placeholder((N, 2 * N), "float32", "X")
    g = sl.func([X, sl.compute((N,), lambda i: X[i, 0], "Y")])
    with pytest.raises(sl.ShapeError, match=r"input X dim 1 is 5, expected 6 \(2 \* N\)$"):
        sl.run_reference(g, {"X": np.zeros((3, 5), "float32")})
