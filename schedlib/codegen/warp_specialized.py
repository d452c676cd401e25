"""The TMA-fed wgmma kernel with a *producer warp* (root annotated ``tensor_core="wgmma"``, ``loader="tma"``
and ``producer="warp"``): the warps that multiply never wait for one another inside the mainloop.

In :mod:`schedlib.codegen.tma` one of the multiplying threads requests the tiles, and a block barrier every k
step tells it which slot every warpgroup has finished with.  Here the roles are split, as in the
warp-specialized kernels of the CUTLASS 3 family:

* one extra warpgroup (the last) holds the producer: lane 0 of its first warp walks the k steps, waits
  until the slot of step ``kt`` is *empty* (released by every accumulator warp after its last use,
  ``kt - stages``), announces the slot's bytes and requests the tiles; the ring thus runs ``stages - 1``
  tiles ahead, one more than the single-role kernel, which must keep the slot of the wgmma group in flight;
* each accumulator warp waits for the slot to be *full*, issues the step's wgmmas, waits until only this
  step's group is in flight, and then releases the previous step's slot (one arrival per warp on its
  ``empty`` mbarrier, whose count is the number of accumulator warps);
* the producer starts on the empty barriers' parity 1, which a fresh barrier reports as completed, so the
  first ``stages`` requests do not wait; after that it waits for parity ``(kt / stages + 1) & 1``.

After the set-up the roles never meet again.  The accumulator warps synchronise among themselves with a
named barrier (``sl_named_barrier``), stage the output tile in the ring and write it out; the producer
warpgroup is done once it has requested the last tile.  That split is what lets the register file be
divided as in CUTLASS: the block is compiled for the register cap of all its threads (168 at 384 threads),
the producer warpgroup gives all but 40 of its registers back (``setmaxnreg.dec``) and the accumulator
warpgroups take them (``setmaxnreg.inc``, 232 at two warpgroups).  ptxas allocates each branch for its own
count, which it can only do because no code after the split runs in both; the same calls in code that
joins again make ptxas fit the joined part to 40 registers (over a kilobyte of spills, and C7512).  The block
stays whole warpgroups, as wgmma kernels are written (the producer's other three warps only give their
registers back).  A ring of one slot cannot work (the slot of the wgmma group in flight could never be
released), so at least two stages are required.
"""

from __future__ import annotations

from schedlib.codegen.tma import WgmmaTmaWriter
from schedlib.hw.registers import PRODUCER_REGISTERS, PRODUCER_THREADS, producer_register_split
from schedlib.ir.func import Block, Func

PRODUCER = "warp"  # the root's ``producer`` annotation
TILE_BARRIER = 1  # the named barrier of the accumulator warps (0 is __syncthreads')


def uses_producer_warp(root: Block) -> bool:
    return dict(root.annotations).get("producer") == PRODUCER


class WgmmaProducerWarpWriter(WgmmaTmaWriter):
    loader = "TMA, producer warp"
    issuer = None  # the producer loop runs on one lane already

    def __init__(self, func: Func, root: Block, scratch: set[str]) -> None:
        super().__init__(func, root, scratch)
        if self.plan.stages < 2:
            self._fail("a producer warp needs a ring of at least 2 stages (pipeline_stages=1): the slot of the "
                       "wgmma group in flight is released only after the next step's group is issued")

    def _block_threads(self, consumers: int) -> int:
        return consumers + PRODUCER_THREADS

    def _barriers(self) -> tuple[tuple[str, str, str], ...]:
        return (("sl_full", "1", "the producer's arrival, plus the slot's bytes"),
                ("sl_empty", str(self.warps_m * self.warps_n), "one release per accumulator warp"))

    def _mainloop(self, ko: str) -> None:
        """The producer's loop, then the accumulator warps' loop; their branch stays open for the epilogue."""
        s = self.plan.stages
        consumer_warps = self.warps_m * self.warps_n
        split = producer_register_split(32 * consumer_warps)
        self.open(f"if (sl_warp >= {consumer_warps})")  # the producer warpgroup
        if split:
            self.emit(f"sl_setmaxnreg_dec<{PRODUCER_REGISTERS}>();  // the block was given {split[0]} per thread")
        self.open(f"if (sl_warp == {consumer_warps} && sl_lane == 0)")
        self.open("for (int sl_kt = 0; sl_kt < sl_ktiles; ++sl_kt)")
        self.emit(f"const int sl_stage = sl_kt % {s};")
        self.emit(f"sl_mbar_wait(&sl_empty[sl_stage], ((sl_kt / {s}) & 1) ^ 1);  // released after use kt - {s}")
        self.emit("sl_load(sl_stage, sl_kt);")
        self.close()
        self.close()
        self.close()
        self.open("else")
        if split:
            self.emit(f"sl_setmaxnreg_inc<{split[1]}>();  // what the producer gave back")
        self._zero_accumulators()
        self.open(f"for (int {ko} = 0; {ko} < sl_ktiles; ++{ko})")
        self.emit(f"const int sl_stage = {ko} % {s};")
        self.emit(f"sl_mbar_wait(&sl_full[sl_stage], ({ko} / {s}) & 1);  // this use of the slot")
        self._mma_step()
        self.emit("sl_wgmma_wait<1>();  // the previous step's group is done: its slot may be refilled")
        self.emit(f"if ({ko} > 0 && sl_lane == 0) sl_mbar_arrive(&sl_empty[({ko} + {s - 1}) % {s}]);")
        self.close()
        self.emit("sl_wgmma_wait<0>();")

    # the epilogue runs in the accumulator warps' branch: the producer has no part in it ----------------
    def _epilogue_barrier(self, consumers: int, why: str | None = None) -> None:
        # the producer's copies are complete by now: every one of them fed a wgmma that has been waited for
        self.emit(f"sl_named_barrier<{TILE_BARRIER}, {consumers}>();  // {why or 'the output tile is staged'}")

    def _end_roles(self) -> None:
        self.close()
