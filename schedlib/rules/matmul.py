"""Matmul rule: C[b.., m, n] = sum_k A * B (any operand layout), with a fused element-wise epilogue.

``tensor_core=False`` is the SIMT template (:mod:`schedlib.rules.matmul_simt`: register-tiled threads over
shared A and B tiles, the epilogue applied in registers).  ``tensor_core=True`` selects the mma.sync template of
:mod:`schedlib.rules.matmul_tc` (fp16/bf16 on sm_80+), which adds the ``stages`` and ``raster`` knobs;
``tensor_core="wgmma"`` the Hopper warpgroup-MMA variant of it (:mod:`schedlib.rules.matmul_wgmma`, sm_90a).

One space holds all three templates.  A knob value only some of them read (``vector`` for SIMT; ``stages`` and
``raster`` for tensor cores; ``block_n=256``, ``block_k=64`` and ``thread_n`` 32/64 for wgmma) is refused in
the others, so no two legal points build the same kernel; the thread tile means the accumulators per thread
in all of them.  Where the tensor-core path cannot exist (fp32, a GPU without mma.m16n8k16, a computed
operand) its knobs have that single value; where only the operand layout rules it out (rows not 16-byte
aligned), ``tensor_core=True`` stays listed and ``check`` says why it is illegal.  Split-K: matmul_split_k.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from schedlib.errors import ScheduleError
from schedlib.hw import HardwareProfile
from schedlib.ir.expr import as_int
from schedlib.ir.func import GRID_YZ_LIMIT, Func
from schedlib.ir.schedule import Schedule
from schedlib.rules import matmul_simt as simt
from schedlib.rules import matmul_split_k as sk
from schedlib.rules import matmul_tc as tc
from schedlib.rules import matmul_wgmma as wg
from schedlib.rules.analysis import ceil_pow2, const_or, shrink_to_fill, tile_count
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range
from schedlib.rules.gemv import analyze_gemv
from schedlib.rules.matmul_facts import MatmulFacts, analyze_matmul

# The tensor-core templates' ``tensor_core`` knob values by the names a profile's ``disabled_templates`` uses
# (schedlib.hw.profile.TEMPLATE_NAMES), in the order the rule prefers them.
TEMPLATE_VALUES: dict[str, bool | str] = {"wgmma_tma": wg.TMA_TEMPLATE, "wgmma": wg.INSTRUCTION,
                                          "wgmma_ws": wg.PRODUCER_TEMPLATE, "mma_sync": True}


def _enabled(values: tuple[bool | str, ...], target: Any) -> tuple[bool | str, ...]:
    """The ``tensor_core`` values whose templates the target has not turned off (``disabled_templates``)."""
    off = [TEMPLATE_VALUES[name] for name in target.disabled_templates]
    return tuple(v for v in values if v is False or v not in off)


class MatmulRule(Rule):
    name = "matmul"
    small_dim = 8  # an m or n extent at most this is a GEMV's job

    def analyze(self, func: Func, target: HardwareProfile) -> MatmulFacts | str:
        return self._analysis(func)

    def _analysis(self, func: Func) -> MatmulFacts | str:
        """The matmul facts, or why not: no matmul, or an m or n side a GEMV's (the target plays no part)."""
        facts = analyze_matmul(func)
        if isinstance(facts, str):
            return facts
        # a small side is the GEMV rule's, unless it cannot take the operands (a relu(X) prologue)
        gemv_takes = not facts.prologue or not isinstance(analyze_gemv(func), str)
        for ax in (facts.m, facts.n):
            v = const_or(facts.extents[ax], 1 << 30)
            if v <= self.small_dim and gemv_takes:
                return f"axis {ax} has extent {v} <= {self.small_dim}: a matrix-vector product (GEMV rule)"
        return facts

    def space(self, func: Func, target: Any) -> Space:
        facts = self._facts(func)
        # cp.async and the TMA copy global memory as it is: a computed operand (a prologue) is SIMT's
        has_tc = tc.unavailable(func, facts, target) is None and not facts.prologue
        layout_why = tc.misaligned(func, facts) if has_tc else None
        tc_knobs = has_tc and layout_why is None
        hopper = has_tc and wg.available(target)

        rows = as_int(facts.extents[facts.m])
        batch = math.prod(const_or(facts.extents[b], 1) for b in facts.batch)
        outputs = batch * const_or(facts.extents[facts.m], 1) * const_or(facts.extents[facts.n], 1)

        def split_reason(c: Config) -> str | None:
            split = c["split_k"]
            if split == 1:
                return None
            if c["tensor_core"] and (why := sk.tensor_core_reason(c, facts)):
                return why
            if split * batch > GRID_YZ_LIMIT:
                return f"split_k={split} x {batch} batches exceed the grid's {GRID_YZ_LIMIT} along z"
            if split * outputs >= sk.PARTIALS_LIMIT:
                return (f"split_k={split} x {outputs:,} outputs of partial results reach 2^31 elements, past the "
                        f"kernels' 32-bit offsets")
            return None

        def check(c: Config) -> str | None:
            why = split_reason(c)
            if why:
                return why
            if c["tensor_core"] and facts.a == facts.b:
                return (f"{facts.a} is read as both operands: the tensor-core templates stage two distinct "
                        "operand buffers; the SIMT template stages each read")
            if c["tensor_core"] and rows is not None and -(-rows // c["block_m"]) > GRID_YZ_LIMIT:
                # the tensor-core kernels give each block row its own blockIdx.y (the SIMT kernel strides)
                return f"{-(-rows // c['block_m'])} block rows exceed the grid's {GRID_YZ_LIMIT} along y"
            if wg.is_wgmma(c["tensor_core"]):
                return layout_why or wg.check(c, facts, target)
            exclusive = wg.exclusive_reason(c) if hopper else None
            if exclusive:
                return exclusive
            if not c["tensor_core"]:
                return simt.check(c, facts, target)
            return layout_why or tc.check(c, facts, target)

        return Space(self.name, (
            Knob("block_m", pow2_range(16, 128), "output rows per thread block"),
            Knob("block_n", pow2_range(16, 256 if hopper else 128), "output columns per thread block"),
            Knob("block_k", (8, 16, 32, *((64,) if hopper else ())),
                 "reduction slice staged in shared memory per step"),
            Knob("thread_m", (1, 2, 4, 8), "accumulator rows per thread (tensor cores: warp tile of 8x rows)"),
            Knob("thread_n", (1, 2, 4, 8, *((16,) if tc_knobs else ()), *((32, 64) if hopper else ())),
                 "accumulator columns per thread (tensor cores: warp tile of 4x columns)"),
            Knob("vector", (1, 2, 4), "elements per thread per copy into shared memory (SIMT)"),
            Knob("split_k", sk.splits(facts), "slices of K computed by separate blocks and added by a second "
                 "kernel (offered where K is long against the output; 1: one kernel)"),
            Knob("stages", tc.STAGES if tc_knobs else simt.STAGES, "shared tiles in flight: the cp.async pipeline "
                 "depth on tensor cores; SIMT 2 double-buffers, loading the next tile while computing on this one"),
            Knob("tensor_core", _enabled((False, True, *((wg.INSTRUCTION, wg.TMA_TEMPLATE, wg.PRODUCER_TEMPLATE)
                                                         if hopper else ())) if has_tc else (False,), target),
                 "tensor cores: False (SIMT), True (mma.sync), 'wgmma' (Hopper warpgroup MMA, sm_90a), "
                 "'wgmma_tma' (the same fed by the TMA), 'wgmma_ws' (TMA from a producer warp); a profile's "
                 "disabled_templates leave theirs out"),
            Knob("raster", tc.RASTER if tc_knobs else (1,), "block rows walked together for L2 reuse (tensor cores)"),
        ), check)

    def _facts(self, func: Func) -> MatmulFacts:
        return self._require(self._analysis(func))

    def default_config(self, func: Func, target: Any) -> Config:
        """Largest block tile that still gives every SM a block, shrunk for small problems; on tensor cores
        when the space has them (wgmma on Hopper, see :func:`matmul_wgmma.default`, else mma.sync, see
        :func:`matmul_tc.default`), else a register-blocked SIMT tile: small tiles with deep k steps short of
        a wave of blocks, and with a wave or more the tile whose busiest SM has the least work
        (:func:`matmul_simt.balanced_tile`)."""
        return self.template_default(func, target, None)

    def seed_configs(self, func: Func, target: Any) -> list[Config]:
        """The default and, where the space offers split-K beside tensor cores, the other side's default (if it
        has a legal point) too: the carver's growth from one side does not reach the other."""
        space = self.space(func, target)
        seeds = [self.default_config(func, target)]
        templates = [v for v in (*wg.TEMPLATES, True) if v in space.knob("tensor_core").values]
        if space.knob("split_k").values[-1] > 1 and templates:
            other = False if seeds[0]["tensor_core"] is not False else templates[0]
            with contextlib.suppress(ValueError):  # rows not 16-byte aligned: no legal point of that template
                seeds.append(self.template_default(func, target, other))
        return seeds

    def template_default(self, func: Func, target: Any, template: bool | str | None) -> Config:
        """The default of one template (``tensor_core`` value ``False``, ``True`` or ``"wgmma"``; None: the
        fastest the space has).  A template the space lacks is a ValueError naming the values it has."""
        space = self.space(func, target)
        values = space.knob("tensor_core").values
        if template is not None and template not in values:
            raise ValueError(f"tensor_core={template!r} is not in this matmul's space (it has {list(values)})")
        wanted = [v for v in (*wg.TEMPLATES, True, False) if v in values and (template is None or v == template)]
        facts = self._facts(func)
        M = const_or(facts.extents[facts.m], 4096)
        N = const_or(facts.extents[facts.n], 4096)
        batch = math.prod(const_or(facts.extents[b], 1) for b in facts.batch)
        start = min(128, max(16, ceil_pow2(M))), min(128, max(16, ceil_pow2(N)))  # the output, up to 128 x 128
        bm, bn = shrink_to_fill(M, N, batch, target.sm_count, start, floor=32)
        # A long K over an output of fewer tiles than half the SMs: slices of K fill the GPU where one block
        # per tile would leave it mostly idle.  A tensor-core template that cannot split this K (slices must
        # be whole k steps) gives way to the split SIMT template; the carver rates that so (fp16 128 x 96 x
        # 8192 on h100: 10.8 us against 32.0 us for an unsplit wgmma).
        split_max = space.knob("split_k").values[-1]
        split_wins = (template is None and split_max > 1
                      and tile_count(M, N, batch, (bm, bn)) < target.sm_count // 2)
        k_known = const_or(facts.extents[facts.k], 1)
        # where K splits, tiles stay large (operand reuse) and the slices fill the SMs (as on SIMT, below)
        tc_tile = sk.default_tile(M, N, batch, k_known, target.sm_count, split_max, start) if split_max > 1 \
            else (bm, bn)
        for value in wanted:
            if value is False:
                continue
            # the tensor-core templates' own sizing, and the slices that fill the SMs with its tiles
            config = wg.default(facts, target, tc_tile, value) if wg.is_wgmma(value) else tc.default(
                facts, target, tc_tile)
            if split_max > 1:
                config, short = sk.tensor_core_default(config, facts, target.sm_count,
                                                       tile_count(M, N, batch, (config["block_m"], config["block_n"])),
                                                       split_max)
                if split_wins and short:
                    continue  # this K splits too little on tensor cores (say K = 8000: whole k steps of 64)
                if template is None and value == wg.TMA_TEMPLATE and config["split_k"] > 1 \
                        and wg.PRODUCER_TEMPLATE in values:
                    # Slices of K on Hopper: the producer warp's kernel, measured on an H200 (2026-11-28, two
                    # runs): fp16 256 x 256 x 65536 split 16 40.2 and 39.7 us against 45.3 and 45.5 us for this
                    # one; unsplit the two tie (4096^3: 193.3 and 192.2 us), and this one stays first there.
                    with contextlib.suppress(ValueError):
                        producer = self.template_default(func, target, wg.PRODUCER_TEMPLATE)
                        if producer["split_k"] > 1:
                            return producer
            # then smaller warp tiles: a profile's register cap (max_registers_per_thread) may refuse the sized one
            for candidate in (config, {**config, "raster": 1}, *tc.smaller_warp_tiles(config)):
                if space.is_legal(candidate):
                    return candidate
        if template not in (None, False):  # that template's sizing did not fit: its first legal point
            first = next((c for c in space.enumerate() if c["tensor_core"] == template
                          and type(c["tensor_core"]) is type(template)), None)
            if first is None:  # say why the template's own default is refused (two batch axes for the TMA...)
                raise ValueError(f"this matmul has no legal tensor_core={template!r} config: "
                                 f"{space.reason(config)}")
            return first
        config, legal = simt.default(facts, target, space, start, (bm, bn))
        if legal:
            return config
        first = next(space.enumerate(), None)
        if first is None:  # a profile whose limits no tile meets (a handful of registers per thread...)
            raise ScheduleError("matmul.default_config", "target", target.key,
                                f"no config of this matmul's space is legal on it; the SIMT default is refused "
                                f"because {space.reason(config)}")
        return first

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        facts = self._facts(func)
        if wg.is_wgmma(config["tensor_core"]):
            return wg.tiling(facts, config)
        if config["tensor_core"]:
            return tc.tiling(facts, config)
        return simt.tiling(facts, config)

    def schedule(self, func: Func, facts: MatmulFacts, config: Config, target: HardwareProfile) -> Schedule:
        if config["tensor_core"]:
            return tc.schedule(func, facts, config)
        return simt.schedule(func, facts, config)
