"""How fast the CPU emulator runs a 16x16-tiled fp32 shared-memory matmul, on one core.

Targets: 64^3 in <= 50 ms and 256^3 in <= 1 s with threads=1. The library is compiled (and the
result checked against numpy) before timing, so the figures are launch time only: median of
several runs. Exit status 1 when a target is missed.  The targets are for one core: with ``--threads`` other
than 1 the times are printed "not judged" (neither met nor missed).

    python benchmarks/emulator_speed.py [--repeat 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# numpy's BLAS threads spin after the reference check and would steal the core being measured.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pathlib import Path

import numpy as np

from schedlib.runtime.emulator import KernelLaunch, cuda_prelude, emulate

# The kernel the emulator's own tests run: a 16x16-tiled fp32 matmul through shared memory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))
from emu_kernels import MATMUL

TARGETS = {64: 0.050, 256: 1.0}


def time_matmul(size: int, repeat: int, threads: int, bounds: bool = False) -> tuple[float, float]:
    """Median wall and CPU seconds of one launch of the size^3 matmul (compiled and verified first).

    CPU time is printed too because wall time on a shared machine includes waiting for the core.
    """
    rng = np.random.default_rng(size)
    A = rng.standard_normal((size, size), dtype=np.float32)
    B = rng.standard_normal((size, size), dtype=np.float32)
    C = np.full((size, size), np.nan, np.float32)
    tiles = -(-size // 16)
    launch = [KernelLaunch("matmul", (tiles, tiles, 1), (16, 16, 1), ("A", "B", "C", "M", "N", "K"))]
    args = {"A": A, "B": B, "C": C, "M": size, "N": size, "K": size}
    source = cuda_prelude() + MATMUL
    emulate(source, launch, args, threads=threads, bounds_check=bounds)  # compile + warm up
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-3, atol=1e-3)
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        emulate(source, launch, args, threads=threads, bounds_check=bounds)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def verdict(seconds: float, target: float, threads: int) -> str | None:
    """"met" or "MISSED" against a one-core target; None (not judged) for another thread count, whose time says
    nothing about that target either way."""
    if threads != 1:
        return None
    return "met" if seconds <= target else "MISSED"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args(argv)
    ok = True
    for size, target in TARGETS.items():
        t, cpu = time_matmul(size, opts.repeat, opts.threads)
        judged = verdict(t, target, opts.threads)
        ok &= judged != "MISSED"
        shown = judged or f"not judged (threads={opts.threads}, not 1)"
        print(f"matmul {size}^3, threads={opts.threads}: {t * 1e3:8.1f} ms wall, {cpu * 1e3:8.1f} ms CPU  "
              f"(target <= {target * 1e3:.0f} ms on 1 core: {shown})")
    t, cpu = time_matmul(256, max(1, opts.repeat // 2), opts.threads, bounds=True)
    print(f"matmul 256^3, threads={opts.threads}, bounds-checked: {t * 1e3:8.1f} ms wall, {cpu * 1e3:8.1f} ms CPU")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
