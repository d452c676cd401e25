"""Tensor-core half of the matmul rule: when the path exists, its legality, its default, tiling and schedule.

The template (CUTLASS-like, sm_80+): a block tile of block_m x block_n outputs computed by warps that each
own a (8 * thread_m) x (4 * thread_n) warp tile of ``mma.sync.m16n8k16`` results with fp32 accumulators in
registers.  The thread tile keeps its SIMT meaning - the accumulators one thread holds - so ``threads =
(block_m / thread_m) * (block_n / thread_n)`` on both paths; only their layout differs (an mma lane holds
rows ``g, g + 8`` and columns ``2t, 2t + 1`` of every 16 x 8 tile).  A and B tiles of block_k move global ->
shared with 16-byte ``cp.async`` through a ``stages``-deep ring (1: one synchronous buffer), are read by
``ldmatrix`` (``.trans`` where the operand's layout needs it), and ``raster`` walks the block grid in groups
of that many block rows so a wave of resident blocks shares A and B tiles in L2.

The schedule says all of this with ordinary primitives, so the reference executor runs it unchanged: the m
loop splits into (block, warp, m16 tile, row half, groupID), the n loop into (block, warp, n8 tile,
threadID_in_group, column pair), and groupID x threadID_in_group fuse into the lane bound to threadIdx.x -
exactly the mma accumulator layout.  The block's ``tensor_core`` annotation then asks codegen
(:mod:`schedlib.codegen.tensor_core`) to lower the k loops under the lane to ldmatrix + mma, after it has
checked that the bindings really are this form.
"""

from __future__ import annotations

import math
from typing import Any

from schedlib.errors import ProfileError
from schedlib.hw import HardwareProfile
from schedlib.ir.expr import as_int
from schedlib.ir.func import GRID_YZ_LIMIT, Func
from schedlib.ir.schedule import Schedule
from schedlib.rules import matmul_split_k as sk
from schedlib.rules.analysis import ceil_pow2, const_or
from schedlib.rules.base import Config, Tiling

MMA_SHAPE = "m16n8k16"
MMA_M, MMA_N, MMA_K = 16, 8, 16
COPY_ELEMENTS = 8  # one 16-byte cp.async of 16-bit elements
TC_DTYPES = ("float16", "bfloat16")
MIN_CC = (8, 0)  # cp.async and bf16 mma.m16n8k16 need sm_80
STAGES = (1, 2, 3, 4)
RASTER = (1, 4, 8)
THREAD_M = (2, 4, 8)  # warp tile rows 16/32/64: whole m16 tiles
THREAD_N = (4, 8, 16)  # warp tile columns 16/32/64: pairs of n8 tiles (one ldmatrix.x4 each)
WARP_TILE_MAX = 64
REGISTER_OVERHEAD = 40  # addresses, loop counters, copy indices (per thread)


def unavailable(func: Func, facts: Any, target: HardwareProfile) -> str | None:
    """Why the func/target pair has no mma.m16n8k16 path at all (None when it has one)."""
    a, b = func.buffer(facts.a).dtype, func.buffer(facts.b).dtype
    acc = func.buffer(func.block(facts.main).store).dtype
    if a != b or a not in TC_DTYPES:
        return f"operands are {a} x {b}; the tensor-core path takes two float16 or two bfloat16 operands"
    if acc != "float32":
        return f"accumulation is {acc}; mma.{MMA_SHAPE} here accumulates in float32"
    if MMA_SHAPE not in target.tensor_core_shapes or target.cc < MIN_CC:
        return f"{target.key} (sm_{''.join(map(str, target.cc))}) lacks mma.{MMA_SHAPE} with cp.async (sm_80+)"
    try:
        target.peak_flops(a, True)
    except ProfileError:
        return f"{target.key} has no {a} tensor cores"
    batch = math.prod(as_int(facts.extents[ax]) or 1 for ax in facts.batch)
    if batch > GRID_YZ_LIMIT:
        # the tensor-core kernels give each matrix of the batch its own blockIdx.z (the SIMT kernel strides)
        return f"a batch of {batch} matrices exceeds the grid's {GRID_YZ_LIMIT} blocks along z"
    return None


def misaligned(func: Func, facts: Any) -> str | None:
    """Why 16-byte cp.async copies cannot read the operands (None when every row is 16-byte aligned)."""
    for name in (facts.a, facts.b):
        last = func.buffer(name).shape[-1]
        v = as_int(last)
        if v is None:
            return (f"{name}'s contiguous extent {last} is symbolic: 16-byte cp.async copies need it to be a "
                    f"known multiple of {COPY_ELEMENTS}")
        if v % COPY_ELEMENTS:
            return (f"{name}'s contiguous extent {v} is not a multiple of {COPY_ELEMENTS}: its rows are not "
                    "16-byte aligned, so 16-byte cp.async copies are impossible")
    return None


def warp_tile(c: Config) -> tuple[int, int]:
    return 8 * c["thread_m"], 4 * c["thread_n"]


def registers(c: Config) -> int:
    """Accumulators, the A fragments of one k16 step, one ldmatrix.x4 of B, and overhead."""
    return c["thread_m"] * c["thread_n"] + 2 * c["thread_m"] + 4 + REGISTER_OVERHEAD


def shared_bytes(c: Config, in_bytes: int) -> int:
    return c["stages"] * (c["block_m"] + c["block_n"]) * c["block_k"] * in_bytes


def _grid(facts: Any, c: Config) -> tuple[int | None, int | None]:
    m, n = as_int(facts.extents[facts.m]), as_int(facts.extents[facts.n])
    return (None if m is None else -(-m // c["block_m"]), None if n is None else -(-n // c["block_n"]))


def check(c: Config, facts: Any, target: HardwareProfile) -> str | None:
    """Why a tensor-core config cannot run (None when it can); knobs of the SIMT copy stay pinned."""
    bm, bn, bk, tm, tn = c["block_m"], c["block_n"], c["block_k"], c["thread_m"], c["thread_n"]
    if c["vector"] != 1:
        return "vector is the SIMT copy width; tensor-core configs copy 16 bytes with cp.async and keep vector=1"
    if tm not in THREAD_M or tn not in THREAD_N:
        return (f"a tensor-core warp tile is (8*thread_m) x (4*thread_n) of whole m16n8 tiles: thread_m must be "
                f"one of {THREAD_M} and thread_n one of {THREAD_N}, got {tm} x {tn}")
    wm, wn = warp_tile(c)
    if wm > bm or wn > bn:
        return f"warp tile {wm}x{wn} is larger than the block tile {bm}x{bn}"
    if bk % MMA_K:
        return f"block_k={bk} is not a multiple of the mma k={MMA_K}"
    threads = (bm // tm) * (bn // tn)
    if threads > target.max_threads_per_block:
        return f"{threads} threads per block exceed {target.max_threads_per_block}"
    smem = shared_bytes(c, facts.in_bytes)
    if smem > target.shared_memory_per_block:
        return f"{c['stages']} stages of {smem // c['stages']} bytes of shared memory exceed " \
               f"{target.shared_memory_per_block}"
    return fit_reason(c, facts, target, threads, registers(c))


def fit_reason(c: Config, facts: Any, target: HardwareProfile, threads: int, regs: int) -> str | None:
    """The checks both tensor-core templates share: registers per thread and per SM, a ring no deeper than the
    k loop, and a raster group that changes the block order."""
    if regs > target.max_registers_per_thread:
        return f"about {regs} registers per thread exceed {target.max_registers_per_thread}"
    if threads // target.warp_size * target.registers_per_warp(regs) > target.registers_per_sm:
        return f"{threads} threads x about {regs} registers do not fit one SM's {target.registers_per_sm}"
    k, bk = as_int(facts.extents[facts.k]), c["block_k"]
    if k is not None:
        k = -(-k // c["split_k"])  # a block's slice of K
    if k is not None and c["stages"] > 1 and c["stages"] > -(-k // bk):
        return f"stages={c['stages']} exceeds the {-(-k // bk)} k-step(s): the extra buffers would hold nothing"
    return raster_reason(c, facts)


def raster_reason(c: Config, facts: Any) -> str | None:
    """A raster group that cannot change the block order would duplicate raster=1 (or a smaller group)."""
    g = c["raster"]
    rows, cols = _grid(facts, c)
    if g == 1 or rows is None or cols is None:
        return None
    if rows <= 1 or cols <= 1:
        return f"raster={g} reorders nothing: the grid is {rows} x {cols} blocks"
    smaller = max(v for v in RASTER if v < g)
    if smaller > 1 and smaller >= rows:
        return f"raster={g} walks the same order as raster={smaller}: there are only {rows} block rows"
    return None


def default(facts: Any, target: HardwareProfile, tile: tuple[int, int]) -> Config:
    """CUTLASS's sm_80 shape scaled by the profile: a 2x2 grid of warps each owning half the block tile (at
    most 64x64: 128 accumulators per thread), the widest k step the problem fills, the deepest ring of
    stages the shared-memory limit allows, and raster groups as wide as one wave of blocks is tall."""
    bm, bn = tile
    wm = min(WARP_TILE_MAX, max(MMA_M, bm // 2))
    wn = min(WARP_TILE_MAX, max(2 * MMA_N, bn // 2))
    k = const_or(facts.extents[facts.k], 4096)
    bk = min(2 * MMA_K, max(MMA_K, ceil_pow2(k)))
    k_steps = -(-k // bk)
    per_stage = (bm + bn) * bk * facts.in_bytes
    stages = max([s for s in STAGES if s * per_stage <= target.shared_memory_per_block and s <= k_steps] or [1])
    config = {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": wm // 8, "thread_n": wn // 4, "vector": 1,
              "split_k": 1, "stages": stages, "tensor_core": True, "raster": 1}
    resident = blocks_per_sm(config, target, registers(config), shared_bytes(config, facts.in_bytes))
    config["raster"] = raster_for(config, facts, target, resident)
    return config


def smaller_warp_tiles(c: Config) -> list[Config]:
    """``c`` with ever smaller warp tiles (the longer side halved first; wgmma keeps its 16 rows), each with
    its raster group and with none: for a profile whose register cap refuses the sized tile.  Under a cap of
    64 the 64x64 warp tile (about 180 registers) was refused and the default fell to SIMT, 8x slower in the
    model (a100, fp16 1024^3); a 16x32 warp tile fits."""
    out: list[Config] = []
    tm, tn = c["thread_m"], c["thread_n"]
    wgmma = isinstance(c["tensor_core"], str)
    low_m, low_n = (tm if wgmma else THREAD_M[0]), (4 if wgmma else THREAD_N[0])  # wgmma N >= 16: thread_n 4
    while tm > low_m or tn > low_n:
        # compare the warp tile's sides (8 * thread_m rows by 4 * thread_n columns)
        if tm > low_m and (8 * tm >= 4 * tn or tn == low_n):
            tm //= 2
        else:
            tn //= 2
        shrunk = {**c, "thread_m": tm, "thread_n": tn}
        out += [shrunk, {**shrunk, "raster": 1}]
    return out


def raster_for(c: Config, facts: Any, target: HardwareProfile, blocks_per_sm: int) -> int:
    """The raster group whose first wave of resident blocks touches the fewest A and B tiles."""
    rows = -(-const_or(facts.extents[facts.m], 4096) // c["block_m"])
    cols = -(-const_or(facts.extents[facts.n], 4096) // c["block_n"])
    wave = target.sm_count * blocks_per_sm
    return min(RASTER, key=lambda g: _wave_patch(g, wave, rows, cols))


def blocks_per_sm(c: Config, target: HardwareProfile, regs: int, smem: int) -> int:
    """Resident blocks of a tensor-core config per SM, by threads, ``regs`` registers per thread and ``smem``
    bytes of shared memory per block (the profile's rules); both templates run (bm/tm) x (bn/tn) threads."""
    threads = (c["block_m"] // c["thread_m"]) * (c["block_n"] // c["thread_n"])
    by_regs = target.registers_per_sm // (threads // target.warp_size * target.registers_per_warp(regs))
    by_smem = target.shared_memory_per_sm // target.shared_allocation(smem)
    return max(1, min(by_regs, by_smem, target.max_threads_per_sm // threads, target.max_blocks_per_sm))


def _wave_patch(group: int, wave: int, rows: int, cols: int) -> int:
    """Block rows + block columns one wave of ``wave`` consecutive blocks touches under a raster group (the
    A and B tiles it must hold in L2); ties go to the smaller group by ``min``'s first-wins rule."""
    group = min(group, rows)
    if wave <= group * cols:
        return min(group, wave) + min(cols, -(-wave // group))
    return min(rows, group * -(-wave // (group * cols))) + cols


def tiling(facts: Any, config: Config) -> Tiling:
    bm, bn, tm, tn = config["block_m"], config["block_n"], config["thread_m"], config["thread_n"]
    wm, wn = warp_tile(config)
    tile = {facts.m: bm, facts.n: bn, facts.k: -(-const_or(facts.extents[facts.k], 4096) // config["split_k"])}
    tile.update(dict.fromkeys(facts.batch, 1))
    return Tiling(facts.main, tile, {facts.m: tm, facts.n: tn}, {facts.k: config["block_k"]},
                  (bm // tm) * (bn // tn), shared_bytes(config, facts.in_bytes), registers(config),
                  COPY_ELEMENTS, config["stages"], config["split_k"], True, {facts.m: wm, facts.n: wn},
                  config["raster"], (facts.a, facts.b))


def schedule(func: Func, facts: Any, config: Config) -> Schedule:
    """Warp-tiled loop nest whose lane loop is the mma accumulator layout (see the module docstring).  With
    ``split_k`` > 1 the nest is the partial block's (its slices beside the batch on blockIdx.z) and a second
    kernel adds the slices and applies the epilogue (:mod:`schedlib.rules.matmul_split_k`)."""
    bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
    wm, wn = warp_tile(config)
    s = Schedule(func)
    C = facts.main
    loops = dict(zip([a.name for a in func.block(C).axes], s.get_loops(C)))
    slices = None
    if config["split_k"] > 1:
        C, loops, slices = sk.factor(s, facts, loops, config["split_k"], bk)
    # row = by*bm + wy*wm + mt*16 + h*8 + g ; col = bx*bn + wx*wn + nt*8 + t*2 + e ; k = ko*bk + kk*16 + ki
    by, wy, mt, h, g = s.split(loops[facts.m], [None, bm // wm, wm // MMA_M, 2, MMA_M // 2])
    bx, wx, nt, t, e = s.split(loops[facts.n], [None, bn // wn, wn // MMA_N, 4, 2])
    ko, kk, ki = s.split(loops[facts.k], [None, bk // MMA_K, MMA_K])
    bz = batch_loop(s, facts, loops)
    s.reorder(*([slices] if slices else []), *([bz] if bz else []), by, bx, wy, wx, g, t, ko, kk, mt, nt, h, e, ki)
    if slices:
        bz = s.fuse(slices, bz) if bz else slices
    lane = s.fuse(g, t)  # lane = groupID * 4 + threadID_in_group
    bind_grid(s, bz, by, bx)
    s.bind(wy, "threadIdx.z")
    s.bind(wx, "threadIdx.y")
    s.bind(lane, "threadIdx.x")
    # The write-back (and the fused epilogue) per warp tile; codegen gives each element to its owning lane.
    stage_operands_and_epilogue(s, sk.without_epilogue(facts) if slices else facts, C, wx, ko)
    # "wgmma" configs lower the same nest to Hopper warpgroup MMA (see matmul_wgmma), "wgmma_tma" fed by the TMA,
    # "wgmma_ws" fed by the TMA from a producer warp
    hopper = config["tensor_core"] in ("wgmma", "wgmma_tma", "wgmma_ws")
    s.annotate(C, "tensor_core", "wgmma" if hopper else MMA_SHAPE)
    if config["tensor_core"] in ("wgmma_tma", "wgmma_ws"):
        s.annotate(C, "loader", "tma")
    if config["tensor_core"] == "wgmma_ws":
        s.annotate(C, "producer", "warp")
    s.annotate(ko, "pipeline_stages", config["stages"])
    s.annotate(by, "raster", config["raster"])
    if slices:
        sk.schedule_sum(s, facts)
    return s


# Schedule steps both matmul templates share ------------------------------------------------------------------
def batch_loop(s: Schedule, facts: Any, loops: dict[str, str]) -> str | None:
    """The batch axes fused into one loop (None without batch axes)."""
    outer = [loops[b] for b in facts.batch]
    return s.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)


def bind_grid(s: Schedule, bz: str | None, by: str, bx: str) -> None:
    """Batch, block rows and block columns onto the grid's z, y and x."""
    if bz:
        s.bind(bz, "blockIdx.z")
    s.bind(by, "blockIdx.y")
    s.bind(bx, "blockIdx.x")


def stage_operands_and_epilogue(s: Schedule, facts: Any, C: str, write_at: str, k_outer: str) -> tuple[str, list[str]]:
    """Accumulate in registers written back (with the fused epilogue) at ``write_at``, and stage the A and B
    tiles in shared memory once per ``k_outer`` step.  Returns the write-back block and the two copy blocks."""
    wb = s.cache_write(C, "local")
    s.reverse_compute_at(wb, write_at)
    for block in facts.epilogue:
        s.reverse_compute_inline(block)
    copies = []
    for n, operand in enumerate((facts.a, facts.b)):
        # one buffer read as both operands (X @ X.T): A's read (the first load) gets the first tile, then the
        # remaining read of the buffer is B's
        one_buffer = facts.a == facts.b and n == 0
        shared = s.cache_read(C, operand, "shared", occurrence=0 if one_buffer else None)
        s.compute_at(shared, k_outer)
        copies.append(shared)
    return wb, copies
