"""Readable text of expressions and loop nests.

The loop-nest text is what users read while scheduling and what the primitive docstrings show, e.g.::

    for C.i_0 in range(4):  # blockIdx.x
      for C.k in range(64):
        block C SSR (i=C.i_0 * 16 + C.i_1, j=C.j, k=C.k):
          init C[i, j] = 0.0
          C[i, j] += A[i, k] * B[k, j]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from schedlib.ir.expr import Binary, Call, Cast, Const, Expr, Load, Reduce, Select, Var

if TYPE_CHECKING:  # func.py imports this module when printing
    from schedlib.ir.func import Block, Func

_PREC = {"or": 1, "and": 2, "<": 3, "<=": 3, ">": 3, ">=": 3, "==": 3, "!=": 3,
         "+": 4, "-": 4, "*": 5, "/": 5, "//": 5, "%": 5}
_REDUCE_SYMBOL = {"sum": "+=", "max": "max=", "min": "min="}
# (op, right operand's op) pairs where ``a op (b rop c)`` means the same as ``a op b rop c``; any other
# right operand of equal precedence keeps its parentheses (``2 * (i // 2)`` is not ``2 * i // 2``).
_ASSOCIATIVE = {("+", "+"), ("+", "-"), ("*", "*"), ("and", "and"), ("or", "or")}


def expr_str(e: Expr, parent_prec: int = 0) -> str:
    if isinstance(e, Const):
        if isinstance(e.value, float):
            if math.isinf(e.value):
                return "inf" if e.value > 0 else "-inf"
            return repr(e.value)
        return str(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Binary):
        if e.op in ("min", "max"):
            return f"{e.op}({expr_str(e.a)}, {expr_str(e.b)})"
        prec = _PREC[e.op]
        if prec == _PREC["<"]:
            # Comparisons do not nest without parentheses: ``a < b == c`` would read as a chain.
            left_prec = right_prec = prec + 1
        else:
            left_prec = prec
            associative = isinstance(e.b, Binary) and (e.op, e.b.op) in _ASSOCIATIVE
            right_prec = prec if associative else prec + 1
        text = f"{expr_str(e.a, left_prec)} {e.op} {expr_str(e.b, right_prec)}"
        return f"({text})" if prec < parent_prec else text
    if isinstance(e, Call):
        if e.fn == "neg":
            return f"-{expr_str(e.args[0], 6)}"
        return f"{e.fn}({', '.join(expr_str(a) for a in e.args)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_str(e.value)})"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.then)}, {expr_str(e.other)})"
    if isinstance(e, Load):
        return f"{e.buffer}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ", ".join(a.name for a in e.axes)
        return f"{e.op}({expr_str(e.source)}, axis=[{axes}])"
    return repr(e)


def _loop_line(lp) -> str:
    notes = []
    if lp.thread:
        notes.append(lp.thread)
    if lp.vectorized:
        notes.append("vectorize")
    if lp.unrolled:
        notes.append("unroll")
    notes.extend(f"{k}={v!r}" for k, v in lp.annotations)
    suffix = f"  # {', '.join(notes)}" if notes else ""
    return f"for {lp.name} in range({expr_str(lp.extent)}):{suffix}"


def _block_lines(func, block, depth: int) -> list[str]:
    pad = "  " * depth
    binds = ", ".join(f"{a.name}={expr_str(b)}" for a, b in zip(block.axes, block.bindings))
    head = f"{pad}block {block.name} {block.kinds or '-'} ({binds})"
    if block.predicate is not None:
        head += f" where {expr_str(block.predicate)}"
    head += ":"
    if block.annotations:  # after the colon, like a loop's notes, so the comment does not swallow it
        head += "  # " + ", ".join(f"{k}={v!r}" for k, v in block.annotations)
    lines = [head]
    target = f"{block.store}[{', '.join(expr_str(i) for i in block.store_indices)}]"
    if block.reducer is not None:
        if block.init is not None:
            lines.append(f"{pad}  init {target} = {expr_str(block.init)}")
        lines.append(f"{pad}  {target} {_REDUCE_SYMBOL[block.reducer]} {expr_str(block.value)}")
    else:
        lines.append(f"{pad}  {target} = {expr_str(block.value)}")
    return lines


def chain_lines(func: Func, block: Block, depth: int) -> list[str]:
    """The text of one block's loop chain with the blocks attached inside it."""
    lines: list[str] = []
    d = depth
    for lp in block.loops:
        lines.append("  " * d + _loop_line(lp))
        d += 1
        for b in func.attached_at(block.name, lp.name, "before"):
            lines.extend(chain_lines(func, b, d))
    lines.extend(_block_lines(func, block, d))
    for lp in reversed(block.loops):
        for b in func.attached_at(block.name, lp.name, "after"):
            lines.extend(chain_lines(func, b, d))
        d -= 1
    return lines


def func_str(func: Func) -> str:
    def sig(name: str) -> str:
        buf = func.buffer(name)
        return f"{name}: {buf.dtype}[{', '.join(expr_str(s) for s in buf.shape)}]"

    params = ", ".join(sig(n) for n in func.inputs)
    outs = ", ".join(sig(n) for n in func.outputs)
    lines = [f"func {func.name}({params}) -> ({outs}):"]
    for buf in func.buffers:
        if buf.name in func.inputs or buf.name in func.outputs:
            continue
        align = f" align={list(buf.align)}" if buf.align else ""
        permute = f" permute={[(d, list(f), list(o)) for d, f, o in buf.permute]}" if buf.permute else ""
        # The mma lane layout is no dense per-thread tile, so a tensor-core accumulator keeps the problem's
        # shape in the IR; the reader of the nest should not take it for the registers it costs.
        fragments = buf.scope == "local" and any(
            b.store == buf.name and "tensor_core" in dict(b.annotations) for b in func.blocks)
        note = "  # held as mma fragments in registers, each lane its own elements" if fragments else ""
        lines.append(f"  alloc {sig(buf.name)} {buf.scope}{align}{permute}{note}")
    for b in func.root_blocks():
        lines.extend(chain_lines(func, b, 1))
    return "\n".join(lines)
