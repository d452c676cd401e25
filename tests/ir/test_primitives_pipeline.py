"""double_buffer: the hint, the kernel it makes (numbers on the emulator, one barrier per iteration, the
prefetch in registers), and every rejection."""

from __future__ import annotations

import re

import numpy as np
import pytest

import schedlib as sl

from .helpers import Reject, assert_same_result, schedule


def _row_sum(rows: int = 8, cols: int = 16) -> sl.Func:
    A = sl.placeholder((rows, cols), "float32", "A")
    k = sl.reduce_axis(cols, "k")
    return sl.func([A, sl.compute((rows,), lambda i: sl.sum(A[i, k], axis=k), "C")])


def _staged(rows: int = 8, cols: int = 16, step: int = 4) -> sl.Schedule:
    return schedule(_row_sum(rows, cols), lambda s: s.split("C.k", [None, step]),
                    lambda s: s.cache_read("C", "A", "shared"), lambda s: s.compute_at("A_shared", "C.k_0"))


def test_the_hint_changes_no_result() -> None:
    s = _staged()
    s.double_buffer("A_shared")
    assert dict(s.func.block("A_shared").annotations) == {"double_buffer": True}
    assert_same_result(s.original, s)
    assert sl.Schedule.from_trace(s.original, s.trace.to_json()).func == s.func


@pytest.mark.parametrize("cols, step", [(16, 4), (18, 4), (4, 4)], ids=["even", "ragged-last-step", "one-step"])
def test_double_buffered_kernel_matches_numpy(cols: int, step: int) -> None:
    s = _staged(cols=cols, step=step)
    s.double_buffer("A_shared")
    kernel = sl.build(s, "h100")
    a = np.random.default_rng(cols).random((8, cols), dtype=np.float32)
    np.testing.assert_allclose(kernel.run_cpu(a, bounds_check=True), a.sum(1), rtol=1e-5)


def test_the_loop_prefetches_into_registers_and_meets_one_barrier() -> None:
    s = _staged()
    s.double_buffer("A_shared")
    src = sl.build(s, "h100").source
    body = src[src.index("for (int C_k_0"):]
    assert "SL_SHARED(float, A_shared, 8);" in src  # two 4-element slots
    assert "float sl_pf_A_shared[4];" in body
    assert body.count("__syncthreads();") == 1  # per iteration; the prologue has its own two
    assert "A_shared[(C_k_1 + (sl_cur * 4))]" in body
    assert re.search(r"A_shared\[.*\(sl_nxt \* 4\)\)\] = sl_pf_A_shared\[", body)
    assert body.index("sl_pf_A_shared[((A_shared_ax0 * 4) + A_shared_ax1)] = A[") < body.index("// block C")


def test_a_vector_copy_is_prefetched_as_vectors() -> None:
    s = _staged(cols=32, step=8)
    loops = s.get_loops("A_shared")
    _, v = s.split(loops[-1], [None, 4])
    s.vectorize(v)
    s.double_buffer("A_shared")
    kernel = sl.build(s, "h100")
    assert "uint4 sl_pf_A_shared[2];" in kernel.source
    a = np.random.default_rng(3).random((8, 32), dtype=np.float32)
    np.testing.assert_allclose(kernel.run_cpu(a, bounds_check=True), a.sum(1), rtol=1e-5)


def test_the_build_refuses_what_later_primitives_made_of_the_loop() -> None:
    A = sl.placeholder((16, 8), "float32", "A")
    s = sl.Schedule(sl.func([A, sl.compute((16, 8), lambda i, j: A[i, j] * 2.0, "D")]))
    s.split("D.i", [None, 4])
    s.cache_read("D", "A", "shared")
    s.compute_at("A_shared", "D.i_0")
    s.double_buffer("A_shared")
    s.bind("D.i_0", "blockIdx.x")  # no next iteration in a block to fetch ahead for
    with pytest.raises(sl.BuildError, match=r"sit at D\.i_0, which is not a serial loop"):
        sl.build(s, "h100")
    nested = sl.Schedule(sl.workloads.matmul(4, 4, 8))
    nested.split("C.k", [None, 4])
    nested.cache_read("C", "A", "shared")
    nested.cache_read("C", "B", "shared")
    nested.compute_at("A_shared", "C.i")
    nested.compute_at("B_shared", "C.k_0")
    nested.double_buffer("A_shared")
    nested.double_buffer("B_shared")
    with pytest.raises(sl.BuildError, match=r"inside the loop of other double-buffered copies \(C\.i\)"):
        sl.build(nested, "h100")


def _not_a_copy() -> sl.Schedule:
    return schedule(_row_sum(), lambda s: s.split("C.k", [None, 4]), lambda s: s.cache_read("C", "A", "shared"),
                    lambda s: s.cache_read("C", "A_shared", "shared"),
                    lambda s: s.compute_at("A_shared_shared", "C.k_0"))


def _bound_host() -> sl.Schedule:
    s = _staged()
    s.bind("C.k_0", "threadIdx.x")
    return s


def _symbolic_copy() -> sl.Schedule:
    return schedule(_row_sum(8, sl.var("Cols")), lambda s: s.cache_read("C", "A", "shared"),
                    lambda s: s.compute_at("A_shared", "C.i"))


def _too_many_values() -> sl.Schedule:
    return schedule(_row_sum(8, 256), lambda s: s.split("C.k", [None, 128]),
                    lambda s: s.cache_read("C", "A", "shared"), lambda s: s.compute_at("A_shared", "C.k_0"))


NEGATIVE = [
    Reject("double-buffer-twice", lambda: schedule(_staged().func, lambda s: s.double_buffer("A_shared")),
           lambda s: s.double_buffer("A_shared"), "double_buffer", "block", "A_shared", "double-buffered already"),
    Reject("double-buffer-global-store", _staged, lambda s: s.double_buffer("C"), "double_buffer", "block", "C",
           "writes global buffer C"),
    Reject("double-buffer-not-a-copy", _not_a_copy, lambda s: s.double_buffer("A_shared_shared"), "double_buffer",
           "block", "A_shared_shared", "is not a copy of a global buffer"),
    Reject("double-buffer-detached", lambda: schedule(_row_sum(), lambda s: s.cache_read("C", "A", "shared")),
           lambda s: s.double_buffer("A_shared"), "double_buffer", "block", "A_shared",
           "is not attached before a loop body"),
    Reject("double-buffer-thread-loop", _bound_host, lambda s: s.double_buffer("A_shared"), "double_buffer", "block",
           "A_shared", "bound to threadIdx.x; it needs a serial loop"),
    Reject("double-buffer-symbolic", _symbolic_copy, lambda s: s.double_buffer("A_shared"), "double_buffer",
           "block", "A_shared", "has a loop of symbolic extent outside its thread loops"),
    Reject("double-buffer-too-many", _too_many_values, lambda s: s.double_buffer("A_shared"), "double_buffer",
           "block", "A_shared", "would hold 128 values per thread in registers (at most 64)"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=[c.id for c in NEGATIVE])
def test_rejections(case: Reject) -> None:
    case.check()
