"""compute_with: a block moved beside another it shares no data with, under one of that block's loops (a
horizontal fusion).  Goldens and numerics, then every rejection (naming the primitive, argument and value,
the schedule left as it was)."""

from __future__ import annotations

import pytest

import schedlib as sl
from schedlib.ir.func import Func

from .helpers import Reject, assert_same_result, loop_nest, moments_func, schedule
from .test_primitives_loops import golden


def scaled_with_sum(rows: int = 6, cols: int = 10) -> Func:
    """``Y = A * 2`` over (rows, cols) and, beside it, each row's sum: a statistic with Y's leading dim."""
    A = sl.placeholder((rows, cols), "float32", "A")
    k = sl.reduce_axis(cols, "k")
    S = sl.compute((rows,), lambda i: sl.sum(A[i, k], axis=k), "S")
    Y = sl.compute((rows, cols), lambda i, j: A[i, j] * 2.0, "Y")
    return sl.func([A, S, Y], "scaled_with_sum")


# goldens and numerics ---------------------------------------------------------------------------

def test_a_row_statistic_runs_in_the_row_loop_of_a_wider_block() -> None:
    s = sl.Schedule(scaled_with_sum())
    s.split("Y.j", [None, 4])
    assert s.compute_with("S", "Y.i") is None
    assert loop_nest(s) == golden("""
        for Y.i in range(6):
          for S.i in range(1):
            for S.k in range(10):
              block S SR (i=Y.i + S.i, k=S.k):
                init S[i] = 0.0
                S[i] += A[i, k]
          for Y.j_0 in range(3):
            for Y.j_1 in range(4):
              block Y SS (i=Y.i, j=Y.j_0 * 4 + Y.j_1) where Y.j_0 * 4 + Y.j_1 < 10:
                Y[i, j] = A[i, j] * 2.0
        """)
    assert_same_result(s.original, s)


def test_tiles_of_rows_under_a_split_row_loop_and_symbolic_rows() -> None:
    """Rows in tiles of 3 over 8 (the last tile overhangs), and a symbolic row count: the statistic follows
    the tile, guarded where the tile overhangs."""
    s = sl.Schedule(moments_func(8))
    io, _ = s.split("Q.i", [None, 3])
    s.bind(io, "blockIdx.x")
    s.compute_with("S", io)
    assert "where Q.i_0 * 3 + S.i < 8" in loop_nest(s)
    assert_same_result(s.original, s)
    s = sl.Schedule(moments_func(sl.var("M"), 5))
    s.compute_with("S", "Q.i")
    assert_same_result(s.original, s, symbols={"M": 4})


def test_a_symbolic_row_length_split_over_threads() -> None:
    """Columns of a symbolic N split in 32s reach ceil(N / 32) * 32 per row: still the whole row, so the row
    loop takes the statistic (it was refused as covering part of the row)."""
    s = sl.Schedule(scaled_with_sum(4, sl.var("N")))
    _, inner = s.split("Y.j", [None, 32])
    s.bind("Y.i", "blockIdx.x")
    s.bind(inner, "threadIdx.x")
    s.compute_with("S", "Y.i")
    for cols in (1, 45):
        assert_same_result(s.original, s, symbols={"N": cols})


def test_a_loop_of_one_iteration_does_not_move_the_index() -> None:
    """Columns split as [1, 64]: the outer loop runs once, so placing the row sum at it computes it once."""
    s = sl.Schedule(scaled_with_sum(4, 64))
    outer, _ = s.split("Y.j", [1, None])
    s.compute_with("S", outer)
    assert_same_result(s.original, s)


def test_the_trace_replays() -> None:
    s = sl.Schedule(moments_func())
    s.compute_with("S", "Q.i")
    replay = sl.Schedule.from_trace(moments_func(), s.trace.to_json())
    assert replay.func == s.func
    assert str(s.trace) == "compute_with(block='S', loop='Q.i')"


# rejections -------------------------------------------------------------------------------------

def _reader_between() -> Func:
    """S, then T = S + 1 (an output), then Q: moving S into Q's loop would run it after T, which reads it."""
    A = sl.placeholder((4, 6), "float32", "A")
    k1, k2 = sl.reduce_axis(6, "k"), sl.reduce_axis(6, "k")
    S = sl.compute((4,), lambda i: sl.sum(A[i, k1], axis=k1), "S")
    T = sl.compute((4,), lambda i: S[i] + 1.0, "T")
    Q = sl.compute((4,), lambda i: sl.max(A[i, k2], axis=k2), "Q")
    return sl.func([A, T, Q], "reader_between")


def _pair(shape_b: tuple[int, ...] = (8,)) -> Func:
    """``B = A * 2`` and ``D = A + 1``: two blocks that share only their input."""
    A = sl.placeholder((8,), "float32", "A")
    B = sl.compute((8,), lambda i: A[i] * 2.0, "B")
    D = sl.compute(shape_b, lambda *ix: A[ix[0]] + 1.0, "D")
    return sl.func([A, B, D], "pair")


def _chained() -> Func:
    """``B = A * 2; C = B + 1`` with both outputs: C reads B."""
    A = sl.placeholder((8,), "float32", "A")
    B = sl.compute((8,), lambda i: A[i] * 2.0, "B")
    return sl.func([A, B, sl.compute((8,), lambda i: B[i] + 1.0, "C")], "chained")


def _compacted_host() -> sl.Schedule:
    """B writes a register tile compacted under its copy's loop; D is independent of both."""
    return schedule(_pair(), lambda s: s.cache_write("B", "local"), lambda s: s.split("B.i", [None, 4]),
                    lambda s: s.reverse_compute_at("B_local", "B.i_0"))


def _host_on_a_slice() -> sl.Schedule:
    """B (8 long) is computed at C's loop, which reads only B[0:4]; D (8 long) is independent of both."""
    A = sl.placeholder((8,), "float32", "A")
    B = sl.compute((8,), lambda i: A[i] * 2.0, "B")
    C = sl.compute((4,), lambda i: B[i] + 1.0, "C")
    D = sl.compute((8,), lambda i: A[i] + 3.0, "D")
    return schedule(sl.func([A, C, D], "host_on_a_slice"), lambda s: s.compute_at("B", "C.i"))


def _fused_and_split_host() -> sl.Schedule:
    """Y's (i, j) fused and split in fours over blocks: an iteration covers four elements, not whole rows."""
    def fuse_and_split(s: sl.Schedule) -> None:
        outer, inner = s.split(s.fuse("Y.i", "Y.j"), [None, 4])
        s.bind(outer, "blockIdx.x")
        s.bind(inner, "threadIdx.x")
    return schedule(scaled_with_sum(), fuse_and_split)


def _column_tiles_outside() -> sl.Schedule:
    """Y's columns split in threes with the tile loop (3 long) inside the row loop and the other outside."""
    def reorder(s: sl.Schedule) -> None:
        outer, inner = s.split("Y.j", [None, 3])
        s.reorder("Y.i", inner, outer)
    return schedule(scaled_with_sum(), reorder)


def _recomputed_host() -> sl.Schedule:
    """B is computed again in every iteration of C.i (which reads all of it); D shares nothing with either."""
    A = sl.placeholder((8, 16), "float32", "A")
    B = sl.compute((16,), lambda j: A[0, j] * 2.0, "B")
    D = sl.compute((16,), lambda j: A[1, j] + 1.0, "D")
    k = sl.reduce_axis(16, "k")
    C = sl.compute((8,), lambda i: sl.sum(A[i, k] * B[k], axis=k), "C")
    return schedule(sl.func([A, D, C], "recomputed_host"), lambda s: s.compute_at("B", "C.i"))


def _columns_over_blocks() -> sl.Schedule:
    """Y's columns split over CUDA blocks inside its row loop."""
    def split_over_blocks(s: sl.Schedule) -> None:
        outer, inner = s.split("Y.j", [None, 4])
        s.bind(outer, "blockIdx.x")
        s.bind(inner, "threadIdx.x")
    return schedule(scaled_with_sum(), split_over_blocks)


NEGATIVE = [
    Reject("compute-with-reads-host", lambda: sl.Schedule(_chained()), lambda s: s.compute_with("C", "B.i"),
           "compute_with", "block", "C", "reads B, which B writes; use reverse_compute_at"),
    Reject("compute-with-host-reads-it", lambda: sl.Schedule(_chained()), lambda s: s.compute_with("B", "C.i"),
           "compute_with", "block", "B", "writes B, which C reads; use compute_at"),
    Reject("compute-with-compacted-host", _compacted_host, lambda s: s.compute_with("D", "B.i_0"),
           "compute_with", "loop", "B.i_0", "B does not store at its plain spatial axes"),
    Reject("compute-with-other-shape", lambda: sl.Schedule(_pair((8, 3))), lambda s: s.compute_with("D", "B.i"),
           "compute_with", "block", "D", "D has shape [8, 3], which is neither B's shape [8] nor its leading"),
    Reject("compute-with-under-a-reduction", lambda: sl.Schedule(moments_func()), lambda s: s.compute_with("S", "Q.k"),
           "compute_with", "loop", "Q.k", "Q.k at or above it reduces; S would run again on every step"),
    Reject("compute-with-part-of-a-row", lambda: schedule(scaled_with_sum(), lambda s: s.split("Y.j", [None, 4])),
           lambda s: s.compute_with("S", "Y.j_0"), "compute_with", "loop", "Y.j_0",
           "each cover part of dimension 1 of Y (its index moves with Y.j_0), which S lacks"),
    Reject("compute-with-host-covers-a-slice", _host_on_a_slice, lambda s: s.compute_with("D", "B.i"),
           "compute_with", "loop", "B.i", "do not cover D exactly once between them"),
    # a loop at or above the host loop that tiles none of the block's dimensions would compute it again in
    # each of its iterations (concurrently where bound to blocks or threads: a race on its global buffer)
    Reject("compute-with-fused-host-loop", _fused_and_split_host, lambda s: s.compute_with("S", "Y.i_j_fused_0"),
           "compute_with", "loop", "Y.i_j_fused_0", "dimension 1 of Y (its index moves with Y.i_j_fused_0)"),
    Reject("compute-with-loop-tiling-none-of-it", _column_tiles_outside, lambda s: s.compute_with("S", "Y.j_1"),
           "compute_with", "loop", "Y.j_1", "dimension 1 of Y (its index moves with Y.j_1)"),
    Reject("compute-with-host-run-again", _recomputed_host, lambda s: s.compute_with("D", "B.j"),
           "compute_with", "loop", "B.j", "do not cover D exactly once between them"),
    Reject("compute-with-above-a-grid-loop", _columns_over_blocks, lambda s: s.compute_with("S", "Y.i"),
           "compute_with", "loop", "Y.i", "Y.j_0 below it is bound to blockIdx.x: every CUDA block would compute S"),
    Reject("compute-with-reader-would-run-first", lambda: sl.Schedule(_reader_between()),
           lambda s: s.compute_with("S", "Q.i"), "compute_with", "block", "S",
           "block T would run before S, which produces S"),
    Reject("compute-with-own-loop", lambda: sl.Schedule(moments_func()), lambda s: s.compute_with("S", "S.i"),
           "compute_with", "loop", "S.i", "is a loop of block S itself"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rejections(case: Reject) -> None:
    case.check()
