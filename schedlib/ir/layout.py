"""Physical layout of buffers: row-major strides, storage_align padding, flattened indices."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from schedlib.errors import BuildError, ShapeError
from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Const, Expr, as_int
from schedlib.ir.func import Buffer, Func
from schedlib.ir.reference import evaluate_int
from schedlib.ir.simplify import free_vars, simplify

# Generated kernels compute global offsets in 32-bit ``int`` (the fast path for address arithmetic on the
# GPU), so every global buffer must have fewer elements than this.
INDEX_LIMIT = 2**31


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
    permute = {dim: (factors, order) for dim, factors, order in buf.permute}
    total: Expr = Const(0)
    for d, (idx, st) in enumerate(zip(indices, strides(buf))):
        if d in permute:
            idx = permuted(idx, *permute[d])
        total = total + idx * st
    return simplify(total)


def permuted(index: Expr, factors: Sequence[int], order: Sequence[int]) -> Expr:
    """Where ``storage_permute`` stores ``index``: its digits in the mixed radix ``factors`` (outermost first),
    placed in ``order``."""
    inner = [math.prod(factors[k + 1:]) for k in range(len(factors))]
    digits = [index // Const(inner[0]) if k == 0 else (index // Const(inner[k])) % Const(factors[k])
              for k in range(len(factors))]
    total: Expr = Const(0)
    for position in order:
        total = total * Const(factors[position]) + digits[position]
    return total


def check_index_range(func: Func, symbols: Mapping[str, int] | None = None) -> None:
    """Refuse a global buffer of :data:`INDEX_LIMIT` elements or more, whose 32-bit offsets would overflow
    (undefined behaviour, silently wrong addresses).  Without ``symbols`` only constant sizes are checked;
    the runtime checks again once the symbolic dimensions are bound."""
    for buf in func.buffers:
        if buf.scope != "global":
            continue
        n = _exact_elements(buf, symbols or {})
        if n is not None and n >= INDEX_LIMIT:
            bound = f" with {dict(symbols)}" if symbols else ""
            raise ShapeError(
                f"{func.name}: buffer {buf.name} of shape {list(_dims(buf, symbols))}{bound} has {n:,} elements; "
                f"generated kernels index with 32-bit offsets, so a buffer must have fewer than 2^31 "
                f"({INDEX_LIMIT:,}); split the computation (for example by rows or batch)")


def _exact_elements(buf: Buffer, symbols: Mapping[str, int]) -> int | None:
    """Elements of ``buf`` in Python ints (``evaluate_int`` wraps at 32 bits, as the kernel would), or None
    while a dimension is unbound.  Padding needs constant inner dimensions, so the outer stride is either a
    constant or the plain product of the inner dimensions."""
    if not buf.shape:
        return 1
    if any(not free_vars(d) <= set(symbols) for d in buf.shape):
        return None
    dims = [evaluate_int(d, symbols) for d in buf.shape]
    outer = as_int(strides(buf)[0])
    return dims[0] * (outer if outer is not None else math.prod(dims[1:]))


def _dims(buf: Buffer, symbols: Mapping[str, int] | None) -> list[int | str]:
    return [evaluate_int(d, symbols) if symbols is not None else (as_int(d) if as_int(d) is not None else str(d))
            for d in buf.shape]
