"""Two-stage reductions: a few long rows, or a whole tensor reduced to one value, spread over many blocks.

One block per row leaves most SMs idle when there are fewer rows than SMs (a loss over a whole tensor has a
single "row").  The first stage (``rfactor``) gives each row ``blocks_per_row`` blocks: block ``p`` of a row
reduces steps ``p, p + P, p + 2P, ...`` of it, each step ``threads x vector`` consecutive elements read by
one coalesced (vector) load per thread, folds them in a register and combines across its threads, and
writes one partial to a global scratch buffer (rows x P).  The second stage reduces each row's P partials
in one block and folds the element-wise epilogue into its store.  A reduction to a single value has no row
loop for the epilogue to ride on: its epilogue stages run as small kernels of their own after it.
"""

from __future__ import annotations

import math

from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import ceil_pow2, const_or
from schedlib.rules.base import Config, Tiling
from schedlib.rules.cross_thread import ReductionFacts, bind_row_grid, fused_loops, row_grid

MAX_PARTIALS = 1024  # the second stage reduces a row's partials in one block of at most this many threads
LONG_ROW_STEPS = 32  # a row is split only when one block would walk it in at least this many steps


def rows_count(func: Func, facts: ReductionFacts) -> int:
    """Outputs of the reduction (1 for a single value), symbolic extents planned at 4096."""
    blk = func.block(facts.main)
    return math.prod(const_or(blk.axis(a).extent, 4096) for a in facts.rows)


def row_length(func: Func, facts: ReductionFacts) -> int:
    """Elements each output reduces, symbolic extents planned at 4096."""
    blk = func.block(facts.main)
    return math.prod(const_or(blk.axis(a).extent, 4096) for a in facts.reduce)


def split_default(rows: int, length: int, threads: int, vector: int, sm_count: int) -> int:
    """Blocks per row: enough that the grid holds about two blocks per SM, where the rows are long enough
    that each block still walks several steps; 1 (one stage) otherwise."""
    step = threads * vector
    if rows >= 2 * sm_count or length < LONG_ROW_STEPS * step:
        return 1
    wanted = ceil_pow2(-(-2 * sm_count // rows))
    most = 1 << max(0, (length // step).bit_length() - 1)  # every block gets at least one whole step
    return max(1, min(MAX_PARTIALS, wanted, most))


def final_threads(partials: int) -> int:
    """Threads of the second stage: one per partial, at least a warp."""
    return max(32, ceil_pow2(partials))


def schedule_two_stage(func: Func, facts: ReductionFacts, config: Config) -> Schedule:
    """The two-stage schedule of an inner-layout reduction (``blocks_per_row`` > 1)."""
    P, T, V = config["blocks_per_row"], config["threads_k"], config["vector"]
    s = Schedule(func)
    for block in facts.prologue:
        s.compute_inline(block)
    C = facts.main
    by_axis = dict(zip([a.name for a in func.block(C).axes], s.get_loops(C)))
    k = fused_loops(s, [by_axis[a] for a in facts.reduce])  # in the walked order: contiguous in the operands
    assert k is not None  # a reduction has a reduce axis
    ko, p, t, v = s.split(k, [None, P, T, V])
    grid_yz, row_loops = row_grid(s, func, facts, [by_axis[a] for a in facts.rows])
    rows = fused_loops(s, row_loops)
    s.reorder(*grid_yz, *([rows] if rows else []), p, t, ko, v)
    out_rank = len(func.buffer(func.block(C).store).shape)
    partial = s.rfactor(p, out_rank)  # partials[rows..., P]: a row's partials are contiguous
    yz = len(grid_yz)
    first = s.get_loops(partial)  # [rows over blockIdx.z/y], [rows], p, t, ko, v
    bind_row_grid(s, first[:yz])
    grid = s.fuse(first[yz], first[yz + 1]) if rows else first[yz]
    s.bind(grid, "blockIdx.x")
    s.bind(first[-3], "threadIdx.x")
    s.vectorize(first[-1])
    held = s.cache_write(partial, "local")
    s.reverse_compute_at(held, grid)
    second = s.get_loops(C)  # [rows over blockIdx.z/y], [rows], partial index
    bind_row_grid(s, second[:yz])
    row = second[yz] if rows else None
    outer, lanes = s.split(second[-1], [None, final_threads(P)])
    if row is not None:
        s.reorder(row, lanes, outer)
        s.bind(row, "blockIdx.x")
    s.bind(lanes, "threadIdx.x")
    if row is not None:
        wb = s.cache_write(C, "local")
        s.reverse_compute_at(wb, row)
        for block in facts.epilogue:
            s.reverse_compute_inline(block)
    return s


def two_stage_tiling(func: Func, facts: ReductionFacts, config: Config) -> Tiling:
    """The carver's view of the first stage, which moves the bytes: a block reduces ``1 / P`` of its row, but
    at least one whole step (blocks past the row's steps have nothing to read, so they are not counted),
    charged to the outermost reduce axis.  ``split_k`` is ``P`` so that the model charges the partials' round
    trip and the second kernel's launch, as it does for a split-K matmul."""
    blk = func.block(facts.main)
    tile: dict[str, int] = {a.name: (1 if a.kind == "S" else const_or(a.extent, 4096)) for a in blk.axes}
    threads, vector = config["threads_k"], config["vector"]
    outermost = facts.reduce[0]
    inner = math.prod(tile[a] for a in facts.reduce[1:])  # elements per index of the outermost reduce axis
    length = row_length(func, facts)
    chunk = max(threads * vector, -(-length // config["blocks_per_row"]))
    tile[outermost] = max(1, min(tile[outermost], -(-chunk // inner)))
    thread_tile = {facts.rows[-1]: 1} if facts.rows else {}
    return Tiling(facts.main, tile, thread_tile, {facts.reduce[-1]: threads * vector}, threads, 4 * threads,
                  32 + 2 * vector, vector, split_k=config["blocks_per_row"])

