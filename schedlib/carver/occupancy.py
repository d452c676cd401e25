"""Resident blocks per SM, computed the way CUDA's occupancy calculator (``cuda_occupancy.h``) does.

Why a copy of the calculator rather than a rule of thumb: occupancy decides how many blocks share an SM,
which sets the wave count and how much memory latency the SM can hide, and the real rules have steps
(registers are granted per warp in ``register_alloc_unit`` chunks inside each of the four scheduler
sub-partitions; every block costs ``shared_memory_reserved_per_block`` extra shared memory, rounded to
``shared_memory_alloc_unit``).  A block whose registers or shared memory cross one of those steps loses a
whole resident block, and the ranking must see that.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlib.hw import HardwareProfile

# Warp schedulers per SM (cudaOccSubPartitionsPerMultiprocessor: 4 for every architecture since Volta,
# which covers every shipped profile).  Registers are allocated inside each sub-partition.
SUB_PARTITIONS = 4


@dataclass(frozen=True)
class Occupancy:
    """How many blocks of one launch configuration fit on an SM, and what stops more from fitting."""

    blocks_per_sm: int
    warps_per_block: int
    by_warps: int
    by_registers: int
    by_shared: int
    by_blocks: int
    registers_per_warp: int  # allocated, after rounding to the allocation unit
    shared_per_block: int  # allocated, after the driver reserve and rounding
    warps_per_sm: int  # resident warps when blocks_per_sm blocks are resident
    occupancy: float  # warps_per_sm / max_warps_per_sm
    limiter: str  # "warps", "registers", "shared" or "blocks" (the first binding one, in that order)

    @property
    def fits(self) -> bool:
        """At least one block can be resident (a launch that does not fit fails on the GPU)."""
        return self.blocks_per_sm > 0


def occupancy(profile: HardwareProfile, threads: int, registers: int, shared_bytes: int) -> Occupancy:
    """Blocks per SM for ``threads`` threads using ``registers`` registers each and ``shared_bytes`` of
    static plus dynamic shared memory, on ``profile`` (cudaOccMaxActiveBlocksPerMultiprocessor)."""
    if threads < 1:
        raise ValueError(f"occupancy: threads={threads} must be positive")
    ws = profile.warp_size
    warps = -(-threads // ws)
    max_warps = profile.max_threads_per_sm // ws
    by_warps = 0 if threads > profile.max_threads_per_block else max_warps // warps
    by_blocks = profile.max_blocks_per_sm

    # Registers: per-warp allocation rounded to the allocation unit; the hardware check assumes the
    # block's warps are spread over all sub-partitions at once (warps rounded up to a multiple of 4).
    regs = max(int(registers), 1)
    per_warp = profile.registers_per_warp(regs)
    regs_per_block_limit = profile.registers_per_sm  # regsPerBlock is 64 K on every shipped part
    hardware_view = per_warp * (-(-warps // SUB_PARTITIONS) * SUB_PARTITIONS)
    if regs > profile.max_registers_per_thread or hardware_view > regs_per_block_limit:
        by_registers = 0
    else:
        warps_per_partition = (profile.registers_per_sm // SUB_PARTITIONS) // per_warp
        by_registers = warps_per_partition * SUB_PARTITIONS // warps

    # Shared memory: request + per-block driver reserve, rounded to the allocation unit.
    allocated = profile.shared_allocation(int(shared_bytes))
    if shared_bytes > profile.shared_memory_per_block_optin:
        by_shared = 0
    elif allocated == 0:  # no shared memory and no reserve (before Ampere): no limit from it
        by_shared = by_blocks
    else:
        by_shared = profile.shared_memory_per_sm // allocated

    limits = {"warps": by_warps, "registers": by_registers, "shared": by_shared, "blocks": by_blocks}
    blocks = min(limits.values())
    limiter = next(name for name, value in limits.items() if value == blocks)
    return Occupancy(
        blocks_per_sm=blocks, warps_per_block=warps, by_warps=by_warps, by_registers=by_registers,
        by_shared=by_shared, by_blocks=by_blocks, registers_per_warp=per_warp, shared_per_block=allocated,
        warps_per_sm=blocks * warps, occupancy=blocks * warps / max_warps, limiter=limiter,
    )  # fmt: skip
