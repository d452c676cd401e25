"""rfactor and decompose_reduction: goldens, numerics, every rejection, regressions."""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl

from .helpers import Reject, assert_same_result, loop_nest, schedule
from .test_primitives_loops import golden


def test_rfactor_golden() -> None:
    s = sl.Schedule(sl.workloads.reduce(8, 16))
    s.split("R.r", [None, 4])
    assert s.rfactor("R.r_1") == "R_rf"
    assert loop_nest(s) == golden("""
        alloc R_rf: float32[4, 8] global
        for R.i in range(8):
          for R.r_0 in range(4):
            for R.r_1 in range(4):
              block R_rf SSR (i=R.i, v_r_1=R.r_1, v_r_0=R.r_0):
                init R_rf[v_r_1, i] = 0.0
                R_rf[v_r_1, i] += X[i, v_r_0 * 4 + v_r_1]
        for R.i_1 in range(8):
          for R.v_r_1 in range(4):
            block R SR (i=R.i_1, v_r_1=R.v_r_1):
              init R[i] = 0.0
              R[i] += R_rf[v_r_1, i]
        """)
    assert_same_result(s.original, s)


def test_rfactor_under_a_guard_golden() -> None:
    # Regression: with r = r_0 * 4 + r_1 < 10 the partial R_rf[i, 3] had no unmasked step, so it was never
    # initialised and the final sum read garbage (NaN).  Masked steps now add the identity instead.
    s = sl.Schedule(sl.workloads.reduce(3, 10))
    s.split("R.r", [4, 4])
    assert s.rfactor("R.r_0", 1) == "R_rf"
    assert loop_nest(s) == golden("""
        alloc R_rf: float32[3, 4] global
        for R.i in range(3):
          for R.r_0 in range(4):
            for R.r_1 in range(4):
              block R_rf SSR (i=R.i, v_r_0=R.r_0, v_r_1=R.r_1):
                init R_rf[i, v_r_0] = 0.0
                R_rf[i, v_r_0] += select(v_r_0 * 4 + v_r_1 < 10, X[i, v_r_0 * 4 + v_r_1], 0.0)
        for R.i_1 in range(3):
          for R.v_r_0 in range(4):
            block R SR (i=R.i_1, v_r_0=R.v_r_0):
              init R[i] = 0.0
              R[i] += R_rf[i, v_r_0]
        """)
    assert_same_result(s.original, s)


@pytest.mark.parametrize("op", ["sum", "max", "min", "sumsq", "mean"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("factors,which", [([4, 4], 0), ([2, 16], 1), ([None, 3], 0), ([None, 3], 1)])
def test_rfactor_with_masked_partials(op: str, dtype: str, factors: list[int | None], which: int) -> None:
    s = sl.Schedule(sl.workloads.reduce(3, 10, op, dtype=dtype))
    parts = s.split("R.r", factors)
    s.rfactor(parts[which])
    assert_same_result(s.original, s, seed=which)


@pytest.mark.parametrize("axis", [0, -1])
def test_rfactor_then_bind_threads(axis: int) -> None:
    s = sl.Schedule(sl.workloads.reduce(7, 33, "max", axis=axis))
    i, r = s.get_loops("R")
    _ro, ri = s.split(r, [None, 8])
    rf = s.rfactor(ri, 1)
    s.bind(ri, "threadIdx.x")
    s.bind(i, "blockIdx.x")
    _final_i, final_v = s.get_loops("R")
    s.bind(final_v, "threadIdx.x")
    assert rf == "R_rf"
    assert_same_result(s.original, s)


@pytest.mark.parametrize("trans", [False, True])
def test_gemv_split_k_with_rfactor(trans: bool) -> None:
    s = sl.Schedule(sl.workloads.gemv(7, 33, trans=trans, batch=3, epilogue="bias_relu"))
    _b, _n, k = s.get_loops("C")
    ko, _ki = s.split(k, [None, 4])
    s.rfactor(ko, 2)
    s.decompose_reduction("C_rf", ko)
    assert_same_result(s.original, s)


def test_rfactor_final_block_gets_fresh_loop_names() -> None:
    # Regression: the final block reused the rf block's loop names (T_max.i twice), so a later fuse of
    # "T_max.i" rewrote the wrong block and left a loop variable unbound.
    s = sl.Schedule(sl.workloads.softmax(3, 5))
    s.rfactor("T_max.k")
    names = [lp.name for b in s.func.blocks for lp in b.loops]
    assert len(names) == len(set(names))
    assert s.get_loops("T_max") == ["T_max.i_1", "T_max.v_k"]
    s.fuse("T_max.i", "T_max.k")
    assert_same_result(s.original, s)


def test_rfactor_symbolic_extent_int() -> None:
    k = sl.var("k_size")
    s = sl.Schedule(sl.workloads.matmul(3, 5, k, dtype="int8"))
    _ko, ki = s.split("C.k", [None, 2])
    s.rfactor(ki)
    for value in (1, 3, 7):
        assert_same_result(s.original, s, seed=value, symbols={"k_size": value})


def test_decompose_reduction_golden() -> None:
    s = sl.Schedule(sl.workloads.reduce(8, 16))
    assert s.decompose_reduction("R", "R.r") == "R_init"
    assert loop_nest(s) == golden("""
        for R.i in range(8):
          block R_init S (i=R.i):
            R[i] = 0.0
          for R.r in range(16):
            block R SR (i=R.i, r=R.r):
              R[i] += X[i, r]
        """)
    assert_same_result(s.original, s)


def test_decompose_reduction_copies_spatial_loops_below() -> None:
    s = sl.Schedule(sl.workloads.matmul(4, 4, 4))
    s.split("C.j", [None, 2])
    s.decompose_reduction("C", "C.j_1")
    assert loop_nest(s) == golden("""
        for C.i in range(4):
          for C.j_0 in range(2):
            for C_init.j_1 in range(2):
              block C_init SS (i=C.i, j=C.j_0 * 2 + C_init.j_1):
                C[i, j] = 0.0
            for C.j_1 in range(2):
              for C.k in range(4):
                block C SSR (i=C.i, j=C.j_0 * 2 + C.j_1, k=C.k):
                  C[i, j] += A[i, k] * B[k, j]
        """)
    assert_same_result(s.original, s)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_decompose_reduction_at_every_level(level: int) -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 3, 33, dtype="int8", epilogue="residual"))
    i, j, _k = s.get_loops("C")
    io, ii = s.split(i, [None, 4])
    s.reorder(io, j, ii)
    s.decompose_reduction("C", s.get_loops("C")[level])
    assert_same_result(s.original, s, seed=level)


def test_decompose_reduction_of_an_attached_reduction() -> None:
    s = sl.Schedule(sl.workloads.matmul(5, 7, 3, epilogue="gelu"))
    s.compute_at("C", "D.i0")
    s.decompose_reduction("C", s.get_loops("C")[0])
    assert s.func.block("C_init").attach == s.func.block("C").attach
    assert_same_result(s.original, s)


def test_decompose_at_an_outer_reduction_loop_copies_the_spatial_loops_inside() -> None:
    s = sl.Schedule(sl.workloads.reduce(3, 5))
    s.reorder("R.r", "R.i")
    s.decompose_reduction("R", "R.r")
    init = s.func.block("R_init")
    assert [lp.name for lp in init.loops] == ["R_init.i"] and init.attach is None
    assert_same_result(s.original, s)


# every rejection --------------------------------------------------------------------------------

def _mm() -> sl.Schedule:
    return sl.Schedule(sl.workloads.matmul(8, 6, 4, epilogue="relu"))


def _mm_ksplit() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.split("C.k", [None, 2]))


def _mm_mixed() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.fuse("C.j", "C.k"))


def _mm_decomposed() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.decompose_reduction("C", "C.k"))


def _mm_staged() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.cache_read("C", "A", "shared"),
                    lambda s: s.compute_at("A_shared", "C.j"))


def _mm_rfactored() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.split("C.k", [None, 2]),
                    lambda s: s.rfactor("C.k_1"))


def _batch_tile_per_b() -> sl.Schedule:
    return schedule(sl.workloads.matmul(3, 2, 2, batch=2), lambda s: s.cache_write("C", "shared"),
                    lambda s: s.reverse_compute_at("C_shared", "C.b"))


def test_decompose_inside_a_compacted_tile() -> None:
    s = _batch_tile_per_b()
    s.decompose_reduction("C", "C.i")
    assert s.func.block("C_init").attach.loop == "C.b"
    assert_same_result(s.original, s)


NEGATIVE = [
    Reject("rfactor-spatial-block", _mm, lambda s: s.rfactor("D.i0"), "rfactor", "loop", "D.i0",
           "block D is not an undecomposed reduction"),
    Reject("rfactor-decomposed", _mm_decomposed, lambda s: s.rfactor("C.k"), "rfactor", "loop", "C.k",
           "block C is not an undecomposed reduction"),
    Reject("rfactor-spatial-loop", _mm, lambda s: s.rfactor("C.i"), "rfactor", "loop", "C.i",
           "does not drive a reduction axis of C"),
    Reject("rfactor-attached", _mm_staged, lambda s: s.rfactor("C.k"), "rfactor", "loop", "C.k",
           "block C is attached or has blocks attached"),
    Reject("rfactor-axis-range", _mm, lambda s: s.rfactor("C.k", 3), "rfactor", "factor_axis", 3,
           "must be in [0, 2]"),
    Reject("rfactor-axis-bool", _mm, lambda s: s.rfactor("C.k", True), "rfactor", "factor_axis", True,
           "must be in [0, 2]"),
    Reject("rfactor-mixed-loop", _mm_mixed, lambda s: s.rfactor("C.j_k_fused"), "rfactor", "loop", "C.j_k_fused",
           "also drive spatial axis j"),
    Reject("rfactor-axis-name-taken", _mm_rfactored, lambda s: s.rfactor("C.k_0"), "rfactor", "loop", "C.k_0",
           "axis name v_k_0 already exists in C_rf"),
    Reject("rfactor-no-loop", _mm, lambda s: s.rfactor("C.q"), "rfactor", "loop", "C.q", "no such loop"),
    Reject("decompose-foreign-loop", _mm, lambda s: s.decompose_reduction("C", "D.i0"), "decompose_reduction",
           "loop", "D.i0", "belongs to block D, not C"),
    Reject("decompose-spatial-block", _mm, lambda s: s.decompose_reduction("D", "D.i0"), "decompose_reduction",
           "block", "D", "is not a reduction with an initialisation"),
    Reject("decompose-twice", _mm_decomposed, lambda s: s.decompose_reduction("C", "C.i"), "decompose_reduction",
           "block", "C", "is not a reduction with an initialisation"),
    Reject("decompose-inside-reduction", _mm_ksplit, lambda s: s.decompose_reduction("C", "C.k_1"),
           "decompose_reduction", "loop", "C.k_1", "is inside reduction loop C.k_0"),
    # Regression: the init block kept j = C.j_k_fused // 4 with no such loop around it (ExecutionError).
    Reject("decompose-mixed-loop", _mm_mixed, lambda s: s.decompose_reduction("C", "C.i"), "decompose_reduction",
           "loop", "C.i", "loop C.j_k_fused below it drives spatial and reduction axes"),
    # Regression: C_shared was compacted per C.b iteration; an init hoisted out of C.b zeroed one tile once,
    # and batch 1 accumulated onto batch 0's result.
    Reject("decompose-out-of-compaction", _batch_tile_per_b, lambda s: s.decompose_reduction("C", "C.b"),
           "decompose_reduction", "loop", "C.b", "C_shared is stored per iteration of C.b (compacted)"),
    Reject("decompose-no-block", _mm, lambda s: s.decompose_reduction("Q", "C.i"), "decompose_reduction", "block",
           "Q", "no such block"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rejections(case: Reject) -> None:
    case.check()


@pytest.mark.parametrize("factor_axis", [0, 1, 2])
def test_an_rfactor_block_moves_whatever_its_factor_axis(factor_axis: int) -> None:
    """The rfactor block stores its buffer with the new axis at ``factor_axis`` (``C_rf[v, i, j]`` for 0):
    compute_at maps each stored dimension to its axis, so every position moves, and a local copy of it
    is compacted along the right dimensions."""
    func = sl.workloads.matmul(12, 10, 32)
    rng = np.random.default_rng(factor_axis)
    inputs = {"A": rng.standard_normal((12, 32)).astype(np.float32),
              "B": rng.standard_normal((32, 10)).astype(np.float32)}
    want = sl.run_reference(func, inputs)["C"]
    s = sl.Schedule(func)
    k = s.get_loops("C")[-1]
    ki = s.split(k, [None, 8])[1]
    rf = s.rfactor(ki, factor_axis)
    local = s.cache_write(rf, "local")  # rf now writes C_rf_local (stored permuted), the copy C_rf
    s.compute_at(local, s.get_loops("C")[0])  # each row's partials right before the row is summed
    s.compute_at(rf, s.get_loops(local)[0])
    assert s.func.buffer(local).shape != s.func.buffer(rf).shape, str(s)  # compacted
    np.testing.assert_allclose(sl.run_reference(s, inputs)["C"], want, rtol=1e-5, atol=1e-5)
