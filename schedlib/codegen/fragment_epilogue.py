"""The epilogue of a warp-tiled matmul: every accumulator element through the write-back block's expression
(bias, residual, activation, cast) in the lane that holds it, then stored; mixed into the tensor-core writers.

An element (row ``g + 8h``, column ``2t + e``) of each 16 x 8 fragment is evaluated at ``sl_row`` / ``sl_col``.
Stores are guarded only along the dimensions the block tiles do not divide (a guard that always holds keeps
nvcc from sharing loads between the fragment's rows), and a thread's two neighbouring columns of a row go out
as one 4- or 8-byte pair where the output allows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedlib.codegen.cuda_expr import ctype, mangle, stored
from schedlib.errors import BuildError
from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Expr, Load, Var, as_int
from schedlib.ir.func import Buffer
from schedlib.ir.layout import flatten
from schedlib.ir.simplify import map_children, substitute

ACC = "sl_v"  # the accumulator element the epilogue is evaluated at


class FragmentEpilogue:
    """Needs the writer's ``plan``, ``func``, ``emit``, ``open``, ``close``, ``loop``, ``_e``, ``_batch`` and
    ``_origin``."""

    plan: Any
    func: Any

    def _writeback_parts(self) -> tuple[Expr, Buffer, Expr]:
        """The write-back's value (the accumulator element as ``sl_v``), output buffer and flat index, in
        terms of ``sl_row`` / ``sl_col`` (and the block's batch element)."""
        p = self.plan
        wb = p.writeback
        coords: dict[str, Expr] = {**self._batch(), p.m: Var("sl_row"), p.n: Var("sl_col")}
        axes = {w: coords[m] for w, m in p.wb_axes.items()}
        missing = [a.name for a in wb.axes if a.name not in axes]
        if missing:
            raise BuildError(f"write-back axes {missing} of {wb.name} do not index the accumulator")

        def accumulator(e: Expr) -> Expr:  # the accumulator load becomes the register element
            if isinstance(e, Load) and e.buffer == p.main.store:
                # typed as the load it replaces: a bare Var is int32, and rebuilding tanh(C[i, j]) or
                # exp(C[i, j]) around an int32 operand was refused ("tanh() needs a floating-point argument")
                return Var(ACC, e.dtype)
            return map_children(e, accumulator)

        out = self.func.buffer(wb.store)
        return (accumulator(substitute(wb.value, axes)), out,
                flatten(out, tuple(substitute(i, axes) for i in wb.store_indices)))

    def _epilogue(self, store: Callable[[str], str] | None = None) -> None:
        """Every accumulator element through the write-back expression, stored by ``store(value)`` (default:
        straight to its place in the output, under the bounds guard)."""
        value, out, target = self._writeback_parts()
        blocks = self._open_fragment(pairs=False)
        self.emit(f"const float {ACC} = sl_acc[sl_mt][sl_nt][sl_e];")
        cast = self._stored(value, out.dtype)
        self.emit(store(cast) if store else f"{mangle(out.name)}[{self._e(target)}] = {cast};")
        for _ in range(blocks):
            self.close()

    def _paired_epilogue(self, buffer: str, index: str) -> None:
        """The epilogue with each thread's two neighbouring columns of a row (accumulator elements ``2h`` and
        ``2h + 1``) stored as one 4- or 8-byte pair at ``buffer[index]`` (``index`` in ``sl_row``/``sl_col``,
        the pair's first column): half the store instructions of element-by-element stores."""
        value, out, _ = self._writeback_parts()
        t = ctype(out.dtype)
        pair = {2: "unsigned", 4: "uint2"}[BYTES[out.dtype]]
        blocks = self._open_fragment(pairs=True)
        self.emit(f"__align__({2 * BYTES[out.dtype]}) {t} sl_pair[2];")
        for i in range(2):
            element = substitute(value, {"sl_col": Var("sl_col") + i}) if i else value
            self.emit(f"{{ const float {ACC} = sl_acc[sl_mt][sl_nt][sl_h * 2 + {i}]; "
                      f"sl_pair[{i}] = {self._stored(element, out.dtype)}; }}")
        self.emit(f"SL_VSTORE_REGS({pair}, {buffer}, {index}, sl_pair);")
        for _ in range(blocks):
            self.close()

    def _stored(self, value: Expr, dtype: str) -> str:
        return f"static_cast<{ctype(dtype)}>({self._e(stored(value, dtype))})"

    def _pairs_fit_output(self) -> bool:
        """Whether a thread's two neighbouring output columns are neighbours in memory, 4/8-byte aligned and
        both inside the output: the column axis is the output's last index, N is even and no block is partial
        along it."""
        p = self.plan
        out = self.func.buffer(p.writeback.store)
        col = next((w for w, m in p.wb_axes.items() if m == p.n), None)
        last = as_int(out.shape[-1])
        return (col is not None and p.writeback.store_indices[-1] == Var(col) and last is not None
                and last % 2 == 0 and not self.ragged(p.n) and BYTES[out.dtype] in (2, 4))

    def _open_fragment(self, pairs: bool) -> int:
        """Open the loops over this thread's accumulator elements, one element per iteration (with ``pairs``: the
        two neighbouring columns of one row, elements ``2h`` and ``2h + 1``), defining ``sl_row`` / ``sl_col``
        (the pair's first column) inside the bounds guard.  Returns how many blocks to close."""
        p = self.plan
        wm, wn = p.warp
        self.loop("sl_mt", wm // 16)
        self.loop("sl_nt", wn // 8)
        if pairs:
            self.loop("sl_h", 2)  # row g + 8h: accumulator elements 2h (column 2t) and 2h + 1 (column 2t + 1)
            half, column = "sl_h", ""
        else:
            self.loop("sl_e", 4)  # accumulator element e: row g + 8 * (e >> 1), column 2t + (e & 1)
            half, column = "(sl_e >> 1)", " + (sl_e & 1)"
        self.emit(f"const int sl_row = {self._origin(p.m)} + sl_wm + sl_mt * 16 + sl_g + ({half} << 3);")
        self.emit(f"const int sl_col = {self._origin(p.n)} + sl_wn + sl_nt * 8 + (sl_t << 1){column};")
        guard = self.bounds_guard()
        if guard:
            self.open(f"if ({guard})")
        return 4 if guard else 3

    def ragged(self, axis: str) -> bool:
        """Whether the block tiles leave a partial block along ``axis`` (or its extent is symbolic)."""
        extent = as_int(self.plan.extent(axis))
        return extent is None or extent % self.plan.tile[axis] != 0

    def bounds_guard(self) -> str:
        """``sl_row < M && sl_col < N``, without the parts the block tiles divide (every block is whole there,
        and a guard left in keeps nvcc from sharing the epilogue's loads between accumulator rows)."""
        p = self.plan
        return " && ".join(f"{name} < {self._e(p.extent(axis))}"
                           for axis, name in ((p.m, "sl_row"), (p.n, "sl_col")) if self.ragged(axis))
