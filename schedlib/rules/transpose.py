"""Transpose rule: ``Y[.., j, i] = X[.., i, j]`` through a shared-memory tile padded against bank conflicts.

Threads read the tile along X's contiguous axis and write it along Y's contiguous axis, so both global
accesses are coalesced; the padding (``storage_align``) makes the column-wise shared reads conflict-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.dtype import BYTES
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import accesses, stores_plainly
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling


@dataclass(frozen=True)
class TransposeFacts:
    block: str
    source: str
    out_last: str  # Y's contiguous axis
    in_last: str  # X's contiguous axis
    in_bytes: int


def analyze_transpose(func: Func) -> TransposeFacts | str:
    if len(func.blocks) != 1:
        return f"needs a single stage, found {len(func.blocks)}"
    (blk,) = func.blocks
    accs = accesses(blk)
    if blk.reducer is not None or not stores_plainly(blk) or len(accs) != 1 or not accs[0].plain:
        return f"block {blk.name} is not a plain copy of one buffer"
    acc = accs[0]
    axes = [a.name for a in blk.axes]
    if len(axes) < 2 or sorted(acc.axes) != sorted(axes) or acc.axes[-1] == axes[-1]:
        return f"block {blk.name} does not move the contiguous axis"
    return TransposeFacts(blk.name, acc.buffer, axes[-1], acc.axes[-1], BYTES[func.buffer(acc.buffer).dtype])


class TransposeRule(Rule):
    name = "transpose"

    def analyze(self, func: Func, target: HardwareProfile) -> TransposeFacts | str:
        return analyze_transpose(func)

    def _facts(self, func: Func) -> TransposeFacts:
        return self._require(analyze_transpose(func))

    def space(self, func: Func, target: Any) -> Space:
        self._facts(func)
        return Space(self.name, (
            Knob("tile", (16, 32, 64), "square tile edge staged in shared memory"),
            Knob("rows_per_thread", (1, 2, 4, 8), "tile rows each thread copies"),
            Knob("pad", (0, 1), "extra element per shared row against bank conflicts"),
        ), lambda c: None if c["rows_per_thread"] <= c["tile"] and c["tile"] * c["tile"] // c["rows_per_thread"]
           <= target.max_threads_per_block else "too many threads per block")

    def default_config(self, func: Func, target: Any) -> Config:
        self._facts(func)
        return {"tile": 32, "rows_per_thread": 4, "pad": 1}

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        facts = self._facts(func)
        blk = func.block(facts.block)
        t = config["tile"]
        tile = {a.name: (t if a.name in (facts.out_last, facts.in_last) else 1) for a in blk.axes}
        threads = t * t // config["rows_per_thread"]
        return Tiling(facts.block, tile, {}, {}, threads, t * (t + config["pad"]) * facts.in_bytes, 32)

    def schedule(self, func: Func, facts: TransposeFacts, config: Config, target: HardwareProfile) -> Schedule:
        t, rpt = config["tile"], config["rows_per_thread"]
        s = Schedule(func)
        loops = dict(zip([a.name for a in func.block(facts.block).axes], s.get_loops(facts.block)))
        oo, oi = s.split(loops[facts.out_last], [None, t])  # Y's contiguous axis -> threadIdx.x
        io, ii = s.split(loops[facts.in_last], [None, t])
        iy, ir = s.split(ii, [None, rpt])
        rest = [lp for a, lp in loops.items() if a not in (facts.out_last, facts.in_last)]
        bz = s.fuse(*rest) if len(rest) > 1 else (rest[0] if rest else None)
        s.reorder(*([bz] if bz else []), io, oo, iy, oi, ir)
        if bz:
            s.bind(bz, "blockIdx.z")
        s.bind(io, "blockIdx.y")
        s.bind(oo, "blockIdx.x")
        s.bind(iy, "threadIdx.y")
        s.bind(oi, "threadIdx.x")
        s.unroll(ir)
        shared = s.cache_read(facts.block, facts.source, "shared")
        s.compute_at(shared, oo)
        fused = s.fuse(*s.get_loops(shared))
        _, fy, fx = s.split(fused, [None, t // rpt, t])
        s.bind(fy, "threadIdx.y")
        s.bind(fx, "threadIdx.x")
        if config["pad"]:
            ndim = len(func.buffer(facts.source).shape)
            s.storage_align(shared, ndim - 2, t, 1)  # row stride t + 1
        return s
