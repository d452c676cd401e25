"""compute_at / reverse_compute_at / compute_inline / reverse_compute_inline: every rejection names the
primitive, argument and value, and leaves the schedule as it was (the placement primitives' goldens and
numerics are in ``test_primitives_placement.py``)."""

from __future__ import annotations

import dataclasses

import pytest

import schedlib as sl
from schedlib.ir.func import Func
from schedlib.ir.simplify import rename_buffer

from .helpers import Reject, assert_same_result, chain_func, schedule
from .test_primitives_placement import _transposing_chain


def _custom(body: str) -> Func:
    A = sl.placeholder((8,), "float32", "A")
    B = sl.compute((8,), lambda i: A[i] * 2.0, "B")
    if body == "mirror":
        C = sl.compute((8,), lambda i: B[i] + B[7 - i], "C")
        return sl.func([A, C])
    if body == "shared":
        C = sl.compute((8,), lambda i: B[i] + 1.0, "C")
        D = sl.compute((8,), lambda i: B[i] * 3.0, "D")
        return sl.func([A, C, D])
    if body == "broadcast":
        C = sl.compute((8, 2), lambda i, j: B[i] + 1.0, "C")
        return sl.func([A, C])
    assert body == "slice"
    C = sl.compute((4,), lambda i: B[i] + 1.0, "C")
    return sl.func([A, C])


def _unread() -> sl.Schedule:
    f = chain_func(8)
    c = f.block("C")
    return sl.Schedule(f.with_block(dataclasses.replace(c, value=rename_buffer(c.value, "B", "A"))))


def _reads_itself() -> sl.Schedule:
    f = chain_func(8)
    b = f.block("B")
    return sl.Schedule(f.with_block(dataclasses.replace(b, value=rename_buffer(b.value, "A", "B"))))


def _mm_relu() -> sl.Schedule:
    return sl.Schedule(sl.workloads.matmul(8, 6, 4, epilogue="relu"))


def _mm_relu_staged() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4, epilogue="relu"), lambda s: s.cache_read("C", "A", "shared"),
                    lambda s: s.compute_at("A_shared", "C.k"))


def _mm_relu_decomposed() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4, epilogue="relu"), lambda s: s.decompose_reduction("C", "C.i"))


def _write_back_under_host() -> sl.Schedule:
    return schedule(sl.workloads.matmul(3, 4, 2, epilogue="bias"), lambda s: s.cache_write("C", "shared"),
                    lambda s: s.reverse_compute_at("C_shared", "C.i"))


def _compacted_stage() -> sl.Schedule:
    return schedule(sl.workloads.elementwise((3, 3), ("add",)), lambda s: s.cache_write("E0", "local"),
                    lambda s: s.compute_at("E0", "E0_local.ax1"), lambda s: s.cache_read("E0", "Y", "local"))


def _gelus_inlined(*stages: int) -> sl.Schedule:
    """An add and ten gelus (each reads its input twice), with ``stages`` inlined in that order."""
    return schedule(sl.workloads.elementwise((4, 8), ("add",) + ("gelu",) * 10),
                    *(lambda s, k=k: s.compute_inline(f"E{k}") for k in stages))


def _transposed_producer() -> sl.Schedule:
    return schedule(_transposing_chain(), lambda s: s.reverse_compute_inline("T"))


def _columns_strided_across_threads() -> sl.Schedule:
    """C = A @ B, 16 columns: thread tx owns columns jo * 8 + tx * 2 + jv (two pairs 8 apart), accumulated in
    registers; the box of one thread's columns, [2 tx, 2 tx + 10), holds other threads' pairs."""
    def tile(s: sl.Schedule) -> None:
        jo, tx, jv = s.split("C.j", [2, 4, 2])
        s.reorder("C.i", tx, "C.k", jo, jv)
        s.bind(tx, "threadIdx.x")
        s.cache_write("C", "local")
    return schedule(sl.workloads.matmul(4, 16, 4), tile)


def _holed_tile_per_block() -> sl.Schedule:
    """``split(i, [2, 2, 3])`` with blockIdx.x on the middle loop: block b writes C[6 i_0 + 3 b + (0..2)], a box
    of 9 with a hole of 3 that the other block fills."""
    A = sl.placeholder((12,), "float32", "A")
    s = sl.Schedule(sl.func([A, sl.compute((12,), lambda i: A[i] * 2.0, "C")], "scale"))
    _, i1, _ = s.split("C.i", [2, 2, 3])
    s.reorder(i1, "C.i_0")
    s.bind(i1, "blockIdx.x")
    s.cache_write("C", "shared")
    return s


def _ew_split_vectorized() -> sl.Schedule:
    return schedule(sl.workloads.elementwise((4, 8), ("scale",)), lambda s: s.cache_read("E0", "X", "local"),
                    lambda s: s.split("E0.i1", [2, 4]), lambda s: s.vectorize("E0.i1_1"))


def _every_other() -> sl.Schedule:
    """``Y2[i] = R[2 * i]`` with R an output too: Y2's loop reads every other element of R."""
    X = sl.placeholder((8, 4), "float32", "X")
    k = sl.reduce_axis(4, "k")
    R = sl.compute((8,), lambda i: sl.sum(X[i, k], axis=k), "R")
    return sl.Schedule(sl.func([X, sl.compute((4,), lambda i: R[2 * i] * 2.0, "Y2"), R], "every_other"))


def _centred_rows(rows: int = 8, cols: int = 64) -> sl.Schedule:
    """Y = X - S[i] with S, a row sum, an output too."""
    X = sl.placeholder((rows, cols), "float32", "X")
    k = sl.reduce_axis(cols, "k")
    S = sl.compute((rows,), lambda i: sl.sum(X[i, k], axis=k), "S")
    return sl.Schedule(sl.func([X, sl.compute((rows, cols), lambda i, j: X[i, j] - S[i], "Y"), S], "centre_rows"))


def _centred_columns() -> sl.Schedule:
    """Y = X - T[j] with T, the column sums, an intermediate in global memory."""
    X = sl.placeholder((8, 64), "float32", "X")
    k = sl.reduce_axis(8, "k")
    T = sl.compute((64,), lambda j: sl.sum(X[k, j], axis=k), "T")
    return sl.Schedule(sl.func([X, sl.compute((8, 64), lambda i, j: X[i, j] - T[j], "Y")], "centre_cols"))


def _row_output_under_column_tiles() -> sl.Schedule:
    """Y's column-tile loop (3 long) sits inside its row loop with the loop over tiles outside: S[i] would be
    computed in each of the three iterations."""
    s = _centred_rows(6, 10)
    outer, inner = s.split("Y.j", [None, 3])
    s.reorder("Y.i", inner, outer)
    return s


def _centred_rows_over_column_blocks() -> sl.Schedule:
    """Y's columns split over CUDA blocks inside its row loop."""
    s = _centred_rows()
    outer, inner = s.split("Y.j", [None, 32])
    s.bind(outer, "blockIdx.x")
    s.bind(inner, "threadIdx.x")
    return s


def _column_sums_under_row_blocks() -> sl.Schedule:
    """Y's rows over CUDA blocks, each of which would reduce every column of T."""
    s = _centred_columns()
    s.bind("Y.i", "blockIdx.x")
    return s


def _pairs_over_blocks() -> sl.Schedule:
    """C[i] = P[i] + P[i + 1] with P (row sums) a global intermediate and C's rows over CUDA blocks: blocks i
    and i + 1 would both reduce P[i + 1]."""
    X = sl.placeholder((9, 16), "float32", "X")
    k = sl.reduce_axis(16, "k")
    P = sl.compute((9,), lambda i: sl.sum(X[i, k], axis=k), "P")
    s = sl.Schedule(sl.func([X, sl.compute((8,), lambda i: P[i] + P[i + 1], "C")], "pairs"))
    s.bind("C.i", "blockIdx.x")
    return s


def test_placements_that_compute_nothing_twice_at_once_are_taken() -> None:
    """A blockIdx loop of one iteration below the placement (one CUDA block along it), and a serial loop over
    a global reduction inside one CUDA block (each row recomputes the column sums, in order): both race-free."""
    s = _centred_rows()
    outer, inner = s.split("Y.j", [None, 64])
    s.bind(outer, "blockIdx.y")
    s.bind(inner, "threadIdx.x")
    s.bind("Y.i", "blockIdx.x")
    s.compute_at("S", "Y.i")
    assert_same_result(s.original, s)
    s = _centred_columns()
    s.bind("Y.j", "threadIdx.x")
    s.compute_at("T", "Y.i")
    assert_same_result(s.original, s)


NEGATIVE = [
    # Regression: accepted, and codegen then dropped the vectorization without a word.
    Reject("compute-at-vectorized-loop", _ew_split_vectorized, lambda s: s.compute_at("X_local", "E0.i1_1"),
           "compute_at", "loop", "E0.i1_1", "is vectorized; attach blocks at a loop outside it"),
    Reject("reverse-compute-at-tile-strided-across-threads", _columns_strided_across_threads,
           lambda s: s.reverse_compute_at("C_local", "C.j_1"), "reverse_compute_at", "loop", "C.j_1",
           "spans the tiles of other threads"),
    # Regression: accepted; every CUDA block then copied its whole box, holes included, over the other block's
    # results (NaN for 3 of 12 outputs on the emulator, a race between blocks on a GPU).
    Reject("reverse-compute-at-holed-box-across-blocks", _holed_tile_per_block,
           lambda s: s.reverse_compute_at("C_shared", "C.i_1"), "reverse_compute_at", "loop", "C.i_1",
           "also spans what other iterations of C.i_1 write side by side"),
    Reject("compute-at-own-loop", _mm_relu_staged, lambda s: s.compute_at("A_shared", "A_shared.ax0"),
           "compute_at", "loop", "A_shared.ax0", "is a loop of block A_shared itself"),
    Reject("compute-at-has-attached", _mm_relu_staged, lambda s: s.compute_at("C", "D.i0"), "compute_at", "block",
           "C", "has blocks attached to its loops (A_shared)"),
    Reject("compute-at-shared-buffer", _mm_relu_decomposed, lambda s: s.compute_at("C_init", "D.i0"),
           "compute_at", "block", "C_init", "C is also written by C"),
    Reject("compute-at-output", _every_other, lambda s: s.compute_at("R", "Y2.i"), "compute_at", "block", "R",
           "writes output R, and the iterations of Y2.i do not read all of it"),
    Reject("compute-at-output-again-per-tile", _row_output_under_column_tiles, lambda s: s.compute_at("S", "Y.j_1"),
           "compute_at", "block", "S", "do not read all of it exactly once between them"),
    # every CUDA block runs what is placed above its own loops: S's row sums would be reduced by each block
    Reject("compute-at-above-a-grid-loop", _centred_rows_over_column_blocks, lambda s: s.compute_at("S", "Y.i"),
           "compute_at", "loop", "Y.i", "Y.j_0 below it is bound to blockIdx.x: every CUDA block would compute S"),
    # each CUDA block of Y.i would reduce every column of T again, re-initialising sums others accumulate
    Reject("compute-at-global-reduction-again", _column_sums_under_row_blocks, lambda s: s.compute_at("T", "Y.i"),
           "compute_at", "loop", "Y.i", "T reduces into global T, and the CUDA blocks of Y.i would compute some"),
    # boxes of neighbouring iterations overlap: two CUDA blocks would reduce P[i + 1] at once
    Reject("compute-at-global-reduction-overlapping", _pairs_over_blocks, lambda s: s.compute_at("P", "C.i"),
           "compute_at", "loop", "C.i", "P reduces into global P, and the CUDA blocks of C.i would compute some"),
    Reject("compute-at-compacted", _mm_relu_staged, lambda s: s.compute_at("A_shared", "C.i"), "compute_at",
           "block", "A_shared", "does not store at its plain spatial axes"),
    Reject("compute-at-unread", _unread, lambda s: s.compute_at("B", "C.i"), "compute_at", "block", "B",
           "nothing reads B"),
    Reject("compute-at-read-outside", lambda: sl.Schedule(sl.workloads.softmax(3, 4)),
           lambda s: s.compute_at("T_exp", "Y.i"), "compute_at", "loop", "Y.i", "also read outside it, by T_sum"),
    # Regression: C_shared reads C_shared[ax0 - C.i, ax1] (compacted under C.i); moving it under D.i0 left
    # C.i unbound.
    Reject("compute-at-leaves-compaction-loop", _write_back_under_host, lambda s: s.compute_at("C_shared", "D.i0"),
           "compute_at", "loop", "D.i0", "indexes a buffer through loop(s) C.i, which would not enclose it"),
    Reject("compute-at-no-loop", _mm_relu, lambda s: s.compute_at("C", "C"), "compute_at", "loop", "C",
           "is a block, not a loop"),
    Reject("reverse-at-not-a-reader", _mm_relu_staged, lambda s: s.reverse_compute_at("D", "A_shared.ax0"),
           "reverse_compute_at", "loop", "A_shared.ax0", "does not read A_shared, which A_shared writes"),
    # Regression: E0 stores E0_local at its own loop variables (compacted under E0_local.ax1); moving it
    # again regenerated those loops over another region while E0_local's reader kept the old shift.
    Reject("reverse-at-compacted", _compacted_stage, lambda s: s.reverse_compute_at("E0", "Y_local.ax1"),
           "reverse_compute_at", "block", "E0", "does not store at its plain spatial axes"),
    # Regression: T_sum moved into T_max's loop, ahead of its init at the root, which then zeroed the sums.
    Reject("reverse-at-separates-init", lambda: schedule(sl.workloads.softmax(3, 4),
                                                         lambda s: s.decompose_reduction("T_sum", "T_sum.i")),
           lambda s: s.reverse_compute_at("T_sum", "T_max.i"), "reverse_compute_at", "block", "T_sum",
           "T_sum is also written by T_sum_init"),
    Reject("reverse-at-two-indices", lambda: sl.Schedule(_custom("mirror")),
           lambda s: s.reverse_compute_at("C", "B.i"), "reverse_compute_at", "block", "C",
           "reads B at several different indices"),
    Reject("reverse-at-not-plain", lambda: sl.Schedule(sl.workloads.softmax(3, 4)),
           lambda s: s.reverse_compute_at("T_sum", "T_exp.i"), "reverse_compute_at", "block", "T_sum",
           "must read T_exp at its plain spatial axes"),
    # Regression: a broadcast read was reported as not reading "at its plain spatial axes".
    Reject("reverse-at-broadcast", lambda: sl.Schedule(sl.workloads.softmax(3, 4)),
           lambda s: s.reverse_compute_at("Y", "T_sum.i"), "reverse_compute_at", "block", "Y",
           "must read T_sum at all of its spatial axes, one per dimension; reads T_sum[i], which does not use j"),
    Reject("reverse-at-reduction-loop", _mm_relu, lambda s: s.reverse_compute_at("D", "C.k"),
           "reverse_compute_at", "loop", "C.k", "C.k at or above it reduces"),
    Reject("reverse-at-own-loop", _mm_relu, lambda s: s.reverse_compute_at("D", "D.i0"), "reverse_compute_at",
           "loop", "D.i0", "is a loop of block D itself"),
    Reject("reverse-at-before-producer", _mm_relu_decomposed, lambda s: s.reverse_compute_at("D", "C_init.i"),
           "reverse_compute_at", "block", "D", "would run before C, which produces C"),
    Reject("inline-reduction", _mm_relu, lambda s: s.compute_inline("C"), "compute_inline", "block", "C",
           "is a reduction (SSR)"),
    Reject("inline-attached", _mm_relu_staged, lambda s: s.compute_inline("A_shared"), "compute_inline", "block",
           "A_shared", "is attached or has blocks attached"),
    Reject("inline-output", _mm_relu, lambda s: s.compute_inline("D"), "compute_inline", "block", "D",
           "writes output D"),
    Reject("inline-init", _mm_relu_decomposed, lambda s: s.compute_inline("C_init"), "compute_inline", "block",
           "C_init", "also written by C"),
    Reject("inline-not-plain-store", _transposed_producer, lambda s: s.compute_inline("B"), "compute_inline",
           "block", "B", "does not store at its plain axes"),
    Reject("inline-reads-itself", _reads_itself, lambda s: s.compute_inline("B"), "compute_inline", "block", "B",
           "reads its own output"),
    Reject("inline-too-large", lambda: _gelus_inlined(9, 8, 7, 6, 5, 4, 3), lambda s: s.compute_inline("E2"),
           "compute_inline", "block", "E2", "would make E10's expression 5624 nodes long, more than 4096"),
    Reject("reverse-inline-too-large", lambda: _gelus_inlined(8, 7, 6, 5, 4, 3, 2),
           lambda s: s.reverse_compute_inline("E10"), "reverse_compute_inline", "block", "E10",
           "would make E9's expression 5624 nodes long, more than 4096"),
    Reject("reverse-inline-no-producer", lambda: sl.Schedule(sl.workloads.elementwise((3,), ("add", "relu"))),
           lambda s: s.reverse_compute_inline("E0"), "reverse_compute_inline", "block", "E0",
           "must read exactly one computed buffer, reads []"),
    Reject("reverse-inline-two-producers", _mm_relu_decomposed, lambda s: s.reverse_compute_inline("D"),
           "reverse_compute_inline", "block", "D", "C has several producers (C_init, C)"),
    Reject("reverse-inline-reduction", _mm_relu, lambda s: s.reverse_compute_inline("D"),
           "reverse_compute_inline", "block", "D", "its producer C is a reduction"),
    Reject("reverse-inline-other-readers", lambda: sl.Schedule(_custom("shared")),
           lambda s: s.reverse_compute_inline("C"), "reverse_compute_inline", "block", "C",
           "B has other readers or is an output"),
    Reject("reverse-inline-broadcast", lambda: sl.Schedule(_custom("broadcast")),
           lambda s: s.reverse_compute_inline("C"), "reverse_compute_inline", "block", "C",
           "must read B at a permutation of its axes"),
    Reject("reverse-inline-slice", lambda: sl.Schedule(_custom("slice")), lambda s: s.reverse_compute_inline("C"),
           "reverse_compute_inline", "block", "C", "axis i spans 4 but reads dim 0 of B, which has 8"),
    Reject("reverse-inline-attached", _mm_relu_staged, lambda s: s.reverse_compute_inline("A_shared"),
           "reverse_compute_inline", "block", "A_shared", "is attached or has blocks attached"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rejections(case: Reject) -> None:
    case.check()
