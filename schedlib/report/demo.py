"""``schedlib demo``, the main job: the built-in suite end to end.

1. Rules: every workload gets its expert schedule, built to CUDA and verified at reduced sizes (every size
   capped at ``limit``) — on the GPU when there is one, else on the CPU emulator — and compile-checked by
   nvcc when present.
2. Carver top-k and a short search (measured on a GPU, else on the carver's model).
3. A report (CSV, Markdown, HTML) and a summary table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from schedlib.hw import HardwareProfile, detect, is_auto, resolve
from schedlib.ir.dtype import numpy_dtype
from schedlib.ir.reference import run_reference
from schedlib.report.compare import compare
from schedlib.report.writers import REPORT_FILES, prepare_out_dir, write_report
from schedlib.rules import apply_default
from schedlib.runtime.gpu import gpu_available
from schedlib.runtime.kernel import build
from schedlib.suites import WorkloadSpec, suite

SYMBOLIC_DEFAULT = 33  # the value a symbolic size takes when a check has to pick one


def tolerance(func: Any) -> float:
    """The largest relative error (of the largest |value|) a kernel's first output may have against numpy:
    a 16-bit output keeps about three significant digits, a 32-bit one far more than 1e-4."""
    return 2e-2 if func.buffer(func.outputs[0]).dtype in ("float16", "bfloat16") else 1e-4


def check_output(func: Any, got: Any, ref: np.ndarray) -> tuple[float, float, bool]:
    """(relative error, tolerance, within it) of a kernel's first output against the reference's.

    Non-finite values are compared by position and value: where the reference holds NaN or +-inf (an
    overflow gives them legitimately) the kernel must hold the same, and ``inf - inf`` never turns a match
    into a NaN error.  The finite values are compared within the tolerance, relative to the largest finite
    |reference|.  A non-finite value where the other has none, or another shape, is a mismatch (error
    ``inf``)."""
    got = np.asarray(got[0] if isinstance(got, tuple) else got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    tol = tolerance(func)
    if got.shape != ref.shape:
        return float("inf"), tol, False
    finite = np.isfinite(got) & np.isfinite(ref)
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))  # inf == inf of one sign; NaN never equals NaN
    if not np.all(finite | same):
        return float("inf"), tol, False
    scale = max(float(np.abs(ref[finite]).max(initial=0.0)), 1e-30)
    err = float(np.abs(got[finite] - ref[finite]).max(initial=0.0) / scale)
    return err, tol, bool(err <= tol)


def random_inputs(func: Any, seed: int = 0, symbols: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Fresh standard-normal inputs in each input's dtype (bfloat16 as float32 values).

    Symbolic sizes take ``symbols[name]``, else :data:`SYMBOLIC_DEFAULT`.
    """
    from schedlib.ir.reference import evaluate_int

    env = {name: (symbols or {}).get(name, SYMBOLIC_DEFAULT) for name in func.symbols}
    rng = np.random.default_rng(seed)
    out = {}
    for name in func.inputs:
        buf = func.buffer(name)
        shape = tuple(evaluate_int(d, env) for d in buf.shape)
        out[name] = rng.standard_normal(shape).astype(np.float32).astype(numpy_dtype(buf.dtype))
    return out


def verify(spec: WorkloadSpec, profile: HardwareProfile, limit: int, on_gpu: bool) -> dict[str, Any]:
    """Schedule one workload with the rules, build it, and check it against the numpy reference, with every
    size capped at ``limit`` on the GPU as on the emulator (a check, not a timing: compare() times the full
    sizes)."""
    small = spec.scaled(limit)
    func = small.build()
    t0 = time.perf_counter()
    sch = apply_default(func, profile)
    apply_ms = (time.perf_counter() - t0) * 1e3
    kernel = build(sch, profile)
    inputs = random_inputs(func)
    ref = next(iter(run_reference(func, inputs).values())).astype(np.float64)
    args = [inputs[n] for n in func.inputs]
    if on_gpu:
        import cupy as cp

        got = cp.asnumpy(kernel(*[cp.asarray(a) for a in args]))
        where = "gpu"
    else:
        got = kernel.run_cpu(*args)
        where = "emulator"
    err, _, ok = check_output(func, got, ref)
    row = {"workload": spec.name, "verified_at": small.text, "rule": sch.rule, "apply_ms": round(apply_ms, 1),
           "checked_on": where, "rel_err": err, "ok": ok}
    try:
        report = kernel.compile_check(profile.arch)
        row.update({"registers": report.registers, "smem_bytes": report.shared_static_bytes,
                    "spill_bytes": report.spill_bytes})
    except Exception as exc:  # no nvcc/NVRTC here: say so in the table instead of failing the demo
        row["registers"] = f"not checked ({type(exc).__name__})"
    return row


def run_demo(target: str = "auto", out: str | Path = "schedlib-report", *, trials: int = 12, limit: int = 64,
             topk: int = 5, echo: Callable[[str], None] = print) -> Path:
    on_gpu = gpu_available()
    auto = is_auto(target)
    profile = detect() if (on_gpu and auto) else resolve("h100" if auto else target)
    # after the target, so that an unknown one creates no folder; before minutes of work
    prepare_out_dir(out, (*REPORT_FILES, "verification.csv"))
    echo(f"schedlib demo: target {profile.key} ({profile.name}); "
         + (f"GPU present: verifying on it at sizes <= {limit}, timing on it" if on_gpu else
            f"no GPU: verifying on the CPU emulator at sizes <= {limit}, timing with the carver model"))
    specs = suite("basic")
    rows = []
    for spec in specs:
        rows.append(verify(spec, profile, limit, on_gpu))
        r = rows[-1]
        echo(f"  verified {r['workload']:24s} rule={r['rule']:18s} rel_err={r['rel_err']:.1e} "
             f"{'ok' if r['ok'] else 'MISMATCH'}")
    checks = pd.DataFrame(rows)
    echo("comparing rule, carver and search" + (" against the vendor library" if on_gpu else ""))
    df = compare(specs, profile, trials=trials, topk=topk, backend="gpu" if on_gpu else "estimate",
                 progress=lambda text: echo(f"  {text}"))  # minutes on a GPU: one line per workload
    # in one step with the report: a run stopped while writing leaves the old verification beside the old report
    paths = write_report(df, out, histories=df.attrs.get("histories"), title="schedlib demo",
                         extra={"verification.csv": checks.to_csv(index=False)})
    echo("")
    echo("Verification (rules' schedules against numpy):")
    echo(checks.to_string(index=False))
    echo("")
    cols = ["workload", "method", "time_us", "pct_roofline", "speedup_vs_vendor", "tuning_s", "source"]
    summary = df[cols].copy()
    for c in ("time_us", "pct_roofline", "speedup_vs_vendor", "tuning_s"):
        summary[c] = summary[c].map(lambda v: f"{v:.3g}" if v == v else "n/a")
    echo("Comparison (" + ("measured" if df.attrs.get("measured") else "estimated: no GPU") + "), at the sizes:")
    for workload, shape in df.drop_duplicates("workload")[["workload", "shape"]].itertuples(index=False):
        echo(f"  {workload:24s} {shape}")  # the inputs timed, larger than the ones verified above
    echo(summary.to_string(index=False))
    echo("")
    failed = int((~checks["ok"]).sum())
    echo(f"{len(checks) - failed}/{len(checks)} workloads verified; report written to {paths['html'].parent}/ "
         "(report.html, report.md, report.csv, verification.csv)")
    if failed:
        raise SystemExit(1)
    return paths["html"].parent
