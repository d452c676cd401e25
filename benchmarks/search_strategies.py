"""Search strategies on recorded spaces: trials needed to reach 97% of the best, against random search.

    python3 benchmarks/search_strategies.py [--seeds 5] [--budget 200] [--jobs 2] [--remake]

Recorded spaces (``benchmarks/spaces/*.json``, replay format, made on first run or with ``--remake``):

* ``estimate``: the carver's ``estimate`` over every legal point of the matmul rule's space for a few shapes
  on the H100 profile.  The cost model is given knob and tiling features only (``features="knobs"``): with
  the carver's figures it would be handed the answer, since these "measurements" *are* carver estimates.
* ``perturbed`` (synthetic): the carver's estimate times effects it does not model - shared-memory bank
  conflicts (thread_n 8 with narrow copies), register pressure of 8x8 thread tiles, scalar copies of deep
  k slices - and 3 % log-normal noise: the situation on a real GPU, where the carver has the coarse picture
  right and the cost model (given the carver's figures, as when tuning on a GPU) must learn the rest.
* ``synthetic``: a hand-written time model over the same space (roofline with wave quantization, an
  occupancy/register trade-off, shared-memory bank conflicts, +-3 % log-normal noise) that the carver does
  not know; the cost model gets the carver's figures here too.

The baseline is random search's *expected* trials, exact for uniform sampling without replacement:
(N + 1) / (k + 1) for N legal configs of which k are within 97% of the best; the empirical random row is
printed as a check.

Every run starts cold (``warm_start=False``: no rule default, no carver top-k) so strategies compare on the
search alone, and stops at the first config within 97% of the space's best (time <= best / 0.97).  A run
that does not get there within ``--budget`` trials counts as the budget (shown with ">=").  Goal: the
cost-model-guided strategies need at most 1/3 of random search's trials.

Second table: the overhead of one search step apart from measurement (proposal, model, bookkeeping,
storage) once the study holds 500 records, per strategy and storage (target < 50 ms).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from script_args import Parser

import schedlib as sl
import schedlib.search as S
from schedlib.cli_args import positive
from schedlib.hw import resolve
from schedlib.rules import find_rule

SPACES = Path(__file__).resolve().parent / "spaces"
TARGET = "h100"
ESTIMATE_SHAPES = {
    "mm4096": {"M": 4096, "N": 4096, "K": 4096},
    "mm512x512x8192": {"M": 512, "N": 512, "K": 8192},
    "mm2048x256x2048": {"M": 2048, "N": 256, "K": 2048},
    "mm1024_fp16": {"M": 1024, "N": 1024, "K": 1024, "dtype": "float16"},
}
PERTURBED_SHAPES = {"mm4096": ESTIMATE_SHAPES["mm4096"], "mm2048x256x2048": ESTIMATE_SHAPES["mm2048x256x2048"]}
SYNTHETIC_SHAPE = {"M": 2048, "N": 2048, "K": 2048}
STRATEGIES = ("random", "grid", "tpe", "cmaes", "nsga2", "evolutionary")
GUIDED = ("tpe", "nsga2", "evolutionary")  # the strategies that screen with the cost model
OVERHEAD_AT = 500
RETRAIN_EVERY = 75  # CostModel.update refits after 15% more records: every 75 at 500


def synthetic_time(c: dict, M: int, N: int, K: int, rng: random.Random) -> float:
    """A structured time the carver does not model (see the module docstring)."""
    threads = (c["block_m"] // c["thread_m"]) * (c["block_n"] // c["thread_n"])
    regs = c["thread_m"] * c["thread_n"] + c["thread_m"] + c["thread_n"] + 40
    blocks_per_sm = max(1, min(32, 2048 // threads, 65536 // (regs * threads)))
    blocks = math.ceil(M / c["block_m"]) * math.ceil(N / c["block_n"])
    waves = math.ceil(blocks / (132 * blocks_per_sm))
    occupancy = min(1.0, blocks_per_sm * threads / 2048)
    ilp = min(1.0, c["thread_m"] * c["thread_n"] / 32)
    compute = 2 * M * N * K / (66.9e6 * (0.25 + 0.75 * ilp) * (0.5 + 0.5 * occupancy))
    traffic = M * N * K * 4 * (1 / c["block_m"] + 1 / c["block_n"]) / 3.0e6
    bank = 1.25 if c["thread_n"] == 8 and c["vector"] < 4 else 1.0
    tail = waves * 132 * blocks_per_sm / blocks
    base = max(compute, traffic) * bank * max(1.0, tail) * (1 + 0.06 * abs(math.log2(c["block_k"]) - 4))
    return base * math.exp(rng.gauss(0.0, 0.03))


def unmodelled(c: dict, rng: random.Random) -> float:
    """The factor a real GPU adds to the carver's estimate in the ``perturbed`` spaces."""
    f = 1.2 if c["thread_n"] == 8 and c["vector"] < 4 else 1.0  # bank conflicts on the B tile
    f *= 1.15 if c["thread_m"] * c["thread_n"] >= 64 else 1.0  # register pressure, spills
    f *= 1.1 if c["block_k"] == 32 and c["vector"] == 1 else 1.0  # scalar copies of a deep k slice
    return f * math.exp(rng.gauss(0.0, 0.03))


def _estimate_records(func: sl.Func, perturb: random.Random | None) -> list[dict]:
    from schedlib.carver import estimate

    profile = resolve(TARGET)
    space = find_rule(func, profile).space(func, profile)
    records = []
    for c in space.enumerate():
        t = estimate(func, profile, c)["est_time_us"]  # inf: no block fits on an SM
        if perturb is not None and math.isfinite(t):
            t *= unmodelled(c, perturb)
        records.append({"config": c, "time_us": t, "status": "ok" if math.isfinite(t) else "launch_error"})
    return records


def make_spaces(remake: bool) -> dict[str, Path]:
    """The recorded spaces, written once (``--remake`` rewrites them)."""
    profile = resolve(TARGET)
    out = {}
    for name, shape in ESTIMATE_SHAPES.items():
        path = SPACES / f"estimate_{name}.json"
        if remake or not path.exists():
            func = sl.workloads.matmul(**shape)
            S.write_recording(path, _estimate_records(func, None), func=func, device=TARGET,
                              origin=f"schedlib.carver.estimate on {TARGET}, every legal matmul config")
        out[f"estimate:{name}"] = path
    for i, (name, shape) in enumerate(PERTURBED_SHAPES.items()):
        path = SPACES / f"perturbed_{name}.json"
        if remake or not path.exists():
            func = sl.workloads.matmul(**shape)
            S.write_recording(path, _estimate_records(func, random.Random(7 + i)), func=func, device=TARGET,
                              origin="synthetic: carver estimate x unmodelled effects x 3% noise")
        out[f"perturbed:{name}"] = path
    path = SPACES / "synthetic_mm2048.json"
    if remake or not path.exists():
        func = sl.workloads.matmul(**SYNTHETIC_SHAPE)
        space = find_rule(func, profile).space(func, profile)
        rng = random.Random(2024)
        records = [{"config": c, "time_us": synthetic_time(c, **SYNTHETIC_SHAPE, rng=rng)} for c in space.enumerate()]
        S.write_recording(path, records, func=func, device=TARGET,
                          origin="synthetic roofline/occupancy/bank-conflict model with 3% noise")
    out["synthetic:mm2048"] = path
    return out


def _func_of(path: Path) -> sl.Func:
    kind, name = path.stem.split("_", 1)
    return sl.workloads.matmul(**{"estimate": ESTIMATE_SHAPES, "perturbed": PERTURBED_SHAPES}.get(kind, {}).get(
        name, SYNTHETIC_SHAPE))


def features_for(path: Path) -> str:
    """Knob and tiling features only where the recorded times *are* carver estimates (see the docstring)."""
    return "knobs" if path.stem.startswith("estimate_") else "auto"


def random_expectation(path: Path) -> float:
    """Expected trials of uniform random sampling without replacement to hit a config within 97%."""
    table = S.ReplayBackend(path).table.values()
    _, best = S.ReplayBackend(path).best
    good = sum(1 for r in table if r["status"] == "ok" and r["time_us"] <= best / 0.97)
    return (len(table) + 1) / (good + 1)


def run_one(job: tuple[str, str, int, int]) -> tuple[str, str, int, int | None, float]:
    """(space, strategy, seed, trials to reach 97% or None, wall seconds)."""
    path_text, strategy, seed, budget = job
    path = Path(path_text)
    backend = S.ReplayBackend(path)
    _, best = backend.best
    start = time.perf_counter()
    res = S.tune(_func_of(path), TARGET, trials=budget, strategy=strategy, storage="memory", backend=backend,
                 seed=seed, quiet=True, warm_start=False, stop_below_us=best / 0.97,
                 features=features_for(path))
    return path.stem, strategy, seed, S.trials_to_reach(res.history, best / 0.97), time.perf_counter() - start


def overhead(job: tuple[str, str, str]) -> tuple[str, str, list[float], float]:
    """Step overheads (s) of ``strategy`` once the study holds OVERHEAD_AT records, on a ``kind`` storage."""
    path_text, strategy, kind = job
    path = Path(path_text)
    func, backend = _func_of(path), S.ReplayBackend(path)
    with tempfile.TemporaryDirectory() as tmp:
        storage = {"memory": None, "journal": f"{tmp}/o.journal", "sqlite": f"{tmp}/o.sqlite3"}[kind]
        if storage is None:
            from optuna.storages import InMemoryStorage

            storage = InMemoryStorage()
        S.tune(func, TARGET, trials=OVERHEAD_AT, strategy="random", storage=storage, backend=backend, quiet=True,
               warm_start=False, features="knobs")
        start = time.perf_counter()
        res = S.tune(func, TARGET, trials=OVERHEAD_AT + 21, strategy=strategy, storage=storage, backend=backend,
                     quiet=True, warm_start=False, features=features_for(path), seed=1)
        wall = time.perf_counter() - start
    rows = res.records[(res.records["trial"] > OVERHEAD_AT).fillna(False)]
    return strategy, kind, list(rows["overhead_s"]), wall


def _mean(values: list[int | None], budget: int) -> tuple[str, float]:
    nums = [budget if v is None else v for v in values]
    mean = statistics.mean(nums)
    return f"{'>=' if any(v is None for v in values) else ''}{mean:.1f}", mean


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The options and the strategies, checked here: a bad name would fail in a pool worker, as a traceback."""
    ap = Parser(prog="search_strategies.py", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=positive, default=8, help="runs per strategy and space (default 8)")
    ap.add_argument("--budget", type=positive, default=300, help="trials per run at most (default 300)")
    ap.add_argument("--jobs", type=positive, default=2, help="worker processes (default 2)")
    ap.add_argument("--remake", action="store_true", help="rewrite the recorded spaces")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help=f"comma-separated, of {', '.join(STRATEGIES)} (default: all)")
    ap.add_argument("--skip-overhead", action="store_true", help="no overhead table")
    ap.add_argument("--skip-search", action="store_true", help="only the overhead table")
    args = ap.parse_args(argv)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        ap.error(f"--strategies: unknown strategy(s) {', '.join(unknown) or '(none given)'}; choose from "
                 f"{', '.join(STRATEGIES)}")
    return args, strategies


def main(argv: list[str] | None = None) -> int:
    args, strategies = parse_args(argv)
    spaces = make_spaces(args.remake)
    print("Recorded spaces (replay backend; matmul rule, H100 profile, every legal config):")
    for name, path in spaces.items():
        rec = S.read_recording(path)
        print(f"  {name:26s} {len(rec['records'])} configs, model features '{features_for(path)}'  "
              f"[{rec['meta'].get('origin')}]")
    jobs = [(str(p), s, seed, args.budget) for p in spaces.values() for s in strategies
            for seed in range(1 if s == "grid" else args.seeds)]  # grid is deterministic
    if args.skip_search:
        jobs = []
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(run_one, jobs, chunksize=1)
    if args.skip_search:
        return overhead_table(spaces, strategies, args.jobs)
    print(f"\n{len(jobs)} search runs in {time.perf_counter() - start:.0f} s ({args.jobs} processes)\n")

    by: dict[tuple[str, str], list[int | None]] = {}
    for space, strategy, _seed, hit, _wall in results:
        by.setdefault((space, strategy), []).append(hit)
    stems = [p.stem for p in spaces.values()]
    expected = {p.stem: random_expectation(p) for p in spaces.values()}
    print(f"Trials to reach 97% of the best: mean over {args.seeds} seeds (grid: 1), budget {args.budget} "
          f"('>=': some runs hit the budget), cold start; in brackets the ratio to random search's expectation")
    width = 22
    print(f"{'strategy':16s}" + "".join(f"{n[:width - 1]:>{width}s}" for n in stems) + f"{'mean ratio':>12s}")
    print(f"{'random (expect)':16s}" + "".join(f"{expected[n]:>{width}.1f}" for n in stems) + f"{1.0:>12.2f}")
    ratios: dict[str, dict[str, float]] = {}
    for strategy in strategies:
        cells = []
        for n in stems:
            text, mean = _mean(by[(n, strategy)], args.budget)
            ratios.setdefault(strategy, {})[n] = mean / expected[n]
            cells.append(f"{text} ({'>=' if text.startswith('>=') else ''}{mean / expected[n]:.2f})")
        avg = statistics.mean(ratios[strategy].values())
        print(f"{strategy:16s}" + "".join(f"{c:>{width}s}" for c in cells) + f"{avg:>12.2f}")

    print("\nGoal: cost-model-guided strategies need <= 1/3 of random search's trials (ratio <= 0.33)")
    groups = {"estimate (knob features only)": [n for n in stems if n.startswith("estimate_")],
              "perturbed + synthetic (with carver features)": [n for n in stems if not n.startswith("estimate_")]}
    for strategy in (s for s in strategies if s in GUIDED):
        parts = []
        for label, names in groups.items():
            if names:
                avg = statistics.mean(ratios[strategy][n] for n in names)
                met = sum(ratios[strategy][n] <= 1 / 3 for n in names)
                parts.append(f"{label}: mean {avg:.2f} {'met' if avg <= 1 / 3 else 'MISSED'} "
                             f"({met}/{len(names)} spaces met)")
        print(f"  {strategy:13s} " + "; ".join(parts))

    if args.skip_overhead:
        return 0
    return overhead_table(spaces, strategies, args.jobs)


def overhead_table(spaces: dict[str, Path], strategies: list[str], jobs: int) -> int:
    path = spaces["perturbed:mm4096"]
    ojobs = [(str(path), s, "memory") for s in strategies if s != "grid"]
    ojobs += [(str(path), "evolutionary", k) for k in ("journal", "sqlite")]
    with mp.get_context("spawn").Pool(jobs) as pool:
        overheads = pool.map(overhead, ojobs, chunksize=1)
    print(f"\nOverhead of one search step apart from measurement (proposal, model, bookkeeping, storage), "
          f"{OVERHEAD_AT} records in the study, 20 steps (target < 50 ms)")
    print("  first: the step that featurizes and fits the model on all records (cold, once per process); "
          f"amortized: steady mean + first / {RETRAIN_EVERY} (the model refits after 15% more records)")
    print(f"{'strategy':14s}{'storage':>9s}{'median ms':>11s}{'steady mean':>13s}{'first ms':>10s}"
          f"{'amortized':>11s}   verdict")
    for strategy, kind, values, _wall in overheads:
        ms = [v * 1000 for v in values]
        steady = statistics.mean(ms[1:])
        amortized = steady + ms[0] / RETRAIN_EVERY
        print(f"{strategy:14s}{kind:>9s}{statistics.median(ms):>11.1f}{steady:>13.1f}{ms[0]:>10.1f}"
              f"{amortized:>11.1f}   {'met' if amortized < 50 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
