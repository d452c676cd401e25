"""Placement primitives: compute_at and reverse_compute_at attach a block under another block's loop (its
consumer's or its producer's; :mod:`~schedlib.ir.primitives.horizontal` places one beside a block it shares
no data with).

Moving a block under a loop regenerates its loops over the region it must cover there (see
:mod:`schedlib.ir.region`).  A shared/local buffer whose every access then lies under that loop is
*compacted* to the region, so a 32x8 tile of A lives in a 32x8 shared array rather than a copy of A.
"""

from __future__ import annotations

from dataclasses import replace

from schedlib.ir.expr import Binary, Const, Expr, Var, as_int
from schedlib.ir.func import Attach, Block, Buffer, Func, Loop
from schedlib.ir.primitives.common import (
    bound_guard,
    check_dependencies,
    check_single_producer,
    fail,
    get_block,
    get_loop,
    loop_ranges,
    normalize,
)
from schedlib.ir.region import access_region, covers_box, repeating_loops, tiles_whole_buffer
from schedlib.ir.simplify import (
    conjunction,
    conjuncts,
    free_vars,
    loads,
    rename_buffer,
    simplify,
    substitute,
    to_affine,
)


def _check_movable(func: Func, prim: str, blk: Block, host: Block, loop: str) -> None:
    if host.name == blk.name:
        fail(prim, "loop", loop, f"is a loop of block {blk.name} itself")
    # A block with nothing attached to it cannot enclose ``host`` either (the chain of attachments from
    # ``host`` upwards would end in one attached to ``blk``), so this check also rules out cycles.
    if func.attached_to(blk.name):
        names = ", ".join(b.name for b in func.attached_to(blk.name))
        fail(prim, "block", blk.name, f"has blocks attached to its loops ({names}); move those first")
    # Its loops are regenerated, so its store must not depend on them: a block whose output was compacted
    # (stored at loop variables, read back shifted by its current host's loops) cannot move.
    if _store_axes(blk) is None:
        fail(prim, "block", blk.name, "does not store at its plain spatial axes (moved or compacted already)")
    # An attached block may read a buffer compacted under a loop of its host (``C_local[i - C.i_0 * 8]``);
    # it can only move where every such loop still encloses it.
    idx = host.loop_index(loop)
    if host.loops[idx].vectorized:  # one wide access per iteration has no room for a block's statements
        fail(prim, "loop", loop, "is vectorized; attach blocks at a loop outside it")
    enclosing = {lp.name for lp in func.all_loops(host)[: len(func.enclosing_loops(host)) + idx + 1]}
    outer = free_vars(blk.value) - {a.name for a in blk.axes} - set(func.symbols) - enclosing
    if outer:
        fail(prim, "loop", loop, f"block {blk.name} indexes a buffer through loop(s) {', '.join(sorted(outer))}, "
             "which would not enclose it there")


def _store_axes(blk: Block) -> list[str] | None:
    """The spatial axes ``blk`` stores at, in the order of its buffer's dimensions (an rfactor block with
    ``factor_axis=0`` stores ``R_rf[v, i]``), or None when its store is not each spatial axis once."""
    spatial = {a.name for a in blk.axes if a.kind == "S"}
    names = [ix.name for ix in blk.store_indices if isinstance(ix, Var) and ix.name in spatial]
    return names if len(names) == len(blk.store_indices) == len(spatial) == len(set(names)) else None


def _fixed_loops(func: Func, host: Block, idx: int, scope: str) -> set[str]:
    """Loops held constant when inferring a region under loop ``idx`` of ``host``.

    A shared buffer serves every thread of a CUDA block, so loops bound to ``threadIdx`` are relaxed:
    the region covers all threads, and the threads' own loops then share out the copy.
    """
    loops = func.all_loops(host)[: len(func.enclosing_loops(host)) + idx + 1]
    return {lp.name for lp in loops if not (scope == "shared" and _per_thread(lp))}


def _per_thread(lp: Loop) -> bool:
    return lp.thread is not None and lp.thread.startswith("threadIdx")


def _per_block(lp: Loop) -> bool:
    return lp.thread is not None and lp.thread.startswith("blockIdx")


def _neighbours_inside_the_box(host: Block, chain: list[Loop], fixed: set[str], region: list[tuple[Expr, Expr]],
                               scope: str) -> list[str]:
    """Fixed loops each thread (registers) or each CUDA block (shared or global memory: a block's threads
    share it, or every block's do) runs its own iteration of, whose step in a stored index is smaller than the
    region's extent there: the box of one iteration then reaches into the tiles its neighbours write."""
    own = _per_thread if scope == "local" else (lambda lp: lp.thread is not None)
    bound = {lp.name for lp in chain if lp.name in fixed and own(lp)}
    binding = {a.name: b for a, b in zip(host.axes, host.bindings)}
    out: list[str] = []
    for index, (_, extent) in zip(host.store_indices, region):
        terms, _ = to_affine(simplify(substitute(index, binding)))
        width = as_int(extent)
        for atom, step in terms.items():
            if isinstance(atom, Var):
                if atom.name in bound and width is not None and width > abs(step):
                    out.append(atom.name)
            elif scope != "local" and width != 1:
                # ``f // 3`` or ``f % 3`` of such a loop, not bounded to one element: region inference gave up
                # and took the whole dimension (registers meet the build's write-race check instead)
                out += sorted(_divided_loops(atom) & bound)
    return list(dict.fromkeys(out))


def _divided_loops(e: Expr) -> set[str]:
    """The variables ``e`` takes a ``//`` or ``%`` of."""
    if not isinstance(e, Binary):
        return set()
    if e.op in ("//", "%"):
        return free_vars(e.a)
    return _divided_loops(e.a) | _divided_loops(e.b)


def _regenerate(func: Func, blk: Block, region: dict[str, tuple[Expr, Expr]], attach: Attach) -> Block:
    """New loops for ``blk``: spatial axes over ``region`` (axis -> (min, extent)), others in full."""
    taken = func.all_loop_names() - {lp.name for lp in blk.loops}
    loops, bindings = [], []
    for a in blk.axes:
        name = func.fresh_name(f"{blk.name}.{a.name}", taken)
        taken.add(name)
        base, extent = region.get(a.name, (None, a.extent))
        loop = Loop(name, extent)
        loops.append(loop)
        bindings.append(loop.var if base is None else simplify(base + loop.var))
    moved = replace(blk, loops=tuple(loops), bindings=tuple(bindings), attach=attach, predicate=None)
    placed = func.with_block(moved)
    rng = loop_ranges(placed, moved)
    guards: list[Expr] = []
    for a, b in zip(blk.axes, bindings):
        if a.name in region:
            guards.extend(simplify(g, rng) for g in bound_guard(b, a.extent, rng))
    return replace(moved, predicate=conjunction(guards))


def _shift(indices: tuple[Expr, ...], bases: list[Expr]) -> tuple[Expr, ...]:
    return tuple(simplify(i - b) for i, b in zip(indices, bases))


def compute_at(func: Func, block: str, loop: str) -> tuple[Func, None]:
    """Compute ``block`` inside ``loop`` of its consumer, only over the region read in one iteration.

    Every reader of the block's buffer must run inside ``loop``, and the block must be its buffer's only
    producer (move a reduction before ``decompose_reduction``).  A block writing a func output moves only
    where the loop's iterations read all of it between them (a row's statistic computed for each row), so
    the output is still written whole.

    Before ``compute_at(f, "A_shared", "C.k_0")``::

        alloc A_shared: float32[64, 64] shared
        for A_shared.ax0 in range(64):
          for A_shared.ax1 in range(64):
            block A_shared SS (ax0=A_shared.ax0, ax1=A_shared.ax1):
              A_shared[ax0, ax1] = A[ax0, ax1]
        for C.i in range(64):
          for C.k_0 in range(8):
            for C.k_1 in range(8):
              block C SR (i=C.i, k=C.k_0 * 8 + C.k_1):
                init C[i] = 0.0
                C[i] += A_shared[i, k]

    After (A_shared is compacted to the 1x8 tile read per iteration)::

        alloc A_shared: float32[1, 8] shared
        for C.i in range(64):
          for C.k_0 in range(8):
            for A_shared.ax0 in range(1):
              for A_shared.ax1 in range(8):
                block A_shared SS (ax0=C.i + A_shared.ax0, ax1=C.k_0 * 8 + A_shared.ax1):
                  A_shared[A_shared.ax0, A_shared.ax1] = A[ax0, ax1]
            for C.k_1 in range(8):
              block C SR (i=C.i, k=C.k_0 * 8 + C.k_1):
                init C[i] = 0.0
                C[i] += A_shared[i - C.i, k - C.k_0 * 8]
    """
    prim = "compute_at"
    blk = get_block(func, prim, block)
    host, idx = get_loop(func, prim, loop)
    _check_movable(func, prim, blk, host, loop)
    buf = func.buffer(blk.store)
    check_single_producer(func, prim, blk)
    stored = _store_axes(blk)  # the axis at each dimension of the buffer
    assert stored is not None  # _check_movable refused anything else
    inside = func.subtree(host.name, idx)
    consumers = [c for c in func.consumers(buf.name) if c.name != block]
    if not consumers:
        fail(prim, "block", block, f"nothing reads {buf.name}")
    outside = [c.name for c in consumers if c not in inside]
    if outside:
        fail(prim, "loop", loop, f"{buf.name} is also read outside it, by {', '.join(outside)}")
    accesses = [(c, ld.indices) for c in consumers for ld in loads(c.value) if ld.buffer == buf.name]
    fixed = _fixed_loops(func, host, idx, buf.scope)
    region = access_region(func, accesses, fixed, buf.shape)
    if buf.name in func.outputs and not tiles_whole_buffer(func, host, fixed, buf.shape, region):
        # an output must still be written whole: the loop's iterations have to read all of it between them
        fail(prim, "block", block, f"writes output {buf.name}, and the iterations of {loop} do not read all of "
                                   "it exactly once between them (each reads one tile of a row-by-row or "
                                   "tile-by-tile walk, or the whole, and every other loop at or above it runs once)")
    if buf.scope == "global" and blk.reducer is not None:
        # a reduction into global memory computed again by another CUDA block would re-initialise partial sums
        # this one is still accumulating (an element-wise stage only writes the same values; a loop over
        # threads gets a guard that leaves the work to one of them, and a serial loop repeats it in order)
        grid = {lp.name for lp in func.all_loops(host) if _per_block(lp)}
        again = [name for name in repeating_loops(func, host, fixed, region) if name in grid]
        if again:
            fail(prim, "loop", loop, f"{block} reduces into global {buf.name}, and the CUDA blocks of {again[0]} "
                                     "would compute some of the same elements of it at once")
    if buf.scope == "global" and (buf.name in func.outputs or blk.reducer is not None):
        _refuse_grid_loops_below(prim, host, idx, block, buf.name)
    moved = _regenerate(func, blk, dict(zip(stored, region)), Attach(host.name, loop, "before"))
    out = func.with_block(moved)
    if buf.scope != "global":
        whole, bases, shape = _compaction(buf, region)
        loop_of = {a.name: lp for a, lp in zip(moved.axes, moved.loops)}
        store = tuple(moved.store_indices[d] if d in whole else loop_of[axis].var for d, axis in enumerate(stored))
        out = out.with_block(replace(moved, store_indices=store))
        for c in consumers:
            c = out.block(c.name)
            value = rename_buffer(c.value, buf.name, buf.name, lambda ix, bases=bases: _shift(ix, bases))
            out = out.with_block(replace(c, value=value))
        out = out.with_buffer(replace(buf, shape=shape))
    out = normalize(out)
    check_dependencies(out, prim, "block", block)
    return out, None


def reverse_compute_at(func: Func, block: str, loop: str) -> tuple[Func, None]:
    """Run consumer ``block`` inside ``loop`` of its producer, over the region written in one iteration.

    A shared/local buffer read by nothing else is compacted to that region when one iteration writes all
    of it; a strided or masked write pattern (an inner split that overshoots, a loop order that interleaves
    the region with others) keeps the buffer whole, which stays correct where the loops run one after
    another (a later iteration rewrites what an earlier one copied too early).  Not where they run side by
    side: a region with holes that other threads or CUDA blocks fill (a local buffer under a ``threadIdx``
    loop; a shared or global one under any ``threadIdx`` or ``blockIdx`` loop) is refused, since the copy
    would store values this iteration never wrote over theirs.

    Before ``reverse_compute_at(f, "C_local", "C.i_0")``::

        alloc C_local: float32[64] local
        for C.i_0 in range(4):
          for C.i_1 in range(16):
            block C S (i=C.i_0 * 16 + C.i_1):
              C_local[i] = A[i] * 2.0
        for C_local.ax0 in range(64):
          block C_local S (ax0=C_local.ax0):
            C[ax0] = C_local[ax0]

    After (C_local compacted to the 16 elements written per iteration)::

        alloc C_local: float32[16] local
        for C.i_0 in range(4):
          for C.i_1 in range(16):
            block C S (i=C.i_0 * 16 + C.i_1):
              C_local[i - C.i_0 * 16] = A[i] * 2.0
          for C_local.ax0 in range(16):
            block C_local S (ax0=C.i_0 * 16 + C_local.ax0):
              C[ax0] = C_local[ax0 - C.i_0 * 16]
    """
    prim = "reverse_compute_at"
    blk = get_block(func, prim, block)
    host, idx = get_loop(func, prim, loop)
    _check_movable(func, prim, blk, host, loop)
    check_single_producer(func, prim, blk)
    buf = func.buffer(host.store)
    reads = [ld for ld in loads(blk.value) if ld.buffer == buf.name]
    if not reads:
        fail(prim, "loop", loop, f"block {block} does not read {buf.name}, which {host.name} writes")
    if any(ld.indices != reads[0].indices for ld in reads):
        fail(prim, "block", block, f"reads {buf.name} at several different indices")
    dims: dict[str, int] = {}
    for d, ix in enumerate(reads[0].indices):
        if isinstance(ix, Var) and any(a.name == ix.name and a.kind == "S" for a in blk.axes):
            dims[ix.name] = d
    spatial = [a for a in blk.axes if a.kind == "S"]
    if len(dims) != len(reads[0].indices):
        fail(prim, "block", block, f"must read {buf.name} at its plain spatial axes, reads {reads[0]}")
    unused = [a.name for a in spatial if a.name not in dims]
    if unused:
        # A broadcast (D[i, j] = C[i]) reads each element many times: one producer iteration's region
        # does not determine the consumer's loops over the other axes.
        fail(prim, "block", block, f"must read {buf.name} at all of its spatial axes, one per dimension; "
             f"reads {reads[0]}, which does not use {', '.join(unused)}")
    for lp in host.loops[: idx + 1]:
        if host.loop_kind(lp.name) == "R":
            fail(prim, "loop", loop, f"{lp.name} at or above it reduces; {host.name}'s results are not final there")
    fixed = _fixed_loops(func, host, idx, buf.scope)
    region = access_region(func, [(host, host.store_indices)], fixed, buf.shape, widen=False)
    moved = _regenerate(func, blk, {a: region[d] for a, d in dims.items()}, Attach(host.name, loop, "after"))
    moved = replace(moved, predicate=conjunction([*conjuncts(moved.predicate), *_iteration_guards(func, host, fixed)]))
    out = func.with_block(moved)
    others = [c.name for c in func.consumers(buf.name) if c.name != block]
    # Compact only when one iteration writes the whole box: the consumer reads all of it, and a compacted
    # element the host skipped would still hold a value from an earlier iteration.  For the same reason a
    # region widened over threadIdx loops (shared scope) must not interleave with a fixed loop inside them:
    # the tile of one fixed iteration would then be filled across several thread iterations, with tiles
    # of other fixed iterations written into the same compacted place in between.
    chain = func.all_loops(host)[: len(func.enclosing_loops(host)) + idx + 1]
    interleaved = any(lp.name in fixed and any(o.name not in fixed for o in chain[:k]) for k, lp in enumerate(chain))
    covered = covers_box(func, host, host.store_indices, fixed, buf.shape, region)
    overlapped = [] if covered else _neighbours_inside_the_box(host, chain, fixed, region, buf.scope)
    if overlapped and buf.scope == "local":
        # Registers are private: box elements of the next threads' tiles are results this thread's copy of
        # the buffer never holds.  Reading the box back would store garbage over them.
        box = ", ".join(f"[{lo}, {simplify(lo + ext)})" for lo, ext in region)
        fail(prim, "loop", loop, f"one iteration writes only part of the box {box} of {buf.name}, which also "
             f"spans the tiles of other threads ({', '.join(overlapped)}): {buf.name} is local to each thread, "
             f"so {block} would store values this thread never computed; give each thread a dense tile (its "
             "own loops innermost, without thread loops between them)")
    if overlapped:
        # Shared memory is each CUDA block's own and global memory everyone's: the box's holes are elements
        # another block (or thread) writes at the same time, or never writes in this block's copy.  A sequential
        # loop would be right (a later iteration rewrites them); blocks and threads run side by side.
        box = ", ".join(f"[{lo}, {simplify(lo + ext)})" for lo, ext in region)
        fail(prim, "loop", loop, f"one iteration writes only part of the box {box} of {buf.name} ({buf.scope}), "
             f"which also spans what other iterations of {', '.join(overlapped)} write side by side: {block} "
             f"would copy elements this iteration never wrote over their results; make the loops below "
             f"{loop} write a dense tile (no loop of another iteration's tiles between them)")
    exact = covered and not interleaved
    # Other writers (a decomposed init) keep the buffer's full indexing, so it stays whole with them.
    sole_writer = [p.name for p in func.producers(buf.name)] == [host.name]
    if buf.scope != "global" and not others and buf.name not in func.outputs and exact and sole_writer:
        _, bases, shape = _compaction(buf, region)
        writer = out.block(host.name)
        out = out.with_block(replace(writer, store_indices=_shift(writer.store_indices, bases)))
        moved = out.block(block)
        value = rename_buffer(moved.value, buf.name, buf.name, lambda ix: _shift(ix, bases))
        out = out.with_block(replace(moved, value=value))
        out = out.with_buffer(replace(buf, shape=shape))
    out = normalize(out)
    check_dependencies(out, prim, "block", block)
    return out, None


def _iteration_guards(func: Func, host: Block, fixed: set[str]) -> list[Expr]:
    """The conjuncts of ``host``'s predicate over the ``fixed`` loops (and symbols) alone: where one fails, the
    iteration writes nothing, and a consumer placed in it must copy nothing either.  An overshooting split
    (``split(i_1, [3, None])`` of 2 points: ``i_1_0 < 2``) masks whole iterations whose box is an element another
    iteration writes: copied anyway, a buffer in registers stored this thread's never-written copy over another
    thread's result (the emulator gave 0 for 3 of 8 outputs), and a shared or global one a stale value."""
    binding = {a.name: b for a, b in zip(host.axes, host.bindings)}
    allowed = fixed | set(func.symbols)
    extents = {lp.name: as_int(lp.extent) for lp in func.all_loops(host)}
    out = []
    for g in (simplify(substitute(g, binding)) for g in conjuncts(host.predicate)):
        if free_vars(g) <= allowed:
            out.append(g)
        elif isinstance(g, Binary) and g.op in ("<", "<="):
            # a bound on inner loops too (i_1_0 + i_1_1 < 2): the iteration writes something only if it holds
            # where the inner loops make the left side least, each at 0 or its last value by its sign
            terms, _ = to_affine(simplify(g.a - g.b))
            inner = {atom.name: k for atom, k in terms.items() if isinstance(atom, Var) and atom.name not in allowed}
            rest = [atom for atom in terms if not (isinstance(atom, Var) and atom.name in inner)]
            if any(free_vars(atom) - allowed for atom in rest) or any(extents.get(v) is None for v in inner):
                continue
            corner = {v: Const(0 if k > 0 else extents[v] - 1) for v, k in inner.items()}  # type: ignore[operator]
            out.append(simplify(substitute(g, corner)))
    return out


def _refuse_grid_loops_below(prim: str, host: Block, idx: int, block: str, buffer: str) -> None:
    """Every CUDA block runs what is placed above its own loops: a global buffer computed above a loop bound to
    ``blockIdx`` would be computed again by each block, concurrently.  (Threads below get a guard instead.)"""
    grid = [lp for lp in host.loops[idx + 1:] if _per_block(lp) and as_int(lp.extent) != 1]
    if grid:
        fail(prim, "loop", host.loops[idx].name, f"{grid[0].name} below it is bound to {grid[0].thread}: every "
                                                 f"CUDA block would compute {block} into global {buffer} again")


def _compaction(buf: Buffer, region: list[tuple[Expr, Expr]]
                ) -> tuple[set[int], list[Expr], tuple[Expr, ...]]:
    """(dims kept whole, each dim's base, the compacted shape) of ``buf`` cut to ``region``.  A dim that
    storage_permute reorders stays whole: its digits describe the whole extent."""
    whole = {d for d, _, _ in buf.permute}
    bases = [Const(0) if d in whole else r[0] for d, r in enumerate(region)]
    return whole, bases, tuple(buf.shape[d] if d in whole else r[1] for d, r in enumerate(region))
