"""Vector loads and stores for the innermost loop of a block marked ``vectorize``.

A plain copy becomes one ``SL_VLOAD``/``SL_VSTORE`` per thread (``_vector_copy``).  Any other block gets
the same wide accesses through registers (``_vector_statement``): every read whose flat index is provably
``base + v`` with ``base`` a multiple of the width is loaded once, before the loop, into a 16-byte aligned
register array; the loop runs unrolled on the registers; and a spatial block's result, gathered in another
register array, is stored with one vector store after it.  A vectorized reduce loop keeps its order: only its
reads are widened, so the sum is the same as the scalar loop's, bit for bit.

Before (``vectorize(C.k_2)``, a GEMV row of 8 fp16 per thread)::

    for (int C_k_2 = 0; C_k_2 < 8; ++C_k_2)
      sl_red = sl_red + float(X[k0 + C_k_2]) * float(W[n * 4096 + k0 + C_k_2]);   // 16 2-byte loads

After::

    __align__(16) half sl_vec1[8];  SL_VLOAD_REGS(uint4, sl_vec1, X, k0);
    __align__(16) half sl_vec2[8];  SL_VLOAD_REGS(uint4, sl_vec2, W, n * 4096 + k0);   // 2 16-byte loads
    for (int C_k_2 = 0; C_k_2 < 8; ++C_k_2)
      sl_red = sl_red + float(sl_vec1[C_k_2]) * float(sl_vec2[C_k_2]);

Why the loads are hoisted rather than left for nvcc to merge: nvcc cannot prove a pointer parameter 16-byte
aligned, so it keeps 2-byte loads; the alignment proof here (:mod:`schedlib.codegen.vectorize`) plus the
runtime's 16-byte aligned arguments are what make one wide load legal.  Reads that the proof does not cover
(a symbolic row stride, a ragged predicate) stay scalar, as do reads of registers and of the stored buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from schedlib.codegen.cuda_expr import ctype, mangle, stored
from schedlib.codegen.vectorize import VECTOR_TYPES, aligned_base, uniform_guard
from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Binary, Const, Expr, Load, Select, as_int
from schedlib.ir.func import Block, Buffer, Loop
from schedlib.ir.layout import strides
from schedlib.ir.simplify import children, free_vars, loads, simplify, substitute


@dataclass(frozen=True)
class _Access:
    """One widened access: ``regs[0:width]`` holds ``buffer[base : base + width]``."""

    buffer: str
    base: Expr
    regs: str
    ctype: str
    vtype: str


@dataclass(frozen=True)
class VectorPlan:
    loop: Loop
    width: int
    guards: tuple[Expr, ...]  # uniform over the loop: each holds for every lane iff it holds for lane 0
    reads: dict[Load, _Access]  # key: the read as printed (bindings substituted, simplified)
    store: _Access | None  # the block's result, gathered in registers and stored once


class VectorAccess:
    """Planning and emission of register-staged vector accesses; mixed into :class:`KernelWriter`."""

    func: Any
    bindings: dict[str, Expr]
    ranges: dict[str, tuple[int, int]]
    vector_regs: dict[Load, str]
    n_vec: int
    staging: tuple[str, str] | None  # a double-buffered copy being written as its load or its store half
    _staged_bounds: Any  # the double-buffer mixin's: a copy's bounds guards for the half being written
    _guards: Any  # the writer's: a block's predicate in loop terms, less what needs no check here

    def _uniform_guards(self, block: Block, lp: Loop, width: int) -> list[Expr] | None:
        """The block's predicate as guards that hold or fail for all ``width`` points of ``lp`` at once (so
        they can guard one vector access); None when some part of it can split a vector."""
        self._enter(block)
        guards = [uniform_guard(g, lp.name, width) for g in self._guards(block)]
        return None if any(g is None for g in guards) else guards  # type: ignore[return-value]

    def _vector_copy(self, block: Block, lp: Loop, ctx: Any) -> bool:
        """Emit a vectorized copy as one aligned 4/8/16-byte access; False when that is not provable."""
        width = as_int(lp.extent)
        buf = self.func.buffer(block.store)
        if block.reducer is not None or not isinstance(block.value, Load) or width is None:
            return False
        src = self.func.buffer(block.value.buffer)
        vtype = VECTOR_TYPES.get(width * BYTES[buf.dtype])
        if src.dtype != buf.dtype or vtype is None:
            return False
        guards = self._uniform_guards(block, lp, width)
        dst_base = self._aligned_base(buf, block.store_indices, lp, width)
        src_base = self._aligned_base(src, block.value.indices, lp, width)
        if dst_base is None or src_base is None or guards is None:
            return False
        conds = [self.printer(g) for g in self._staged_bounds(block, guards)] + self._once_guards(block, ctx)
        dst, src_at = f"{mangle(buf.name)}, {self.printer(dst_base)}", f"{mangle(src.name)}, {self.printer(src_base)}"
        if self.staging:  # a double-buffered copy, split into its load or its store
            copy = self._staged_vector(block, lp, vtype, dst, src_at)
        else:
            copy = f"SL_VSTORE({vtype}, {dst}, SL_VLOAD({vtype}, {src_at}));"
        self._emit(f"// block {block.name}: {width}-wide vector copy")
        self._emit(f"if ({' && '.join(conds)}) {copy}" if conds else copy)
        return True

    def _aligned_base(self, buf: Buffer, indices: tuple[Expr, ...], lp: Loop, width: int) -> Expr | None:
        """Flat index of lane 0 when the ``width`` lanes of ``lp`` access ``buf[base : base + width]`` with
        ``base`` a multiple of ``width``; else None."""
        flat = self._flat(buf, indices)
        base = aligned_base(flat, lp.name, width)
        if base is not None or not buf.permute:
            return base
        # A storage_permute that keeps its innermost digit innermost moves aligned runs of that digit whole.
        # Its div/mod arithmetic defeats the proof above, so prove the run on the plain layout and place
        # lane 0.  With the last dimension and the row stride multiples of the width, an aligned run of the
        # plain layout lies in one row, so the lanes move the last index only, within one run.
        last = len(buf.shape) - 1
        for dim, factors, order in buf.permute:
            if dim == last and (order[-1] != len(factors) - 1 or factors[-1] % width):
                return None
        extent, row = as_int(buf.shape[last]), as_int(strides(buf)[last - 1]) if last else width
        if extent is None or row is None or extent % width or row % width:
            return None
        if aligned_base(self._flat(replace(buf, permute=()), indices), lp.name, width) is None:
            return None
        return simplify(substitute(flat, {lp.name: Const(0)}), self.ranges)

    def _widen(self, buffer: str, indices: tuple[Expr, ...], lp: Loop, width: int) -> _Access | None:
        buf = self.func.buffer(buffer)
        vtype = VECTOR_TYPES.get(width * BYTES[buf.dtype])
        if vtype is None or buf.scope == "local":
            return None
        base = self._aligned_base(buf, indices, lp, width)
        if base is None:
            return None
        self.n_vec += 1
        return _Access(buffer, base, f"sl_vec{self.n_vec}", ctype(buf.dtype), vtype)

    def _vector_plan(self, block: Block, lp: Loop) -> VectorPlan | None:
        """Which reads (and the store) of ``block`` widen over its innermost loop ``lp``; None when none do,
        or when the block's predicate does not hold or fail for a whole vector at once."""
        width = as_int(lp.extent)
        if width is None or width < 2 or self.func.attached_at(block.name, lp.name):
            return None
        guards = self._uniform_guards(block, lp, width)
        if guards is None:
            return None
        value = simplify(substitute(block.value, self.bindings), self.ranges)
        guarded = _guarded_loads(value)
        reads: dict[Load, _Access] = {}
        for ld in loads(value):
            if ld in reads or ld in guarded or ld.buffer == block.store or lp.name not in free_vars(ld):
                continue
            access = self._widen(ld.buffer, ld.indices, lp, width)
            if access is not None:
                reads[ld] = access
        store = None
        # Gathering the results in registers delays their stores past the loop: not for a block that reads
        # what it writes (a later lane would read memory its predecessor has not stored yet).
        if block.reducer is None and all(ld.buffer != block.store for ld in loads(value)):
            store = self._widen(block.store, block.store_indices, lp, width)
        if not reads and store is None:
            return None
        return VectorPlan(lp, width, tuple(guards), reads, store)

    def _open_vector_loads(self, plan: VectorPlan, extra_conds: list[str]) -> int:
        """Declare the register arrays and load them; returns how many braces the caller closes (the
        guard's).  Reads inside the loop then print as register elements."""
        accesses = [*plan.reads.values(), *([plan.store] if plan.store else [])]
        for a in accesses:
            self._emit(f"__align__(16) {a.ctype} {a.regs}[{plan.width}];")
        conds = [self.printer(g) for g in plan.guards] + extra_conds
        braces = 0
        if conds:
            self._open(f"if ({' && '.join(conds)})")
            braces = 1
        for a in plan.reads.values():
            self._emit(f"SL_VLOAD_REGS({a.vtype}, {a.regs}, {mangle(a.buffer)}, {self.printer(a.base)});")
        v = mangle(plan.loop.name)
        self.vector_regs = {ld: f"{a.regs}[{v}]" for ld, a in plan.reads.items()}
        return braces

    def _close_vector_loads(self, plan: VectorPlan, braces: int) -> None:
        self.vector_regs = {}
        if plan.store is not None:
            a = plan.store
            self._emit(f"SL_VSTORE_REGS({a.vtype}, {mangle(a.buffer)}, {self.printer(a.base)}, {a.regs});")
        self._close(braces)

    def _vector_statement(self, block: Block, lp: Loop, ctx: Any) -> bool:
        """Emit ``block`` under its innermost vectorized loop ``lp`` with widened accesses; False when
        nothing widens (the caller then emits an unrolled scalar loop)."""
        plan = self._vector_plan(block, lp)
        if plan is None:
            return False
        names = ", ".join(dict.fromkeys(a.buffer for a in plan.reads.values()))
        what = [f"loads of {names}"] if names else []
        what += [f"a store of {plan.store.buffer}"] if plan.store else []
        self._open(f"// block {block.name}: {plan.width}-wide {' and '.join(what)}")
        braces = self._open_vector_loads(plan, self._once_guards(block, ctx))
        v = mangle(lp.name)
        self._emit("#pragma unroll")
        self._open(f"for (int {v} = 0; {v} < {plan.width}; ++{v})")
        self._enter(block)
        if plan.store is not None:
            value = self._expr(stored(block.value, self.func.buffer(plan.store.buffer).dtype))
            self._emit(f"{plan.store.regs}[{v}] = static_cast<{plan.store.ctype}>({value});")
        else:
            self._assign(block, self._expr(block.value))
        self._close()
        self._close_vector_loads(plan, braces)
        self._close()
        return True


def _guarded_loads(e: Expr) -> set[Load]:
    """Loads that run only under a condition (a select's branches, the right side of ``and``/``or``): a
    vector load reads all ``width`` elements up front, before and whatever the guard says (a pad op's
    ``if_then_else(i < n, X[i], 0)`` read beyond the end of X, whether the condition varies along the vector
    or with an outer loop, ``if_then_else(row < 3, X[row, j], 0)``)."""
    out: set[Load] = set()

    def visit(x: Expr, guarded: bool) -> None:
        if isinstance(x, Load):
            if guarded:
                out.add(x)
            for i in x.indices:
                visit(i, guarded)
        elif isinstance(x, Select):
            visit(x.cond, guarded)
            branch = guarded or not isinstance(x.cond, Const)
            visit(x.then, branch)
            visit(x.other, branch)
        elif isinstance(x, Binary) and x.op in ("and", "or"):
            visit(x.a, guarded)
            visit(x.b, guarded or not isinstance(x.a, Const))
        else:
            for child in children(x):
                visit(child, guarded)

    visit(e, False)
    return out
