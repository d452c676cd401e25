"""The GPU suite's ceilings, measured on the card with CUDA events: device-to-device copy bandwidth, cuBLAS
GEMM throughput through cupy, and a copy of as many bytes as one workload moves."""

from __future__ import annotations

import pandas as pd


def ceilings() -> dict[str, float]:
    """Copy bandwidth and cuBLAS GEMM throughput, measured with CUDA events on random data."""
    import cupy as cp

    from schedlib.runtime.timing import benchmark

    n = 1 << 28  # 1 GiB of float32
    src = cp.random.standard_normal(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    copy = benchmark(lambda: dst.__setitem__(Ellipsis, src), repeat=20)
    out = {"bandwidth": 2 * 4 * n / (copy["median_us"] * 1e-6)}
    for dtype, key in (("float16", "fp16_flops"), ("float32", "fp32_flops")):
        m = 8192
        a = cp.random.standard_normal((m, m), dtype=cp.float32).astype(dtype)
        b = cp.random.standard_normal((m, m), dtype=cp.float32).astype(dtype)
        t = benchmark(lambda a=a, b=b: cp.matmul(a, b), repeat=20)
        out[key] = 2 * m**3 / (t["median_us"] * 1e-6)
    return out


def same_bytes_copy_us(rows: pd.DataFrame, flush_bytes: int) -> float:
    """Device time of a copy moving as many bytes as the rule default did (half read, half written), with the
    L2 flushed before each run: the ceiling a memory-bound kernel of this size can reach.  The suite's copy
    ceiling moves 2 GiB, where a ~35 us kernel also pays its launch and the ramp at its start and end."""
    import cupy as cp

    from schedlib.runtime.timing import benchmark, l2_flush_buffer

    rule = rows[rows["method"] == "rule"]
    if not len(rule) or not (float(rule["gbs"].iloc[0]) > 0):
        return float("nan")
    moved = float(rule["gbs"].iloc[0]) * 1e9 * float(rule["time_us"].iloc[0]) * 1e-6
    n = max(1, int(moved / 2 / 4))  # float32 elements each way
    src = cp.ones(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    flush = l2_flush_buffer(flush_bytes)
    return float(benchmark(lambda: dst.__setitem__(Ellipsis, src), repeat=20, flush=flush)["median_us"])
