"""SIMT half of the matmul rule: its legality, its default, tiling and schedule.

The template: a block tile of block_m x block_n outputs, each thread a thread_m x thread_n register tile, A
and B staged through shared memory block_k at a time by a cooperative (vectorized) copy, single- or
double-buffered (``stages`` 1 or 2), the epilogue applied in registers before the single store.  A computed
operand (a prologue stage) is computed as it is copied in.  ``split_k`` slices K over blocks as on the
tensor-core templates (:mod:`schedlib.rules.matmul_split_k`).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from schedlib.ir.expr import as_int
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules import matmul_split_k as sk
from schedlib.rules import matmul_tc as tc
from schedlib.rules.analysis import const_or, shrink_to_fill, tile_count
from schedlib.rules.base import Config, Space, Tiling
from schedlib.rules.matmul_facts import MatmulFacts

REGISTER_OVERHEAD = 40  # addresses, loop counters, fetch temporaries (per thread)
STAGES = (1, 2)  # single- or double-buffered shared tiles


def balanced_tile(M: int, N: int, batch: int, sms: int, tile: tuple[int, int]) -> tuple[int, int]:
    """A SIMT block tile that spreads the work evenly over the SMs, when there are enough blocks to.

    With at least a block per SM the kernel takes as long as its busiest SM, which runs ``ceil(blocks / SMs)``
    tiles: 128 tiles of 64x128 on 108 SMs leave 20 SMs with two (16384 outputs) and the rest with one, where
    256 tiles of 64x64 give at most three (12288).  Among the tiles from 64x64 up to ``tile`` (each keeps an
    8x8 thread tile), the one whose busiest SM has the least work, a halved tile charged 5% for the extra
    operand traffic per output it costs.  A grid short of one block per SM is latency-bound instead: ``tile``
    is kept.
    """
    def cost(bm: int, bn: int) -> float:
        busiest = -(-tile_count(M, N, batch, (bm, bn)) // sms) * bm * bn
        return busiest * (1 + 0.05 * math.log2(tile[0] * tile[1] / (bm * bn)))

    if tile[0] < 64 or tile[1] < 64 or tile_count(M, N, batch, tile) < sms:
        return tile
    candidates = [(bm, bn) for bm in (128, 64) for bn in (128, 64) if bm <= tile[0] and bn <= tile[1]]
    return min(candidates, key=lambda t: (cost(*t), -t[0] * t[1], -t[0]))


def registers(c: Config) -> int:
    """About the registers per thread: accumulators, one column and row of operands, the next tiles' values
    when double-buffered, and the addressing."""
    threads = (c["block_m"] // c["thread_m"]) * (c["block_n"] // c["thread_n"])
    # double-buffered, each thread holds its share of the next A and B tiles in registers
    prefetch = -(-(c["block_m"] + c["block_n"]) * c["block_k"] // threads) if c["stages"] > 1 else 0
    return c["thread_m"] * c["thread_n"] + c["thread_m"] + c["thread_n"] + prefetch + REGISTER_OVERHEAD


def check(c: Config, facts: MatmulFacts, target: Any) -> str | None:
    """Why a SIMT config cannot run on ``target``, or None."""
    if c["raster"] != 1:
        return "raster belongs to the tensor-core template; SIMT configs keep it at 1"
    if c["stages"] > STAGES[-1]:
        return f"SIMT tiles are single- or double-buffered (stages 1 or 2), not {c['stages']}"
    if c["thread_n"] > 8:
        return f"thread_n={c['thread_n']} is a tensor-core warp tile; SIMT thread tiles are at most 8"
    threads = (c["block_m"] // c["thread_m"]) * (c["block_n"] // c["thread_n"])
    if c["thread_m"] > c["block_m"] or c["thread_n"] > c["block_n"]:
        return "thread tile larger than block tile"
    if not 32 <= threads <= target.max_threads_per_block:
        return f"{threads} threads per block (needs 32..{target.max_threads_per_block})"
    smem = (c["block_m"] + c["block_n"]) * c["block_k"] * facts.in_bytes * c["stages"]
    if smem > target.shared_memory_per_block:
        return f"{smem} bytes of shared memory exceed {target.shared_memory_per_block}"
    regs = registers(c)
    if regs > target.max_registers_per_thread:
        return f"about {regs} registers per thread exceed {target.max_registers_per_thread}"
    if -(-threads // target.warp_size) * target.registers_per_warp(regs) > target.registers_per_sm:
        return f"{threads} threads x about {regs} registers do not fit one SM's {target.registers_per_sm}"
    if c["block_k"] % c["vector"] or (c["block_m"] * c["block_k"]) % (threads * c["vector"]):
        return "vector width does not divide the copy evenly"
    return None


def default(facts: MatmulFacts, target: Any, space: Space, start: tuple[int, int], tile: tuple[int, int]
            ) -> tuple[Config, bool]:
    """The SIMT default and True, or the last candidate tried and False where none is legal.

    Short of a wave of blocks, each block's k loop is the kernel's time, and every k step waits on one global
    round trip (the carver's latency bound): tiles shrink to 16 to reach more SMs, a thread keeps a 2-deep
    tile per 16 rows/columns and a small tile's k step deepens to 32, a quarter of the round trips of 8
    (256^3 on h100: 8.1 -> 2.3 us estimated).  A 64x64 tile or larger already does enough work per round
    trip and would pay the deeper prefetch in registers (64x64x32 at 8x8 per thread: 217 on sm_90).  Where
    K splits, tiles keep 64x64 and slices fill the SMs (matmul_split_k).  ``start`` is the output up to
    128 x 128, ``tile`` the unsplit sizing."""
    M = const_or(facts.extents[facts.m], 4096)
    N = const_or(facts.extents[facts.n], 4096)
    batch = math.prod(const_or(facts.extents[b], 1) for b in facts.batch)
    k_known = const_or(facts.extents[facts.k], 1)
    split_max = space.knob("split_k").values[-1]
    split = 1
    if split_max > 1:
        bm, bn = sk.default_tile(M, N, batch, k_known, target.sm_count, split_max, start)
        split = sk.default_split(tile_count(M, N, batch, (bm, bn)), k_known, target.sm_count, split_max)
    else:
        bm, bn = shrink_to_fill(M, N, batch, target.sm_count, tile, floor=16)
    bm, bn = balanced_tile(M, N, batch, target.sm_count, (bm, bn))
    few_blocks = tile_count(M, N, batch, (bm, bn)) * split < 2 * target.sm_count
    per = 8 if few_blocks else 16
    tm = 8 if bm >= 64 else max(1, bm // per)
    tn = 8 if bn >= 64 else max(1, bn // per)
    # Double-buffered where the k loop has a next tile to fetch and fewer than two blocks per SM would hide
    # each other's waits.  Measured on an H200 (2026-11-28): fp32 4096^3 at 128x128x8 (two blocks per SM,
    # four waves) 4508 us double-, 3840 us single-buffered; 256 x 256 x 65536 split 16 (256 blocks) 348 us
    # double-, 415 us single-buffered.
    k_extent = const_or(facts.extents[facts.k], 4096) // split
    # (a split's 64x64 tiles take 16: each slice's k loop is long, and its round trips count; so do grids of
    # two or more blocks per SM, single-buffered: on an H200 fp32 4096^3 at 128x128 ran 3486 us at block_k 16
    # against 3843 us at 8)
    depths = (32, 16, 8) if few_blocks and bm * bn <= 32 * 64 else (16, 8) if split > 1 or not few_blocks \
        else (8, 16)
    order = (2, 1) if few_blocks else (1, 2)
    choices = [(bk, stages) for bk in depths for stages in (order if k_extent > bk else (1,))]
    for (rows, cols), (bk, stages), vector in itertools.product(_thread_tiles(tm, tn), choices, (4, 2, 1)):
        config = {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": rows, "thread_n": cols,
                  "vector": vector, "split_k": split, "stages": stages, "tensor_core": False, "raster": 1}
        if space.is_legal(config):
            return config, True
    return config, False


def _thread_tiles(tm: int, tn: int) -> list[tuple[int, int]]:
    """``tm`` x ``tn``, then smaller thread tiles (the longer side halved first) for a target whose register cap
    refuses the larger ones: a profile with max_registers_per_thread 64 keeps the 64x64 block at 4x4 per thread
    (64 registers) where the 8x8 tile needs about 120; before, the default fell to the space's first legal
    point, a 16x16 block at 1x2 per thread (1024^3 fp32: 252 us estimated against 69 us)."""
    tiles = [(tm, tn)]
    while tm * tn > 1:
        tm, tn = (tm // 2, tn) if tm > tn else (tm, tn // 2)
        tiles.append((tm, tn))
    return tiles


def tiling(facts: MatmulFacts, config: Config) -> Tiling:
    threads = (config["block_m"] // config["thread_m"]) * (config["block_n"] // config["thread_n"])
    tile = {facts.m: config["block_m"], facts.n: config["block_n"],
            facts.k: -(-const_or(facts.extents[facts.k], 4096) // config["split_k"])}  # a slice of K
    tile.update(dict.fromkeys(facts.batch, 1))
    return Tiling(facts.main, tile, {facts.m: config["thread_m"], facts.n: config["thread_n"]},
                  {facts.k: config["block_k"]}, threads,
                  (config["block_m"] + config["block_n"]) * config["block_k"] * facts.in_bytes * config["stages"],
                  registers(config), config["vector"], config["stages"], config["split_k"], config["tensor_core"])


def _interleaved_width(s: Schedule, facts: MatmulFacts, tn: int, b_shared: str) -> int | None:
    """B_shared's row width when the template interleaves it: a thread owns two 16-byte runs of columns (fp32
    ``thread_n`` = 8) and N is whole vectors (a ragged edge's guard would split one); else None."""
    chunk = 16 // facts.in_bytes
    width = as_int(s.func.buffer(b_shared).shape[-1])  # the block tile, or less where N is smaller
    n = as_int(facts.extents[facts.n])
    if facts.b_contig != facts.n or tn != 2 * chunk or width is None or width % tn or n is None or n % chunk:
        return None
    return width


def schedule(func: Func, facts: MatmulFacts, config: Config) -> Schedule:
    bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
    tm, tn, vec = config["thread_m"], config["thread_n"], config["vector"]
    ty_n, tx_n = bm // tm, bn // tn
    s = Schedule(func)
    C = facts.main
    loops = dict(zip([a.name for a in func.block(C).axes], s.get_loops(C)))
    slices = None
    if config["split_k"] > 1:  # tile the partial block; the sum kernel gets the epilogue (schedule_sum, below)
        C, loops, slices = sk.factor(s, facts, loops, config["split_k"], bk)
    by, ty, im = s.split(loops[facts.m], [None, ty_n, tm])
    bx, tx, jn = s.split(loops[facts.n], [None, tx_n, tn])
    ko, ki = s.split(loops[facts.k], [None, bk])
    bz = tc.batch_loop(s, facts, loops)
    s.reorder(*([slices] if slices else []), *([bz] if bz else []), by, bx, ty, tx, ko, ki, im, jn)
    if slices:
        bz = s.fuse(slices, bz) if bz else slices
    tc.bind_grid(s, bz, by, bx)
    s.bind(ty, "threadIdx.y")
    s.bind(tx, "threadIdx.x")
    wb, copies = tc.stage_operands_and_epilogue(s, sk.without_epilogue(facts) if slices else facts, C, tx, ko)
    chunk = 16 // facts.in_bytes  # elements per 16-byte shared access
    width = _interleaved_width(s, facts, tn, copies[1])
    for shared in copies:  # the cooperative, vectorized copy: every thread moves vec elements per step
        loops = s.get_loops(shared)
        if shared == copies[1] and width and vec == chunk:
            # in storage order: consecutive lanes fill consecutive 16-byte slots of the permuted rows
            *outer, cols = loops
            t, h, fv = s.split(cols, [width // tn, 2, chunk])
            s.reorder(*outer, h, t, fv)
            _, fy, fx = s.split(s.fuse(*outer, h, t), [None, ty_n, tx_n])
        else:
            _, fy, fx, fv = s.split(s.fuse(*loops), [None, ty_n, tx_n, vec])
        s.bind(fy, "threadIdx.y")
        s.bind(fx, "threadIdx.x")
        if vec > 1:
            s.vectorize(fv)
    runs = [jn]
    if width:
        # The thread's tn columns are two 16-byte loads.  Stored as they are, a quarter warp's first loads
        # fall 32 bytes apart (two lanes per bank group); interleaving the threads' runs makes each load one
        # 128-byte row.  The reads are written as vector loads, as the GPU runs them.
        last = len(s.func.buffer(copies[1]).shape) - 1
        s.storage_permute(copies[1], last, [width // tn, 2, chunk], [1, 0, 2])
        runs = s.split(jn, [2, chunk])
    if config["stages"] == 2:
        for shared in copies:
            s.double_buffer(shared)
    for stage in facts.prologue:  # a computed operand is computed as it is copied in (its only reader now)
        s.compute_inline(stage)
    init = s.decompose_reduction(C, ko)
    for lp in (ki, im, *runs[:-1], *s.get_loops(init), *s.get_loops(wb)):
        s.unroll(lp)
    if len(runs) > 1:
        s.vectorize(runs[-1])
    else:
        s.unroll(runs[-1])
    if slices:
        sk.schedule_sum(s, facts)
    return s
