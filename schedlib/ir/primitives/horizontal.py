"""compute_with: a block placed under a loop of another block it shares no data with (a horizontal fusion),
so that two statistics of the same rows share the rows' pass.  Region inference, regeneration and the checks
common to every placement come from :mod:`~schedlib.ir.primitives.placement`.
"""

from __future__ import annotations

from schedlib.ir.expr import Expr, as_int
from schedlib.ir.func import Attach, Func
from schedlib.ir.primitives.common import (
    check_dependencies,
    check_single_producer,
    fail,
    get_block,
    get_loop,
    normalize,
)
from schedlib.ir.primitives.placement import (
    _check_movable,
    _fixed_loops,
    _refuse_grid_loops_below,
    _regenerate,
    _store_axes,
)
from schedlib.ir.region import access_region, tiles_whole_buffer
from schedlib.ir.simplify import free_vars, simplify, substitute


def compute_with(func: Func, block: str, loop: str) -> tuple[Func, None]:
    """Run ``block`` inside ``loop`` of a block it shares no data with (a horizontal fusion), over the
    elements the loop's block stores in one iteration: two statistics of the same rows then share a pass.

    Neither block may read what the other writes (that is compute_at or reverse_compute_at).  ``block``'s
    buffer has the loop's block's shape or its leading dimensions (a row statistic beside the rows); the
    iterations of ``loop`` must tile those dimensions whole and leave the others to loops inside it, so each
    element is computed once, and no loop at or above it may reduce.

    Before ``compute_with(f, "S", "Q.i")``::

        for S.i in range(8):
          for S.k in range(16):
            block S SR (i=S.i, k=S.k):
              init S[i] = 0.0
              S[i] += A[i, k]
        for Q.i in range(8):
          for Q.k in range(16):
            block Q SR (i=Q.i, k=Q.k):
              init Q[i] = 0.0
              Q[i] += A[i, k] * A[i, k]

    After::

        for Q.i in range(8):
          for S.i in range(1):
            for S.k in range(16):
              block S SR (i=Q.i + S.i, k=S.k):
                init S[i] = 0.0
                S[i] += A[i, k]
          for Q.k in range(16):
            block Q SR (i=Q.i, k=Q.k):
              init Q[i] = 0.0
              Q[i] += A[i, k] * A[i, k]
    """
    prim = "compute_with"
    blk = get_block(func, prim, block)
    host, idx = get_loop(func, prim, loop)
    _check_movable(func, prim, blk, host, loop)
    check_single_producer(func, prim, blk)
    buf, host_buf = func.buffer(blk.store), func.buffer(host.store)
    if host_buf.name in blk.read_buffers:
        fail(prim, "block", block, f"reads {host_buf.name}, which {host.name} writes; use reverse_compute_at")
    if buf.name in host.read_buffers:
        fail(prim, "block", block, f"writes {buf.name}, which {host.name} reads; use compute_at")
    if _store_axes(host) is None:
        fail(prim, "loop", loop, f"{host.name} does not store at its plain spatial axes (compacted already), so "
                                 "its iterations name no elements to match")
    rank = len(buf.shape)
    if tuple(simplify(e) for e in buf.shape) != tuple(simplify(e) for e in host_buf.shape[:rank]):
        fail(prim, "block", block, f"{buf.name} has shape {_dims(buf.shape)}, which is neither {host_buf.name}'s "
                                   f"shape {_dims(host_buf.shape)} nor its leading dimensions")
    for lp in host.loops[: idx + 1]:
        if host.loop_kind(lp.name) == "R":
            fail(prim, "loop", loop, f"{lp.name} at or above it reduces; {block} would run again on every step")
    fixed = _fixed_loops(func, host, idx, "global")  # each thread computes its own elements
    region = access_region(func, [(host, host.store_indices)], fixed, host_buf.shape)
    # A dimension the block lacks must be walked whole in each iteration: its index may not move with a loop
    # held there.  (Asked of the index, not the region's box, which a split of a symbolic extent leaves at
    # ceil(N / f) * f, and which a fused index widens to the whole dimension while it still moves.)
    binding = {a.name: b for a, b in zip(host.axes, host.bindings)}
    held = {lp.name for lp in func.all_loops(host) if lp.name in fixed and as_int(lp.extent) != 1}
    for d in range(rank, len(host_buf.shape)):
        moving = sorted(free_vars(substitute(host.store_indices[d], binding)) & held)
        if moving:
            fail(prim, "loop", loop, f"its iterations each cover part of dimension {d} of {host_buf.name} (its "
                                     f"index moves with {', '.join(moving)}), which {buf.name} lacks: {block} "
                                     "would be computed again in each of them")
    _refuse_grid_loops_below(prim, host, idx, block, buf.name)
    if not tiles_whole_buffer(func, host, fixed, buf.shape, region[:rank]):
        fail(prim, "loop", loop, f"its iterations do not cover {buf.name} exactly once between them (each "
                                 "dimension must be whole or tiled by a loop of its own, and every other loop "
                                 f"at or above it run once, or {block} would be computed again in each of its "
                                 "iterations)")
    stored = _store_axes(blk)
    assert stored is not None  # _check_movable refused anything else
    moved = _regenerate(func, blk, dict(zip(stored, region)), Attach(host.name, loop, "before"))
    out = normalize(func.with_block(moved))
    check_dependencies(out, prim, "block", block)
    return out, None


def _dims(shape: tuple[Expr, ...]) -> str:
    return "[" + ", ".join(str(e) for e in shape) + "]"
