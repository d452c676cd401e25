"""Fallback rule: any valid Func gets a correct, bound schedule.

Each stage becomes its own kernel: its spatial loops are moved outermost, fused and spread over blocks of
``threads`` threads; reduction loops run sequentially inside each thread.  Slow but always right.
"""

from __future__ import annotations

from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
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
        return None

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
