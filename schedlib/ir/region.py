"""Region inference: which part of a buffer a loop subtree touches.

When a block moves under a loop (compute_at / reverse_compute_at) it only needs to produce or consume the
elements touched in one iteration of that loop.  For every access we substitute the accessing block's
bindings, hold the loops at and above the anchor *fixed*, let every other loop vary over its extent, and
bound each index.  Affine indices give an exact box ``[base + lo, base + hi]`` whose extent does not depend
on the fixed loops; anything else falls back to the whole dimension, which is always correct.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedlib.ir.expr import Binary, Const, Expr, Var, as_int
from schedlib.ir.func import Block, Func
from schedlib.ir.simplify import (
    bounds,
    conjuncts,
    free_vars,
    from_affine,
    simplify,
    substitute,
    to_affine,
    var_ranges,
)

Interval = tuple[Expr, Expr, Expr]  # base (fixed loops only), lo, hi offsets (no loop variables)


def _interval(index: Expr, varying: dict[str, Expr]) -> Interval | None:
    terms, c = to_affine(simplify(index))
    base_terms: dict[Expr, int] = {}
    lo: Expr = Const(0)
    hi: Expr = Const(0)
    const_ranges = var_ranges(varying)
    for atom, k in terms.items():
        names = free_vars(atom)
        if not names & varying.keys():
            base_terms[atom] = k
            continue
        if isinstance(atom, Var):
            span = (varying[atom.name] - 1) * abs(k)
            if k > 0:
                hi = hi + span
            else:
                lo = lo - span
            continue
        if names <= const_ranges.keys():
            b = bounds(atom, const_ranges)
            if b is not None:
                lo = lo + min(k * b[0], k * b[1])
                hi = hi + max(k * b[0], k * b[1])
                continue
        scaled = _scaled_interval(atom, varying)
        if scaled is not None:
            # loops times a symbolic step (split(i, [2, 2, None]) over a symbolic n: (i_0 * 2 + i_1) * ((n + 3) // 4));
            # without this the box fell back to the whole dimension, which a reader under a loop bound to
            # blockIdx or threadIdx reads from memory that other CUDA blocks or threads wrote
            base_x, lo_x, hi_x = scaled
            base_terms[base_x] = base_terms.get(base_x, 0) + k
            lo = lo + (k * lo_x if k > 0 else k * hi_x)
            hi = hi + (k * hi_x if k > 0 else k * lo_x)
            continue
        return None
    return from_affine(base_terms, c), simplify(lo), simplify(hi)


def _scaled_interval(atom: Expr, varying: dict[str, Expr]) -> Interval | None:
    """``x * step`` with ``x`` over the varying loops and ``step`` over neither them nor anything that can be
    negative: ``x``'s interval, each part times ``step`` (which keeps lo <= hi)."""
    if not (isinstance(atom, Binary) and atom.op == "*"):
        return None
    for x, step in ((atom.a, atom.b), (atom.b, atom.a)):
        if free_vars(step) & varying.keys() or not _nonnegative(step):
            continue
        inner = _interval(x, varying)
        if inner is None:
            return None
        base, lo, hi = inner
        return simplify(base * step), simplify(lo * step), simplify(hi * step)
    return None


def _nonnegative(e: Expr) -> bool:
    """True for an expression built of variables (symbols are sizes, loops count from 0: never negative),
    non-negative constants, ``+``, ``*`` and ``//``: the steps that a split of a symbolic extent puts into its
    indices."""
    if isinstance(e, Const):
        return as_int(e) is not None and as_int(e) >= 0
    if isinstance(e, Var):
        return True
    if isinstance(e, Binary) and e.op in ("+", "*", "//"):
        return _nonnegative(e.a) and _nonnegative(e.b)
    return False


def access_region(func: Func, accesses: Sequence[tuple[Block, Sequence[Expr]]], fixed: set[str],
                  shape: Sequence[Expr], widen: bool = True) -> list[tuple[Expr, Expr]]:
    """The ``(min, extent)`` box per dimension covering every access, with ``fixed`` loops held constant.

    ``accesses`` pairs a block with index expressions written over its axes (and possibly loop vars).
    With ``widen`` a box at least as large as a dimension becomes the whole dimension (base 0): right for
    a producer, which then fills all of it; a consumer of what one iteration wrote needs the window itself
    (``widen=False``), since the whole dimension includes elements that iteration did not write.
    """
    per_dim: list[list[Interval | None]] = [[] for _ in shape]
    for block, indices in accesses:
        binding = {a.name: b for a, b in zip(block.axes, block.bindings)}
        varying = {lp.name: lp.extent for lp in func.all_loops(block) if lp.name not in fixed}
        for d, idx in enumerate(indices):
            per_dim[d].append(_interval(substitute(idx, binding), varying))
    region = []
    for d, intervals in enumerate(per_dim):
        region.append(_union(intervals, shape[d], widen))
    return region


def _union(intervals: list[Interval | None], dim: Expr, widen: bool = True) -> tuple[Expr, Expr]:
    whole = (Const(0), dim)
    if not intervals or any(iv is None for iv in intervals):
        return whole
    base0, lo0, hi0 = intervals[0]  # type: ignore[misc]
    los, his = [lo0], [hi0]
    for iv in intervals[1:]:
        base, lo, hi = iv  # type: ignore[misc]
        shift = simplify(base - base0)
        if not isinstance(shift, Const):
            return whole
        los.append(simplify(lo + shift))
        his.append(simplify(hi + shift))
    lo = _extreme(los, min)
    hi = _extreme(his, max)
    if lo is None or hi is None:
        return whole
    extent = simplify(hi - lo + 1)
    ext_c, dim_c = as_int(extent), as_int(dim)
    if widen and ext_c is not None and dim_c is not None and ext_c >= dim_c:
        return whole
    return simplify(base0 + lo), extent


def _extreme(values: list[Expr], pick) -> Expr | None:
    if all(v == values[0] for v in values):
        return values[0]
    ints = [as_int(v) for v in values]
    if any(i is None for i in ints):
        return None
    return Const(pick(ints))


def covers_box(func: Func, block: Block, indices: Sequence[Expr], fixed: set[str], shape: Sequence[Expr],
               region: Sequence[tuple[Expr, Expr]]) -> bool:
    """True if one iteration of the ``fixed`` loops makes ``block`` touch *every* element of its region box.

    ``access_region`` over-approximates: ``i_0 * 4 + i_1`` with only ``i_0`` varying touches every 4th
    element of a box of ``4 * (n - 1) + 1``.  The box is covered exactly when each index is its fixed part
    plus a dense mixed-radix walk of its own varying loops (coefficients 1, n1, n1*n2, ...), no loop feeding
    two indices, and the block's guards only trim an index at the buffer's edge (which readers of the box
    trim alike) or skip reduction steps.  A guard from an overshooting inner split (``i_1 * 3 + i_2 < 4``)
    masks points inside the box, and a guard on fixed loops may mask a whole iteration: both leave holes.
    ``region`` is the box as ``access_region`` gave it; it must be exactly the one walked (not widened to
    the whole dimension while the index still moves with the fixed loops).
    """
    binding = {a.name: b for a, b in zip(block.axes, block.bindings)}
    varying = {lp.name: lp.extent for lp in func.all_loops(block) if lp.name not in fixed}
    canon = [to_affine(simplify(substitute(idx, binding))) for idx in indices]
    reduce_only = {lp.name for lp in block.loops if block.loop_kind(lp.name) == "R"
                   and not any(a.kind == "S" and lp.name in free_vars(b) for a, b in zip(block.axes, block.bindings))}
    loop_names = {lp.name for lp in func.all_loops(block)}
    for guard in conjuncts(block.predicate):
        used = free_vars(guard) & loop_names
        if used and used <= reduce_only:
            continue
        if not (isinstance(guard, Binary) and any(
                to_affine(simplify(guard.a)) == canon[d] and
                ((guard.op == "<" and guard.b == shape[d]) or (guard.op == ">=" and guard.b == Const(0)))
                for d in range(len(canon)))):
            return False
    ranges = var_ranges({lp.name: lp.extent for lp in func.all_loops(block)})
    used_loops: set[str] = set()
    for (terms, c), (base, extent), dim in zip(canon, region, shape):
        walk: list[tuple[int, str]] = []
        fixed_part: dict[Expr, int] = {}
        for atom, k in terms.items():
            if not free_vars(atom) & varying.keys():
                fixed_part[atom] = k
                continue
            if not isinstance(atom, Var) or k < 1 or atom.name in used_loops:
                return False
            used_loops.add(atom.name)
            walk.append((k, atom.name))
        span: Expr = Const(1)
        for k, name in sorted(walk):
            if as_int(span) != k:
                return False
            span = simplify(span * varying[name])
        # The walked window [fixed part, + span) must be the region box in every iteration; a window at
        # least as wide as the dim, always at 0, also covers a box widened to the whole dim.
        if bounds(simplify(from_affine(fixed_part, c) - base), ranges) != (0, 0):
            return False
        if simplify(span - extent) != Const(0):
            span_c, dim_c = as_int(span), as_int(dim)
            if not (extent == dim and span_c is not None and dim_c is not None and span_c >= dim_c):
                return False
    return True


def tiles_whole_buffer(func: Func, host: Block, fixed: set[str], shape: Sequence[Expr],
                       region: Sequence[tuple[Expr, Expr]]) -> bool:
    """True if the per-iteration boxes of ``region`` (``access_region`` with ``fixed`` loops held), over all
    iterations of those loops, cover every element of a buffer of ``shape`` exactly once: each dimension is
    whole, or tiled exactly by a fixed loop of its own (box ``[v * e, e)`` with ``v`` running over
    ``ceil(n / e)`` values; for a symbolic ``n``, ``e`` = 1 and ``v`` running over ``n``), and every other
    fixed loop runs once.  One loop tiling two dimensions walks a diagonal; a fixed loop that tiles none
    would compute the same boxes again in each of its iterations (concurrently, where it is bound to blocks
    or threads).  A sufficient condition, not a necessary one: anything else answers False."""
    extents = {lp.name: lp.extent for lp in func.all_loops(host)}
    used: set[str] = set()
    for (base, extent), size in zip(region, shape):
        e, n = as_int(extent), as_int(size)
        terms, c = to_affine(simplify(base))
        if not terms and c == 0 and e is not None and n is not None and e >= n:
            continue
        if e is None or c != 0 or len(terms) != 1:
            return False
        ((atom, k),) = terms.items()
        if not isinstance(atom, Var) or atom.name not in fixed or atom.name in used or k != e:
            return False
        used.add(atom.name)
        trips = extents.get(atom.name)
        whole = (n is not None and as_int(trips) is not None and as_int(trips) * e >= n) or \
            (e == 1 and trips is not None and simplify(trips) == simplify(size))
        if not whole:
            return False
    return not repeating_loops(func, host, fixed, region)


def repeating_loops(func: Func, host: Block, fixed: set[str], region: Sequence[tuple[Expr, Expr]]) -> list[str]:
    """The ``fixed`` loops of more than one iteration whose iterations cover some of each other's boxes of
    ``region``: their variable places no dimension (each iteration covers the same box again), or places one
    with a step shorter than the box (``P[i:i + 2]`` for each ``i``: neighbours overlap).  A block placed there
    is computed again over those elements (concurrently, where the loop is bound to blocks or threads)."""
    apart: set[str] = set()  # loops that move the box by at least its extent along some dimension
    for base, extent in region:
        e = as_int(extent)
        terms, _ = to_affine(simplify(base))
        apart |= {atom.name for atom, k in terms.items() if isinstance(atom, Var) and e is not None and abs(k) >= e}
    return [lp.name for lp in func.all_loops(host)
            if lp.name in fixed and as_int(lp.extent) != 1 and lp.name not in apart]
