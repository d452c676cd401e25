"""Expression nodes of the IR.

Nodes are frozen dataclasses, so an expression is a value: it can be hashed, compared and shared between
schedules without copying.  Python operators build nodes (``a + b``, ``a < b``); ``==`` keeps its ordinary
meaning (structural equality), use :func:`eq` / :func:`ne` for comparison nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Union

from schedlib.errors import IRError
from schedlib.ir.dtype import canonical_dtype, fits, int_range, is_float, is_int, promote

ExprLike = Union["Expr", int, float, bool]

ARITH_OPS = ("+", "-", "*", "/", "//", "%", "min", "max")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGIC_OPS = ("and", "or")
UNARY_FUNCS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "abs", "neg", "not", "sigmoid")


class Expr:
    """Base class; subclasses are frozen dataclasses with a ``dtype`` attribute."""

    dtype: str

    # arithmetic -------------------------------------------------------------------------------
    def __add__(self, o: ExprLike) -> Expr:
        return binary("+", self, o)

    def __radd__(self, o: ExprLike) -> Expr:
        return binary("+", o, self)

    def __sub__(self, o: ExprLike) -> Expr:
        return binary("-", self, o)

    def __rsub__(self, o: ExprLike) -> Expr:
        return binary("-", o, self)

    def __mul__(self, o: ExprLike) -> Expr:
        return binary("*", self, o)

    def __rmul__(self, o: ExprLike) -> Expr:
        return binary("*", o, self)

    def __truediv__(self, o: ExprLike) -> Expr:
        return binary("/", self, o)

    def __rtruediv__(self, o: ExprLike) -> Expr:
        return binary("/", o, self)

    def __floordiv__(self, o: ExprLike) -> Expr:
        return binary("//", self, o)

    def __rfloordiv__(self, o: ExprLike) -> Expr:
        return binary("//", o, self)

    def __mod__(self, o: ExprLike) -> Expr:
        return binary("%", self, o)

    def __rmod__(self, o: ExprLike) -> Expr:
        return binary("%", o, self)

    def __neg__(self) -> Expr:
        return call("neg", self)

    def __lt__(self, o: ExprLike) -> Expr:
        return binary("<", self, o)

    def __le__(self, o: ExprLike) -> Expr:
        return binary("<=", self, o)

    def __gt__(self, o: ExprLike) -> Expr:
        return binary(">", self, o)

    def __ge__(self, o: ExprLike) -> Expr:
        return binary(">=", self, o)

    # logic on conditions: Python's 'and'/'or'/'not' cannot be overloaded, so, as in numpy, '&', '|' and '~'
    def __and__(self, o: ExprLike) -> Expr:
        return binary("and", self, o)

    def __rand__(self, o: ExprLike) -> Expr:
        return binary("and", o, self)

    def __or__(self, o: ExprLike) -> Expr:
        return binary("or", self, o)

    def __ror__(self, o: ExprLike) -> Expr:
        return binary("or", o, self)

    def __invert__(self) -> Expr:
        return call("not", self)

    def __bool__(self) -> bool:
        raise IRError(f"the truth value of expression {self} is unknown at definition time; "
                      "use sl.if_then_else instead of Python 'if', and '&', '|', '~' (with parentheses: "
                      "(a > 0) & (a < 1)) to combine conditions instead of 'and', 'or', 'not'")

    def astype(self, dtype: str) -> Expr:
        """Cast to ``dtype`` (fp16/bf16 arithmetic cast to its own type is rounded there, as a store would)."""
        from schedlib.ir.rounding import rounded

        return rounded(dtype, self)

    def __str__(self) -> str:
        from schedlib.ir.printer import expr_str

        return expr_str(self)


@dataclass(frozen=True, eq=True, repr=False)
class Const(Expr):
    value: int | float | bool
    dtype: str = "int32"

    def __repr__(self) -> str:
        return f"Const({self.value!r}, {self.dtype})"


@dataclass(frozen=True, eq=True, repr=False)
class Var(Expr):
    """A named scalar: a symbolic dimension, a loop variable or a block axis."""

    name: str
    dtype: str = "int32"

    def __repr__(self) -> str:
        return f"Var({self.name})"


@dataclass(frozen=True, eq=True, repr=False)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str

    def __repr__(self) -> str:
        return f"Binary({self.op!r}, {self.a!r}, {self.b!r})"


@dataclass(frozen=True, eq=True, repr=False)
class Call(Expr):
    """An intrinsic math function applied element-wise."""

    fn: str
    args: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True, eq=True, repr=False)
class Cast(Expr):
    dtype: str
    value: Expr


@dataclass(frozen=True, eq=True, repr=False)
class Select(Expr):
    cond: Expr
    then: Expr
    other: Expr
    dtype: str


@dataclass(frozen=True, eq=True, repr=False)
class Load(Expr):
    """Read of ``buffer[indices]``.  ``tensor`` links back to the front-end Tensor and is not compared."""

    buffer: str
    indices: tuple[Expr, ...]
    dtype: str
    tensor: Any = field(default=None, compare=False, hash=False)


@dataclass(frozen=True, eq=True, repr=False)
class Reduce(Expr):
    """A commutative reduction over reduce axes; only legal as the whole body of a compute."""

    op: str  # "sum" | "max" | "min"
    source: Expr
    axes: tuple[Any, ...]  # tuple[IterAxis]
    dtype: str


# construction helpers -------------------------------------------------------------------------

def const(value: ExprLike, dtype: str | None = None) -> Expr:
    """Wrap a Python scalar as a Const (an Expr passes through)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, dtype or "bool")
    if isinstance(value, int):
        dtype = dtype or "int32"
        # int8 is data only; int32 also carries indices, whose range the shape and launch checks police
        if dtype == "int8" and not fits(value, dtype):
            lo, hi = int_range(dtype)
            raise IRError(f"constant {value} does not fit {dtype} ({lo} to {hi}); cast the operand to a wider "
                          "type first (.astype('int32'))")
        return Const(value, dtype)
    if isinstance(value, float):
        return Const(value, dtype or "float32")
    if hasattr(value, "dtype") and hasattr(value, "item"):  # numpy scalar
        return const(value.item(), dtype)
    raise IRError(f"cannot use {value!r} (type {type(value).__name__}) in an expression")


def _coerce_pair(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    """Python scalars take the dtype of the other operand, so ``x * 2`` keeps x's dtype."""
    if isinstance(a, Expr) and not isinstance(b, Expr):
        b = const(b, a.dtype if (is_float(a.dtype) or not isinstance(b, float)) else None)
    elif isinstance(b, Expr) and not isinstance(a, Expr):
        a = const(a, b.dtype if (is_float(b.dtype) or not isinstance(a, float)) else None)
    return const(a), const(b)


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """Build a binary node, folding constants and trivial identities on integers."""
    x, y = _coerce_pair(a, b)
    if op in COMPARE_OPS:
        dtype = "bool"
    elif op in LOGIC_OPS:
        if x.dtype != "bool" or y.dtype != "bool":  # C would take any non-zero value as true; say so instead
            raise IRError(f"'{op}' combines conditions (bool), got {x.dtype} and {y.dtype} in ({x}) {op} ({y}); "
                          "compare first, e.g. (x > 0) & (y > 0)")
        dtype = "bool"
    elif op in ARITH_OPS:
        dtype = promote(x.dtype, y.dtype)
        if op == "/" and is_int(dtype):
            raise IRError(f"'/' between integers ({x} / {y}); use '//' for floor division")
        if op in ("//", "%") and is_float(dtype):
            raise IRError(f"'{op}' needs integer operands, got {x.dtype} and {y.dtype}")
    else:
        raise IRError(f"unknown binary operator {op!r}")
    if isinstance(x, Const) and isinstance(y, Const):
        value = _fold(op, x.value, y.value)
        if dtype == "int8":  # wraps as int8 arithmetic on arrays does (wider ints are index math: kept exact)
            value = (int(value) + 128) % 256 - 128
        return Const(value, dtype)
    if is_int(dtype) or dtype == "bool":
        folded = _identity(op, x, y)
        if folded is not None:
            return folded
    return Binary(op, x, y, dtype)


def _identity(op: str, x: Expr, y: Expr) -> Expr | None:
    zero_x = isinstance(x, Const) and x.value == 0
    zero_y = isinstance(y, Const) and y.value == 0
    one_x = isinstance(x, Const) and x.value == 1
    one_y = isinstance(y, Const) and y.value == 1
    if op == "+":
        return y if zero_x else x if zero_y else None
    if op == "-":
        return x if zero_y else None
    if op == "*":
        if zero_x or zero_y:
            return Const(0, promote(x.dtype, y.dtype))
        return y if one_x else x if one_y else None
    if op == "//":
        return x if one_y else None
    if op == "%":
        return Const(0, x.dtype) if one_y else None
    if op == "and":
        if isinstance(x, Const):
            return y if x.value else x
        if isinstance(y, Const):
            return x if y.value else y
    return None


def _fold(op: str, a: Any, b: Any) -> Any:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    if op == "//":
        return a // b
    if op == "%":
        return a % b
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    if op == "and":
        return bool(a and b)
    if op == "or":
        return bool(a or b)
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]


def call(fn: str, *args: ExprLike) -> Expr:
    """Apply an intrinsic (exp, log, sqrt, rsqrt, tanh, erf, abs, neg, not, sigmoid)."""
    if fn not in UNARY_FUNCS:
        raise IRError(f"unknown intrinsic {fn!r}; expected one of {', '.join(UNARY_FUNCS)}")
    xs = tuple(const(a) for a in args)
    x = xs[0]
    if fn == "not":
        if x.dtype != "bool":
            raise IRError(f"not() / '~' negates a condition (bool), got {x.dtype} ({x}); compare first")
        return Call(fn, xs, "bool")
    if fn == "neg" and isinstance(x, Const):
        return Const(-x.value, x.dtype)
    if fn not in ("abs", "neg") and not is_float(x.dtype):
        raise IRError(f"{fn}() needs a floating-point argument, got {x.dtype} ({x}); cast it first")
    if isinstance(x, Const) and fn in ("exp", "log", "sqrt", "tanh", "erf", "abs"):
        value = {"exp": math.exp, "log": math.log, "sqrt": math.sqrt, "tanh": math.tanh,
                 "erf": math.erf, "abs": abs}[fn](x.value)
        return Const(value, x.dtype)
    return Call(fn, xs, x.dtype)


def cast(dtype: str, value: ExprLike) -> Expr:
    dtype = canonical_dtype(dtype)
    v = const(value)
    if v.dtype == dtype:
        return v
    if isinstance(v, Const):
        if dtype in ("float32", "float16", "bfloat16"):
            return Const(float(v.value), dtype)
        if dtype == "bool":
            return Const(bool(v.value), dtype)
        folded = int(v.value)
        if dtype == "int8":  # wraps as astype does (int8 is data only; see const)
            folded = (folded + 128) % 256 - 128
        return Const(folded, dtype)
    return Cast(dtype, v)


def select(cond: ExprLike, then: ExprLike, other: ExprLike) -> Expr:
    c = const(cond)
    if c.dtype != "bool":
        raise IRError(f"if_then_else condition must be boolean, got {c.dtype} ({c})")
    t, o = _coerce_pair(then, other)
    dtype = promote(t.dtype, o.dtype)
    if isinstance(c, Const):
        return cast(dtype, t if c.value else o)
    return Select(c, cast(dtype, t), cast(dtype, o), dtype)


def eq(a: ExprLike, b: ExprLike) -> Expr:
    return binary("==", a, b)


def ne(a: ExprLike, b: ExprLike) -> Expr:
    return binary("!=", a, b)


def all_of(*conds: ExprLike) -> Expr:
    """Conjunction of boolean expressions (True when empty)."""
    out: Expr = Const(True, "bool")
    for c in conds:
        out = binary("and", out, c)
    return out


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("min", a, b)


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("max", a, b)


def ceildiv(a: ExprLike, b: ExprLike) -> Expr:
    """Ceiling division of non-negative integers."""
    x, y = _coerce_pair(a, b)
    return binary("//", binary("+", x, binary("-", y, 1)), y)


def as_int(e: Expr) -> int | None:
    """The integer value of a constant expression, else None."""
    return int(e.value) if isinstance(e, Const) and not isinstance(e.value, float) else None
