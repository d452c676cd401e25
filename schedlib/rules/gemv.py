"""GEMV rule: a matmul whose m (or n) extent is small (decode-time activations, batch 1-8).

Both weight layouts: reduction over the weight's contiguous axis (``inner``) or over its outer axis
(``outer``).  See :mod:`schedlib.rules.cross_thread` for the template.
"""

from __future__ import annotations

import math
from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.expr import as_int
from schedlib.ir.func import MAX_LANES, Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import accesses, ceil_pow2, const_or, reduction_view
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range
from schedlib.rules.cross_thread import (
    ReductionFacts,
    outer_default,
    outer_space,
    outer_tiling,
    schedule_cross_thread,
)
from schedlib.rules.matmul_facts import analyze_matmul

SMALL = 8  # largest activation extent treated as a vector side


def analyze_gemv(func: Func) -> ReductionFacts | str:
    found = reduction_view(func)  # a dequantised weight: its stages are inlined
    if isinstance(found, str):
        return found
    view, _, prologue = found
    mm = analyze_matmul(view, scaled=True)
    if isinstance(mm, str):
        return mm
    m, n = (const_or(mm.extents[a], 1 << 30) for a in (mm.m, mm.n))
    if min(m, n) > SMALL:
        return f"no small axis: m={m}, n={n} both exceed {SMALL}"
    small, big = (mm.m, mm.n) if m <= n else (mm.n, mm.m)
    weight, weight_contig = (mm.b, mm.b_contig) if big == mm.n else (mm.a, mm.a_contig)
    # Batch axes the weight is broadcast over (a linear layer's X[b, s, k] against W[n, k]) join the small
    # side while a thread's partials fit (MAX_LANES rows): each weight element it loads serves every one.
    weight_axes = {ax for acc in accesses(view.block(mm.main)) if acc.buffer == weight for ax in acc.axes}
    shared = [b for b in mm.batch if b in weight_axes]
    broadcast = [b for b in mm.batch if b not in weight_axes]
    vectors = math.prod(const_or(mm.extents[b], 1 << 30) for b in broadcast) * min(m, n)
    smalls, rows, split = (small,), (*mm.batch, big), None
    if broadcast and vectors <= MAX_LANES:
        smalls, rows = (*broadcast, small), (*shared, big)
    elif len(broadcast) == 1 and all(as_int(mm.extents[a]) is not None for a in (*shared, big, *broadcast)):
        # more rows than lanes: passes of as many rows as divide the batch and fit, each reading the weight once
        B = as_int(mm.extents[broadcast[0]]) or 1
        lanes = max((d for d in range(1, MAX_LANES // min(m, n) + 1) if B % d == 0), default=1)
        if lanes > 1:
            smalls, rows, split = (broadcast[0], small), (*shared, big), (broadcast[0], lanes)
    return ReductionFacts(mm.main, rows, smalls, (mm.k,), weight_contig == mm.k, mm.epilogue, mm.in_bytes,
                          prologue, split)


def lane_sizes(func: Func, facts: ReductionFacts) -> dict[str, int]:
    """Per small axis, the activation rows one pass holds a partial for (a split axis: its lanes).  Small
    axes are constant: analyze_gemv plans a symbolic one as too large to be small."""
    blk = func.block(facts.main)
    sizes = {a: const_or(blk.axis(a).extent, 1) for a in facts.small}
    if facts.lane_split is not None:
        sizes[facts.lane_split[0]] = facts.lane_split[1]
    return sizes


class GemvRule(Rule):
    name = "gemv"

    def analyze(self, func: Func, target: HardwareProfile) -> ReductionFacts | str:
        return analyze_gemv(func)

    def _facts(self, func: Func) -> ReductionFacts:
        return self._require(analyze_gemv(func))

    def space(self, func: Func, target: Any) -> Space:
        facts = self._facts(func)
        limit = target.max_threads_per_block
        if facts.inner:
            knobs = (Knob("rows_per_block", (1, 2, 4, 8), "weight rows per thread block (threadIdx.y)"),
                     Knob("threads_k", pow2_range(32, 512), "threads splitting one row's reduction"),
                     Knob("vector", (1, 2, 4, 8), "consecutive elements each thread loads per step"))

            def check(c: Config) -> str | None:
                threads = c["rows_per_block"] * c["threads_k"]
                return None if threads <= limit else f"{threads} threads exceed {limit}"
        else:
            return outer_space(self.name, target)
        return Space(self.name, knobs, check)

    def default_config(self, func: Func, target: Any) -> Config:
        """16-byte loads per thread, a full warp or more per row, ~256 threads per block.  With four or more
        activation rows (lanes) two warps per weight row, eight rows per block: each thread then walks its row
        in more steps with its lanes' loads in flight, where 256 threads on one row take two steps and wait
        a memory round trip for each (the carver's model puts a batch-8 GEMV over a 14336 x 4096 weight at
        109 us that way, 36 us this way, on the H100 profile; batch 1 and 2 keep the wide rows, at the DRAM
        floor).  Two warps rather than one, and half the vector past 8 lanes: ptxas spilled 4-8 B of the
        one-warp fp16/bf16 batch-8 kernel on sm_80, and of 12-16 lanes at full vector width."""
        facts = self._facts(func)
        K = const_or(func.block(facts.main).axis(facts.reduce[0]).extent, 4096)
        vector = max(1, min(8, 16 // facts.in_bytes))
        if facts.inner:
            lanes = math.prod(lane_sizes(func, facts).values())
            if lanes >= 4:  # past 8 lanes, half as wide: a lane's activation vector is registers too
                return {"rows_per_block": 8, "threads_k": 64, "vector": vector if lanes <= 8 else max(1, vector // 2)}
            threads_k = max(32, min(256, ceil_pow2(-(-K // vector))))
            return {"rows_per_block": max(1, min(8, 256 // threads_k)), "threads_k": threads_k, "vector": vector}
        return outer_default()

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        facts = self._facts(func)
        blk = func.block(facts.main)
        full = {a.name: const_or(a.extent, 4096) for a in blk.axes}
        tile = dict.fromkeys(facts.rows, 1) | lane_sizes(func, facts) | {a: full[a] for a in facts.reduce}
        if not facts.inner:
            return outer_tiling(func, facts, config, tile)
        tile[facts.rows[-1]] = config["rows_per_block"]
        threads = config["rows_per_block"] * config["threads_k"]
        step = config["threads_k"] * config["vector"]
        return Tiling(facts.main, tile, {facts.rows[-1]: 1}, {facts.reduce[0]: step}, threads,
                      4 * threads, 32 + 2 * config["vector"], config["vector"])

    def schedule(self, func: Func, facts: ReductionFacts, config: Config, target: HardwareProfile) -> Schedule:
        return schedule_cross_thread(func, facts, config)
