"""Vectorized loops that compute (not copy): reads loaded wide into registers, spatial results stored wide.

Each kernel is compared with the same schedule whose vectorized loops are merely unrolled: the emulated
results must be identical bit for bit (a vectorized reduce loop keeps its fold order), and the widened source
must say so (``SL_VLOAD_REGS``/``SL_VSTORE_REGS``) exactly where the alignment proof holds.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from cg_support import kernel_bodies, random_inputs

import schedlib as sl
from schedlib.runtime.nvcc import find_nvcc, ptx
from schedlib.suites import parse_workload

VLOAD = re.compile(r"SL_VLOAD_REGS\((\w+), \w+, (\w+), ")
VSTORE = re.compile(r"SL_VSTORE_REGS\((\w+), (\w+), ")


def widened(source: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(vector type, buffer) of every register-staged vector load, and of every such store."""
    source = "\n".join(kernel_bodies(source).values())  # not the prelude, which defines the macros
    return [(m.group(1), m.group(2)) for m in VLOAD.finditer(source)], \
        [(m.group(1), m.group(2)) for m in VSTORE.finditer(source)]


def unrolled_instead(s: sl.Schedule) -> sl.Schedule:
    """The same schedule with every ``vectorize`` replayed as ``unroll``: the scalar twin."""
    trace = json.loads(s.trace.to_json())
    for step in trace["steps"]:
        if step["primitive"] == "vectorize":
            step["primitive"] = "unroll"
    return sl.Schedule.from_trace(s.original, json.dumps(trace))


def run_both(s: sl.Schedule, inputs: list[np.ndarray]) -> tuple[sl.Kernel, np.ndarray]:
    """The vectorized kernel and its emulated output (bounds and alignment checked), which must be exactly its
    scalar twin's: the same additions in the same order give the very same bits."""
    fast = sl.build(s, "sm_90")
    slow = sl.build(unrolled_instead(s), "sm_90")
    assert widened(slow.source) == ([], [])
    got = fast.run_cpu(*inputs, bounds_check=True)
    np.testing.assert_array_equal(got, slow.run_cpu(*inputs, bounds_check=True))
    return fast, got


def assert_matches_reference(s: sl.Schedule, inputs: list[np.ndarray], got: np.ndarray, tol: float) -> None:
    want = sl.run_reference(s.original, dict(zip(s.func.inputs, inputs)))[s.func.outputs[0]]
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol)


def rule_schedule(spec: str) -> sl.Schedule:
    return sl.rules.apply_default(parse_workload(spec).build(), "h100")


@pytest.mark.emulator
def test_gemv_row_reads_are_16_byte_loads_with_an_unchanged_sum(rng: np.random.Generator) -> None:
    s = rule_schedule("gemv:N=96,K=512,dtype=float16")
    inputs = random_inputs(s.func, rng)
    k, got = run_both(s, inputs)
    loads, stores = widened(k.source)
    assert sorted(loads) == [("uint4", "W"), ("uint4", "X")] and stores == []
    assert_matches_reference(s, inputs, got, 2e-2)


@pytest.mark.emulator
def test_rmsnorm_reads_and_writes_wide_and_guards_a_ragged_row_per_vector(rng: np.random.Generator) -> None:
    """1000 columns over 1024 threads x 4: the last vectors fall past the row, and the guard on the column
    holds or fails for all 4 lanes at once (1000 is a multiple of 4), so it guards the vector access."""
    s = rule_schedule("rmsnorm:rows=3,cols=1000")
    inputs = random_inputs(s.func, rng)
    k, got = run_both(s, inputs)
    loads, stores = widened(k.source)
    assert sorted(loads) == [("uint4", "W"), ("uint4", "X"), ("uint4", "X")]  # the sum of squares, then Y
    assert stores == [("uint4", "Y")]
    assert_matches_reference(s, inputs, got, 1e-5)


@pytest.mark.emulator
def test_a_guard_that_splits_a_vector_keeps_the_loop_scalar(rng: np.random.Generator) -> None:
    """1002 columns: a vector of 4 can straddle the row's end, so no access may be widened."""
    s = rule_schedule("rmsnorm:rows=2,cols=1002")
    assert any(lp.vectorized for b in s.func.blocks for lp in b.loops)
    k, _ = run_both(s, random_inputs(s.func, rng))
    assert widened(k.source) == ([], [])


@pytest.mark.emulator
def test_softmax_with_a_symbolic_row_count_still_widens(rng: np.random.Generator) -> None:
    """Only the row stride must be known: rows may be symbolic."""
    s = sl.rules.apply_default(sl.workloads.softmax(sl.var("M"), 256), "h100")
    k, _ = run_both(s, random_inputs(s.func, rng, {"M": 5}))
    loads, stores = widened(k.source)
    assert loads and stores == [("uint4", "Y")]


@pytest.mark.emulator
def test_a_symbolic_row_stride_cannot_be_proved_aligned(rng: np.random.Generator) -> None:
    f = sl.workloads.reduce(4, sl.var("N"))
    s = sl.Schedule(f)
    _, rv = s.split("R.r", [None, 4])
    s.bind("R.i", "threadIdx.x")
    s.vectorize(rv)
    k, _ = run_both(s, random_inputs(s.func, rng, {"N": 12}))
    assert widened(k.source) == ([], [])


@pytest.mark.emulator
def test_a_serial_vectorized_reduction_folds_registers_in_order(rng: np.random.Generator) -> None:
    """Not a cross-thread reduction: the vectorized reduce loop sits in one thread, after the init."""
    s = sl.Schedule(sl.workloads.reduce(8, 24))
    _, rv = s.split("R.r", [None, 4])
    s.bind("R.i", "threadIdx.x")
    s.vectorize(rv)
    inputs = random_inputs(s.func, rng)
    k, got = run_both(s, inputs)
    assert widened(k.source) == ([("uint4", "X")], [])
    np.testing.assert_allclose(got, inputs[0].sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_elementwise_chain_loads_and_stores_wide(dtype: str, rng: np.random.Generator) -> None:
    """16-byte accesses by default: 4 fp32 or 8 fp16 elements per thread."""
    s = sl.rules.apply_default(sl.workloads.elementwise((64, 256), ("scale", "relu"), dtype), "h100")
    k, _ = run_both(s, random_inputs(s.func, rng))
    loads, stores = widened(k.source)
    assert loads and stores and all(vt == "uint4" for vt, _ in loads + stores)


@pytest.mark.nvcc
@pytest.mark.skipif(find_nvcc() is None, reason="reading the PTX needs nvcc")
def test_nvcc_emits_vector_global_loads_for_the_suite_gemv() -> None:
    """The suite's decode GEMV: before, nvcc kept 32 2-byte loads per thread; now 16-byte ones only."""
    k = sl.build(rule_schedule("gemv:N=14336,K=4096,dtype=float16"), "sm_90")
    text = ptx(k.source, "sm_90")
    global_loads = re.findall(r"ld\.global(?:\.nc)?\.(\S+)", text)
    assert global_loads and all(op.startswith("v4.") for op in global_loads), global_loads
    assert ".local" not in text  # the register arrays stay in registers


@pytest.mark.emulator
def test_fp16_norm_defaults_to_16_byte_runs(rng: np.random.Generator) -> None:
    """8 fp16 columns per thread and step (not 4: an 8-byte access) wherever the row holds enough of them."""
    s = rule_schedule("rmsnorm:rows=3,cols=1024,dtype=float16")
    inputs = random_inputs(s.func, rng)
    k, got = run_both(s, inputs)
    loads, stores = widened(k.source)
    assert {vt for vt, _ in loads + stores} == {"uint4"} and stores == [("uint4", "Y")]
    assert_matches_reference(s, inputs, got, 2e-2)


@pytest.mark.emulator
def test_a_register_tile_written_back_as_vectors_is_16_byte_aligned(rng: np.random.Generator) -> None:
    """A 4 x 4 register tile per thread stored with one 16-byte copy per row: the register array is read 16
    bytes at a time, so it is declared 16-byte aligned (alignment by luck would pass the emulator, not the GPU)."""
    s = sl.Schedule(sl.workloads.matmul(16, 16, 8))
    i, j, k = s.get_loops("C")
    io, ii = s.split(i, [None, 4])
    jo, ji = s.split(j, [None, 4])
    s.reorder(io, jo, k, ii, ji)
    s.bind(io, "threadIdx.y")
    s.bind(jo, "threadIdx.x")
    wb = s.cache_write("C", "local")
    s.reverse_compute_at(wb, jo)
    s.vectorize(s.get_loops(wb)[-1])
    A, B = random_inputs(s.func, rng)
    k = sl.build(s, "sm_90")
    body = "\n".join(kernel_bodies(k.source).values())
    assert "__align__(16) float C_local[16];" in body and "// block C_local: 4-wide vector copy" in body
    np.testing.assert_allclose(k.run_cpu(A, B, bounds_check=True), A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.emulator
def test_a_load_under_a_select_on_an_outer_loop_is_not_hoisted() -> None:
    """Rows 3 and 4 of the padded output read no X; a vector load hoisted before the select read them past
    the end of X (``SL_VLOAD`` out of bounds), because the condition varies with the row, not the vector."""
    X = sl.placeholder((3, 8), "float32", "X")
    Y = sl.compute((5, 8), lambda i, j: sl.if_then_else(i < 3, X[i, j], 0.0), "Y")
    s = sl.Schedule(sl.func([X, Y], "pad_rows"))
    i, j = s.get_loops("Y")
    jo, jv = s.split(j, [None, 4])
    s.bind(i, "blockIdx.x")
    s.bind(jo, "threadIdx.x")
    s.vectorize(jv)
    x = np.random.default_rng(0).random((3, 8), np.float32)
    out = sl.build(s, "h100").run_cpu(x, bounds_check=True)
    np.testing.assert_array_equal(out, np.concatenate([x, np.zeros((2, 8), np.float32)]))
