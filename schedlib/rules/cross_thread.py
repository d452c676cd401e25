"""The shared template of GEMV and Reduction: one reduction block, reduced across threads.

Two layouts, decided by whether the reduced axis is the contiguous dimension of the big operand:

* **inner** (``y[r] = sum_k W[r, k]``): each block owns ``rows_per_block`` rows (threadIdx.y); the threads
  of a row (threadIdx.x) read ``vector`` consecutive elements each, coalesced (one vector load), fold them in
  a register and combine with warp shuffles.  A small batch (GEMV's m) sits inside the reduction as lanes:
  one partial per activation row, so each weight vector is loaded once for all of them.
* **outer** (``y[n] = sum_k W[k, n]``, DLight has no CUDA schedule for it): threadIdx.x runs along the
  contiguous ``n`` (coalesced), each thread owns ``vector`` neighbouring columns (the innermost loop, read
  with one vector load per row into one partial per column), and ``threads_k`` threads (threadIdx.y) split
  ``k`` and combine through shared memory.  Each thread walks its rows ``unroll`` at a
  time in an unrolled loop, so that many independent loads are in flight at once: a block of the outer
  layout holds few threads per output, and without them it waits one memory latency per row it reads.

The result lands in a register (cache_write local), the element-wise epilogue is folded into the single
store, and small spatial axes (a GEMV's batch) loop inside each thread: as lanes of the reduction (one
pass over the weight for all of them) where the thread's partials fit, else one reduction each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedlib.ir.expr import as_int
from schedlib.ir.func import MAX_LANES, Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import const_or
from schedlib.rules.base import Config, Knob, Space, Tiling, pow2_range

# Outer layout default: one warp along n, two columns per thread (a 16-bit row segment is one 128-byte line),
# 32 warps splitting k, 8 rows per thread loaded before use: 256 independent loads in flight per block is what
# it takes to keep DRAM busy when a block holds so few outputs (the carver ranks it at the DRAM floor of a
# 4096 x 14336 fp16 GEMV on H100, where the former 64 x 4-thread default sat 15x above it, latency-bound).
OUTER_DEFAULT = {"threads_n": 32, "threads_k": 32, "unroll": 8, "vector": 2}


@dataclass(frozen=True)
class ReductionFacts:
    main: str
    rows: tuple[str, ...]  # large spatial axes, spread over blocks
    small: tuple[str, ...]  # small spatial axes, looped inside a thread (GEMV batch)
    reduce: tuple[str, ...]
    inner: bool  # the reduced axis is contiguous in the big operand
    epilogue: tuple[str, ...]
    in_bytes: int  # the widest element the reduction walks
    prologue: tuple[str, ...] = ()  # element-wise stages before ``main``, inlined first, in this order
    # (small axis, lanes): that many of the axis's points are lanes of one pass, the rest blockIdx.y (a GEMV
    # broadcast over more activation rows than a thread holds partials for)
    lane_split: tuple[str, int] | None = None


def fused_loops(s: Schedule, loops: list[str]) -> str | None:
    """``loops`` fused in the order given (reordered into it first: a reduction over ``axis=[j, i]`` walks
    ``X[i, j]`` as i, j)."""
    if not loops:
        return None
    if len(loops) == 1:
        return loops[0]
    s.reorder(*loops)
    return s.fuse(*loops)


def row_grid(s: Schedule, func: Func, facts: ReductionFacts, row_loops: list[str]) -> tuple[list[str], list[str]]:
    """(row loops for blockIdx.z and .y, outermost first; the row loops left to fuse for blockIdx.x).

    Rows of several axes are fused into one grid dimension, except where a size is symbolic: the // and % of a
    fused symbolic index hide from the write-back's region which output a thread holds, so its register
    buffer would have a symbolic size.  There the last axis alone is fused into blockIdx.x and the others get
    blockIdx.y and .z (three or more fused into z: one fixed value per block, which the region sees)."""
    blk = func.block(facts.main)
    if len(row_loops) < 2 or all(as_int(blk.axis(a).extent) is not None for a in facts.rows):
        return [], row_loops
    outer = row_loops[:-1]
    if len(outer) > 2:
        outer = [fused_loops(s, outer[:-1]) or outer[0], outer[-1]]
    return outer, row_loops[-1:]


def bind_row_grid(s: Schedule, loops: list[str]) -> None:
    """Bind ``row_grid``'s outer row loops: the innermost to blockIdx.y, the one outside it to blockIdx.z."""
    for loop, tag in zip(reversed(loops), ("blockIdx.y", "blockIdx.z")):
        s.bind(loop, tag)


def schedule_cross_thread(func: Func, facts: ReductionFacts, config: Config) -> Schedule:
    s = Schedule(func)
    for block in facts.prologue:
        s.compute_inline(block)
    C = facts.main
    by_axis = dict(zip([a.name for a in func.block(C).axes], s.get_loops(C)))
    k = fused_loops(s, [by_axis[a] for a in facts.reduce])
    small = [by_axis[a] for a in facts.small]
    lane_grid: list[str] = []
    if facts.lane_split is not None:
        axis, lanes_per_pass = facts.lane_split
        passes, lane = s.split(by_axis[axis], [None, lanes_per_pass])
        small = [lane if loop == by_axis[axis] else loop for loop in small]
        lane_grid = [passes]
    row_loops = [by_axis[a] for a in facts.rows]
    if len(row_loops) > 1 and small:  # a batched matmul's small m sits between batch and n: move it inside
        s.reorder(*row_loops, *small)
    grid_yz, row_loops = row_grid(s, func, facts, row_loops)
    grid_yz = [*lane_grid, *grid_yz]  # analyze_gemv splits lanes only where row_grid leaves y and z free
    rows = fused_loops(s, row_loops)
    vec = config["vector"]
    if facts.inner:
        outer: list[str] = []
        if rows is not None:
            bx, ty = s.split(rows, [None, config["rows_per_block"]])
            outer = [bx, ty]
        ko, kt, kv = s.split(k, [None, config["threads_k"], vec])
        # A small batch (GEMV's m <= 8) inside the reduction, as lanes: each weight vector a thread loads
        # serves every activation row, instead of one pass over the weight row per activation row.
        lanes = bool(outer) and bool(small)
        order = [*outer, kt, ko, *small, kv] if lanes else [*outer, *small, kt, ko, kv]
        order = [*grid_yz, *order]
        s.reorder(*order)
        bind_row_grid(s, grid_yz)
        if outer:
            s.bind(outer[0], "blockIdx.x")
            s.bind(outer[1], "threadIdx.y")
        s.bind(kt, "threadIdx.x")
        s.vectorize(kv)  # one 16-byte load per operand where alignment is provable
    else:
        outer = []
        if rows is not None:
            bx, nt, nv = s.split(rows, [None, config["threads_n"], vec])
            outer = [bx, nt, nv]
        ko, ku, kt = s.split(k, [None, config["unroll"], config["threads_k"]])
        # The thread's columns innermost (lanes): one pass over its rows reads them together, a vector load
        # per row, into one partial per column.  Not when the columns come from fusing several axes (a
        # batched GEMV): the // and % of the fused index hide which outputs a thread owns from the
        # write-back's region, so the columns stay outside, one pass each.
        lanes = bool(outer) and len(row_loops) == 1
        # A small batch joins the lanes too while the thread's partials fit (batch x columns <= MAX_LANES).
        batch_lanes = lanes and bool(small) and vec * math.prod(
            const_or(func.block(C).axis(a).extent, MAX_LANES + 1) for a in facts.small) <= MAX_LANES
        if batch_lanes:
            order = [*outer[:2], kt, ko, ku, *small, outer[2]]
        elif lanes:
            order = [*outer[:2], *small, kt, ko, ku, outer[2]]
        else:
            order = [*outer, *small, kt, ko, ku]
        order = [*grid_yz, *order]
        s.reorder(*order)
        bind_row_grid(s, grid_yz)
        if outer:
            s.bind(outer[0], "blockIdx.x")
            s.bind(outer[1], "threadIdx.x")
            if not lanes:
                s.unroll(outer[2])
            elif vec > 1:
                s.vectorize(outer[2])
        s.bind(kt, "threadIdx.y")
        s.unroll(ku)
    # The write-back sits at the innermost loop outside the reduction; with none (a reduction to a single
    # value) there is nothing to hold per thread.
    at = order.index(kt)
    if at == 0:
        return s
    anchor = order[at - 1]
    wb = s.cache_write(C, "local")
    s.reverse_compute_at(wb, anchor)
    for block in facts.epilogue:
        s.reverse_compute_inline(block)
    return s


def threads_within(limit: int) -> Callable[[Config], str | None]:
    """The check of a space whose blocks are ``threads_n`` x ``threads_k`` threads."""
    def check(c: Config) -> str | None:
        t = c["threads_n"] * c["threads_k"]
        return None if t <= limit else f"{t} threads exceed {limit}"

    return check


def outer_space(rule: str, target: Any) -> Space:
    """The knob space of the outer layout (shared by GEMV and Reduction)."""
    return Space(rule, (Knob("threads_n", pow2_range(32, 256), "threads along the kept (contiguous) axis"),
                        Knob("vector", (1, 2, 4), "neighbouring outputs per thread"),
                        Knob("threads_k", (1, 2, 4, 8, 16, 32), "threads splitting the reduction (threadIdx.y)"),
                        Knob("unroll", (1, 2, 4, 8), "reduction rows each thread loads before folding them")),
                 threads_within(target.max_threads_per_block))


def outer_default() -> Config:
    """The outer layout's expert choice (:data:`OUTER_DEFAULT`)."""
    return dict(OUTER_DEFAULT)


def outer_tiling(func: Func, facts: ReductionFacts, config: Config, tile: dict[str, int]) -> Tiling:
    """The carver's view of an outer-layout config: ``unroll`` rows per thread are loaded before any is used,
    so one pipeline step covers ``threads_k * unroll`` rows."""
    tile = {**tile, facts.rows[-1]: config["threads_n"] * config["vector"]}
    threads = config["threads_n"] * config["threads_k"]
    return Tiling(facts.main, tile, {facts.rows[-1]: 1}, {facts.reduce[-1]: config["threads_k"] * config["unroll"]},
                  threads, 4 * threads, 32 + 2 * config["vector"] + config["unroll"], config["vector"])
