"""Region inference: which part of a buffer a loop subtree touches.

When a block moves under a loop (compute_at / reverse_compute_at) it only needs to produce or consume the
elements touched in one iteration of that loop.  For every access we substitute the accessing block's
bindings, hold the loops at and above the anchor *fixed*, let every other loop vary over its extent, and
bound each index.  Affine indices give an exact box ``[base + lo, base + hi]`` whose extent does not depend
on the fixed loops; anything else falls back to the whole dimension, which is always correct.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedlib.ir.expr import Const, Expr, Var, as_int
from schedlib.ir.func import Block, Func
from schedlib.ir.simplify import bounds, free_vars, from_affine, simplify, substitute, to_affine, var_ranges

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
        return None
    return from_affine(base_terms, c), simplify(lo), simplify(hi)


def access_region(func: Func, accesses: Sequence[tuple[Block, Sequence[Expr]]], fixed: set[str],
                  shape: Sequence[Expr]) -> list[tuple[Expr, Expr]]:
    """The ``(min, extent)`` box per dimension covering every access, with ``fixed`` loops held constant.

    ``accesses`` pairs a block with index expressions written over its axes (and possibly loop vars).
    """
    per_dim: list[list[Interval | None]] = [[] for _ in shape]
    for block, indices in accesses:
        binding = {a.name: b for a, b in zip(block.axes, block.bindings)}
        varying = {lp.name: lp.extent for lp in func.all_loops(block) if lp.name not in fixed}
        for d, idx in enumerate(indices):
            per_dim[d].append(_interval(substitute(idx, binding), varying))
    region = []
    for d, intervals in enumerate(per_dim):
        region.append(_union(intervals, shape[d]))
    return region


def _union(intervals: list[Interval | None], dim: Expr) -> tuple[Expr, Expr]:
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
    if ext_c is not None and dim_c is not None and ext_c >= dim_c:
        return whole
    return simplify(base0 + lo), extent


def _extreme(values: list[Expr], pick) -> Expr | None:
    if all(v == values[0] for v in values):
        return values[0]
    ints = [as_int(v) for v in values]
    if any(i is None for i in ints):
        return None
    return Const(pick(ints))
