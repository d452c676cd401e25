"""Split-K for the matmul: a long reduction over few output tiles spread across more blocks.

A 64 x 64 output with K = 65536 is a handful of block tiles; one block per tile leaves most SMs idle while
each walks all of K.  With ``split_k = S`` the k loop is cut into S slices before tiling, and ``rfactor``
turns the slice index into a spatial axis of a partial-result block: the first kernel computes
``partials[s, b.., m, n]`` (in the accumulation dtype) with the usual SIMT or tensor-core tiles, its grid's z
covering the slices (and the batch); a second, element-wise kernel adds a point's S partials in registers and
applies the fused epilogue on its single store.  The partials cost ``2 x S x outputs`` accumulator bytes of
traffic, which is why the rule only splits when the grid is short of the SMs and each slice keeps a long k
loop.  The tensor-core lowering stages whole k tiles with no guard along k, so there every slice must be
whole k steps (``K % (S * block_k) == 0``): a partial step would read into the next slice.
"""

from __future__ import annotations

import dataclasses

from schedlib.ir.expr import as_int
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import ceil_pow2, const_or, tile_count
from schedlib.rules.matmul_facts import MatmulFacts

SPLITS = (1, 2, 4, 8, 16)  # the knob's values at most; 1 is one kernel, no partials
LONG_K = 4  # a matmul offers the split when K is at least this many times its longer output side
MIN_SPACE_SLICE = 256  # ... in slices of at least this much of K
MIN_SLICE = 512  # the default splits only while every slice keeps at least this much of K
SUM_THREADS = 256  # threads per block of the second kernel, one output each
PARTIALS_LIMIT = 2**31  # elements the partials may hold: generated kernels index global buffers in 32 bits


def splits(facts: MatmulFacts) -> tuple[int, ...]:
    """The ``split_k`` values a matmul's space offers: beyond 1, only for a known K at least :data:`LONG_K`
    times the longer output side (symbolic sides planned at 4096) and known batch sizes, in slices of at
    least :data:`MIN_SPACE_SLICE`.  Elsewhere the output alone has enough tiles to fill the GPU, and every split
    would only add partials and a second kernel (and make the space five times larger to rank)."""
    k = as_int(facts.extents[facts.k])
    side = max(const_or(facts.extents[facts.m], 4096), const_or(facts.extents[facts.n], 4096))
    if k is None or k < LONG_K * side:
        return (1,)
    if any(as_int(facts.extents[b]) is None for b in facts.batch):
        return (1,)  # the slices share blockIdx.z with a batch of unknown size: split, it could pass 65535
    return tuple(s for s in SPLITS if s == 1 or k // s >= MIN_SPACE_SLICE)


def factor(s: Schedule, facts: MatmulFacts, loops: dict[str, str], split: int, block_k: int
           ) -> tuple[str, dict[str, str], str]:
    """Cut the k loop into ``split`` slices of whole ``block_k`` steps and factor them out of the main block.

    Returns the partial block's name, its loops by axis name (the k entry now the loop within a slice) and
    the slice loop.  A slice is ``ceil(K / split)`` rounded up to whole k steps, so only the last slice can
    end inside a step: with slices of 513 of K = 4099 every block's last step read past its slice, guarded
    twice per element, and ptxas spilled under the predicate pressure.  (The rounding can leave fewer slices
    than ``split``; slices are at least :data:`MIN_SPACE_SLICE` long, so at most one or two fewer.)

    Before (k of extent K)::

        for C.i, C.j, C.k:  C[i, j] += A[i, k] * B[k, j]

    After (KS the slice)::

        for C.i, C.j, C.k_0 in range(ceil(K / KS)), C.k_1 in range(KS):  C_rf[v_k_0, i, j] += A[i, k] * B[k, j]
        for C.i_1, C.j_1, C.v_k_0:  C[i, j] += C_rf[v_k_0, i, j]
    """
    k = as_int(facts.extents[facts.k])
    factors: list[int | None] = [split, None]
    if k is not None:
        per_slice = -(-k // split)
        factors = [None, -(-per_slice // block_k) * block_k]
    slices, within = s.split(loops[facts.k], factors)
    partial = s.rfactor(slices, 0)
    return partial, {**loops, facts.k: within}, slices


def tensor_core_reason(c: dict, facts: MatmulFacts) -> str | None:
    """Why a tensor-core config cannot take its ``split_k`` (None when it can): its slices must be whole
    k steps of a known K."""
    split, bk = c["split_k"], c["block_k"]
    k = as_int(facts.extents[facts.k])
    if split > 1 and (k is None or k % (split * bk)):
        return (f"split_k={split} on tensor cores needs K a multiple of split_k x block_k = {split * bk} (slices of "
                f"whole k steps; the tensor-core copies have no guard along k), K is {facts.extents[facts.k]}")
    return None


def tensor_core_default(config: dict, facts: MatmulFacts, sm_count: int, tiles: int, most: int
                        ) -> tuple[dict, bool]:
    """A tensor-core default with the slices :func:`default_split` gives its ``tiles`` block tiles, halved
    until they are whole k steps, and no more pipeline stages than a slice has k steps; and whether that
    halving left it fewer slices than :func:`default_split` wanted."""
    k = as_int(facts.extents[facts.k])
    if k is None or most == 1:
        return config, False
    wanted = split = default_split(tiles, k, sm_count, most)
    while split > 1 and k % (split * config["block_k"]):
        split //= 2
    if split == 1:
        return config, wanted > 1
    stages = max(1, min(config["stages"], k // split // config["block_k"]))
    return {**config, "split_k": split, "stages": stages}, split < wanted


def without_epilogue(facts: MatmulFacts) -> MatmulFacts:
    """The facts for tiling the partial block: its store takes no epilogue (the sum kernel applies it)."""
    return dataclasses.replace(facts, epilogue=())


def schedule_sum(s: Schedule, facts: MatmulFacts) -> None:
    """The second kernel: a block per row of up to :data:`SUM_THREADS` output columns, a thread per output
    (consecutive threads along n, so every read of the partials is coalesced) adding its ``split`` partials
    in a register, then applying the epilogue.

    Before: ``for C.b.., C.i_1, C.j_1, C.v_k_0: C[b.., i, j] += C_rf[v_k_0, b.., i, j]`` (epilogue blocks
    after it).  After: the column loop split into blocks of threads, the batch, row and column-block loops
    fused onto blockIdx.x, the slice loop unrolled in each thread, the sum held in a register and the
    epilogue inlined into its write-back.  (The threads span columns only: a thread's point is then a fixed
    row, which keeps its register a single element when the extents are symbolic.)
    """
    *outer, columns, slices = s.get_loops(facts.main)
    threads = min(SUM_THREADS, max(32, ceil_pow2(const_or(facts.extents[facts.n], SUM_THREADS))))
    column_blocks, lanes = s.split(columns, [None, threads])
    grid = s.fuse(*outer, column_blocks)
    s.bind(grid, "blockIdx.x")
    s.bind(lanes, "threadIdx.x")
    s.unroll(slices)
    held = s.cache_write(facts.main, "local")
    s.reverse_compute_at(held, lanes)
    for block in facts.epilogue:
        s.reverse_compute_inline(block)


def default_tile(M: int, N: int, batch: int, k_extent: int, sm_count: int, most: int,
                 start: tuple[int, int]) -> tuple[int, int]:
    """The SIMT block tile where K is split: halved from ``start`` (the output, up to 128 x 128) only while
    the grid, with as many slices as :func:`default_split` allows, is still short of the SMs, and not below
    32 x 32.  A bigger tile reuses each operand element for more outputs; the slices fill the SMs instead
    of ever smaller tiles."""
    bm, bn = start
    while max(bm, bn) > 32:
        tiles = tile_count(M, N, batch, (bm, bn))
        if tiles * default_split(tiles, k_extent, sm_count, most) >= sm_count:
            break
        if bm >= bn:
            bm //= 2
        else:
            bn //= 2
    return bm, bn


def default_split(tiles: int, k_extent: int, sm_count: int, most: int) -> int:
    """Slices for a grid of ``tiles`` blocks: the fewest that give every SM a block, at most ``most`` (the
    space's largest value) and while each slice keeps at least :data:`MIN_SLICE` of K; 1 where the tiles
    already fill the SMs."""
    split = 1
    while tiles * split < sm_count and split * 2 <= most and k_extent // (split * 2) >= MIN_SLICE:
        split *= 2
    return split
