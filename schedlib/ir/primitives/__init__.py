"""Schedule primitives as pure functions ``(func, *args) -> (func, result)``.

:data:`PRIMITIVES` maps each primitive's name to its function; the :class:`~schedlib.ir.schedule.Schedule`
recorder and trace replay dispatch through it, so a trace can only ever call these.
"""

from __future__ import annotations

from schedlib.ir.primitives.annotate import annotate, bind, unroll, vectorize
from schedlib.ir.primitives.cache import cache_read, cache_write
from schedlib.ir.primitives.horizontal import compute_with
from schedlib.ir.primitives.inline import compute_inline, reverse_compute_inline
from schedlib.ir.primitives.loops import fuse, reorder, split
from schedlib.ir.primitives.pipeline import double_buffer
from schedlib.ir.primitives.placement import compute_at, reverse_compute_at
from schedlib.ir.primitives.reduction import decompose_reduction, rfactor
from schedlib.ir.primitives.storage import storage_align, storage_permute

PRIMITIVES = {
    f.__name__: f
    for f in (split, fuse, reorder, bind, vectorize, unroll, annotate, storage_align, storage_permute,
              double_buffer, cache_read, cache_write,
              compute_at, reverse_compute_at, compute_with, compute_inline, reverse_compute_inline, rfactor,
              decompose_reduction)
}

__all__ = ["PRIMITIVES", *PRIMITIVES]
