"""Model-only rules for shapes whose real rules have not landed (GEMV, row-wise softmax).

The carver needs nothing from a rule but its knob space and ``tiling``; these two give plausible
templates for a warp-cooperative GEMV and a one-row-per-block softmax so the model can be checked on
non-matmul shapes now.  ``schedule`` returns the unscheduled func: they are never built.
``StagedTiling`` shows the one field the carver would like in :class:`Tiling`: which buffers are staged
in shared memory (here: none, the shared memory holds cross-warp partial sums).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func
from schedlib.ir.reference import evaluate_int
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range
from schedlib.rules.matmul import MatmulRule


@dataclass(frozen=True)
class StagedTiling(Tiling):
    shared_buffers: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReductionFacts:
    main: str
    spatial: tuple[str, ...]
    k: str
    K: int


class FakeGemvRule(Rule):
    """Each block computes ``rows`` outputs; the block's threads split the K loop, ``vector`` wide."""

    name = "fake_gemv"

    def analyze(self, func: Func, target: HardwareProfile) -> ReductionFacts | str:
        reductions = [b for b in func.blocks if b.reducer is not None]
        if len(reductions) != 1 or reductions[0].kinds.count("R") != 1:
            return "needs one reduction block with one reduce axis"
        main = reductions[0]
        k = next(a for a in main.axes if a.kind == "R")
        return ReductionFacts(main.name, tuple(a.name for a in main.axes if a.kind == "S"), k.name,
                              evaluate_int(k.extent, {s: 4096 for s in func.symbols}))

    def space(self, func: Func, target: Any) -> Space:
        facts = self.analyze(func, target)
        assert not isinstance(facts, str)

        def check(c: Config) -> str | None:
            if c["threads"] % c["rows"]:
                return "threads must split evenly over rows"
            if (c["threads"] // c["rows"]) * c["vector"] > facts.K:
                return "more lanes than K"
            return None

        return Space(self.name, (
            Knob("rows", (1, 2, 4, 8, 16, 32)),
            Knob("threads", pow2_range(32, target.max_threads_per_block)),
            Knob("vector", (1, 2, 4, 8)),
        ), check)

    def default_config(self, func: Func, target: Any) -> Config:
        return {"rows": 1, "threads": 256, "vector": 8}

    def schedule(self, func: Func, facts: Any, config: Config, target: HardwareProfile) -> Schedule:
        return Schedule(func)

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        facts = self.analyze(func, target)
        assert not isinstance(facts, str)
        *outer, n = facts.spatial
        lanes = config["threads"] // config["rows"]
        return StagedTiling(
            main_block=facts.main,
            block_tile={**dict.fromkeys(outer, 1), n: config["rows"], facts.k: facts.K},
            thread_tile={n: 1},
            step={facts.k: lanes * config["vector"]},
            threads=config["threads"],
            shared_bytes=config["threads"] * 4,
            registers=32 + 2 * config["vector"],
            vector=config["vector"],
        )


class FakeRowwiseRule(Rule):
    """Softmax-like funcs: each block owns ``rows`` whole rows, held in registers across the stages."""

    name = "fake_rowwise"

    def analyze(self, func: Func, target: HardwareProfile) -> str | tuple[str, str, str]:
        last = func.blocks[-1]
        if last.kinds != "SS" or not any(b.reducer for b in func.blocks):
            return "needs reductions followed by a 2-d element-wise output stage"
        i, j = (a.name for a in last.axes)
        return last.name, i, j

    def space(self, func: Func, target: Any) -> Space:
        return Space(self.name, (
            Knob("rows", (1, 2, 4)),
            Knob("threads", pow2_range(32, target.max_threads_per_block)),
            Knob("vector", (1, 2, 4)),
        ), lambda c: None if self._per_thread(func, c) <= 128 else "row does not fit in registers")

    def _per_thread(self, func: Func, c: Config) -> int:
        cols = evaluate_int(func.blocks[-1].axes[1].extent, {s: 4096 for s in func.symbols})
        return -(-cols * c["rows"] // c["threads"])

    def default_config(self, func: Func, target: Any) -> Config:
        return {"rows": 1, "threads": 1024, "vector": 4}

    def schedule(self, func: Func, facts: Any, config: Config, target: HardwareProfile) -> Schedule:
        return Schedule(func)

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        main, i, j = self.analyze(func, target)  # type: ignore[misc]
        cols = evaluate_int(func.blocks[-1].axes[1].extent, {s: 4096 for s in func.symbols})
        per_thread = self._per_thread(func, config)
        return StagedTiling(
            main_block=main,
            block_tile={i: config["rows"], j: cols},
            thread_tile={i: 1, j: per_thread},
            step={},
            threads=config["threads"],
            shared_bytes=config["threads"] * 4,
            registers=min(255, 40 + per_thread),
            vector=config["vector"],
        )


class TensorCoreMatmul(MatmulRule):
    """The matmul space with the tensor-core knob switched on and no legality check, for the tensor-core
    parts of the model: it prices configs the real space rejects (a k-step of 8, bf16 on a V100)."""

    name = "tc_matmul"

    def space(self, func: Func, target: Any) -> Space:
        base = super().space(func, target)
        knobs = tuple(Knob(k.name, (True,)) if k.name == "tensor_core" else k for k in base.knobs)
        return Space(self.name, knobs, None)
