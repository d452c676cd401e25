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


def _tile_written_back_at(scope: str, inside_x: bool, cols: int = 10) -> sl.Schedule:
    """A 13 x ``cols`` matmul tiled 8x4 over blockIdx.y/x, a thread per column of a tile; its accumulator (in
    ``scope``) is written back at the blockIdx.y loop (outside the blockIdx.x one) or at the blockIdx.x loop
    (inside both, outside the thread loop)."""
    s = sl.Schedule(sl.workloads.matmul(13, cols, 11))
    i, j, k = s.get_loops("C")
    bi, ii = s.split(i, [None, 8])
    bj, jj = s.split(j, [None, 4])
    s.reorder(bi, bj, ii, jj, k)
    s.bind(bi, "blockIdx.y")
    s.bind(bj, "blockIdx.x")
    s.bind(jj, "threadIdx.x")
    acc = s.cache_write("C", scope)
    s.reverse_compute_at(acc, bj if inside_x else bi)
    return s


@pytest.mark.parametrize("scope", ["shared", "global"])
def test_a_reader_outside_a_blockidx_loop_of_its_writer_is_refused(scope: str) -> None:
    """Each CUDA block computes its own columns; a write-back covering the whole row of tiles would read
    the other blocks' columns, from its own shared memory (never written: the emulator read NaN for 88 of
    130 outputs) or from global memory with no order between the blocks."""
    with pytest.raises(sl.BuildError, match=r"block C_\w+ reads C_\w+ \(" + scope + r"\), which C writes inside "
                                            r"loop C.j_0 bound to blockIdx.x; .*Attach C_\w+ inside C.j_0"):
        sl.build(_tile_written_back_at(scope, inside_x=False), "h100")


@pytest.mark.emulator
def test_the_same_write_back_inside_every_blockidx_loop_builds_and_is_right() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.random((13, 11), np.float32), rng.random((11, 10), np.float32)
    out = sl.build(_tile_written_back_at("shared", inside_x=True), "h100").run_cpu(a, b, bounds_check=True)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


def test_a_register_write_back_outside_the_thread_loop_is_refused() -> None:
    """Each thread holds its own 1x1 column of the tile in registers; a write-back attached outside the
    threadIdx.x loop would copy one thread's registers over all 4 columns (an error of about 4.7 on the
    emulator, once the write-back stopped being written in the inner loop's context)."""
    with pytest.raises(sl.BuildError, match=r"block C_local reads the registers C_local, which C fills inside "
                                            r"loop C.j_1 bound to threadIdx.x, each thread its own part"):
        sl.build(_tile_written_back_at("local", inside_x=True), "h100")


@pytest.mark.emulator
def test_a_blockidx_loop_of_one_iteration_does_not_separate_reader_and_writer() -> None:
    """Four columns in tiles of 4: the blockIdx.x loop runs once, so a write-back outside it reads nothing
    another CUDA block computed."""
    rng = np.random.default_rng(1)
    a, b = rng.random((13, 11), np.float32), rng.random((11, 4), np.float32)
    kernel = sl.build(_tile_written_back_at("shared", inside_x=False, cols=4), "h100")
    np.testing.assert_allclose(kernel.run_cpu(a, b, bounds_check=True), a @ b, rtol=1e-5)


def test_a_thread_loop_over_spatial_and_reduce_axes_at_once_is_refused() -> None:
    """``fuse(R.i, R.r)`` bound to threadIdx.x: the store index depends on the thread, which a cross-thread
    reduction has combined away (the kernel did not compile: the loop variable was out of scope)."""
    s = sl.Schedule(sl.workloads.reduce(8, 4, op="sum"))
    fused = s.fuse("R.i", "R.r")
    _, lanes = s.split(fused, [None, 8])
    with pytest.raises(sl.ScheduleError, match=r"drives spatial and reduce axes at once"):
        s.bind(lanes, "threadIdx.x")
    with pytest.raises(sl.BuildError, match=r"loop R.i_r_fused_1 bound to threadIdx.x drives spatial and reduce"):
        sl.build(forced(s.func, lanes, thread="threadIdx.x"), "h100")


def test_a_block_attached_inside_a_cross_thread_reduction_is_refused_with_the_fix() -> None:
    """rfactor's partial block attached at the loop bound to threadIdx.x, as in TVM's rfactor recipe: the
    threads combine once, after every reduce loop, so nothing can sit inside those loops."""
    s = sl.Schedule(sl.workloads.reduce(8, 1024))
    _, k = s.get_loops("R")
    _, ki = s.split(k, [None, 32])
    partial = s.rfactor(ki)
    rows, lanes = s.get_loops("R")
    s.bind(rows, "blockIdx.x")
    s.bind(lanes, "threadIdx.x")
    s.compute_at(partial, lanes)
    with pytest.raises(sl.BuildError, match=r"R_rf is attached at R.v_r_1, inside its cross-thread reduction .* "
                                            r"attach it at a loop outside the reduce loops \(the blockIdx loop\)"):
        sl.build(s, "h100")


def _init_outside_the_blockidx_loop() -> sl.Schedule:
    """A batched matmul whose init is split off at C.i, above C.j, and C.j bound to blockIdx.x: the batch loop
    holds both in one kernel, so every CUDA block runs the init over the whole batch slice."""
    s = sl.Schedule(sl.workloads.matmul(2, 4, 3, batch=2))
    _, i, j, _ = s.get_loops("C")
    s.decompose_reduction("C", i)
    s.bind(j, "blockIdx.x")
    return s


def test_a_second_writer_outside_a_blockidx_loop_of_the_first_is_refused() -> None:
    """C_init zeroes every column in every CUDA block, over the sums other blocks have accumulated (the emulator
    gave 0 for 12 of 16 outputs, blocks running one after another; on a GPU, a race)."""
    with pytest.raises(sl.BuildError, match=r"block C_init writes C \(global\) outside loop C\.j bound to "
                                            r"blockIdx\.x, inside which C writes it too"):
        sl.build(_init_outside_the_blockidx_loop(), "h100")


@pytest.mark.emulator
def test_the_init_inside_the_blockidx_loop_builds_and_is_right() -> None:
    s = sl.Schedule(sl.workloads.matmul(2, 4, 3, batch=2))
    _, _, j, k = s.get_loops("C")
    s.decompose_reduction("C", k)
    s.bind(j, "blockIdx.x")
    rng = np.random.default_rng(0)
    a, b = rng.random((2, 2, 3), np.float32), rng.random((2, 3, 4), np.float32)
    np.testing.assert_allclose(sl.build(s, "h100").run_cpu(a, b, bounds_check=True), a @ b, rtol=1e-5)


@pytest.mark.emulator
@pytest.mark.xfail(strict=True, reason="known: a write-back box with holes is copied whole by every CUDA block; "
                                       "neither reverse_compute_at nor the build refuses it")
def test_a_write_back_box_with_holes_under_a_blockidx_loop_is_refused_or_right() -> None:
    """split(i, [2, 2, 3]) reordered so that blockIdx.x runs i_1: block b writes C[6 i_0 + 3 b + (0..2)], a box
    of 9 with a hole of 3 that the other block fills.  The write-back at the blockIdx loop copies the whole box
    from this block's shared memory: NaN for 3 of 12 outputs on the emulator (and in run_reference); for a
    global cache, a race between blocks that the emulator, running blocks one after another, cannot see."""
    A = sl.placeholder((12,), "float32", "A")
    f = sl.func([A, sl.compute((12,), lambda i: A[i] * 2.0, "C")], "scale")
    s = sl.Schedule(f)
    _, i1, _ = s.split("C.i", [2, 2, 3])
    s.reorder(i1, "C.i_0")
    s.bind(i1, "blockIdx.x")
    s.reverse_compute_at(s.cache_write("C", "shared"), i1)
    a = np.random.default_rng(0).random(12, np.float32)
    try:
        kernel = sl.build(s, "h100")
    except sl.BuildError:
        return
    np.testing.assert_array_equal(kernel.run_cpu(a, bounds_check=True), a * 2)
