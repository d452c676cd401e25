"""Emission of double-buffered shared tiles (the ``double_buffer`` primitive); mixed into the kernel writer.

For copies marked ``double_buffer`` attached before loop ``k`` of extent ``n``, the kernel becomes::

    __syncthreads();                       // the slots are free
    { const int k = 0; copy into slot 0 }  // the first tile, as before
    __syncthreads();
    for (int k = 0; k < n; ++k) {
      const int sl_cur = k & 1, sl_nxt = sl_cur ^ 1;
      T sl_pf_A[m];                        // this thread's values of the next tile
      if (k + 1 < n) { const int k = sl_next; sl_pf_A[j] = A[...]; }    // loads in flight ...
      ... the loop body, reading slot sl_cur ...                            // ... while this runs
      if (k + 1 < n) { const int k = sl_next; A_shared[slot sl_nxt] = sl_pf_A[j]; }
      __syncthreads();                     // one barrier per iteration
    }

Slot ``sl_nxt`` was last read in iteration ``k - 1``, which every thread finished before the barrier that
closed it, so one barrier per iteration is enough: the write of the next tile needs no barrier before it.
The copies' own loops outside their thread bindings are unrolled, so ``sl_pf_A`` stays in registers.

A copy whose tile overhangs its source (a ragged edge of A: ``if (k * 32 + j < K) sl_pf_A[j] = A[...]``)
guards its loads only.  Its register array starts zeroed (``T sl_pf_A[m] = {};``) and the store half writes
every slot of the tile: the elements past the edge get zeros that no guarded reader looks at, and the
predicates of the loads need not stay live across the loop body until the store.  Those guards are the ones
that involve the loops around the copy (where the tile sits); a guard on the copy's own loops alone (a split
of them that overshoots the tile) keeps the store inside the tile and stays.
"""

from __future__ import annotations

from typing import Any

from schedlib.codegen.cuda_expr import ctype, mangle
from schedlib.errors import BuildError
from schedlib.ir.dtype import BYTES, is_float
from schedlib.ir.expr import Const, Expr, Var, as_int
from schedlib.ir.func import THREAD_INDEX_TAGS, Block, Buffer, Loop
from schedlib.ir.layout import const_bytes, size_elements
from schedlib.ir.primitives.pipeline import DOUBLE_BUFFER
from schedlib.ir.simplify import conjuncts, free_vars

CURRENT, NEXT = "sl_cur", "sl_nxt"


def is_double_buffered(block: Block) -> bool:
    return bool(dict(block.annotations).get(DOUBLE_BUFFER))


def slot_stride(buf: Buffer) -> int:
    """Elements from one slot of a double-buffered tile to the next: the tile, rounded up to 16 bytes so that
    vector accesses stay aligned in both slots."""
    size = as_int(size_elements(buf))
    assert size is not None, "double_buffer admits copies whose every loop has a constant extent"
    per = max(1, 16 // BYTES[buf.dtype])
    return -(-size // per) * per


class DoubleBuffer:
    """The prologue, prefetch and store phases of double-buffered copies; see the module docstring."""

    func: Any
    lines: list[str]
    last_sync: bool
    double_buffered: set[str]  # the double-buffered shared buffers
    slot_of: dict[str, str]  # double-buffered buffer -> the slot variable its accesses use now ("" = slot 0)
    db_loop: str | None  # the loop whose slots are in use (double-buffered loops do not nest)
    staging: tuple[str, str] | None  # ("load" | "store", register array) while a copy runs split in two
    staged_types: dict[str, tuple[str, bool]]  # register array -> (element type, one vector per entry)

    printer: Any  # the writer's ExprPrinter; _emit, _open, _close, _sync, _store and chain are the writer's too

    def _shared_array(self, b: Buffer) -> tuple[str, str, int, int]:
        """(C type, name, elements, bytes) of a shared buffer's allocation: two slots when double-buffered."""
        if b.name in self.double_buffered:
            n = 2 * slot_stride(b)
            return ctype(b.dtype), mangle(b.name), n, n * BYTES[b.dtype]
        return ctype(b.dtype), mangle(b.name), as_int(size_elements(b)) or 0, const_bytes(b)

    def _slot_offset(self, buf: Buffer) -> Expr | None:
        slot = self.slot_of.get(buf.name)
        return Var(slot) * Const(slot_stride(buf)) if slot else None  # no slot variable: slot 0

    def _double_buffered_before(self, host: Block, lp: Loop) -> list[Block]:
        copies = [b for b in self.func.attached_at(host.name, lp.name, "before") if is_double_buffered(b)]
        if copies and (lp.thread is not None or lp.vectorized):
            raise BuildError(f"double-buffered copies {', '.join(b.name for b in copies)} sit at {lp.name}, "
                             "which is not a serial loop")
        if copies and self.db_loop is not None:
            raise BuildError(f"{lp.name}: double-buffered copies sit inside the loop of other double-buffered "
                             f"copies ({self.db_loop}); they cannot nest")
        for b in copies:
            # The next tile is read into registers one iteration ahead: from global memory, which holds every
            # tile all along.  A copy fed by blocks of its own (a staging copy attached inside it) would read
            # what those have not written yet.
            inner = self.func.attached_to(b.name)
            if inner:
                raise BuildError(f"double-buffered copy {b.name} has {', '.join(x.name for x in inner)} attached "
                                 "inside it; a double-buffered copy must read global memory directly")
        return copies

    def _db_prologue(self, copies: list[Block], lp: Loop, ctx: Any) -> None:
        """Before loop ``lp``: its first iteration's tiles, into slot 0."""
        ctx.refuse_barrier(f"double-buffered copies {', '.join(b.name for b in copies)} share memory between "
                           "threads but sit", "their barriers")
        self.last_sync = False
        self._sync()
        for b in copies:
            self.slot_of[b.store] = ""
        self._open("")
        self._emit(f"const int {mangle(lp.name)} = 0;")
        for b in copies:
            self.chain(b, ctx)
        self._close()
        self._sync()

    def _db_next(self, lp: Loop) -> str:
        return f"{mangle(lp.name)} + 1 < {self.printer(lp.extent)}"

    def _db_prefetch(self, copies: list[Block], lp: Loop, ctx: Any) -> None:
        """At the top of ``lp``'s body: the slot variables, and the next iteration's values into registers."""
        v = mangle(lp.name)
        self._emit(f"const int {CURRENT} = {v} & 1, {NEXT} = {CURRENT} ^ 1, sl_next_{v} = {v} + 1;")
        self.db_loop = lp.name
        for b in copies:
            self.slot_of[b.store] = CURRENT
        self._staged(copies, lp, ctx, "load")

    def _db_store(self, copies: list[Block], lp: Loop, ctx: Any) -> None:
        """At the end of ``lp``'s body: the registers into the other slot, then the iteration's one barrier."""
        for b in copies:
            self.slot_of[b.store] = NEXT
        self._staged(copies, lp, ctx, "store")
        for b in copies:
            del self.slot_of[b.store]
        self.db_loop = None
        self.last_sync = False
        self._sync()

    def _staged(self, copies: list[Block], lp: Loop, ctx: Any, mode: str) -> None:
        v = mangle(lp.name)
        for b in copies:
            reg = f"sl_pf_{mangle(b.store)}"
            at = len(self.lines)
            self._open(f"if ({self._db_next(lp)})")
            self._emit(f"const int {v} = sl_next_{v}; (void){v};  // the next iteration's tile")
            self.staging = (mode, reg)
            try:
                self.chain(b, ctx)
            finally:
                self.staging = None
            self._close()
            if mode == "load":  # the array's element type is the copy's access type, known only now
                element, vector = self.staged_types[reg]
                indent = self.lines[at][: len(self.lines[at]) - len(self.lines[at].lstrip())]
                zeroed = " = {}" if conjuncts(b.predicate) else ""  # the store half writes every entry
                self.lines.insert(at, f"{indent}{element} {reg}[{prefetch_values(b, vector)}]{zeroed};")

    def _staged_bounds(self, block: Block, guards: list[Expr]) -> list[Expr]:
        """A copy's guards (in loop terms) as the current half of a double-buffered copy needs them: all of
        them to load; to store, those on the copy's own loops alone (a split that overshoots the tile), not
        those that say where the tile overhangs the source (the registers there hold zeros)."""
        if self.staging is None or self.staging[0] != "store":
            return guards
        own = {lp.name for lp in block.loops}
        outer = {lp.name for lp in self.func.all_loops(block)} - own
        return [g for g in guards if not free_vars(g) & outer]

    def _staged_index(self, block: Block, skip: Loop | None) -> str:
        """This thread's slot in the register array: the copy's loops outside its thread bindings (and
        outside ``skip``, a loop moved as one vector) in row-major order."""
        index: Expr = Const(0)
        for lp in block.loops:
            if lp.thread in THREAD_INDEX_TAGS or lp is skip:
                continue
            index = index * Const(as_int(lp.extent)) + Var(lp.name)  # type: ignore[arg-type]
        return self.printer(index)

    def _staged_statement(self, block: Block, value: str) -> None:
        """A scalar copy statement split in two: the load into the register, or the register into the tile."""
        assert self.staging is not None
        mode, reg = self.staging
        slot = self._staged_index(block, None)
        if mode == "load":
            self.staged_types[reg] = (register_type(self.func.buffer(block.store).dtype), False)
            self._emit(f"{reg}[{slot}] = {value};")
        else:
            target = self._store(block)[1]
            self._emit(f"{target} = {reg}[{slot}];")

    def _staged_vector(self, block: Block, lp: Loop, vtype: str, dst: str, src: str) -> str:
        """A vector copy split in two; returns the statement."""
        assert self.staging is not None
        mode, reg = self.staging
        slot = self._staged_index(block, lp)
        if mode == "load":
            self.staged_types[reg] = (vtype, True)
            return f"{reg}[{slot}] = SL_VLOAD({vtype}, {src});"
        return f"SL_VSTORE({vtype}, {dst}, {reg}[{slot}]);"


def register_type(dtype: str) -> str:
    """C type of one scalar of a prefetch array: 8- and 16-bit elements widened to 32 bits.  ptxas puts an
    array of narrow elements written one at a time in local memory (a bf16 SIMT prefetch of 8 values spilled
    20 bytes at 40 registers); widened, it stays in registers.  The store into the tile narrows again, with
    the same single rounding as a direct copy."""
    if BYTES[dtype] >= 4:
        return ctype(dtype)
    return "float" if is_float(dtype) else "int"


def prefetch_values(block: Block, vector: bool) -> int:
    """Entries of the register array one thread fills for ``block``: its non-thread loops' points (without the
    innermost loop when it moves as one vector)."""
    loops = [lp for lp in block.loops if lp.thread not in THREAD_INDEX_TAGS]
    if vector and loops and loops[-1].vectorized:
        loops = loops[:-1]
    count = 1
    for lp in loops:
        count *= as_int(lp.extent) or 1
    return count
