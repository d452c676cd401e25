"""Storage primitives: how an intermediate buffer is laid out in shared or local memory.

They change addresses only: every block still reads and writes the same logical elements, so the numpy
reference is unaffected and only the generated code sees them (through ``schedlib.ir.layout``).
"""

from __future__ import annotations

import math
from dataclasses import replace

from schedlib.ir.expr import as_int
from schedlib.ir.func import Buffer, Func
from schedlib.ir.primitives.common import check_positive_int, fail, get_block


def _intermediate(func: Func, prim: str, block: str) -> Buffer:
    buf = func.buffer(get_block(func, prim, block).store)
    if buf.scope == "global":
        fail(prim, "block", block, f"writes global buffer {buf.name}; only shared/local buffers can be laid out")
    return buf


def storage_align(func: Func, block: str, dim: int, factor: int, offset: int) -> tuple[Func, None]:
    """Pad the stride of dimension ``dim`` of the buffer ``block`` writes to ``factor * k + offset``.

    Used against shared-memory bank conflicts.  The loop nest is unchanged; the allocation records it.

    Before ``storage_align(f, "A_shared", 0, 32, 1)``::

        alloc A_shared: float32[16, 32] shared
        for A_shared.ax0 in range(16):
          for A_shared.ax1 in range(32):
            block A_shared SS (ax0=A_shared.ax0, ax1=A_shared.ax1):
              A_shared[ax0, ax1] = A[ax0, ax1]
        for C.i in range(16):
          for C.j in range(32):
            block C SS (i=C.i, j=C.j):
              C[i, j] = A_shared[i, j] * 2.0

    After (only the allocation changes: rows of A_shared are 33 elements apart)::

        alloc A_shared: float32[16, 32] shared align=[(0, 32, 1)]
        for A_shared.ax0 in range(16):
          for A_shared.ax1 in range(32):
            block A_shared SS (ax0=A_shared.ax0, ax1=A_shared.ax1):
              A_shared[ax0, ax1] = A[ax0, ax1]
        for C.i in range(16):
          for C.j in range(32):
            block C SS (i=C.i, j=C.j):
              C[i, j] = A_shared[i, j] * 2.0
    """
    prim = "storage_align"
    buf = _intermediate(func, prim, block)
    if len(buf.shape) < 2:
        fail(prim, "dim", dim, f"{buf.name} has {len(buf.shape)} dimension(s), so no non-last dimension to pad")
    if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < len(buf.shape) - 1:
        fail(prim, "dim", dim, f"must index a non-last dimension of {buf.name} (0..{len(buf.shape) - 2})")
    check_positive_int(prim, "factor", factor, upper=2**31 - 1)  # a row stride is a 32-bit index
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < factor:
        fail(prim, "offset", offset, f"must be an integer in [0, factor={factor})")
    align = (*(a for a in buf.align if a[0] != dim), (dim, factor, offset))
    return func.with_buffer(replace(buf, align=align)), None


def storage_permute(func: Func, block: str, dim: int, factors: list[int], order: list[int]) -> tuple[Func, None]:
    """Store dimension ``dim`` of the buffer ``block`` writes with its digits reordered.

    An index ``i`` of that dimension has the digits ``i = d0 * (f1 * f2 ...) + d1 * (f2 ...) + ...`` in the
    mixed radix ``factors`` (outermost first); it is stored at the position whose digits are ``d[order[0]]``
    (outermost), ``d[order[1]]``, ...  The dimension keeps its extent (the product of ``factors``), so this
    is a permutation of its elements.  Against bank conflicts: a thread that owns 8 neighbouring fp32 columns
    reads them as two 16-byte loads, and a quarter warp's first loads then fall 32 bytes apart, two lanes per
    bank group; ``factors=[16, 2, 4], order=[1, 0, 2]`` puts every thread's first 4 columns side by side.

    Before ``storage_permute(f, "B_shared", 1, [4, 2, 2], [1, 0, 2])``::

        alloc B_shared: float32[4, 16] shared
        for B_shared.ax0 in range(4):
          for B_shared.ax1 in range(16):
            block B_shared SS (ax0=B_shared.ax0, ax1=B_shared.ax1):
              B_shared[ax0, ax1] = B[ax0, ax1]
        for C.i in range(2):
          for C.j in range(16):
            for C.k in range(4):
              block C SSR (i=C.i, j=C.j, k=C.k):
                init C[i, j] = 0.0
                C[i, j] += A[i, k] * B_shared[k, j]

    After (only the allocation changes: column ``4 t + 2 h + v`` is stored at ``8 h + 2 t + v``)::

        alloc B_shared: float32[4, 16] shared permute=[(1, [4, 2, 2], [1, 0, 2])]
        for B_shared.ax0 in range(4):
          for B_shared.ax1 in range(16):
            block B_shared SS (ax0=B_shared.ax0, ax1=B_shared.ax1):
              B_shared[ax0, ax1] = B[ax0, ax1]
        for C.i in range(2):
          for C.j in range(16):
            for C.k in range(4):
              block C SSR (i=C.i, j=C.j, k=C.k):
                init C[i, j] = 0.0
                C[i, j] += A[i, k] * B_shared[k, j]
    """
    prim = "storage_permute"
    buf = _intermediate(func, prim, block)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < len(buf.shape):
        fail(prim, "dim", dim, f"must index a dimension of {buf.name} (0..{len(buf.shape) - 1})")
    extent = as_int(buf.shape[dim])
    if extent is None:
        fail(prim, "dim", dim, f"dimension {dim} of {buf.name} is symbolic ({buf.shape[dim]}); it must be constant")
    if not isinstance(factors, (list, tuple)) or len(factors) < 2:
        fail(prim, "factors", factors, "must be a list of at least two positive integers")
    for f in factors:
        check_positive_int(prim, "factors", f)
    if math.prod(factors) != extent:
        fail(prim, "factors", factors, f"multiply to {math.prod(factors)}, but dimension {dim} of {buf.name} has "
             f"{extent} elements")
    if (not isinstance(order, (list, tuple)) or not all(isinstance(o, int) and not isinstance(o, bool) for o in order)
            or sorted(order) != list(range(len(factors)))):
        fail(prim, "order", order, f"must be a permutation of 0..{len(factors) - 1}")
    entry = (dim, tuple(int(f) for f in factors), tuple(int(o) for o in order))
    permute = (*(p for p in buf.permute if p[0] != dim), entry)
    return func.with_buffer(replace(buf, permute=permute)), None
