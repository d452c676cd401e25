"""Symbol values from input dimensions that are affine in one symbol: ``N + 1``, ``2 * N``, ``2 * N + 1``.

A bare symbol is read off an input's shape directly.  A CSR row-pointer array of ``N + 1`` entries, or
interleaved pairs of ``2 * N`` values, is as ordinary, yet a func with such an input built and then refused every
input ("dimension N cannot be inferred").  Only ``+``, ``-`` and ``*`` by known values are inverted: each has
at most one solution.  A floor division or modulo (``N // 2`` of size 4: N = 8 or 9) is left unsolved, and the
caller says that the dimension cannot be inferred.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from schedlib.ir.expr import Binary, Const, Expr, Var, as_int
from schedlib.ir.simplify import free_vars, substitute


def _known(e: Expr, env: Mapping[str, int]) -> int | None:
    """The value of ``e`` when every symbol in it is bound, else None."""
    names = free_vars(e)
    if names - set(env):
        return None
    return as_int(substitute(e, {n: Const(int(env[n])) for n in names}))


def _invert(e: Expr, target: Fraction, env: Mapping[str, int]) -> tuple[str, Fraction] | None:
    if isinstance(e, Var):
        return None if e.name in env else (e.name, target)
    if not (isinstance(e, Binary) and e.op in ("+", "-", "*")):
        return None
    ka, kb = _known(e.a, env), _known(e.b, env)
    if (ka is None) == (kb is None):  # both known (nothing to solve) or both unknown (not affine in one symbol)
        return None
    if e.op == "+":
        return _invert(e.a, target - kb, env) if kb is not None else _invert(e.b, target - ka, env)
    if e.op == "-":
        return _invert(e.a, target + kb, env) if kb is not None else _invert(e.b, ka - target, env)
    factor = kb if kb is not None else ka
    if not factor:
        return None
    return _invert(e.a if kb is not None else e.b, target / factor, env)


def solve_dim(dim: Expr, size: int, env: Mapping[str, int]) -> tuple[str, Fraction] | None:
    """The one unbound symbol of ``dim`` and the value that makes ``dim == size`` (possibly not an integer,
    or negative: the caller refuses those), or None when ``dim`` is not affine in exactly one unbound symbol."""
    return _invert(dim, Fraction(size), env)
