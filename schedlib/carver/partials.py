"""The price of splitting a reduction across blocks (a split-K matmul): partial results and a second kernel.

With ``split_k = S`` the first kernel writes S partial results per output, in the accumulation dtype, and a
second kernel reads them back, adds them and writes the output.  The model charges that round trip at DRAM
bandwidth (the partials are written once and read once; for large outputs they do not stay in L2) and the
second kernel's launch behind the first.  Without this price every split would look free, because the
first kernel alone only gets shorter as its k loop does.
"""

from __future__ import annotations

import math

from schedlib.carver.problem import Problem
from schedlib.hw import HardwareProfile
from schedlib.ir.dtype import BYTES

# A dependent kernel queued behind another on the same stream starts about this long after it ends
# (launch latencies of 1-3 us are typical of A100/H100 microbenchmarks).  A model assumption, not
# measured by this project.
SECOND_KERNEL_GAP_S = 1.5e-6


def split_cost(problem: Problem, split: int, profile: HardwareProfile) -> tuple[float, float]:
    """(seconds, DRAM bytes) the partials and the second kernel add to a ``split``-way split; (0, 0) for 1."""
    if split <= 1:
        return 0.0, 0.0
    outputs = math.prod(problem.extents[a] for a in problem.axes if problem.kinds[a] == "S")
    partial_bytes = split * outputs * BYTES[problem.acc_dtype]
    moved = 2.0 * partial_bytes  # written by the first kernel, read by the second
    return SECOND_KERNEL_GAP_S + moved / profile.dram_bytes_per_s, moved
