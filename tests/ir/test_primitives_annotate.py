"""bind, vectorize, unroll, annotate, storage_align: goldens, unchanged results, every rejection."""

from __future__ import annotations

import pytest

import schedlib as sl
from schedlib.ir.primitives.common import check_positive_int

from .helpers import Reject, assert_same_result, loop_nest, schedule, vector_func
from .test_primitives_loops import golden


def _ew() -> sl.Schedule:
    return sl.Schedule(sl.workloads.elementwise((4, 8), ("scale",)))


def test_bind_and_vectorize_golden() -> None:
    s = _ew()
    s.split("E0.i1", [None, 4])
    assert s.bind("E0.i0", "blockIdx.x") is None
    s.bind("E0.i1_0", "threadIdx.x")
    assert s.vectorize("E0.i1_1") is None
    assert loop_nest(s) == golden("""
        for E0.i0 in range(4):  # blockIdx.x
          for E0.i1_0 in range(2):  # threadIdx.x
            for E0.i1_1 in range(4):  # vectorize
              block E0 SS (i0=E0.i0, i1=E0.i1_0 * 4 + E0.i1_1):
                E0[i0, i1] = X[i0, i1] * 0.5
        """)
    assert_same_result(s.original, s)


def test_vectorize_a_reduce_loop_golden() -> None:
    """A reduce loop vectorizes (its reads widen, the fold keeps its order): the nest and result are unchanged."""
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    s.split("R.r", [None, 4])
    assert s.vectorize("R.r_1") is None
    assert loop_nest(s) == golden("""
        for R.i in range(4):
          for R.r_0 in range(2):
            for R.r_1 in range(4):  # vectorize
              block R SR (i=R.i, r=R.r_0 * 4 + R.r_1):
                init R[i] = 0.0
                R[i] += X[i, r]
        """)
    assert_same_result(s.original, s)


def test_unroll_and_annotate_golden() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    assert s.unroll("R.r") is None
    assert s.annotate("R.i", "pipeline_stages", 2) is None
    s.annotate("R", "note", "x")
    assert loop_nest(s) == golden("""
        for R.i in range(4):  # pipeline_stages=2
          for R.r in range(8):  # unroll
            block R SR (i=R.i, r=R.r):  # note='x'
              init R[i] = 0.0
              R[i] += X[i, r]
        """)
    assert_same_result(s.original, s)


def test_annotate_replaces_a_key_and_keeps_others() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    s.annotate("R.i", "a", 1)
    s.annotate("R.i", "b", True)
    s.annotate("R.i", "a", 2.5)
    assert s.func.block("R").loops[0].annotations == (("b", True), ("a", 2.5))


def test_bind_reduction_loop_to_threads_is_a_cross_thread_reduction() -> None:
    s = sl.Schedule(sl.workloads.reduce(3, 33, "max"))
    s.split("R.r", [None, 8])
    s.bind("R.r_1", "threadIdx.x")
    s.bind("R.i", "blockIdx.x")
    assert [lp.thread for lp in s.func.block("R").loops] == ["blockIdx.x", None, "threadIdx.x"]
    assert_same_result(s.original, s)


def test_storage_align_golden() -> None:
    s = sl.Schedule(sl.workloads.matmul(8, 8, 8))
    s.split("C.k", [None, 4])
    s.cache_read("C", "A", "shared")
    s.compute_at("A_shared", "C.k_0")
    assert s.storage_align("A_shared", 0, 32, 1) is None
    assert loop_nest(s).splitlines()[0] == "alloc A_shared: float32[1, 4] shared align=[(0, 32, 1)]"
    s.storage_align("A_shared", 0, 16, 2)  # a second call on the same dim replaces the first
    assert s.func.buffer("A_shared").align == ((0, 16, 2),)
    assert_same_result(s.original, s)


def test_annotations_keep_int_results_bit_identical() -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 9, 5, dtype="int8", epilogue="relu"))
    i, j, k = s.get_loops("C")
    jo, ji = s.split(j, [None, 4])
    s.bind(i, "blockIdx.x")
    s.bind(jo, "threadIdx.x")
    s.unroll(k)
    s.annotate(ji, "pipeline_stages", 3)
    s.vectorize(s.get_loops("D")[-1])
    assert_same_result(s.original, s, seed=5)


def test_check_positive_int_upper_bound() -> None:
    assert check_positive_int("p", "a", 4, upper=4) == 4
    with pytest.raises(sl.ScheduleError) as info:
        check_positive_int("p", "a", 5, upper=4)
    assert (info.value.primitive, info.value.argument, info.value.value) == ("p", "a", 5)
    assert "must be at most 4" in str(info.value)


def test_annotate_rejects_non_finite_floats() -> None:
    # Regression: NaN was accepted, and the trace then replayed to a func that is not == (nan != nan).
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(sl.ScheduleError, match="must be finite"):
            s.annotate("R", "x", bad)
    assert len(s.trace) == 0


# every rejection --------------------------------------------------------------------------------

def _mm() -> sl.Schedule:
    return sl.Schedule(sl.workloads.matmul(8, 6, 4))


def _mm_bound() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.bind("C.i", "blockIdx.x"))


def _ew_vectorized() -> sl.Schedule:
    return schedule(sl.workloads.elementwise((4, 8), ("scale",)), lambda s: s.vectorize("E0.i1"))


def _ew_thread_inner() -> sl.Schedule:
    return schedule(sl.workloads.elementwise((4, 8), ("scale",)), lambda s: s.bind("E0.i1", "threadIdx.x"))


def _ew_attached_inner() -> sl.Schedule:
    return schedule(sl.workloads.elementwise((4, 8), ("scale",)), lambda s: s.cache_read("E0", "X", "shared"),
                    lambda s: s.compute_at("X_shared", "E0.i1"))


def _ew_unrolled() -> sl.Schedule:
    return schedule(sl.workloads.elementwise((4, 8), ("scale",)), lambda s: s.unroll("E0.i1"))


def _mm_staged() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.cache_read("C", "A", "shared"),
                    lambda s: s.compute_at("A_shared", "C.k"))


def _cached_vector() -> sl.Schedule:
    return schedule(vector_func(8), lambda s: s.cache_read("C", "A", "shared"))


def _cached() -> sl.Schedule:
    return schedule(sl.workloads.matmul(8, 8, 8), lambda s: s.cache_read("C", "A", "shared"))


def _ew_inside_thread_loop() -> sl.Schedule:
    return schedule(sl.workloads.elementwise((4, 8), ("scale",)), lambda s: s.bind("E0.i0", "threadIdx.x"),
                    lambda s: s.cache_read("E0", "X", "local"), lambda s: s.compute_at("X_local", "E0.i0"))


def _mm_fused_jk() -> sl.Schedule:
    """A 4x4x4 matmul with its j and k loops fused into one."""
    s = sl.Schedule(sl.workloads.matmul(4, 4, 4))
    s.fuse("C.j", "C.k")
    return s


def _mm_threads_x() -> sl.Schedule:
    """A 64x64 matmul with C.i on threadIdx.x."""
    s = sl.Schedule(sl.workloads.matmul(64, 64, 8))
    s.bind("C.i", "threadIdx.x")
    return s


NAN = float("nan")

NEGATIVE = [
    Reject("bind-bad-tag", _mm, lambda s: s.bind("C.i", "warp.x"), "bind", "thread", "warp.x", "must be one of"),
    Reject("bind-twice", _mm_bound, lambda s: s.bind("C.i", "blockIdx.y"), "bind", "loop", "C.i",
           "already bound to blockIdx.x"),
    Reject("bind-vectorized", _ew_vectorized, lambda s: s.bind("E0.i1", "threadIdx.x"), "bind", "loop", "E0.i1",
           "is vectorized"),
    Reject("bind-reduction-to-blocks", _mm, lambda s: s.bind("C.k", "blockIdx.x"), "bind", "thread",
           "blockIdx.x", "reduction loop"),
    Reject("bind-symbolic-threads", lambda: sl.Schedule(vector_func(sl.var("n"))),
           lambda s: s.bind("C.i", "threadIdx.x"), "bind", "loop", "C.i", "symbolic extent n"),
    Reject("bind-too-many-threads", lambda: sl.Schedule(vector_func(2048)), lambda s: s.bind("C.i", "threadIdx.x"),
           "bind", "loop", "C.i", "exceeds the 1024 threads CUDA allows along threadIdx.x"),
    Reject("bind-too-many-threads-z", lambda: sl.Schedule(vector_func(128)), lambda s: s.bind("C.i", "threadIdx.z"),
           "bind", "loop", "C.i", "exceeds the 64 threads CUDA allows along threadIdx.z"),
    Reject("bind-thread-block-too-big", _mm_threads_x, lambda s: s.bind("C.j", "threadIdx.y"), "bind", "loop",
           "C.j", "thread block would be threadIdx.x 64 x threadIdx.y 64 = 4096 threads, more than 1024"),
    Reject("bind-fused-spatial-and-reduce", _mm_fused_jk, lambda s: s.bind("C.j_k_fused", "threadIdx.x"), "bind",
           "loop", "C.j_k_fused", "drives spatial and reduce axes at once (a fused S x R loop)"),
    Reject("bind-tag-taken", _mm_bound, lambda s: s.bind("C.j", "blockIdx.x"), "bind", "thread", "blockIdx.x",
           "already binds C.i to it"),
    # Regression: accepted, then refused by the build (one thread index cannot stand for two loops).
    Reject("bind-tag-of-enclosing-loop", _ew_inside_thread_loop, lambda s: s.bind("X_local.ax0", "threadIdx.x"),
           "bind", "thread", "threadIdx.x", "runs inside E0.i0, which is bound to threadIdx.x, and its axes depend"),
    Reject("bind-no-loop", _mm, lambda s: s.bind("C.z", "blockIdx.x"), "bind", "loop", "C.z", "no such loop"),
    # Regression: unroll and unroll_limit refused a bound loop, but bind took an unrolled one (and dropped it)
    Reject("bind-unrolled", lambda: schedule(sl.workloads.matmul(8, 6, 4), lambda s: s.unroll("C.i")),
           lambda s: s.bind("C.i", "threadIdx.x"), "bind", "loop", "C.i", "is unrolled"),
    Reject("bind-unroll-limit", lambda: schedule(sl.workloads.matmul(8, 6, 4),
                                                 lambda s: s.annotate("C.i", "unroll_limit", 2)),
           lambda s: s.bind("C.i", "threadIdx.x"), "bind", "loop", "C.i", "has an unroll_limit"),
    Reject("vectorize-unroll-limit", lambda: schedule(sl.workloads.elementwise((4, 8), ("scale",)),
                                                      lambda s: s.annotate("E0.i1", "unroll_limit", 2)),
           lambda s: s.vectorize("E0.i1"), "vectorize", "loop", "E0.i1", "has an unroll_limit"),
    Reject("vectorize-not-innermost", _mm, lambda s: s.vectorize("C.j"), "vectorize", "loop", "C.j",
           "not the innermost"),
    Reject("vectorize-too-long", lambda: sl.Schedule(vector_func(40)), lambda s: s.vectorize("C.i"), "vectorize",
           "loop", "C.i", "extent 40 must be a constant of at most 16"),
    Reject("vectorize-symbolic", lambda: sl.Schedule(vector_func(sl.var("n"))), lambda s: s.vectorize("C.i"),
           "vectorize", "loop", "C.i", "extent n must be a constant"),
    Reject("vectorize-bound", _ew_thread_inner, lambda s: s.vectorize("E0.i1"), "vectorize", "loop", "E0.i1",
           "bound to threadIdx.x"),
    Reject("vectorize-attached", _ew_attached_inner, lambda s: s.vectorize("E0.i1"), "vectorize", "loop",
           "E0.i1", "has blocks attached"),
    Reject("unroll-vectorized", _ew_vectorized, lambda s: s.unroll("E0.i1"), "unroll", "loop", "E0.i1",
           "is vectorized"),
    Reject("unroll-bound", _mm_bound, lambda s: s.unroll("C.i"), "unroll", "loop", "C.i", "bound to blockIdx.x"),
    # Regressions: vectorize took an unrolled loop (unroll refuses a vectorized one), unroll took a loop it
    # cannot fully unroll, and bind took blockIdx in an attached block, which only the build then refused.
    Reject("vectorize-unrolled", _ew_unrolled, lambda s: s.vectorize("E0.i1"), "vectorize", "loop", "E0.i1",
           "is unrolled"),
    Reject("unroll-symbolic", lambda: sl.Schedule(vector_func(sl.var("n"))), lambda s: s.unroll("C.i"), "unroll",
           "loop", "C.i", "has symbolic extent n; only a loop of constant extent can be fully unrolled"),
    Reject("bind-blocks-in-attached", _mm_staged, lambda s: s.bind("A_shared.ax0", "blockIdx.y"), "bind", "loop",
           "A_shared.ax0", "only the outermost block of a kernel (C) may bind blockIdx"),
    Reject("annotate-value-type", _mm, lambda s: s.annotate("C", "k", [1]), "annotate", "value", [1],
           "JSON scalar"),
    Reject("annotate-value-none", _mm, lambda s: s.annotate("C.i", "k", None), "annotate", "value", None,
           "JSON scalar"),
    Reject("annotate-value-nan", _mm, lambda s: s.annotate("C", "k", NAN), "annotate", "value", NAN,
           "must be finite"),
    Reject("annotate-key", _mm, lambda s: s.annotate("C", "1bad", 1), "annotate", "key", "1bad", "identifier"),
    Reject("annotate-stages-negative", _mm, lambda s: s.annotate("C.k", "pipeline_stages", -5), "annotate",
           "value", -5, "pipeline_stages must be an integer in 1..16"),
    Reject("annotate-raster-float", _mm, lambda s: s.annotate("C.i", "raster", 1.5), "annotate", "value", 1.5,
           "raster must be an integer in 1..16"),
    Reject("annotate-tensor-core-name", _mm, lambda s: s.annotate("C", "tensor_core", "mma"), "annotate",
           "value", "mma", "tensor_core must be one of ['m16n8k16', 'wgmma']"),
    Reject("annotate-key-typo", _mm, lambda s: s.annotate("C.k", "pipline_stages", 2), "annotate", "key",
           "pipline_stages", "is one typo away from 'pipeline_stages', which the code generator reads"),
    Reject("annotate-unroll-limit-zero", _mm, lambda s: s.annotate("C.k", "unroll_limit", 0), "annotate", "value",
           0, "unroll_limit must be an integer in 1..1024"),
    Reject("annotate-unroll-limit-block", _mm, lambda s: s.annotate("C", "unroll_limit", 4), "annotate", "target",
           "C", "applies to a loop, not a block"),
    Reject("annotate-unroll-limit-bound", _mm_bound, lambda s: s.annotate(s.get_loops("C")[0], "unroll_limit", 4),
           "annotate", "target", "C.i", "it has no loop to unroll"),
    Reject("annotate-key-double-buffer", _mm, lambda s: s.annotate("C", "double_buffer", True), "annotate", "key",
           "double_buffer", "is set by the double_buffer primitive"),
    Reject("annotate-target-type", _mm, lambda s: s.annotate(5, "k", 1), "annotate", "target", 5,
           "must be a loop name"),
    Reject("annotate-no-target", _mm, lambda s: s.annotate("Q", "k", 1), "annotate", "target", "Q",
           "no such loop"),
    Reject("storage-align-global", _mm, lambda s: s.storage_align("C", 0, 32, 1), "storage_align", "block", "C",
           "writes global buffer C"),
    Reject("storage-align-dim", _cached, lambda s: s.storage_align("A_shared", 1, 32, 1), "storage_align", "dim",
           1, "non-last dimension of A_shared (0..0)"),
    Reject("storage-align-huge-factor", _cached, lambda s: s.storage_align("A_shared", 0, 2**40, 1),
           "storage_align", "factor", 2**40, "must be at most 2147483647"),
    Reject("storage-align-one-dim", _cached_vector, lambda s: s.storage_align("A_shared", 0, 32, 1),
           "storage_align", "dim", 0, "A_shared has 1 dimension(s), so no non-last dimension to pad"),
    Reject("storage-align-factor", _cached, lambda s: s.storage_align("A_shared", 0, 0, 0), "storage_align",
           "factor", 0, "positive integer"),
    Reject("storage-align-offset", _cached, lambda s: s.storage_align("A_shared", 0, 32, 32), "storage_align",
           "offset", 32, "[0, factor=32)"),
    Reject("storage-align-block-type", _cached, lambda s: s.storage_align(None, 0, 32, 1), "storage_align",
           "block", None, "must be a block name"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rejections(case: Reject) -> None:
    case.check()


@pytest.mark.parametrize("key", ["master", "roster", "leader", "loaded", "product", "pipeline_steps",
                                 "tensor_cost", "double_buffered", "note"])
def test_note_keys_near_but_not_one_typo_from_a_generator_key_are_kept(key: str) -> None:
    """Only one slip from a generator key of 8+ letters is refused; other keys are notes, shown in the nest."""
    s = _mm()
    s.annotate("C", key, 1)
    assert f"# {key}=1" in str(s)


@pytest.mark.parametrize("key", ["tensor_coer", "tensorcore", "pipeline_stage", "producr", "pipelinestages"])
def test_one_typo_from_a_generator_key_is_refused(key: str) -> None:
    with pytest.raises(sl.ScheduleError, match=f"annotate: argument key='{key}': is one typo away from '"):
        _mm().annotate("C", key, 1)


def test_the_generator_values_annotate_checks_are_the_code_generators() -> None:
    from schedlib.codegen.mma_pattern import INSTRUCTIONS
    from schedlib.codegen.tma import LOADER
    from schedlib.codegen.warp_specialized import PRODUCER
    from schedlib.ir.primitives.annotate import GENERATOR_NAMES

    assert GENERATOR_NAMES == {"tensor_core": INSTRUCTIONS, "loader": (LOADER,), "producer": (PRODUCER,)}


def test_an_array_for_a_name_is_a_schedule_error() -> None:
    """Regression: a numpy array as ``thread`` or ``scope`` raised numpy's ambiguous-truth ValueError."""
    import numpy as np

    tags = np.array(["threadIdx.x", "threadIdx.y"])
    for call, argument in ((lambda s: s.bind("C.i", tags), "thread"),
                           (lambda s: s.cache_read("C", "A", tags), "scope"),
                           (lambda s: s.cache_write("C", tags), "scope")):
        s = _mm()
        before = str(s)
        with pytest.raises(sl.ScheduleError) as err:
            call(s)
        assert err.value.argument == argument and str(s) == before
