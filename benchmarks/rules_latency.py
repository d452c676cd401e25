"""How long ``sl.rules.apply_default`` takes to pick and build a schedule, per built-in workload.

The expert rules are the zero-search path: a schedule must come back in well under the time of one kernel
compile.  Target: median < 50 ms per workload at realistic (4096-class) sizes.  Each row times
``apply_default(func, target)`` alone (the Func is built once, outside the timed region) over ``--repeat``
runs after ``--warmup`` untimed ones, and prints median / p90 / max wall time and the median CPU time (on
a shared machine wall time includes waiting for a core; CPU time does not).  Exit status 1 when any row
misses the target.

    PYTHONPATH=. python benchmarks/rules_latency.py [--repeat 30] [--warmup 2] [--target h100] [--build]

``--build`` adds a column for ``sl.build`` of the returned schedule (CUDA generation), which is not part of
the target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import schedlib as sl
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.ir.func import Func

TARGET_MS = 50.0

WORKLOADS: list[tuple[str, Callable[[], Func]]] = [
    ("matmul 4096x4096x4096 fp16", lambda: wl.matmul(4096, 4096, 4096, "float16")),
    ("matmul 4096x4096x4096 fp32", lambda: wl.matmul(4096, 4096, 4096, "float32")),
    ("matmul 4096^3 fp16 +bias_relu", lambda: wl.matmul(4096, 4096, 4096, "float16", epilogue="bias_relu")),
    ("matmul Mx4096x4096 fp16 (M sym)", lambda: wl.matmul(sl.var("M"), 4096, 4096, "float16")),
    ("gemv 1x4096 . 4096x14336 fp16", lambda: wl.gemv(14336, 4096, "float16")),
    ("gemv 1x4096 . 4096x14336 fp16 (W^T)", lambda: wl.gemv(14336, 4096, "float16", trans=True)),
    ("softmax 4096x32000 fp32", lambda: wl.softmax(4096, 32000)),
    ("rmsnorm 4096x4096 fp32", lambda: wl.rmsnorm(4096, 4096)),
    ("layernorm 4096x4096 fp32", lambda: wl.layernorm(4096, 4096)),
    ("reduce sum 4096x4096 (last axis)", lambda: wl.reduce(4096, 4096, "sum")),
    ("reduce max 4096x4096 (first axis)", lambda: wl.reduce(4096, 4096, "max", axis=0)),
    ("transpose 4096x4096 fp32", lambda: wl.transpose(4096, 4096)),
    ("elementwise add+gelu 4096x4096", lambda: wl.elementwise((4096, 4096), ("add", "gelu"))),
]


def measure(func: Func, target: str, repeat: int, warmup: int, build: bool) -> dict[str, object]:
    for _ in range(warmup):
        rules.apply_default(func, target)
    wall, cpu, build_wall = [], [], []
    sch = None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        sch = rules.apply_default(func, target)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
        if build:
            b0 = time.perf_counter()
            sl.build(sch, target)
            build_wall.append(time.perf_counter() - b0)
    wall_ms = sorted(1e3 * w for w in wall)
    return {
        "rule": sch.rule,
        "median": statistics.median(wall_ms),
        "p90": wall_ms[min(len(wall_ms) - 1, int(0.9 * len(wall_ms)))],
        "max": wall_ms[-1],
        "cpu": 1e3 * statistics.median(cpu),
        "build": 1e3 * statistics.median(build_wall) if build_wall else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30, help="timed runs per workload (at least 20)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    ap.add_argument("--target", default="h100", help="hardware profile")
    ap.add_argument("--build", action="store_true", help="also time sl.build of the schedule (not targeted)")
    args = ap.parse_args(argv)
    if args.repeat < 20:
        ap.error("--repeat must be at least 20")

    header = (f"{'workload':38s} {'rule':18s} {'median ms':>9s} {'p90 ms':>8s} {'max ms':>8s} {'cpu ms':>8s}"
              + (f" {'build ms':>9s}" if args.build else "") + f"  target < {TARGET_MS:g} ms")
    print(f"apply_default latency on target {args.target}, {args.repeat} runs each (median wall time judged)")
    print(header)
    print("-" * len(header))
    missed = 0
    for name, make in WORKLOADS:
        r = measure(make(), args.target, args.repeat, args.warmup, args.build)
        ok = r["median"] < TARGET_MS
        missed += not ok
        print(f"{name:38s} {r['rule']:18s} {r['median']:9.2f} {r['p90']:8.2f} {r['max']:8.2f} {r['cpu']:8.2f}"
              + (f" {r['build']:9.2f}" if args.build else "") + f"  {'met' if ok else 'MISSED'}")
    print("-" * len(header))
    print(f"{len(WORKLOADS) - missed} of {len(WORKLOADS)} workloads meet the {TARGET_MS:g} ms target")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
