"""Where fp16/bf16 arithmetic rounds.  It is computed in float (the reference and the generated CUDA alike)
and rounded only where a stage stores it or a cast converts it, so a cast of such arithmetic to its own type
is not a no-op: it is the rounding a store would do.  :func:`rounded` keeps that cast; type promotion inside an
expression (:func:`~schedlib.ir.expr.cast`) drops it, since promotion rounds nothing.
"""

from __future__ import annotations

import numpy as np

from schedlib.ir.dtype import canonical_dtype, round_to_dtype
from schedlib.ir.expr import Binary, Call, Cast, Const, Expr, ExprLike, Load, Select, cast, const

__all__ = ["rounded"]


def _holds_its_type(v: Expr) -> bool:
    """``v`` is a value of its own type with no rounding owed: a load, a cast, a constant the type holds
    exactly (an fp16 constant stays the float literal it was written as: 0.1 is not fp16's 0.09998), or a
    max, min, absolute value, negation or choice of such values (each returns one of its operands, or flips a
    sign)."""
    if isinstance(v, (Load, Cast)):
        return True
    if isinstance(v, Const):  # (1e9 is inf in fp16: not held, so the cast stays)
        held = round_to_dtype(np.array([v.value], dtype=np.float32), v.dtype)
        return float(np.asarray(held, dtype=np.float64)[0]) == float(v.value)
    if isinstance(v, Binary) and v.op in ("max", "min"):
        return _holds_its_type(v.a) and _holds_its_type(v.b)
    if isinstance(v, Call) and v.fn in ("abs", "neg"):
        return _holds_its_type(v.args[0])
    if isinstance(v, Select):
        return _holds_its_type(v.then) and _holds_its_type(v.other)
    return False


def rounded(dtype: str, value: ExprLike) -> Expr:
    """``value`` as a store into a ``dtype`` buffer would leave it: :func:`cast`, and for fp16/bf16 arithmetic
    of that very type (computed in float, rounded only where stored or cast) a cast that rounds it.  What an
    explicit ``astype`` and an inlined stage give; type promotion inside expressions uses :func:`cast`."""
    v = const(value)
    if v.dtype == canonical_dtype(dtype) and v.dtype in ("float16", "bfloat16") and not _holds_its_type(v):
        return Cast(v.dtype, v)
    return cast(dtype, v)
