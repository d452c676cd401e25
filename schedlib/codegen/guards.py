"""The checks a statement runs under; mixed into the kernel writer.

Two kinds: the block's predicate (its points inside the iteration domain), less what a loop version has
checked already (:mod:`schedlib.codegen.loop_versioning`) and what speculative accumulation leaves out
(:mod:`schedlib.codegen.speculation`); and the once-guards that keep a store to memory shared between threads
from running in every thread of a loop the store does not depend on.
"""

from __future__ import annotations

from typing import Any

from schedlib.codegen.speculation import speculated_guards
from schedlib.ir.expr import Expr
from schedlib.ir.func import THREAD_INDEX_TAGS, Block
from schedlib.ir.simplify import conjuncts, free_vars, is_true, simplify, substitute


class StatementGuards:
    func: Any
    threads: dict[str, int]
    bindings: dict[str, Expr]
    ranges: dict[str, tuple[int, int]]
    needed_guards: dict[str, list[Expr]]  # per block: its checks in loop terms, less the speculated ones
    _without_assumed: Any  # the loop-versioning mixin's: an expression less the checks its version made

    def _guards(self, block: Block) -> list[Expr]:
        """``block``'s predicate in loop terms (after ``_enter(block)``), without the parts that hold here or
        need no check.  The speculation proof runs once per block; the loop version is applied per call."""
        if block.name not in self.needed_guards:
            guards = [g for g in (simplify(substitute(p, self.bindings), self.ranges)
                                  for p in conjuncts(block.predicate)) if not is_true(g)]
            dropped = speculated_guards(self.func, block, self.bindings, self.ranges, guards)
            self.needed_guards[block.name] = [g for g in guards if g not in dropped]
        return [g for g in map(self._without_assumed, self.needed_guards[block.name]) if not is_true(g)]

    def _once_guards(self, block: Block, ctx: Any, skip: str | None = None) -> list[str]:
        """Conditions making a store to shared/global memory happen once instead of in every thread."""
        if self.func.buffer(block.store).scope == "local":
            return []
        own = {lp.thread for lp in block.loops if lp.thread}
        # An update that accumulates into memory (a reduction whose init was decomposed: ``+=``) inside an
        # enclosing thread loop its axes do not depend on is the same update in every thread of that loop:
        # done by each, it would count n times.
        accumulates = block.reducer is not None and block.init is None
        used = {v for b in block.bindings for v in free_vars(b)}
        replicated = {tag for tag, loop in ctx.bound.items() if accumulates and loop not in used}
        return [f"{tag} == 0" for tag in THREAD_INDEX_TAGS
                if self.threads[tag] > 1 and (tag not in ctx.bound or tag in replicated) and tag not in own
                and tag != skip]
