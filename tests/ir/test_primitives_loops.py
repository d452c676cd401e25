"""split, fuse, reorder: loop-nest goldens, numeric equivalence, every rejection, regressions."""

from __future__ import annotations

import textwrap

import pytest

import schedlib as sl

from .helpers import Reject, assert_same_result, chain_func, loop_nest, schedule, vector_func


def golden(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


# split ------------------------------------------------------------------------------------------

def test_split_inferred_factor_adds_guard() -> None:
    s = sl.Schedule(vector_func(40))
    assert s.split("C.i", [None, 16]) == ["C.i_0", "C.i_1"]
    assert loop_nest(s) == golden("""
          for C.i_0 in range(3):
            for C.i_1 in range(16):
              block C S (i=C.i_0 * 16 + C.i_1) where C.i_0 * 16 + C.i_1 < 40:
                C[i] = A[i] * 2.0
        """)
    assert_same_result(s.original, s)


def test_split_exact_factors_need_no_guard() -> None:
    s = sl.Schedule(vector_func(40))
    assert s.split("C.i", [5, 2, 4]) == ["C.i_0", "C.i_1", "C.i_2"]
    assert loop_nest(s) == golden("""
          for C.i_0 in range(5):
            for C.i_1 in range(2):
              for C.i_2 in range(4):
                block C S (i=C.i_0 * 8 + C.i_1 * 4 + C.i_2):
                  C[i] = A[i] * 2.0
        """)
    assert_same_result(s.original, s)


def test_split_symbolic_extent() -> None:
    n = sl.var("n")
    s = sl.Schedule(vector_func(n))
    s.split("C.i", [None, 4])
    assert loop_nest(s) == golden("""
          for C.i_0 in range((n + 3) // 4):
            for C.i_1 in range(4):
              block C S (i=C.i_0 * 4 + C.i_1) where C.i_0 * 4 + C.i_1 < n:
                C[i] = A[i] * 2.0
        """)
    for value in (1, 3, 7, 33):
        assert_same_result(s.original, s, seed=value, symbols={"n": value})


def test_split_keeps_unroll_on_the_innermost_loop() -> None:
    s = schedule(vector_func(12), lambda s: s.unroll("C.i"))
    outer, inner = s.split("C.i", [3, 4])
    loops = {lp.name: lp for lp in s.func.block("C").loops}
    assert loops[inner].unrolled and not loops[outer].unrolled


def test_split_moves_attached_blocks_to_the_innermost_loop() -> None:
    s = schedule(sl.workloads.matmul(8, 4, 6), lambda s: s.cache_read("C", "A", "shared"),
                 lambda s: s.compute_at("A_shared", "C.i"))
    s.split("C.i", [2, 4])
    attach = s.func.block("A_shared").attach
    assert (attach.block, attach.loop, attach.position) == ("C", "C.i_1", "before")
    assert_same_result(s.original, s)


def test_split_overshoot_guards_attached_blocks_too() -> None:
    # Regression: the guard went on the owner only, so A_shared (attached under C.i) read A[33..39].
    s = schedule(sl.workloads.matmul(33, 3, 7), lambda s: s.cache_read("C", "A", "shared"),
                 lambda s: s.compute_at("A_shared", "C.i"))
    s.split("C.i", [None, 8])
    assert "C.i_0 * 8 + C.i_1 < 33" in str(s.func.block("A_shared").predicate)
    assert_same_result(s.original, s)


def test_split_overshoot_guards_reverse_attached_consumer() -> None:
    s = schedule(sl.workloads.matmul(7, 5, 3, epilogue="relu"), lambda s: s.reverse_compute_at("D", "C.i"))
    s.split("C.i", [4, 4])
    assert_same_result(s.original, s)


@pytest.mark.parametrize("factors", [[None, 4], [4, None], [3, None, 2], [2, 2, None], [8, 8], [1, None]])
@pytest.mark.parametrize("size", [1, 3, 7, 33])
def test_split_matches_reference(size: int, factors: list[int | None]) -> None:
    s = sl.Schedule(sl.workloads.matmul(size, 3, size, epilogue="bias"))
    for loop in s.get_loops("C"):
        s.split(loop, factors)
    assert_same_result(s.original, s, seed=size)


def test_split_int_workload_is_bit_identical() -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 5, 9, dtype="int8"))
    i, _j, k = s.get_loops("C")
    s.split(k, [None, 2])
    s.split(i, [2, None])
    assert_same_result(s.original, s, seed=3)


# fuse -------------------------------------------------------------------------------------------

def test_fuse_golden() -> None:
    s = sl.Schedule(sl.workloads.elementwise((4, 8), ("scale",)))
    assert s.fuse("E0.i0", "E0.i1") == "E0.i0_i1_fused"
    assert loop_nest(s) == golden("""
          for E0.i0_i1_fused in range(32):
            block E0 SS (i0=E0.i0_i1_fused // 8, i1=E0.i0_i1_fused % 8):
              E0[i0, i1] = X[i0, i1] * 0.5
        """)
    assert_same_result(s.original, s)


def test_fuse_then_split_simplifies_back() -> None:
    s = sl.Schedule(sl.workloads.elementwise((4, 8), ("scale",)))
    fused = s.fuse("E0.i0", "E0.i1")
    s.split(fused, [None, 8])
    assert loop_nest(s) == golden("""
          for E0.i0_i1_fused_0 in range(4):
            for E0.i0_i1_fused_1 in range(8):
              block E0 SS (i0=E0.i0_i1_fused_0, i1=E0.i0_i1_fused_1):
                E0[i0, i1] = X[i0, i1] * 0.5
        """)


@pytest.mark.parametrize("sizes", [(3, 7, 5), (1, 33, 3), (7, 1, 1)])
def test_fuse_matches_reference(sizes: tuple[int, int, int]) -> None:
    s = sl.Schedule(sl.workloads.elementwise(sizes, ("add", "gelu")))
    s.fuse(*s.get_loops("E0"))
    s.fuse(*s.get_loops("E1")[1:])
    assert_same_result(s.original, s)


def test_fuse_symbolic_and_reduction_loops() -> None:
    m = sl.var("m")
    s = sl.Schedule(sl.workloads.matmul(m, 5, 3, dtype="int8"))
    s.fuse("C.j", "C.k")
    s.fuse("C.i", "C.j_k_fused")
    for value in (1, 3, 7):
        assert_same_result(s.original, s, seed=value, symbols={"m": value})


def test_fuse_moves_blocks_attached_at_the_last_loop() -> None:
    s = schedule(sl.workloads.matmul(6, 4, 5), lambda s: s.cache_read("C", "B", "shared"),
                 lambda s: s.compute_at("B_shared", "C.j"))
    fused = s.fuse("C.i", "C.j")
    assert s.func.block("B_shared").attach.loop == fused
    assert_same_result(s.original, s)


# reorder ----------------------------------------------------------------------------------------

def test_reorder_golden() -> None:
    s = sl.Schedule(sl.workloads.elementwise((4, 8), ("scale",)))
    assert s.reorder("E0.i1", "E0.i0") is None
    assert loop_nest(s) == golden("""
          for E0.i1 in range(8):
            for E0.i0 in range(4):
              block E0 SS (i0=E0.i0, i1=E0.i1):
                E0[i0, i1] = X[i0, i1] * 0.5
        """)
    assert_same_result(s.original, s)


def test_reorder_fills_the_listed_loops_slots_only() -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 3, 5))
    i, j, k = s.get_loops("C")
    s.reorder(k, i)  # j keeps its slot
    assert s.get_loops("C") == [k, j, i]
    assert_same_result(s.original, s)


def test_reorder_tiles_of_a_reduction_int() -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 9, 33, dtype="int8"))
    i, j, k = s.get_loops("C")
    io, ii = s.split(i, [None, 2])
    jo, ji = s.split(j, [None, 4])
    ko, ki = s.split(k, [None, 8])
    s.reorder(ko, io, jo, ki, ii, ji)
    assert_same_result(s.original, s, seed=11)


def test_reorder_inside_an_attachment_is_allowed() -> None:
    s = schedule(sl.workloads.matmul(6, 4, 8), lambda s: s.split("C.k", [None, 4]),
                 lambda s: s.reorder("C.k_0", "C.i"), lambda s: s.cache_read("C", "A", "shared"),
                 lambda s: s.compute_at("A_shared", "C.k_0"))
    assert s.get_loops("C") == ["C.k_0", "C.j", "C.i", "C.k_1"]
    s.reorder("C.k_1", "C.j")  # below the attachment at C.k_0
    s.reorder("C.i", "C.k_1")
    assert_same_result(s.original, s)


def test_reorder_rejects_non_string_loop_names() -> None:
    # Regression: a list among the names hit set() and raised TypeError instead of ScheduleError.
    s = sl.Schedule(sl.workloads.matmul(4, 3, 3))
    with pytest.raises(sl.ScheduleError) as info:
        s.reorder(["C.i"], "C.j")
    assert (info.value.primitive, info.value.argument, info.value.value) == ("reorder", "loops", ["C.i"])
    assert len(s.trace) == 0


# every rejection --------------------------------------------------------------------------------

def _mm() -> sl.Schedule:
    return sl.Schedule(sl.workloads.matmul(8, 6, 4))


def _mm_bound() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.bind("C.i", "blockIdx.x"))


def _ew_vectorized() -> sl.Schedule:
    return schedule(sl.workloads.elementwise((4, 8), ("scale",)), lambda s: s.vectorize("E0.i1"))


def _mm_attached_at_j() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.cache_read("C", "B", "shared"),
                    lambda s: s.compute_at("B_shared", "C.j"))


def _sym() -> sl.Schedule:
    return sl.Schedule(vector_func(sl.var("n")))


NEGATIVE = [
    Reject("split-loop-not-str", _mm, lambda s: s.split(3, [None, 2]), "split", "loop", 3, "must be a loop name"),
    Reject("split-loop-is-block", _mm, lambda s: s.split("C", [None, 2]), "split", "loop", "C", "is a block"),
    Reject("split-no-such-loop", _mm, lambda s: s.split("C.x", [None, 2]), "split", "loop", "C.x", "no such loop"),
    Reject("split-one-factor", _mm, lambda s: s.split("C.i", [8]), "split", "factors", [8], "at least two"),
    Reject("split-factors-not-list", _mm, lambda s: s.split("C.i", "24"), "split", "factors", "24",
           "at least two"),
    Reject("split-two-nones", _mm, lambda s: s.split("C.i", [None, None]), "split", "factors", [None, None],
           "at most one factor may be None"),
    Reject("split-zero-factor", _mm, lambda s: s.split("C.i", [None, 0]), "split", "factors", [None, 0],
           "factor 0 must be a positive integer"),
    Reject("split-bool-factor", _mm, lambda s: s.split("C.i", [True, None]), "split", "factors", [True, None],
           "factor True must be a positive integer"),
    Reject("split-bound", _mm_bound, lambda s: s.split("C.i", [None, 2]), "split", "loop", "C.i",
           "is bound to blockIdx.x"),
    Reject("split-vectorized", _ew_vectorized, lambda s: s.split("E0.i1", [None, 2]), "split", "loop", "E0.i1",
           "is vectorized"),
    # Regression: split dropped a loop's hints (which piece would keep pipeline_stages is ambiguous).
    Reject("split-annotated", lambda: schedule(sl.workloads.matmul(8, 6, 4),
                                               lambda s: s.annotate("C.k", "pipeline_stages", 2)),
           lambda s: s.split("C.k", [2, 2]), "split", "loop", "C.k", "is annotated (pipeline_stages); split before"),
    Reject("split-symbolic-no-none", _sym, lambda s: s.split("C.i", [4, 4]), "split", "factors", [4, 4],
           "cannot cover the symbolic extent n"),
    Reject("split-too-small", _mm, lambda s: s.split("C.i", [2, 3]), "split", "factors", [2, 3],
           "product 6 is smaller than the extent 8"),
    # Regressions: factors past the 32-bit range were accepted, then overflowed in the executor and kernel.
    Reject("split-huge-factor", _mm, lambda s: s.split("C.i", [10**30, None]), "split", "factors",
           [10**30, None], f"factor {10**30} exceeds 2^31-1"),
    Reject("split-huge-product", _mm, lambda s: s.split("C.j", [None, 2**16, 2**16]), "split", "factors",
           [None, 2**16, 2**16], "product 4294967296 exceeds 2^31-1"),
    Reject("split-huge-cover", lambda: sl.Schedule(vector_func(2**31 - 1)),
           lambda s: s.split("C.i", [None, 2**30 + 1]), "split", "factors", [None, 2**30 + 1],
           "the loops cover 2147483650 iterations, more than 2^31-1"),
    Reject("fuse-one-loop", _mm, lambda s: s.fuse("C.i"), "fuse", "loops", ["C.i"], "at least two"),
    Reject("fuse-unknown-loop", _mm, lambda s: s.fuse("C.i", "C.q"), "fuse", "loops", "C.q", "no such loop"),
    Reject("fuse-two-blocks", _mm_attached_at_j, lambda s: s.fuse("C.i", "B_shared.ax0"), "fuse", "loops",
           ["C.i", "B_shared.ax0"], "different blocks"),
    Reject("fuse-not-adjacent", _mm, lambda s: s.fuse("C.i", "C.k"), "fuse", "loops", ["C.i", "C.k"],
           "adjacent and listed outermost first"),
    Reject("fuse-wrong-order", _mm, lambda s: s.fuse("C.j", "C.i"), "fuse", "loops", ["C.j", "C.i"],
           "adjacent and listed outermost first"),
    Reject("fuse-bound", _mm_bound, lambda s: s.fuse("C.i", "C.j"), "fuse", "loops", "C.i", "bound, vectorized"),
    # Regressions: fuse dropped an unroll or a hint of the loops it fused, and let a fused index pass 32 bits.
    Reject("fuse-unrolled", lambda: schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.unroll("C.j")),
           lambda s: s.fuse("C.i", "C.j"), "fuse", "loops", "C.j", "unrolled or annotated; fuse before annotating"),
    Reject("fuse-annotated", lambda: schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.annotate("C.i", "raster", 2)),
           lambda s: s.fuse("C.i", "C.j"), "fuse", "loops", "C.i", "unrolled or annotated"),
    Reject("fuse-huge", lambda: sl.Schedule(sl.workloads.matmul(70000, 70000, 4)), lambda s: s.fuse("C.i", "C.j"),
           "fuse", "loops", ["C.i", "C.j"], "would run 4900000000 iterations, more than 2^31-1"),
    Reject("fuse-attached-inner", _mm_attached_at_j, lambda s: s.fuse("C.j", "C.k"), "fuse", "loops", "C.j",
           "has blocks attached"),
    Reject("reorder-one-loop", _mm, lambda s: s.reorder("C.i"), "reorder", "loops", ["C.i"], "at least two"),
    Reject("reorder-twice", _mm, lambda s: s.reorder("C.i", "C.i"), "reorder", "loops", ["C.i", "C.i"],
           "listed twice"),
    Reject("reorder-two-blocks", _mm_attached_at_j, lambda s: s.reorder("C.k", "B_shared.ax0"), "reorder",
           "loops", ["C.k", "B_shared.ax0"], "different blocks"),
    Reject("reorder-across-attachment", _mm_attached_at_j, lambda s: s.reorder("C.k", "C.i"), "reorder",
           "loops", ["C.k", "C.i"], "across C.j, where blocks are attached"),
    # Regression: reorder moved a vectorized loop outwards; codegen then silently unrolled it.
    Reject("reorder-vectorized-out", _ew_vectorized, lambda s: s.reorder("E0.i1", "E0.i0"), "reorder", "loops",
           ["E0.i1", "E0.i0"], "would move vectorized loop E0.i1 out of the innermost place"),
    Reject("reorder-not-str", _mm, lambda s: s.reorder("C.i", None), "reorder", "loops", None,
           "must be a loop name"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rejections(case: Reject) -> None:
    case.check()


def test_reorder_above_an_attachment_keeps_the_loops_above_it() -> None:
    s = schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.split("C.i", [2, 4]),
                 lambda s: s.cache_read("C", "B", "shared"), lambda s: s.compute_at("B_shared", "C.j"))
    s.reorder("C.i_1", "C.i_0")  # permutes loops above C.j only: the attached block sees the same ones
    assert s.get_loops("C") == ["C.i_1", "C.i_0", "C.j", "C.k"]
    assert_same_result(s.original, s)


def test_chain_func_fuse_split_reorder_combination() -> None:
    s = sl.Schedule(chain_func(7))
    (b,) = s.get_loops("B")
    bo, bi = s.split(b, [None, 3])
    s.reorder(bi, bo)
    s.fuse(bi, bo)
    assert_same_result(s.original, s)
