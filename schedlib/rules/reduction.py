"""Reduction rule: sum / max / min / mean / sum of squares over the last or the first axis.

Row-per-block (many threads per row) and row-per-warp (32 threads per row, several rows per block) are two
points of the same knob space (``threads_k`` = 32 with ``rows_per_block`` > 1 is row-per-warp); the
default picks by row length.  Reductions over the first axis use the ``outer`` layout.
"""

from __future__ import annotations

from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.dtype import BYTES
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import accesses, ceil_pow2, const_or, epilogue_chain, stores_plainly
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range
from schedlib.rules.cross_thread import (
    ReductionFacts,
    outer_default,
    outer_space,
    outer_tiling,
    schedule_cross_thread,
)

WARP_ROW_LIMIT = 256  # rows up to this many elements get one warp each


def analyze_reduction(func: Func) -> ReductionFacts | str:
    reductions = [b for b in func.blocks if b.reducer is not None]
    if len(reductions) != 1:
        return f"needs exactly one reduction block, found {len(reductions)}"
    main = reductions[0]
    if func.blocks.index(main) != 0:
        return "stages before the reduction must be inlined first"
    if "S" not in main.kinds or not stores_plainly(main):
        return f"block {main.name} ({main.kinds}) must keep spatial axes and store at them"
    accs = accesses(main)
    buffers = {a.buffer for a in accs}
    if len(buffers) != 1 or not all(a.plain for a in accs) or len({a.axes for a in accs}) != 1:
        return f"block {main.name} must read one buffer at one plain index"
    (buf,) = buffers
    if buf not in func.inputs:
        return f"{buf} is computed; inline its producer first"
    index = accs[0].axes
    r_axes = tuple(a.name for a in main.axes if a.kind == "R")
    s_axes = tuple(a.name for a in main.axes if a.kind == "S")
    epi = epilogue_chain(func, main)
    if isinstance(epi, str):
        return epi
    inner = index[-1] in r_axes
    return ReductionFacts(main.name, s_axes, (), r_axes, inner, tuple(b.name for b in epi),
                          BYTES[func.buffer(buf).dtype])


class ReductionRule(Rule):
    name = "reduction"

    def analyze(self, func: Func, target: HardwareProfile) -> ReductionFacts | str:
        return analyze_reduction(func)

    def _facts(self, func: Func) -> ReductionFacts:
        return self._require(analyze_reduction(func))

    def _length(self, func: Func, facts: ReductionFacts) -> int:
        blk = func.block(facts.main)
        n = 1
        for a in facts.reduce:
            n *= const_or(blk.axis(a).extent, 4096)
        return n

    def space(self, func: Func, target: Any) -> Space:
        facts = self._facts(func)
        limit = target.max_threads_per_block
        if facts.inner:
            knobs = (Knob("rows_per_block", (1, 2, 4, 8), "rows per thread block (threadIdx.y)"),
                     Knob("threads_k", pow2_range(32, 1024), "threads per row (32: one warp per row)"),
                     Knob("vector", (1, 2, 4), "consecutive elements per thread per step"))

            def check(c: Config) -> str | None:
                t = c["rows_per_block"] * c["threads_k"]
                return None if t <= limit else f"{t} threads exceed {limit}"
        else:
            return outer_space(self.name, target)
        return Space(self.name, knobs, check)

    def default_config(self, func: Func, target: Any) -> Config:
        facts = self._facts(func)
        length = self._length(func, facts)
        vector = max(1, min(4, 16 // facts.in_bytes))
        if not facts.inner:
            return outer_default()
        if length <= WARP_ROW_LIMIT:  # row per warp
            return {"rows_per_block": 8, "threads_k": 32, "vector": 1 if length < 128 else vector}
        threads = max(32, min(512, ceil_pow2(-(-length // (vector * 4)))))
        return {"rows_per_block": 1, "threads_k": threads, "vector": vector}

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        facts = self._facts(func)
        blk = func.block(facts.main)
        tile = {a.name: (1 if a.kind == "S" else const_or(a.extent, 4096)) for a in blk.axes}
        if not facts.inner:
            return outer_tiling(func, facts, config, tile)
        tile[facts.rows[-1]] = config["rows_per_block"]
        threads, step = config["rows_per_block"] * config["threads_k"], config["threads_k"] * config["vector"]
        return Tiling(facts.main, tile, {facts.rows[-1]: 1}, {facts.reduce[-1]: step}, threads, 4 * threads,
                      32 + 2 * config["vector"], config["vector"])

    def schedule(self, func: Func, facts: ReductionFacts, config: Config, target: HardwareProfile) -> Schedule:
        return schedule_cross_thread(func, facts, config)
