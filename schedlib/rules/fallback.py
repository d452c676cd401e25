"""Fallback rule: any valid Func gets a correct, bound schedule.

Each stage becomes its own kernel: its spatial loops are moved outermost, fused and spread over blocks of
``threads`` threads; reduction loops run sequentially inside each thread.  Slow but always right.
"""

from __future__ import annotations

import math
from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import const_or
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range


class FallbackRule(Rule):
    name = "fallback"

    def analyze(self, func: Func, target: HardwareProfile) -> bool:
        return True

    def space(self, func: Func, target: Any) -> Space:
        return Space(self.name, (Knob("threads", pow2_range(32, target.max_threads_per_block),
                                      "threads per block over the fused spatial loops"),))

    def default_config(self, func: Func, target: Any) -> Config:
        return {"threads": 256}

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling | None:
        """The carver's view of the stage with the most work (outputs x reduced elements): a block of
        ``threads`` consecutive outputs, mostly along the innermost spatial axis, each thread walking its
        reduction one element per step (every step a round trip to memory)."""
        main = max(func.blocks, key=lambda b: math.prod(const_or(a.extent, 4096) for a in b.axes))
        spatial = [a for a in main.axes if a.kind == "S"]
        tile = {a.name: (const_or(a.extent, 4096) if a.kind == "R" else 1) for a in main.axes}
        left = config["threads"]
        for a in reversed(spatial):  # the fused index runs fastest along the innermost axis
            take = min(left, const_or(a.extent, 4096))
            tile[a.name] = take
            left = max(1, left // take)
        thread = {a.name: 1 for a in spatial}
        step = {a.name: 1 for a in main.axes if a.kind == "R"}
        return Tiling(main.name, tile, thread, step, config["threads"], 0, 32)

    def schedule(self, func: Func, facts: Any, config: Config, target: HardwareProfile) -> Schedule:
        s = Schedule(func)
        for blk in func.blocks:
            loops = s.get_loops(blk.name)
            kinds = [blk.loop_kind(lp) for lp in loops]
            spatial = [lp for lp, k in zip(loops, kinds) if k != "R"]
            reduce = [lp for lp, k in zip(loops, kinds) if k == "R"]
            if not spatial:
                continue  # a reduction to one value: a single thread does it
            if reduce and loops != spatial + reduce:
                s.reorder(*spatial, *reduce)
            flat = s.fuse(*spatial) if len(spatial) > 1 else spatial[0]
            bx, tx = s.split(flat, [None, config["threads"]])
            s.bind(bx, "blockIdx.x")
            s.bind(tx, "threadIdx.x")
        return s
