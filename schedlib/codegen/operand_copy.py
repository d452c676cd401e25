"""The operand copies of a warp-tiled matmul: global -> shared in 16-byte ``cp.async`` chunks into a ring of
XOR-swizzled tiles; mixed into the tensor-core writers (:mod:`schedlib.codegen.tensor_core`).

* A tile is stored ``rows x cols`` with ``cols`` the operand's contiguous dimension; chunk ``q`` of row ``r``
  lives at chunk ``q ^ swizzle(r)`` (:func:`swizzle`), so the 8 rows an ldmatrix reads fall in 8 bank groups.
* Chunks outside the operand (M/N/K edges) are written as zeros instead of copied, tested only along a
  dimension some tile reaches past.
* The copy's addresses are loop invariants where they can be.  A thread's chunks of an operand lie whole
  rows apart whenever the threads cover whole tile rows, so the thread's first row and chunk, and its
  shared offset where the swizzle repeats along those rows, are computed once before the k loop; with no
  edge to test, one source pointer per k step serves every chunk at a constant distance.  Per-chunk
  division, swizzle and 64-bit address arithmetic left the mma.sync k loop with more integer instructions
  than HMMA.
"""

from __future__ import annotations

import math
from typing import Any

from schedlib.codegen.cuda_expr import ctype, mangle
from schedlib.codegen.mma_pattern import COPY_ELEMENTS, Operand
from schedlib.ir.expr import Const, Expr, Var, as_int
from schedlib.ir.layout import flatten, strides


def swizzle_shape(cols: int) -> tuple[int, int]:
    """(chunks the XOR permutes, rows sharing one 128-byte line) of a tile ``cols`` elements wide.

    The XOR permutes each aligned group of ``width`` 16-byte chunks of a row, ``width`` being the largest
    power of two up to 8 that divides the row's chunks: a row of 6 chunks XORed with up to 5 would send its
    chunks 2 and 3 to 6 and 7, into the next row."""
    chunks = cols // COPY_ELEMENTS
    width = math.gcd(chunks, 8)
    per_line = 8 // chunks if chunks == width else 1  # a row of 1, 2 or 4 chunks shares its line with others
    return width, per_line


def swizzle(row: str, cols: int) -> str:
    """C expression of the XOR applied to the chunk index of ``row`` in a tile ``cols`` elements wide; it
    depends on ``row % 8`` only (ldmatrix reads rows from 8-aligned bases)."""
    width, per_line = swizzle_shape(cols)
    if width == 1:
        return "0"
    return f"((({row}) >> {int(math.log2(per_line))}) & {width - 1})"


class OperandCopy:
    """``sl_load(slot, kt)`` and its per-thread invariants.  Needs the writer's ``plan``, ``depth``, ``emit``,
    ``open``, ``close``, ``loop``, ``_e``, ``_batch``, ``_tile_shape``, ``_origin``, ``_origin_expr`` and
    ``ragged``."""

    plan: Any

    def _copy(self, op: Operand, smem: str, threads: int, key: str) -> None:
        """One operand tile of k-step ``sl_kt`` into ring slot ``sl_stage``: 16-byte cp.async or zeros.

        When every thread copies one chunk column of rows a fixed step apart (:meth:`_hoistable`), the
        thread's first row and chunk are loop invariants (:meth:`_thread_chunks`); and when no tile reaches
        past the operand, one source pointer per k step serves every chunk, which lies a constant distance
        from it.  Otherwise each chunk's row, column and source are computed as they are copied."""
        rows, cols = self._tile_shape(op)
        chunks, per_row = rows * cols // COPY_ELEMENTS, cols // COPY_ELEMENTS
        source = mangle(op.source.name)
        limit_r, limit_c = op.source.shape[-2], op.source.shape[-1]
        guard = " && ".join(f"{var} < {self._e(limit)}" for axis, var, limit in
                            ((op.rows, "sl_gr", limit_r), (op.cols, "sl_gc", limit_c)) if self._partial(axis, limit))
        hoisted, step = self._hoistable(op, threads), threads // per_row
        pointer = hoisted and not guard  # a guarded chunk's address may lie outside the operand: not formed
        if pointer:
            first = {op.rows: self._origin_expr(op.rows) + Var(f"sl_{key}_r0"),
                     op.cols: self._origin_expr(op.cols) + Var(f"sl_{key}_q") * Const(COPY_ELEMENTS)}
            self.emit(f"const {ctype(op.source.dtype)}* sl_{key}_src = &{source}[{self._source_index(op, first)}];")
        if hoisted:
            self.loop("sl_i", chunks // threads)
            if guard or not self._invariant_swizzle(op, threads):
                self.emit(f"const int sl_r = sl_{key}_r0 + sl_i * {step}, sl_q = sl_{key}_q;")
        else:
            self.open_chunks(chunks, per_row, threads)
        if not pointer:
            self.emit(f"const int sl_gr = {self._origin(op.rows)} + sl_r, "
                      f"sl_gc = {self._origin(op.cols)} + sl_q * 8;")
        for line in (self._slot_offset(op, key, threads) if hoisted and self._invariant_swizzle(op, threads)
                     else self._chunk_offset(op)):
            self.emit(line)
        if pointer:
            row_stride = self._e(strides(op.source)[len(op.roles) - 2] * Const(step))
            src = f"sl_{key}_src + sl_i * ({row_stride})"
        else:
            src = f"&{source}[{self._source_index(op, {op.rows: Var('sl_gr'), op.cols: Var('sl_gc')})}]"
        copy = f"sl_cp_async_16(&{smem}[sl_dst], {src});"
        if guard:
            self.emit(f"if ({guard}) {copy}")
            self.emit(f"else SL_VSTORE(uint4, {smem}, sl_dst, make_uint4(0u, 0u, 0u, 0u));")
        else:  # every tile lies inside the operand: no compare, and no zero-fill store that ptxas must pad
            self.emit(copy)
        if hoisted:
            self.close()
        else:
            self.close_chunks(chunks, threads)

    def _source_index(self, op: Operand, at: dict[str, Expr]) -> str:
        """C index into ``op``'s global source of tile element ``at`` (its row and column axes), this batch."""
        index = {**self._batch(), **at}
        return self._e(flatten(op.source, tuple(index[r] for r in op.roles)))

    def _hoistable(self, op: Operand, threads: int) -> bool:
        """Whether every thread copies the same chunk column of rows a fixed step apart: the thread count a
        multiple of a tile row's chunks, the tile's chunks a multiple of the thread count, and the operand's
        row stride linear (not permuted)."""
        rows, cols = self._tile_shape(op)
        per_row = cols // COPY_ELEMENTS
        return (rows * per_row) % threads == 0 and threads % per_row == 0 and not op.source.permute

    def _thread_chunks(self, op: Operand, key: str, threads: int) -> None:
        """Loop-invariant row and chunk of this thread's first copy chunk of ``op`` (``sl_<key>_r0``,
        ``sl_<key>_q``) and, when the swizzle repeats along the thread's rows, its shared offset in slot 0."""
        cols = self._tile_shape(op)[1]
        per_row = cols // COPY_ELEMENTS
        self.emit(f"const int sl_{key}_r0 = sl_tid / {per_row}, sl_{key}_q = sl_tid % {per_row};")
        if self._invariant_swizzle(op, threads):
            self.emit(f"const int sl_{key}_dst0 = sl_{key}_r0 * {cols} + "
                      f"((sl_{key}_q ^ {swizzle(f'sl_{key}_r0', cols)}) << 3);")

    def _invariant_swizzle(self, op: Operand, threads: int) -> bool:
        """Whether the XOR swizzle of a thread's copy rows (``threads / chunks per row`` apart) is one value."""
        cols = self._tile_shape(op)[1]
        width, per_line = swizzle_shape(cols)
        return (threads // (cols // COPY_ELEMENTS)) % (width * per_line) == 0  # rows after which it repeats

    def _partial(self, axis: str, limit: Expr) -> bool:
        """Whether some tile of the operand dimension indexed by ``axis`` (``limit`` long) reaches past it."""
        if axis == self.plan.k and self.plan.k_slice is not None:
            return False  # split-K: the plan proved every slice is whole k steps inside K
        return self.ragged(axis) or as_int(limit) != as_int(self.plan.extent(axis))

    def open_chunks(self, chunks: int, per_row: int, threads: int) -> None:
        """A block-wide loop over ``chunks`` 16-byte chunks of a tile ``per_row`` chunks wide: chunk ``sl_c``,
        at row ``sl_r`` and chunk ``sl_q`` of its row (guarded when the threads do not divide the chunks)."""
        self.loop("sl_i", -(-chunks // threads))
        self.emit(f"const int sl_c = sl_tid + sl_i * {threads};")
        if chunks % threads:
            self.open(f"if (sl_c < {chunks})")
        self.emit(f"const int sl_r = sl_c / {per_row}, sl_q = sl_c % {per_row};")

    def close_chunks(self, chunks: int, threads: int) -> None:
        if chunks % threads:
            self.close()
        self.close()

    def _loader(self, smem: dict[str, str], threads: int) -> None:
        """``sl_ktiles`` and ``sl_load(slot, kt)``, which requests both operand tiles of k step ``kt``."""
        p = self.plan
        bk = p.tile[p.k]
        self.emit(f"const int sl_ktiles = ({self._e(p.extent(p.k))} + {bk - 1}) / {bk};")
        operands = (("a", p.a), ("b", p.b))
        for key, op in operands:
            if self._hoistable(op, threads):
                self._thread_chunks(op, key, threads)
        self.emit("auto sl_load = [&](int sl_stage, int sl_kt) {")
        self.depth += 1
        for key, op in operands:
            self._copy(op, smem[key], threads, key)
        self.depth -= 1
        self.emit("};")

    def _chunk_offset(self, op: Operand) -> list[str]:
        """Statements defining ``sl_dst``: the element offset in the operand's shared ring of chunk ``sl_q`` of
        tile row ``sl_r`` in slot ``sl_stage``."""
        rows, cols = self._tile_shape(op)
        return [f"const int sl_dst = sl_stage * {rows * cols} + sl_r * {cols} + "
                f"((sl_q ^ {swizzle('sl_r', cols)}) << 3);"]

    def _slot_offset(self, op: Operand, key: str, threads: int) -> list[str]:
        """``sl_dst`` as :meth:`_chunk_offset` defines it, from the hoisted offset ``sl_<key>_dst0`` of the
        thread's first chunk: its later chunks lie a constant number of rows below, at the same swizzle."""
        rows, cols = self._tile_shape(op)
        step = threads // (cols // COPY_ELEMENTS)
        return [f"const int sl_dst = sl_stage * {rows * cols} + sl_{key}_dst0 + sl_i * {step * cols};"]
