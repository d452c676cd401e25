"""ElementWise rule: a chain of element-wise stages fused into one kernel per output, vectorized.

Every intermediate stage is inlined into its consumers (but one that would make a consumer's expression too
large, which stays a kernel of its own); each output's loops are fused into one flat loop
split as (blocks, threads, vector) so that consecutive threads touch consecutive vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.dtype import BYTES
from schedlib.ir.func import Func
from schedlib.ir.primitives.inline import INLINE_NODE_LIMIT, largest_after_inline
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import is_elementwise
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range


@dataclass(frozen=True)
class ElementwiseFacts:
    outputs: tuple[str, ...]
    intermediates: tuple[str, ...]


def analyze_elementwise(func: Func) -> ElementwiseFacts | str:
    for b in func.blocks:
        if not is_elementwise(b):
            return f"block {b.name} ({b.kinds}) is not element-wise"
    outputs = tuple(b.name for b in func.blocks if b.store in func.outputs)
    return ElementwiseFacts(outputs, tuple(b.name for b in func.blocks if b.name not in outputs))


class ElementwiseRule(Rule):
    name = "elementwise"

    def analyze(self, func: Func, target: HardwareProfile) -> ElementwiseFacts | str:
        return analyze_elementwise(func)

    def _facts(self, func: Func) -> ElementwiseFacts:
        return self._require(analyze_elementwise(func))

    def space(self, func: Func, target: Any) -> Space:
        self._facts(func)
        return Space(self.name, (
            Knob("threads", pow2_range(64, target.max_threads_per_block), "threads per block"),
            Knob("vector", (1, 2, 4, 8), "consecutive elements per thread"),
        ))

    def default_config(self, func: Func, target: Any) -> Config:
        """256 threads, each moving 16 bytes per access of the widest array (4 fp32, 8 fp16 elements)."""
        self._facts(func)
        widest = max(BYTES[func.buffer(n).dtype] for n in (*func.inputs, *func.outputs))
        return {"threads": 256, "vector": max(1, min(8, 16 // widest))}

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        out = func.block(self._facts(func).outputs[0])
        tile = {a.name: 1 for a in out.axes}
        tile[out.axes[-1].name] = config["threads"] * config["vector"]
        return Tiling(out.name, tile, {}, {}, config["threads"], 0, 16 + 2 * config["vector"], config["vector"])

    def schedule(self, func: Func, facts: ElementwiseFacts, config: Config, target: HardwareProfile) -> Schedule:
        s = Schedule(func)
        kept = []
        for name in reversed(facts.intermediates):
            # a stage its consumer reads more than once (gelu, silu) doubles that consumer with each one inlined:
            # where the chain would outgrow the limit, this stage stays, a kernel of its own (one more round trip
            # through memory, against an expression of millions of nodes)
            if largest_after_inline(s.func, name) > INLINE_NODE_LIMIT:
                kept.append(name)
            else:
                s.compute_inline(name)
        for name in (*reversed(kept), *facts.outputs):
            loops = s.get_loops(name)
            flat = s.fuse(*loops) if len(loops) > 1 else loops[0]
            bx, tx, v = s.split(flat, [None, config["threads"], config["vector"]])
            s.bind(bx, "blockIdx.x")
            s.bind(tx, "threadIdx.x")
            if config["vector"] > 1:
                s.vectorize(v)
        return s
