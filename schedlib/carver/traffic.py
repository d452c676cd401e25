"""Footprints and global-memory traffic of one tiling: per block, per wave and in total, in sectors.

Why sectors: DRAM and L2 move 32-byte sectors, so a tile whose rows are 24 bytes long really costs 32 or
64 bytes per row depending on where the row starts.  Each access's contiguous run (its innermost tiled
dimension, merged with outer ones while the tile spans a dimension completely) is rounded to the
sectors it touches, averaged over the start offsets the tiling can produce.

Grid order: blocks are assumed to launch with the main block's last spatial axis fastest (blockIdx.x),
as the rules bind them, and split reduce axes slowest.  That order decides which tiles one wave of
resident blocks shares, i.e. the wave's working set that must fit in L2 for re-reads to stay on chip.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from schedlib.carver.problem import Access, Problem
from schedlib.rules.base import Tiling

RULE_SYMBOLIC_EXTENT = 4096  # the value rules plan a symbolic extent at (rules.analysis.const_or callers)


@dataclass(frozen=True)
class Geometry:
    """How one tiling cuts the main block's iteration space into CUDA blocks."""

    tile: Mapping[str, int]  # per-block extent of each main axis, clipped to the axis extent
    padded: Mapping[str, int]  # per-block extent as launched (threads past the edge still run)
    step: Mapping[str, int]  # per loop step of the block (the Tiling's step; the whole tile if none)
    counts: Mapping[str, int]  # blocks along each axis
    avg: Mapping[str, float]  # average useful extent per block (edge blocks are partial)
    grid: int  # blocks launched


def geometry(problem: Problem, tiling: Tiling) -> Geometry:
    """Per-axis tiles and block counts.

    Reduce axes follow the Tiling contract (a block reduces ``extent / split_k``).  Rules plan a symbolic
    extent at :data:`RULE_SYMBOLIC_EXTENT` (``const_or(extent, 4096)``), so on a symbolic axis a tile of
    exactly that size means "the whole axis" and is recomputed from the value being ranked.
    """
    tile: dict[str, int] = {}
    padded: dict[str, int] = {}
    step: dict[str, int] = {}
    split = max(1, int(tiling.split_k))
    for a in problem.axes:
        extent = problem.extents[a]
        given = tiling.block_tile.get(a)
        whole = given is None or (a in problem.symbolic_axes and given == RULE_SYMBOLIC_EXTENT)
        if problem.kinds[a] == "R" and (whole or a in problem.symbolic_axes):
            want = -(-extent // split)
        elif whole:
            want = extent
        else:
            want = int(given)  # type: ignore[arg-type]
        want = max(1, want)
        padded[a] = want
        tile[a] = min(want, extent)
        step[a] = max(1, min(int(tiling.step.get(a, tile[a])), tile[a]))
    counts = {a: -(-problem.extents[a] // padded[a]) for a in problem.axes}
    avg = {a: problem.extents[a] / counts[a] for a in problem.axes}
    return Geometry(tile, padded, step, counts, avg, math.prod(counts.values()))


@functools.lru_cache(maxsize=8192)
def sectors_per_run(run_bytes: int, align_bytes: int, sector: int) -> float:
    """Average sectors a contiguous run of ``run_bytes`` touches when it starts at a multiple of
    ``align_bytes`` (buffers themselves start sector-aligned)."""
    stride = math.gcd(align_bytes, sector) or sector
    offsets = range(0, sector, stride)
    return sum(-(-(o + run_bytes) // sector) for o in offsets) / len(offsets)


def contiguous_run(access: Access, tile: Mapping[str, float]) -> tuple[int, int]:
    """(elements in one contiguous run of a block's tile of ``access``, byte alignment of its start)."""
    exts = tuple(math.ceil(d.extent(tile)) for d in access.dims)
    return _run(access.sizes, exts, access.single, access.nbytes)


@functools.lru_cache(maxsize=65536)
def _run(sizes: tuple[int, ...], exts: tuple[int, ...], single: tuple[bool, ...], nbytes: int) -> tuple[int, int]:
    strides = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
    run = 1
    for d in range(len(sizes) - 1, -1, -1):
        run *= exts[d]
        if exts[d] < sizes[d]:
            # a tile along a plain axis starts at multiples of its extent; anything else at any index
            align = (exts[d] if single[d] else 1) * strides[d] * nbytes
            for outer in range(d):
                align = math.gcd(align, strides[outer] * nbytes)
            return run, align
    return run, 1 << 12  # the whole buffer: starts where the buffer does


@functools.lru_cache(maxsize=65536)
def _factor(sizes: tuple[int, ...], exts: tuple[int, ...], single: tuple[bool, ...], nbytes: int,
            sector: int) -> float:
    run, align = _run(sizes, exts, single, nbytes)
    run_bytes = max(1, run * nbytes)
    return sectors_per_run(run_bytes, align, sector) * sector / run_bytes


def block_elements(access: Access, tile: Mapping[str, float]) -> float:
    """Elements of ``access`` one block touches: the product over its dimensions of the tile extent."""
    return math.prod(d.extent(tile) for d in access.dims)


@dataclass(frozen=True)
class AccessTraffic:
    """One access under one tiling."""

    access: Access
    block_bytes: float  # one full block's footprint, sector-rounded
    step_bytes: float  # one pipeline step's footprint (what a block has in flight per round trip)
    total_bytes: float  # all blocks together, sector-rounded: the L2 traffic of this access
    wave_bytes: float  # distinct bytes one wave of resident blocks touches
    factor: float  # sector rounding factor


def distinct_per_wave(problem: Problem, geo: Geometry, resident: int, raster: int = 1) -> dict[str, int]:
    """Distinct tile indices along each axis among ``resident`` consecutively launched blocks.

    ``raster`` > 1 (a rule's swizzled block order): consecutive blocks walk ``raster`` rows of the last two
    spatial axes column by column, so a wave covers about ``raster`` block rows and ``resident / raster``
    block columns instead of whole rows."""
    order = [*problem.reduce, *problem.spatial]  # slowest first; the last spatial axis is blockIdx.x
    out: dict[str, int] = {}
    inner = 1
    for a in reversed(order):
        out[a] = min(geo.counts[a], -(-resident // inner))
        inner *= geo.counts[a]
    if raster > 1 and len(problem.spatial) >= 2:
        rows_axis, cols_axis = problem.spatial[-2], problem.spatial[-1]
        rows, cols = geo.counts[rows_axis], geo.counts[cols_axis]
        group = min(raster, rows)
        if resident <= group * cols:  # the wave stays within one group of block rows
            out[rows_axis] = min(group, resident)
            out[cols_axis] = min(cols, -(-resident // group))
        else:
            out[rows_axis] = min(rows, group * -(-resident // (group * cols)))
            out[cols_axis] = cols
    return out


def wave_tile(geo: Geometry, distinct: Mapping[str, int]) -> dict[str, float]:
    """Extent of each axis that one wave of resident blocks covers together."""
    return {a: min(geo.counts[a] * geo.avg[a], distinct[a] * geo.tile[a]) for a in geo.tile}


def access_traffic(access: Access, geo: Geometry, wave: Mapping[str, float], sector: int) -> AccessTraffic:
    """Footprints of ``access`` per block, per step, per wave and in total under ``geo``."""
    nb = access.nbytes
    tile_ext = [d.extent(geo.tile) for d in access.dims]
    step_ext = [d.extent(geo.step) for d in access.dims]
    factor = _factor(access.sizes, tuple(math.ceil(e) for e in tile_ext), access.single, nb, sector)
    step_factor = _factor(access.sizes, tuple(math.ceil(e) for e in step_ext), access.single, nb, sector)
    per_byte = nb * factor
    return AccessTraffic(
        access=access,
        block_bytes=math.prod(tile_ext) * per_byte,
        step_bytes=math.prod(step_ext) * nb * step_factor,
        total_bytes=geo.grid * block_elements(access, geo.avg) * per_byte,
        wave_bytes=block_elements(access, wave) * per_byte,
        factor=factor,
    )


def reused_in_block(access: Access, geo: Geometry) -> bool:
    """A load is reused inside a block when some tiled axis does not index it (each element feeds
    ``tile`` iterations), which is what makes staging it in shared memory worthwhile."""
    return any(geo.tile[a] > 1 and a not in access.axes for a in geo.tile)
