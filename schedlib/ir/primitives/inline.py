"""Inlining primitives: compute_inline and reverse_compute_inline fold a spatial block into its neighbour."""

from __future__ import annotations

from dataclasses import replace

from schedlib.ir.expr import Expr, Load, Var
from schedlib.ir.func import Block, Buffer, Func
from schedlib.ir.primitives.common import check_single_producer, fail, get_block, normalize
from schedlib.ir.rounding import rounded
from schedlib.ir.simplify import loads, map_children, substitute, tree_count

# The most nodes an expression may have once inlined.  A stage read twice by its consumer (gelu reads x in x and in
# erf(x)) doubles in size with each such stage inlined: a chain of 16 gelus written out is over a million nodes,
# and the printer, the code generator and the compilers all walk it whole.  Fused epilogues and dequantising
# prologues stay far below (a bias, gelu and cast epilogue: about 40).
INLINE_NODE_LIMIT = 4096


def inlined_size(consumer: Expr, buffer: Buffer, producer: Block) -> int:
    """Nodes of ``consumer`` once :func:`_inline_loads` has replaced its loads of ``buffer`` by ``producer``'s
    value, counted without building it (which could take memory exponential in the stages inlined)."""
    value = rounded(buffer.dtype, producer.value)
    uses = {a.name: tree_count(value, lambda n, name=a.name: isinstance(n, Var) and n.name == name)
            for a in producer.axes}
    size, value_size = tree_count(consumer), tree_count(value)
    for ld in loads(consumer):
        if ld.buffer == buffer.name:
            # each use of an axis in the value becomes that axis's index expression
            grown = sum(uses[name] * (tree_count(ix) - 1) for name, ix in zip(uses, ld.indices))
            size += value_size + grown - tree_count(ld)
    return size


def largest_after_inline(func: Func, block: str) -> int:
    """The largest expression, in nodes, that ``compute_inline(func, block)`` would leave among the block's
    consumers (what a rule asks before inlining a stage; above ``INLINE_NODE_LIMIT`` the primitive refuses)."""
    blk = func.block(block)
    buf = func.buffer(blk.store)
    return max((inlined_size(b.value, buf, blk) for b in func.blocks if buf.name in b.read_buffers), default=0)


def _check_size(prim: str, block: str, target: str, size: int) -> None:
    if size > INLINE_NODE_LIMIT:
        fail(prim, "block", block, f"would make {target}'s expression {size} nodes long, more than "
                                   f"{INLINE_NODE_LIMIT} (a stage read more than once is copied into each read, so "
                                   "every such stage inlined multiplies the size); keep this stage in a loop nest "
                                   "of its own")


def _inline_loads(e: Expr, buffer: Buffer, producer: Block) -> Expr:
    """Replace loads of ``buffer`` in ``e`` by the producer's value at the loaded index, converted as the store
    into ``buffer`` converted it (an fp16 stage computed in float was rounded to fp16 there: a chain of such
    stages inlined without it would round once, at the end, where the func rounds at every stage)."""
    names = [a.name for a in producer.axes]
    value = rounded(buffer.dtype, producer.value)

    def go(x: Expr) -> Expr:
        if isinstance(x, Load) and x.buffer == buffer.name:
            idx = [go(i) for i in x.indices]
            return substitute(value, dict(zip(names, idx)))
        return map_children(x, go)

    return go(e)


def _check_standalone(func: Func, prim: str, blk: Block) -> None:
    if blk.reducer is not None:
        fail(prim, "block", blk.name, f"is a reduction ({blk.kinds}); only spatial blocks can be inlined")
    if blk.attach is not None or func.attached_to(blk.name):
        fail(prim, "block", blk.name, "is attached or has blocks attached; inline before compute_at")


def compute_inline(func: Func, block: str) -> tuple[Func, None]:
    """Substitute a spatial block's expression into its consumers and remove it.

    Before ``compute_inline(f, "B")``::

        alloc B: float32[8] global
        for B.i in range(8):
          block B S (i=B.i):
            B[i] = A[i] * 2.0
        for C.i in range(8):
          block C S (i=C.i):
            C[i] = B[i] + 1.0

    After::

        for C.i in range(8):
          block C S (i=C.i):
            C[i] = A[i] * 2.0 + 1.0

    Refused where a consumer's expression would grow past ``INLINE_NODE_LIMIT`` nodes.
    """
    prim = "compute_inline"
    blk = get_block(func, prim, block)
    _check_standalone(func, prim, blk)
    buf = func.buffer(blk.store)
    if buf.name in func.outputs:
        fail(prim, "block", block, f"writes output {buf.name}, which must be stored")
    check_single_producer(func, prim, blk)
    if tuple(blk.store_indices) != tuple(Var(a.name) for a in blk.axes):
        fail(prim, "block", block, "does not store at its plain axes")
    if buf.name in {ld.buffer for ld in loads(blk.value)}:
        fail(prim, "block", block, "reads its own output")
    blocks = []
    for b in func.blocks:
        if b.name == block:
            continue
        if buf.name in b.read_buffers:
            _check_size(prim, block, b.name, inlined_size(b.value, buf, blk))
            b = replace(b, value=_inline_loads(b.value, buf, blk))
        blocks.append(b)
    out = replace(func, blocks=tuple(blocks), buffers=tuple(x for x in func.buffers if x.name != buf.name),
                  _index={})
    return normalize(out), None


def reverse_compute_inline(func: Func, block: str) -> tuple[Func, None]:
    """Fold a spatial consumer into its producer's store and remove it (e.g. an epilogue into a write-back).

    Before ``reverse_compute_inline(f, "D")``::

        alloc C: float32[8] global
        for C.i in range(8):
          block C S (i=C.i):
            C[i] = C_local[i]
        for D.i in range(8):
          block D S (i=D.i):
            D[i] = max(C[i] + bias[i], 0.0)

    After::

        for C.i in range(8):
          block C S (i=C.i):
            D[i] = max(C_local[i] + bias[i], 0.0)
    """
    prim = "reverse_compute_inline"
    blk = get_block(func, prim, block)
    _check_standalone(func, prim, blk)
    produced = [b for b in blk.read_buffers if func.producers(b)]
    if len(produced) != 1:
        fail(prim, "block", block, f"must read exactly one computed buffer, reads {produced}")
    buf = func.buffer(produced[0])
    producers = func.producers(buf.name)
    if len(producers) != 1:
        fail(prim, "block", block, f"{buf.name} has several producers ({', '.join(p.name for p in producers)})")
    (producer,) = producers
    if producer.reducer is not None:
        fail(prim, "block", block, f"its producer {producer.name} is a reduction; cache_write it first")
    if buf.name in func.outputs or [c.name for c in func.consumers(buf.name)] != [block]:
        fail(prim, "block", block, f"{buf.name} has other readers or is an output")
    reads = [ld for ld in loads(blk.value) if ld.buffer == buf.name]
    index = reads[0].indices
    names = [a.name for a in blk.axes]
    if any(ld.indices != index for ld in reads) or sorted(
            i.name for i in index if isinstance(i, Var)) != sorted(names) or len(index) != len(names):
        fail(prim, "block", block, f"must read {buf.name} at a permutation of its axes, reads {reads[0]}")
    for d, (ix, dim) in enumerate(zip(index, buf.shape)):
        extent = blk.axis(ix.name).extent
        if extent != dim:
            fail(prim, "block", block, f"axis {ix.name} spans {extent} but reads dim {d} of {buf.name}, which "
                 f"has {dim}; the producer's iteration domain would not match")
    mapping = {ix.name: p for ix, p in zip(index, producer.store_indices)}
    # Rename the consumer's axes first, so producer axes that share their names are never captured.
    consumer = substitute(blk.value, mapping)
    _check_size(prim, block, producer.name, inlined_size(consumer, buf, replace(producer, axes=())))
    value = _inline_loads(consumer, buf, replace(producer, axes=()))
    new_producer = replace(producer, store=blk.store,
                           store_indices=tuple(substitute(i, mapping) for i in blk.store_indices), value=value)
    blocks = tuple(new_producer if b.name == producer.name else b for b in func.blocks if b.name != block)
    out = replace(func, blocks=blocks, buffers=tuple(x for x in func.buffers if x.name != buf.name), _index={})
    return normalize(out), None
