"""Where a tiling's bytes come from: the loads staged in shared memory, each access's traffic summed over
the grid, and a row kernel's later passes, charged to the level that holds the rows in flight.

The model (:mod:`schedlib.carver.model`) turns these byte counts into times.
"""

from __future__ import annotations

import math

from schedlib.carver.problem import Problem
from schedlib.carver.traffic import (
    Geometry,
    access_traffic,
    block_elements,
    distinct_per_wave,
    reused_in_block,
    wave_tile,
)
from schedlib.hw import HardwareProfile
from schedlib.rules.base import Tiling

# Share of the L2 that holds reusable tiles: set conflicts, the two-partition split on A100/H100 and
# streaming data mean the full capacity is never available for reuse.
L2_USABLE_FRACTION = 0.75
# A row kernel's later passes find less: every SM streams new rows through L2 between a row's first read and
# its re-read.  Measured on an H200 (50 MiB L2, 2026-11-28): rows in flight totalling 17 MB were re-read
# from L2 (softmax 4096 x 4096, 256 threads: 36.6 us, the DRAM floor), 35 MB were not (64 threads: 70.7 us;
# RMSNorm 4096 x 32000 unstaged 332 us against 276 us staged), so the usable share lies between a third
# and two thirds.
ROW_PASS_L2_FRACTION = 0.4


def l2_overflow(working_set: float, usable_l2: float) -> float:
    """The share of ``working_set`` that does not fit ``usable_l2`` bytes (0 when it fits)."""
    return min(1.0, max(0.0, 1.0 - usable_l2 / working_set)) if working_set > 0 else 0.0


def staged_loads(problem: Problem, tiling: Tiling, geo: Geometry) -> set[str]:
    """Loads held in shared memory: what the Tiling names (``shared_buffers``, when a rule's Tiling has
    it), else the reused loads whose per-step tiles (times the pipeline depth) fill the block's shared
    memory, 90-100%: a matmul's A and B tiles account for all of it, while a reduction's few bytes of
    partial sums account for none of its input."""
    named = tiling.shared_buffers
    if named is not None:
        return set(named)
    if tiling.shared_bytes <= 0:
        return set()
    stages = max(1, tiling.stages)
    need = {acc.buffer: math.prod(d.extent(geo.step) for d in acc.dims) * acc.nbytes * stages
            for acc in problem.loads if reused_in_block(acc, geo)}
    total = sum(need.values())
    return set(need) if 0.9 * tiling.shared_bytes <= total <= tiling.shared_bytes * 1.001 else set()


def later_passes(problem: Problem, tiling: Tiling, geo: Geometry, loads: list, staged: set[str], bps: int,
                  profile: HardwareProfile) -> tuple[float, float, float, float]:
    """What a block's further passes over its input tiles (``Tiling.rereads``) cost: L2 bytes and DRAM bytes
    for the whole grid, and shared/L1 port bytes and load instructions per block.

    A staged input is read from shared memory.  Otherwise the pass goes to global memory: L1 keeps the
    resident blocks' tiles when they fit in the part of the unified L1/shared array that their shared
    memory leaves free (the array is taken as ``shared_memory_per_sm``, a little under its real size), else
    L2 serves them, and DRAM the share of one wave's tiles that exceeds the usable L2."""
    if not tiling.rereads:
        return 0.0, 0.0, 0.0, 0.0
    vector = max(1, int(tiling.vector))
    block_bytes = port = instr = 0.0
    for t in loads:
        again = int(tiling.rereads.get(t.access.buffer, 0))
        if again <= 0:
            continue
        elements = t.block_bytes / t.factor / t.access.nbytes
        port += again * elements * max(t.access.nbytes, 4)
        instr += again * elements / vector
        if t.access.buffer not in staged:
            block_bytes += again * t.block_bytes
    if block_bytes == 0:
        return 0.0, 0.0, port, instr
    resident = max(1, bps)
    l1_free = profile.l1_left(resident, int(tiling.shared_bytes))
    footprint = sum(t.block_bytes for t in loads if t.access.buffer in tiling.rereads)
    if resident * footprint <= l1_free:
        return 0.0, 0.0, port, instr
    wave_set = footprint * min(geo.grid, resident * profile.sm_count)
    overflow = l2_overflow(wave_set, ROW_PASS_L2_FRACTION * profile.l2_bytes)
    total = block_bytes * geo.grid
    return total, total * overflow, port, instr


# Co-resident blocks walk their reduce loops at about the same pace, so the data several blocks of one
# wave share (a matmul's A rows across the wave's block columns) has to stay in L2 only while the k steps
# that read it are in flight: the steps a block pipelines plus the drift between blocks, taken as 4.
IN_FLIGHT_STEPS = 4


def traffic_sums(problem: Problem, geo: Geometry, resident: int, sector: int, raster: int = 1) -> tuple:
    """Per-access traffic and its sums: L2 bytes, the working sets, one block's footprint, useful bytes,
    and the re-read bytes split by what keeps them in L2.

    A re-read of data an earlier wave read needs the wave's whole footprint to survive in L2 until the next
    wave (``wave_set``); a re-read by another block of the same wave needs only the in-flight k slices of
    that footprint (``inflight_set``).  Each wave reads its footprint once from L2's point of view, so the
    earlier-wave re-reads are the waves' footprints beyond the compulsory bytes."""
    distinct = distinct_per_wave(problem, geo, resident, raster)
    wave = wave_tile(geo, distinct)
    inflight = {a: min(ext, geo.step[a] * IN_FLIGHT_STEPS) if a in problem.reduce else ext
                for a, ext in wave.items()}
    waves = geo.grid / max(1, resident)
    loads = [access_traffic(a, geo, wave, sector) for a in problem.loads]
    stores = [access_traffic(a, geo, wave, sector) for a in problem.stores]
    # Only re-read data needs to stay in L2: an access whose blocks together read more than its size.
    # Streamed data (each byte used once, like a GEMV's matrix) passes through and is not counted.
    l2_bytes = wave_set = inflight_set = block_global = useful_bytes = same_wave = later_wave = 0.0
    for t in (*loads, *stores):
        l2_bytes += t.total_bytes
        block_global += t.block_bytes
        useful_bytes += t.total_bytes / t.factor
        once = t.access.size * t.access.nbytes * t.factor
        extra = t.total_bytes - once
        if not t.access.store and extra > 0.5 * t.access.nbytes:
            wave_set += t.wave_bytes
            inflight_set += block_elements(t.access, inflight) * t.access.nbytes * t.factor
            later = min(extra, max(0.0, waves * t.wave_bytes - once))
            later_wave += later
            same_wave += extra - later
    return (loads, stores, l2_bytes, wave_set, inflight_set, block_global, useful_bytes, same_wave, later_wave)
