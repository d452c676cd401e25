"""Values cross between CUDA blocks only through global memory between launches
(schedlib/codegen/grid_locality.py): readers and second writers placed outside a blockIdx loop of a writer
are refused at build (as are thread loops that split a cross-thread reduction), and the same schedules with
them inside build and give the right values."""

from __future__ import annotations

import numpy as np
import pytest
from cg_support import forced

import schedlib as sl


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
def test_a_write_back_box_with_holes_under_a_blockidx_loop_is_refused_or_right() -> None:
    """split(i, [2, 2, 3]) reordered so that blockIdx.x runs i_1: block b writes C[6 i_0 + 3 b + (0..2)], a box
    of 9 with a hole of 3 that the other block fills.  The write-back at the blockIdx loop would copy the whole
    box from this block's shared memory: NaN for 3 of 12 outputs on the emulator (and in run_reference); for a
    global cache, a race between blocks that the emulator, running blocks one after another, cannot see.
    reverse_compute_at refuses it (it used to accept it, and the build too)."""
    A = sl.placeholder((12,), "float32", "A")
    f = sl.func([A, sl.compute((12,), lambda i: A[i] * 2.0, "C")], "scale")
    s = sl.Schedule(f)
    _, i1, _ = s.split("C.i", [2, 2, 3])
    s.reorder(i1, "C.i_0")
    s.bind(i1, "blockIdx.x")
    cache = s.cache_write("C", "shared")
    try:
        s.reverse_compute_at(cache, i1)
        kernel = sl.build(s, "h100")
    except (sl.ScheduleError, sl.BuildError) as refused:
        assert "C.i_1" in str(refused)
        return
    a = np.random.default_rng(0).random(12, np.float32)
    np.testing.assert_array_equal(kernel.run_cpu(a, bounds_check=True), a * 2)
