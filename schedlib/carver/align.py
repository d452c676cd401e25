"""Hardware alignment of a tiling: whole warps, whole memory sectors, whole tensor-core fragments.

Roller's first rule is that a tile which is not aligned to the hardware's natural units wastes it: a
block of 48 threads leaves 16 lanes of its second warp idle, a 16-byte row of a tile fetches a 32-byte
sector and uses half, an MMA tile that is not a multiple of the instruction shape needs padding.  The
carver ranks aligned points only (and says so when a problem admits none, e.g. an odd tiny shape).
Alignment is a property of the *tiling*, not of the problem: a row stride that no config can change
(an 80-byte fp16 row of K=40) does not make every point unaligned.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from schedlib.carver.problem import Access, Problem
from schedlib.carver.traffic import Geometry
from schedlib.hw import HardwareProfile
from schedlib.rules.base import Tiling

# Preferred mma.sync shape per operand width; the profile's list decides what exists.
_PREFERRED_MMA = {1: "m16n8k32", 2: "m16n8k16", 4: "m16n8k8"}
_SHAPE = re.compile(r"m(\d+)n(\d+)k(\d+)")


def mma_shape(profile: HardwareProfile, operand_bytes: int) -> tuple[int, int, int] | None:
    """The (m, n, k) of the tensor-core instruction a tile must be a multiple of (None: no tensor cores)."""
    shapes = [s for s in profile.tensor_core_shapes if _SHAPE.fullmatch(s)]
    if not shapes:
        return None
    wanted = _PREFERRED_MMA.get(operand_bytes, "m16n8k16")
    m = _SHAPE.fullmatch(wanted if wanted in shapes else shapes[0])
    assert m is not None
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def _run_aligned(access: Access, tile: Mapping[str, int], sector: int) -> bool:
    """The innermost dimension's tile is whole sectors long, or spans the dimension completely."""
    if not access.dims:
        return True
    last = access.dims[-1]
    ext = int(last.extent(tile))
    return ext >= last.size or (ext * access.nbytes) % sector == 0


def alignment_issue(problem: Problem, geo: Geometry, tiling: Tiling, profile: HardwareProfile,
                    minor: Collection[Access] = ()) -> str | None:
    """Why this tiling is not aligned to the hardware (None when it is).

    ``minor`` accesses carry too little of the traffic for their sector use to matter (a GEMV's
    output next to its weight matrix) and are not held to the sector rule, nor to the vector width.
    """
    ws = profile.warp_size
    if tiling.threads % ws:
        return f"{tiling.threads} threads is not a whole number of {ws}-thread warps"
    sector = profile.transaction_bytes.global_sector
    # the element the vector widens: that of the loads carrying the traffic (a per-row fp32 scale beside an
    # int8 weight is loaded once per row, not in vectors)
    major = [a for a in problem.loads if a not in minor] or list(problem.loads)
    operand = max((a.nbytes for a in major), default=4)
    vec_bytes = tiling.vector * operand
    if vec_bytes > 16 or vec_bytes & (vec_bytes - 1):
        return f"vector of {tiling.vector} x {operand} bytes is not a 1/2/4/8/16-byte access"
    for access in problem.loads:
        if access not in minor and not _run_aligned(access, geo.step, sector):
            return f"each step reads {access.buffer} in rows that are not whole {sector}-byte sectors"
    for access in problem.stores:
        if access not in minor and not _run_aligned(access, geo.tile, sector):
            return f"each block writes {access.buffer} in rows that are not whole {sector}-byte sectors"
    if tiling.tensor_core:
        shape = mma_shape(profile, operand)
        if shape is None:
            return f"{profile.name} lists no mma shape for tensor cores"
        m, n, k = shape
        spatial = [a for a in problem.spatial if geo.padded[a] > 1][-2:]
        if len(spatial) == 2:
            (am, an) = spatial
            if geo.padded[am] % m or geo.padded[an] % n:
                return f"block tile {geo.padded[am]}x{geo.padded[an]} is not a multiple of the m{m}n{n} MMA tile"
        for r in problem.reduce:
            if geo.step[r] % k and geo.step[r] < problem.extents[r]:
                return f"reduction step {geo.step[r]} is not a multiple of the MMA k={k}"
    return None
