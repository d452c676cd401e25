"""Exact-integer checks of a launch at bound symbol values.

``schedlib.ir.reference.evaluate_int`` computes in int32, as a kernel would, so a grid such as
``(M*64 + 1023) // 1024`` wraps to a negative count at large ``M``.  The runtime must instead know the true
value, to refuse shapes whose 32-bit index arithmetic would wrap rather than launch too few blocks: here
every expression is evaluated with Python ints (no wrap), and the loop indices of each block are bounded by
interval arithmetic to find the padded iteration cover that ``split`` checks for constant shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from schedlib.errors import ShapeError
from schedlib.ir.expr import Binary, Call, Cast, Const, Expr, Select, Var
from schedlib.ir.func import Func

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
Interval = tuple[int, int]
Check = Callable[[Expr, Interval], None]


def exact_int(e: Expr, env: Mapping[str, int], where: str = "") -> int:
    """``e`` at the integer values ``env`` in unbounded Python ints; ShapeError for what is not integral."""
    span = _interval(e, {k: (int(v), int(v)) for k, v in env.items()})
    if span is None or span[0] != span[1]:
        raise ShapeError(f"{where or 'expression'} {e} has no integer value at {dict(env)}")
    return span[0]


def symbols_text(symbols: Mapping[str, int]) -> str:
    return ", ".join(f"{n}={v}" for n, v in sorted(symbols.items())) or "these shapes"


def check_iteration_cover(func: Func, symbols: Mapping[str, int], kernel: str) -> None:
    """Refuse symbol values at which a block's loops cover (padded to whole tiles) more than 2^31-1 iterations
    along one index, the rule ``split`` applies to constant extents, or at which any integer the generated code
    computes for a loop extent or an index leaves int32: the kernel computes them in 32-bit ints, so past that
    they wrap and it silently runs the wrong iterations (or none)."""
    env: dict[str, Interval] = {k: (int(v), int(v)) for k, v in symbols.items()}
    for block in func.blocks:  # loop names are unique in a Func, so one environment serves every block
        for lp in block.loops:
            extent = int32_range(lp.extent, env, lambda sub, span, b=block.name, n=lp.name: _refuse(
                sub, span, func, symbols, kernel, f"the extent of loop {n} of block {b}"))
            if extent is not None:
                env[lp.name] = (0, max(extent[1] - 1, 0))
    for block in func.blocks:
        for e in (*block.bindings, *([block.predicate] if block.predicate is not None else [])):
            what = f"an index of block {block.name}"
            span = int32_range(e, env, lambda sub, s, w=what: _refuse(sub, s, func, symbols, kernel, w))
            # an index running 0..hi stands for hi + 1 iterations, the padded cover split bounds by 2^31-1
            if span is not None and span[1] + 1 > INT32_MAX:
                raise ShapeError(
                    f"kernel {kernel}: at {symbols_text(symbols)}, {what} covers {span[1] + 1:,} iterations "
                    f"({e}), more than 2^31-1 = {INT32_MAX:,}; the generated code indexes with 32-bit ints, "
                    "so it would wrap (split refuses this for constant shapes); use smaller shapes or split "
                    "the computation")


def int32_range(e: Expr, env: Mapping[str, Interval], refuse: Check) -> Interval | None:
    """The range of integer expression ``e`` over ``env``; ``refuse(sub, span)`` is called for the first
    value computed on the way that leaves int32 (and should raise)."""
    def check(sub: Expr, span: Interval) -> None:
        if span[1] > INT32_MAX or span[0] < INT32_MIN:
            refuse(sub, span)

    return _interval(e, env, check)


def _refuse(sub: Expr, span: Interval, func: Func, symbols: Mapping[str, int], kernel: str, what: str) -> None:
    bad = span[1] if span[1] > INT32_MAX else span[0]
    raise ShapeError(
        f"kernel {kernel}: at {symbols_text(symbols)}, {what} computes {sub} = {bad:,}, outside the 32-bit "
        f"ints the generated code uses ([{INT32_MIN:,}, {INT32_MAX:,}]), so it would wrap (split refuses such "
        f"covers for constant shapes); use smaller shapes or split the computation ({func.name})")


def _interval(e: Expr, env: Mapping[str, Interval], check: Check | None = None) -> Interval | None:
    """The range [lo, hi] of integer expression ``e`` over ``env`` (exact when every Var is a point), or None
    where it is not an integer expression of known variables.  ``check(sub, span)`` sees each integer node."""
    span = _node(e, env, check)
    if span is not None and check is not None:
        check(e, span)
    return span


def _node(e: Expr, env: Mapping[str, Interval], check: Check | None) -> Interval | None:
    if isinstance(e, Const):
        return None if isinstance(e.value, float) else (int(e.value), int(e.value))
    if isinstance(e, Var):
        return env.get(e.name)
    if isinstance(e, Cast):
        return _interval(e.value, env, check) if e.dtype.startswith(("int", "uint", "bool")) else None
    if isinstance(e, Select):
        _interval(e.cond, env, check)
        a, b = _interval(e.then, env, check), _interval(e.other, env, check)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(e, Call):
        a = _interval(e.args[0], env, check) if e.args else None
        return None if a is None or e.fn != "neg" else (-a[1], -a[0])
    if not isinstance(e, Binary):
        return None  # a Load: data, not index arithmetic
    a, b = _interval(e.a, env, check), _interval(e.b, env, check)
    if e.op in ("<", "<=", ">", ">=", "==", "!=", "and", "or"):
        return 0, 1
    return None if a is None or b is None else _arith(e.op, a, b)


def _arith(op: str, a: Interval, b: Interval) -> Interval | None:
    if op == "+":
        return a[0] + b[0], a[1] + b[1]
    if op == "-":
        return a[0] - b[1], a[1] - b[0]
    if op == "*":
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)
    if op == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if op == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    if b[0] <= 0 or a[0] < 0:
        return None  # index arithmetic divides non-negative values by positive tile sizes; nothing else is bounded
    if op == "//":
        return a[0] // b[1], a[1] // b[0]
    if op == "%":
        if a == (a[0], a[0]) and b == (b[0], b[0]):
            return a[0] % b[0], a[0] % b[0]
        return 0, min(a[1], b[1] - 1)
    return None
