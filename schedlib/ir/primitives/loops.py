"""Loop-shape primitives: split, fuse, reorder.  Each is a pure function ``(func, ...) -> (func, result)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from math import prod

from schedlib.ir.expr import Const, Expr, as_int, binary, ceildiv
from schedlib.ir.func import Attach, Func, Loop
from schedlib.ir.primitives.common import fail, fresh_loop, get_loop, normalize, short
from schedlib.ir.simplify import conjunction, conjuncts

INT32_MAX = 2**31 - 1  # loop variables and indices are C ints in the generated code


def _move_attachments(func: Func, block: str, old: str, new: str) -> Func:
    blocks = tuple(
        replace(b, attach=Attach(block, new, b.attach.position))
        if b.attach is not None and b.attach.block == block and b.attach.loop == old else b
        for b in func.blocks)
    return replace(func, blocks=blocks, _index={})


def split(func: Func, loop: str, factors: Sequence[int | None]) -> tuple[Func, list[str]]:
    """Split ``loop`` into nested loops with the given extents; one factor may be ``None`` (inferred).

    When the factors overshoot the extent, the block and every block attached inside ``loop`` get a guard.
    Blocks attached at ``loop`` move to the innermost new loop.  Returns the new loop names, outermost first.

    Before ``split(f, "C.i", [None, 16])`` with ``C.i`` of extent 40::

        for C.i in range(40):
          block C S (i=C.i):
            C[i] = A[i] * 2.0

    After::

        for C.i_0 in range(3):
          for C.i_1 in range(16):
            block C S (i=C.i_0 * 16 + C.i_1) where C.i_0 * 16 + C.i_1 < 40:
              C[i] = A[i] * 2.0
    """
    prim = "split"
    owner, idx = get_loop(func, prim, loop)
    lp = owner.loops[idx]
    if not isinstance(factors, (list, tuple)) or len(factors) < 2:
        fail(prim, "factors", factors, "must be a list of at least two extents")
    if sum(f is None for f in factors) > 1:
        fail(prim, "factors", factors, "at most one factor may be None")
    for f in factors:
        if f is not None and (isinstance(f, bool) or not isinstance(f, int) or f < 1):
            fail(prim, "factors", factors, f"factor {f!r} must be a positive integer or None")
        if f is not None and f > INT32_MAX:
            fail(prim, "factors", factors, f"factor {f} exceeds 2^31-1; loop variables are 32-bit ints")
    if lp.thread or lp.vectorized:
        fail(prim, "loop", loop, f"is {'bound to ' + lp.thread if lp.thread else 'vectorized'}; split it first")
    if lp.annotations:  # a hint (pipeline_stages, raster) names one loop; which piece keeps it is ambiguous
        fail(prim, "loop", loop, f"is annotated ({', '.join(k for k, _ in lp.annotations)}); split before annotating")
    known = prod(f for f in factors if f is not None)
    if known > INT32_MAX:
        fail(prim, "factors", factors, f"product {known} exceeds 2^31-1; the split index would overflow 32 bits")
    extent = lp.extent
    ext_c = as_int(extent)
    if None in factors:
        missing: Expr = ceildiv(extent, known) if ext_c is None else Const(-(-ext_c // known))
        sizes: list[Expr] = [missing if f is None else Const(f) for f in factors]
    else:
        if ext_c is None:
            fail(prim, "factors", factors, f"cannot cover the symbolic extent {extent}; put None in one slot")
        if known < ext_c:
            fail(prim, "factors", factors, f"product {known} is smaller than the extent {ext_c}")
        sizes = [Const(f) for f in factors]
    covered = prod(as_int(s) or 0 for s in sizes)
    if covered > INT32_MAX:
        fail(prim, "factors", factors, f"the loops cover {covered} iterations, more than 2^31-1; "
             "the split index would overflow 32 bits")
    taken = func.all_loop_names()
    names = [fresh_loop(func, owner.name, f"{short(loop)}_{k}", taken) for k in range(len(sizes))]
    value: Expr = Const(0)
    for name, size in zip(names, sizes):
        value = binary("+", binary("*", value, size), Loop(name, size).var)
    exact = ext_c is not None and covered == ext_c
    new_loops = tuple(Loop(n, s, unrolled=lp.unrolled if k == len(sizes) - 1 else False)
                      for k, (n, s) in enumerate(zip(names, sizes)))
    out = func.substitute_loops({loop: value})
    if not exact:
        # Every block run inside the loop (the owner and all blocks attached at or below it) must skip
        # the overshooting iterations, or an attached producer/consumer would touch out-of-range elements.
        guard = binary("<", value, extent)
        for inner in func.subtree(owner.name, idx):
            b = out.block(inner.name)
            out = out.with_block(replace(b, predicate=conjunction([*conjuncts(b.predicate), guard])))
    blk = out.block(owner.name)
    blk = replace(blk, loops=blk.loops[:idx] + new_loops + blk.loops[idx + 1:])
    out = _move_attachments(out.with_block(blk), owner.name, loop, names[-1])
    return normalize(out), names


def fuse(func: Func, loops: Sequence[str]) -> tuple[Func, str]:
    """Fuse consecutive loops of one block (outermost first) into a single loop; returns its name.

    Before ``fuse(f, ["C.i", "C.j"])``::

        for C.i in range(4):
          for C.j in range(8):
            block C SS (i=C.i, j=C.j):
              C[i, j] = A[i, j] + 1.0

    After::

        for C.i_j_fused in range(32):
          block C SS (i=C.i_j_fused // 8, j=C.i_j_fused % 8):
            C[i, j] = A[i, j] + 1.0
    """
    prim = "fuse"
    if not isinstance(loops, (list, tuple)) or len(loops) < 2:
        fail(prim, "loops", loops, "must list at least two loops")
    owners = [get_loop(func, prim, name, "loops") for name in loops]
    block = owners[0][0]
    if any(b.name != block.name for b, _ in owners):
        fail(prim, "loops", list(loops), "loops belong to different blocks")
    positions = [i for _, i in owners]
    if positions != list(range(positions[0], positions[0] + len(positions))):
        fail(prim, "loops", list(loops), "must be adjacent and listed outermost first")
    for name, (_, i) in zip(loops, owners):
        lp = block.loops[i]
        if lp.thread or lp.vectorized or lp.unrolled or lp.annotations:
            # one loop's way of running (or its hint) would silently apply to the others, or be lost
            fail(prim, "loops", name, "is bound, vectorized, unrolled or annotated; fuse before annotating")
    for name in loops[:-1]:
        if func.attached_at(block.name, name):
            fail(prim, "loops", name, "has blocks attached to it; fusing would move them")
    extents = [block.loops[i].extent for i in positions]
    fused_extent: Expr = Const(1)
    for e in extents:
        fused_extent = binary("*", fused_extent, e)
    sizes = [as_int(e) for e in extents]
    total = None if None in sizes else prod(sizes)
    if total is not None and total > INT32_MAX:
        fail(prim, "loops", list(loops), f"the fused loop would run {total} iterations, more than 2^31-1; "
             "its index would overflow 32 bits")
    taken = func.all_loop_names()
    fused = fresh_loop(func, block.name, "_".join(short(n) for n in loops) + "_fused", taken)
    fvar = Loop(fused, fused_extent).var
    mapping: dict[str, Expr] = {}
    inner: Expr = Const(1)
    for k in range(len(loops) - 1, -1, -1):
        value = binary("//", fvar, inner)
        if k > 0:
            value = binary("%", value, extents[k])
        mapping[loops[k]] = value
        inner = binary("*", inner, extents[k])
    out = func.substitute_loops(mapping)
    blk = out.block(block.name)
    first = positions[0]
    blk = replace(blk, loops=(*blk.loops[:first], Loop(fused, fused_extent), *blk.loops[positions[-1] + 1:]))
    out = _move_attachments(out.with_block(blk), block.name, loops[-1], fused)
    return normalize(out), fused


def reorder(func: Func, loops: Sequence[str]) -> tuple[Func, None]:
    """Put the given loops of one block in the given order, in the slots they occupy now.

    Loops may not cross a point where other blocks are attached.

    Before ``reorder(f, ["C.j", "C.i"])``::

        for C.i in range(4):
          for C.j in range(8):
            block C SS (i=C.i, j=C.j):
              C[i, j] = A[i, j] + 1.0

    After::

        for C.j in range(8):
          for C.i in range(4):
            block C SS (i=C.i, j=C.j):
              C[i, j] = A[i, j] + 1.0
    """
    prim = "reorder"
    if not isinstance(loops, (list, tuple)) or len(loops) < 2:
        fail(prim, "loops", loops, "must list at least two loops")
    owners = [get_loop(func, prim, name, "loops") for name in loops]
    if len(set(loops)) != len(loops):
        fail(prim, "loops", list(loops), "a loop is listed twice")
    block = owners[0][0]
    if any(b.name != block.name for b, _ in owners):
        fail(prim, "loops", list(loops), "loops belong to different blocks")
    slots = sorted(i for _, i in owners)
    new = list(block.loops)
    by_name = {lp.name: lp for lp in block.loops}
    for slot, name in zip(slots, loops):
        new[slot] = by_name[name]
    for lp in new[:-1]:
        if lp.vectorized:  # vectorize accepts only the innermost loop, and codegen relies on it
            fail(prim, "loops", list(loops), f"would move vectorized loop {lp.name} out of the innermost place")
    for i, lp in enumerate(block.loops):
        if func.attached_at(block.name, lp.name):
            if new[i].name != lp.name or {x.name for x in new[:i]} != {x.name for x in block.loops[:i]}:
                fail(prim, "loops", list(loops), f"would move loops across {lp.name}, where blocks are attached")
    out = func.with_block(replace(block, loops=tuple(new)))
    return out, None

