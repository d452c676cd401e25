"""The scheduled IR: a Func of blocks, each owning a chain of loops.

A *block* computes one buffer element per point of its axes (kinds S or R).  Its ``bindings`` give each axis
value as an expression of loop variables; its ``loops`` are the chain of loops it owns, outermost first.  A
block either sits at the root or hangs inside a loop of another block (``attach``), before or after that
loop's body.  Blocks run in ``Func.blocks`` order at the root and among blocks attached at one place.

Every node is a frozen dataclass: schedule primitives build new Funcs and never mutate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from schedlib.errors import IRError
from schedlib.ir.expr import Const, Expr, Load, Var
from schedlib.ir.simplify import free_vars, loads, map_children, substitute

THREAD_INDEX_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", *THREAD_INDEX_TAGS)
SCOPES = ("global", "shared", "local")
GRID_YZ_LIMIT = 65535  # CUDA's largest gridDim.y and gridDim.z (gridDim.x goes to 2^31 - 1)
# Partial results one thread keeps in registers across a cross-thread reduction (its spatial "lanes").
MAX_LANES = 16


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[Expr, ...]
    dtype: str
    scope: str = "global"
    # storage_align entries: (dim, factor, offset) pad the stride of dim to factor*k + offset
    align: tuple[tuple[int, int, int], ...] = ()
    # storage_permute entries: (dim, factors, order) store dim's mixed-radix digits in `order`
    permute: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Axis:
    name: str
    extent: Expr
    kind: str  # "S" or "R"


@dataclass(frozen=True)
class Loop:
    name: str
    extent: Expr
    thread: str | None = None  # one of THREAD_TAGS when bound
    vectorized: bool = False
    unrolled: bool = False
    annotations: tuple[tuple[str, Any], ...] = ()

    @property
    def var(self) -> Var:
        return Var(self.name)


@dataclass(frozen=True)
class Attach:
    block: str
    loop: str
    position: str  # "before" (producers, compute_at) or "after" (consumers, reverse_compute_at)


@dataclass(frozen=True)
class Block:
    name: str
    axes: tuple[Axis, ...]
    bindings: tuple[Expr, ...]
    loops: tuple[Loop, ...]
    store: str
    store_indices: tuple[Expr, ...]
    value: Expr
    reducer: str | None = None  # "sum" | "max" | "min" for reduction blocks
    init: Expr | None = None  # identity written at the first reduction step; None once decomposed
    predicate: Expr | None = None
    attach: Attach | None = None
    annotations: tuple[tuple[str, Any], ...] = ()

    @property
    def kinds(self) -> str:
        """Iterator kinds, e.g. ``"SSR"`` for a matmul."""
        return "".join(a.kind for a in self.axes)

    @property
    def reads(self) -> list[Load]:
        return loads(self.value)

    @property
    def read_buffers(self) -> list[str]:
        out: list[str] = []
        for ld in self.reads:
            if ld.buffer not in out:
                out.append(ld.buffer)
        return out

    def loop_index(self, name: str) -> int:
        for i, lp in enumerate(self.loops):
            if lp.name == name:
                return i
        raise KeyError(name)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def loop_kind(self, loop: str) -> str:
        """``R`` if the loop drives a reduce axis, ``S`` if only spatial axes, ``-`` if none."""
        kinds = {a.kind for a, b in zip(self.axes, self.bindings) if loop in free_vars(b)}
        return "R" if "R" in kinds else ("S" if kinds else "-")

    def map_exprs(self, fn: Callable[[Expr], Expr]) -> Block:
        """Apply ``fn`` to every expression of the block (bindings, indices, value, init, predicate)."""
        return replace(
            self,
            bindings=tuple(fn(b) for b in self.bindings),
            store_indices=tuple(fn(i) for i in self.store_indices),
            value=fn(self.value),
            init=None if self.init is None else fn(self.init),
            predicate=None if self.predicate is None else fn(self.predicate),
        )


@dataclass(frozen=True)
class Func:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    buffers: tuple[Buffer, ...]
    blocks: tuple[Block, ...]
    symbols: tuple[str, ...] = ()
    _index: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    # lookups ----------------------------------------------------------------------------------
    def block(self, name: str) -> Block:
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(name)

    def has_block(self, name: str) -> bool:
        return any(b.name == name for b in self.blocks)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def has_buffer(self, name: str) -> bool:
        return any(b.name == name for b in self.buffers)

    def loop_owner(self, loop: str) -> tuple[Block, int]:
        """The block owning ``loop`` and the loop's position in its chain."""
        for b in self.blocks:
            for i, lp in enumerate(b.loops):
                if lp.name == loop:
                    return b, i
        raise KeyError(loop)

    def all_loop_names(self) -> set[str]:
        return {lp.name for b in self.blocks for lp in b.loops}

    def producers(self, buffer: str) -> list[Block]:
        return [b for b in self.blocks if b.store == buffer]

    def consumers(self, buffer: str) -> list[Block]:
        return [b for b in self.blocks if buffer in b.read_buffers]

    def attached_at(self, block: str, loop: str, position: str | None = None) -> list[Block]:
        return [b for b in self.blocks if b.attach is not None and b.attach.block == block
                and b.attach.loop == loop and (position is None or b.attach.position == position)]

    def attached_to(self, block: str) -> list[Block]:
        """Blocks hanging anywhere in ``block``'s loop chain."""
        return [b for b in self.blocks if b.attach is not None and b.attach.block == block]

    def enclosing_loops(self, block: Block) -> list[tuple[Block, Loop]]:
        """Loops of other blocks that surround ``block``, outermost first."""
        out: list[tuple[Block, Loop]] = []
        cur = block
        while cur.attach is not None:
            host = self.block(cur.attach.block)
            idx = host.loop_index(cur.attach.loop)
            out = [(host, lp) for lp in host.loops[: idx + 1]] + out
            cur = host
        return out

    def all_loops(self, block: Block) -> list[Loop]:
        """Every loop around the block's statement: enclosing ones, then its own."""
        return [lp for _, lp in self.enclosing_loops(block)] + list(block.loops)

    def subtree(self, block: str, loop_index: int) -> list[Block]:
        """Blocks executed inside loop ``loop_index`` of ``block``: itself plus all nested attachments."""
        host = self.block(block)
        inner = {lp.name for lp in host.loops[loop_index:]}
        out = [host]
        for b in self.blocks:
            if b.attach is not None and b.attach.block == block and b.attach.loop in inner:
                out.extend(x for x in self.subtree(b.name, 0) if x not in out)
        return out

    def root_of(self, block: Block) -> Block:
        """The outermost block of ``block``'s kernel (itself when it is attached nowhere)."""
        while block.attach is not None:
            block = self.block(block.attach.block)
        return block

    def root_blocks(self) -> list[Block]:
        return [b for b in self.blocks if b.attach is None]

    # rebuilding -------------------------------------------------------------------------------
    def with_block(self, block: Block) -> Func:
        return replace(self, blocks=tuple(block if b.name == block.name else b for b in self.blocks), _index={})

    def with_buffer(self, buf: Buffer) -> Func:
        return replace(self, buffers=tuple(buf if b.name == buf.name else b for b in self.buffers), _index={})

    def map_exprs(self, fn: Callable[[Expr], Expr]) -> Func:
        return replace(self, blocks=tuple(b.map_exprs(fn) for b in self.blocks), _index={})

    def substitute_loops(self, mapping: dict[str, Expr]) -> Func:
        """Replace loop variables everywhere (used by split and fuse)."""
        return self.map_exprs(lambda e: substitute(e, mapping))

    def fresh_name(self, base: str, taken: set[str] | None = None) -> str:
        used = taken if taken is not None else (
            {b.name for b in self.blocks} | {b.name for b in self.buffers} | self.all_loop_names())
        if base not in used:
            return base
        n = 1
        while f"{base}_{n}" in used:
            n += 1
        return f"{base}_{n}"

    def fresh_axis_name(self, base: str) -> str:
        """A name for an axis a primitive creates: never a symbolic size's (codegen substitutes sizes by name,
        so an axis ``ax1`` beside a size ``ax1`` would index with the loop variable in place of the size)."""
        return self.fresh_name(base, set(self.symbols))

    def __str__(self) -> str:
        from schedlib.ir.printer import func_str

        return func_str(self)

    def iter_blocks(self) -> Iterator[Block]:
        return iter(self.blocks)


def require_func(value: Any, caller: str) -> Func:
    """``value`` if it is a Func, else the TypeError every entry point gives (rules, carver, search)."""
    if not isinstance(value, Func):
        raise TypeError(f"{caller}: expected a Func (from sl.func or sl.workloads), got {type(value).__name__} "
                        f"{value!r:.60}")
    return value


def make_func(tensors: list[Any], name: str = "main") -> Func:
    """Collect the stages between the given inputs (placeholders) and outputs (computes) into a Func."""
    from schedlib.ir.names import check_name
    from schedlib.ir.tensor import AxisVar, Tensor, identity

    if isinstance(tensors, Tensor):
        raise IRError(f"sl.func: got the single tensor {tensors.name}; pass a list of tensors, "
                      f"e.g. sl.func([inputs..., {tensors.name}])")
    try:
        tensors = list(tensors)
    except TypeError:
        raise IRError(f"sl.func: tensors={tensors!r} must be a list of tensors") from None
    check_name("sl.func", "name", name)
    if not tensors:
        raise IRError("sl.func needs at least one output tensor")
    for t in tensors:
        if not isinstance(t, Tensor):
            raise IRError(f"sl.func: {t!r} is not a tensor")
    given_inputs = [t for t in tensors if t.is_placeholder]
    outputs = [t for t in tensors if not t.is_placeholder]
    if not outputs:
        raise IRError("sl.func: no compute tensor among the arguments; pass the outputs too")

    order: list[Tensor] = []
    seen: dict[str, Tensor] = {}

    def visit(t: Tensor) -> None:
        if t.name in seen:
            if seen[t.name] is not t:
                raise IRError(f"sl.func: two different tensors are named {t.name!r}")
            return
        seen[t.name] = t
        if not t.is_placeholder:
            for ld in loads(t.body):
                if ld.tensor is None:
                    raise IRError(f"stage {t.name} reads {ld.buffer}, which is not a tensor")
                visit(ld.tensor)
        order.append(t)

    for t in outputs:
        visit(t)
    placeholders = [t for t in order if t.is_placeholder]
    for p in placeholders:
        if p not in given_inputs:
            raise IRError(f"sl.func: stage reads placeholder {p.name}, which is not among the arguments")
    for group in (given_inputs, outputs):
        names = [t.name for t in group]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise IRError(f"sl.func: {', '.join(twice)} listed more than once; list each tensor once")
    unread = [t.name for t in given_inputs if t not in placeholders]
    if unread:
        raise IRError(f"sl.func: input {', '.join(unread)} is read by no stage of the outputs; leave it out")

    symbols: list[str] = []
    for t in order:
        for d in t.shape:
            for v in sorted(free_vars(d)):
                if v not in symbols:
                    symbols.append(v)
    buffers: list[Buffer] = []
    blocks: list[Block] = []
    for t in order:
        buffers.append(Buffer(t.name, t.shape, t.dtype))
        if t.is_placeholder:
            continue
        body = t.body
        reducer, init, raxes = None, None, ()
        from schedlib.ir.expr import Reduce

        if isinstance(body, Reduce):
            reducer, raxes = body.op, body.axes
            init = identity(body.op, body.dtype)
            body = body.source
        declared = [a.name for a in (*t.axes, *raxes)]
        if len(set(declared)) != len(declared):
            raise IRError(f"stage {t.name}: axis names {declared} repeat")
        # An axis named like a dimension (``i`` in a matmul of M = sl.var("i")) is renamed: axis names are the
        # stage's own, a dimension's name is the user's.
        renamed = _unclash(declared, set(symbols))
        axes = ([Axis(renamed[a.name], a.extent, "S") for a in t.axes]
                + [Axis(renamed[a.name], a.extent, "R") for a in raxes])
        names = [a.name for a in axes]
        # Plain Vars in the IR: AxisVar carries front-end metadata only.
        strip = {old: Var(new) for old, new in renamed.items()}

        def to_ir(e: Expr, strip: dict[str, Var] = strip, stage: str = t.name) -> Expr:
            if isinstance(e, AxisVar):
                if e.name not in strip:
                    raise IRError(f"stage {stage} uses axis {e.name} that is not one of its axes")
                return strip[e.name]
            if isinstance(e, Load):
                return Load(e.buffer, tuple(to_ir(i) for i in e.indices), e.dtype)
            return map_children(e, to_ir)

        value = to_ir(body)
        loops = tuple(Loop(f"{t.name}.{a.name}", a.extent) for a in axes)
        value_vars = free_vars(value) - set(names)
        for v in value_vars:
            if v not in symbols:
                raise IRError(f"stage {t.name} uses variable {v} that is neither an axis nor a dimension")
        blocks.append(Block(
            name=t.name,
            axes=tuple(axes),
            bindings=tuple(lp.var for lp in loops),
            loops=loops,
            store=t.name,
            store_indices=tuple(Var(renamed[a.name]) for a in t.axes),
            value=value,
            reducer=reducer,
            init=init,
        ))
    return Func(name, tuple(p.name for p in given_inputs), tuple(t.name for t in outputs), tuple(buffers),
                tuple(blocks), tuple(symbols))


def _unclash(names: list[str], taken: set[str]) -> dict[str, str]:
    """Each axis name, or ``name_1``, ``name_2``, ... where it is a dimension's name."""
    out: dict[str, str] = {}
    used = taken | set(names)
    for n in names:
        if n not in taken:
            out[n] = n
            continue
        k = 1
        while f"{n}_{k}" in used:
            k += 1
        out[n] = f"{n}_{k}"
        used.add(out[n])
    return out


def const_extent(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Const) else None
