"""How ptxas shares the register file out among a block's threads.

Why here: the rules and the carver price a config's registers (they limit how many of its blocks stay
resident), and the code generator writes the same counts into kernels (a profile's register cap, the
warp-specialized kernel's ``setmaxnreg`` hand-over).  Both sides need one arithmetic, and neither should
import the other.
"""

from __future__ import annotations

HARDWARE_MAX = 255  # registers per thread on every CUDA architecture since Kepler
REGISTER_FILE = 65536  # 32-bit registers per SM, all of which one block may hold
GRANULE = 8  # registers per thread are allotted in eights

# The warp-specialized wgmma kernel (codegen/warp_specialized.py): one producer warpgroup beside the
# accumulator warps, which keeps this many registers per thread after setmaxnreg.dec (its loop needs about 30;
# CUTLASS keeps 40) and hands the rest over.
PRODUCER_THREADS = 128
PRODUCER_REGISTERS = 40
SETMAXNREG_MAX = 248  # the largest count setmaxnreg.inc accepts (a multiple of 8)


def block_limit(threads: int) -> int:
    """The most registers per thread ptxas gives a kernel compiled with ``__launch_bounds__(threads)`` (or
    ``(threads, 1)``): the register file shared out over the block in eights, at most 255."""
    return min(HARDWARE_MAX, REGISTER_FILE // max(threads, 1) // GRANULE * GRANULE)


def producer_register_split(consumers: int) -> tuple[int, int] | None:
    """(the block's per-thread count at entry, the accumulator threads' count after setmaxnreg.inc) for a
    warp-specialized kernel of ``consumers`` accumulator threads, or None when the hand-over would give them
    nothing: the entry count is already the most a thread can have (one accumulator warpgroup), or the
    producer's returned registers come to fewer than 8 per accumulator thread (six or more accumulator
    warpgroups).  (The emulator models the same pool: sl_emu_wgmma.h.)"""
    threads = consumers + PRODUCER_THREADS
    entry = block_limit(threads)
    spare = entry * threads - PRODUCER_REGISTERS * PRODUCER_THREADS
    grown = min(SETMAXNREG_MAX, spare // consumers // GRANULE * GRANULE)
    return (entry, grown) if grown > entry else None
