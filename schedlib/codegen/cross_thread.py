"""Cross-thread reductions: a reduce loop bound to a thread index.

Each thread folds its share of the reduction into a register; then the partials are combined with warp
shuffles when the group is a power of two within a warp, shuffles plus shared memory across warps when it
spans whole warps, and a shared-memory fold otherwise.  Mixed into :class:`KernelWriter`, whose emission
helpers (``_emit``, ``_open``, ``_sync`` ...) it uses.

Spatial loops inside the reduction ("lanes") give each thread several results: it keeps one partial per
lane point, reads all of them in one pass over its share (one vector load when the lanes are contiguous and
vectorized), and combines each across threads afterwards::

    float sl_lanes[2] = {0, 0};
    for k in this thread's rows:  sl_lanes[n_2] += X[k] * W[k, n + n_2]   (n_2 = 0, 1: one 4-byte load)
    for each lane: combine across threadIdx.y, then store

rather than one pass over the rows per result, which reads every row's cache line once per result.
"""

from __future__ import annotations

import math
from typing import Any

from schedlib.codegen.cuda_expr import compute_type, ctype, literal, mangle, unroll_pragma
from schedlib.errors import BuildError
from schedlib.ir.expr import as_int
from schedlib.ir.func import MAX_LANES, THREAD_INDEX_TAGS, Block, Loop
from schedlib.ir.simplify import conjuncts, free_vars
from schedlib.ir.tensor import identity

THREAD_TAGS = THREAD_INDEX_TAGS


class CrossThreadReduction:
    """Emission of blocks whose reduction loop is bound to ``threadIdx.*``."""

    func: Any
    threads: dict[str, int]
    n_threads: int
    n_red: int
    scratch_arrays: list[tuple[str, str, int]]
    vector_regs: dict[Any, str]

    def _reduction_region(self, block: Block) -> int | None:
        """Index of the first reduce loop when some reduce loop is bound to a thread index."""
        if block.reducer is None:
            return None
        kinds = [block.loop_kind(lp.name) for lp in block.loops]
        if not any(k == "R" and lp.thread in THREAD_TAGS for k, lp in zip(kinds, block.loops)):
            return None
        for lp in block.loops:
            driven = {a.kind for a, b in zip(block.axes, block.bindings) if lp.name in free_vars(b)}
            if lp.thread in THREAD_TAGS and driven == {"S", "R"}:
                raise BuildError(f"block {block.name}: loop {lp.name} bound to {lp.thread} drives spatial and reduce "
                                 "axes at once (a fused S x R loop); a cross-thread reduction combines over reduce "
                                 "axes only: split or reorder so that the bound loop is reduce-only")
        start = kinds.index("R")
        self._lanes(block, start)
        for lp in block.loops[start:]:
            if self.func.attached_at(block.name, lp.name):
                inner = ", ".join(b.name for b in self.func.attached_at(block.name, lp.name))
                raise BuildError(f"block {block.name}: {inner} is attached at {lp.name}, inside its cross-thread "
                                 f"reduction (the threads combine once, after every reduce loop); attach it at a "
                                 f"loop outside the reduce loops (the blockIdx loop), or leave it unattached")
        return start

    def _lanes(self, block: Block, start: int) -> list[Loop]:
        """The spatial loops inside a cross-thread reduction: each thread keeps one partial result per point
        of them (a GEMV thread owning neighbouring columns, or a small batch of vectors, reads the shared
        operand once for all of them, then reduces each)."""
        lanes = [lp for lp in block.loops[start:] if block.loop_kind(lp.name) == "S"]
        points = 1
        for lp in lanes:
            ext = as_int(lp.extent)
            points *= ext or 0
            if lp.thread or ext is None or points > MAX_LANES:
                raise BuildError(f"block {block.name}: spatial loop {lp.name} lies inside a cross-thread "
                                 "reduction; move it outside the reduction loops, or keep it unbound and of "
                                 f"constant extent, at most {MAX_LANES} results per thread in all")
        return lanes

    def _for(self, lp: Loop, lane: bool = False) -> None:
        """A loop of the reduction; lane loops are always unrolled, so that ``sl_lanes`` stays in registers."""
        v = mangle(lp.name)
        pragma = unroll_pragma(lp, whole=lane)
        if pragma:
            self._emit(pragma)
        self._open(f"for (int {v} = 0; {v} < {self.printer(lp.extent)}; ++{v})")

    def _cross_thread_reduction(self, block: Block, start: int, ctx: Any) -> None:
        lanes = self._lanes(block, start)
        region = [lp for lp in block.loops[start:] if lp not in lanes]
        tags = sorted({lp.thread for lp in region if lp.thread in THREAD_TAGS})
        if len(tags) != 1:
            raise BuildError(f"block {block.name}: a cross-thread reduction must use one thread index, got {tags}")
        ctx.refuse_barrier(f"block {block.name}: a cross-thread reduction", "its barriers")
        tag = tags[0]
        dtype = block.value.dtype
        acc = compute_type(dtype)
        init = literal(identity(block.reducer, dtype).value, dtype)
        n_lanes = math.prod(as_int(lp.extent) or 1 for lp in lanes)
        partial = "sl_red"  # this thread's partial result, one per lane point when there are lanes
        if lanes:
            lane = mangle(lanes[0].name)
            for lp in lanes[1:]:
                lane = f"({lane} * {as_int(lp.extent)} + {mangle(lp.name)})"
            partial = f"sl_lanes[{lane}]"
            self._open(f"// block {block.name}: cross-thread reduction over {tag}, {n_lanes} results per thread")
            self._emit(f"{acc} sl_lanes[{n_lanes}];")
            self._emit("#pragma unroll")
            self._emit(f"for (int sl_l = 0; sl_l < {n_lanes}; ++sl_l) sl_lanes[sl_l] = {init};")
        else:
            self._open(f"// block {block.name}: cross-thread reduction over {tag}")
            self._emit(f"{acc} sl_red = {init};")
        braces = 0
        # A vectorized innermost loop: its reads are loaded wide, once, before the loop.
        innermost = block.loops[-1]
        plan = self._vector_plan(block, innermost) if innermost.vectorized else None
        for lp in block.loops[start:]:
            v = mangle(lp.name)
            if plan is not None and lp is plan.loop:
                braces += self._open_vector_loads(plan, [])
            if lp.thread in THREAD_TAGS:
                self._open("")
                self._emit(f"const int {v} = {lp.thread};")
                braces += 1
                if (as_int(lp.extent) or 0) < self.threads[lp.thread]:
                    self._open(f"if ({v} < {self.printer(lp.extent)})")
                    braces += 1
            else:
                self._for(lp, lp in lanes)
                braces += 1
        self._open("")
        self._enter(block)
        value = self._expr(block.value)
        update = f"{partial} = {self._combine(block.reducer, partial, value, dtype)};"
        if block.predicate is not None:
            update = f"if ({self._expr(block.predicate)}) {update}"
        self._emit(update)
        self.vector_regs = {}
        self._close(braces + 1)
        if lanes:  # one combine across threads per lane point, through the same scratch
            self._emit("#pragma unroll")
            self._open(f"for (int sl_l = 0; sl_l < {n_lanes}; ++sl_l)")
            self._emit(f"{acc} sl_red = sl_lanes[sl_l];")
            self._allreduce(block.reducer, dtype, tag)
            self._emit("sl_lanes[sl_l] = sl_red;")
            self._close()
        else:
            self._allreduce(block.reducer, dtype, tag)
        self._open("")
        for lp in lanes:
            self._for(lp, lane=True)
        region_vars = {lp.name for lp in region} | {a.name for a in block.axes if a.kind == "R"}
        spatial = [p for p in conjuncts(block.predicate) if not free_vars(p) & region_vars]
        conds = [self._expr(p) for p in spatial]
        buf, target = self._store(block)
        if buf.scope != "local":
            conds.append(f"{tag} == 0")
        conds += self._once_guards(block, ctx, skip=tag)
        result = partial
        if block.init is None:
            result = self._combine(block.reducer, f"static_cast<{acc}>({target})", partial, dtype)
        line = f"{target} = static_cast<{ctype(buf.dtype)}>({result});"
        self._emit(f"if ({' && '.join(conds)}) {line}" if conds else line)
        self._close(2 + len(lanes))

    def _lane_mask(self, linear: str) -> str:
        """The lanes of this thread's warp that exist.  shfl.sync waits for every non-exited lane its mask
        names, and the lanes a partial last warp never launched are not documented as exited: a block of 48
        threads names 16 lanes in its second warp."""
        n = self.n_threads
        if n < 32:
            return f"{(1 << n) - 1}u"
        if n % 32 == 0:
            return "0xffffffffu"
        return f"({linear} < {n // 32 * 32} ? 0xffffffffu : {(1 << (n % 32)) - 1}u)"

    def _allreduce(self, reducer: str, dtype: str, tag: str) -> None:
        size = self.threads[tag]
        acc = compute_type(dtype)
        pow2 = size & (size - 1) == 0
        dx, dy = self.threads["threadIdx.x"], self.threads["threadIdx.y"]
        linear = f"(threadIdx.x + {dx} * (threadIdx.y + {dy} * threadIdx.z))"
        if tag == "threadIdx.x" and pow2 and size <= 32:
            self._emit("#pragma unroll")
            partner = f"__shfl_xor_sync({self._lane_mask(linear)}, sl_red, sl_off, {size})"
            self._emit(f"for (int sl_off = {size // 2}; sl_off > 0; sl_off >>= 1) "
                       f"sl_red = {self._combine(reducer, 'sl_red', partner, dtype)};")
            return
        self.n_red += 1
        buf = f"sl_red_buf{self.n_red}"
        if tag == "threadIdx.x" and pow2 and size % 32 == 0:
            warps = size // 32
            self.scratch_arrays.append((acc, buf, max(self.n_threads // 32, 1)))
            self._emit("#pragma unroll")
            partner = "__shfl_xor_sync(0xffffffffu, sl_red, sl_off, 32)"
            self._emit(f"for (int sl_off = 16; sl_off > 0; sl_off >>= 1) "
                       f"sl_red = {self._combine(reducer, 'sl_red', partner, dtype)};")
            row = f"({linear} / {size}) * {warps}"
            self._emit(f"if (threadIdx.x % 32 == 0) {buf}[{row} + threadIdx.x / 32] = sl_red;")
            self._sync()
            self._emit(f"sl_red = {buf}[{row}];")
            self._emit(f"for (int sl_w = 1; sl_w < {warps}; ++sl_w) "
                       f"sl_red = {self._combine(reducer, 'sl_red', f'{buf}[{row} + sl_w]', dtype)};")
            self._sync()
            return
        # General case: every thread publishes its partial, then folds its group's partials in order.
        self.scratch_arrays.append((acc, buf, self.n_threads))
        stride = {"threadIdx.x": 1, "threadIdx.y": dx, "threadIdx.z": dx * dy}[tag]
        self._emit(f"{buf}[{linear}] = sl_red;")
        self._sync()
        base = f"({linear} - {tag} * {stride})"
        self._emit(f"sl_red = {buf}[{base}];")
        self._emit(f"for (int sl_j = 1; sl_j < {size}; ++sl_j) "
                   f"sl_red = {self._combine(reducer, 'sl_red', f'{buf}[{base} + sl_j * {stride}]', dtype)};")
        self._sync()

