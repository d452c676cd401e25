"""Timing on the GPU: warm-up, an L2 flush before every repetition, inputs rotated when they fit in L2,
median and spread.

:func:`repetitions` is the one timing policy of the project, written against two callables (time one run,
flush the cache) so the search's measuring worker, the report and the GPU suite all time kernels the same
way, and tests can drive it with a fake clock.  :func:`benchmark` binds it to cupy's CUDA events.

When one set of a kernel's arrays fits in L2, the callers time a round robin (:func:`round_robin`) over
:func:`rotation_copies` sets instead of one: writing the flush buffer evicts what the L2's replacement policy
chooses, not necessarily every line of the previous run, while a different set was never loaded at all.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from schedlib.runtime.gpu import require_cupy


def l2_flush_buffer(l2_bytes: int) -> Any:
    """A device buffer twice the L2 size; writing it evicts whatever a kernel left in L2."""
    cp = require_cupy()
    return cp.empty(max(2 * int(l2_bytes), 1 << 20) // 4, dtype=cp.float32)


MAX_ROTATION = 8  # input sets at most (each smaller than the L2, so at most 8 L2 sizes of memory)


def rotation_copies(set_bytes: int, l2_bytes: int, limit: int = MAX_ROTATION) -> int:
    """How many sets of a kernel's arrays (inputs and outputs, ``set_bytes`` together) the timing cycles
    through: 1 when one set is at least the L2, else enough for twice the L2, at most ``limit``."""
    if set_bytes <= 0 or set_bytes >= l2_bytes:
        return 1
    return max(1, min(int(limit), math.ceil(2 * l2_bytes / set_bytes)))


def round_robin(runs: Sequence[Callable[[], Any]]) -> Callable[[], None]:
    """One callable that performs the next of ``runs`` on each call, cycling."""
    if not runs:
        raise ValueError("round_robin needs at least one run")
    order = itertools.cycle(runs)

    def run() -> None:
        next(order)()

    return run


def repetitions(time_us: Callable[[], float], flush: Callable[[int], None] | None = None, *, warmup_runs: int = 3,
                warmup_ms: float = 0.0, min_repeats: int = 20, max_repeats: int = 20, target_ms: float = 0.0,
                factor: float = 1.0) -> list[float]:
    """Times of single runs in microseconds, each after ``flush(i)`` (when given).

    Warm-up: at least ``warmup_runs`` runs and ``warmup_ms`` of device time (clocks ramp up, caches and the
    instruction cache fill, lazy module loading happens).  Then as many timed runs as fill ``target_ms``,
    clamped to ``[min_repeats, max_repeats]`` and scaled by ``factor`` (the final re-benchmark asks for more).
    """
    spent, runs = 0.0, 0
    while runs < warmup_runs or spent < warmup_ms * 1000:
        spent += time_us()
        runs += 1
        if runs >= 1000:
            break
    per_run = max(spent / max(runs, 1), 1e-3)
    n = int(min(max(target_ms * 1000 / per_run, min_repeats), max_repeats) * factor)
    times = []
    for i in range(max(n, 1)):
        if flush is not None:
            flush(i)
        times.append(time_us())
    return times


def summarize(times_us: list[float]) -> dict[str, float]:
    """Median with the 20th/80th percentiles (the spread a report shows)."""
    arr = np.asarray(times_us, dtype=float)
    return {"median_us": float(np.median(arr)), "p20_us": float(np.percentile(arr, 20)),
            "p80_us": float(np.percentile(arr, 80)), "repeat": len(times_us)}


def event_timer(fn: Callable[[], Any]) -> Callable[[], float]:
    """``fn``'s device time in microseconds, measured with CUDA events on the current stream.

    A kernel shorter than the events' resolution (about 0.5 us) reads 0.0.  That reading is passed on as is,
    not clamped: the search's worker records such a config as an error (``BelowTimerResolution``) rather than
    let a made-up tiny time win (see ``measurement_from_reply`` in ``schedlib.search.backends.worker``)."""
    cp = require_cupy()
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def time_us() -> float:
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return float(cp.cuda.get_elapsed_time(start, stop)) * 1e3

    return time_us


def benchmark(fn: Callable[[], Any], *, warmup: int = 5, repeat: int = 20, flush: Any = None) -> dict[str, float]:
    """Median / p20 / p80 of ``fn``'s device time in microseconds, each repetition timed alone."""
    times = repetitions(event_timer(fn), (lambda i: flush.fill(1.0)) if flush is not None else None,
                        warmup_runs=warmup, min_repeats=repeat, max_repeats=repeat)
    return summarize(times)
