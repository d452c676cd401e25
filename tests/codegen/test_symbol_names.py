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
