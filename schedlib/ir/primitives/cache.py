"""Caching primitives: cache_read and cache_write add a copy stage through a faster memory scope."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from schedlib.ir.expr import Load, Var
from schedlib.ir.func import SCOPES, Axis, Block, Buffer, Func, Loop
from schedlib.ir.primitives.common import check_dependencies, fail, get_block
from schedlib.ir.simplify import rename_buffer, walk


def _copy_block(func: Func, name: str, src: Buffer, dst: str) -> Block:
    """A block copying every element of ``src`` into ``dst`` (same shape), one loop per dimension."""
    axes = tuple(Axis(func.fresh_axis_name(f"ax{d}"), ext, "S") for d, ext in enumerate(src.shape))
    taken = func.all_loop_names()
    loops = tuple(Loop(func.fresh_name(f"{name}.ax{d}", taken), ext) for d, ext in enumerate(src.shape))
    idx = tuple(Var(a.name) for a in axes)
    return Block(name=name, axes=axes, bindings=tuple(lp.var for lp in loops), loops=loops, store=dst,
                 store_indices=idx, value=Load(src.name, idx, src.dtype))


def _check_scope(prim: str, scope: str) -> None:
    if not isinstance(scope, str) or scope not in SCOPES:
        fail(prim, "scope", scope, f"must be one of {', '.join(SCOPES)}")


def _insert(blocks: tuple[Block, ...], new: Block, anchor: str, after: bool) -> tuple[Block, ...]:
    out: list[Block] = []
    for b in blocks:
        if b.name == anchor and not after:
            out.append(new)
        out.append(b)
        if b.name == anchor and after:
            out.append(new)
    return tuple(out)


def cache_read(func: Func, block: str, buffer: str | int, scope: str,
               consumers: Sequence[str] | None = None, occurrence: int | None = None) -> tuple[Func, str]:
    """Make ``block`` read ``buffer`` through a copy in ``scope``; returns the new copy block's name.

    ``buffer`` is a buffer name or an index into the block's reads.  ``consumers`` names further blocks
    that read ``buffer`` through the same copy (a softmax's max, sum and output stages sharing one staged
    row); the copy is placed before the first of them.  Other readers are unchanged.  ``occurrence`` sends
    only that one of the block's loads of ``buffer`` (counted left to right from 0) through the copy: in
    ``C[i, j] += X[i, k] * X[j, k]`` each load of X gets a tile of its own (``occurrence=0`` is ``X[i, k]``).

    Before ``cache_read(f, "C", "A", "shared")``::

        for C.i in range(64):
          for C.k in range(32):
            block C SR (i=C.i, k=C.k):
              init C[i] = 0.0
              C[i] += A[i, k]

    After::

        alloc A_shared: float32[64, 32] shared
        for A_shared.ax0 in range(64):
          for A_shared.ax1 in range(32):
            block A_shared SS (ax0=A_shared.ax0, ax1=A_shared.ax1):
              A_shared[ax0, ax1] = A[ax0, ax1]
        for C.i in range(64):
          for C.k in range(32):
            block C SR (i=C.i, k=C.k):
              init C[i] = 0.0
              C[i] += A_shared[i, k]
    """
    prim = "cache_read"
    blk = get_block(func, prim, block)
    _check_scope(prim, scope)
    reads = blk.read_buffers
    if isinstance(buffer, int) and not isinstance(buffer, bool):
        if not 0 <= buffer < len(reads):
            fail(prim, "buffer", buffer, f"block {block} reads {len(reads)} buffers ({', '.join(reads)})")
        buffer = reads[buffer]
    if not isinstance(buffer, str) or buffer not in reads:
        fail(prim, "buffer", buffer, f"block {block} does not read it; it reads {', '.join(reads) or 'nothing'}")
    readers = [block, *_consumers(func, prim, consumers, buffer)]
    if occurrence is not None:
        loads = sum(1 for e in walk(blk.value) if isinstance(e, Load) and e.buffer == buffer)
        if isinstance(occurrence, bool) or not isinstance(occurrence, int) or not 0 <= occurrence < loads:
            fail(prim, "occurrence", occurrence, f"block {block} has {loads} load(s) of {buffer}: 0..{loads - 1}")
        if consumers:
            fail(prim, "occurrence", occurrence, "picks one load of one block; it cannot be combined with consumers")
    producer = next((b for b in func.blocks if b.store == buffer), None)
    if producer is not None and producer.attach is not None:
        # the new copy goes before its first reader at the top level, where the attached producer has not run
        fail(prim, "buffer", buffer, f"is written by {producer.name}, which is attached inside {producer.attach.block}"
             f"'s loops, so a copy of it would run first; make the copies before attaching: cache_read both, "
             f"then compute_at the inner copy, then {producer.name}")
    src = func.buffer(buffer)
    name = func.fresh_name(f"{buffer}_{scope}")
    copy = _copy_block(func, name, src, name)
    new_buf = Buffer(name, src.shape, src.dtype, scope)
    out = func
    for reader in dict.fromkeys(readers):
        blk = out.block(reader)
        out = out.with_block(replace(blk, value=rename_buffer(blk.value, buffer, name, only=occurrence)))
    first = next(b.name for b in func.blocks if b.name in readers)
    out = replace(out, blocks=_insert(out.blocks, copy, first, after=False), buffers=(*out.buffers, new_buf),
                  _index={})
    check_dependencies(out, prim, "block", block)
    return out, name


def _consumers(func: Func, prim: str, consumers: Sequence[str] | None, buffer: str) -> list[str]:
    """The further readers named by ``consumers``, each checked to be a block that reads ``buffer``."""
    if consumers is None:
        return []
    if isinstance(consumers, str) or not isinstance(consumers, Sequence):
        fail(prim, "consumers", consumers, "must be a list of block names")
    for name in consumers:
        if buffer not in get_block(func, prim, name, "consumers").read_buffers:
            fail(prim, "consumers", list(consumers), f"block {name} does not read {buffer}")
    return list(consumers)


def cache_write(func: Func, block: str, scope: str, consumers: Sequence[str] | None = None) -> tuple[Func, str]:
    """Make ``block`` write into a new buffer in ``scope`` and copy it back; returns the copy block's name.

    ``consumers`` names readers of the buffer that read the new one instead (it holds the same values once
    ``block`` is done): a row's statistic that is also a func output is stored by the copy, and the stages
    after it read it from the register.  Other readers are unchanged.

    Before ``cache_write(f, "C", "local")``::

        for C.i in range(64):
          for C.k in range(32):
            block C SR (i=C.i, k=C.k):
              init C[i] = 0.0
              C[i] += A[i, k]

    After::

        alloc C_local: float32[64] local
        for C.i in range(64):
          for C.k in range(32):
            block C SR (i=C.i, k=C.k):
              init C_local[i] = 0.0
              C_local[i] += A[i, k]
        for C_local.ax0 in range(64):
          block C_local S (ax0=C_local.ax0):
            C[ax0] = C_local[ax0]

    With ``consumers=["D"]`` for a reader ``D[i] = C[i] * 2.0``, D reads ``C_local[i]`` instead.
    """
    prim = "cache_write"
    blk = get_block(func, prim, block)
    _check_scope(prim, scope)
    target = func.buffer(blk.store)
    readers = _consumers(func, prim, consumers, target.name)  # (``block`` is no reader of its own buffer)
    if len(func.producers(target.name)) != 1:
        fail(prim, "block", block, f"buffer {target.name} has several producers")
    if func.attached_to(block) or blk.attach is not None:
        fail(prim, "block", block, "is attached or has blocks attached to it; cache_write before compute_at")
    if target.name in func.inputs:
        fail(prim, "block", block, f"writes input buffer {target.name}")
    name = func.fresh_name(f"{target.name}_{scope}")
    new_buf = Buffer(name, target.shape, target.dtype, scope)
    copy = _copy_block(func, name, new_buf, target.name)
    writer = replace(blk, store=name, value=rename_buffer(blk.value, target.name, name))
    out = func.with_block(writer)
    for reader in dict.fromkeys(readers):
        rb = out.block(reader)
        out = out.with_block(replace(rb, value=rename_buffer(rb.value, target.name, name)))
    out = replace(out, blocks=_insert(out.blocks, copy, block, after=True), buffers=(*out.buffers, new_buf),
                  _index={})
    check_dependencies(out, prim, "block", block)
    return out, name
