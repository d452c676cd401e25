"""Timing on the GPU with CUDA events: warm-up, an L2 flush before every repetition, median and spread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from schedlib.runtime.gpu import require_cupy


def l2_flush_buffer(l2_bytes: int) -> Any:
    """A device buffer twice the L2 size; writing it evicts whatever a kernel left in L2."""
    cp = require_cupy()
    return cp.empty(max(2 * int(l2_bytes), 1 << 20) // 4, dtype=cp.float32)


def benchmark(fn: Callable[[], Any], *, warmup: int = 5, repeat: int = 20, flush: Any = None) -> dict[str, float]:
    """Median / p20 / p80 of ``fn``'s device time in microseconds, each repetition timed alone."""
    cp = require_cupy()
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(repeat):
        if flush is not None:
            flush.fill(1.0)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
    arr = np.asarray(times)
    return {"median_us": float(np.median(arr)), "p20_us": float(np.percentile(arr, 20)),
            "p80_us": float(np.percentile(arr, 80)), "repeat": repeat}
