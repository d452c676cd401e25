"""cache_write's ``consumers`` (readers switched to the cache) and compute_at of a stage that is a func
output (allowed where the loop's iterations read all of it between them)."""

from __future__ import annotations

import pytest

import schedlib as sl

from .helpers import Reject, assert_rejected, assert_same_result, loop_nest
from .test_primitives_loops import golden


def stats(rows: int | sl.Expr = 4, cols: int = 8) -> sl.Func:
    """``R[i] = sum_j X[i, j]`` (an output) and ``Y[i, j] = X[i, j] - R[i]``."""
    X = sl.placeholder((rows, cols), "float32", "X")
    k = sl.reduce_axis(cols, "k")
    R = sl.compute((rows,), lambda i: sl.sum(X[i, k], axis=k), "R")
    Y = sl.compute((rows, cols), lambda i, j: X[i, j] - R[i], "Y")
    return sl.func([X, Y, R], "stats")


def test_cache_write_with_consumers_golden() -> None:
    s = sl.Schedule(stats())
    assert s.cache_write("R", "local", consumers=["Y"]) == "R_local"
    assert loop_nest(s) == golden("""
        alloc R_local: float32[4] local
        for R.i in range(4):
          for R.k in range(8):
            block R SR (i=R.i, k=R.k):
              init R_local[i] = 0.0
              R_local[i] += X[i, k]
        for R_local.ax0 in range(4):
          block R_local S (ax0=R_local.ax0):
            R[ax0] = R_local[ax0]
        for Y.i in range(4):
          for Y.j in range(8):
            block Y SS (i=Y.i, j=Y.j):
              Y[i, j] = X[i, j] - R_local[i]
        """)
    assert_same_result(s.original, s)


def test_consumers_survive_a_trace_round_trip() -> None:
    s = sl.Schedule(stats())
    s.cache_write("R", "local", consumers=("Y",))
    again = sl.Schedule.from_trace(s.original, s.trace.to_json())
    assert str(again.func) == str(s.func)
    plain = sl.Schedule(stats())
    plain.cache_write("R", "local")
    assert "consumers" not in plain.trace.to_json()  # a trace without them keeps its old form


@pytest.mark.parametrize("case", [
    Reject("not-a-reader", lambda: sl.Schedule(sl.workloads.softmax(3, 7)),
           lambda s: s.cache_write("T_max", "local", consumers=["T_sum"]), "cache_write", "consumers", ["T_sum"],
           "block T_sum does not read T_max"),
    Reject("itself", lambda: sl.Schedule(sl.workloads.reduce(4, 8)),
           lambda s: s.cache_write("R", "local", consumers=["R"]), "cache_write", "consumers", ["R"],
           "block R does not read R"),
    Reject("a-string", lambda: sl.Schedule(stats()), lambda s: s.cache_write("R", "local", consumers="Y"),
           "cache_write", "consumers", "Y", "must be a list of block names"),
    Reject("unknown", lambda: sl.Schedule(stats()), lambda s: s.cache_write("R", "local", consumers=["Q"]),
           "cache_write", "consumers", "Q", "no such block"),
], ids=lambda c: c.id)
def test_cache_write_consumer_rejections(case: Reject) -> None:
    case.check()


def test_an_output_stage_moves_into_the_loop_that_reads_each_row() -> None:
    s = sl.Schedule(stats())
    s.compute_at("R", "Y.i")
    assert "for Y.i in range(4):\n    for R.i in range(1):" in str(s.func)
    assert "block R SR (i=Y.i + R.i, k=R.k)" in str(s.func)
    assert_same_result(s.original, s)




def test_one_loop_tiling_two_dimensions_walks_a_diagonal_and_is_refused() -> None:
    """``B[i] = A[i, i] + 1`` reads one element of each row of the output A: A would be written on its
    diagonal only."""
    X = sl.placeholder((4, 4), "float32", "X")
    A = sl.compute((4, 4), lambda i, j: X[i, j] * 2.0, "A")
    s = sl.Schedule(sl.func([X, A, sl.compute((4,), lambda i: A[i, i] + 1.0, "B")], "diagonal"))
    assert_rejected(s, lambda: s.compute_at("A", "B.i"), "compute_at", "block", "A",
                    "writes output A, and the iterations of B.i do not read all of it")


def test_a_symbolic_row_count_is_walked_whole() -> None:
    f = stats(sl.var("M"), 8)
    s = sl.Schedule(f)
    s.compute_at("R", "Y.i")
    assert_same_result(f, s, symbols={"M": 5})
