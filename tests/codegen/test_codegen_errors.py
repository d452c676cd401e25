"""Schedules the code generator must refuse (BuildError), arguments run_cpu must refuse (ShapeError), and the
GPU entry point on a machine without a GPU."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from cg_schedules import schedule_rmsnorm
from cg_support import forced, gpu_skip_reason

import schedlib as sl
from schedlib.codegen import generate


def _tiled_matmul(threads_fetch: int) -> sl.Schedule:
    """8 x 8 threads per 8 x 8 tile of C, an A tile in shared memory fetched by ``threads_fetch`` threads."""
    s = sl.Schedule(sl.workloads.matmul(64, 64, 32))
    i, j, k = s.get_loops("C")
    bi, ti = s.split(i, [None, 8])
    bj, tj = s.split(j, [None, 8])
    ko, _ = s.split(k, [None, 8])
    s.reorder(bi, bj, ti, tj, ko)
    s.bind(bi, "blockIdx.y")
    s.bind(bj, "blockIdx.x")
    s.bind(ti, "threadIdx.y")
    s.bind(tj, "threadIdx.x")
    tile = s.cache_read("C", "A", "shared")
    s.compute_at(tile, ko)
    _, tx = s.split(s.fuse(*s.get_loops(tile)), [None, threads_fetch])
    s.bind(tx, "threadIdx.x")
    return s


def test_the_tiled_matmul_helper_builds_when_fetch_threads_match() -> None:
    """The control for the guard test below: with 8 fetch threads there is no guard, and it builds."""
    k = sl.build(_tiled_matmul(8), "sm_90")
    assert k.launch[0].block == (8, 8, 1)


# --------------------------------------------------------------------------------------------------
# BuildError
# --------------------------------------------------------------------------------------------------
def test_shared_buffer_used_outside_its_kernel() -> None:
    """A shared copy left at the root is its own kernel; the matmul reading it runs in another."""
    s = sl.Schedule(sl.workloads.matmul(16, 16, 16))
    s.cache_read("C", "A", "shared")
    with pytest.raises(sl.BuildError, match=r"shared buffer A_shared is used outside kernel matmul_A_shared "
                                            r"\(by C\); it cannot outlive the kernel"):
        sl.build(s, "sm_90")


def test_local_buffer_used_outside_its_kernel() -> None:
    s = sl.Schedule(sl.workloads.matmul(16, 16, 16))
    s.cache_write("C", "local")
    with pytest.raises(sl.BuildError, match=r"local buffer C_local is used outside kernel matmul_C \(by C_local\)"):
        sl.build(s, "sm_90")


def test_blockidx_bound_inside_an_attached_block() -> None:
    """Refused by ``bind`` itself (with the reason codegen would give), leaving the schedule buildable."""
    s = sl.Schedule(sl.workloads.matmul(16, 16, 16))
    i, _, _ = s.get_loops("C")
    s.bind(i, "blockIdx.x")
    tile = s.cache_read("C", "A", "shared")
    s.compute_at(tile, i)
    before = str(s)
    with pytest.raises(sl.ScheduleError, match=r"bind: argument loop='A_shared\.ax1'.*only the outermost block of "
                                               r"a kernel \(C\) may bind blockIdx"):
        s.bind(s.get_loops(tile)[1], "blockIdx.y")
    assert str(s) == before
    sl.build(s, "sm_90")


def test_more_than_1024_threads() -> None:
    s = sl.Schedule(sl.workloads.matmul(64, 32, 16))
    i, j, _ = s.get_loops("C")
    s.bind(i, "threadIdx.y")
    with pytest.raises(sl.ScheduleError, match=r"thread block would be threadIdx.x 32 x threadIdx.y 64 = 2048"):
        s.bind(j, "threadIdx.x")  # refused where the call is
    with pytest.raises(sl.BuildError, match=r"kernel matmul_C: 2048 threads per block exceed 1024"):
        sl.build(forced(s.func, j, thread="threadIdx.x"), "sm_90")  # and again by the build


def test_exactly_1024_threads_is_fine() -> None:
    s = sl.Schedule(sl.workloads.matmul(32, 32, 16))
    i, j, _ = s.get_loops("C")
    s.bind(i, "threadIdx.y")
    s.bind(j, "threadIdx.x")
    assert sl.build(s, "sm_90").launch[0].block == (32, 32, 1)


def test_barrier_needing_stage_inside_a_thread_guard() -> None:
    """32 fetch threads widen threadIdx.x to 32, so C's 8-wide threadIdx.x loop becomes `if (tx < 8)`; the
    shared tile filled inside it would need a barrier that only a quarter of the threads reach."""
    with pytest.raises(sl.BuildError, match=r"block A_shared shares memory between threads but sits inside a "
                                            r"thread guard .*a barrier there would deadlock"):
        sl.build(_tiled_matmul(32), "sm_90")


def test_cross_thread_reduction_inside_a_thread_guard() -> None:
    """RMSNorm's rows on threadIdx.y (4) while the weight fetch uses 8: the row reduction sits in a guard."""
    f = sl.workloads.rmsnorm(sl.var("M"), 64)
    s = sl.Schedule(f)
    s.compute_inline(s.cache_write("T_sumsq", "local"))
    i, j = s.get_loops("Y")
    bi, ti = s.split(i, [None, 4])
    jo, jt = s.split(j, [None, 32])
    s.reorder(bi, ti, jt, jo)
    s.bind(bi, "blockIdx.x")
    s.bind(ti, "threadIdx.y")
    s.bind(jt, "threadIdx.x")
    s.compute_at("T_sumsq", ti)
    ko, kt = s.split(s.get_loops("T_sumsq")[-1], [None, 32])
    s.reorder(kt, ko)
    s.bind(kt, "threadIdx.x")
    ws = s.cache_read("Y", "W", "shared")
    s.compute_at(ws, bi)
    _, wy, wx = s.split(s.get_loops(ws)[0], [None, 8, 32])
    s.bind(wy, "threadIdx.y")
    s.bind(wx, "threadIdx.x")
    why = (r"block T_sumsq: a cross-thread reduction inside a thread guard \(a thread loop shorter than the "
           r"launch\); its barriers would deadlock")
    with pytest.raises(sl.BuildError, match=why):
        sl.build(s, "sm_90")
    # The same schedule with 4 fetch rows (the hand-written one) builds.
    assert sl.build(schedule_rmsnorm(f), "sm_90").launch[0].block == (32, 4, 1)


def test_cross_thread_reduction_over_two_thread_indices() -> None:
    s = sl.Schedule(sl.workloads.reduce(8, 64, "sum"))
    i, r = s.get_loops("R")
    _, ry, rx = s.split(r, [None, 4, 8])
    s.bind(i, "blockIdx.x")
    s.bind(ry, "threadIdx.y")
    s.bind(rx, "threadIdx.x")
    with pytest.raises(sl.BuildError, match=r"block R: a cross-thread reduction must use one thread index, got "
                                            r"\['threadIdx\.x', 'threadIdx\.y'\]"):
        sl.build(s, "sm_90")


def test_spatial_loop_inside_a_cross_thread_reduction() -> None:
    """A spatial loop inside a cross-thread reduction must be a lane (unbound, constant extent, few points:
    see test_cross_thread_lanes.py); one of symbolic extent is not."""
    s = sl.Schedule(sl.workloads.reduce(sl.var("M"), 64, "sum"))
    i, r = s.get_loops("R")
    ro, rt = s.split(r, [None, 32])
    s.reorder(rt, i, ro)
    s.bind(rt, "threadIdx.x")
    with pytest.raises(sl.BuildError, match=r"block R: spatial loop R\.i lies inside a cross-thread reduction; "
                                            r"move it outside the reduction loops, or keep it unbound and of "
                                            r"constant extent"):
        sl.build(s, "sm_90")


def test_a_write_back_whose_region_spans_other_threads_is_a_write_race() -> None:
    """A batched GEMV's (batch, n) fused and split over threads, its write-back attached inside the thread loop
    but outside the thread's own columns: the // and % of the fused index make the write-back's region every
    column, so each thread would store all of D from its own registers (found as wrong results on the
    emulator, never an error, before this check)."""
    s = sl.Schedule(sl.workloads.matmul(8, 40, 24, batch=2, epilogue="bias"))
    b, i, j, k = s.get_loops("C")
    s.reorder(b, j, i, k)
    bx, nt, nv = s.split(s.fuse(b, j), [None, 32, 2])
    ko, ku, kt = s.split(k, [None, 8, 32])
    s.reorder(bx, nt, i, kt, ko, ku, nv)
    s.bind(bx, "blockIdx.x")
    s.bind(nt, "threadIdx.x")
    s.bind(kt, "threadIdx.y")
    s.reverse_compute_at(s.cache_write("C", "local"), i)
    s.reverse_compute_inline("D")
    with pytest.raises(sl.BuildError, match=r"block C_local: every thread of threadIdx\.x \(loop C\.b_j_fused_1\) "
                                            r"stores to the same elements of D, each from its own registers "
                                            r"C_local: a write race"):
        sl.build(s, "sm_90")


def test_shared_buffer_of_symbolic_size() -> None:
    """A shared row of softmax over a symbolic number of columns has no compile-time size."""
    s = sl.Schedule(sl.workloads.softmax(4, sl.var("N")))
    s.compute_inline(s.cache_write("T_exp", "shared"))
    i, _ = s.get_loops("Y")
    s.bind(i, "blockIdx.x")
    s.compute_at("T_sum", i)
    s.compute_at("T_exp", i)
    with pytest.raises(sl.BuildError, match=r"shared buffer T_exp_shared has symbolic size N; compact it"):
        sl.build(s, "sm_90")


def test_build_and_generate_refuse_other_objects() -> None:
    with pytest.raises(sl.BuildError, match="build needs a Schedule or Func, got str"):
        sl.build("matmul", "sm_90")
    with pytest.raises(sl.BuildError, match="generate needs a Func, got Schedule"):
        generate(sl.Schedule(sl.workloads.transpose(4, 4)))


# --------------------------------------------------------------------------------------------------
# ShapeError from run_cpu (raised before anything is compiled)
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def matmul_kernel() -> sl.Kernel:
    """C[M, 8] = A[M, K] @ B[K, 8] with symbolic M and K."""
    return sl.build(sl.Schedule(sl.workloads.matmul(sl.var("M"), 8, sl.var("K"))), "sm_90")


def _ab(rng: np.random.Generator, m: int = 5, k: int = 7) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, 8), dtype=np.float32)


@pytest.mark.parametrize("count", [0, 1, 4])
def test_wrong_number_of_arrays(matmul_kernel: sl.Kernel, rng: np.random.Generator, count: int) -> None:
    A, B = _ab(rng)
    arrays = [A, B, np.zeros((5, 8), np.float32), A][:count]
    with pytest.raises(sl.ShapeError, match=rf"kernel matmul takes 2 inputs \['A', 'B'\] \(optionally followed "
                                            rf"by 1 outputs \['C'\]\), got {count} arrays"):
        matmul_kernel.run_cpu(*arrays)


def test_constant_dim_mismatch(matmul_kernel: sl.Kernel, rng: np.random.Generator) -> None:
    A, _ = _ab(rng)
    with pytest.raises(sl.ShapeError, match=r"matmul: input B dim 1 is 9, expected 8"):
        matmul_kernel.run_cpu(A, rng.standard_normal((7, 9), dtype=np.float32))


def test_symbolic_dim_bound_inconsistently(matmul_kernel: sl.Kernel, rng: np.random.Generator) -> None:
    A, _ = _ab(rng, k=7)
    with pytest.raises(sl.ShapeError, match=r"matmul: input B dim 0 is 6, but K=7 from an earlier input"):
        matmul_kernel.run_cpu(A, rng.standard_normal((6, 8), dtype=np.float32))


def test_wrong_dtype(matmul_kernel: sl.Kernel, rng: np.random.Generator) -> None:
    A, B = _ab(rng)
    with pytest.raises(sl.ShapeError, match=r"matmul: input A has dtype float64, expected float32"):
        matmul_kernel.run_cpu(A.astype(np.float64), B)
    with pytest.raises(sl.ShapeError, match=r"matmul: input B has dtype float16, expected float32"):
        matmul_kernel.run_cpu(A, B.astype(np.float16))


def test_wrong_rank(matmul_kernel: sl.Kernel, rng: np.random.Generator) -> None:
    A, B = _ab(rng)
    with pytest.raises(sl.ShapeError, match=r"matmul: input A has rank 1, expected 2"):
        matmul_kernel.run_cpu(A[0], B)


def test_wrong_output_given(matmul_kernel: sl.Kernel, rng: np.random.Generator) -> None:
    A, B = _ab(rng)
    with pytest.raises(sl.ShapeError, match=r"output C must be float32\[5, 8\], got float32\[5, 9\]"):
        matmul_kernel.run_cpu(A, B, np.zeros((5, 9), np.float32))
    with pytest.raises(sl.ShapeError, match=r"output C must be float32\[5, 8\], got float64\[5, 8\]"):
        matmul_kernel.run_cpu(A, B, np.zeros((5, 8), np.float64))
    with pytest.raises(sl.ShapeError, match=r"output C must be C-contiguous"):
        matmul_kernel.run_cpu(A, B, np.zeros((8, 5), np.float32).T)


def test_shape_error_is_a_value_error(matmul_kernel: sl.Kernel, rng: np.random.Generator) -> None:
    _, B = _ab(rng)
    with pytest.raises(sl.ShapeError, match=re.escape("matmul: input A has dtype int32, expected float32")) as info:
        matmul_kernel.run_cpu(np.ones((5, 7), np.int32), B)
    assert isinstance(info.value, ValueError)


@pytest.mark.emulator
def test_given_output_is_written_in_place(matmul_kernel: sl.Kernel, rng: np.random.Generator) -> None:
    A, B = _ab(rng, m=3, k=5)
    out = np.full((3, 8), np.nan, np.float32)
    got = matmul_kernel.run_cpu(A, B, out, bounds_check=True)
    assert got is out
    np.testing.assert_allclose(out, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# the GPU entry point without a GPU
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def no_gpu() -> None:
    if gpu_skip_reason() is None:
        pytest.skip("a CUDA device is present; this checks the message given without one")


def test_call_without_a_gpu_points_at_run_cpu(no_gpu: None, matmul_kernel: sl.Kernel,
                                              rng: np.random.Generator) -> None:
    A, B = _ab(rng)
    with pytest.raises(sl.BuildError, match=r"run_cpu"):
        matmul_kernel(A, B)


def test_call_without_cupy_points_at_run_cpu(monkeypatch: pytest.MonkeyPatch, matmul_kernel: sl.Kernel,
                                             rng: np.random.Generator) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` now raises ImportError
    A, B = _ab(rng)
    with pytest.raises(sl.BuildError, match=r"needs cupy") as info:
        matmul_kernel(A, B)
    assert "run_cpu" in str(info.value)


def test_a_buffer_of_2_to_the_31_elements_is_refused_not_miscompiled() -> None:
    # 32-bit offsets would overflow from row 32768 on: undefined behaviour, silently wrong addresses
    sch = sl.rules.apply_default(sl.workloads.matmul(65536, 65536, 64), "h100")
    with pytest.raises(sl.ShapeError, match=r"buffer C of shape \[65536, 65536\] has 4,294,967,296 elements"):
        sl.build(sch, "h100")
    sl.build(sl.rules.apply_default(sl.workloads.matmul(32768, 65535, 64), "h100"), "h100")  # 2^31 - 32768


def test_symbolic_sizes_are_checked_once_bound() -> None:
    from schedlib.ir.layout import check_index_range

    func = sl.workloads.matmul(sl.var("M"), 65536, 64)
    check_index_range(func)  # unknown until launch
    check_index_range(func, {"M": 32767})
    with pytest.raises(sl.ShapeError, match=r"buffer C of shape \[32768, 65536\] with \{'M': 32768\}"):
        check_index_range(func, {"M": 32768})


def test_a_dimension_beyond_the_index_type_is_an_ir_error() -> None:
    with pytest.raises(sl.IRError, match="does not fit the 32-bit index type"):
        sl.placeholder((2**31, 4), "float32", "X")
