"""Writes one CUDA kernel for one root block of a scheduled Func (the root and all blocks attached in it).

How the sequential loop nest maps to CUDA:

* a loop bound to ``blockIdx.*``/``threadIdx.*`` becomes that index (guarded when its extent is smaller
  than the launch dimension); a nested loop bound to the same thread index is the same thread (the
  cooperative copy of a shared tile);
* a statement that no loop binds to some launched thread or block dimension would run redundantly in every
  thread; when it writes shared or global memory it is guarded to run once (``threadIdx.x == 0``);
* ``__syncthreads()`` surrounds every attached block that reads or writes shared memory (or a global
  scratch buffer), so a tile is complete before it is read and not overwritten while being read;
* a reduction whose reduce loop is bound to a thread index is a cross-thread reduction: each thread folds
  its share into a register, then warp shuffles (and shared memory across warps) combine them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from schedlib.codegen.cross_thread import CrossThreadReduction
from schedlib.codegen.cuda_expr import ExprPrinter, compute_type, ctype, float_min_max, mangle, stored, unroll_pragma
from schedlib.codegen.double_buffer import DoubleBuffer, is_double_buffered
from schedlib.codegen.guards import StatementGuards
from schedlib.codegen.kernel_spec import KernelSpec
from schedlib.codegen.loop_versioning import LoopVersioning
from schedlib.codegen.vector_access import VectorAccess
from schedlib.errors import BuildError
from schedlib.ir.dtype import BYTES, is_float
from schedlib.ir.expr import Const, Expr, Load, as_int, binary
from schedlib.ir.func import GRID_YZ_LIMIT, THREAD_INDEX_TAGS, Block, Buffer, Func, Loop
from schedlib.ir.layout import flatten, size_elements
from schedlib.ir.simplify import free_vars, loads, simplify, substitute, var_ranges

STATIC_SMEM_LIMIT = 48 * 1024
SYMBOL_PREFIX = "$"  # launch parameters that are symbolic sizes, not buffers
THREAD_TAGS = THREAD_INDEX_TAGS
BLOCK_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")


def _fits_grid(extent: Expr) -> bool:
    """Whether a blockIdx.y/z extent fits the grid.  A symbolic one is taken to: the grid-stride loop costs
    registers in every kernel (a symbolic-M matmul spilled on sm_80), and the launch refuses a grid past
    the limit with the shapes that caused it (``LaunchSpec.grid_for``)."""
    value = as_int(extent)
    return value is None or value <= GRID_YZ_LIMIT


@dataclass
class _Ctx:
    bound: dict[str, str] = field(default_factory=dict)  # tag -> loop name of the enclosing binding
    divergent: bool = False  # inside a thread guard: no barrier may be placed here

    def refuse_barrier(self, what: str, barriers: str) -> None:
        """Refuse ``what`` here when it needs a barrier of the whole block and this is inside a thread guard:
        the threads the guard leaves out never arrive, so the barrier would wait for ever."""
        if self.divergent:
            raise BuildError(f"{what} inside a thread guard (a thread loop shorter than the launch); {barriers} "
                             "would deadlock")


class KernelWriter(CrossThreadReduction, VectorAccess, DoubleBuffer, LoopVersioning, StatementGuards):
    def __init__(self, func: Func, root: Block, scratch: set[str]) -> None:
        self.func = func
        self.root = root
        self.blocks = func.subtree(root.name, 0)
        self.names = {b.name for b in self.blocks}
        self.name = mangle(f"{func.name}_{root.name}")
        self.scratch = scratch
        self.lines: list[str] = []
        self.scratch_arrays: list[tuple[str, str, int]] = []  # (C type, name, elements) for reductions
        self.depth = 1
        self.last_sync = False
        self.n_red = 0
        self.n_vec = 0
        self.vector_regs: dict[Load, str] = {}  # reads staged in registers by a vectorized loop
        self.slot_of: dict[str, str] = {}
        self.db_loop: str | None = None
        self.staging: tuple[str, str] | None = None
        self.staged_types: dict[str, tuple[str, bool]] = {}
        self.assumed: frozenset[Expr] = frozenset()
        self.needed_guards: dict[str, list[Expr]] = {}
        self.rolled: str | None = None
        self.double_buffered = {b.store for b in self.blocks if is_double_buffered(b)}
        # outputs one block of this kernel stores and another of it reads back (a row statistic): as scratch,
        # the threads meet at a barrier between the store and the reads (another kernel's: done at launch)
        self.passed_outputs = {n for b in self.blocks for n in b.read_buffers if n in func.outputs
                               and any(p.name != b.name and p.name in self.names for p in func.producers(n))}
        self.bindings: dict[str, Expr] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        # A dimension may share its name with a buffer (sl.var("R") sizing buffer R): rename the int.
        buffers = {mangle(b.name) for b in func.buffers}
        self.symbol_names = {sym: mangle(sym) + ("_dim" if mangle(sym) in buffers else "") for sym in func.symbols}
        self.printer = ExprPrinter(self._load, self._var)
        self._launch()
        self._buffers()

    # setup ------------------------------------------------------------------------------------
    def _launch(self) -> None:
        self.threads = dict.fromkeys(THREAD_TAGS, 1)
        self.grid: dict[str, Expr] = {}
        self.strided: set[str] = set()  # blockIdx.y/z loops that may exceed the grid limit: grid-stride loops
        self.uses_shared = any(self.func.buffer(b.store).scope == "shared" for b in self.blocks)
        for b in self.blocks:
            for lp in b.loops:
                if lp.thread in THREAD_TAGS:
                    self.threads[lp.thread] = max(self.threads[lp.thread], as_int(lp.extent) or 1)
                elif lp.thread in BLOCK_TAGS:
                    if b is not self.root:
                        raise BuildError(f"block {b.name} binds {lp.name} to {lp.thread}, but only the "
                                         f"outermost block of a kernel ({self.root.name}) may bind blockIdx")
                    self.grid[lp.thread] = lp.extent
                    if lp.thread != "blockIdx.x" and not _fits_grid(lp.extent):
                        # y and z stop at 65535 blocks: launch at most that many and let each block stride
                        # over the rest (a batch of 70,000 matrices, a transpose of a 2^21-row input)
                        self.grid[lp.thread] = binary("min", lp.extent, Const(GRID_YZ_LIMIT))
                        self.strided.add(lp.thread)
        if self.threads["threadIdx.z"] > 64:
            raise BuildError(f"kernel {self.name}: threadIdx.z extent {self.threads['threadIdx.z']} exceeds 64")
        self.n_threads = math.prod(self.threads.values())
        if self.n_threads > 1024:
            raise BuildError(f"kernel {self.name}: {self.n_threads} threads per block exceed 1024")

    def _buffers(self) -> None:
        used: set[str] = set()
        for b in self.blocks:
            used.add(b.store)
            used.update(b.read_buffers)
        self.shared: list[Buffer] = []
        self.local: list[Buffer] = []
        for buf in self.func.buffers:
            if buf.name not in used or buf.scope == "global":
                continue
            users = {b.name for b in self.func.producers(buf.name) + self.func.consumers(buf.name)}
            if not users <= self.names:
                raise BuildError(f"{buf.scope} buffer {buf.name} is used outside kernel {self.name} "
                                 f"(by {', '.join(sorted(users - self.names))}); it cannot outlive the kernel")
            (self.shared if buf.scope == "shared" else self.local).append(buf)
        order = [*self.func.inputs, *self.func.outputs, *sorted(self.scratch)]
        # Symbolic sizes are keyed "$name" so a size never shadows a buffer of the same name.
        self.params = tuple(n for n in order if n in used) + tuple(SYMBOL_PREFIX + s for s in self.func.symbols)

    # printing helpers ------------------------------------------------------------------------
    def _var(self, name: str) -> str:
        return self.symbol_names.get(name) or mangle(name)

    def _flat(self, buf: Buffer, indices: tuple[Expr, ...]) -> Expr:
        """Flat index with the block's bindings substituted and simplified under the loop ranges, so
        register arrays end up indexed by constants once loops are unrolled."""
        flat, offset = flatten(buf, indices), self._slot_offset(buf)
        return simplify(substitute(flat if offset is None else flat + offset, self.bindings), self.ranges)

    def _index(self, buf: Buffer, indices: tuple[Expr, ...]) -> str:
        return self.printer(self._flat(buf, indices))

    def _load(self, ld: Load) -> str:
        if ld in self.vector_regs:
            return self.vector_regs[ld]
        buf = self.func.buffer(ld.buffer)
        return f"{mangle(buf.name)}[{self._index(buf, ld.indices)}]"

    def _expr(self, e: Expr) -> str:
        return self.printer(self._bound_expr(e))

    def _bound_expr(self, e: Expr) -> Expr:
        """``e`` in the loops' terms, simplified, without the guards a loop version has checked already."""
        return self._without_assumed(simplify(substitute(e, self.bindings), self.ranges))

    def _emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)
        self.last_sync = False

    def _open(self, head: str = "") -> None:
        if head.startswith("//"):
            self._emit(head)
            head = ""
        self._emit(f"{head} {{" if head else "{")
        self.depth += 1

    def _close(self, n: int = 1) -> None:
        for _ in range(n):
            self.depth -= 1
            self._emit("}")

    def _sync(self) -> None:
        if not self.last_sync:
            self._emit("__syncthreads();")
            self.last_sync = True

    # structure --------------------------------------------------------------------------------
    def _open_loop(self, block: Block, lp: Loop, ctx: _Ctx) -> tuple[_Ctx, int]:
        v = mangle(lp.name)
        if lp.thread in THREAD_TAGS:
            outer = ctx.bound.get(lp.thread)
            if outer is not None and any(outer in free_vars(b) for b in block.bindings):
                raise BuildError(f"block {block.name}: {lp.name} re-binds {lp.thread}, but the block also "
                                 f"depends on the enclosing {outer}; bind threads before compute_at")
            self._open("")
            self._emit(f"const int {v} = {lp.thread};")
            new = replace(ctx, bound={**ctx.bound, lp.thread: lp.name})
            ext = as_int(lp.extent)
            if ext is not None and ext < self.threads[lp.thread]:
                self._open(f"if ({v} < {ext})")
                return replace(new, divergent=True), 2
            return new, 1
        if lp.thread in self.strided:
            dim = lp.thread.split(".")[1]
            self._open(f"for (int {v} = {lp.thread}; {v} < {self.printer(lp.extent)}; {v} += gridDim.{dim})")
            return ctx, 1
        if lp.thread in BLOCK_TAGS:
            self._open("")
            self._emit(f"const int {v} = {lp.thread};")
            if as_int(lp.extent) is None:
                # A symbolic extent of 0 still launches one block (a grid has no empty dimension); the guard
                # is uniform over the block, so barriers inside it stay legal.
                self._open(f"if ({v} < {self.printer(lp.extent)})")
                return ctx, 2
            return ctx, 1
        pragma = self._edge_pragma(lp) or unroll_pragma(lp, whole=self.staging)  # staged: constant indices
        if pragma:
            self._emit(pragma)
        self._open(f"for (int {v} = 0; {v} < {self.printer(lp.extent)}; ++{v})")
        return ctx, 1

    def _touches_memory_shared_by_threads(self, block: Block) -> bool:
        bufs = [block.store, *block.read_buffers]
        return any(self.func.buffer(b).scope == "shared" or b in self.scratch or b in self.passed_outputs
                   for b in bufs)

    def _attached(self, block: Block, ctx: _Ctx) -> None:
        needs_sync = self._touches_memory_shared_by_threads(block)
        if needs_sync:
            ctx.refuse_barrier(f"block {block.name} shares memory between threads but sits", "a barrier there")
        if needs_sync:
            self._sync()
        self.chain(block, ctx)
        if needs_sync:
            self._sync()

    def chain(self, block: Block, ctx: _Ctx, start: int = 0) -> None:
        """Write ``block``'s loops from ``start`` inward, the blocks attached to them, and its statement."""
        region = self._reduction_region(block)
        # each loop with the context inside it: a block attached after an inner loop closes runs in its own
        # loop's context, not the innermost one's (whose thread loops and guards are closed by then)
        closers: list[tuple[Loop, int, list[Block], _Ctx]] = []
        for i, lp in enumerate(block.loops[start:], start):
            if region is not None and i == region:
                self._cross_thread_reduction(block, i, ctx)
                break
            if lp.vectorized and i == len(block.loops) - 1:
                self._check_private_store(block, ctx)
                # a double-buffered copy is split into a load and a store stage, which only the vector copy
                # and the scalar statement know how to do: a copy that is not one vector access stays scalar
                if self._vector_copy(block, lp, ctx) or (not self.staging and self._vector_statement(block, lp, ctx)):
                    break
            copies = self._double_buffered_before(block, lp)
            if copies:
                self._db_prologue(copies, lp, ctx)
            ctx, braces = self._open_loop(block, lp, ctx)
            closers.append((lp, braces, copies, ctx))
            if copies:
                self._db_prefetch(copies, lp, ctx)
            for b in self.func.attached_at(block.name, lp.name, "before"):
                if b not in copies:
                    self._attached(b, ctx)
            if region is None and self._versioned(block, i, ctx):
                break
        else:
            self._statement(block, ctx)
        for lp, braces, copies, inside in reversed(closers):
            for b in self.func.attached_at(block.name, lp.name, "after"):
                self._attached(b, inside)
            if copies:
                self._db_store(copies, lp, inside)
            if lp.thread in self.strided and self.uses_shared:
                # the next block index reuses the shared tiles: every thread is done with this one first
                self._sync()
            self._close(braces)

    # statements -------------------------------------------------------------------------------
    def _enter(self, block: Block) -> None:
        """Make ``block``'s axis bindings and loop ranges current for printing its expressions."""
        self.bindings = {a.name: b for a, b in zip(block.axes, block.bindings)}
        self.ranges = var_ranges({lp.name: lp.extent for lp in self.func.all_loops(block)})

    def _store(self, block: Block) -> tuple[Buffer, str]:
        buf = self.func.buffer(block.store)
        return buf, f"{mangle(buf.name)}[{self._index(buf, block.store_indices)}]"

    def _combine(self, reducer: str, a: str, b: str, dtype: str) -> str:
        if reducer == "sum":
            return f"{a} + {b}"
        fn = float_min_max(reducer) if is_float(dtype) else reducer
        return f"{fn}({a}, {b})"

    def _check_private_store(self, block: Block, ctx: _Ctx) -> None:
        """Refuse a write race: inside a loop bound to a thread index, a store to shared or global memory
        whose address does not depend on that thread, of a value that does (or that comes from the thread's
        own registers).  It arises when a schedule places a block where its region cannot be told apart per
        thread (e.g. a write-back attached below a loop over a fused, split index)."""
        buf = self.func.buffer(block.store)
        if buf.scope == "local":
            return
        self._enter(block)
        address = free_vars(self._flat(buf, block.store_indices))
        value = simplify(substitute(block.value, self.bindings), self.ranges)
        registers = sorted({ld.buffer for ld in loads(value) if self.func.buffer(ld.buffer).scope == "local"})
        for tag, loop in ctx.bound.items():
            if self.threads[tag] > 1 and loop not in address and (loop in free_vars(value) or registers):
                source = f"registers {', '.join(registers)}" if registers else f"a value that depends on {loop}"
                raise BuildError(f"block {block.name}: every thread of {tag} (loop {loop}) stores to the same "
                                 f"elements of {buf.name}, each from its own {source}: a write race.  Attach "
                                 f"the block where its region is one thread's (at or inside {loop}'s own "
                                 f"split loops), or bind a loop of its own to {tag}")

    def _statement(self, block: Block, ctx: _Ctx) -> None:
        self._check_private_store(block, ctx)
        self._open(f"// block {block.name}")
        self._enter(block)
        bounds = [self.printer(g) for g in self._staged_bounds(block, self._guards(block))]
        conds = bounds + self._once_guards(block, ctx)
        if conds:
            self._open(f"if ({' && '.join(conds)})")
        if self.staging:
            self._staged_statement(block, self._expr(block.value))
        elif block.reducer is None:
            self._assign(block, self._expr(stored(block.value, self.func.buffer(block.store).dtype)))
        else:
            self._assign(block, self._expr(block.value))
        if conds:
            self._close()
        self._close()

    def _assign(self, block: Block, value: str) -> None:
        """Store ``value`` (already printed) into the block's target: plainly, or folded into it after the
        init on the first reduction step."""
        buf, target = self._store(block)
        if block.reducer is None:
            self._emit(f"{target} = static_cast<{ctype(buf.dtype)}>({value});")
            return
        if block.init is not None:
            first = [f"{self._expr(self.bindings[a.name])} == 0" for a in block.axes if a.kind == "R"]
            init = self._expr(block.init)
            self._emit(f"if ({' && '.join(first) or 'true'}) {target} = static_cast<{ctype(buf.dtype)}>({init});")
        current = f"static_cast<{compute_type(buf.dtype)}>({target})"
        combined = self._combine(block.reducer, current, value, buf.dtype)
        self._emit(f"{target} = static_cast<{ctype(buf.dtype)}>({combined});")

    # assembly ---------------------------------------------------------------------------------
    def write(self) -> tuple[str, KernelSpec]:
        self.chain(self.root, _Ctx())
        body = self.lines
        decls: list[str] = []
        # Every shared array, tiles and reduction scratch alike, rounded to its 16-byte alignment.
        arrays = [self._shared_array(b) for b in self.shared]
        arrays += [(t, name, n, n * 4 if t in ("float", "int") else n * 8) for t, name, n in self.scratch_arrays]
        total = sum((nbytes + 15) // 16 * 16 for *_, nbytes in arrays)
        static, dynamic = total, 0
        if total > STATIC_SMEM_LIMIT:
            decls.append("SL_DYN_SHARED(sl_smem);")
            offset = 0
            for t, name, n, nbytes in arrays:
                decls.append(f"SL_SHARED_VIEW({t}, {name}, sl_smem, {offset}, {n});")
                offset += (nbytes + 15) // 16 * 16
            dynamic, static = offset, 0
        else:
            decls += [f"SL_SHARED({t}, {name}, {n});" for t, name, n, _ in arrays]
        local_bytes = 0
        for b in self.local:
            n = as_int(size_elements(b))
            if n is None:
                raise BuildError(f"local buffer {b.name} has symbolic size; compact it with compute_at")
            # 16-byte aligned: a vector copy may read a register array as 8 or 16 bytes at a time
            decls.append(f"__align__(16) {ctype(b.dtype)} {mangle(b.name)}[{n}];")
            local_bytes += -(-n * BYTES[b.dtype] // 16) * 16
        params = []
        for p in self.params:
            if p.startswith(SYMBOL_PREFIX):
                params.append(f"int {self.symbol_names[p[len(SYMBOL_PREFIX):]]}")
            else:  # inputs are read-only, so read-only host arrays and const device memory are accepted
                const = "const " if p in self.func.inputs else ""
                params.append(f"SL_GLOBAL({const}{ctype(self.func.buffer(p).dtype)}) {mangle(p)}")
        head = f'extern "C" __global__ void __launch_bounds__({self.n_threads}) {self.name}({", ".join(params)}) {{'
        text = "\n".join([head, *("  " + d for d in decls), *body, "}"])
        grid = tuple(self.grid.get(t, Const(1)) for t in BLOCK_TAGS)
        block = tuple(self.threads[t] for t in THREAD_TAGS)
        spec = KernelSpec(self.name, grid, block, self.params, dynamic, static,  # type: ignore[arg-type]
                          local_bytes=local_bytes)
        return text, spec

