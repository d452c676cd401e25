"""GeneralReduction rule: softmax, layernorm, RMSNorm and kin, recognised by structure.

Pattern: the output block is element-wise over (rows..., cols); every other stage is either a reduction
over ``cols`` that keeps the rows, or element-wise over the output's shape.  One thread block per row:
element-wise intermediates are inlined (recomputed where used), every reduction keeps its per-row result
in a register (cache_write local, then the copy is inlined away) and reduces across the row's threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.dtype import BYTES
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import accesses, ceil_pow2, const_or, is_elementwise, stores_plainly
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range


@dataclass(frozen=True)
class GeneralReductionFacts:
    output: str
    reductions: tuple[str, ...]
    elementwise: tuple[str, ...]
    in_bytes: int
    cols: int


def analyze_general_reduction(func: Func) -> GeneralReductionFacts | str:
    computed = func.blocks
    out = computed[-1]
    if len(func.outputs) != 1 or out.store != func.outputs[0]:
        return "needs a single output written by the last stage"
    reductions = [b for b in computed if b.reducer is not None]
    if not reductions or len(computed) < 2:
        return "needs at least one reduction feeding an element-wise output"
    if not is_elementwise(out) or len(out.axes) < 2:
        return f"output block {out.name} must be element-wise over (rows..., cols)"
    rows = [a.extent for a in out.axes[:-1]]
    cols = out.axes[-1].extent
    for b in computed[:-1]:
        if b.reducer is not None:
            spatial = [a.extent for a in b.axes if a.kind == "S"]
            red = [a.extent for a in b.axes if a.kind == "R"]
            if spatial != rows or red != [cols] or not stores_plainly(b):
                return f"reduction {b.name} does not reduce the output's last axis row by row"
            if any(not acc.plain for acc in accesses(b)):
                return f"reduction {b.name} reads at non-plain indices"
        elif not is_elementwise(b) or [a.extent for a in b.axes] != [*rows, cols]:
            return f"block {b.name} is neither a row reduction nor element-wise over the output shape"
    x = next(iter(func.inputs))
    return GeneralReductionFacts(out.name, tuple(b.name for b in reductions),
                                 tuple(b.name for b in computed[:-1] if b.reducer is None),
                                 BYTES[func.buffer(x).dtype], const_or(cols, 4096))


class GeneralReductionRule(Rule):
    name = "general_reduction"

    def analyze(self, func: Func, target: HardwareProfile) -> GeneralReductionFacts | str:
        return analyze_general_reduction(func)

    def _facts(self, func: Func) -> GeneralReductionFacts:
        facts = analyze_general_reduction(func)
        if isinstance(facts, str):
            raise ValueError(f"general_reduction rule does not apply: {facts}")
        return facts

    def space(self, func: Func, target: Any) -> Space:
        limit = target.max_threads_per_block
        return Space(self.name, (
            Knob("threads", pow2_range(32, limit), "threads per row (one thread block per row)"),
            Knob("unroll", (1, 2, 4, 8), "consecutive elements each thread handles per step (one vector access "
                 "when aligned and at most 16 bytes)"),
        ))

    def default_config(self, func: Func, target: Any) -> Config:
        """About 8 columns per thread; each step a 16-byte run per thread where the row holds enough of them
        (4 fp32 or 8 fp16 columns), else 4 columns, else 1."""
        facts = self._facts(func)
        threads = min(max(32, min(1024, ceil_pow2(-(-facts.cols // 8)))), target.max_threads_per_block)
        unroll = next((u for u in (16 // facts.in_bytes, 4) if u <= 8 and facts.cols >= u * threads), 1)
        return {"threads": threads, "unroll": unroll}

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        facts = self._facts(func)
        out = func.block(facts.output)
        tile = {a.name: 1 for a in out.axes[:-1]} | {out.axes[-1].name: facts.cols}
        return Tiling(facts.output, tile, {}, {out.axes[-1].name: config["threads"] * config["unroll"]},
                      config["threads"], 4 * config["threads"], 40, _vector_width(config["unroll"], facts.in_bytes))

    def schedule(self, func: Func, facts: GeneralReductionFacts, config: Config,
                 target: HardwareProfile) -> Schedule:
        s = Schedule(func)
        for name in facts.elementwise:
            s.compute_inline(name)
        for name in facts.reductions:
            copy = s.cache_write(name, "local")
            s.compute_inline(copy)
        T, U = config["threads"], config["unroll"]
        loops = s.get_loops(facts.output)
        row = s.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        jo, jt, ju = s.split(loops[-1], [None, T, U]) if U > 1 else (*s.split(loops[-1], [None, T]), None)
        s.reorder(row, jt, jo)
        s.bind(row, "blockIdx.x")
        s.bind(jt, "threadIdx.x")
        vectorize = _vector_width(U, facts.in_bytes) > 1
        for name in reversed(facts.reductions):
            s.compute_at(name, row)
            k = s.get_loops(name)[-1]
            if vectorize:  # the same U consecutive columns per thread and step as the output stage
                ko, kt, kv = s.split(k, [None, T, U])
                s.reorder(kt, ko, kv)
                s.vectorize(kv)
            else:
                ko, kt = s.split(k, [None, T])
                s.reorder(kt, ko)
            s.bind(kt, "threadIdx.x")
        if ju is not None:
            (s.vectorize if vectorize else s.unroll)(ju)
        return s


def _vector_width(unroll: int, in_bytes: int) -> int:
    """Elements per load when a thread's ``unroll`` consecutive elements make one 4/8/16-byte access."""
    return unroll if unroll > 1 and unroll * in_bytes in (4, 8, 16) else 1
