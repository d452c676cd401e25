"""What a func asks of the memory system, in terms of the main block's axes: the carver's view of a func.

The model is generic over rules, so it reads the access pattern off the IR instead of off a rule: every
load of a func input and every store of a func output, in *any* block, becomes an :class:`Access` whose
index dimensions are expressed in the axes of the rule's main block.  A CUDA block that covers
``tile[a]`` of each main axis ``a`` then touches ``prod over dims of (extent of that dim)`` elements of
the access: that is the per-block footprint the brief asks for, and it extends to fused epilogues and
multi-stage funcs (softmax) without a rule having to describe them.

Axes of other blocks are tied to main axes through the data flow (a consumer's index at dimension ``d`` of
a produced buffer is the producer's axis stored at ``d``; two loads of one input at the same dimension
are the same axis), with a union-find.  Intermediate buffers are assumed to stay on chip (the rules fuse
epilogues and multi-stage reductions into one kernel); only func inputs and outputs cost global traffic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Binary, Call, Cast, Expr, Load, Select, Var
from schedlib.ir.func import Block, Func
from schedlib.ir.reference import evaluate_int
from schedlib.ir.simplify import children, free_vars
from schedlib.rules.analysis import operand_stages

DEFAULT_SYMBOLIC_VALUE = 4096  # what a symbolic dimension is ranked at unless told otherwise
_ARITH = ("+", "-", "*", "/", "min", "max")


@dataclass(frozen=True)
class Term:
    """One variable of an index expression: a main-block axis, or (``axis`` None) a fixed extent."""

    axis: str | None
    extent: int


@dataclass(frozen=True)
class Dim:
    """One index dimension of an access: its terms (an index ``i + r`` has two) and the buffer extent."""

    terms: tuple[Term, ...]
    size: int

    def extent(self, tile: Mapping[str, float]) -> float:
        """Elements of this dimension one tile touches: a window ``sum(term extents) - (terms - 1)``
        (exact for unit-stride affine indices such as ``i + r``), at least 1, at most the dimension."""
        terms = self.terms
        if len(terms) == 1:  # the common plain index: a fast path, the model calls this a lot
            t = terms[0]
            v = tile[t.axis] if t.axis is not None else t.extent
            return v if v < self.size else self.size
        if not terms:
            return 1.0
        total = sum(tile[t.axis] if t.axis is not None else t.extent for t in terms)
        return max(1.0, min(float(self.size), total - (len(terms) - 1)))


@dataclass(frozen=True)
class Access:
    """A load of a func input or a store of a func output, indexed in main-block axes."""

    buffer: str
    nbytes: int  # element size
    dims: tuple[Dim, ...]
    store: bool
    axes: frozenset[str] = field(init=False)  # main axes indexing it
    sizes: tuple[int, ...] = field(init=False)  # buffer extents
    single: tuple[bool, ...] = field(init=False)  # per dimension: indexed by exactly one main axis

    def __post_init__(self) -> None:  # derived once: the model reads them for every candidate
        object.__setattr__(self, "axes", frozenset(t.axis for d in self.dims for t in d.terms
                                                   if t.axis is not None))
        object.__setattr__(self, "sizes", tuple(d.size for d in self.dims))
        object.__setattr__(self, "single", tuple(len(d.terms) == 1 and d.terms[0].axis is not None
                                                 for d in self.dims))

    @property
    def size(self) -> int:
        """Elements of the whole buffer."""
        return math.prod(self.sizes)


@dataclass(frozen=True)
class Work:
    """Arithmetic of one block per iteration point, with its axes in main-block terms."""

    block: str
    terms: tuple[Term, ...]  # one per block axis
    flops: int  # floating-point (or integer) operations per point, a multiply-add counting 2
    instructions: int  # issue slots per point: a multiply feeding an add fuses into one FMA
    main: bool
    kinds: str = ""  # the block's axis kinds, e.g. "SSR"
    reduces: bool = False  # a reduction block (its threads may combine partial results)
    reads_input: bool = False  # loads a func input (each of its loop steps waits on global memory)


@dataclass(frozen=True)
class Problem:
    """A func seen from its main block: extents, accesses and arithmetic, with symbols bound."""

    func_name: str
    main: str
    axes: tuple[str, ...]  # main block axes, in order
    kinds: Mapping[str, str]  # axis -> "S" | "R"
    extents: Mapping[str, int]
    symbolic_axes: frozenset[str]  # main axes whose extent depends on a symbolic dimension
    loads: tuple[Access, ...]
    stores: tuple[Access, ...]
    work: tuple[Work, ...]
    in_dtype: str  # dtype of the main block's operands (what tensor cores would read)
    acc_dtype: str  # dtype the main block computes in (what SIMT units run)
    symbols: Mapping[str, int]

    @property
    def spatial(self) -> tuple[str, ...]:
        return tuple(a for a in self.axes if self.kinds[a] == "S")

    @property
    def reduce(self) -> tuple[str, ...]:
        return tuple(a for a in self.axes if self.kinds[a] == "R")

    @functools.cached_property
    def compulsory_bytes(self) -> int:
        """Every input read once and every output written once: the least DRAM traffic possible.  A buffer
        read twice (``X @ X.T``) is still read from DRAM once."""
        loads = {a.buffer: a for a in self.loads}.values()
        return sum(a.size * a.nbytes for a in (*loads, *self.stores))

    @functools.cached_property
    def useful_flops(self) -> float:
        """Operations the func needs (a multiply-add counts 2), without any padding."""
        return float(sum(w.flops * self.points(w) for w in self.work))

    def points(self, w: Work) -> int:
        """Iteration points of one block of the func."""
        return math.prod(t.extent if t.axis is None else self.extents[t.axis] for t in w.terms)

    @functools.cached_property
    def load_shape(self) -> tuple[tuple[Access, tuple[str, ...], bool], ...]:
        """Per load: the spatial main axes indexing it and whether a reduce axis does."""
        return tuple((a, tuple(x for x in a.axes if self.kinds[x] == "S"),
                      any(self.kinds[x] == "R" for x in a.axes)) for a in self.loads)

    def symbolic_label(self) -> str:
        """``"M=4096"``-style text naming the value each symbolic dimension was ranked at."""
        return ", ".join(f"{k}={v}" for k, v in sorted(self.symbols.items()))


def bind_symbolic(func: Func, symbolic_value: int | Mapping[str, int] | None) -> dict[str, int]:
    """Values for the func's symbolic dimensions: one representative int for all, or a per-name map
    (missing names get :data:`DEFAULT_SYMBOLIC_VALUE`)."""
    if symbolic_value is None:
        return dict.fromkeys(func.symbols, DEFAULT_SYMBOLIC_VALUE)
    if isinstance(symbolic_value, Mapping):
        unknown = set(symbolic_value) - set(func.symbols)
        if unknown:
            raise ValueError(f"symbolic_value names {sorted(unknown)}, but {func.name} has symbols "
                             f"{list(func.symbols)}")
        values = {s: _size(symbolic_value.get(s, DEFAULT_SYMBOLIC_VALUE), s) for s in func.symbols}
    else:
        values = dict.fromkeys(func.symbols, _size(symbolic_value, "all symbols"))
    bad = {k: v for k, v in values.items() if v < 1}
    if bad:
        raise ValueError(f"symbolic values must be positive, got {bad}")
    return values


def _size(value: Any, what: str) -> int:
    # 1.7 or True would be truncated to 1 without a word: only ints stand for a dimension
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"symbolic_value for {what} must be an int, got {value!r}")
    return int(value)


def _count_ops(e: Expr) -> tuple[int, int]:
    """(operations, fused multiply-adds) in a value expression, skipping index arithmetic."""
    if isinstance(e, Load):
        return 0, 0
    ops = fused = 0
    if isinstance(e, Binary) and e.op in _ARITH:
        ops = 1
        if e.op in ("+", "-") and any(_is_mul(x) for x in (e.a, e.b)):
            fused = 1
    elif isinstance(e, (Call, Select)):
        ops = 1
    for c in children(e):
        o, f = _count_ops(c)
        ops, fused = ops + o, fused + f
    return ops, fused


def _is_mul(e: Expr) -> bool:
    while isinstance(e, Cast):
        e = e.value
    return isinstance(e, Binary) and e.op == "*"


def _block_work(block: Block, terms: tuple[Term, ...], main: bool, reads: bool) -> Work:
    ops, fused = _count_ops(block.value)
    if block.reducer is not None:
        ops += 1
        if block.reducer == "sum" and _is_mul(block.value):
            fused += 1
    return Work(block.name, terms, max(ops, 1), max(ops - fused, 1), main, block.kinds,
                block.reducer is not None, reads)


def _prologue(func: Func, main: Block) -> set[str]:
    """The element-wise stages that compute ``main``'s operands and that only ``main`` (through each other)
    reads (:func:`~schedlib.rules.analysis.operand_stages`, as the rules decide it): the rules compute them
    where ``main`` reads its operands (inlined, or in the copy into shared memory), so their global reads are
    ``main``'s loop steps, not steps of their own."""
    found = operand_stages(func, main, main.read_buffers)
    if isinstance(found, str):  # not all of them: each operand's own stages, where those qualify alone
        found = tuple(name for buffer in main.read_buffers
                      for name in _as_tuple(operand_stages(func, main, [buffer])))
    return set(found)


def _as_tuple(found: tuple[str, ...] | str) -> tuple[str, ...]:
    return () if isinstance(found, str) else found


def _waits_on_inputs(func: Func, main: Block) -> dict[str, bool]:
    """Per block, whether its loop steps wait on global inputs: its own reads of func inputs, except that a
    prologue stage's reads (:func:`_prologue`) are waited on by ``main``."""
    stages = _prologue(func, main)
    direct = {b.name: any(ld.buffer in func.inputs for ld in _walk_loads(b.value)) for b in func.blocks}
    waits = {name: reads and name not in stages for name, reads in direct.items()}
    waits[main.name] = direct[main.name] or any(direct[name] for name in stages)
    return waits


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, x: Any) -> Any:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: Any, b: Any) -> None:
        self.parent[self.find(a)] = self.find(b)


def _axis_map(func: Func, main: Block, extents: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], str]:
    """(block, axis) -> main axis, for every block axis the data flow ties to one."""
    uf = _UnionFind()
    producer = {b.store: b for b in func.blocks}
    first_use: dict[tuple[str, int], tuple[str, str]] = {}
    for b in func.blocks:
        names = {a.name for a in b.axes}
        for ld in (n for n in _walk_loads(b.value)):
            for d, idx in enumerate(ld.indices):
                if not (isinstance(idx, Var) and idx.name in names):
                    continue
                here = (b.name, idx.name)
                p = producer.get(ld.buffer)
                if p is not None and d < len(p.store_indices):
                    s = p.store_indices[d]
                    if isinstance(s, Var) and s.name in {a.name for a in p.axes}:
                        uf.union(here, (p.name, s.name))
                if ld.buffer in func.inputs:
                    other = first_use.setdefault((ld.buffer, d), here)
                    if other != here:
                        uf.union(here, other)
    classes: dict[Any, list[str]] = {}
    for a in main.axes:
        classes.setdefault(uf.find((main.name, a.name)), []).append(a.name)
    out: dict[tuple[str, str], str] = {}
    for b in func.blocks:
        for a in b.axes:
            key = (b.name, a.name)
            if b.name == main.name:
                out[key] = a.name
                continue
            cands = classes.get(uf.find(key), [])
            same_extent = [m for m in cands if extents[(main.name, m)] == extents[key]]
            pick = next((m for m in same_extent if m == a.name), None) or (same_extent or cands or [None])[0]
            if pick is None:  # no data-flow tie: a main axis of the same name and extent, if any
                pick = next((m.name for m in main.axes if m.name == a.name
                             and extents[(main.name, m.name)] == extents[key]), None)
            if pick is not None:
                out[key] = pick
    return out


def _walk_loads(e: Expr) -> list[Load]:
    out: list[Load] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Load):
            out.append(x)
        stack.extend(children(x))
    return out


def analyze(func: Func, main_block: str, symbols: Mapping[str, int]) -> Problem:
    """The :class:`Problem` of ``func`` around ``main_block`` with symbolic dimensions bound to ``symbols``."""
    main = func.block(main_block)
    env = dict(symbols)
    extents = {(b.name, a.name): evaluate_int(a.extent, env) for b in func.blocks for a in b.axes}
    amap = _axis_map(func, main, extents)

    def term(block: Block, var: str) -> Term:
        axis = amap.get((block.name, var))
        return Term(axis, extents[(block.name, var)])

    def dims(block: Block, buffer: str, indices: tuple[Expr, ...]) -> tuple[Dim, ...]:
        shape = [evaluate_int(s, env) for s in func.buffer(buffer).shape]
        names = {a.name for a in block.axes}
        return tuple(Dim(tuple(term(block, v) for v in sorted(free_vars(idx) & names)), size)
                     for idx, size in zip(indices, shape))

    loads: dict[tuple[str, tuple[Dim, ...]], Access] = {}
    stores: list[Access] = []
    work: list[Work] = []
    waits = _waits_on_inputs(func, main)
    for b in func.blocks:
        for ld in _walk_loads(b.value):
            if ld.buffer in func.inputs:
                nbytes = BYTES[func.buffer(ld.buffer).dtype]
                acc = Access(ld.buffer, nbytes, dims(b, ld.buffer, ld.indices), False)
                loads.setdefault((acc.buffer, acc.dims), acc)
        if b.store in func.outputs:
            stores.append(Access(b.store, BYTES[func.buffer(b.store).dtype],
                                 dims(b, b.store, b.store_indices), True))
        work.append(_block_work(b, tuple(term(b, a.name) for a in b.axes), b.name == main.name, waits[b.name]))
    main_inputs = [ld for ld in _walk_loads(main.value) if ld.buffer in func.inputs]
    acc_dtype = func.buffer(main.store).dtype
    in_dtype = func.buffer(main_inputs[0].buffer).dtype if main_inputs else acc_dtype
    symbolic = frozenset(a.name for a in main.axes if free_vars(a.extent) & set(func.symbols))
    return Problem(
        func_name=func.name, main=main.name, axes=tuple(a.name for a in main.axes),
        kinds={a.name: a.kind for a in main.axes}, extents={a.name: extents[(main.name, a.name)] for a in main.axes},
        symbolic_axes=symbolic, loads=tuple(loads.values()), stores=tuple(stores), work=tuple(work),
        in_dtype=in_dtype, acc_dtype=acc_dtype,
        symbols=dict(symbols),
    )  # fmt: skip
