"""CUDA C spelling of IR expressions.

The IR's ``//`` and ``%`` floor (like Python and the reference executor); C's ``/`` and ``%`` truncate.
The two agree when the dividend is non-negative and the divisor positive, which index arithmetic is by
construction (loop variables and axes start at 0, dimensions are positive), so such expressions print as
plain ``/`` and ``%``; anything else goes through ``sl_floordiv``/``sl_floormod``.
Half and bfloat16 arithmetic is done in float: values are converted on load and back on store.
Integer arithmetic narrower than ``int`` is cast back to its dtype, since C would promote it to int.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from schedlib.errors import BuildError
from schedlib.ir.dtype import C_TYPES, is_float
from schedlib.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Var
from schedlib.ir.func import Loop

_IDENT = re.compile(r"[^0-9A-Za-z_]")

# Floor division: step the truncated quotient down when there is a remainder and the operands' signs differ.
# Floor division and modulo as numpy and the reference executor compute them, for every operand: C leaves
# x / 0 and INT_MIN / -1 undefined (x86 traps, so the emulator died with SIGFPE); numpy gives 0 for a zero
# divisor and wraps INT_MIN // -1 to INT_MIN.  A constant divisor (index arithmetic) folds the checks away.
_FLOOR_HELPERS = """\
static __device__ __forceinline__ {t} sl_floordiv{sfx}({t} a, {t} b) {{
  if (b == 0) return 0;
  if (b == -1) return ({t})(({u})0 - ({u})a);
  {t} q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }}
static __device__ __forceinline__ {t} sl_floormod{sfx}({t} a, {t} b) {{
  if (b == 0 || b == -1) return 0;
  return a - sl_floordiv{sfx}(a, b) * b; }}
"""
HELPERS = (_FLOOR_HELPERS.format(t="int", u="unsigned", sfx="")
           + _FLOOR_HELPERS.format(t="long long", u="unsigned long long", sfx="_ll"))
# Float max/min that return NaN when either operand is NaN, as numpy and the reference executor do:
# fmaxf/fminf return the other operand, so a NaN in a row would vanish from a max reduction or a ReLU.
# sm_80+ has one instruction for it (max.NaN / min.NaN); older GPUs and the emulator compare and select.
_NAN_HELPER = """\
static __device__ __forceinline__ float sl_f{op}_nan(float a, float b) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r; asm("{op}.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
#else
  return (a {cmp} b || a != a) ? a : b;
#endif
}}
"""
NAN_HELPERS = _NAN_HELPER.format(op="max", cmp=">") + _NAN_HELPER.format(op="min", cmp="<")
# Float -> integer as the GPU converts (cvt.rzi.s32/s64.f32, then a narrower store keeps the low bytes):
# toward zero, NaN to 0, saturated to the 32-bit range (64-bit for long long).  C++ leaves NaN and
# out-of-range values undefined, and x86 gives INT_MIN for them, so the emulator spells the GPU's rule out.
F2I_HELPER = """\
template <typename T>
static __device__ __forceinline__ T sl_f2i(float x) {
#if defined(__CUDA_ARCH__)
  return static_cast<T>(x);
#else
  if (x != x) return T(0);
  if (sizeof(T) == 8) {
    if (x >= 9223372036854775808.0f) return static_cast<T>(0x7fffffffffffffffLL);
    if (x <= -9223372036854775808.0f) return static_cast<T>(-0x7fffffffffffffffLL - 1);
    return static_cast<T>(static_cast<long long>(x));
  }
  if (x >= 2147483648.0f) return static_cast<T>(2147483647);
  if (x <= -2147483648.0f) return static_cast<T>(-2147483647 - 1);
  return static_cast<T>(static_cast<int>(x));
#endif
}
"""


def float_min_max(op: str) -> str:
    """The CUDA function for a float ``max``/``min`` (NaN-propagating, see NAN_HELPERS)."""
    return "sl_fmax_nan" if op == "max" else "sl_fmin_nan"


def mangle(name: str) -> str:
    """A C identifier for an IR name (``C.i_0`` -> ``C_i_0``)."""
    out = _IDENT.sub("_", name)
    return out if not out[:1].isdigit() else f"_{out}"


def ctype(dtype: str) -> str:
    return C_TYPES[dtype]


def stored(value: Expr, dtype: str) -> Expr:
    """What a plain store into a ``dtype`` buffer converts: ``value`` without its outer cast when that is a cast
    to the same floating type.  Printed alone such a cast rounds through the narrow type and back to float (as
    a stored value would read), and the store rounds again: the same value, but ptxas keeps every conversion
    (two extra instructions per fp16 element stored) and, on wgmma accumulators, serializes the wgmmas
    (C7514).  Integer casts stay: C's conversion to a narrow integer is not the same as through ``int``."""
    if isinstance(value, Cast) and value.dtype == dtype and is_float(dtype):
        return value.value
    return value


def compute_type(dtype: str) -> str:
    """The C type arithmetic of ``dtype`` is done in (half/bf16 compute in float)."""
    return "float" if is_float(dtype) else C_TYPES[dtype]


def unroll_pragma(loop: Loop, whole: bool) -> str | None:
    """The pragma before ``loop``: ``#pragma unroll N`` for an ``unroll_limit`` annotation, ``#pragma unroll``
    where it unrolls whole (``whole``: the writer needs constant indices there, or the loop is marked unrolled
    or vectorized), else none.  A limit never applies where the indices must be constants."""
    forced = whole or loop.vectorized
    limit = dict(loop.annotations).get("unroll_limit")
    if limit and not forced:
        return f"#pragma unroll {limit}"
    return "#pragma unroll" if forced or loop.unrolled else None


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
    # The most negative value is written as a difference: C reads "-2147483648" as minus a long, so that
    # max(x, -2147483648) has no single overload (and -9223372036854775808LL does not fit its own type).
    if dtype == "int64":
        v = int(value)
        return "(-9223372036854775807LL - 1)" if v == -(2**63) else f"{v}LL"
    v = int(value)
    return "(-2147483647 - 1)" if dtype == "int32" and v == -(2**31) else str(v)


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
            if is_float(e.value.dtype) and e.dtype != "bool" and not is_float(e.dtype):
                return f"sl_f2i<{target}>({inner})"  # the GPU's conversion on both builds (F2I_HELPER)
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
            fn = float_min_max(e.op) if is_float(e.dtype) else e.op
            return f"{fn}({a}, {b})"
        if e.op in ("//", "%"):
            # A divisor of 0 is undefined either way, so a non-negative divisor is enough.
            if non_negative(e.a) and non_negative(e.b):
                return _narrow(f"({a} {'/' if e.op == '//' else '%'} {b})", e.dtype)
            fn = "sl_floordiv" if e.op == "//" else "sl_floormod"
            if e.dtype == "int64":
                # Both operands as long long, so neither a narrow one nor an overload choice truncates.
                return f"{fn}_ll(static_cast<long long>({a}), static_cast<long long>({b}))"
            return _narrow(f"{fn}({a}, {b})", e.dtype)
        text = f"({a} {_C_OP.get(e.op, e.op)} {b})"
        return _narrow(text, e.dtype) if e.op in ("+", "-", "*") else text

    def _call(self, e: Call) -> str:
        x = self.p(e.args[0])
        if e.fn == "neg":
            return _narrow(f"(-{x})", e.dtype)
        if e.fn == "not":
            return f"(!{x})"
        if e.fn == "abs" and not is_float(e.dtype):
            return _narrow(f"abs({x})", e.dtype)
        if e.fn == "sigmoid":
            return f"(1.0f / (1.0f + expf(-{x})))"
        return f"{_FLOAT_FN[e.fn]}({x})"


def _narrow(text: str, dtype: str) -> str:
    """Cast integer arithmetic of a dtype narrower than int back to it.

    The IR gives ``int8 * int8`` the dtype int8 (see :func:`schedlib.ir.dtype.promote`) and the reference
    executor wraps around accordingly; C would silently compute it in int, so the result is cast back.
    """
    return f"static_cast<{ctype(dtype)}>({text})" if dtype == "int8" else text


def non_negative(e: Expr) -> bool:
    """True when ``e`` is provably >= 0: loop variables, axes and dimensions, combined without subtraction."""
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value >= 0
    if isinstance(e, Var):
        # Every Var of the IR is a loop variable (from 0), a block axis (kept in range by its guard) or a
        # symbolic dimension (positive).
        return True
    if isinstance(e, Binary) and e.op in ("+", "*", "//", "%", "min", "max"):
        return non_negative(e.a) and non_negative(e.b)
    return False

