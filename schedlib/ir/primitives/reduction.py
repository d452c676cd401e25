"""Reduction primitives: rfactor and decompose_reduction."""

from __future__ import annotations

from dataclasses import replace

from schedlib.ir.expr import Expr, Load, Var, select
from schedlib.ir.func import Attach, Axis, Block, Buffer, Func, Loop
from schedlib.ir.primitives.common import fail, get_block, get_loop, normalize, short
from schedlib.ir.simplify import conjunction, conjuncts, free_vars, substitute
from schedlib.ir.tensor import identity


def _reduce_loops(block: Block) -> list[Loop]:
    return [lp for lp in block.loops if block.loop_kind(lp.name) == "R"]


def _drives_spatial(block: Block, loop: str) -> bool:
    return any(a.kind == "S" and loop in free_vars(b) for a, b in zip(block.axes, block.bindings))


def rfactor(func: Func, loop: str, factor_axis: int = 0) -> tuple[Func, str]:
    """Turn reduction loop ``loop`` into a spatial axis of a new partial-result block; returns its name.

    The original block then reduces the partials over that axis.  Guards on the reduction loops (a split
    of K that overshoots) move into the partials' value as ``select(guard, value, identity)``, so every
    partial is initialised and defined even when all of its steps are masked.

    Before ``rfactor(f, "C.k_1")`` with ``k = C.k_0 * 4 + C.k_1``::

        for C.i in range(8):
          for C.k_0 in range(4):
            for C.k_1 in range(4):
              block C SR (i=C.i, k=C.k_0 * 4 + C.k_1):
                init C[i] = 0.0
                C[i] += A[i, k]

    After::

        alloc C_rf: float32[4, 8] global
        for C.i in range(8):
          for C.k_0 in range(4):
            for C.k_1 in range(4):
              block C_rf SSR (i=C.i, v_k_1=C.k_1, v_k_0=C.k_0):
                init C_rf[v_k_1, i] = 0.0
                C_rf[v_k_1, i] += A[i, v_k_0 * 4 + v_k_1]
        for C.i_1 in range(8):
          for C.v_k_1 in range(4):
            block C SR (i=C.i_1, v_k_1=C.v_k_1):
              init C[i] = 0.0
              C[i] += C_rf[v_k_1, i]
    """
    prim = "rfactor"
    owner, idx = get_loop(func, prim, loop)
    if owner.reducer is None or owner.init is None:
        fail(prim, "loop", loop, f"block {owner.name} is not an undecomposed reduction")
    if owner.loop_kind(loop) != "R":
        fail(prim, "loop", loop, f"does not drive a reduction axis of {owner.name}")
    if func.attached_to(owner.name) or owner.attach is not None:
        fail(prim, "loop", loop, f"block {owner.name} is attached or has blocks attached; rfactor first")
    out_buf = func.buffer(owner.store)
    if isinstance(factor_axis, bool) or not isinstance(factor_axis, int) or not (
            0 <= factor_axis <= len(out_buf.shape)):
        fail(prim, "factor_axis", factor_axis, f"must be in [0, {len(out_buf.shape)}]")
    r_loops = _reduce_loops(owner)
    for a, b in zip(owner.axes, owner.bindings):
        if a.kind == "S" and free_vars(b) & {lp.name for lp in r_loops}:
            fail(prim, "loop", loop, f"reduction loops also drive spatial axis {a.name}; cannot factor")
    names = {a.name for a in owner.axes}
    new_axis = {lp.name: func.fresh_axis_name(f"v_{short(lp.name)}") for lp in r_loops}
    for v in new_axis.values():
        if v in names:
            fail(prim, "loop", loop, f"axis name {v} already exists in {owner.name}")
    spatial = [(a, b) for a, b in zip(owner.axes, owner.bindings) if a.kind == "S"]
    lp_rf = owner.loops[idx]
    rf_axes = [a for a, _ in spatial] + [Axis(new_axis[loop], lp_rf.extent, "S")]
    rf_axes += [Axis(new_axis[lp.name], lp.extent, "R") for lp in r_loops if lp.name != loop]
    rf_bindings = [b for _, b in spatial] + [Var(loop)] + [Var(lp.name) for lp in r_loops if lp.name != loop]
    # Original reduce axes, rewritten over the new per-loop axes.
    to_new = {lp: Var(ax) for lp, ax in new_axis.items()}
    r_values = {a.name: substitute(b, to_new) for a, b in zip(owner.axes, owner.bindings) if a.kind == "R"}
    rf_name = func.fresh_name(f"{owner.store}_rf")
    rf_index = list(owner.store_indices)
    rf_index.insert(factor_axis, Var(new_axis[loop]))
    rf_shape = list(out_buf.shape)
    rf_shape.insert(factor_axis, lp_rf.extent)
    # A guard on the reduction loops (a split overshooting K) may mask *every* step of some partial, which
    # then would never be initialised; such steps add the identity instead, so every partial is defined.
    r_names = set(new_axis)
    r_guards = [p for p in conjuncts(owner.predicate) if free_vars(p) & r_names]
    rf_value = substitute(owner.value, r_values)
    rf_init = identity(owner.reducer, owner.value.dtype)
    if r_guards:
        rf_value = select(substitute(conjunction(r_guards), to_new), rf_value, rf_init)
    rf_pred = conjunction(p for p in conjuncts(owner.predicate) if not free_vars(p) & r_names)
    rf_block = Block(name=rf_name, axes=tuple(rf_axes), bindings=tuple(rf_bindings), loops=owner.loops,
                     store=rf_name, store_indices=tuple(rf_index), value=rf_value,
                     reducer=owner.reducer, init=rf_init, predicate=rf_pred)
    taken = func.all_loop_names()  # the rf block keeps the owner's loops, so their names stay taken
    final_axes = [a for a, _ in spatial] + [Axis(new_axis[loop], lp_rf.extent, "R")]
    final_loops = []
    for a in final_axes:
        name = func.fresh_name(f"{owner.name}.{a.name}", taken)
        taken.add(name)
        final_loops.append(Loop(name, a.extent))
    final = replace(owner, axes=tuple(final_axes), bindings=tuple(lp.var for lp in final_loops),
                    loops=tuple(final_loops), predicate=None,
                    value=Load(rf_name, tuple(rf_index), owner.value.dtype))
    blocks: list[Block] = []
    for b in func.blocks:
        if b.name == owner.name:
            blocks.extend([rf_block, final])
        else:
            blocks.append(b)
    out = replace(func, blocks=tuple(blocks),
                  buffers=(*func.buffers, Buffer(rf_name, tuple(rf_shape), owner.value.dtype)), _index={})
    return normalize(out), rf_name


def decompose_reduction(func: Func, block: str, loop: str) -> tuple[Func, str]:
    """Move a reduction's initialisation into its own block placed just before ``loop``.

    ``loop`` must enclose every reduction loop of the block, no loop below it may drive spatial and
    reduction axes at once, and it must lie inside any loop the block's output tile is compacted to.
    Spatial loops at or below ``loop`` are copied (with their bindings) for the init block.  Returns the
    init block's name.

    Before ``decompose_reduction(f, "C", "C.k")``::

        for C.i in range(8):
          for C.k in range(16):
            block C SR (i=C.i, k=C.k):
              init C[i] = 0.0
              C[i] += A[i, k]

    After::

        for C.i in range(8):
          block C_init S (i=C.i):
            C[i] = 0.0
          for C.k in range(16):
            block C SR (i=C.i, k=C.k):
              C[i] += A[i, k]
    """
    prim = "decompose_reduction"
    blk = get_block(func, prim, block)
    owner, idx = get_loop(func, prim, loop)
    if owner.name != blk.name:
        fail(prim, "loop", loop, f"belongs to block {owner.name}, not {block}")
    if blk.reducer is None or blk.init is None:
        fail(prim, "block", block, "is not a reduction with an initialisation")
    r_loops = [i for i, lp in enumerate(blk.loops) if blk.loop_kind(lp.name) == "R"]
    if r_loops and idx > r_loops[0]:
        fail(prim, "loop", loop, f"is inside reduction loop {blk.loops[r_loops[0]].name}; pick an outer loop")
    r_names = {blk.loops[i].name for i in r_loops}
    inner = {lp.name for lp in blk.loops[idx:]}
    tied = sorted(inner & set().union(*(free_vars(i) for i in blk.store_indices)))
    if tied:
        # The buffer was compacted to one iteration of these loops; an init hoisted out of them would
        # initialise every iteration's tile in the same place, once, before the first.
        fail(prim, "loop", loop, f"{blk.store} is stored per iteration of {', '.join(tied)} (compacted); "
             "decompose at a loop inside it")
    for lp in blk.loops[idx:]:
        if lp.name in r_names and _drives_spatial(blk, lp.name):
            fail(prim, "loop", loop, f"loop {lp.name} below it drives spatial and reduction axes at once; "
                 "the initialisation cannot be split from it")
    taken = func.all_loop_names()
    init_name = func.fresh_name(f"{block}_init")
    copies: dict[str, Expr] = {}
    loops: list[Loop] = []
    for lp in blk.loops[idx:]:
        if blk.loop_kind(lp.name) != "S":
            continue
        name = func.fresh_name(f"{init_name}.{short(lp.name)}", taken)
        taken.add(name)
        copies[lp.name] = Var(name)
        loops.append(replace(lp, name=name))
    spatial = [(a, b) for a, b in zip(blk.axes, blk.bindings) if a.kind == "S"]
    pred = conjunction(substitute(p, copies) for p in conjuncts(blk.predicate) if not free_vars(p) & r_names)
    if idx == 0:
        attach = blk.attach
    else:
        attach = Attach(block, blk.loops[idx - 1].name, "before")
    init = Block(name=init_name, axes=tuple(a for a, _ in spatial),
                 bindings=tuple(substitute(b, copies) for _, b in spatial), loops=tuple(loops),
                 store=blk.store,
                 store_indices=tuple(substitute(i, copies) for i in blk.store_indices), value=blk.init, predicate=pred,
                 attach=attach)
    blocks: list[Block] = []
    for b in func.blocks:
        if b.name == block:
            blocks.extend([init, replace(b, init=None)])
        else:
            blocks.append(b)
    return normalize(replace(func, blocks=tuple(blocks), _index={})), init_name
