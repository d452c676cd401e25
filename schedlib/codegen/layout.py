"""Physical layout of buffers: row-major strides, storage_align padding, flattened indices."""

from __future__ import annotations

from collections.abc import Sequence

from schedlib.errors import BuildError
from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Const, Expr, as_int
from schedlib.ir.func import Buffer
from schedlib.ir.simplify import simplify


def strides(buf: Buffer) -> list[Expr]:
    """Row-major strides in elements; a ``storage_align`` entry pads a dimension's stride."""
    align = {dim: (factor, offset) for dim, factor, offset in buf.align}
    out: list[Expr] = [Const(1)] * len(buf.shape)
    stride: Expr = Const(1)
    for d in range(len(buf.shape) - 1, -1, -1):
        if d in align:
            s = as_int(stride)
            if s is None:
                raise BuildError(f"buffer {buf.name}: storage_align needs constant inner dimensions")
            factor, offset = align[d]
            while s % factor != offset:
                s += 1
            stride = Const(s)
        out[d] = stride
        stride = simplify(stride * buf.shape[d])
    return out


def size_elements(buf: Buffer) -> Expr:
    st = strides(buf)
    return simplify(st[0] * buf.shape[0]) if buf.shape else Const(1)


def const_bytes(buf: Buffer) -> int:
    n = as_int(size_elements(buf))
    if n is None:
        raise BuildError(f"{buf.scope} buffer {buf.name} has symbolic size {size_elements(buf)}; "
                         "compact it with compute_at / reverse_compute_at first")
    return n * BYTES[buf.dtype]


def flatten(buf: Buffer, indices: Sequence[Expr]) -> Expr:
    total: Expr = Const(0)
    for idx, st in zip(indices, strides(buf)):
        total = total + idx * st
    return simplify(total)
