"""Axes that primitives create never take the name of a symbolic size.

Codegen substitutes a symbolic size's value by name, so a copy axis called ``ax1`` beside a size called
``ax1`` (or rfactor's ``v_k`` beside a size ``v_k``) used to index with the loop variable in place of the
size: the reference executor, which evaluates by scope, still agreed, but the kernel read the wrong
elements.  These run the kernels on the CPU emulator.
"""

from __future__ import annotations

import numpy as np

import schedlib as sl


def _axis_names(s: sl.Schedule) -> set[str]:
    return {a.name for b in s.func.blocks for a in b.axes}


def test_cache_read_axes_avoid_a_size_named_like_them() -> None:
    n = sl.var("ax1")
    A = sl.placeholder((4, n), "float32", "A")
    C = sl.compute((4, n), lambda i, j: A[i, j] * 2.0, "C")
    s = sl.Schedule(sl.func([A, C]))
    s.cache_read("C", "A", "global")
    assert "ax1" not in _axis_names(s)
    for block in ("A_global", "C"):
        s.bind(s.get_loops(block)[0], "blockIdx.x")
    a = np.random.default_rng(0).random((4, 6), dtype=np.float32)
    np.testing.assert_array_equal(sl.build(s, "sm_90").run_cpu(a, bounds_check=True), a * 2)


def test_rfactor_axes_avoid_a_size_named_like_them() -> None:
    k_size = sl.var("v_k")
    A = sl.placeholder((4, k_size), "float32", "A")
    k = sl.reduce_axis(k_size, "k")
    C = sl.compute((4,), lambda i: sl.sum(A[i, k], axis=k), "C")
    s = sl.Schedule(sl.func([A, C]))
    s.rfactor("C.k")
    assert "v_k" not in _axis_names(s)
    for block in [b.name for b in s.func.blocks]:
        s.bind(s.get_loops(block)[0], "blockIdx.x")
    a = np.random.default_rng(1).random((4, 5), dtype=np.float32)
    np.testing.assert_allclose(sl.build(s, "sm_90").run_cpu(a, bounds_check=True), a.sum(axis=1), rtol=1e-5)


def test_a_loop_whose_c_name_is_a_size_or_a_buffer_is_renamed_in_the_kernel() -> None:
    """The loop ``out.n`` prints as ``out_n``; beside a size called ``out_n`` it shadowed the size and the
    loop ``for (int out_n = 0; out_n < out_n; ...)`` ran nothing.  A buffer called ``Y_j`` beside the loop
    ``Y.j`` did not compile."""
    rows = sl.var("out_n")
    X = sl.placeholder((rows, 16), "float32", "X")
    r = sl.reduce_axis(16, "k")
    total = sl.func([X, sl.compute((rows,), lambda n: sl.sum(X[n, r], axis=r), "out")], "rowsum")
    kernel = sl.build(total, "h100")
    assert "out_n < out_n" not in kernel.source
    np.testing.assert_array_equal(kernel.run_cpu(np.ones((5, 16), np.float32)), np.full(5, 16.0, np.float32))

    Yj = sl.placeholder((3, 8), "float32", "Y_j")
    s = sl.Schedule(sl.func([Yj, sl.compute((3, 8), lambda i, j: Yj[i, j] + 1.0, "Y")], "plus_one"))
    s.bind(s.get_loops("Y")[1], "threadIdx.x")
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(sl.build(s, "h100").run_cpu(x, bounds_check=True), x + 1)
    assert s.get_loops("Y") == ["Y.i", "Y.j"]  # the schedule keeps its names
