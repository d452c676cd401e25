"""storage_permute: the allocation it records, the addresses codegen derives from it, and every rejection
(storage_align's tests are with the annotation primitives)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.expr import Const
from schedlib.ir.layout import flatten, permuted
from schedlib.ir.reference import evaluate_int

from .helpers import Reject, assert_same_result, schedule


def _cached() -> sl.Schedule:
    return schedule(sl.workloads.matmul(2, 16, 4), lambda s: s.cache_read("C", "B", "shared"))


def test_the_allocation_records_it_and_a_second_call_on_the_dim_replaces_it() -> None:
    s = _cached()
    assert s.storage_permute("B_shared", 1, [4, 2, 2], [1, 0, 2]) is None
    assert s.func.buffer("B_shared").permute == ((1, (4, 2, 2), (1, 0, 2)),)
    s.storage_permute("B_shared", 1, [2, 8], [1, 0])
    assert s.func.buffer("B_shared").permute == ((1, (2, 8), (1, 0)),)
    assert_same_result(s.original, s)  # logical indexing is untouched
    replayed = sl.Schedule.from_trace(s.original, s.trace.to_json())
    assert replayed.func == s.func


@pytest.mark.parametrize(("factors", "order"), [([4, 2, 2], [1, 0, 2]), ([2, 8], [1, 0]), ([2, 2, 2, 2], [3, 1, 0, 2]),
                                                ([16, 1], [1, 0])])
def test_each_index_lands_on_its_own_slot(factors: list[int], order: list[int]) -> None:
    """The stored position of every index: its digits in ``factors``, read in ``order``; a permutation."""
    n = int(np.prod(factors))
    got = [evaluate_int(permuted(Const(i), factors, order), {}) for i in range(n)]
    assert sorted(got) == list(range(n))
    for i, pos in enumerate(got):
        digits = [(i // int(np.prod(factors[k + 1:]))) % factors[k] for k in range(len(factors))]
        want = 0
        for d in order:
            want = want * factors[d] + digits[d]
        assert pos == want


def test_flatten_applies_it_on_its_dim_only() -> None:
    s = _cached()
    s.storage_permute("B_shared", 1, [4, 2, 2], [1, 0, 2])
    buf = s.func.buffer("B_shared")
    for k, j in itertools.product(range(4), range(16)):
        t, h, v = j // 4, (j // 2) % 2, j % 2
        assert evaluate_int(flatten(buf, (Const(k), Const(j))), {}) == k * 16 + h * 8 + t * 2 + v


NEGATIVE = [
    Reject("storage-permute-global", _cached, lambda s: s.storage_permute("C", 1, [4, 4], [1, 0]), "storage_permute",
           "block", "C", "writes global buffer C"),
    Reject("storage-permute-dim", _cached, lambda s: s.storage_permute("B_shared", 2, [4, 4], [1, 0]),
           "storage_permute", "dim", 2, "must index a dimension of B_shared (0..1)"),
    Reject("storage-permute-dim-bool", _cached, lambda s: s.storage_permute("B_shared", True, [4, 4], [1, 0]),
           "storage_permute", "dim", True, "must index a dimension"),
    Reject("storage-permute-symbolic", lambda: schedule(sl.workloads.matmul(2, sl.var("N"), 4),
                                                        lambda s: s.cache_read("C", "B", "shared")),
           lambda s: s.storage_permute("B_shared", 1, [4, 4], [1, 0]), "storage_permute", "dim", 1,
           "is symbolic"),
    Reject("storage-permute-one-factor", _cached, lambda s: s.storage_permute("B_shared", 1, [16], [0]),
           "storage_permute", "factors", [16], "at least two positive integers"),
    Reject("storage-permute-factor", _cached, lambda s: s.storage_permute("B_shared", 1, [0, 16], [1, 0]),
           "storage_permute", "factors", 0, "positive integer"),
    Reject("storage-permute-product", _cached, lambda s: s.storage_permute("B_shared", 1, [4, 2], [1, 0]),
           "storage_permute", "factors", [4, 2], "multiply to 8, but dimension 1 of B_shared has 16 elements"),
    Reject("storage-permute-order", _cached, lambda s: s.storage_permute("B_shared", 1, [4, 4], [0, 0]),
           "storage_permute", "order", [0, 0], "must be a permutation of 0..1"),
    # Regression: Schedule.storage_permute called list() on its arguments first (TypeError, or a string
    # split into characters that the error then named).
    Reject("storage-permute-factors-int", _cached, lambda s: s.storage_permute("B_shared", 1, 16, [1, 0]),
           "storage_permute", "factors", 16, "at least two positive integers"),
    Reject("storage-permute-factors-str", _cached, lambda s: s.storage_permute("B_shared", 1, "44", [1, 0]),
           "storage_permute", "factors", "44", "at least two positive integers"),
    Reject("storage-permute-order-none", _cached, lambda s: s.storage_permute("B_shared", 1, [4, 4], None),
           "storage_permute", "order", None, "must be a permutation of 0..1"),
    Reject("storage-permute-order-mixed", _cached, lambda s: s.storage_permute("B_shared", 1, [4, 4], [1, "a"]),
           "storage_permute", "order", [1, "a"], "must be a permutation of 0..1"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rejections(case: Reject) -> None:
    case.check()


@pytest.mark.parametrize("placement", ["compute_at", "reverse_compute_at"])
def test_a_permuted_dim_stays_whole_when_the_buffer_is_compacted(placement: str) -> None:
    """Regression: compaction kept the permute entry, whose factors describe the old extent, so the kernel
    indexed past the smaller allocation (an out-of-bounds shared/local access)."""
    if placement == "compute_at":
        A = sl.placeholder((8, 16), "float32", "A")
        k = sl.reduce_axis(16, "k")
        C = sl.compute((8,), lambda i: sl.sum(A[i, k], axis=k), "C")
        s = sl.Schedule(sl.func([A, C]))
        s.cache_read("C", "A", "shared")
        s.storage_permute("A_shared", 1, [4, 4], [1, 0])
        s.split("C.k", [4, 4])
        s.compute_at("A_shared", "C.k_0")
        name, whole_dim = "A_shared", 1
    else:
        A = sl.placeholder((4, 16), "float32", "A")
        C = sl.compute((4, 16), lambda i, j: A[i, j] * 2.0, "C")
        s = sl.Schedule(sl.func([A, C]))
        s.cache_write("C", "shared")  # block C now writes C_shared; block C_shared copies it out to C
        s.storage_permute("C", 1, [4, 4], [1, 0])
        s.split("C.j", [4, 4])
        s.reverse_compute_at("C_shared", "C.j_0")  # one iteration writes 4 of a row's 16 elements
        name, whole_dim = "C_shared", 1
    buf = s.func.buffer(name)
    assert buf.permute == ((whole_dim, (4, 4), (1, 0)),)
    # the other dim is compacted to the one row an iteration touches; the permuted one keeps its 16
    assert [int(e.value) for e in buf.shape] == [1, 16], buf
    assert_same_result(s.original, s)
