"""CUDA C spelling of IR expressions.

Index arithmetic in the IR is non-negative by construction (loop variables start at 0, dimensions are
positive), so ``//`` and ``%`` on index expressions print as C ``/`` and ``%``.  Only data-dependent integer
division needs floor semantics and goes through ``sl_floordiv``/``sl_floormod``.
Half and bfloat16 arithmetic is done in float: values are converted on load and back on store.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from schedlib.errors import BuildError
from schedlib.ir.dtype import C_TYPES, is_float
from schedlib.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Var
from schedlib.ir.simplify import walk

_IDENT = re.compile(r"[^0-9A-Za-z_]")

HELPERS = """\
static __device__ __forceinline__ int sl_floordiv(int a, int b) { int q = a / b; return (q * b > a) ? q - 1 : q; }
static __device__ __forceinline__ int sl_floormod(int a, int b) { return a - sl_floordiv(a, b) * b; }
"""


def mangle(name: str) -> str:
    """A C identifier for an IR name (``C.i_0`` -> ``C_i_0``)."""
    out = _IDENT.sub("_", name)
    return out if not out[:1].isdigit() else f"_{out}"


def ctype(dtype: str) -> str:
    return C_TYPES[dtype]


def compute_type(dtype: str) -> str:
    """The C type arithmetic of ``dtype`` is done in (half/bf16 compute in float)."""
    return "float" if is_float(dtype) else C_TYPES[dtype]


def literal(value: float | int | bool, dtype: str) -> str:
    if dtype == "bool":
        return "true" if value else "false"
    if is_float(dtype):
        v = float(value)
        if math.isinf(v):
            return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
        if math.isnan(v):
            return "__int_as_float(0x7fc00000)"
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}f"
    if dtype == "int64":
        return f"{int(value)}LL"
    return str(int(value))


_INFIX = {"+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "and", "or"}
_C_OP = {"and": "&&", "or": "||"}
_FLOAT_FN = {"exp": "expf", "log": "logf", "sqrt": "sqrtf", "rsqrt": "rsqrtf", "tanh": "tanhf", "erf": "erff",
             "abs": "fabsf"}


class ExprPrinter:
    """Prints expressions; ``load`` renders a buffer access (the kernel knows layouts and names)."""

    def __init__(self, load: Callable[[Load], str], var: Callable[[str], str]) -> None:
        self.load = load
        self.var = var

    def __call__(self, e: Expr) -> str:
        return self.p(e)

    def p(self, e: Expr) -> str:
        if isinstance(e, Const):
            return literal(e.value, e.dtype)
        if isinstance(e, Var):
            return self.var(e.name)
        if isinstance(e, Load):
            text = self.load(e)
            return f"static_cast<float>({text})" if e.dtype in ("float16", "bfloat16") else text
        if isinstance(e, Cast):
            inner = self.p(e.value)
            target = compute_type(e.dtype)
            if e.dtype in ("float16", "bfloat16"):
                # Round through the narrow type so the value matches a stored one.
                return f"static_cast<float>(static_cast<{ctype(e.dtype)}>({inner}))"
            return f"static_cast<{target}>({inner})"
        if isinstance(e, Select):
            return f"({self.p(e.cond)} ? {self.p(e.then)} : {self.p(e.other)})"
        if isinstance(e, Binary):
            return self._binary(e)
        if isinstance(e, Call):
            return self._call(e)
        raise BuildError(f"cannot print expression {e!r} as CUDA")

    def _binary(self, e: Binary) -> str:
        a, b = self.p(e.a), self.p(e.b)
        if e.op in ("min", "max"):
            fn = ("fminf" if e.op == "min" else "fmaxf") if is_float(e.dtype) else e.op
            return f"{fn}({a}, {b})"
        if e.op in ("//", "%"):
            if any(isinstance(n, Load) for n in walk(e)):
                return f"{'sl_floordiv' if e.op == '//' else 'sl_floormod'}({a}, {b})"
            return f"({a} {'/' if e.op == '//' else '%'} {b})"
        return f"({a} {_C_OP.get(e.op, e.op)} {b})"

    def _call(self, e: Call) -> str:
        x = self.p(e.args[0])
        if e.fn == "neg":
            return f"(-{x})"
        if e.fn == "not":
            return f"(!{x})"
        if e.fn == "abs" and not is_float(e.dtype):
            return f"abs({x})"
        if e.fn == "sigmoid":
            return f"(1.0f / (1.0f + expf(-{x})))"
        return f"{_FLOAT_FN[e.fn]}({x})"
