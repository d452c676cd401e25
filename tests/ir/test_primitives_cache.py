"""cache_read, cache_write: goldens, numeric equivalence in every scope, every rejection."""

from __future__ import annotations

import dataclasses

import pytest

import schedlib as sl

from .helpers import Reject, assert_same_result, loop_nest, schedule, vector_func
from .test_primitives_loops import golden


def test_cache_read_golden() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    assert s.cache_read("R", "X", "shared") == "X_shared"
    assert loop_nest(s) == golden("""
        alloc X_shared: float32[4, 8] shared
        for X_shared.ax0 in range(4):
          for X_shared.ax1 in range(8):
            block X_shared SS (ax0=X_shared.ax0, ax1=X_shared.ax1):
              X_shared[ax0, ax1] = X[ax0, ax1]
        for R.i in range(4):
          for R.r in range(8):
            block R SR (i=R.i, r=R.r):
              init R[i] = 0.0
              R[i] += X_shared[i, r]
        """)
    assert_same_result(s.original, s)


def test_cache_write_golden() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    assert s.cache_write("R", "local") == "R_local"
    assert loop_nest(s) == golden("""
        alloc R_local: float32[4] local
        for R.i in range(4):
          for R.r in range(8):
            block R SR (i=R.i, r=R.r):
              init R_local[i] = 0.0
              R_local[i] += X[i, r]
        for R_local.ax0 in range(4):
          block R_local S (ax0=R_local.ax0):
            R[ax0] = R_local[ax0]
        """)
    assert_same_result(s.original, s)


def test_cache_read_by_index_and_chained() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    assert s.cache_read("R", 0, "local") == "X_local"
    assert s.cache_read("R", "X_local", "shared") == "X_local_shared"
    assert s.blocks == ["X_local", "X_local_shared", "R"]
    assert s.func.buffer("X_local_shared").scope == "shared"
    assert_same_result(s.original, s)


def test_cache_read_leaves_other_readers_alone() -> None:
    s = sl.Schedule(sl.workloads.softmax(3, 7))
    s.cache_read("T_exp", "X", "shared")
    assert s.func.block("T_max").read_buffers == ["X"]
    assert s.func.block("T_exp").read_buffers == ["X_shared", "T_max"]
    assert_same_result(s.original, s)


def test_cache_read_shared_by_several_readers() -> None:
    s = sl.Schedule(sl.workloads.softmax(3, 7))
    assert s.cache_read("T_exp", "X", "shared", consumers=["T_max"]) == "X_shared"
    assert s.blocks == ["X_shared", "T_max", "T_exp", "T_sum", "Y"]  # before the first reader
    assert s.func.block("T_max").read_buffers == ["X_shared"]
    assert s.func.block("T_exp").read_buffers == ["X_shared", "T_max"]
    assert s.trace.steps[-1]["args"]["consumers"] == ["T_max"]
    again = sl.Schedule.from_trace(s.original, s.trace.to_json())
    assert str(again) == str(s)
    assert_same_result(s.original, s)


def test_cache_read_without_consumers_keeps_its_trace_form() -> None:
    s = sl.Schedule(sl.workloads.softmax(3, 7))
    s.cache_read("T_max", "X", "local")
    assert "consumers" not in s.trace.steps[-1]["args"]


@pytest.mark.parametrize("scope", ["global", "shared", "local"])
@pytest.mark.parametrize("workload", [
    lambda: sl.workloads.matmul(7, 3, 33, epilogue="bias_relu"),
    lambda: sl.workloads.matmul(3, 7, 5, dtype="int8", trans_a=True, trans_b=True, batch=2),
    lambda: sl.workloads.gemv(7, 33, dtype="float16", trans=True),
    lambda: sl.workloads.layernorm(3, 7),
    lambda: sl.workloads.reduce(sl.var("rows"), 7, "sumsq", axis=0),
], ids=["matmul-bias-relu", "matmul-int8-batch-trans", "gemv-t", "layernorm", "reduce-sym"])
def test_cache_everything_matches_reference(workload, scope: str) -> None:
    f = workload()
    s = sl.Schedule(f)
    for blk in list(s.blocks):
        for buf in s.func.block(blk).read_buffers:
            s.cache_read(blk, buf, scope)
    for blk in [b for b in s.blocks if s.func.block(b).reducer is not None]:
        s.cache_write(blk, scope)
    for value in (1, 3):
        assert_same_result(f, s, seed=value, symbols={"rows": value} if f.symbols else None)


def test_cache_write_of_a_spatial_output_stage() -> None:
    s = sl.Schedule(sl.workloads.elementwise((3, 7), ("add", "relu")))
    name = s.cache_write("E1", "local")
    assert s.func.block(name).store == "E1" and s.func.block("E1").store == name
    assert_same_result(s.original, s)


def test_cache_write_after_rfactor_and_split() -> None:
    s = sl.Schedule(sl.workloads.reduce(5, 33, "min"))
    _, r = s.get_loops("R")
    s.split(r, [None, 4])
    s.rfactor("R.r_1")
    s.cache_write("R", "local")
    s.cache_write("R_rf", "shared")
    assert_same_result(s.original, s)


# every rejection --------------------------------------------------------------------------------

def _red() -> sl.Schedule:
    return sl.Schedule(sl.workloads.reduce(4, 8))


def _writes_input() -> sl.Schedule:
    f = vector_func(8)
    bad = dataclasses.replace(f.block("C"), store="A")
    return sl.Schedule(dataclasses.replace(f, blocks=(bad,), _index={}))


def _decomposed() -> sl.Schedule:
    return schedule(sl.workloads.reduce(4, 8), lambda s: s.decompose_reduction("R", "R.r"))


def _gram() -> sl.Schedule:
    """``G = X @ X.T``: one buffer read at two indices."""
    X = sl.placeholder((6, 5), "float32", "X")
    k = sl.reduce_axis(5, "k")
    return sl.Schedule(sl.func([X, sl.compute((6, 6), lambda i, j: sl.sum(X[i, k] * X[j, k], axis=k), "G")]))


def _staged() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 8, 8), lambda s: s.cache_read("C", "A", "shared"),
                    lambda s: s.compute_at("A_shared", "C.k"))


NEGATIVE = [
    Reject("cache-read-block-type", _red, lambda s: s.cache_read(0, "X", "shared"), "cache_read", "block", 0,
           "must be a block name"),
    Reject("cache-read-no-block", _red, lambda s: s.cache_read("Q", "X", "shared"), "cache_read", "block", "Q",
           "no such block; blocks are: R"),
    Reject("cache-read-scope", _red, lambda s: s.cache_read("R", "X", "texture"), "cache_read", "scope",
           "texture", "must be one of global, shared, local"),
    Reject("cache-read-index", _red, lambda s: s.cache_read("R", 1, "shared"), "cache_read", "buffer", 1,
           "reads 1 buffers (X)"),
    Reject("cache-read-negative-index", _red, lambda s: s.cache_read("R", -1, "shared"), "cache_read", "buffer",
           -1, "reads 1 buffers"),
    Reject("cache-read-of-an-attached-copy", _staged, lambda s: s.cache_read("C", "A_shared", "local"), "cache_read",
           "buffer", "A_shared", "attached inside C's loops, so a copy of it would run first; make the copies "
           "before attaching"),
    Reject("cache-read-occurrence-range", _gram, lambda s: s.cache_read("G", "X", "shared", occurrence=2),
           "cache_read", "occurrence", 2, "block G has 2 load(s) of X: 0..1"),
    Reject("cache-read-occurrence-with-consumers", lambda: sl.Schedule(sl.workloads.softmax(3, 7)),
           lambda s: s.cache_read("T_max", "X", "shared", consumers=["T_exp"], occurrence=0), "cache_read",
           "occurrence", 0, "cannot be combined with consumers"),
    Reject("cache-read-not-read", _red, lambda s: s.cache_read("R", "R", "shared"), "cache_read", "buffer", "R",
           "does not read it; it reads X"),
    Reject("cache-read-consumers-type", lambda: sl.Schedule(sl.workloads.softmax(3, 7)),
           lambda s: s.cache_read("T_max", "X", "shared", consumers="T_exp"), "cache_read", "consumers", "T_exp",
           "must be a list of block names"),
    Reject("cache-read-consumer-unknown", lambda: sl.Schedule(sl.workloads.softmax(3, 7)),
           lambda s: s.cache_read("T_max", "X", "shared", consumers=["Q"]), "cache_read", "consumers", "Q",
           "no such block"),
    Reject("cache-read-consumer-not-reader", lambda: sl.Schedule(sl.workloads.softmax(3, 7)),
           lambda s: s.cache_read("T_max", "X", "shared", consumers=["T_sum"]), "cache_read", "consumers",
           ["T_sum"], "block T_sum does not read X"),
    Reject("cache-write-scope", _red, lambda s: s.cache_write("R", "register"), "cache_write", "scope",
           "register", "must be one of"),
    Reject("cache-write-no-block", _red, lambda s: s.cache_write("X", "local"), "cache_write", "block", "X",
           "no such block"),
    Reject("cache-write-two-producers", _decomposed, lambda s: s.cache_write("R", "local"), "cache_write", "block",
           "R", "buffer R has several producers"),
    Reject("cache-write-attached", _staged, lambda s: s.cache_write("A_shared", "local"), "cache_write", "block",
           "A_shared", "is attached or has blocks attached"),
    Reject("cache-write-has-attached", _staged, lambda s: s.cache_write("C", "local"), "cache_write", "block",
           "C", "is attached or has blocks attached"),
    Reject("cache-write-input", _writes_input, lambda s: s.cache_write("C", "local"), "cache_write", "block", "C",
           "writes input buffer A"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rejections(case: Reject) -> None:
    case.check()


def test_the_order_the_attached_copy_error_advises_works() -> None:
    s = sl.Schedule(sl.workloads.matmul(8, 8, 8))
    shared = s.cache_read("C", "A", "shared")
    local = s.cache_read("C", shared, "local")
    s.compute_at(local, "C.k")
    s.compute_at(shared, "C.j")
    assert_same_result(s.original, s)


def test_one_load_of_a_buffer_read_twice_goes_through_the_copy() -> None:
    s = _gram()
    first = s.cache_read("G", "X", "shared", occurrence=1)
    assert "G[i, j] += X[i, k] * X_shared[j, k]" in str(s)
    second = s.cache_read("G", "X", "shared")  # the load left is the other one
    assert "G[i, j] += X_shared_1[i, k] * X_shared[j, k]" in str(s)
    s.compute_at(first, "G.j")
    s.compute_at(second, "G.i")
    assert_same_result(s.original, s)
    assert str(sl.Schedule.from_trace(s.original, s.trace.to_json())) == str(s)
    assert '"occurrence": 1' in s.trace.to_json() and s.trace.to_json().count("occurrence") == 1
