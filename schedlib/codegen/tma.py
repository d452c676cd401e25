"""The wgmma kernel fed by the Tensor Memory Accelerator instead of ``cp.async`` (root annotated
``tensor_core="wgmma"`` and ``loader="tma"``).

Everything of :mod:`schedlib.codegen.wgmma` stays (warpgroups, canonical swizzled layouts, descriptors, one
wgmma group in flight, the staged epilogue); only the ring's producer changes:

* one thread requests a k step's tiles with ``cp.async.bulk.tensor`` copies described by *tensor maps*
  (box, 32/64/128-byte swizzle), which the runtime builds per launch from the operands' shapes and passes as
  pointers (``@tmap:<buffer>`` parameters, :class:`schedlib.codegen.kernel_writer.TensorMapSpec`).  TMA
  writes exactly the canonical layouts wgmma reads: a K-major tile is one box of ``block_k x rows`` whose
  rows are the swizzle width; an MN-major tile is one box per 64-element (or narrower) atom column.
  Elements outside the operand are filled with zeros by the copy itself, so no thread tests bounds;
* each ring slot has an mbarrier: the requesting thread announces the slot's bytes (``expect_tx``), the
  copies count them down, and every thread waits for the slot's phase (parity = use of the slot, mod 2)
  instead of a cp.async group.  The block barrier after that wait stays: it is what tells the requesting
  thread that every warpgroup's wgmmas have finished with the slot it refills next;
* both writers and readers are the asynchronous proxy, so no proxy fence is needed between them.

The operands' contiguous dimensions must be whole 16-byte rows in global memory (multiples of 8 halves), as
tensor maps require; the rule checks it, and the runtime refuses a launch whose shapes break it.
"""

from __future__ import annotations

from schedlib.codegen.kernel_spec import KernelSpec, TensorMapSpec, tmap_param
from schedlib.codegen.mma_pattern import Operand
from schedlib.codegen.wgmma import ALIGN, SharedLayout, WgmmaWriter
from schedlib.ir.expr import Const, Expr, as_int
from schedlib.ir.func import Block, Func

LOADER = "tma"
TMAP_PREFIX = "@tmap:"  # launch parameters that are tensor maps of the named buffer
MBARRIER_BYTES = 8


def uses_tma(root: Block) -> bool:
    return dict(root.annotations).get("loader") == LOADER


class WgmmaTmaWriter(WgmmaWriter):
    loader = "TMA"
    issuer: str | None = "sl_tid == 0"  # the one thread that requests tiles (None: the caller already is it)

    def __init__(self, func: Func, root: Block, scratch: set[str]) -> None:
        super().__init__(func, root, scratch)
        for op in (self.plan.a, self.plan.b):
            if len(op.roles) > 3:
                self._fail(f"operand {op.source.name} has {len(op.roles)} dimensions; TMA copies here take at most "
                           "one batch dimension")
            row = as_int(op.source.shape[-1])
            if row is not None and (row * 2) % 16:
                self._fail(f"operand {op.source.name} has rows of {row} elements; a tensor map needs rows of whole "
                           "16-byte units (a multiple of 8)")
        self.maps = {key: self._map(op, self.layouts[key]) for key, op in (("a", self.plan.a), ("b", self.plan.b))}

    def _map(self, op: Operand, lay: SharedLayout) -> TensorMapSpec:
        rows, cols = self._tile_shape(op)
        box = (cols, rows, 1) if lay.k_major else (lay.width // 2, rows, 1)
        return TensorMapSpec(TMAP_PREFIX + op.source.name, op.source.name, op.source.dtype, box, lay.width)

    # the ring ---------------------------------------------------------------------------------
    def _loader(self, smem: dict[str, str], threads: int) -> None:
        p = self.plan
        bk = p.tile[p.k]
        self.emit(f"const int sl_ktiles = ({self._e(p.extent(p.k))} + {bk - 1}) / {bk};")
        stage_bytes = sum(2 * m.box[0] * m.box[1] * self._copies(key) for key, m in self.maps.items())
        self.emit("auto sl_load = [&](int sl_stage, int sl_kt) {")
        self.depth += 1
        if self.issuer:
            self.open(f"if ({self.issuer})")
        self.emit(f"sl_mbar_expect_tx(&sl_full[sl_stage], {stage_bytes});")
        for key, op in (("a", p.a), ("b", p.b)):
            self._copy_tma(key, op, smem[key])
        if self.issuer:
            self.close()
        self.depth -= 1
        self.emit("};")

    def _copies(self, key: str) -> int:
        """Boxes per tile: one K-major box, or one per atom column of an MN-major tile."""
        lay = self.layouts[key]
        op = self.plan.a if key == "a" else self.plan.b
        return 1 if lay.k_major else self._tile_shape(op)[1] // (lay.width // 2)

    def _copy_tma(self, key: str, op: Operand, smem: str) -> None:
        lay = self.layouts[key]
        tmap = f"&{tmap_param(op.source.name)}[0]"
        batch = self._e(self._batch_coordinate(op))
        for g in range(self._copies(key)):
            group = f" + {g * (lay.width // 2)}" if g else ""
            # K-major: x = k, y = the tile's rows; MN-major atom column g: x = m or n, y = k
            x, y = f"{self._origin(op.cols)}{group}", self._origin(op.rows)
            dst = f"&{smem}[sl_stage * {lay.slot_bytes // 2} + {g * lay.lbo // 2}]"
            self.emit(f"sl_tma_load_3d({dst}, {tmap}, {x}, {y}, {batch}, &sl_full[sl_stage]);")

    def _batch_coordinate(self, op: Operand) -> Expr:
        """The operand's batch index (0 for an operand without one, shared by the whole batch)."""
        return self._batch()[op.roles[0]] if len(op.roles) == 3 else Const(0)

    def _ring_setup(self) -> None:
        # A proxy fence orders the memory operations of the thread that runs it, and which thread issues the
        # copies depends on the template (thread 0, or the producer warp's lane 0): every thread runs it, once.
        for op in (self.plan.a, self.plan.b):
            self.emit(f"sl_tmap_acquire(&{tmap_param(op.source.name)}[0]);  // the map as the host wrote it")
        self.open("if (sl_tid == 0)")
        self.loop("sl_s", self.plan.stages)
        for name, count, why in self._barriers():
            self.emit(f"sl_mbar_init(&{name}[sl_s], {count});  // {why}")
        self.close()
        self.emit("sl_mbar_init_fence();")
        self.close()
        self.emit("__syncthreads();  // the barriers exist before anyone waits on them")

    def _barriers(self) -> tuple[tuple[str, str, str], ...]:
        """The mbarrier arrays of ``stages`` each, after the shared data: name, arrivals per phase, why."""
        return (("sl_full", "1", "one arrival (the requesting thread) per phase"),)

    def _commit(self) -> None:
        """TMA copies are tracked by the slot's mbarrier: nothing to commit."""

    def _arrival(self, ko: str, ahead: int) -> None:
        self.emit(f"sl_mbar_wait(&sl_full[sl_stage], ({ko} / {self.plan.stages}) & 1);  // this use of the slot")

    # assembly ---------------------------------------------------------------------------------
    def _finish(self, decls: list[str], comment: str, bounds: str, block: tuple[int, int, int], dynamic: int,
                static: int, tensor_maps: tuple[TensorMapSpec, ...] = ()) -> tuple[str, KernelSpec]:
        """The cp.async kernel's declarations plus the slots' mbarriers (after everything the ring and the staged
        output use, 8-byte aligned) and the tensor-map parameters."""
        stages = self.plan.stages
        offset = -(-(dynamic - ALIGN) // MBARRIER_BYTES) * MBARRIER_BYTES  # past the ring or staged output
        decls = list(decls)
        for name, _, _ in self._barriers():
            decls.append(f"SL_SHARED_VIEW(unsigned long long, {name}, sl_smem, sl_pad + {offset}, {stages});")
            offset += MBARRIER_BYTES * stages
        return super()._finish(decls, comment, bounds, block, offset + ALIGN, static,
                               (self.maps["a"], self.maps["b"]))
