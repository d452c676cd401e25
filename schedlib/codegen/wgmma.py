"""Lowering of a checked warp-tiled matmul annotated ``tensor_core="wgmma"`` to one Hopper (sm_90a) kernel:
``cp.async`` ring -> swizzled shared tiles in the layouts wgmma reads -> ``wgmma.mma_async.m64nNk16`` -> epilogue.

The loop nest is the one :mod:`schedlib.codegen.mma_pattern` proves, with warp tiles 16 rows tall; four warps
stacked along m are one warpgroup, which owns a 64 x N accumulator tile (N = the warp tile's width) in exactly
the registers the warps' mma lanes would hold, so the epilogue is the mma path's.  What changes:

* Threads are numbered so that warps ``4j .. 4j+3`` are one warpgroup: warp w is warp row ``w % warps_m`` of
  warp column ``w // warps_m`` (wgmma needs 4 consecutive warps from a warp index divisible by 4).
* Shared tiles are stored in the canonical layouts of the PTX ISA ("Shared Memory Matrix Layout"), never read
  by the threads themselves: an operand whose contiguous dimension is K is *K-major* (rows of ``2 * block_k``
  bytes, 32/64/128-byte swizzle), one stored K x M or K x N is *MN-major* (atoms of 8 k-rows x 64 elements,
  128-byte swizzle; narrower warpgroup tiles of B use 64/32-byte atoms).  The swizzle is the address-bit form
  (bits 4..6 ^= bits 7..9 for 128 bytes), so every ring slot starts on a 1024-byte boundary; the dynamic
  shared memory is over-allocated by 1 KiB and aligned at run time.
* Each k16 step is one wgmma per warpgroup whose descriptors point into the current slot (K-major: +32 bytes
  per step; MN-major: +2 groups of 8 k-rows).  A warpgroup keeps one group of wgmmas in flight while the next
  slot's data arrives, so the ring refills the slot of step ``kt - 2`` (``stages - 2`` tiles ahead); with
  fewer than 3 stages it waits for its wgmmas every step instead.
* cp.async and zero-fill stores write shared memory through the generic proxy and wgmma reads it through the
  async proxy: every thread fences (``fence.proxy.async``) after its copies land and before the barrier.
* The epilogue is evaluated per accumulator element as on the mma path, but stored into the (now idle) ring's
  shared memory and written out row by row in 16-byte chunks: one block fills an SM here, so its scattered
  2- or 4-byte stores would not overlap any other block's work.  Into the staging tile each thread stores its
  two neighbouring columns of a row as one pair (element by element where N is ragged), in rows padded so that
  a phase's pairs fall on distinct banks.  Outputs whose rows are not whole 16-byte chunks (or whose last
  dimension is not the n axis) are stored directly instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlib.codegen.cuda_expr import ctype, mangle
from schedlib.codegen.kernel_spec import KernelSpec
from schedlib.codegen.mma_pattern import Operand, fail
from schedlib.codegen.tensor_core import TensorCoreWriter
from schedlib.ir.dtype import BYTES
from schedlib.ir.expr import Var, as_int
from schedlib.ir.func import Block, Func

WGMMA_N = (16, 32, 64, 128, 256)  # warp tile widths the wrappers in cuda_wgmma.cuh provide
SWIZZLE_MODE = {128: 1, 64: 2, 32: 3}  # descriptor bits 62-63 per swizzle width in bytes
ALIGN = 1024  # a 128-byte swizzle pattern repeats every 1024 bytes; slots start on that boundary
ARCH = "sm_90a"


def stage_row_pad(out_bytes: int) -> int:
    """Bytes after each staged output row.  Each thread stores its columns ``2t, 2t + 1`` of rows ``g`` and
    ``g + 8`` as one pair; a pad that puts row ``g`` 4 words (16-bit outputs: pairs of 4 bytes, 32 lanes in one
    phase) or 8 words (fp32: pairs of 8 bytes, 16 lanes per phase) further along the banks than row ``g - 1``
    gives every lane of a phase its own banks."""
    return 32 if out_bytes >= 4 else 16


def staging_bytes(block_m: int, block_n: int) -> int:
    """Shared memory the output tile is staged in, sized for fp32 outputs (the widest), so that the rule can
    size the allocation without knowing the output type."""
    return block_m * (block_n * 4 + stage_row_pad(4))


@dataclass(frozen=True)
class SharedLayout:
    """Where one operand's tile lives in its ring slot, and the descriptor fields that say so."""

    k_major: bool
    width: int  # swizzle width in bytes
    lbo: int
    sbo: int
    slot_bytes: int  # one ring slot, rounded up to ALIGN

    @property
    def mask(self) -> int:  # the address bits 7.. that are XORed into the 16-byte chunk index
        return self.width // 16 - 1

    def descriptor_bits(self) -> int:
        return ((self.lbo >> 4) << 16) | ((self.sbo >> 4) << 32) | (SWIZZLE_MODE[self.width] << 62)


class WgmmaWriter(TensorCoreWriter):
    loader = "cp.async"  # what fills the ring, as the kernel's comment names it

    def __init__(self, func: Func, root: Block, scratch: set[str]) -> None:
        super().__init__(func, root, scratch)
        p = self.plan
        wm, wn = p.warp
        loops = {lp.name: lp for lp in p.main.loops}
        self.warps_m, self.warps_n = (int(loops[p.loops[r]].extent.value)  # type: ignore[attr-defined]
                                      for r in ("wy", "wx"))
        if wm != 16:
            self._fail(f"its warp tile is {wm} rows tall; a wgmma warpgroup stacks 4 warps of 16 rows")
        if self.warps_m % 4:
            self._fail(f"it has {self.warps_m} warp rows, not whole warpgroups of 4 (block_m a multiple of 64)")
        if wn not in WGMMA_N:
            self._fail(f"its warp tile is {wn} columns wide; wgmma here takes N in {WGMMA_N}")
        if p.tile[p.k] not in (16, 32, 64):
            self._fail(f"block_k={p.tile[p.k]}; K-major wgmma tiles are rows of 32, 64 or 128 bytes (block_k "
                       "16, 32 or 64)")
        self.layouts = {"a": self._layout(p.a, 64), "b": self._layout(p.b, wn)}

    def _fail(self, why: str) -> None:
        fail(self.plan.main, why)  # "block B is annotated tensor_core='wgmma', but <why>"

    def _layout(self, op: Operand, group_extent: int) -> SharedLayout:
        """K-major when the operand's contiguous dimension is k; else MN-major atoms as wide as the warpgroup's
        slice of the operand allows (at most 64 elements = 128 bytes)."""
        rows, cols = self._tile_shape(op)
        slot = -(-rows * cols * 2 // ALIGN) * ALIGN
        if op.cols == self.plan.k:
            width = 2 * cols
            return SharedLayout(True, width, 16, 8 * width, slot)
        width = min(128, 2 * group_extent)
        return SharedLayout(False, width, rows * width, 8 * width, slot)

    # pieces -----------------------------------------------------------------------------------
    def _invariant_swizzle(self, op: Operand, threads: int) -> bool:
        return False  # the wgmma layouts swizzle byte-address bits; each chunk's offset is computed as it is

    def _chunk_offset(self, op: Operand) -> list[str]:
        lay = self.layouts["a" if op is self.plan.a else "b"]
        if lay.k_major:  # row sl_r of width bytes, chunk sl_q
            pre = f"sl_r * {lay.width} + sl_q * 16"
        else:  # k row sl_r, elements 8 * sl_q.. of the MN dimension
            per = lay.width // 2
            pre = (f"(sl_q * 8 / {per}) * {lay.lbo} + (sl_r >> 3) * {lay.sbo} + (sl_r & 7) * {lay.width} + "
                   f"(sl_q * 8 % {per}) * 2")
        return [f"const int sl_o = {pre};  // byte offset in the slot, then the swizzle on its address bits",
                f"const int sl_dst = sl_stage * {lay.slot_bytes // 2} + "
                f"((sl_o ^ (((sl_o >> 7) & {lay.mask}) << 4)) >> 1);"]

    def _descriptor(self, key: str, step: str) -> str:
        """Descriptor of operand ``key`` for k16 step ``step`` of slot ``sl_stage``, this thread's warpgroup."""
        p = self.plan
        lay = self.layouts[key]
        if key == "a":
            first = "sl_wg_m * 64"  # the warpgroup's first row of A
        else:
            first = f"{mangle(p.loops['wx'])} * {p.warp[1]}"
        if lay.k_major:
            offset = f"({first}) * {lay.width} + ({step}) * 32"
        else:
            offset = f"({first}) / {lay.width // 2} * {lay.lbo} + ({step}) * {2 * lay.sbo}"
        addr = f"sl_{key}_addr + sl_stage * {lay.slot_bytes} + {offset}"
        return f"({lay.descriptor_bits():#x}ull | (((unsigned long long)({addr}) & 0x3FFFF) >> 4))"

    def _mma_step(self) -> None:
        p = self.plan
        fn = f"sl_wgmma_n{p.warp[1]}_{'bf16' if p.dtype == 'bfloat16' else 'f16'}"
        trans = f"{int(not self.layouts['a'].k_major)}, {int(not self.layouts['b'].k_major)}"
        self.emit("sl_wgmma_fence();")
        self.loop("sl_ks", p.tile[p.k] // 16)
        self.emit(f"{fn}<{trans}>(&sl_acc[0][0][0], {self._descriptor('a', 'sl_ks')}, "
                  f"{self._descriptor('b', 'sl_ks')});")
        self.close()
        self.emit("sl_wgmma_commit();")

    # assembly ---------------------------------------------------------------------------------
    def write(self) -> tuple[str, KernelSpec]:
        p = self.plan
        consumers = 32 * self.warps_m * self.warps_n  # the warps that own accumulators
        threads = self._block_threads(consumers)
        wy, wx, ko = (mangle(p.loops[r]) for r in ("wy", "wx", "ko"))
        smem = {"a": mangle(p.a.shared.name), "b": mangle(p.b.shared.name)}
        self.emit("const int sl_tid = threadIdx.x, sl_lane = sl_tid & 31, sl_warp = sl_tid >> 5;")
        self.emit(f"const int {wy} = sl_warp % {self.warps_m}, {wx} = sl_warp / {self.warps_m};  "
                  "// warps 4j..4j+3: one warpgroup")
        self.emit(f"const int sl_wg_m = {wy} >> 2;")
        self._block_index()
        self.emit(f"const int sl_wm = {wy} * 16, sl_wn = {wx} * {p.warp[1]};")
        self.emit("const int sl_g = sl_lane >> 2, sl_t = sl_lane & 3;")
        self.emit(f"const unsigned sl_a_addr = sl_smem_addr(&{smem['a']}[0]), "
                  f"sl_b_addr = sl_smem_addr(&{smem['b']}[0]);")
        self.emit(f"float sl_acc[1][{p.warp[1] // 8}][4];  // = the wgmma's {p.warp[1] // 2} accumulator registers")
        if threads == consumers:
            self._zero_accumulators()
        self._loader(smem, threads)
        self._ring_setup()
        self._mainloop(ko)
        self.chunk = self._stage_chunk()
        if self.chunk:
            self._staged_epilogue(consumers)
        else:
            self._epilogue()  # the accumulator warps' work (in the warp-specialized kernel, inside their branch)
        self._end_roles()
        return self._assemble_wgmma(threads, smem)

    def _block_threads(self, consumers: int) -> int:
        """The block's threads: the accumulator warps (a producer warp is added where one feeds the ring)."""
        return consumers

    def _zero_accumulators(self) -> None:
        """Where a producer warp shares the block, only the accumulator warps' branch does this: zeros set for
        every thread meet the wgmma results where the branches join, and that made ptxas serialize the wgmmas
        (C7514) of the fp32-output kernel."""
        self.loop("sl_nt", self.plan.warp[1] // 8)
        self.loop("sl_e", 4)
        self.emit("sl_acc[0][sl_nt][sl_e] = 0.0f;")
        self.close()
        self.close()

    def _mainloop(self, ko: str) -> None:
        """Every k step: the ring refilled ``ahead`` tiles ahead, the step's wgmmas issued, one group in flight."""
        p = self.plan
        s = p.stages
        in_flight = 1 if s >= 3 else 0  # wgmma groups left running across a step
        ahead = s - 1 - in_flight  # tiles requested ahead of the one being multiplied
        if ahead:
            self.loop("sl_s", ahead)
            self.emit("if (sl_s < sl_ktiles) sl_load(sl_s, sl_s);")
            self._commit()
            self.close()
        self.open(f"for (int {ko} = 0; {ko} < sl_ktiles; ++{ko})")
        self.emit(f"const int sl_stage = {ko} % {s};")
        if not ahead:
            self.emit("__syncthreads();  // the previous step's wgmmas, complete in every warpgroup, read this slot")
            self.emit(f"sl_load(sl_stage, {ko});")
            self._commit()
        self._arrival(ko, ahead)
        self.emit("__syncthreads();")
        if ahead:
            # slot (kt + ahead) % s last fed the wgmmas of step kt + ahead - s <= kt - 1 - in_flight, which every
            # warpgroup has waited for before the barrier above
            self.emit(f"if ({ko} + {ahead} < sl_ktiles) sl_load(({ko} + {ahead}) % {s}, {ko} + {ahead});")
            self._commit()
        self._mma_step()
        self.emit(f"sl_wgmma_wait<{in_flight}>();")
        self.close()
        if in_flight:
            self.emit("sl_wgmma_wait<0>();")

    def _epilogue_barrier(self, consumers: int, why: str | None = None) -> None:
        """A barrier among the threads that write the output tile out (the block, here)."""
        self.emit(f"__syncthreads();  // {why}" if why else "__syncthreads();")

    def _end_roles(self) -> None:
        """After the epilogue: where the roles split for good, the accumulator warps' branch closes here."""

    # the ring's synchronisation: cp.async groups here, mbarrier phases in the TMA writer -----------
    def _ring_setup(self) -> None:
        """Before the first request."""

    def _commit(self) -> None:
        """After each request of one k step's tiles."""
        self.emit("sl_cp_async_commit();")

    def _arrival(self, ko: str, ahead: int) -> None:
        """Until this thread sees step ``ko``'s tiles in slot ``sl_stage`` (the barrier after it publishes them)."""
        self.emit(f"sl_cp_async_wait<{max(ahead - 1, 0)}>();")
        self.emit("sl_fence_proxy_async();  // generic-proxy writes, read next by the tensor cores")

    def _stage_chunk(self) -> int | None:
        """Output elements per 16-byte chunk when the tile can be written out in chunks (None: it cannot)."""
        p = self.plan
        out = self.func.buffer(p.writeback.store)
        if BYTES[out.dtype] > 4:  # staging_bytes holds a tile of at most 4-byte elements (an int64 ran past it)
            return None
        chunk = 16 // BYTES[out.dtype]
        col = next((w for w, m in p.wb_axes.items() if m == p.n), None)
        last = as_int(out.shape[-1])
        if col is None or p.writeback.store_indices[-1] != Var(col) or last is None or last % chunk:
            return None
        return chunk

    def _staged_epilogue(self, consumers: int) -> None:
        p = self.plan
        _, out, target = self._writeback_parts()
        bm, bn, ch = p.tile[p.m], p.tile[p.n], self.chunk
        ld = bn + stage_row_pad(BYTES[out.dtype]) // BYTES[out.dtype]
        om, on = self._origin(p.m), self._origin(p.n)
        self._epilogue_barrier(consumers, "every warpgroup's wgmmas are done: the ring now stages the output tile")
        # element by element where a pair may straddle the last column, or where the element size has no 4- or
        # 8-byte pair store (an int8 or bool output)
        if self.ragged(p.n) or BYTES[out.dtype] not in (2, 4):
            self._epilogue(lambda value: f"sl_out_s[(sl_row - {om}) * {ld} + (sl_col - {on})] = {value};")
        else:
            self._paired_epilogue("sl_out_s", f"(sl_row - {om}) * {ld} + (sl_col - {on})")
        self._epilogue_barrier(consumers)
        chunks, per_row = bm * bn // ch, bn // ch
        writers = consumers  # the accumulator warps write the staged tile out, as they staged it
        self.open_chunks(chunks, per_row, writers)
        self.emit(f"const int sl_row = {om} + sl_r, sl_col = {on} + sl_q * {ch};")
        guard = self.bounds_guard()
        self.emit(f"{f'if ({guard}) ' if guard else ''}SL_VSTORE(uint4, {mangle(out.name)}, {self._e(target)}, "
                  f"SL_VLOAD(uint4, sl_out_s, sl_r * {ld} + sl_q * {ch}));")
        self.close_chunks(chunks, writers)

    def _assemble_wgmma(self, threads: int, smem: dict[str, str]) -> tuple[str, KernelSpec]:
        p = self.plan
        t = ctype(p.dtype)
        sizes = {k: self.layouts[k].slot_bytes * p.stages for k in ("a", "b")}
        decls = ["SL_DYN_SHARED(sl_smem);",
                 f"const int sl_pad = ({ALIGN} - (int)(sl_smem_addr(&sl_smem[0]) & {ALIGN - 1})) & {ALIGN - 1};",
                 f"SL_SHARED_VIEW({t}, {smem['a']}, sl_smem, sl_pad, {sizes['a'] // 2});",
                 f"SL_SHARED_VIEW({t}, {smem['b']}, sl_smem, sl_pad + {sizes['a']}, {sizes['b'] // 2});"]
        stage = staging_bytes(p.tile[p.m], p.tile[p.n])
        if self.chunk:  # the output tile, over the ring once the mainloop is done
            out = self.func.buffer(p.writeback.store)
            decls.append(f"SL_SHARED_VIEW({ctype(out.dtype)}, sl_out_s, sl_smem, sl_pad, "
                         f"{stage // BYTES[out.dtype]});")
        la, lb = self.layouts["a"], self.layouts["b"]
        comment = (f"wgmma (sm_90a): block {p.tile[p.m]}x{p.tile[p.n]}x{p.tile[p.k]}, "
                   f"{self.warps_m // 4 * self.warps_n} warpgroup(s) of 64x{p.warp[1]}, "
                   f"{p.stages}-stage {self.loader}, "
                   f"raster {p.raster}; A {'K' if la.k_major else 'M'}-major {la.width}B swizzle, "
                   f"B {'K' if lb.k_major else 'N'}-major {lb.width}B swizzle")
        dynamic = max(sum(sizes.values()), stage) + ALIGN
        return self._finish(decls, comment, f"{threads}, 1", (threads, 1, 1), dynamic, 0)


def uses_wgmma(root: Block) -> bool:
    return dict(root.annotations).get("tensor_core") == "wgmma"

