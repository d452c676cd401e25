"""The loop IR: compute definitions, the Func of S/R blocks, schedule primitives, printer and executor."""

from schedlib.ir.expr import Const, Expr, Var
from schedlib.ir.func import Axis, Block, Buffer, Func, Loop, make_func
from schedlib.ir.reference import run_reference
from schedlib.ir.schedule import Schedule, Trace
from schedlib.ir.tensor import (
    Tensor,
    abs,
    compute,
    erf,
    exp,
    if_then_else,
    log,
    max,
    maximum,
    min,
    minimum,
    placeholder,
    reduce_axis,
    rsqrt,
    sigmoid,
    sqrt,
    sum,
    tanh,
    var,
)

__all__ = [
    "Axis", "Block", "Buffer", "Const", "Expr", "Func", "Loop", "Schedule", "Tensor", "Trace", "Var", "abs",
    "compute", "erf", "exp", "if_then_else", "log", "make_func", "max", "maximum", "min", "minimum",
    "placeholder", "reduce_axis", "rsqrt", "run_reference", "sigmoid", "sqrt", "sum", "tanh", "var",
]
