"""Hopper half of the matmul rule's tensor-core template: ``tensor_core="wgmma"`` (sm_90a).

Same knobs, same warp-tiled loop nest as :mod:`schedlib.rules.matmul_tc` (so the reference executor runs it
unchanged); what differs is the instruction codegen lowers it to (:mod:`schedlib.codegen.wgmma`):

* a warp tile is 16 rows (``thread_m=2``) by ``4 * thread_n`` columns, and 4 warps stacked along m form one
  warpgroup issuing ``wgmma.m64nNk16`` with N = the warp tile's width (16..256), so ``block_m`` is a multiple
  of 64 and the block has ``block_m / 64 * block_n / N`` warpgroups;
* operands are read by the tensor cores straight from shared memory in the canonical swizzled layouts, so
  ``block_k`` is 16, 32 or 64 (K-major rows of 32/64/128 bytes) and every ring slot is 1 KiB-aligned;
* the ring may use the opt-in shared memory (up to 227 KiB on H100), so 4 stages of 128x256x64 fit.

Its second value, ``tensor_core="wgmma_tma"``, is the same kernel with the ring fed by the Tensor Memory
Accelerator (:mod:`schedlib.codegen.tma`): one thread requests each k step's tiles, mbarriers track their
bytes, and the other threads no longer spend issue slots on copies.  It is the Hopper default.  The third,
``tensor_core="wgmma_ws"``, adds a producer warp to that kernel (:mod:`schedlib.codegen.warp_specialized`):
the accumulator warps release ring slots through mbarriers instead of meeting at a block barrier every k
step, and the ring runs one tile further ahead.  It needs 2 stages or more.

This template owns ``block_n=256``, ``block_k=64`` and ``thread_n`` 32/64 in the shared space: the SIMT and
mma.sync templates refuse them, so no two legal points build the same kernel.
"""

from __future__ import annotations

from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.hw.registers import PRODUCER_THREADS, producer_register_split
from schedlib.rules import matmul_tc as tc
from schedlib.rules.analysis import const_or
from schedlib.rules.base import Config, Tiling

INSTRUCTION = "wgmma"
TMA_TEMPLATE = "wgmma_tma"  # the same kernel, operand tiles requested through the TMA
PRODUCER_TEMPLATE = "wgmma_ws"  # TMA requests from a producer warp (warp-specialized)
TEMPLATES = (TMA_TEMPLATE, INSTRUCTION, PRODUCER_TEMPLATE)  # the knob values of this file, preferred first
TMA_FED = (TMA_TEMPLATE, PRODUCER_TEMPLATE)
MIN_CC = (9, 0)
WARPGROUP_ROWS = 64
N_VALUES = (16, 32, 64, 128, 256)  # wgmma N = warp tile width = 4 * thread_n
BLOCK_K = (16, 32, 64)
ALIGN = 1024  # ring slots start on 1 KiB (128-byte swizzle) boundaries; the allocation carries 1 KiB of slack
STAGE_ROW_PAD = 32  # codegen stages the output tile in shared memory, rows padded by 32 bytes (fp32: widest)
REGISTER_OVERHEAD = 48  # descriptors, copy indices, loop counters (per thread)
TMA_REGISTER_OVERHEAD = 32  # no copy indices: ptxas gave the 64x256 TMA kernel 154 registers (128 accumulators)
EXCLUSIVE = {"block_n": (256,), "block_k": (64,), "thread_n": (32, 64)}  # knob values only wgmma configs take


def is_wgmma(value: Any) -> bool:
    """Whether a ``tensor_core`` knob value is one of this file's templates."""
    return isinstance(value, str) and value in TEMPLATES


def available(target: HardwareProfile) -> bool:
    """Whether the target has Hopper warpgroup MMA (the profile lists it, compute capability 9.0)."""
    return INSTRUCTION in target.tensor_core_shapes and target.cc >= MIN_CC


def shared_bytes(c: Config, in_bytes: int) -> int:
    """The dynamic allocation: each operand's slots rounded to 1 KiB times the stages, or the output tile staged
    over them after the mainloop if that is larger, plus alignment slack (and, fed by TMA, one 8-byte mbarrier
    per slot after them)."""
    slot = sum(-(-rows * c["block_k"] * in_bytes // ALIGN) * ALIGN for rows in (c["block_m"], c["block_n"]))
    staged = c["block_m"] * (c["block_n"] * 4 + STAGE_ROW_PAD)  # as codegen.wgmma.staging_bytes
    barriers = 8 * c["stages"] * {TMA_TEMPLATE: 1, PRODUCER_TEMPLATE: 2}.get(c["tensor_core"], 0)  # full (empty)
    return max(c["stages"] * slot, staged) + barriers + ALIGN


def registers(c: Config) -> int:
    """The accumulators of one 64 x N wgmma (N / 2 per thread) and overhead.  A producer warp that hands its
    registers to the accumulator warps (``setmaxnreg``) needs the block compiled for the register file's whole
    share per thread, and ptxas allots every thread that count whatever the accumulators need (168 at 384
    threads, where the estimate alone said 64): that count is what limits residency."""
    own = 2 * c["thread_n"] + (TMA_REGISTER_OVERHEAD if c["tensor_core"] in TMA_FED else REGISTER_OVERHEAD)
    split = producer_split(c)
    return max(own, split[0]) if split else own


def producer_split(c: Config) -> tuple[int, int] | None:
    """(registers per thread at entry, the accumulator threads' count after setmaxnreg) of a producer-warp
    config whose kernel hands registers over (:func:`schedlib.hw.registers.producer_register_split`), else
    None."""
    if c["tensor_core"] != PRODUCER_TEMPLATE or 4 * c["thread_n"] > c["block_n"] or c["block_m"] < 16:
        return None
    return producer_register_split((c["block_m"] // 16) * (c["block_n"] // (4 * c["thread_n"])) * 32)


def exclusive_reason(c: Config) -> str | None:
    """Why a non-wgmma config may not take one of the wgmma template's own knob values (None: it may not)."""
    for knob, values in EXCLUSIVE.items():
        if c[knob] in values:
            return f"{knob}={c[knob]} belongs to the wgmma template (tensor_core='wgmma')"
    return None


def check(c: Config, facts: Any, target: HardwareProfile) -> str | None:
    """Why a wgmma config cannot run (None when it can)."""
    bm, bn, bk, tm, tn = c["block_m"], c["block_n"], c["block_k"], c["thread_m"], c["thread_n"]
    if c["vector"] != 1:
        return "vector is the SIMT copy width; wgmma configs copy 16 bytes with cp.async and keep vector=1"
    if c["tensor_core"] in TMA_FED and len(facts.batch) > 1:
        return f"{len(facts.batch)} batch axes; the TMA tensor maps here take at most one"
    if c["tensor_core"] == PRODUCER_TEMPLATE and c["stages"] < 2:
        return "a producer warp needs 2 stages or more (the slot of the wgmma group in flight is still read)"
    if tm != 2:
        return f"a wgmma warp tile is 16 rows (thread_m=2; 4 warps make the 64-row warpgroup), got thread_m={tm}"
    wn = 4 * tn
    if wn not in N_VALUES:
        return f"the warp tile width 4*thread_n={wn} is not a wgmma N in {N_VALUES}"
    if bm % WARPGROUP_ROWS:
        return f"block_m={bm} is not a whole number of 64-row warpgroups"
    if wn > bn:
        return f"warp tile width {wn} is wider than block_n={bn}"
    if bk not in BLOCK_K:
        return f"block_k={bk}: K-major wgmma rows are 32, 64 or 128 bytes (block_k in {BLOCK_K})"
    threads = (bm // 16) * (bn // wn) * 32 + (PRODUCER_THREADS if c["tensor_core"] == PRODUCER_TEMPLATE else 0)
    if threads > target.max_threads_per_block:
        return f"{threads} threads per block exceed {target.max_threads_per_block}"
    smem = shared_bytes(c, facts.in_bytes)
    limit = target.max_shared_per_block(opt_in=True)
    if smem > limit:
        return f"{c['stages']} stages need {smem} bytes of shared memory, more than the opt-in {limit}"
    split = producer_split(c)
    if split and split[1] > target.max_registers_per_thread:  # setmaxnreg's counts are fixed in the kernel
        return (f"the producer warp hands the accumulator warps {split[1]} registers per thread (setmaxnreg), more "
                f"than max_registers_per_thread={target.max_registers_per_thread}")
    return tc.fit_reason(c, facts, target, threads, registers(c))


def default(facts: Any, target: HardwareProfile, tile: tuple[int, int], template: str = TMA_TEMPLATE) -> Config:
    """Two warpgroups of 64 x block_n over a 128-row tile, 64-wide k steps (128-byte rows), and the deepest
    ring the opt-in shared memory holds (at most 4): 128x256x64 in 4 stages on a large problem.  Smaller
    problems take 64 rows, and the columns of ``tile`` (the SIMT/mma sizing, at least 64)."""
    m = const_or(facts.extents[facts.m], 4096)
    n = const_or(facts.extents[facts.n], 4096)
    bm = 128 if m > 64 else 64
    bn = 256 if tile[1] >= 128 and n >= 4096 else max(64, tile[1])
    k = const_or(facts.extents[facts.k], 4096)
    bk = 64 if k >= 64 else 32 if k >= 32 else 16
    config = {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": 2, "thread_n": bn // 4, "vector": 1,
              "split_k": 1, "stages": 1, "tensor_core": template, "raster": 1}
    limit = target.max_shared_per_block(opt_in=True)
    k_steps = -(-k // bk)
    config["stages"] = max([s for s in tc.STAGES if shared_bytes({**config, "stages": s}, facts.in_bytes) <= limit
                            and s <= k_steps] or [1])
    resident = tc.blocks_per_sm(config, target, registers(config), shared_bytes(config, facts.in_bytes))
    config["raster"] = tc.raster_for(config, facts, target, resident)
    return config


def tiling(facts: Any, config: Config) -> Tiling:
    """The mma tiling, with the warpgroup's 64 x N tile as its ``warp_tile`` (what one wgmma reads from shared
    memory per k step, for the carver) and the dynamic allocation as its shared memory."""
    base = tc.tiling(facts, config)
    group = {facts.m: WARPGROUP_ROWS, facts.n: 4 * config["thread_n"]}
    stages = config["stages"]
    # tiles requested ahead: a ring of 3+ slots keeps one for the wgmma group in flight, unless a producer warp
    # refills slots as their releases arrive (codegen.wgmma / codegen.warp_specialized)
    ahead = stages - 1 if config["tensor_core"] == PRODUCER_TEMPLATE or stages < 3 else stages - 2
    return Tiling(base.main_block, base.block_tile, base.thread_tile, base.step, base.threads,
                  shared_bytes(config, facts.in_bytes), registers(config), base.vector, base.stages, base.split_k,
                  True, group, base.raster, base.shared_buffers, warpgroup=True,
                  tma=config["tensor_core"] in TMA_FED, ahead=ahead)
