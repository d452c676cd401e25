"""Proving that a vectorized copy can use one 4/8/16-byte access per thread.

A loop ``v`` of extent ``V`` marked ``vectorize`` may become a single vector load/store when the flat index
is ``base + v`` with ``base`` a multiple of ``V`` (so the access is aligned), for *every* value of the outer
loops.  Index expressions contain ``//`` and ``%`` from fuse/split, so the proof peels ``v`` through them:
with ``X`` a multiple of ``V`` and ``V | c``, ``(X + v) // c == X // c`` and ``(X + v) % c == X % c + v``.
"""

from __future__ import annotations

from math import gcd

from schedlib.ir.expr import Binary, Const, Expr, Var, as_int, binary
from schedlib.ir.simplify import free_vars, from_affine, to_affine


def multiple_of(e: Expr) -> int:
    """A positive integer that provably divides every value of ``e`` (1 when nothing is known)."""
    if isinstance(e, Const) and not isinstance(e.value, float):
        return abs(int(e.value)) or 1 << 30
    if isinstance(e, Binary):
        a, b = multiple_of(e.a), multiple_of(e.b)
        if e.op == "*":
            return a * b
        if e.op in ("+", "-", "min", "max"):
            return gcd(a, b)
        c = as_int(e.b)
        if e.op == "%" and c:
            return gcd(a, c)
        if e.op == "//" and c and a % c == 0:
            return a // c
    return 1


def peel(e: Expr, v: str, width: int) -> tuple[Expr, int] | None:
    """Write ``e`` as ``base + k * v`` for ``v`` in ``[0, width)``; None when that is not provable."""
    terms, const = to_affine(e)
    base: dict[Expr, int] = {}
    k_v = 0
    for atom, k in terms.items():
        if v not in free_vars(atom):
            base[atom] = base.get(atom, 0) + k
            continue
        if isinstance(atom, Var):
            k_v += k
            continue
        if isinstance(atom, Binary) and atom.op in ("//", "%"):
            c = as_int(atom.b)
            inner = peel(atom.a, v, width)
            if not c or inner is None or inner[1] != 1 or c % width or multiple_of(inner[0]) % width:
                return None
            rest = binary(atom.op, inner[0], atom.b)
            base[rest] = base.get(rest, 0) + k
            if atom.op == "%":
                k_v += k
            continue
        return None
    return from_affine(base, const), k_v


def aligned_base(e: Expr, v: str, width: int) -> Expr | None:
    """``base`` when ``e == base + v`` with ``base`` a multiple of ``width``, else None."""
    found = peel(e, v, width)
    if found is None or found[1] != 1 or multiple_of(found[0]) % width:
        return None
    return found[0]


def uniform_guard(cond: Expr, v: str, width: int) -> Expr | None:
    """A guard on ``v = 0`` equivalent to ``cond`` for every ``v`` in ``[0, width)``, or None.

    Holds for ``base + v < E`` with ``width | E`` and ``base + v >= 0`` with ``base`` a multiple of ``width``.
    """
    if v not in free_vars(cond):
        return cond
    if isinstance(cond, Binary) and cond.op in ("<", ">="):
        base = aligned_base(cond.a, v, width)
        bound = as_int(cond.b)
        if base is None or bound is None:
            return None
        if cond.op == "<" and bound % width == 0:
            return binary("<", base, cond.b)
        if cond.op == ">=" and bound == 0:
            return binary(">=", base, cond.b)
    return None


VECTOR_TYPES = {4: "unsigned int", 8: "uint2", 16: "uint4"}
