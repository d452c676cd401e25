"""C identifiers for loop variables that never stand for a size or a buffer.

A loop prints as its mangled name (``out.n`` -> ``out_n``), a symbolic size and a buffer as theirs.  When two
coincide (a size the user called ``out_n`` beside the loop ``out.n``), the loop variable shadows the size
inside the kernel: ``for (int out_n = 0; out_n < out_n; ...)`` runs nothing, silently.  Such loops are renamed
before the source is written; the schedule itself keeps its names.
"""

from __future__ import annotations

from dataclasses import replace

from schedlib.codegen.cuda_expr import mangle
from schedlib.ir.expr import Expr, Var
from schedlib.ir.func import Func
from schedlib.ir.simplify import substitute


def distinct_loop_names(func: Func) -> Func:
    """``func`` with every loop whose C name is taken (by a size, a buffer or an earlier loop) renamed."""
    used = {mangle(n) for n in (*func.symbols, *(b.name for b in func.buffers))}
    renamed: dict[str, str] = {}
    for block in func.blocks:
        for lp in block.loops:
            name = lp.name
            k = 0
            while mangle(name) in used:
                k += 1
                name = f"{lp.name}_l{k}"
            used.add(mangle(name))
            if name != lp.name:
                renamed[lp.name] = name
    if not renamed:
        return func
    to_var: dict[str, Expr] = {old: Var(new) for old, new in renamed.items()}
    blocks = []
    for b in func.blocks:
        loops = tuple(replace(lp, name=renamed.get(lp.name, lp.name), extent=substitute(lp.extent, to_var))
                      for lp in b.loops)
        attach = b.attach if b.attach is None else replace(b.attach, loop=renamed.get(b.attach.loop, b.attach.loop))
        blocks.append(replace(b.map_exprs(lambda e: substitute(e, to_var)), loops=loops, attach=attach))
    return replace(func, blocks=tuple(blocks), _index={})
