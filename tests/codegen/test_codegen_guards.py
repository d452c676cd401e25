"""Guards the generated code needs where a schedule or a size is at its edge.

Each case used to produce a kernel that read or wrote outside its buffers, or one that would hang on the GPU:
a symbolic row count of 0 (a grid has no empty dimension, so one block ran), a vector load hoisted out of
the ``if_then_else`` that guards it, and double-buffered copies whose barriers sat inside a thread guard.
"""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
from schedlib.errors import BuildError


@pytest.mark.parametrize("kind", ["softmax", "layernorm"])
@pytest.mark.parametrize("rows", [0, 1, 3])
def test_row_kernels_with_a_symbolic_row_count_of_zero(kind: str, rows: int) -> None:
    cols = 37
    f = getattr(sl.workloads, kind)(sl.var("M"), cols)
    kernel = sl.build(sl.rules.apply_default(f, "h100"), "h100")
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    extra = [np.ones(cols, np.float32), np.zeros(cols, np.float32)] if kind == "layernorm" else []
    out = kernel.run_cpu(x, *extra, bounds_check=True)  # checked: block 0 used to touch row 0 of nothing
    want = sl.run_reference(f, dict(zip(f.inputs, [x, *extra])))[f.outputs[0]]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_a_vector_load_stays_under_its_if_then_else() -> None:
    X = sl.placeholder((10,), "float32", "X")
    f = sl.func([X, sl.compute((16,), lambda i: sl.if_then_else(i < 10, X[i], 0.0), "Y")], "pad")
    s = sl.Schedule(f)
    outer, thread, lane = s.split(s.get_loops("Y")[0], [None, 2, 4])
    s.bind(outer, "blockIdx.x")
    s.bind(thread, "threadIdx.x")
    s.vectorize(lane)
    kernel = sl.build(s, "h100")
    assert "SL_VLOAD_REGS(uint4, sl_vec1, X" not in kernel.source  # the read of X stays scalar
    x = np.arange(1, 11, dtype=np.float32)
    np.testing.assert_array_equal(kernel.run_cpu(x, bounds_check=True), np.concatenate([x, np.zeros(6, np.float32)]))


def stage_operands(s: sl.Schedule, k_outer: str, threads_y: int, threads_x: int) -> list[str]:
    """Matmul C's operands A and B copied into shared memory at ``k_outer`` by threads_y x threads_x threads
    (the copy's fused loop split over them); returns the copies."""
    copies = []
    for operand in ("A", "B"):
        shared = s.cache_read("C", operand, "shared")
        s.compute_at(shared, k_outer)
        _, fy, fx = s.split(s.fuse(*s.get_loops(shared)), [None, threads_y, threads_x])
        s.bind(fy, "threadIdx.y")
        s.bind(fx, "threadIdx.x")
        copies.append(shared)
    return copies


@pytest.mark.parametrize("double_buffered", [False, True])
def test_copies_inside_a_thread_guard_are_refused_either_way(double_buffered: bool) -> None:
    """The copies spread over 16 threads in x while C's loop has 8, so C's statements sit under
    ``if (C_j_1 < 8)``; a barrier there waits for threads that never come."""
    s = sl.Schedule(sl.workloads.matmul(64, 64, 64))
    i, j, k = s.get_loops("C")
    by, ty, _ = s.split(i, [None, 8, 4])
    bx, tx, _ = s.split(j, [None, 8, 4])
    ko, _ = s.split(k, [None, 16])
    s.reorder(by, bx, ty, tx, ko)
    for loop, tag in ((by, "blockIdx.y"), (bx, "blockIdx.x"), (ty, "threadIdx.y"), (tx, "threadIdx.x")):
        s.bind(loop, tag)
    s.reverse_compute_at(s.cache_write("C", "local"), tx)
    for shared in stage_operands(s, ko, 8, 16):
        if double_buffered:
            s.double_buffer(shared)
    s.decompose_reduction("C", ko)
    with pytest.raises(BuildError, match=r"shares? memory between threads but sits? inside a thread guard"):
        sl.build(s, "h100")


@pytest.mark.emulator
def test_a_block_attached_after_a_guarded_thread_loop_runs_outside_its_guard() -> None:
    """24 threads compute under ``if (threadIdx.x < 24)`` in a 32-thread launch; the shared write-back is
    attached at the blockIdx loop, after that thread loop and its guard have closed.  It was given the inner
    loop's context: refused as a barrier inside a thread guard (and its once-only guard was dropped)."""
    X = sl.placeholder((4, 24), "float32", "X")
    s = sl.Schedule(sl.func([X, sl.compute((4, 24), lambda i, j: X[i, j] * 2.0, "T")], "write_back_after"))
    i, j = s.get_loops("T")
    s.bind(i, "blockIdx.x")
    s.bind(j, "threadIdx.x")
    w = s.cache_write("T", "shared")
    s.reverse_compute_at(w, i)
    _, lanes = s.split(s.get_loops(w)[-1], [None, 32])
    s.bind(lanes, "threadIdx.x")
    x = np.random.default_rng(0).random((4, 24), np.float32)
    np.testing.assert_array_equal(sl.build(s, "h100").run_cpu(x, bounds_check=True), 2 * x)


@pytest.mark.emulator
def test_a_decomposed_reduction_repeated_across_a_thread_loop_accumulates_once() -> None:
    """A softmax row sum in shared memory, computed at a threadIdx.y loop it does not depend on (the shared
    region spans every row), its init decomposed: each of the 4 thread rows added the whole sum (4x)."""
    s = sl.Schedule(sl.workloads.softmax(8, 9))
    s.compute_inline(s.cache_write("T_sum", "shared"))
    # the row max in shared memory too: in global memory each CUDA block would reduce every row again
    # (compute_at refuses that race)
    s.compute_inline(s.cache_write("T_max", "shared"))
    s.compute_inline("T_exp")
    io, ii = s.split("Y.i", [None, 4])
    jo, ji = s.split("Y.j", [None, 4])
    s.reorder(io, ii, ji, jo)
    s.bind(io, "blockIdx.x")
    s.bind(ii, "threadIdx.y")
    s.bind(ji, "threadIdx.x")
    for red in ("T_sum", "T_max"):
        s.compute_at(red, ii)
        ko, kt = s.split(f"{red}.k", [None, 4])
        s.reorder(kt, ko)
        s.bind(kt, "threadIdx.x")
    s.decompose_reduction("T_sum", "T_sum.k_1")
    x = np.random.default_rng(0).random((8, 9), np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    got = sl.build(s, "h100").run_cpu(x, bounds_check=True)
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_an_output_another_kernel_wrote_is_read_without_a_barrier() -> None:
    """Kernel 1 writes the output A; kernel 2 reads it back through a register copy inside a thread guard (B's
    32 threads of 64).  A was finished before the launch: no barrier is needed, and one there would be refused
    (it sits inside the guard)."""
    X = sl.placeholder((4, 32), "float32", "X")
    W = sl.placeholder((4, 64), "float32", "W")
    A = sl.compute((4, 32), lambda i, j: X[i, j] * 2.0, "A")
    B = sl.compute((4, 32), lambda i, j: A[i, j] + 1.0, "B")
    C = sl.compute((4, 64), lambda i, j: W[i, j] + B[i, j // 2], "C")
    s = sl.Schedule(sl.func([X, W, A, C], "read_back"))
    for block in ("A", "C"):
        row, col = s.get_loops(block)
        s.bind(row, "blockIdx.x")
        s.bind(col, "threadIdx.x")
    s.compute_at("B", "C.i")
    s.bind(s.get_loops("B")[-1], "threadIdx.x")
    s.compute_at(s.cache_read("B", "A", "local"), s.get_loops("B")[-1])
    kernel = sl.build(s, "h100")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 32)).astype(np.float32), rng.standard_normal((4, 64)).astype(np.float32)
    a, c = kernel.run_cpu(x, w, bounds_check=True)
    np.testing.assert_allclose(a, 2 * x)
    np.testing.assert_allclose(c, w + np.repeat(2 * x + 1, 2, axis=1), rtol=1e-6)


def test_a_check_that_reads_memory_is_not_hoisted_into_the_version_test() -> None:
    """A masked batched matmul (``k < L[b]``) with the batch split 3 -> 2 x 2: the padding batch b = 3 is
    skipped by the block's predicate, but a version test hoisting ``k < L[b]`` read L[3] before it."""
    A = sl.placeholder((3, 16, 24), "float32", "A")
    B = sl.placeholder((3, 24, 16), "float32", "B")
    L = sl.placeholder((3,), "int32", "L")
    k = sl.reduce_axis(24, "k")
    C = sl.compute((3, 16, 16), lambda b, i, j: sl.sum(sl.if_then_else(k < L[b], A[b, i, k] * B[b, k, j], 0.0),
                                                       axis=k), "C")
    f = sl.func([A, B, L, C], "masked")
    s = sl.Schedule(f)
    b, i, j, kk = s.get_loops("C")
    bo, bb = s.split(b, [None, 2])
    bi, ti, ii = s.split(i, [None, 4, 4])
    bj, tj, jj = s.split(j, [None, 4, 4])
    ko, ki = s.split(kk, [None, 8])
    s.reorder(bo, bi, bj, ti, tj, bb, ko, ki, ii, jj)
    for loop, tag in ((bo, "blockIdx.z"), (bi, "blockIdx.y"), (bj, "blockIdx.x"), (ti, "threadIdx.y"),
                      (tj, "threadIdx.x")):
        s.bind(loop, tag)
    s.reverse_compute_at(s.cache_write("C", "local"), bb)
    stage_operands(s, ko, 4, 4)
    s.decompose_reduction("C", ko)
    for loop in s.get_loops("C")[-3:]:  # an unrolled nest of 8 x 4 x 4, big enough to version
        s.unroll(loop)
    kernel = sl.build(s, "h100")
    rng = np.random.default_rng(0)
    a, bm = rng.standard_normal((3, 16, 24)).astype(np.float32), rng.standard_normal((3, 24, 16)).astype(np.float32)
    lengths = np.array([24, 10, 17], np.int32)
    got = kernel.run_cpu(a, bm, lengths, bounds_check=True)  # L[3] was read here
    want = sl.run_reference(f, {"A": a, "B": bm, "L": lengths})["C"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.emulator
@pytest.mark.parametrize("scope", ["local", "shared", "global"])
def test_a_write_back_skips_the_iterations_an_overshooting_split_masks(scope: str) -> None:
    """Thread t owns C[2t] and C[2t + 1]; split(i_1, [3, None]) adds an iteration i_1_0 = 2, masked in C, whose
    box is C[2t + 2], thread t + 1's element.  The write-back reverse_compute_at'ed at the thread loop copied
    it anyway: from registers, this thread's never-written copy over the other thread's result (0 for 3 of 8
    outputs on the emulator).  It now carries the guard of the iteration."""
    A = sl.placeholder((8,), "float32", "A")
    f = sl.func([A, sl.compute((8,), lambda i: A[i] * 2.0, "C")], "scale")
    s = sl.Schedule(f)
    t, i1 = s.split("C.i", [4, None])
    o, _ = s.split(i1, [3, None])
    s.reorder(o, t)
    s.bind(t, "threadIdx.x")
    s.reverse_compute_at(s.cache_write("C", scope), t)
    assert f"C.i_1_0 < 2:\n          C[ax0] = C_{scope}[ax0]" in str(s)
    a = np.random.default_rng(0).random(8, np.float32)
    np.testing.assert_array_equal(sl.build(s, "h100").run_cpu(a, bounds_check=True), a * 2)
