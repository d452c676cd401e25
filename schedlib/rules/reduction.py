"""Reduction rule: sum / max / min / mean / sum of squares over the last or the first axis.

The body may read several operands, as long as every load indexed by all of the block's axes uses them in one
order (``sum(A[i, k] * B[i, k])``); loads of fewer axes are broadcasts (``W[i, k] * x[k]``, ``X[i, k] * s[i]``).
Element-wise stages before the reduction are inlined into it (:func:`~schedlib.rules.analysis.inline_prologue`).

Row-per-block (many threads per row) and row-per-warp (32 threads per row, several rows per block) are two
points of the same knob space (``threads_k`` = 32 with ``rows_per_block`` > 1 is row-per-warp); the
default picks by row length.  Reductions over the first axis use the ``outer`` layout.  ``blocks_per_row`` > 1
reduces each row in two stages (:mod:`schedlib.rules.two_stage`): a reduction to one value, or a few long rows.
"""

from __future__ import annotations

from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import as_int
from schedlib.ir.func import Block, Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import (
    accesses,
    ceil_pow2,
    const_or,
    epilogue_chain,
    reduction_view,
    stores_plainly,
)
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range
from schedlib.rules.cross_thread import (
    ReductionFacts,
    outer_default,
    outer_space,
    outer_tiling,
    schedule_cross_thread,
)
from schedlib.rules.two_stage import (
    MAX_PARTIALS,
    final_threads,
    row_length,
    rows_count,
    schedule_two_stage,
    split_default,
    two_stage_tiling,
)

WARP_ROW_LIMIT = 256  # rows up to this many elements get one warp each


def analyze_reduction(func: Func) -> ReductionFacts | str:
    found = reduction_view(func)
    if isinstance(found, str):
        return found
    view, main, prologue = found
    if not stores_plainly(main):
        return f"block {main.name} ({main.kinds}) must store at its spatial axes"
    index = walked_index(view, main)
    if isinstance(index, str):
        return index
    r_axes = tuple(a for a in index if main.axis(a).kind == "R")  # in the order the operands walk them
    s_axes = tuple(a.name for a in main.axes if a.kind == "S")
    if not s_axes and index[-1] not in r_axes:
        return f"block {main.name} reduces to one value but its operands are not walked contiguously"
    epi = epilogue_chain(view, main)
    if isinstance(epi, str):
        return epi
    walked = {a.buffer for a in accesses(main) if a.axes == index}
    in_bytes = max(BYTES[func.buffer(b).dtype] for b in walked)
    return ReductionFacts(main.name, s_axes, (), r_axes, index[-1] in r_axes, tuple(b.name for b in epi),
                          in_bytes, prologue)


def walked_index(func: Func, main: Block) -> tuple[str, ...] | str:
    """The index at which the reduction walks its operands (every axis of ``main``, in the order of the
    operands' dimensions), or why there is none.

    ``sum_k X[i, k] * Y[i, k]`` walks ``(i, k)``.  Loads of fewer axes are broadcasts (``w[k]`` of a
    matrix-vector product, ``s[i]`` a per-row scale) and may come in any order, but every load indexed by all
    the axes must use the same order: that order decides which axis is contiguous, so which layout (inner or
    outer) coalesces.
    """
    accs = accesses(main)
    if not accs:
        return f"block {main.name} reads no buffer"
    if not all(a.plain for a in accs):
        return f"block {main.name} reads at an index that is not a plain axis"
    computed = sorted({a.buffer for a in accs if a.buffer not in func.inputs})
    if computed:
        return f"{computed[0]} is computed; inline its producer first"
    read = {ax for a in accs for ax in a.axes}
    # a kept axis of extent 1 (``sum(x)`` stored as shape (1,)) need not be read: it has a single value
    every = {a.name for a in main.axes if a.name in read or a.kind == "R" or as_int(a.extent) != 1}
    full = sorted({a.axes for a in accs if set(a.axes) == every})
    if not full:
        return f"block {main.name} reads no operand at all of its axes {sorted(every)}"
    if len(full) > 1:
        orders = ", ".join("(" + ", ".join(f) + ")" for f in full)
        return f"block {main.name} reads its operands in different axis orders: {orders}"
    if len(full[0]) != len(every):
        return f"block {main.name} reads an operand at a repeated axis {full[0]}"
    return full[0]


class ReductionRule(Rule):
    name = "reduction"

    def analyze(self, func: Func, target: HardwareProfile) -> ReductionFacts | str:
        return analyze_reduction(func)

    def _facts(self, func: Func) -> ReductionFacts:
        return self._require(analyze_reduction(func))

    def space(self, func: Func, target: Any) -> Space:
        facts = self._facts(func)
        limit = target.max_threads_per_block
        if facts.inner:
            one_row = rows_count(func, facts) == 1  # a single value, or kept axes of extent 1
            fixed = all(as_int(func.block(facts.main).axis(a).extent) is not None for a in facts.reduce)
            length = row_length(func, facts) if fixed else None
            knobs = (Knob("rows_per_block", (1,) if one_row else (1, 2, 4, 8), "rows per thread block (threadIdx.y)"),
                     Knob("threads_k", pow2_range(32, 1024), "threads per row (32: one warp per row)"),
                     Knob("vector", (1, 2, 4), "consecutive elements per thread per step"),
                     Knob("blocks_per_row", pow2_range(1, MAX_PARTIALS),
                          "blocks sharing a row (> 1: partial results, then a second kernel combines them)"))

            def check(c: Config) -> str | None:
                t = c["rows_per_block"] * c["threads_k"]
                if t > limit:
                    return f"{t} threads exceed {limit}"
                if c["blocks_per_row"] > 1 and c["rows_per_block"] > 1:
                    return "a row split over blocks takes the whole block (rows_per_block 1)"
                step = c["threads_k"] * c["vector"]
                if c["blocks_per_row"] > 1 and length is not None and (c["blocks_per_row"] - 1) * step >= length:
                    # a block whose share starts past the row's end reads nothing, yet it is launched: on an
                    # H200 a row sum of 4096 x 4096 split 1024 ways (1008 of each row's blocks empty) took
                    # 2546 us against 24 us unsplit
                    return (f"{c['blocks_per_row']} blocks per row of {step} elements per step leave blocks with "
                            f"nothing to read: the row has {length} elements")
                if c["blocks_per_row"] > 1 and final_threads(c["blocks_per_row"]) > limit:
                    return (f"the second stage reduces {c['blocks_per_row']} partials with "
                            f"{final_threads(c['blocks_per_row'])} threads, more than {limit}")
                return None
        else:
            return outer_space(self.name, target)
        return Space(self.name, knobs, check)

    def default_config(self, func: Func, target: Any) -> Config:
        facts = self._facts(func)
        length = row_length(func, facts)
        vector = max(1, min(4, 16 // facts.in_bytes))
        if not facts.inner:
            return outer_default()
        if length <= WARP_ROW_LIMIT:  # row per warp (a single short row: one warp)
            rows = min(8, 1 << (rows_count(func, facts).bit_length() - 1))  # no more rows than there are
            return {"rows_per_block": rows, "threads_k": 32, "vector": 1 if length < 128 else vector,
                    "blocks_per_row": 1}
        threads = max(32, min(512, ceil_pow2(-(-length // (vector * 4)))))
        split = split_default(rows_count(func, facts), length, threads, vector, target.sm_count)
        return {"rows_per_block": 1, "threads_k": threads, "vector": vector, "blocks_per_row": split}

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        facts = self._facts(func)
        blk = func.block(facts.main)
        tile = {a.name: (1 if a.kind == "S" else const_or(a.extent, 4096)) for a in blk.axes}
        if not facts.inner:
            return outer_tiling(func, facts, config, tile)
        if config["blocks_per_row"] > 1 or not facts.rows:
            return two_stage_tiling(func, facts, config)
        tile[facts.rows[-1]] = config["rows_per_block"]
        threads, step = config["rows_per_block"] * config["threads_k"], config["threads_k"] * config["vector"]
        return Tiling(facts.main, tile, {facts.rows[-1]: 1}, {facts.reduce[-1]: step}, threads, 4 * threads,
                      32 + 2 * config["vector"], config["vector"])

    def schedule(self, func: Func, facts: ReductionFacts, config: Config, target: HardwareProfile) -> Schedule:
        if facts.inner and config["blocks_per_row"] > 1:
            return schedule_two_stage(func, facts, config)
        return schedule_cross_thread(func, facts, config)
