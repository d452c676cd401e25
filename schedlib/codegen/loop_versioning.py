"""Loop versioning of ragged tiles: a tile loop's interior iterations run without the guards of the edges.

A matmul's k loop over K = 8191 in steps of 32 stages two tiles per iteration and computes on them in an
unrolled nest, every multiply-add of which checks ``k_0 * 32 + k_1 < 8191`` (and, where M or N is ragged,
its row and column).  Only the last iteration, or a block at the edge of the output, can fail a check.  The
writer emits the nest twice instead::

    for (int k_0 = 0; k_0 < 256; ++k_0) {
      ... the tiles' copies ...
      if (k_0 * 32 + 31 < 8191 && block_row0 + 31 < M) {  // every point of the block's nests passes
        for k_1, i, j (unrolled): C[i, j] += A_s[i, k_1] * B_s[k_1, j];
      } else {
        for k_1, i, j (unrolled): if (k_0 * 32 + k_1 < 8191 && row0 + i < M) C[i, j] += ...;
      }
    }

The checks cost more than their compares: ptxas kept the unrolled nest's predicates live together, spilled
(a double-buffered 32 x 32 x 32 fp32 tile over K = 8191: 8 bytes on sm_90) and read the shared tiles one
scalar at a time.  The k step of a 128 x 128 x 16 fp32 tile over a ragged K was 8811 SASS instructions, 1024
of them FFMA; its unchecked version is 1182, 1024 FFMA and 64 vector shared loads.  A guard is
hoisted when it is a comparison affine in the nest's loops: it holds for every point of the nest when it
holds at the corner that maximises its left side minus its right.  The corner spans the block's threads as
well as the nest, so the test is the same for every thread of a block: a warp never runs both versions, and
a block at the edge runs the guarded nest exactly as an unversioned kernel does.
"""

from __future__ import annotations

import math
from typing import Any

from schedlib.codegen.cuda_expr import unroll_pragma
from schedlib.codegen.speculation import may_trap
from schedlib.ir.dtype import is_int
from schedlib.ir.expr import Binary, Const, Expr, Load, Select, Var, as_int
from schedlib.ir.func import THREAD_INDEX_TAGS, Block, Func, Loop
from schedlib.ir.simplify import map_children, simplify, substitute, to_affine, walk

COMPARISONS = ("<", "<=", ">", ">=")
# Points of the unrolled nest below which it is not versioned: a 4 x 2 x 8 nest gains a few predicated
# instructions, and the second copy of it changed ptxas's allocation enough to spill 8 bytes on sm_80.
MIN_NEST = 128


class LoopVersioning:
    """Choosing the loops to version and writing their two bodies; mixed into the kernel writer."""

    func: Any
    bindings: dict[str, Expr]
    ranges: dict[str, tuple[int, int]]
    staging: tuple[str, str] | None
    assumed: frozenset[Expr]  # guards known to hold in the version being written (empty: none)
    rolled: str | None  # the loop the edge version keeps rolled
    printer: Any  # the writer's; _enter, _open, _close and chain are the writer's too

    def _edge_guards(self, block: Block, index: int) -> dict[Expr, Expr]:
        """Guards of ``block``'s statement that vary within the nest inside its loop ``index``, each with the
        condition, outside that nest, under which it holds at every point of it; empty where loop ``index``
        is not a tile loop worth versioning.

        A tile loop: a plain serial loop that stages tiles (blocks attached before its body) and whose
        loops within are all unrolled, at least ``MIN_NEST`` points, with nothing attached to them."""
        lp = block.loops[index]
        inner = block.loops[index + 1:]
        if (self.staging or self.assumed or lp.thread is not None or unroll_pragma(lp, whole=False)
                or not inner or not self.func.attached_at(block.name, lp.name, "before")):
            return {}
        if any(x.thread is not None or as_int(x.extent) is None or unroll_pragma(x, whole=False) != "#pragma unroll"
               or self.func.attached_at(block.name, x.name) for x in inner):
            return {}
        if math.prod(as_int(x.extent) for x in inner) < MIN_NEST:  # type: ignore[misc]
            return {}
        saved = self.bindings, self.ranges
        self._enter(block)  # type: ignore[attr-defined]
        selects = [e.cond for e in walk(block.value) if isinstance(e, Select)]
        guards = [*self._guards(block), *map(self._bound_expr, selects)]  # type: ignore[attr-defined]
        corners: dict[Expr, Expr] = {}
        # the corner spans the block's threads too, so that the whole block takes one version: a warp split
        # between them would run both, and a block at the edge runs the guarded nest as it did unversioned
        threads = [x for x in self.func.all_loops(block) if x.thread in THREAD_INDEX_TAGS]
        box = {x.name: as_int(x.extent) for x in (*threads, *inner)}
        for g in guards:
            corner = _corner(g, box)  # type: ignore[arg-type]
            if corner is not None:
                corners[g] = simplify(corner, self.ranges)
        self.bindings, self.ranges = saved
        return {g: c for g, c in corners.items() if not isinstance(c, Const)}

    def _versioned(self, block: Block, index: int, ctx: Any) -> bool:
        """Write the rest of ``block``'s nest, inside its loop ``index``, twice: without the edge guards where
        they all hold, as it is elsewhere.  False (nothing written) where the loop is not versioned."""
        guards = self._edge_guards(block, index)
        if not guards:
            return False
        test = " && ".join(dict.fromkeys(self.printer(c) for c in guards.values()))
        self._open(f"if ({test})")  # type: ignore[attr-defined]
        self.assumed = frozenset(guards)
        try:
            self.chain(block, ctx, index + 1)  # type: ignore[attr-defined]
        finally:
            self.assumed = frozenset()
        self._close()  # type: ignore[attr-defined]
        self._open("else")  # type: ignore[attr-defined]
        self.rolled = _rollable(self.func, block, index + 1)
        try:
            self.chain(block, ctx, index + 1)  # type: ignore[attr-defined]
        finally:
            self.rolled = None
        self._close()  # type: ignore[attr-defined]
        return True

    def _edge_pragma(self, lp: Loop) -> str | None:
        """``#pragma unroll 1`` for the edge version's outer loop (see :func:`_rollable`), else None."""
        return "#pragma unroll 1" if lp.name == self.rolled else None

    def _without_assumed(self, e: Expr) -> Expr:
        """``e`` with the guards the current version has checked replaced by true (selects fold away)."""
        if not self.assumed:
            return e

        def go(x: Expr) -> Expr:
            return Const(True, "bool") if x in self.assumed else map_children(x, go)

        return go(e)


def _rollable(func: Func, block: Block, index: int) -> str | None:
    """The edge version's outermost loop, kept rolled where no register array is indexed by it: the edge
    runs once per slice of K or in the blocks at the output's edge, and a rolled nest holds one step's
    predicates at a time, where an unrolled one beside the interior version spilled (8-36 bytes on sm_90 in
    ragged defaults)."""
    lp = block.loops[index]
    accesses = [(block.store, block.store_indices), *((ld.buffer, ld.indices) for ld in walk(block.value)
                                                        if isinstance(ld, Load))]
    for buffer, indices in accesses:
        if func.buffer(buffer).scope == "local" and any(lp.name in _names(substitute(i, dict(
                zip((a.name for a in block.axes), block.bindings)))) for i in indices):
            return None
    return lp.name


def _corner(guard: Expr, inner: dict[str, int]) -> Expr | None:
    """``guard`` at the corner of the inner loops' box where it is hardest to meet, or None when it is not an
    integer comparison affine in them (or does not depend on them: one predicate for the whole nest, which
    the compiler hoists itself), or when it reads memory or can trap."""
    if not (isinstance(guard, Binary) and guard.op in COMPARISONS and is_int(guard.a.dtype)
            and is_int(guard.b.dtype)):
        return None
    if any(isinstance(e, Load) or may_trap(e) for e in walk(guard)):
        # the test runs before the nest's other guards: a load there (``k < L[b]`` of a padding batch b)
        # could read out of bounds, a division divide by zero
        return None
    terms, _ = to_affine(simplify(guard.a - guard.b))
    sign = 1 if guard.op in ("<", "<=") else -1  # the side to keep small
    corner: dict[str, Expr] = {}
    for atom, k in terms.items():
        names = _names(atom) & inner.keys()
        if not names:
            continue
        if not isinstance(atom, Var):
            return None  # an inner loop inside a division or product: not monotone in it
        corner[atom.name] = Const(inner[atom.name] - 1 if k * sign > 0 else 0)
    if not corner:
        return None
    return substitute(guard, corner)


def _names(e: Expr) -> set[str]:
    return {x.name for x in walk(e) if isinstance(x, Var)}
