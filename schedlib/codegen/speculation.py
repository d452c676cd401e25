"""Speculative accumulation: a thread's private accumulators are computed at the padding points too.

A matmul thread whose 8 x 8 register tile overhangs M or N checks its row and column before every
multiply-add (``if (row0 + i < M && col0 + j < N) C_local[i][j] += A_s[i][k] * B_s[k][j]``).  The padding
points' results are never read: the write-back to global memory keeps its checks, and every reader of the
registers runs over the output's points only.  So these checks can go where computing a padding point is
harmless:

* the block stores into a register array (``local``): nothing another thread or kernel can see;
* it reads only shared and register arrays, at indices inside them for every point of its loops: the
  padding points read stale or poisoned values, but from memory the kernel owns;
* nothing it computes can trap on such values (an integer division, a float-to-integer conversion);
* the check involves the block's spatial axes only.  A check on a reduction axis stays: a padding step of k
  would add into an accumulator whose output point is real.

Without the checks the compiler vectorises the shared reads and keeps no predicates live across the nest
(the h100 default for a 1000 x 1000 x 1024 fp32 matmul, 64 x 64 x 8 tiles of 8 x 8 per thread: 1079 SASS
instructions per k step, 512 of them FFMA and 256 scalar shared loads, before; 614 with 32 vector loads).
"""

from __future__ import annotations

from schedlib.ir.dtype import is_float, is_int
from schedlib.ir.expr import Binary, Cast, Const, Expr, Load, as_int
from schedlib.ir.func import Block, Func
from schedlib.ir.simplify import bounds, free_vars, simplify, substitute, walk


def speculated_guards(func: Func, block: Block, bindings: dict[str, Expr], ranges: dict[str, tuple[int, int]],
                      guards: list[Expr]) -> set[Expr]:
    """The guards among ``guards`` (``block``'s predicate in loop terms, as ``bindings`` and ``ranges`` give
    them) that the block may run without; see the module docstring."""
    if func.buffer(block.store).scope != "local" or not guards:
        return set()
    value = simplify(substitute(block.value, bindings), ranges)
    accesses = [(ld.buffer, ld.indices) for ld in walk(value) if isinstance(ld, Load)]
    store = tuple(simplify(substitute(i, bindings), ranges) for i in block.store_indices)
    if not all(_inside(func, buffer, indices, ranges) for buffer, indices in [(block.store, store), *accesses]):
        return set()
    if any(may_trap(e) for e in walk(value)):
        return set()
    spatial: set[str] = set()
    reduce_: set[str] = set()
    for axis, binding in zip(block.axes, block.bindings):
        (spatial if axis.kind == "S" else reduce_).update(free_vars(simplify(substitute(binding, bindings), ranges)))
    loops = {g: free_vars(g) - set(func.symbols) for g in guards}  # a size (``i < N``) is no loop
    return {g for g, names in loops.items() if names and names <= spatial - reduce_}


def _inside(func: Func, buffer: str, indices: tuple[Expr, ...], ranges: dict[str, tuple[int, int]]) -> bool:
    """Whether ``buffer`` is shared or local and every index stays inside its dimension over ``ranges``."""
    buf = func.buffer(buffer)
    if buf.scope not in ("shared", "local") or len(indices) != len(buf.shape):
        return False
    for index, extent in zip(indices, buf.shape):
        span, size = bounds(index, ranges), as_int(extent)
        if span is None or size is None or span[0] < 0 or span[1] >= size:
            return False
    return True


def may_trap(e: Expr) -> bool:
    """Integer division by a value that may be zero, or a float converted to an integer (out of range on a
    stale value: undefined in C++, and the CPU emulator runs the same C++)."""
    if isinstance(e, Binary) and e.op in ("//", "%") and is_int(e.dtype):
        return not (isinstance(e.b, Const) and int(e.b.value) != 0)
    return isinstance(e, Cast) and is_int(e.dtype) and is_float(e.value.dtype)
