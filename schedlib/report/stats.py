"""Work of a func, independent of its schedule: floating-point operations and compulsory bytes.

These give the roofline a report measures against: each input read once, each output written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Binary, Call, Expr
from schedlib.ir.func import Func
from schedlib.ir.reference import evaluate_int
from schedlib.ir.simplify import walk


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float
    dtype: str  # the dtype of the largest input, which sets the arithmetic unit

    def roofline_s(self, peak_flops: float, bandwidth: float) -> float:
        return max(self.flops / peak_flops, self.bytes / bandwidth)


def _ops(e: Expr) -> int:
    return sum(1 for n in walk(e) if (isinstance(n, Binary) and n.op in ("+", "-", "*", "/", "min", "max"))
               or isinstance(n, Call))


def work(func: Func, symbols: Mapping[str, int] | None = None) -> Work:
    """Operations (a multiply-add counts 2) and bytes of ``func``; symbolic dims from ``symbols``."""
    env = dict(symbols or {})
    flops = 0.0
    for blk in func.blocks:
        points = 1
        for a in blk.axes:
            points *= evaluate_int(a.extent, env)
        flops += points * (_ops(blk.value) + (1 if blk.reducer else 0))
    nbytes = 0.0
    largest, dtype = -1, "float32"
    for name in (*func.inputs, *func.outputs):
        buf = func.buffer(name)
        n = 1
        for d in buf.shape:
            n *= evaluate_int(d, env)
        nbytes += n * BYTES[buf.dtype]
        if name in func.inputs and n > largest:
            largest, dtype = n, buf.dtype
    return Work(flops, nbytes, dtype)
