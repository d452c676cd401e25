"""What the GeneralReduction rule reads off a softmax / norm func: which axis its reductions reduce, and which
input every pass reads.

The output stage is element-wise over the output's axes; every reduction reduces one of them (the same one)
and keeps the others, and every other stage is element-wise over the output's shape or over the kept axes (a
row statistic: ``rstd = rsqrt(var + eps)``).  Reductions and row statistics may be func outputs too (a
layer norm that returns its mean and rstd for the backward pass); the row layout stores them once per row.
Without an element-wise output, reductions of the same rows may be the outputs themselves, a chain (a row's
max, then its sum of exp(x - max)) or side by side (its sum and its sum of squares): the last leads the row's
block and the others run before it.  An output no stage reads runs in the row's block all the same.
Extents alone cannot say which axis that is (a square softmax over columns has the extents of one over
rows), so the analysis follows the indices: each reduction must read its operands at the output's axes with
its reduce axis in one position, and every stage must read the reductions' results at the kept axes, in
order.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Expr, as_int
from schedlib.ir.func import Block, Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import accesses, const_or, is_elementwise, stores_plainly


@dataclass(frozen=True)
class GeneralReductionFacts:
    output: str
    reductions: tuple[str, ...]
    elementwise: tuple[str, ...]
    in_bytes: int
    cols: int  # the reduced length (planned at 4096 when symbolic)
    row_input: str | None  # the input every pass reads row by row (what ``stage_row`` copies), if any
    row_passes: int  # passes reading it: reductions and the output, element-wise stages inlined
    row_bytes: int | None  # bytes of one row of ``row_input``; None for a symbolic row length
    axis: int = -1  # the output axis the reductions reduce; the last one (-1) unless ``column``
    row_stages: tuple[str, ...] = ()  # element-wise stages over the kept axes that are func outputs
    stored: tuple[str, ...] = ()  # reductions and row stages whose results are func outputs, in func order
    # stored ones no stage reads (a row's sum beside its sum of squares, a log-sum-exp beside the softmax):
    # computed beside the row's other stages (compute_with), as nothing reads them inside the row
    side_by_side: tuple[str, ...] = ()

    @property
    def column(self) -> bool:
        """The reduced axis is not the contiguous one (a softmax over ``dim=0``): the column layout."""
        return self.axis != -1


def analyze_general_reduction(func: Func) -> GeneralReductionFacts | str:
    """The facts of a softmax / norm-shaped func, or why it is not one."""
    computed = func.blocks
    # The output over (rows, cols) leads the row's block wherever the func lists it: statistics beside it (a
    # log-sum-exp listed after the softmax) come later in the func's order, as nothing it computes reads them.
    wide = [b for b in computed if b.store in func.outputs and len(b.axes) >= 2 and is_elementwise(b)]
    out = wide[-1] if wide else computed[-1]
    if out.store not in func.outputs:
        return "needs the last stage to write a func output"
    others_computed = [b for b in computed if b is not out]
    reductions = [b for b in computed if b.reducer is not None]
    if not reductions or len(computed) < 2:
        return "needs at least one reduction feeding an element-wise output"
    statistics_only = out.reducer is not None  # (max, sum) of the same rows: the last reduction leads
    if statistics_only and len(reductions) < 2:
        return "a single reduction is the reduction rule's"
    if not statistics_only and (not is_elementwise(out) or len(out.axes) < 2):
        return f"output block {out.name} must be element-wise over (rows..., cols)"
    rank = len(out.axes)  # a reduction's operands: its spatial axes and its reduce axis
    axis = _reduced_axis(func, reductions, rank)
    if isinstance(axis, str):
        return axis
    if statistics_only:  # the operands' shape: the kept axes with the reduced one at its place
        shape = [a.extent for a in out.axes if a.kind == "S"]
        shape.insert(axis, next(a.extent for a in out.axes if a.kind == "R"))
        if axis != len(shape) - 1:
            return "reductions over a non-contiguous axis need an element-wise output (the column layout)"
    else:
        shape = [a.extent for a in out.axes]
    kept = [e for d, e in enumerate(shape) if d != axis]
    rows = [b for b in others_computed if b.reducer is None and [a.extent for a in b.axes] == kept
            and is_elementwise(b)]
    if statistics_only and rows:
        return (f"row statistic {rows[0].name} and no element-wise output over (rows, cols): without one to "
                "lead the row's block, the rule takes reductions alone")
    # (sl.func collects only the stages its outputs need, so a stage nothing reads is an output)
    unread = [b for b in (*reductions, *rows) if b is not out and not func.consumers(b.store)]
    results = {b.store for b in (*reductions, *rows)}
    stored = [b for b in (*reductions, *rows) if b.store in func.outputs and b is not out]
    row_names, stored_names = {b.name for b in rows}, {b.name for b in stored}
    others = sorted(set(func.outputs) - {out.store} - {b.store for b in stored})
    if others:
        return (f"output {others[0]} is written by neither the last stage, a reduction nor a row statistic "
                "(an element-wise stage over the kept axes)")
    if stored and axis != len(shape) - 1:
        return f"the column layout stores one output; {stored[0].store} is a further one"
    if stored and len(kept) != 1:
        return (f"{stored[0].store} is a further output over {len(kept)} kept axes; statistics are stored for "
                "rows of a 2-D func")
    for b in computed:
        if b.name in row_names:
            why = _reads_in_order(b, [a.name for a in b.axes], results)
        elif b.reducer is not None:
            spatial = [a.extent for a in b.axes if a.kind == "S"]
            red = [a.extent for a in b.axes if a.kind == "R"]
            if spatial != kept or red != [shape[axis]] or not stores_plainly(b):
                return (f"reduction {b.name} does not reduce the output's axis {axis} and keep the others "
                        "(every reduction must reduce the same axis)")
            why = _reads_in_order(b, [a.name for a in b.axes if a.kind == "S"], results)
        elif not is_elementwise(b) or [a.extent for a in b.axes] != shape:
            return f"block {b.name} is neither a reduction nor element-wise over the output shape"
        else:
            names = [a.name for a in b.axes]
            why = _reads_in_order(b, [n for d, n in enumerate(names) if d != axis], results, full=names)
        if why:
            return why
    x = next(iter(func.inputs))
    row_input, passes = _row_input(func, shape)
    fixed = as_int(shape[axis])
    row_bytes = None if fixed is None or row_input is None else fixed * BYTES[func.buffer(row_input).dtype]
    return GeneralReductionFacts(out.name, tuple(b.name for b in reductions if b is not out),
                                 tuple(b.name for b in others_computed
                                       if b.reducer is None and b.name not in stored_names),
                                 BYTES[func.buffer(x).dtype], const_or(shape[axis], 4096), row_input, passes,
                                 row_bytes, -1 if axis == len(shape) - 1 else axis,
                                 tuple(b.name for b in rows if b.name in stored_names), tuple(b.name for b in stored),
                                 tuple(b.name for b in unread))


def inlined_schedule(func: Func, facts: GeneralReductionFacts) -> tuple[Schedule, list[str]]:
    """The start both layouts share: element-wise stages inlined (recomputed where used), and each
    reduction's result kept in a register (cache_write local, then the copy inlined away).  A result that is
    a func output is stored where it is computed instead, and the stages after it read it back through a
    register copy (cache_read local); returns the schedule and those copies."""
    s = Schedule(func)
    for name in facts.elementwise:
        s.compute_inline(name)
    for name in facts.reductions:
        if name not in facts.stored:
            s.compute_inline(s.cache_write(name, "local"))
    copies = []
    for name in facts.stored:
        readers = [b.name for b in s.func.consumers(func.block(name).store)]
        if readers:
            copies.append(s.cache_read(readers[0], func.block(name).store, "local", consumers=readers[1:]))
    return s, copies


def _reduced_axis(func: Func, reductions: list[Block], rank: int) -> int | str:
    """The output axis every reduction reduces: where each one's reduce axis sits in its reads of operands of
    the output's rank (``max_k X[k, j]`` reduces axis 0).  Those reads must hold every axis of the reduction
    once, its spatial axes in order."""
    found: set[int] = set()
    for b in reductions:
        r_axes = [a.name for a in b.axes if a.kind == "R"]
        if len(r_axes) != 1:
            return f"reduction {b.name} reduces {len(r_axes)} axes; a row or column reduction reduces one"
        spatial = [a.name for a in b.axes if a.kind == "S"]
        accs = accesses(b)
        if not all(acc.plain for acc in accs):
            return f"reduction {b.name} reads at non-plain indices"
        full = [acc for acc in accs if len(acc.axes) == rank]
        if not full:
            return f"reduction {b.name} reads no operand of the output's rank {rank}"
        for acc in full:
            names = list(acc.axes)
            if r_axes[0] not in names or [n for n in names if n != r_axes[0]] != spatial:
                return (f"reduction {b.name} reads {acc.buffer}[{', '.join(names)}]; a row or column reduction "
                        f"reads its operands at its kept axes in order with the reduced one among them")
            found.add(names.index(r_axes[0]))
    if len(found) != 1:
        return f"the reductions reduce different axes of the output ({sorted(found)})"
    return found.pop()


def _reads_in_order(block: Block, kept: list[str], results: set[str], full: list[str] | None = None) -> str | None:
    """Why ``block`` reads a reduction's result anywhere but at ``kept`` (the axes a reduction keeps, in
    order), or an operand of the output's rank anywhere but at ``full`` (a permuted read is a transpose)."""
    for acc in accesses(block):
        if acc.buffer in results and list(acc.axes) != kept:
            return (f"block {block.name} reads the reduction result {acc.buffer} at [{', '.join(map(str, acc.axes))}]"
                    f", not at the kept axes [{', '.join(kept)}]")
        # (a constant index, None here, is a broadcast: a (1, cols) gain read at [0, j] is no transpose)
        if full is not None and len(acc.axes) == len(full) and None not in acc.axes and list(acc.axes) != full:
            return f"block {block.name} reads {acc.buffer} at permuted indices [{', '.join(map(str, acc.axes))}]"
    return None


def _row_input(func: Func, shape: list[Expr]) -> tuple[str | None, int]:
    """The input shaped like the output that most passes read (element-wise stages count as part of the
    reduction or output stage they are inlined into), and that count."""
    reads: dict[str, set[str]] = {}  # block -> inputs it reads once element-wise stages are inlined
    for b in func.blocks:
        reads[b.name] = {n for n in b.read_buffers if n in func.inputs}
        for n in b.read_buffers:
            producer = func.producers(n)
            if producer and producer[0].reducer is None:
                reads[b.name] |= reads.get(producer[0].name, set())
    passes = [b.name for b in func.blocks if b.reducer is not None or b.store in func.outputs]
    best: tuple[str | None, int] = (None, 0)
    for name in func.inputs:
        count = sum(name in reads[p] for p in passes)
        if list(func.buffer(name).shape) == shape and count > best[1]:
            best = (name, count)
    return best if best[1] >= 2 else (None, best[1])
