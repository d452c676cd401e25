"""What makes a func a matmul: the S/R structure and the operands of its one reduction, read off the IR.

Shared by the Matmul rule (whose templates stage exactly two operands) and the GEMV rule (which also takes
products with broadcast scales, ``x[m, k] * (w[n, k] * s[n])``, multiplied in registers).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Expr
from schedlib.ir.func import Block, Func
from schedlib.rules.analysis import (
    Access,
    access_of,
    epilogue_chain,
    operand_stages,
    product_loads,
    product_operands,
    stores_plainly,
)


@dataclass(frozen=True)
class MatmulFacts:
    main: str
    batch: tuple[str, ...]
    m: str
    n: str
    k: str
    a: str  # buffer holding the m axis
    b: str  # buffer holding the n axis
    a_contig: str  # axis along A's last dimension (k or m)
    b_contig: str
    epilogue: tuple[str, ...]
    in_bytes: int
    extents: dict[str, Expr]
    # element-wise stages computing an operand from func inputs (``relu(X) @ W``, ``float(W) * s @ ...``),
    # readers first: the SIMT template applies them in its copy into shared memory
    prologue: tuple[str, ...] = ()


def analyze_matmul(func: Func, scaled: bool = False) -> MatmulFacts | str:
    """The matmul's facts, or why ``func`` is not one.  ``scaled`` also takes products of more than two loads
    when the extra ones are broadcasts of an operand (``x[m, k] * (w[n, k] * s[n])``): the GEMV template
    multiplies them in registers, the matmul templates stage exactly two operands."""
    reductions = [b for b in func.blocks if b.reducer is not None]
    if len(reductions) != 1:
        return f"needs exactly one reduction block, found {len(reductions)}"
    main = reductions[0]
    if main.reducer != "sum" or main.kinds.count("R") != 1 or main.kinds.count("S") < 2:
        return f"block {main.name} has kinds {main.kinds}; a matmul is S..SR with a sum"
    if not stores_plainly(main):
        return f"block {main.name} does not store at its spatial axes"
    k = next(a.name for a in main.axes if a.kind == "R")
    operands = _scaled_operands(main, k) if scaled else _two_operands(main)
    if isinstance(operands, str):
        return operands
    acc_a, acc_b = operands
    computed = [acc.buffer for acc in (acc_a, acc_b) if acc.buffer not in func.inputs]
    if computed and scaled:  # the GEMV template multiplies what it loads in registers; its rule inlines first
        return f"operand {computed[0]} of a product of more than two loads must be a func input"
    # a stage both operands reach (relu(X) @ relu(X).T, or (R * 2) @ (R * 3).T): each operand's copy computes it
    prologue = operand_stages(func, main, computed)
    if isinstance(prologue, str):
        which = f"operand {computed[0]} must be a func input" if len(computed) == 1 else \
            f"operands {computed[0]} and {computed[1]} must be func inputs"
        return f"{which}, or computed from func inputs by element-wise stages that only the matmul reads ({prologue})"
    if not (acc_a.plain and acc_b.plain):
        return "operands must be indexed by plain axes"
    if acc_a.buffer == acc_b.buffer and (scaled or acc_a.axes == acc_b.axes):
        # one buffer read twice (a Gram matrix X @ X.T): the matmul templates stage each read as its own
        # operand tile; the GEMV template, and a product of one load with itself, have no such form
        return "operands must be two different buffers (or two different reads of one)"
    sa, sb = set(acc_a.axes), set(acc_b.axes)
    if k not in sa or k not in sb:
        return f"reduce axis {k} must index both operands"
    for acc in (acc_a, acc_b):
        if len(sa if acc is acc_a else sb) != len(acc.axes):
            return f"operand {acc.buffer} is read at a repeated axis ({', '.join(str(x) for x in acc.axes)})"
    spatial = [a.name for a in main.axes if a.kind == "S"]
    only_a = [s for s in acc_a.axes if s in spatial and s not in sb]
    only_b = [s for s in acc_b.axes if s in spatial and s not in sa]
    if not only_a or not only_b or len(set(only_a) | set(only_b) | (sa & sb)) != len(spatial) + 1:
        return f"spatial axes {spatial} do not split into batch, m (A only) and n (B only)"
    # Axes of one operand besides its innermost one (a linear layer's batch and sequence over activations
    # X[b, s, k] against a shared weight W[n, k]) are batch axes the other operand is broadcast over.
    batch_set = (sa & sb) - {k} | set(only_a[:-1]) | set(only_b[:-1])
    batch = tuple(s for s in spatial if s in batch_set)
    if list(spatial[:len(batch)]) != list(batch):
        return f"spatial axes {spatial}: the batch axes {list(batch)} must come first in the output"
    for acc in (acc_a, acc_b):  # the templates stage each operand as batch dims, then one matrix
        if any(x not in batch_set for x in acc.axes[:-2]) or any(x in batch_set for x in acc.axes[-2:]):
            return (f"operand {acc.buffer} is read at [{', '.join(str(x) for x in acc.axes)}]: its batch axes "
                    f"{[x for x in acc.axes if x in batch_set]} must come before its two matrix dimensions")
    epi = epilogue_chain(func, main)
    if isinstance(epi, str):
        return epi
    extents = {a.name: a.extent for a in main.axes}
    in_bytes = BYTES[func.buffer(acc_a.buffer).dtype]
    return MatmulFacts(main.name, batch, only_a[-1], only_b[-1], k, acc_a.buffer, acc_b.buffer, acc_a.axes[-1],
                       acc_b.axes[-1], tuple(b.name for b in epi), in_bytes, extents, tuple(prologue))


def _two_operands(main: Block) -> tuple[Access, Access] | str:
    ops = product_operands(main.value)
    if ops is None:
        return f"block {main.name} does not reduce a product of two loads"
    return access_of(main, ops[0]), access_of(main, ops[1])


def _scaled_operands(main: Block, k: str) -> tuple[Access, Access] | str:
    """The two loads of a product that the reduce axis ``k`` walks; every other factor must be a broadcast of
    one of them (indexed by some of its axes) and be read at plain axes."""
    lds = product_loads(main.value)
    if lds is None:
        return f"block {main.name} does not reduce a product of loads"
    accs = [access_of(main, ld) for ld in lds]
    walking = [a for a in accs if k in a.axes]
    if len(walking) != 2:
        return f"block {main.name} reduces a product of {len(walking)} loads indexed by {k}, not two"
    for extra in (a for a in accs if k not in a.axes):
        if not extra.plain or not any(set(extra.axes) <= set(w.axes) for w in walking):
            return f"factor {extra.buffer}[{', '.join(str(x) for x in extra.axes)}] is not a broadcast of an operand"
    return walking[0], walking[1]
