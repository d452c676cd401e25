"""Pipelining primitives: overlap the copy of the next tile with the computation on the current one.

They change when data moves, not what any block computes, so the numpy reference is unaffected and only the
generated code (``schedlib.codegen.double_buffer``) sees them.
"""

from __future__ import annotations

import math
from dataclasses import replace

from schedlib.ir.expr import Load, as_int
from schedlib.ir.func import THREAD_INDEX_TAGS, Func
from schedlib.ir.primitives.common import fail, get_block

# Elements one thread may hold in flight for one prefetched copy (registers: the copy's values wait in them
# while the tile before is computed on).
MAX_PREFETCH_VALUES = 64
DOUBLE_BUFFER = "double_buffer"


def double_buffer(func: Func, block: str) -> tuple[Func, None]:
    """Give the shared tile that copy ``block`` fills two slots, and fetch the next iteration's tile while the
    current one is computed on.

    ``block`` copies a global buffer into a shared one and is attached (``compute_at``) before the body of a
    serial loop.  On the GPU each iteration of that loop then loads the next iteration's tile into
    registers, computes on the current slot, stores the registers into the other slot and meets one barrier:
    the memory latency of the copy hides behind the computation instead of stalling it.  The first tile is
    copied before the loop.  The loop nest is unchanged; the block carries the hint.

    Before ``double_buffer(f, "A_shared")``::

        alloc A_shared: float32[1, 4] shared
        for C.i in range(8):
          for C.k_0 in range(4):
            for A_shared.ax0 in range(1):
              for A_shared.ax1 in range(4):
                block A_shared SS (ax0=C.i + A_shared.ax0, ax1=C.k_0 * 4 + A_shared.ax1):
                  A_shared[A_shared.ax0, A_shared.ax1] = A[ax0, ax1]
            for C.k_1 in range(4):
              block C SR (i=C.i, k=C.k_0 * 4 + C.k_1):
                init C[i] = 0.0
                C[i] += A_shared[i - C.i, k - C.k_0 * 4]

    After::

        alloc A_shared: float32[1, 4] shared
        for C.i in range(8):
          for C.k_0 in range(4):
            for A_shared.ax0 in range(1):
              for A_shared.ax1 in range(4):
                block A_shared SS (ax0=C.i + A_shared.ax0, ax1=C.k_0 * 4 + A_shared.ax1):  # double_buffer=True
                  A_shared[A_shared.ax0, A_shared.ax1] = A[ax0, ax1]
            for C.k_1 in range(4):
              block C SR (i=C.i, k=C.k_0 * 4 + C.k_1):
                init C[i] = 0.0
                C[i] += A_shared[i - C.i, k - C.k_0 * 4]
    """
    prim = "double_buffer"
    blk = get_block(func, prim, block)
    if dict(blk.annotations).get(DOUBLE_BUFFER):
        fail(prim, "block", block, "is double-buffered already")
    if func.buffer(blk.store).scope != "shared":
        fail(prim, "block", block, f"writes {func.buffer(blk.store).scope} buffer {blk.store}; only a copy into "
                                   "shared memory is double-buffered")
    if (blk.reducer is not None or not isinstance(blk.value, Load)
            or func.buffer(blk.value.buffer).scope != "global"):
        fail(prim, "block", block, "is not a copy of a global buffer (its value must be one load of it)")
    if blk.attach is None or blk.attach.position != "before":
        fail(prim, "block", block, "is not attached before a loop body; compute_at it at the loop whose "
                                   "iterations it should run ahead of")
    host = func.block(blk.attach.block)
    loop = host.loops[host.loop_index(blk.attach.loop)]
    if loop.thread is not None or loop.vectorized:
        fail(prim, "block", block, f"is attached at {loop.name}, which is "
                                   f"{'bound to ' + loop.thread if loop.thread else 'vectorized'}; it needs a "
                                   "serial loop")
    per_thread = [as_int(lp.extent) for lp in blk.loops if lp.thread not in THREAD_INDEX_TAGS]
    if any(n is None for n in per_thread):
        fail(prim, "block", block, "has a loop of symbolic extent outside its thread loops; the values a "
                                   "thread prefetches must fit a fixed register array")
    values = math.prod(per_thread)  # type: ignore[arg-type]
    if values > MAX_PREFETCH_VALUES:
        fail(prim, "block", block, f"would hold {values} values per thread in registers (at most "
                                   f"{MAX_PREFETCH_VALUES}); bind more of its loops to threads")
    annotations = (*blk.annotations, (DOUBLE_BUFFER, True))
    return func.with_block(replace(blk, annotations=annotations)), None
