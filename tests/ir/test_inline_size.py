"""compute_inline refuses to grow an expression past INLINE_NODE_LIMIT nodes (a stage read more than once is
copied into each read), and the sizes are counted without writing the expression out."""

from __future__ import annotations

import time

import schedlib as sl
from schedlib import workloads as wl
from schedlib.ir.expr import Var
from schedlib.ir.primitives.inline import INLINE_NODE_LIMIT, largest_after_inline
from schedlib.ir.simplify import tree_count

from .helpers import assert_rejected, assert_same_result


def test_tree_count_counts_a_shared_subexpression_once_per_use_in_linear_time() -> None:
    x = sl.placeholder((8,), "float32", "X")
    e = x[Var("i")]  # a load and its index: 2 nodes
    size = 2
    for _ in range(60):  # x * x sixty times: 2^60 leaves written out, 61 distinct nodes
        e = e * e
        size = 2 * size + 1
    start = time.perf_counter()
    assert tree_count(e) == size
    assert tree_count(e, lambda n: isinstance(n, Var)) == 2 ** 60
    assert time.perf_counter() - start < 5  # seconds: written out, this would never finish


def test_inlining_a_chain_of_stages_read_twice_stops_at_the_limit() -> None:
    # each gelu reads its input twice (x and erf(x)): E10 doubles with every stage inlined into it
    s = sl.Schedule(wl.elementwise((4, 8), ("add", *("gelu",) * 10)))
    inlined = []
    for name in [f"E{k}" for k in range(9, -1, -1)]:
        if largest_after_inline(s.func, name) > INLINE_NODE_LIMIT:
            break
        s.compute_inline(name)
        inlined.append(name)
    assert 4 <= len(inlined) < 10, inlined
    refused = f"E{9 - len(inlined)}"
    size = largest_after_inline(s.func, refused)
    assert size > INLINE_NODE_LIMIT
    err = assert_rejected(s, lambda: s.compute_inline(refused), "compute_inline", "block", refused)
    assert f"{size} nodes long, more than {INLINE_NODE_LIMIT}" in str(err)
    assert_same_result(s.original, s)  # what was inlined still computes the chain


def test_the_size_a_rule_is_told_is_the_size_inlining_makes() -> None:
    s = sl.Schedule(wl.elementwise((4, 8), ("add", "gelu", "gelu", "gelu")))
    for name in ("E2", "E1", "E0"):
        expected = largest_after_inline(s.func, name)
        consumer = next(b.name for b in s.func.blocks if s.func.block(name).store in b.read_buffers)
        s.compute_inline(name)
        assert tree_count(s.func.block(consumer).value) == expected, name
