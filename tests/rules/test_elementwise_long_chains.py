"""The element-wise rule on chains whose stages are read more than once (gelu reads x twice): it inlines until
a consumer would outgrow INLINE_NODE_LIMIT, and keeps that stage as a kernel of its own."""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
from schedlib import workloads as wl
from schedlib.ir.primitives.inline import INLINE_NODE_LIMIT
from schedlib.ir.simplify import tree_count

from .helpers import check_schedule


@pytest.mark.parametrize("gelus", [4, 20])
def test_a_chain_of_gelus_is_fused_as_far_as_the_limit_allows(gelus: int) -> None:
    f = wl.elementwise((24, 40), ("add", *("gelu",) * gelus))
    s = sl.rules.apply_default(f, "h100")  # before: 16 gelus did not finish in 20 s, 256 took 6.7 GB
    assert s.rule == "elementwise"
    kernels = s.func.root_blocks()
    assert all(tree_count(b.value) <= INLINE_NODE_LIMIT for b in kernels)
    # a gelu doubles what it reads, so about 9 fit in one kernel (the first one also holds the add)
    assert len(kernels) == (1 if gelus == 4 else -(-gelus // 9)), [b.name for b in kernels]
    assert [b.name for b in kernels][-1] == f"E{gelus}"  # the output last, after the stages kept
    check_schedule(f, s, np.random.default_rng(gelus), archs=("sm_90",))
