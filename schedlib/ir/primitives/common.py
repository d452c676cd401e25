"""Argument checks shared by the schedule primitives, and the post-primitive normalisation.

Checks raise :class:`ScheduleError` naming the primitive, the argument and the value; since primitives
are pure functions of a frozen Func, raising is all it takes to leave the schedule untouched.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NoReturn

from schedlib.errors import ScheduleError
from schedlib.ir.expr import Const, Expr
from schedlib.ir.func import Block, Func
from schedlib.ir.simplify import bounds, conjunction, conjuncts, simplify, var_ranges


def fail(primitive: str, argument: str, value: Any, reason: str) -> NoReturn:
    raise ScheduleError(primitive, argument, value, reason)


def get_block(func: Func, primitive: str, name: Any, argument: str = "block") -> Block:
    if not isinstance(name, str):
        fail(primitive, argument, name, "must be a block name (str)")
    if not func.has_block(name):
        known = ", ".join(b.name for b in func.blocks)
        fail(primitive, argument, name, f"no such block; blocks are: {known}")
    return func.block(name)


def get_loop(func: Func, primitive: str, name: Any, argument: str = "loop") -> tuple[Block, int]:
    if not isinstance(name, str):
        fail(primitive, argument, name, "must be a loop name (str), as returned by get_loops")
    try:
        return func.loop_owner(name)
    except KeyError:
        if func.has_block(name):
            fail(primitive, argument, name, "is a block, not a loop; use get_loops(block)")
        fail(primitive, argument, name, "no such loop")


def check_positive_int(primitive: str, argument: str, value: Any, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail(primitive, argument, value, "must be a positive integer")
    if upper is not None and value > upper:
        fail(primitive, argument, value, f"must be at most {upper}")
    return value


def loop_ranges(func: Func, block: Block) -> dict[str, tuple[int, int]]:
    """Constant ranges of every loop variable around ``block``."""
    return var_ranges({lp.name: lp.extent for lp in func.all_loops(block)})


def bound_guard(binding: Expr, extent: Expr, ranges: dict[str, tuple[int, int]]) -> list[Expr]:
    """Guards keeping ``binding`` inside ``[0, extent)``, minus those that provably hold."""
    guards: list[Expr] = []
    b = bounds(binding, ranges)
    if b is None or b[0] < 0:
        guards.append(binding >= 0)
    guards.append(binding < extent)
    return guards


def normalize(func: Func) -> Func:
    """Simplify every block's bindings, indices and predicate under its loops' ranges."""
    blocks = []
    for blk in func.blocks:
        rng = loop_ranges(func, blk)
        parts = [simplify(p, rng) for p in conjuncts(blk.predicate)]
        if any(isinstance(p, Const) and p.value is False for p in parts):
            pred: Expr | None = Const(False, "bool")
        else:
            pred = conjunction(parts)
        blocks.append(replace(
            blk,
            bindings=tuple(simplify(b, rng) for b in blk.bindings),
            store_indices=tuple(simplify(i, rng) for i in blk.store_indices),
            value=simplify(blk.value, rng),
            predicate=pred,
        ))
    return replace(func, blocks=tuple(blocks), _index={})


def short(loop_name: str) -> str:
    """Loop name without its block prefix: ``C.i_0`` -> ``i_0``."""
    return loop_name.split(".", 1)[1] if "." in loop_name else loop_name


def fresh_loop(func: Func, block: str, base: str, taken: set[str]) -> str:
    name = func.fresh_name(f"{block}.{base}", taken)
    taken.add(name)
    return name


def execution_order(func: Func) -> list[str]:
    """Block names in the order their statements first run: a walk of the loop tree."""
    order: list[str] = []

    def visit(block: Block) -> None:
        for lp in block.loops:
            for b in func.attached_at(block.name, lp.name, "before"):
                visit(b)
        order.append(block.name)
        for lp in reversed(block.loops):
            for b in func.attached_at(block.name, lp.name, "after"):
                visit(b)

    for b in func.root_blocks():
        visit(b)
    return order


def check_dependencies(func: Func, primitive: str, argument: str, value: Any) -> None:
    """Fail if some block would run before a producer of a buffer it reads."""
    position = {name: i for i, name in enumerate(execution_order(func))}
    for blk in func.blocks:
        for buf in blk.read_buffers:
            for prod in func.producers(buf):
                if prod.name != blk.name and position[prod.name] > position[blk.name]:
                    fail(primitive, argument, value,
                         f"block {blk.name} would run before {prod.name}, which produces {buf}")


def check_single_producer(func: Func, prim: str, blk: Block) -> None:
    """A block sharing its buffer with another producer (a reduction and its decomposed init) cannot move or
    vanish on its own: the other producer would then run at the wrong time or write a removed buffer."""
    others = [b.name for b in func.producers(blk.store) if b.name != blk.name]
    if others:
        fail(prim, "block", blk.name, f"{blk.store} is also written by {', '.join(others)}; "
             "schedule it before decompose_reduction")
