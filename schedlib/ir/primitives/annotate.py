"""Annotation primitives: bind, vectorize, unroll, annotate.

They change how a loop or buffer is realised on the GPU, never what is computed.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from schedlib.ir.expr import as_int
from schedlib.ir.func import THREAD_TAGS, Func
from schedlib.ir.primitives.common import fail, get_loop
from schedlib.ir.primitives.pipeline import DOUBLE_BUFFER
from schedlib.ir.simplify import free_vars

MAX_VECTOR = 16
MAX_THREADS = 1024
MAX_THREAD_DIM = {"threadIdx.x": 1024, "threadIdx.y": 1024, "threadIdx.z": 64}


def _kernel_threads(func: Func, name: str) -> dict[str, int]:
    """The thread block of the kernel ``name`` belongs to, as bound so far: each threadIdx tag's largest
    extent over the kernel's blocks (blocks of one kernel share its threads)."""
    root = func.root_of(func.block(name)).name
    dims: dict[str, int] = {}
    for block in func.blocks:
        if func.root_of(block).name != root:
            continue
        for lp in block.loops:
            ext = as_int(lp.extent)
            if lp.thread is not None and lp.thread.startswith("threadIdx") and ext is not None:
                dims[lp.thread] = max(dims.get(lp.thread, 1), ext)
    return dims


def _replace_loop(func: Func, loop: str, **changes: Any) -> Func:
    owner, idx = func.loop_owner(loop)
    loops = list(owner.loops)
    loops[idx] = replace(loops[idx], **changes)
    return func.with_block(replace(owner, loops=tuple(loops)))


def bind(func: Func, loop: str, thread: str) -> tuple[Func, None]:
    """Bind a loop to a GPU grid or block dimension.

    A reduction loop may be bound to ``threadIdx.*`` (a cross-thread reduction) but never to ``blockIdx.*``,
    and only a block at the root (the outermost block of its kernel) may bind ``blockIdx.*``.

    Before ``bind(f, "C.i_0", "blockIdx.x")``::

        for C.i_0 in range(4):
          for C.i_1 in range(32):
            block C S (i=C.i_0 * 32 + C.i_1):
              C[i] = A[i] * 2.0

    After::

        for C.i_0 in range(4):  # blockIdx.x
          for C.i_1 in range(32):
            block C S (i=C.i_0 * 32 + C.i_1):
              C[i] = A[i] * 2.0
    """
    prim = "bind"
    owner, idx = get_loop(func, prim, loop)
    lp = owner.loops[idx]
    if not isinstance(thread, str) or thread not in THREAD_TAGS:
        fail(prim, "thread", thread, f"must be one of {', '.join(THREAD_TAGS)}")
    if lp.thread is not None:
        fail(prim, "loop", loop, f"is already bound to {lp.thread}")
    if lp.vectorized:
        fail(prim, "loop", loop, "is vectorized")
    # As unroll and unroll_limit refuse a bound loop: a bound loop is no loop to unroll.
    if lp.unrolled:
        fail(prim, "loop", loop, "is unrolled; a loop bound to the grid has no iterations to unroll")
    if "unroll_limit" in dict(lp.annotations):
        fail(prim, "loop", loop, "has an unroll_limit; a loop bound to the grid has no iterations to unroll")
    kind = owner.loop_kind(loop)
    driven = {a.kind for a, b in zip(owner.axes, owner.bindings) if loop in free_vars(b)}
    if thread.startswith("threadIdx") and driven == {"S", "R"}:
        fail(prim, "loop", loop, "drives spatial and reduce axes at once (a fused S x R loop); threads combine "
             "a reduction over reduce axes only: bind a loop that drives one kind")
    if thread.startswith("blockIdx") and kind == "R":
        fail(prim, "thread", thread, f"loop {loop} is a reduction loop; blocks cannot share an accumulator")
    if thread.startswith("blockIdx") and owner.attach is not None:
        # The grid is launched by the root block of a kernel; an attached block runs inside its host's
        # loops, in every CUDA block, so it has no grid dimension of its own (the build would refuse it).
        root = func.root_of(owner)
        fail(prim, "loop", loop, f"block {owner.name} is attached inside {owner.attach.block}; only the "
             f"outermost block of a kernel ({root.name}) may bind blockIdx")
    if thread.startswith("threadIdx"):
        ext = as_int(lp.extent)
        if ext is None:
            fail(prim, "loop", loop, f"has symbolic extent {lp.extent}; thread extents must be constants")
        limit = MAX_THREAD_DIM[thread]
        if ext > limit:
            fail(prim, "loop", loop, f"extent {ext} exceeds the {limit} threads CUDA allows along {thread}")
        dims = _kernel_threads(func, owner.name)
        dims[thread] = max(dims.get(thread, 1), ext)
        if math.prod(dims.values()) > MAX_THREADS:
            shape = " x ".join(f"{t} {n}" for t, n in sorted(dims.items()))
            fail(prim, "loop", loop, f"the kernel's thread block would be {shape} = {math.prod(dims.values())} "
                 f"threads, more than {MAX_THREADS}")
    for other in owner.loops:
        if other.thread == thread:
            fail(prim, "thread", thread, f"block {owner.name} already binds {other.name} to it")
    # A block inside another block's thread loop may bind the same tag again (a cooperative copy spreads
    # its own elements over the threads) only if its axes do not depend on that outer loop: one thread
    # index cannot stand for both loops at once.
    for _, outer in func.enclosing_loops(owner):
        if outer.thread == thread and any(outer.name in free_vars(b) for b in owner.bindings):
            fail(prim, "thread", thread, f"block {owner.name} runs inside {outer.name}, which is bound to "
                 f"{thread}, and its axes depend on {outer.name}; bind another tag")
    return _replace_loop(func, loop, thread=thread), None


def vectorize(func: Func, loop: str) -> tuple[Func, None]:
    """Mark the innermost loop of a block for vector loads/stores (float4, half2, ...).

    A copy becomes one vector access per thread; a block that computes loads its reads wide into registers
    and, when spatial, stores its result the same way.  A reduce loop may be vectorized too: its reads are
    widened and the fold keeps its order, so the result does not change.  Accesses whose alignment cannot be
    proved stay scalar (see ``schedlib.codegen.vector_access``).

    Before ``vectorize(f, "C.j_1")``::

        for C.i in range(4):
          for C.j_0 in range(2):
            for C.j_1 in range(4):
              block C SS (i=C.i, j=C.j_0 * 4 + C.j_1):
                C[i, j] = A[i, j] + 1.0

    After::

        for C.i in range(4):
          for C.j_0 in range(2):
            for C.j_1 in range(4):  # vectorize
              block C SS (i=C.i, j=C.j_0 * 4 + C.j_1):
                C[i, j] = A[i, j] + 1.0
    """
    prim = "vectorize"
    owner, idx = get_loop(func, prim, loop)
    lp = owner.loops[idx]
    if idx != len(owner.loops) - 1:
        fail(prim, "loop", loop, f"is not the innermost loop of block {owner.name}")
    ext = as_int(lp.extent)
    if ext is None or ext > MAX_VECTOR:
        fail(prim, "loop", loop, f"extent {lp.extent} must be a constant of at most {MAX_VECTOR}")
    if lp.thread:
        fail(prim, "loop", loop, f"is bound to {lp.thread}")
    if lp.unrolled:
        # As unroll refuses a vectorized loop: a loop is realised one way or the other, not both.
        fail(prim, "loop", loop, "is unrolled")
    if "unroll_limit" in dict(lp.annotations):
        fail(prim, "loop", loop, "has an unroll_limit; a vectorized loop is unrolled whole")
    if func.attached_at(owner.name, loop):
        fail(prim, "loop", loop, "has blocks attached to it")
    return _replace_loop(func, loop, vectorized=True), None


def unroll(func: Func, loop: str) -> tuple[Func, None]:
    """Ask for the loop, which must have a constant extent, to be fully unrolled.

    Before ``unroll(f, "C.k_1")``::

        for C.i in range(8):
          for C.k_0 in range(4):
            for C.k_1 in range(4):
              block C SR (i=C.i, k=C.k_0 * 4 + C.k_1):
                init C[i] = 0.0
                C[i] += A[i, k]

    After::

        for C.i in range(8):
          for C.k_0 in range(4):
            for C.k_1 in range(4):  # unroll
              block C SR (i=C.i, k=C.k_0 * 4 + C.k_1):
                init C[i] = 0.0
                C[i] += A[i, k]
    """
    prim = "unroll"
    owner, idx = get_loop(func, prim, loop)
    lp = owner.loops[idx]
    if lp.vectorized:
        fail(prim, "loop", loop, "is vectorized")
    if lp.thread:
        fail(prim, "loop", loop, f"is bound to {lp.thread}")
    if as_int(lp.extent) is None:
        fail(prim, "loop", loop, f"has symbolic extent {lp.extent}; only a loop of constant extent can be "
             "fully unrolled")
    return _replace_loop(func, loop, unrolled=True), None


def _check_value(prim: str, value: Any) -> None:
    if not isinstance(value, (int, float, str, bool)):
        fail(prim, "value", value, "must be an int, float, str or bool (a JSON scalar)")
    if isinstance(value, float) and not math.isfinite(value):
        fail(prim, "value", value, "must be finite: JSON has no NaN or infinity, so the trace could not replay it")


# The annotation keys the code generator reads; any other identifier is a note, printed with the nest.
GENERATOR_KEYS = ("tensor_core", "pipeline_stages", "raster", "producer", "loader", "unroll_limit", DOUBLE_BUFFER)
# Read only by the tensor-core lowering (a root block annotated tensor_core); elsewhere the build refuses them.
TENSOR_CORE_KEYS = ("pipeline_stages", "raster", "producer", "loader")
UNROLL_LIMIT_MAX = 1024
# What the code generator accepts for them (it checks again when it lowers): counts in 1..16, or one of the
# names of the lowerings (codegen's MMA_SHAPE, LOADER and PRODUCER; a test holds the two in step).
GENERATOR_COUNTS = ("pipeline_stages", "raster")
GENERATOR_NAMES = {"tensor_core": ("m16n8k16", "wgmma"), "loader": ("tma",), "producer": ("warp",)}


def _check_generator_value(prim: str, key: str, value: Any) -> None:
    """A value the code generator would refuse at build time is refused here, where the call is."""
    if key in GENERATOR_COUNTS and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 16):
        fail(prim, "value", value, f"{key} must be an integer in 1..16")
    if key in GENERATOR_NAMES and value not in GENERATOR_NAMES[key]:
        fail(prim, "value", value, f"{key} must be one of {list(GENERATOR_NAMES[key])}")
    if key == "unroll_limit" and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= UNROLL_LIMIT_MAX):
        fail(prim, "value", value, f"unroll_limit must be an integer in 1..{UNROLL_LIMIT_MAX} (iterations unrolled "
             "at a time; the unroll primitive unrolls a loop whole)")


def _one_edit_apart(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one letter changed, added, dropped, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _check_key(prim: str, key: Any) -> None:
    if not isinstance(key, str) or not key.isidentifier():
        fail(prim, "key", key, "must be an identifier string")
    if key == DOUBLE_BUFFER:
        fail(prim, "key", key, "is set by the double_buffer primitive, which checks the copy it applies to")
    # One slip from a long key the generator reads is a typo that would silently change nothing; shorter or
    # more distant keys (``master``, ``pipeline_steps``) are taken as the notes they may well be.
    near = [k for k in GENERATOR_KEYS[:-1] if len(k) >= 8 and _one_edit_apart(key, k)]
    if near:
        fail(prim, "key", key, f"is one typo away from {near[0]!r}, which the code generator reads: a typo would "
             f"change nothing (keys it reads: {', '.join(GENERATOR_KEYS[:-1])}; pick a note name further away)")


def annotate(func: Func, target: str, key: str, value: Any) -> tuple[Func, None]:
    """Attach a ``key=value`` hint to a block or loop (e.g. ``pipeline_stages=2`` on a reduction loop).

    Before ``annotate(f, "C.k_0", "pipeline_stages", 2)``::

        for C.i in range(8):
          for C.k_0 in range(4):
            for C.k_1 in range(4):
              block C SR (i=C.i, k=C.k_0 * 4 + C.k_1):
                init C[i] = 0.0
                C[i] += A[i, k]

    After::

        for C.i in range(8):
          for C.k_0 in range(4):  # pipeline_stages=2
            for C.k_1 in range(4):
              block C SR (i=C.i, k=C.k_0 * 4 + C.k_1):
                init C[i] = 0.0
                C[i] += A[i, k]

    On a block the hint follows its header: ``block C SR (...):  # pipeline_stages=2``.

    The code generator reads the keys in :data:`GENERATOR_KEYS` (``double_buffer`` is set only by its own
    primitive): ``unroll_limit=N`` on a loop unrolls it N iterations at a time (``#pragma unroll N``), and
    the tensor-core keys (:data:`TENSOR_CORE_KEYS`) are read under a root annotated ``tensor_core`` (the
    build refuses them elsewhere, where they would change nothing).  Any other identifier is kept as a note.
    A key one slip (a letter changed, added, dropped or swapped) from a generator key of 8 letters or more
    (``pipline_stages``) is refused as the typo it most likely is, since it would change nothing.
    """
    prim = "annotate"
    _check_key(prim, key)
    _check_value(prim, value)
    _check_generator_value(prim, key, value)
    if isinstance(target, str) and func.has_block(target):
        if key == "unroll_limit":
            fail(prim, "target", target, "unroll_limit applies to a loop, not a block")
        blk = func.block(target)
        ann = (*((k, v) for k, v in blk.annotations if k != key), (key, value))
        return func.with_block(replace(blk, annotations=ann)), None
    owner, idx = get_loop(func, prim, target, "target")
    if key == "unroll_limit" and (owner.loops[idx].thread or owner.loops[idx].vectorized):
        fail(prim, "target", target, "is bound to the grid or vectorized: it has no loop to unroll")
    ann = (*((k, v) for k, v in owner.loops[idx].annotations if k != key), (key, value))
    return _replace_loop(func, target, annotations=ann), None
