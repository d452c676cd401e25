"""The compute-definition front end, in the style of ``te.compute``.

    M = sl.var("M")
    A = sl.placeholder((M, 64), "float32", "A")
    k = sl.reduce_axis(64, "k")
    S = sl.compute((M,), lambda i: sl.sum(A[i, k] * A[i, k], axis=k), "S")
    f = sl.func([A, S], "sumsq")

Tensors are recipes; :func:`schedlib.ir.func.make_func` turns them into a Func of blocks.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from schedlib.errors import IRError
from schedlib.ir.dtype import canonical_dtype, is_float
from schedlib.ir.expr import Const, Expr, ExprLike, Load, Reduce, Var, call, const, select
from schedlib.ir.expr import maximum as _maximum
from schedlib.ir.expr import minimum as _minimum
from schedlib.ir.names import check_name


@dataclass(frozen=True, eq=True, repr=False)
class AxisVar(Var):
    """An iteration axis of a compute: spatial (S) or reduce (R).  Usable inside expressions."""

    extent: Expr = Const(1)  # noqa: RUF009 - a frozen value, safe to share as a default
    kind: str = "S"

    def __repr__(self) -> str:
        return f"AxisVar({self.name}, {self.extent}, {self.kind})"


class Tensor:
    """A placeholder (input) or the output of a compute stage."""

    def __init__(self, name: str, shape: tuple[Expr, ...], dtype: str, axes: tuple[AxisVar, ...] = (),
                 body: Expr | None = None) -> None:
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.axes = axes
        self.body = body  # None for placeholders

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_placeholder(self) -> bool:
        return self.body is None

    def __getitem__(self, index: ExprLike | tuple[ExprLike, ...]) -> Load:
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) != self.ndim:
            raise IRError(f"tensor {self.name} has {self.ndim} dimensions, indexed with {len(idx)}")
        exprs = tuple(const(i) for i in idx)
        for i in exprs:
            if i.dtype not in ("int32", "int64"):
                raise IRError(f"index {i} of tensor {self.name} must be an integer, got {i.dtype}")
        return Load(self.name, exprs, self.dtype, self)

    def __iter__(self) -> Iterator[Load]:
        # Without this, Python would iterate through __getitem__(0), (1), ... and never stop (a 1-D
        # tensor accepts any index expression), e.g. when a tensor is passed where a list is expected.
        raise IRError(f"tensor {self.name} cannot be iterated: tensors are indexed (A[i, j]), not iterated")

    def __repr__(self) -> str:
        dims = ", ".join(str(s) for s in self.shape)
        kind = "placeholder" if self.is_placeholder else "compute"
        return f"Tensor({self.name}: {self.dtype}[{dims}], {kind})"


_counter = itertools.count()


def var(name: str) -> Var:
    """A symbolic dimension, bound at run time from the shapes of the inputs."""
    return Var(check_name("var", "name", name))


def _shape(shape: Sequence[ExprLike] | ExprLike, what: str) -> tuple[Expr, ...]:
    if isinstance(shape, np.ndarray):
        # A numpy shape vector (``arr.shape`` as an array): its integers are the dimensions.
        if shape.ndim > 1 or not np.issubdtype(shape.dtype, np.integer):
            raise IRError(f"{what}: shape array {shape!r} must be a 1-D array of integers")
        shape = [int(d) for d in shape.reshape(-1)]
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    out = []
    for d in dims:
        e = const(d)
        if e.dtype not in ("int32", "int64"):
            raise IRError(f"{what}: dimension {d!r} must be an int or sl.var, got {e.dtype}")
        if isinstance(e, Const) and int(e.value) < 1:
            raise IRError(f"{what}: dimension {d!r} must be >= 1")
        if isinstance(e, Const) and int(e.value) >= 2**31:
            raise IRError(f"{what}: dimension {d!r} does not fit the 32-bit index type (must be < 2^31)")
        out.append(e)
    return tuple(out)


def placeholder(shape: Sequence[ExprLike] | ExprLike, dtype: str = "float32", name: str | None = None) -> Tensor:
    """An input tensor of the given shape (ints or ``sl.var``) and dtype (a name or a numpy dtype)."""
    dtype = canonical_dtype(dtype)
    name = f"placeholder_{next(_counter)}" if name is None else check_name("placeholder", "name", name)
    return Tensor(name, _shape(shape, f"placeholder {name}"), dtype)


def reduce_axis(extent: ExprLike, name: str | None = None) -> AxisVar:
    """A reduction axis ranging over ``[0, extent)``."""
    name = f"r{next(_counter)}" if name is None else check_name("reduce_axis", "name", name)
    (ext,) = _shape((extent,), f"reduce_axis {name}")
    return AxisVar(name, "int32", ext, "R")


def compute(shape: Sequence[ExprLike] | ExprLike, fcompute: Callable[..., ExprLike], name: str | None = None
            ) -> Tensor:
    """A stage whose element at index ``(i, j, ...)`` is ``fcompute(i, j, ...)``.

    Axis names come from ``fcompute``'s parameter names.  A reduction (``sl.sum`` ...) must be the whole
    body; its expression dtype is the accumulation dtype.
    """
    name = f"compute_{next(_counter)}" if name is None else check_name("compute", "name", name)
    dims = _shape(shape, f"compute {name}")
    if not callable(fcompute):
        raise IRError(f"compute {name}: fcompute={fcompute!r} must be callable, e.g. lambda i, j: A[i, j] * 2")
    try:
        signature = inspect.signature(fcompute)
    except (TypeError, ValueError):
        raise IRError(f"compute {name}: cannot read the parameters of fcompute={fcompute!r}; "
                      "pass a Python function or lambda") from None
    params = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_varargs = any(p.kind == p.VAR_POSITIONAL for p in signature.parameters.values())
    if len(params) == len(dims):
        # Axis names become loop and CUDA variable names, so they follow the same rules as stage names.
        names = [check_name(f"compute {name}", "fcompute parameter", p.name) for p in params]
    elif has_varargs and not params:
        names = [f"i{d}" for d in range(len(dims))]
    else:
        raise IRError(f"compute {name}: fcompute takes {len(params)} indices, shape has {len(dims)}")
    axes = tuple(AxisVar(n, "int32", d, "S") for n, d in zip(names, dims))
    body = const(fcompute(*axes))
    for node in _walk_reduces(body):
        if node is not body:
            raise IRError(f"compute {name}: a reduction must be the whole body, not part of {body}")
    return Tensor(name, dims, body.dtype, axes, body)


def _walk_reduces(e: Expr) -> list[Reduce]:
    from schedlib.ir.simplify import walk

    return [n for n in walk(e) if isinstance(n, Reduce)]


def _axes(axis: AxisVar | Sequence[AxisVar]) -> tuple[AxisVar, ...]:
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    for a in axes:
        if not (isinstance(a, AxisVar) and a.kind == "R"):
            raise IRError(f"reduction axis {a!r} must come from sl.reduce_axis")
    if not axes:
        raise IRError("a reduction needs at least one axis")
    return axes


def sum(expr: ExprLike, axis: AxisVar | Sequence[AxisVar]) -> Reduce:  # shadows the builtin, as numpy's does
    e = const(expr)
    return Reduce("sum", e, _axes(axis), e.dtype)


def max(expr: ExprLike, axis: AxisVar | Sequence[AxisVar]) -> Reduce:
    e = const(expr)
    return Reduce("max", e, _axes(axis), e.dtype)


def min(expr: ExprLike, axis: AxisVar | Sequence[AxisVar]) -> Reduce:
    e = const(expr)
    return Reduce("min", e, _axes(axis), e.dtype)


def identity(op: str, dtype: str) -> Const:
    """The identity element of a reduction in ``dtype`` (the finite extreme for integers; for bool, max is
    "any" and starts at False, min is "all" and starts at True)."""
    if op not in ("sum", "max", "min"):
        raise IRError(f"no identity for reduction {op!r}; reductions are sum, max and min")
    if op == "sum":
        return Const(0.0 if is_float(dtype) else 0, dtype)
    if is_float(dtype):
        return Const(-math.inf if op == "max" else math.inf, dtype)
    limits = {"bool": (False, True), "int8": (-128, 127), "int32": (-(2**31), 2**31 - 1),
              "int64": (-(2**63), 2**63 - 1)}
    if dtype not in limits:
        raise IRError(f"no identity for a {op} reduction over {dtype!r}; "
                      f"it is defined for float types and {', '.join(limits)}")
    lo, hi = limits[dtype]
    return Const(lo if op == "max" else hi, dtype)


def exp(x: ExprLike) -> Expr:
    return call("exp", x)


def log(x: ExprLike) -> Expr:
    return call("log", x)


def sqrt(x: ExprLike) -> Expr:
    return call("sqrt", x)


def rsqrt(x: ExprLike) -> Expr:
    return call("rsqrt", x)


def tanh(x: ExprLike) -> Expr:
    return call("tanh", x)


def erf(x: ExprLike) -> Expr:
    return call("erf", x)


def sigmoid(x: ExprLike) -> Expr:
    return call("sigmoid", x)


def abs(x: ExprLike) -> Expr:
    return call("abs", x)


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    return _maximum(a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    return _minimum(a, b)


def if_then_else(cond: ExprLike, then: ExprLike, other: ExprLike) -> Expr:
    return select(cond, then, other)
