"""The memory side of generated CUDA: tile fetches that become vector accesses (and those that must not),
and shared memory past the 48 KB static limit becoming dynamic, aligned views."""

from __future__ import annotations

import re

import numpy as np
import pytest
from cg_cases import CASE_BY_NAME
from cg_schedules import reduce_through_shared, schedule_matmul
from cg_support import kernel_bodies, random_inputs

import schedlib as sl

STATIC_LIMIT = 48 * 1024


def only_body(k: sl.Kernel) -> str:
    (body,) = kernel_bodies(k.source).values()
    return body


# --------------------------------------------------------------------------------------------------
# vectorized copies
# --------------------------------------------------------------------------------------------------
VECTOR_COPY = re.compile(r"// block (\w+): (\d+)-wide vector copy\n\s*(?:if \(.*\) )?"
                         r"SL_VSTORE\((\w+( \w+)?), (\w+), .*SL_VLOAD\(\3, (\w+), ")


def vector_copies(body: str) -> dict[str, tuple[int, str, str, str]]:
    """block -> (width, vector type, destination, source) for every copy emitted as one vector access."""
    return {m.group(1): (int(m.group(2)), m.group(3), m.group(5), m.group(6)) for m in VECTOR_COPY.finditer(body)}


def test_aligned_tile_fetches_become_single_vector_accesses() -> None:
    """64 x 64 x 24 divides every tile: both 2-float fetches are provably 8-byte aligned and unguarded."""
    k = sl.build(schedule_matmul(sl.workloads.matmul(64, 64, 24), vec=2), "sm_90")
    body = only_body(k)
    assert vector_copies(body) == {"A_shared": (2, "uint2", "A_shared", "A"), "B_shared": (2, "uint2", "B_shared", "B")}
    assert "A_shared_ax0_ax1_fused_3" not in body and "B_shared_ax0_ax1_fused_3" not in body


def test_unprovable_alignment_keeps_scalar_copies() -> None:
    """K = 30 with 4-wide fetches: an A row (stride 30) is not 16-byte aligned and the k guard (< 30) may
    cut a vector in half, so A is copied element by element; B's rows (stride 64) stay vectorized."""
    k = sl.build(schedule_matmul(sl.workloads.matmul(64, 64, 30), TN=4, vec=4), "sm_90")
    body = only_body(k)
    assert set(vector_copies(body)) == {"B_shared"}
    assert re.search(r"#pragma unroll\n\s*for \(int A_shared_ax0_ax1_fused_3 = 0; A_shared_ax0_ax1_fused_3 < 4;",
                     body), "A must be copied by an unrolled scalar loop"
    # Odd sizes: nothing is provable, no vector access at all.
    case = CASE_BY_NAME["matmul_bias_relu"]  # N = 45, K = 37
    odd = sl.build(case.schedule(case.symbolic_func()), "sm_90")
    assert vector_copies(only_body(odd)) == {}


@pytest.mark.emulator
@pytest.mark.parametrize(("dtype", "vec", "pad", "want"), [
    ("float32", 4, 4, {"B_shared": (4, "uint4", "B_shared", "B"), "C_local": (4, "uint4", "C", "C_local")}),
    ("float16", 8, 8, {"B_shared": (8, "uint4", "B_shared", "B")}),
    ("float16", 8, 4, {}),  # B_shared rows of 68 halves: a row start is not 16-byte aligned
    ("float16", 2, 4, {"B_shared": (2, "unsigned int", "B_shared", "B")}),
], ids=["f32x4", "f16x8", "f16x8-misaligned-rows", "f16x2"])
def test_vector_copies_run_right(dtype: str, vec: int, pad: int, want: dict, rng: np.random.Generator) -> None:
    """Vector fetches into shared memory (and, for float32, the register tile's vector write-back) give the
    same numbers as numpy for a symbolic M that is not a multiple of the tile; a padding that breaks the
    alignment falls back to scalar copies."""
    f = sl.workloads.matmul(sl.var("M"), 64, 32, dtype=dtype)
    s = schedule_matmul(f, BM=32, BN=64, BK=16, TM=4, TN=4, vec=vec, pad=pad)
    if dtype == "float32":
        s.vectorize(s.get_loops("C_local")[-1])
    k = sl.build(s, "sm_90")
    assert vector_copies(only_body(k)) == want
    for m in (5, 37):
        A, B = random_inputs(f, rng, {"M": m})
        ref = A.astype(np.float64) @ B.astype(np.float64)
        np.testing.assert_allclose(k.run_cpu(A, B, bounds_check=True).astype(np.float64),
                                   ref.astype(dtype).astype(np.float64), rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------------------------------
# shared memory beyond 48 KB
# --------------------------------------------------------------------------------------------------
@pytest.mark.emulator
def test_shared_memory_over_48kb_becomes_dynamic(rng: np.random.Generator) -> None:
    s = reduce_through_shared(8192)  # a 64 KB tile
    k = sl.build(s, "sm_90")
    (spec,) = k.launch
    assert spec.dynamic_smem >= 2 * 8192 * 4 > STATIC_LIMIT
    body = only_body(k)
    assert "SL_DYN_SHARED(sl_smem);" in body
    assert "SL_SHARED_VIEW(float, X_shared, sl_smem, 0, 16384);" in body
    assert "SL_SHARED(float, X_shared" not in body
    (X,) = random_inputs(s.func, rng, {"M": 3})
    np.testing.assert_allclose(k.run_cpu(X, bounds_check=True), X.astype(np.float64).sum(axis=1),
                               rtol=1e-4, atol=1e-3)


@pytest.mark.emulator
def test_dynamic_shared_views_are_16_byte_aligned(rng: np.random.Generator) -> None:
    """Two fp16 tiles (36 KB + 33 KB with padding) share one dynamic allocation, each view 16-byte aligned."""
    f = sl.workloads.matmul(sl.var("M"), 130, 130, dtype="float16")
    k = sl.build(schedule_matmul(f, BM=128, BN=128, BK=128, TM=8, TN=8, vec=8), "sm_90")
    (spec,) = k.launch
    views = re.findall(r"SL_SHARED_VIEW\(half, (\w+), sl_smem, (\d+), (\d+)\);", only_body(k))
    assert [v[0] for v in views] == ["A_shared", "B_shared"]
    offsets = [int(v[1]) for v in views]
    assert offsets[0] == 0 and offsets[1] % 16 == 0 and offsets[1] >= 2 * int(views[0][2])
    assert spec.dynamic_smem >= offsets[1] + 2 * int(views[1][2]) > STATIC_LIMIT
    A, B = random_inputs(f, rng, {"M": 5})
    want = (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float16)
    np.testing.assert_allclose(k.run_cpu(A, B, bounds_check=True).astype(np.float64), want.astype(np.float64),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.nvcc
def test_dynamic_shared_kernel_compiles_with_little_static_shared_memory() -> None:
    k = sl.build(reduce_through_shared(8192), "sm_90")
    report = k.compile_check("sm_90")
    (res,) = report.kernels.values()
    assert res.shared_static_bytes < STATIC_LIMIT


@pytest.mark.emulator
def test_a_local_array_larger_than_the_default_stack_runs_on_the_emulator() -> None:
    """400 KB of registers spilled to local memory per thread (valid CUDA; nvcc puts it in the stack frame):
    the emulator's fiber stacks are sized from the kernel's local arrays.  A 128 KB stack was jumped past,
    beyond the canary the overflow check watches, and the process died with SIGSEGV."""
    n = 100_000
    X = sl.placeholder((2, n), "float32", "X")
    s = sl.Schedule(sl.func([X, sl.compute((2, n), lambda i, j: X[i, j] * 2.0, "Y")], "big_local"))
    i, _ = s.get_loops("Y")
    s.bind(i, "blockIdx.x")
    s.reverse_compute_at(s.cache_write("Y", "local"), i)
    kernel = sl.build(s, "h100")
    assert kernel.launch[0].local_bytes == 4 * n
    x = np.random.default_rng(0).random((2, n), np.float32)
    np.testing.assert_array_equal(kernel.run_cpu(x, bounds_check=True), 2 * x)


@pytest.mark.emulator
def test_a_double_buffered_copy_that_is_no_vector_access_stays_scalar() -> None:
    """A 4-wide copy down a column of A (not contiguous) with a double buffer: the vector statement path did
    not split the copy into its load and store stages, and the build failed with KeyError: 'sl_pf_A_shared'."""
    s = sl.Schedule(sl.workloads.matmul(8, 8, 2))
    s.split("C.i", [None, 4])
    s.reorder("C.i_0", "C.j", "C.k", "C.i_1")
    a = s.cache_read("C", "A", "shared")
    s.compute_at(a, "C.k")
    s.vectorize(s.fuse(*s.get_loops(a)))
    s.double_buffer(a)
    rng = np.random.default_rng(2)
    A, B = rng.random((8, 2), np.float32), rng.random((2, 8), np.float32)
    np.testing.assert_allclose(sl.build(s, "h100").run_cpu(A, B, bounds_check=True), A @ B, rtol=1e-5)


def test_a_double_buffered_copy_fed_by_a_copy_of_its_own_is_refused() -> None:
    """A_shared is double-buffered, then read through a second shared copy attached inside it: the next
    tile's prefetch read that copy before it was filled (an error of 4.9 on the emulator)."""
    s = sl.Schedule(sl.workloads.matmul(1, 24, 9, epilogue="bias_relu"))
    s.split("C.j", [None, 2, 1])
    s.split("C.k", [None, 8])
    s.reverse_compute_at(s.cache_write("C", "local"), "C.j_1")
    a = s.cache_read("C", "A", "shared")
    s.compute_at(a, "C.k_0")
    s.double_buffer(a)
    inner = s.cache_read(a, "A", "shared")
    s.compute_at(inner, s.get_loops(a)[0])
    with pytest.raises(sl.BuildError, match=r"double-buffered copy A_shared has A_shared_1 attached inside it"):
        sl.build(s, "h100")
