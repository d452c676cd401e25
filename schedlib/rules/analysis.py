"""Pattern facts read off a Func's structure: S/R kinds and access indices, never block or buffer names."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schedlib.errors import ScheduleError
from schedlib.ir.expr import Binary, Cast, Const, Expr, Load, Var, as_int
from schedlib.ir.func import Block, Func
from schedlib.ir.primitives.inline import compute_inline
from schedlib.ir.simplify import loads


@dataclass(frozen=True)
class Access:
    """One load: the buffer and, per index dimension, the axis it is (None if not a plain axis)."""

    buffer: str
    axes: tuple[str | None, ...]

    @property
    def plain(self) -> bool:
        return all(a is not None for a in self.axes)


def access_of(block: Block, ld: Load) -> Access:
    names = {a.name for a in block.axes}
    return Access(ld.buffer, tuple(i.name if isinstance(i, Var) and i.name in names else None
                                   for i in ld.indices))


def accesses(block: Block) -> list[Access]:
    return [access_of(block, ld) for ld in loads(block.value)]


def stores_plainly(block: Block) -> bool:
    """The block writes ``out[s0, s1, ...]`` at its spatial axes in order."""
    spatial = [a.name for a in block.axes if a.kind == "S"]
    return [i.name if isinstance(i, Var) else None for i in block.store_indices] == spatial


def strip_casts(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.value
    return e


def product_operands(e: Expr) -> tuple[Load, Load] | None:
    """``cast(a[...]) * cast(b[...])`` -> the two loads."""
    e = strip_casts(e)
    if isinstance(e, Binary) and e.op == "*":
        a, b = strip_casts(e.a), strip_casts(e.b)
        if isinstance(a, Load) and isinstance(b, Load):
            return a, b
    return None


def product_loads(e: Expr) -> list[Load] | None:
    """The loads of a product of (cast) loads and constants, ``cast(x[m, k]) * (cast(w[n, k]) * s[n])`` ->
    the three loads; None when ``e`` is anything else (a sum, a call)."""
    e = strip_casts(e)
    if isinstance(e, Load):
        return [e]
    if isinstance(e, Const):
        return []
    if isinstance(e, Binary) and e.op == "*":
        a, b = product_loads(e.a), product_loads(e.b)
        return None if a is None or b is None else a + b
    return None


def is_elementwise(block: Block) -> bool:
    """Spatial, stored at its axes, and every load indexed by plain axes or constants: broadcasts allowed,
    a missing axis (``b[k]`` in a 3-D block) or a kept dimension of one (``c[j, 0]``, numpy's keepdims)."""
    names = {a.name for a in block.axes}
    return block.reducer is None and stores_plainly(block) and all(
        isinstance(i, Const) or (isinstance(i, Var) and i.name in names) for ld in loads(block.value)
        for i in ld.indices)


def epilogue_chain(func: Func, main: Block) -> list[Block] | str:
    """Element-wise blocks after ``main`` that consume its result in a chain, or why there is none."""
    chain: list[Block] = []
    current = main
    for b in func.blocks[func.blocks.index(main) + 1:]:
        if not is_elementwise(b):
            return f"block {b.name} after {main.name} is not element-wise"
        produced = [r for r in b.read_buffers if func.producers(r)]
        if produced != [current.store]:
            return f"block {b.name} does not consume only {current.store}"
        reads = [acc for acc in accesses(b) if acc.buffer == current.store]
        spatial = tuple(a.name for a in b.axes)
        if any(acc.axes != spatial for acc in reads):
            return f"block {b.name} reads {current.store} at permuted indices"
        if len(func.consumers(current.store)) != 1:
            return f"{current.store} has several consumers"
        # A stage the rules fuse is inlined into the next one, so its values never reach memory: a stage that
        # is also a func output would have to be stored as well, which the templates do not do.
        if current.store in func.outputs:
            return f"{current.store} is a func output and also feeds {b.name}; it cannot be fused into {b.name}"
        chain.append(b)
        current = b
    return chain


def reduction_view(func: Func) -> tuple[Func, Block, tuple[str, ...]] | str:
    """The func's one reduction block as it reads after :func:`inline_prologue`: (that func, the block, the
    stages inlined in the order a schedule inlines them); or why there is none."""
    reductions = [b for b in func.blocks if b.reducer is not None]
    if len(reductions) != 1:
        return f"needs exactly one reduction block, found {len(reductions)}"
    inlined = inline_prologue(func, reductions[0])
    if isinstance(inlined, str):
        return inlined
    view, prologue = inlined
    return view, view.block(reductions[0].name), prologue


def inline_prologue(func: Func, main: Block) -> tuple[Func, tuple[str, ...]] | str:
    """``func`` with every stage before ``main`` inlined into its consumers, and those stages' names in the
    order a schedule inlines them; or why that cannot be done.

    A reduction of a computed value (``sum(exp(x))`` written as two stages, a dequantised weight) then reads
    func inputs only, which is what the cross-thread template stages and vectorizes.  Only element-wise
    stages qualify: they are recomputed where used, so nothing is stored and nothing is recomputed twice
    unless two loads read one element.  A stage that is also a func output must be stored, so it declines.
    """
    names: list[str] = []
    for b in func.blocks[:func.blocks.index(main)]:
        if not is_elementwise(b):
            return f"block {b.name} before {main.name} is not element-wise"
        if b.store in func.outputs:
            return f"block {b.name} before {main.name} writes func output {b.store}, which must be stored"
        names.append(b.name)
    view = func
    # Last stage first: each is inlined into a consumer that is itself still a plain element-wise block.
    order = tuple(reversed(names))
    for name in order:
        try:
            view, _ = compute_inline(view, name)
        except ScheduleError as e:
            return f"block {name} cannot be inlined: {e.reason}"
    return view, order


def operand_stages(func: Func, main: Block, buffers: Iterable[str]) -> tuple[str, ...] | str:
    """The element-wise stages computing ``buffers`` (operands ``main`` reads) from func inputs, chains or
    trees of them (``scale(float(W))``), readers before the stages they read (the order they inline in); or
    why they cannot all be computed where ``main`` reads its operands and never be stored.

    Each stage must be read only by ``main`` or by another of them, and be no func output: a template then
    computes them in its copy of each operand (the matmul's into shared memory; a stage both operands reach
    in each copy), and the carver counts their global reads as ``main``'s loop steps.  A stage read twice
    within the trees (a diamond) is listed once.
    """
    trees: list[list[str]] = []
    for buffer in buffers:
        tree = [] if buffer in func.inputs else _elementwise_tree(func, buffer)
        if isinstance(tree, str):
            return tree
        trees.append(tree)
    stages = list(dict.fromkeys(name for tree in trees for name in tree))
    allowed = {main.name, *stages}
    for name in stages:
        others = [r.name for r in func.consumers(func.block(name).store) if r.name not in allowed]
        if others:
            return f"block {others[0]} reads {func.block(name).store} too, so it must be stored"
    # Operand by operand, readers first (func order is a topological one): a stage is inlined once every
    # reader it had is gone, so one that several operands reach goes with the last of them.
    last = {name: t for t, tree in enumerate(trees) for name in tree}
    position = {b.name: i for i, b in enumerate(func.blocks)}
    return tuple(sorted(last, key=lambda name: (last[name], -position[name])))


def _elementwise_tree(func: Func, buffer: str) -> list[str] | str:
    """The blocks computing ``buffer`` from func inputs, each element-wise and no func output; or why not."""
    order: list[str] = []
    pending = [buffer]
    while pending:
        name = pending.pop(0)
        producers = func.producers(name)
        if name in func.outputs:
            return f"{name} is a func output, which must be stored"
        if len(producers) != 1:
            return f"{name} has {len(producers)} producing blocks, not one"
        stage = producers[0]
        if not is_elementwise(stage):
            return f"block {stage.name} computing {name} is not element-wise"
        if stage.name not in order:
            order.append(stage.name)
            pending += [n for n in stage.read_buffers if n not in func.inputs]
    return order


def const_or(e: Expr, default: int) -> int:
    """A constant extent, or ``default`` for a symbolic one (rules plan for a representative value)."""
    v = as_int(e)
    return default if v is None else v


def ceil_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def tile_count(M: int, N: int, batch: int, tile: tuple[int, int]) -> int:
    """Blocks of a ``tile[0] x tile[1]`` tiling of ``batch`` M x N outputs (partial tiles at the edges count)."""
    return batch * -(-M // tile[0]) * -(-N // tile[1])


def shrink_to_fill(M: int, N: int, batch: int, sms: int, tile: tuple[int, int], floor: int) -> tuple[int, int]:
    """``tile`` halved, its longer side first, until the grid gives every SM a block or both sides are at most
    ``floor``."""
    bm, bn = tile
    while tile_count(M, N, batch, (bm, bn)) < sms and max(bm, bn) > floor:
        if bm >= bn:
            bm //= 2
        else:
            bn //= 2
    return bm, bn
