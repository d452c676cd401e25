"""The loop walk of the numpy reference executor (:mod:`schedlib.ir.reference`).

A block's loops that carry attached blocks are walked one iteration at a time (a shared tile must be refilled
before the loop body reads it); below the last attachment every remaining loop is evaluated at once as a
numpy grid.

Walked one at a time, a rule's schedule costs a grid evaluation per CUDA thread and k step: a 256^3 SIMT
matmul, whose register tile hangs under the thread loops, took about a minute.  So a loop bound to
``blockIdx``/``threadIdx`` is walked *side by side* where its iterations cannot see one another: each
iteration becomes an *instance*, every shared or local buffer gets a copy per instance (a leading axis), and
each grid below evaluates all instances at once.  Instances are numbered in loop order, so a grid's points
keep the order the one-at-a-time walk gives them.  A loop is walked side by side only when that changes no
value:

* no shared or local buffer written inside it is read outside it (each instance's copy is dropped at the
  end; the schedule primitives place a producer so that each iteration writes what it reads);
* for a loop over threads, no shared or local buffer inside it is stored at places that move with the loop
  (threads filling one tile between them, which each then reads whole: there the iterations meet); CUDA
  blocks share no such buffer, so each block's copy holds all the block reads;
* no global buffer written inside it is also read inside it (an instance would see another's write at
  another time than in loop order);
* no global reduction inside it, except the loop's own block reducing along a spatial loop (instances then
  add into distinct elements, each in its own order);
* no loop extent inside it depends on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schedlib.ir.dtype import round_to_dtype
from schedlib.ir.expr import Expr
from schedlib.ir.func import Block, Func, Loop
from schedlib.ir.reference_eval import INSTANCE, Evaluator, accumulate_rounded, evaluate_int
from schedlib.ir.simplify import free_vars, loads, simplify, substitute

CHUNK = 1 << 20  # iteration points evaluated at once
MAX_INSTANCES = 1 << 12  # CUDA threads or blocks walked side by side
MAX_PRIVATE_ELEMENTS = 1 << 23  # shared and local elements held for all of them


@dataclass(frozen=True)
class Batch:
    """The instances walked side by side: each batched loop's value per instance, and INSTANCE."""

    size: int
    values: dict[str, np.ndarray]

    def widen(self, loop: str, values: np.ndarray) -> Batch:
        """Each instance once per value of ``loop`` (the new loop innermost, as in the walk's order)."""
        n = len(values)
        grown = {k: np.repeat(v, n) for k, v in self.values.items() if k != INSTANCE}
        grown[loop] = np.tile(values, self.size)
        grown[INSTANCE] = np.arange(self.size * n, dtype=np.int64)
        return Batch(self.size * n, grown)


SINGLE = Batch(1, {INSTANCE: np.zeros(1, dtype=np.int64)})


def _exprs(block: Block) -> list[Expr]:
    extra = [e for e in (block.init, block.predicate) if e is not None]
    return [block.value, *block.bindings, *block.store_indices, *extra]


def _reads(block: Block) -> set[str]:
    """Every buffer ``block`` loads, in its guard and indices too (``Block.read_buffers`` covers its value only,
    and a buffer read only by a guard still ties the iterations together)."""
    return {ld.buffer for e in _exprs(block) for ld in loads(e)}


class Runner:
    def __init__(self, func: Func, buffers: dict[str, np.ndarray], private: set[str]) -> None:
        """``buffers``: every buffer, the ``private`` (shared and local) ones with an instance axis of 1."""
        self.func = func
        self.buffers = buffers
        self.private = private
        self.private_elements = sum(buffers[n][0].size for n in private)
        attach_loops: dict[str, set[str]] = {}
        for b in func.blocks:
            if b.attach is not None:
                attach_loops.setdefault(b.attach.block, set()).add(b.attach.loop)
        self.attach_loops = attach_loops
        self._independent: dict[tuple[str, int], bool] = {}

    def _sequential_from(self, block: Block) -> int:
        """Index just past the innermost loop of ``block`` that carries attachments."""
        names = self.attach_loops.get(block.name, set())
        last = -1
        for i, lp in enumerate(block.loops):
            if lp.name in names:
                last = i
        return last + 1

    def chain(self, block: Block, level: int, env: dict[str, Any], batch: Batch = SINGLE) -> None:
        loops = block.loops
        if level < self._sequential_from(block):
            lp = loops[level]
            extent = evaluate_int(lp.extent, env)
            width = self._width(block, level, extent, batch)
            for start in range(0, extent, width):
                if width == 1:
                    self._iteration(block, level, {**env, lp.name: start}, batch)
                    continue
                saved = {n: self.buffers[n] for n in self.private}
                values = np.arange(start, min(extent, start + width), dtype=np.int64)
                self.buffers.update({n: np.repeat(a, len(values), axis=0) for n, a in saved.items()})
                self._iteration(block, level, env, batch.widen(lp.name, values))
                self.buffers.update(saved)  # nothing outside the loop reads what its instances wrote there
            return
        rest = loops[level:]
        extents = [evaluate_int(lp.extent, env) for lp in rest]
        if rest and math.prod(extents) * batch.size > CHUNK and (len(rest) > 1 or batch.size > 1):
            p = self._split_at(block, rest)
            for v in range(extents[p]):
                self._grid(block, rest[:p] + rest[p + 1:], extents[:p] + extents[p + 1:], {**env, rest[p].name: v},
                           batch)
            return
        self._grid(block, rest, extents, env, batch)

    def _iteration(self, block: Block, level: int, env: dict[str, Any], batch: Batch) -> None:
        name = block.loops[level].name
        for b in self.func.attached_at(block.name, name, "before"):
            self.chain(b, 0, env, batch)
        self.chain(block, level + 1, env, batch)
        for b in self.func.attached_at(block.name, name, "after"):
            self.chain(b, 0, env, batch)

    def _width(self, block: Block, level: int, extent: int, batch: Batch) -> int:
        """How many iterations of loop ``level`` to walk side by side (1: one at a time)."""
        if block.loops[level].thread is None or extent < 2:
            return 1
        key = (block.name, level)
        if key not in self._independent:
            self._independent[key] = self._iterations_independent(block, level)
        if not self._independent[key]:
            return 1
        fit = MAX_PRIVATE_ELEMENTS // max(1, batch.size * self.private_elements)
        return max(1, min(extent, MAX_INSTANCES // batch.size, fit))

    def _iterations_independent(self, block: Block, level: int) -> bool:
        """Whether loop ``level`` of ``block`` may be walked side by side (the conditions in the module docstring)."""
        loop = block.loops[level]
        inside = self.func.subtree(block.name, level)
        names = {b.name for b in inside}
        written = {b.store for b in inside}
        read_inside = set().union(*(_reads(b) for b in inside))
        read_outside = set().union(*(_reads(b) for b in self.func.blocks if b.name not in names))
        if written & self.private & read_outside:
            return False
        # CUDA blocks never share a shared or local buffer; the threads of one block do (a block-wide tile)
        if (loop.thread or "").startswith("threadIdx") and any(
                self._stores_apart(b, loop.name) for b in inside if b.store in self.private):
            return False
        if (written - self.private) & read_inside:
            return False
        for b in inside:
            if b.reducer is not None and b.store not in self.private \
                    and not (b.name == block.name and block.loop_kind(loop.name) == "S"):
                return False
        own = block.loops[level + 1:]
        others: Sequence[Loop] = [lp for b in inside if b.name != block.name for lp in b.loops]
        return not any(loop.name in free_vars(lp.extent) for lp in (*own, *others))

    @staticmethod
    def _stores_apart(block: Block, loop: str) -> bool:
        """Whether ``block`` stores at places that move with ``loop``: a shared tile the threads of ``loop`` fill
        row by row, which the rest of the subtree reads whole.  The iterations then meet in it (the one-at-a-time
        walk leaves each one's rows for the next), so they cannot run as instances with a copy each.  A buffer
        compacted under ``loop`` (a register tile, a cooperative copy) is stored at the same places by each."""
        axes = dict(zip((a.name for a in block.axes), block.bindings))
        return any(loop in free_vars(simplify(substitute(ix, axes))) for ix in block.store_indices)

    def _split_at(self, block: Block, loops: Sequence[Loop]) -> int:
        """Which of ``loops`` a grid too large to evaluate at once is cut along: the first, except for an fp16/bf16
        sum, which rounds at every step and so adds its terms one step at a time (vectorised over the elements
        a chunk holds): it is cut along its first reducing loop when only spatial loops come before, so each
        chunk holds many elements and one step of each, and each element still takes its terms in order."""
        if block.reducer == "sum" and self.func.buffer(block.store).dtype in ("float16", "bfloat16"):
            kinds = [block.loop_kind(lp.name) for lp in loops]
            first = next((p for p, kind in enumerate(kinds) if kind != "S"), 0)
            if kinds[first] == "R":
                return first
        return 0

    def _grid(self, block: Block, loops: Sequence[Loop], extents: list[int], env: dict[str, Any],
              batch: Batch) -> None:
        if any(e <= 0 for e in extents):
            return
        shape = (batch.size, *extents)
        # Values stay at their broadcastable shapes (a load of A[i, k] is not computed once per j); where a guard
        # drops points, every grid-shaped value is cut to the points kept, in the grid's (the walk's) order.
        full = dict(env)
        for name, values in batch.values.items():
            full[name] = values.reshape((batch.size,) + (1,) * len(extents))
        for k, (lp, ext) in enumerate(zip(loops, extents)):
            view = [1] * len(shape)
            view[k + 1] = ext
            full[lp.name] = np.arange(ext, dtype=np.int64).reshape(view)
        ev = Evaluator(self.buffers, full, block.name, self.private)
        for a, b in zip(block.axes, block.bindings):
            full[a.name] = np.asarray(ev.eval(b))
        points = full
        if block.predicate is not None:
            mask = np.broadcast_to(np.asarray(ev.eval(block.predicate)), shape)
            if not mask.any():
                return
            if not mask.all():
                points = {k: (np.broadcast_to(v, shape)[mask] if isinstance(v, np.ndarray) and v.ndim == len(shape)
                              else v) for k, v in full.items()}
        flat = points is full  # grid-shaped values are flattened as they are written
        count = int(mask.sum()) if not flat else math.prod(shape)

        def per_point(v: Any) -> np.ndarray:
            v = np.asarray(v)
            return np.broadcast_to(v, shape).reshape(-1) if flat and v.ndim else np.broadcast_to(v, (count,))

        ev = Evaluator(self.buffers, points, block.name, self.private)
        out = self.buffers[block.store]
        dtype = self.func.buffer(block.store).dtype
        if out.ndim == 0:  # a single global value: written through a one-element view, so every point has an index
            out = out.reshape(1)
            idx: tuple[np.ndarray, ...] = (np.zeros(count, dtype=np.int64),)
        else:
            idx = tuple(per_point(i) for i in ev.index(block.store, block.store_indices, out.shape, "writes"))
        value = per_point(ev.eval(block.value))
        if block.reducer is None:
            out[idx] = round_to_dtype(value, dtype)
            return
        if block.init is not None:
            first = np.ones(count, dtype=bool)
            for a in block.axes:
                if a.kind == "R":
                    first &= per_point(points[a.name]) == 0
            out[tuple(i[first] for i in idx)] = round_to_dtype(np.asarray(ev.eval(block.init)), dtype)
        ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[block.reducer]
        if dtype in ("float16", "bfloat16") and block.reducer == "sum":
            # the kernel adds the term as computed (in float) to the widened sum and rounds the sum once a
            # step: the term itself is not rounded first
            accumulate_rounded(out, idx, np.asarray(value, dtype=np.float32), dtype)
        else:
            # max/min return one of their operands: rounding the term first gives the same bits
            ufunc.at(out, idx, round_to_dtype(value, dtype))
