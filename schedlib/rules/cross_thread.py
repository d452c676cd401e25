"""The shared template of GEMV and Reduction: one reduction block, reduced across threads.

Two layouts, decided by whether the reduced axis is the contiguous dimension of the big operand:

* **inner** (``y[r] = sum_k W[r, k]``): each block owns ``rows_per_block`` rows (threadIdx.y); the threads
  of a row (threadIdx.x) read ``vector`` consecutive elements each, coalesced, fold them in a register and
  combine with warp shuffles.
* **outer** (``y[n] = sum_k W[k, n]``, DLight has no CUDA schedule for it): threadIdx.x runs along the
  contiguous ``n`` (coalesced), each thread owns ``vector`` neighbouring columns, and ``threads_k`` threads
  (threadIdx.y) split ``k`` and combine through shared memory.

The result lands in a register (cache_write local), the element-wise epilogue is folded into the single
store, and small spatial axes (a GEMV's batch) loop inside each thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config


@dataclass(frozen=True)
class ReductionFacts:
    main: str
    rows: tuple[str, ...]  # large spatial axes, spread over blocks
    small: tuple[str, ...]  # small spatial axes, looped inside a thread (GEMV batch)
    reduce: tuple[str, ...]
    inner: bool  # the reduced axis is contiguous in the big operand
    epilogue: tuple[str, ...]
    in_bytes: int


def _fused(s: Schedule, loops: list[str]) -> str | None:
    if not loops:
        return None
    return s.fuse(*loops) if len(loops) > 1 else loops[0]


def schedule_cross_thread(func: Func, facts: ReductionFacts, config: Config) -> Schedule:
    s = Schedule(func)
    C = facts.main
    by_axis = dict(zip([a.name for a in func.block(C).axes], s.get_loops(C)))
    k = _fused(s, [by_axis[a] for a in facts.reduce])
    small = [by_axis[a] for a in facts.small]
    rows = _fused(s, [by_axis[a] for a in facts.rows])
    vec = config["vector"]
    if facts.inner:
        outer: list[str] = []
        if rows is not None:
            bx, ty = s.split(rows, [None, config["rows_per_block"]])
            outer = [bx, ty]
        ko, kt, kv = s.split(k, [None, config["threads_k"], vec])
        s.reorder(*outer, *small, kt, ko, kv)
        if outer:
            s.bind(outer[0], "blockIdx.x")
            s.bind(outer[1], "threadIdx.y")
        s.bind(kt, "threadIdx.x")
        s.unroll(kv)
        anchor = small[-1] if small else (outer[-1] if outer else None)
    else:
        outer = []
        if rows is not None:
            bx, nt, nv = s.split(rows, [None, config["threads_n"], vec])
            outer = [bx, nt, nv]
        ko, kt = s.split(k, [None, config["threads_k"]])
        s.reorder(*outer, *small, kt, ko)
        if outer:
            s.bind(outer[0], "blockIdx.x")
            s.bind(outer[1], "threadIdx.x")
            s.unroll(outer[2])
        s.bind(kt, "threadIdx.y")
        anchor = small[-1] if small else (outer[-1] if outer else None)
    if anchor is None:  # a reduction to a single value: nothing to hold per thread
        return s
    wb = s.cache_write(C, "local")
    s.reverse_compute_at(wb, anchor)
    for block in facts.epilogue:
        s.reverse_compute_inline(block)
    return s
