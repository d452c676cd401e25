"""Lowering of a checked warp-tiled matmul (:class:`~schedlib.codegen.mma_pattern.MmaPlan`) to one CUDA kernel:
``cp.async`` ring -> XOR-swizzled shared tiles -> ``ldmatrix`` -> ``mma.sync.m16n8k16`` -> epilogue in registers.

* Global -> shared (:mod:`schedlib.codegen.operand_copy`): each operand tile is copied in 16-byte chunks, one
  ``cp.async`` per chunk, through ``stages`` ring slots: tile ``kt + stages - 1`` is requested while tile
  ``kt`` is multiplied, and ``cp.async.wait_group(stages - 2)`` + ``__syncthreads`` make tile ``kt`` visible.
  ``stages = 1`` is one synchronous buffer.  The slots read and refilled advance by a compare, not a
  ``% stages`` (a multiply-high and a multiply per step for 3 stages).
* Shared layout: XOR-swizzled rows (:func:`~schedlib.codegen.operand_copy.swizzle`), so that the 8 rows an
  ldmatrix reads lie on 8 distinct 16-byte bank groups.  The swizzle costs no memory (padding would: +25% at
  block_k=32, pushing the 3-stage 128x128 tile past the 48 KiB static limit) and keeps every chunk 16-byte
  aligned for cp.async.
* Fragments: A via ``ldmatrix.x4`` (``.trans`` when A is stored K x M), B two n8 tiles per ``ldmatrix.x4``
  (``.trans`` when B is stored K x N), so all four layouts read shared memory with 16-byte rows.  Where each lane's
  ldmatrix rows start in a slot is computed once, before the k loop (``sl_fa`` / ``sl_fb``).
* Epilogue: every accumulator element is owned by the lane the IR's lane loop gives it; the write-back
  block's expression (bias, residual, activation, cast) is evaluated there and stored, guarded along the
  dimensions the block tiles do not divide.
* Raster: blocks are renumbered so that consecutive block ids walk ``raster`` block rows column by column.
"""

from __future__ import annotations

import math

from schedlib.codegen.cuda_expr import ExprPrinter, ctype, mangle
from schedlib.codegen.fragment_epilogue import FragmentEpilogue
from schedlib.codegen.kernel_spec import KernelSpec, TensorMapSpec, tmap_param
from schedlib.codegen.kernel_writer import BLOCK_TAGS, STATIC_SMEM_LIMIT, SYMBOL_PREFIX
from schedlib.codegen.mma_pattern import MmaPlan, Operand, plan
from schedlib.codegen.operand_copy import OperandCopy, swizzle
from schedlib.ir.expr import Const, Expr, Load, Var
from schedlib.ir.func import Block, Func
from schedlib.ir.layout import flatten
from schedlib.ir.simplify import simplify

MMA = {"float16": "sl_mma_m16n8k16_f16f32", "bfloat16": "sl_mma_m16n8k16_bf16f32"}


def is_tensor_core_root(root: Block) -> bool:
    return "tensor_core" in dict(root.annotations)


class TensorCoreWriter(OperandCopy, FragmentEpilogue):
    def __init__(self, func: Func, root: Block, scratch: set[str]) -> None:
        self.func = func
        self.plan: MmaPlan = plan(func, root)
        self.name = mangle(f"{func.name}_{root.name}")
        self.scratch = scratch
        buffers = {mangle(b.name) for b in func.buffers}
        self.symbol_names = {s: mangle(s) + ("_dim" if mangle(s) in buffers else "") for s in func.symbols}
        self.printer = ExprPrinter(self._load, lambda n: self.symbol_names.get(n) or mangle(n))
        self.lines: list[str] = []
        self.depth = 1

    # printing ---------------------------------------------------------------------------------
    def _load(self, ld: Load) -> str:
        buf = self.func.buffer(ld.buffer)
        return f"{mangle(buf.name)}[{self.printer(simplify(flatten(buf, ld.indices)))}]"

    def _e(self, e: Expr) -> str:
        return self.printer(simplify(e))

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def open(self, head: str) -> None:
        self.emit(f"{head} {{")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.emit("}")

    def loop(self, var: str, n: int | str) -> None:
        self.emit("#pragma unroll")
        self.open(f"for (int {var} = 0; {var} < {n}; ++{var})")

    # pieces -----------------------------------------------------------------------------------
    def _tile_shape(self, op: Operand) -> tuple[int, int]:
        return self.plan.tile[op.rows], self.plan.tile[op.cols]

    def _origin_parts(self, axis: str) -> tuple[str, int]:
        """This block's tile along ``axis`` starts at ``var * tile``: (IR name of var, tile); for k, the k step."""
        p = self.plan
        return ("sl_kt" if axis == p.k else p.loops["by" if axis == p.m else "bx"]), p.tile[axis]

    def _origin(self, axis: str) -> str:
        """:meth:`_origin_expr` as C."""
        var, tile = self._origin_parts(axis)
        slice_start = self._slice_start(axis)
        return f"{mangle(var)} * {tile}" + (f" + {self._e(slice_start)}" if slice_start is not None else "")

    def _origin_expr(self, axis: str) -> Expr:
        """First index along ``axis`` of this block's tile (of k step ``sl_kt`` for k, within the block's slice
        of K under split-K)."""
        var, tile = self._origin_parts(axis)
        slice_start = self._slice_start(axis)
        return Var(var) * Const(tile) + (slice_start if slice_start is not None else Const(0))

    def _slice_start(self, axis: str) -> Expr | None:
        """Split-K: where this block's slice of K starts (its slice axis' binding times the slice's length);
        None for m, n and an unsplit k."""
        p = self.plan
        if axis != p.k or p.k_slice is None:
            return None
        binding = dict(zip((a.name for a in p.main.axes), p.main.bindings))[p.k_slice]
        return binding * p.extent(p.k)

    def _batch(self) -> dict[str, Expr]:
        p = self.plan
        return {a.name: b for a, b in zip(p.main.axes, p.main.bindings) if a.name in p.batch}

    def _fragment_rows(self, op: Operand, first: str, mn_bit: str, k_bit: str) -> tuple[str, str, str]:
        """(row, 16-byte chunk, ldmatrix suffix) this lane addresses for one ldmatrix.x4 of ``op``: 16 rows of
        m or n from ``first`` by the k16 step; ``mn_bit`` / ``k_bit`` are the bits of the lane's matrix index
        that pick the upper 8 of those rows and the upper k half.  An operand stored with k contiguous is
        read row by row; one stored K x M (or K x N) has k rows and is transposed on load."""
        if op.cols == self.plan.k:
            return f"{first} + sl_lr + ({mn_bit} << 3)", f"sl_ks * 2 + {k_bit}", ""
        return f"sl_ks * 16 + sl_lr + ({k_bit} << 3)", f"(({first}) >> 3) + {mn_bit}", "_trans"

    # Matrix q = lane / 8 of an ldmatrix.x4 gets its 8 row addresses from lanes 8q..8q+7 (row lane % 8).
    # A (m16 x k16): q&1 selects rows 8..15 of m, q>>1 the k half.  B pair: q&1 the k half, q>>1 the n8 tile.
    def _fragment_reads(self) -> dict[str, tuple[Operand, str, str, str, str, str]]:
        """Per operand: (operand, tile loop, row, chunk, ldmatrix suffix, swizzle variable) of its ldmatrix.x4
        reads, one per k16 step and m16 tile (A) or pair of n8 tiles (B)."""
        p = self.plan
        return {"a": (p.a, "sl_mt", *self._fragment_rows(p.a, "sl_wm + sl_mt * 16", "(sl_lq & 1)", "(sl_lq >> 1)"),
                      "sl_swa"),
                "b": (p.b, "sl_np", *self._fragment_rows(p.b, "sl_wn + sl_np * 16", "(sl_lq >> 1)", "(sl_lq & 1)"),
                      "sl_swb")}

    def _fragment_offsets(self) -> None:
        """``sl_fa[ks][mt]`` / ``sl_fb[ks][np]``: where in a ring slot this lane's ldmatrix rows start, computed
        once: the k loop then adds only the slot's offset (the swizzle XOR keeps them from being one base plus
        constants)."""
        p = self.plan
        steps, tiles = p.tile[p.k] // 16, {"a": p.warp[0] // 16, "b": p.warp[1] // 16}
        for key, (op, tile, row, chunk, _, swizzled) in self._fragment_reads().items():
            cols = self._tile_shape(op)[1]
            self.emit(f"int sl_f{key}[{steps}][{tiles[key]}];")
            self.loop("sl_ks", steps)
            self.loop(tile, tiles[key])
            self.emit(f"sl_f{key}[sl_ks][{tile}] = ({row}) * {cols} + ((({chunk}) ^ {swizzled}) << 3);")
            self.close()
            self.close()

    def _ldmatrix(self, dst: str, smem: str, key: str) -> None:
        """One ``ldmatrix.x4`` of operand ``key`` into ``dst`` from the current ring slot."""
        op, tile, _, _, suffix, _ = self._fragment_reads()[key]
        rows, cols = self._tile_shape(op)
        self.emit(f"sl_ldmatrix_x4{suffix}({dst}, &{smem}[sl_stage * {rows * cols} + sl_f{key}[sl_ks][{tile}]]);")

    def _fragments(self, smem: dict[str, str]) -> None:
        """One k16 step: A fragments of every m16 tile, then B two n8 tiles at a time, and the mmas."""
        p = self.plan
        wm, wn = p.warp
        mt, nt = wm // 16, wn // 8
        self.emit(f"unsigned sl_a[{mt}][4];")
        self.loop("sl_mt", mt)
        self._ldmatrix("sl_a[sl_mt]", smem["a"], "a")
        self.close()
        self.loop("sl_np", nt // 2)
        self.emit("unsigned sl_b[4];")
        self._ldmatrix("sl_b", smem["b"], "b")
        self.loop("sl_mt", mt)
        for half in (0, 1):
            acc = f"sl_acc[sl_mt][sl_np * 2 + {half}]"
            self.emit(f"{MMA[p.dtype]}({acc}, sl_a[sl_mt], &sl_b[{2 * half}], {acc});")
        self.close()
        self.close()

    def _block_index(self) -> None:
        """Block row/column of this block; with raster G, ids run down G block rows, then across."""
        p = self.plan
        by, bx = mangle(p.loops["by"]), mangle(p.loops["bx"])
        if "bz" in p.loops:
            self.emit(f"const int {mangle(p.loops['bz'])} = blockIdx.z;")
        if p.raster == 1:
            self.emit(f"const int {by} = blockIdx.y, {bx} = blockIdx.x;")
            return
        g = p.raster
        self.emit("const int sl_pid = blockIdx.y * gridDim.x + blockIdx.x;")
        self.emit(f"const int sl_span = {g} * gridDim.x, sl_first = sl_pid / sl_span * {g};")
        self.emit(f"const int sl_height = (int)gridDim.y - sl_first < {g} ? (int)gridDim.y - sl_first : {g};")
        self.emit(f"const int {by} = sl_first + sl_pid % sl_span % sl_height, {bx} = sl_pid % sl_span / sl_height;")

    # assembly ---------------------------------------------------------------------------------
    def write(self) -> tuple[str, KernelSpec]:
        p = self.plan
        loops = {lp.name: lp for lp in p.main.loops}
        warps_m, warps_n = (int(loops[p.loops[r]].extent.value) for r in ("wy", "wx"))  # type: ignore[attr-defined]
        threads = 32 * warps_m * warps_n
        wm, wn = p.warp
        smem = {"a": mangle(p.a.shared.name), "b": mangle(p.b.shared.name)}
        tiles = {key: math.prod(self._tile_shape(op)) for key, op in (("a", p.a), ("b", p.b))}
        self.emit("const int sl_lane = threadIdx.x;  // the IR's lane loop: groupID * 4 + threadID_in_group")
        self.emit(f"const int {mangle(p.loops['wy'])} = threadIdx.z, {mangle(p.loops['wx'])} = threadIdx.y;")
        self.emit(f"const int sl_tid = (threadIdx.z * {warps_n} + threadIdx.y) * 32 + sl_lane;")
        self._block_index()
        self.emit(f"const int sl_wm = {mangle(p.loops['wy'])} * {wm}, sl_wn = {mangle(p.loops['wx'])} * {wn};")
        self.emit("const int sl_g = sl_lane >> 2, sl_t = sl_lane & 3, sl_lr = sl_lane & 7, sl_lq = sl_lane >> 3;")
        self.emit(f"const int sl_swa = {swizzle('sl_lr', self._tile_shape(p.a)[1])}, "
                  f"sl_swb = {swizzle('sl_lr', self._tile_shape(p.b)[1])};")
        self.emit(f"float sl_acc[{wm // 16}][{wn // 8}][4];")
        self.loop("sl_mt", wm // 16)
        self.loop("sl_nt", wn // 8)
        self.loop("sl_e", 4)
        self.emit("sl_acc[sl_mt][sl_nt][sl_e] = 0.0f;")
        for _ in range(3):
            self.close()
        self._loader(smem, threads)
        self._fragment_offsets()
        bk, s = p.tile[p.k], p.stages
        if s > 1:
            self.loop("sl_s", s - 1)
            self.emit("if (sl_s < sl_ktiles) sl_load(sl_s, sl_s);")
            self.emit("sl_cp_async_commit();")
            self.close()
        if s > 1:  # ring slots read and refilled this step, advanced by a compare rather than a % s
            self.emit(f"int sl_read = 0, sl_fill = {s - 1};")
        self.open(f"for (int {mangle(p.loops['ko'])} = 0; {mangle(p.loops['ko'])} < sl_ktiles; "
                  f"++{mangle(p.loops['ko'])})")
        ko = mangle(p.loops["ko"])
        if s > 1:
            self.emit(f"sl_cp_async_wait<{s - 2}>();")
            self.emit("__syncthreads();")
            self.emit(f"if ({ko} + {s - 1} < sl_ktiles) sl_load(sl_fill, {ko} + {s - 1});")
            self.emit("sl_cp_async_commit();")
            self.emit("const int sl_stage = sl_read;")
        else:
            self.emit("__syncthreads();  // the previous step's tiles are no longer read")
            self.emit(f"sl_load(0, {ko});")
            self.emit("sl_cp_async_commit();")
            self.emit("sl_cp_async_wait<0>();")
            self.emit("__syncthreads();")
            self.emit("const int sl_stage = 0;")
        self.loop("sl_ks", bk // 16)
        self._fragments(smem)
        self.close()
        if s > 1:
            self.emit(f"sl_read = sl_read == {s - 1} ? 0 : sl_read + 1;")
            self.emit(f"sl_fill = sl_fill == {s - 1} ? 0 : sl_fill + 1;")
        self.close()
        if self._pairs_fit_output():
            _, out, target = self._writeback_parts()
            self._paired_epilogue(mangle(out.name), self._e(target))
        else:
            self._epilogue()
        return self._assemble(threads, smem, tiles, warps_m, warps_n)

    def _assemble(self, threads: int, smem: dict[str, str], tiles: dict[str, int], warps_m: int, warps_n: int
                  ) -> tuple[str, KernelSpec]:
        p = self.plan
        t = ctype(p.dtype)
        arrays = [(smem[k], tiles[k] * p.stages) for k in ("a", "b")]
        total = sum((n * 2 + 15) // 16 * 16 for _, n in arrays)
        decls: list[str] = []
        dynamic = 0
        if total > STATIC_SMEM_LIMIT:
            decls.append("SL_DYN_SHARED(sl_smem);")
            offset = 0
            for name, n in arrays:
                decls.append(f"SL_SHARED_VIEW({t}, {name}, sl_smem, {offset}, {n});")
                offset += (n * 2 + 15) // 16 * 16
            dynamic = offset
        else:
            decls += [f"SL_SHARED({t}, {name}, {n});" for name, n in arrays]
        comment = (f"tensor cores: block {p.tile[p.m]}x{p.tile[p.n]}x{p.tile[p.k]}, warp tile "
                   f"{p.warp[0]}x{p.warp[1]}, {p.stages}-stage cp.async, raster {p.raster}")
        return self._finish(decls, comment, f"{threads}", (32, warps_n, warps_m), dynamic, 0 if dynamic else total)

    def _finish(self, decls: list[str], comment: str, bounds: str, block: tuple[int, int, int], dynamic: int,
                static: int, tensor_maps: tuple[TensorMapSpec, ...] = ()) -> tuple[str, KernelSpec]:
        """The kernel's text (signature, shared declarations, body) and launch spec; each of ``tensor_maps`` is
        one more parameter, a pointer to the map named ``sl_tmap_<buffer>``."""
        p = self.plan
        used = {b for blk in self.func.subtree(p.main.name, 0) for b in (blk.store, *blk.read_buffers)}
        order = [*self.func.inputs, *self.func.outputs, *sorted(self.scratch)]
        names = tuple(n for n in order if n in used) + tuple(SYMBOL_PREFIX + s for s in self.func.symbols)
        params = []
        for n in names:
            if n.startswith(SYMBOL_PREFIX):
                params.append(f"int {self.symbol_names[n[len(SYMBOL_PREFIX):]]}")
            else:
                const = "const " if n in self.func.inputs else ""
                params.append(f"SL_GLOBAL({const}{ctype(self.func.buffer(n).dtype)}) {mangle(n)}")
        params += [f"SL_GLOBAL(const unsigned long long) {tmap_param(m.buffer)}" for m in tensor_maps]
        names += tuple(m.param for m in tensor_maps)
        head = f'extern "C" __global__ void __launch_bounds__({bounds}) {self.name}({", ".join(params)}) {{'
        text = "\n".join([head, f"  // {comment}", *("  " + d for d in decls), *self.lines, "}"])
        bound = {lp.thread: lp.extent for lp in p.main.loops if lp.thread in BLOCK_TAGS}
        grid = tuple(bound.get(tag, Const(1)) for tag in BLOCK_TAGS)
        spec = KernelSpec(self.name, grid, block, names, dynamic, static, tensor_maps)  # type: ignore[arg-type]
        return text, spec
