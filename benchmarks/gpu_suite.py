"""The one-call GPU suite: ceilings, then rule / carver top-k / short search / vendor for a fixed suite.

    python3 benchmarks/gpu_suite.py [--out DIR] [--trials 8] [--topk 4] [--dry-run]

1. Ceilings measured on the card: device-to-device copy bandwidth (bytes read + written), cuBLAS fp16 and
   fp32 GEMM through ``cupy.matmul``.
2. Each workload: every kernel is checked against the vendor result first, then timed with CUDA events
   (warm-up, L2 flush before each repetition, inputs rotated when they fit in L2, median of >= 20; only the
   kernels' launches between the events, see ``Kernel.prepare``): the rule default, each of the carver's
   top-k, a short search (gpu backend), and the vendor library.  % of roofline uses the measured ceilings.
   fp16 matmuls also get ``rule[tensor_core=wgmma]``, ``rule[tensor_core=wgmma_ws]`` and
   ``rule[tensor_core=True]`` rows: the cp.async-fed wgmma, the warp-specialized TMA wgmma and the mma.sync
   templates' defaults next to the TMA-fed wgmma default that Hopper's rule picks.  One-knob variants of the
   rule default show what a knob buys: ``rule[stages=1]`` (the SIMT matmul single-buffered, next to its
   double-buffered default) and ``rule[stage_row=True]`` (softmax/RMSNorm rows staged in shared memory).
   Before them, a tensor-core self-check (``sl.report.tensor_core_selfcheck``): each tensor-core template
   the card has (wgmma with TMA, with cp.async, with a producer warp; mma.sync), every operand layout, fp16
   and bf16, against numpy, so that a template whose hardware semantics differ from the emulator's shows up
   by layout, not as one failed workload.  Each template is checked in its own process, and one whose check
   hangs or a case of which does not run is turned off for the workloads (``HardwareProfile.without_templates``,
   or ``--disable``): no default, carver pick or search trial uses it, so it cannot take their time too.
3. Each workload runs in its own process under a time limit (``--workload-timeout``, and the whole call's
   ``--budget``), so a kernel that faults or hangs costs that workload's rows only: the others, and the
   ceilings, are kept.  A workload writes its rows as it goes (the rule default, template and variant rows
   and the vendor's first, then the carver's, then the search's), so one that runs out of time keeps the
   rows it has.  A method that fails inside a workload gets a row saying why.
4. CSV and Markdown go to ``$OUT`` (or ``--out``); the full table is printed, then a short one last: per
   workload, the fastest schedlib row against the vendor library.

``--dry-run`` runs the same pipeline with the carver's estimates and no GPU, to check the script itself; every
table and heading then says its times are carver-model estimates.  The options are checked before any work,
and the exit status is 1 when no workload produced rows or every workload failed or was skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from script_args import Parser, positive_float, writable_dir
from suite_ceilings import ceilings, same_bytes_copy_us

import schedlib as sl
from schedlib.cli_args import positive
from schedlib.report import compare, markdown_table
from schedlib.report.writers import flat_configs
from schedlib.rules.matmul import TEMPLATE_VALUES
from schedlib.suites import WorkloadSpec

MEMORY_BOUND = ("gemv", "rmsnorm", "softmax", "reduce")  # judged against a copy of the same bytes too
SELFCHECK = "selfcheck"  # the child label of the tensor-core self-check, one child per template
TEMPLATES = TEMPLATE_VALUES  # name: the matmul rule's tensor_core value; self-checked in this order
METHOD_ORDER = ("rule", "carver", "carver_best_of_k", "search")  # then the rule[...] rows, the vendor last
# In order of what their targets are worth, so that a call that runs out of budget loses the least: the
# memory-bound kernels (>= 90% of copy bandwidth), the fused epilogue (>= 1.15x cuBLAS + cupy), the matmuls.
SUITE = [
    WorkloadSpec("gemv", {"N": 14336, "K": 4096, "dtype": "float16"}, "gemv_fp16_inner"),
    WorkloadSpec("gemv", {"N": 14336, "K": 4096, "dtype": "float16", "trans": True}, "gemv_fp16_outer"),
    WorkloadSpec("rmsnorm", {"rows": 4096, "cols": 4096}, "rmsnorm_4096"),
    WorkloadSpec("rmsnorm", {"rows": 4096, "cols": 32000}, "rmsnorm_32000"),
    WorkloadSpec("softmax", {"rows": 4096, "cols": 4096}, "softmax_4096"),
    WorkloadSpec("softmax", {"rows": 4096, "cols": 32000}, "softmax_32000"),
    WorkloadSpec("reduce", {"rows": 4096, "cols": 4096, "op": "sum"}, "row_sum_4096"),
    WorkloadSpec("matmul", {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16", "epilogue": "bias_relu"},
                 "matmul_fp16_bias_relu"),
    WorkloadSpec("matmul", {"M": 4096, "N": 4096, "K": 4096, "dtype": "float32"}, "matmul_fp32_4096"),
    WorkloadSpec("matmul", {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16"}, "matmul_fp16_4096"),
    WorkloadSpec("matmul", {"M": 2048, "N": 6144, "K": 4096, "dtype": "float16"}, "prefill_qkv_2048"),
    # a long K over a small output (split-K against cuBLAS's own split, SIMT and tensor cores); last: no target
    WorkloadSpec("matmul", {"M": 256, "N": 256, "K": 65536, "dtype": "float32"}, "matmul_fp32_long_k"),
    WorkloadSpec("matmul", {"M": 256, "N": 256, "K": 65536, "dtype": "float16"}, "matmul_fp16_long_k"),
]
# One device call is cut at 600 s; start-up (about 1 s) and writing the tables need what the budget leaves.
BUDGET_CAP = 590.0
# What a dry run's numbers are, said wherever they appear: a table of them reads like measurements otherwise.
ESTIMATES = "carver-model estimates for the h100 profile, not measurements"
DRY_RUN_NOTE = ("Dry run, no GPU: every time is the carver model's estimate for the h100 profile, not a "
                "measurement; % of roofline is against the h100 profile's peaks (no measured ceilings); the "
                "tensor-core self-check ran one case (nn_f16) per template on the CPU emulator, not every case "
                "on a GPU.")


def variants(spec: WorkloadSpec, target: sl.hw.HardwareProfile) -> list[dict[str, object]]:
    """The rule default with one knob flipped, measured beside it: the SIMT matmul's buffering (``stages`` 1
    or 2), the row kernels' rows staged in shared memory or not."""
    knob = ("stages" if spec.kind == "matmul" and spec.params.get("dtype", "float32") == "float32" else
            "stage_row" if spec.kind in ("softmax", "rmsnorm") else None)
    if knob is None:
        return []
    func = spec.build()
    current = sl.rules.find_rule(func, target).default_config(func, target)[knob]
    return [{knob: (3 - current) if knob == "stages" else not current}]


def run_one(spec: WorkloadSpec, args: argparse.Namespace, ceil: dict[str, float] | None) -> None:
    """One workload in this process (the child side): its rows to ``<out>/parts/<label>.csv``, written after
    each step so that a step that hangs leaves the earlier rows."""
    off = [n for n in args.disable.split(",") if n]
    target = sl.hw.load("h100") if args.dry_run else sl.hw.detect()
    target = target.without_templates(off)
    backend = "estimate" if args.dry_run else "gpu"
    fp16 = spec.params.get("dtype") in ("float16", "bfloat16")
    # a template turned off is out of the target's space: compare adds no row for it
    templates = [TEMPLATES[n] for n in ("wgmma", "wgmma_ws", "mma_sync")] if fp16 else []
    steps = [{"methods": ("rule", "vendor"), "templates": templates, "variants": variants(spec, target)},
             {"methods": ("carver",)}, {"methods": ("search",)}]
    frames = []
    copy_us = float("nan")
    for step in steps:
        frames.append(compare([spec], target, topk=args.topk, trials=args.trials, backend=backend, ceilings=ceil,
                              **step))
        if len(frames) == 1 and spec.kind in MEMORY_BOUND and not args.dry_run:
            try:  # a side figure: its failure must not cost the workload's rows
                copy_us = same_bytes_copy_us(frames[0], target.l2_bytes)
            except Exception as exc:  # any cupy or driver error
                print(f"{spec.label}: the same-bytes copy failed ({type(exc).__name__}: {exc})", flush=True)
        write_rows(pd.concat(frames, ignore_index=True).assign(copy_us=copy_us),
                   Path(args.out) / "parts" / f"{spec.label}.csv")


def write_rows(df: pd.DataFrame, path: Path) -> None:
    """A workload's rows in the table's order, each compared with the vendor row (measured in the first step)."""
    vendor = df.loc[df["method"] == "vendor", "time_us"]
    vendor_us = float(vendor.iloc[0]) if len(vendor) else float("nan")
    df = flat_configs(df.assign(speedup_vs_vendor=vendor_us / df["time_us"]))  # configs as JSON, as report.csv
    rank = df["method"].map(lambda m: METHOD_ORDER.index(m) if m in METHOD_ORDER else
                            len(METHOD_ORDER) + (m == "vendor"))
    write_atomic(df.iloc[rank.argsort(kind="stable")], path)


def write_atomic(df: pd.DataFrame, path: Path) -> None:
    """``df`` as CSV at ``path``, whole or not at all: the parent may read it after killing the writer."""
    df.to_csv(path.with_suffix(".tmp"), index=False)
    path.with_suffix(".tmp").replace(path)


def run_selfcheck(args: argparse.Namespace, name: str) -> None:
    """The tensor-core self-check of one template in this process (the child side), to
    ``<out>/parts/selfcheck-<name>.csv``; a dry run checks one case on the CPU emulator."""
    from schedlib.report import tensor_core_selfcheck

    if args.dry_run:
        df = tensor_core_selfcheck("h100", backend="emulator", templates=(TEMPLATES[name],), cases=("nn_f16",))
    else:
        df = tensor_core_selfcheck(sl.hw.detect(), backend="gpu", templates=(TEMPLATES[name],))
    write_atomic(df, Path(args.out) / "parts" / f"{SELFCHECK}-{name}.csv")


def selfcheck_all(args: argparse.Namespace, ceil: dict[str, float] | None, limit: float
                  ) -> tuple[pd.DataFrame | None, list[str], list[tuple[str, str]]]:
    """Each template checked in its own child: (the rows, the templates to turn off, problems).  A template is
    turned off when its child fails or hangs, or a case it has on this card does not run (a launch failure can
    take the CUDA context down, a hang the workload's time).  A case whose result differs is reported and the
    template kept: the workloads check every kernel's result themselves, and it costs them no time."""
    frames, off, problems = [], [], []
    for name in TEMPLATES:
        t0 = time.time()
        df, what = run_isolated(f"{SELFCHECK}-{name}", args, ceil, limit)
        turn_off = what != "ok"
        if df is not None and len(df):
            errors = df["error"].where(df["error"].notna(), "").astype(str)
            frames.append(df.assign(error=errors))  # no error: "" (the CSV round trip made it NaN, "n/a")
            failed = ~df["ok"].astype(bool) & ~errors.str.startswith("not available")  # not: a card without it
            differs = failed & errors.str.startswith("result differs")
            broken = failed & ~differs
            if broken.any():
                turn_off = True
                what = (f"{int(broken.sum())} of {len(df)} cases did not run ({', '.join(df['case'][broken])}): "
                        f"{errors[broken].iloc[0][:200]}")
            elif differs.any() and what == "ok":
                what = (f"{int(differs.sum())} of {len(df)} cases differ from numpy "
                        f"({', '.join(df['case'][differs])}); kept, the workloads check their own results")
        if turn_off:
            off.append(name)
            what += "; turned off for the workloads"
        if what != "ok":
            problems.append((f"tensor-core self-check of {name}", what))
        where = " (dry run: case nn_f16 on the CPU emulator)" if args.dry_run else ""
        print(f"tensor-core self-check of {name}: {what} in {time.time() - t0:.0f} s{where}", flush=True)
    return (pd.concat(frames, ignore_index=True) if frames else None), off, problems


def run_child(cmd: list[str], limit: float) -> tuple[int, str]:
    """Run ``cmd`` in a session of its own: (exit code, the last of its output).  On timeout the whole session
    is killed, the search's measurement workers too, so that none keeps the GPU busy for the next workload."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the session may have ended meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, output or ""


def run_isolated(label: str, args: argparse.Namespace, ceil: dict[str, float] | None, limit: float
                 ) -> tuple[object, str]:
    """Run one workload (or the self-check) in a child process: (its rows or None, what happened).  The rows a
    workload wrote before it timed out or failed are kept."""
    part = Path(args.out) / "parts" / f"{label}.csv"
    part.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", label, "--out", args.out,
           "--trials", str(args.trials), "--topk", str(args.topk), "--ceilings", json.dumps(ceil or {}),
           "--disable", args.disable]
    if args.dry_run:
        cmd.append("--dry-run")
    try:
        code, output = run_child(cmd, limit)
        what = "ok" if code == 0 else f"failed (exit {code}): " + " | ".join(output.strip().splitlines()[-3:])[:300]
    except subprocess.TimeoutExpired:
        what = f"timed out after {limit:g} s"
    try:
        rows = pd.read_csv(part) if part.is_file() else None
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as exc:  # not a file this script wrote whole
        rows, what = None, f"{what}; its rows are unreadable ({exc})"
    if what != "ok" and rows is not None:
        what += "; the rows written before it are kept"
    elif what == "ok" and rows is None:
        what = "failed: the child wrote no rows"
    return rows, what


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per workload: its fastest schedlib row (method and time), the vendor's time, their ratio (> 1:
    schedlib is faster), that row's share of the roofline and its source (``estimated`` in a dry run)."""
    rows = []
    for workload, rows_of in table.groupby("workload", sort=False):
        ours = rows_of[(rows_of["method"] != "vendor") & rows_of["time_us"].notna()]
        vendor = rows_of[rows_of["method"] == "vendor"]["time_us"]
        vendor_us = float(vendor.iloc[0]) if len(vendor) else float("nan")
        if len(ours):
            best = ours.loc[ours["time_us"].idxmin()]
            copy_us = float(best["copy_us"]) if "copy_us" in best else float("nan")
            rows.append({"workload": workload, "best": best["method"], "best_us": float(best["time_us"]),
                         "vendor_us": vendor_us, "vs_vendor": vendor_us / float(best["time_us"]),
                         "pct_roofline": float(best["pct_roofline"]),
                         "pct_same_bytes_copy": 100.0 * copy_us / float(best["time_us"]),
                         "source": best.get("source", "")})
        else:
            rows.append({"workload": workload, "best": "(none ran)", "best_us": float("nan"),
                         "vendor_us": vendor_us, "vs_vendor": float("nan"), "pct_roofline": float("nan"),
                         "pct_same_bytes_copy": float("nan"), "source": ""})
    return pd.DataFrame(rows, columns=SUMMARY)


SUMMARY = ["workload", "best", "best_us", "vendor_us", "vs_vendor", "pct_roofline", "pct_same_bytes_copy", "source"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, every one checked here, before the self-checks: on a GPU a mistake found later wastes the
    one device call."""
    labels = [spec.label for spec in SUITE]
    ap = Parser(prog="gpu_suite.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-suite-out"),
                    help="folder for gpu_suite.csv, gpu_suite.md and parts/ (default: $OUT, else gpu-suite-out)")
    ap.add_argument("--trials", type=positive, default=8, help="search trials per workload (default 8)")
    ap.add_argument("--topk", type=positive, default=4, help="carver configs timed per workload (default 4)")
    ap.add_argument("--only", nargs="+", metavar="LABEL", help=f"the workloads to run, of {', '.join(labels)}")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: estimates only, to test the script")
    ap.add_argument("--budget", type=positive_float, default=560.0,
                    help=f"seconds for the whole call, at most {BUDGET_CAP:g} (default 560)")
    ap.add_argument("--workload-timeout", type=positive_float, default=150.0,
                    help="seconds per workload (default 150)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # run one workload in this process
    ap.add_argument("--ceilings", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--disable", default="", metavar="NAMES",
                    help=f"templates to turn off, comma-separated, of {', '.join(TEMPLATES)} (besides those the "
                         "self-check turns off)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.disable.split(",") if n and n not in TEMPLATES]
    if unknown:
        ap.error(f"--disable: unknown template(s) {unknown}; choose from {', '.join(TEMPLATES)}")
    unknown = [n for n in args.only or [] if n not in labels]
    if unknown:
        ap.error(f"--only: unknown workload(s) {', '.join(unknown)}; the suite has {', '.join(labels)}")
    if args.budget > BUDGET_CAP:
        ap.error(f"--budget {args.budget:g}: at most {BUDGET_CAP:g} s, since one device call is cut at 600 s "
                 "and start-up and the tables need the rest")
    children = [*labels, *(f"{SELFCHECK}-{n}" for n in TEMPLATES)]
    if args.child is not None and args.child not in children:
        ap.error(f"--child {args.child!r}: not a workload or self-check of this suite")
    writable_dir(ap, args.out)
    writable_dir(ap, Path(args.out) / "parts")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child and args.child.startswith(f"{SELFCHECK}-"):
        run_selfcheck(args, args.child.removeprefix(f"{SELFCHECK}-"))
        return 0
    if args.child:
        spec = next(s for s in SUITE if s.label == args.child)
        run_one(spec, args, json.loads(args.ceilings) or None)
        return 0
    start = time.time()
    if args.dry_run:
        device, ceil = "none (dry run)", None
        print(f"dry run, no GPU: {ESTIMATES}; the self-check runs one case per template on the CPU emulator",
              flush=True)
    else:
        import cupy as cp

        device = cp.cuda.runtime.getDeviceProperties(0)["name"]
        device = device.decode() if isinstance(device, bytes) else device
        ceil = ceilings()
        cp.get_default_memory_pool().free_all_blocks()  # the children need the memory, not this process
        print(f"device {device}: copy {ceil['bandwidth'] / 1e9:.0f} GB/s, cuBLAS fp16 "
              f"{ceil['fp16_flops'] / 1e12:.0f} TFLOP/s, fp32 {ceil['fp32_flops'] / 1e12:.1f} TFLOP/s", flush=True)
    suite = [s for s in SUITE if not args.only or s.label in args.only]
    frames: list[pd.DataFrame] = []
    check, off, problems = selfcheck_all(args, ceil, min(args.workload_timeout, args.budget / 12))
    args.disable = ",".join(dict.fromkeys([*filter(None, args.disable.split(",")), *off]))  # and any given
    completed = 0
    for spec in suite:
        t0 = time.time()
        left = args.budget - (t0 - start)
        if left < 20:
            problems.append((spec.label, f"skipped: {left:.0f} s of the {args.budget:.0f} s budget left"))
            print(f"{spec.label}: {problems[-1][1]}", flush=True)
            continue
        df, what = run_isolated(spec.label, args, ceil, min(args.workload_timeout, left - 10))
        if df is not None:
            frames.append(df)
        if what != "ok":
            problems.append((spec.label, what))
        completed += what == "ok"
        print(f"{spec.label}: {what} in {time.time() - t0:.0f} s", flush=True)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    report(table, check, problems, device, ceil, args, start)
    if not len(table) or not completed:  # a run to check the script, or a GPU call, that showed nothing
        why = "no workload produced rows" if not len(table) else "every workload failed or was skipped"
        print(f"gpu_suite.py: error: {why} (see the list above and {Path(args.out) / 'gpu_suite.md'})",
              file=sys.stderr)
        return 1
    return 0


def report(table: pd.DataFrame, check: pd.DataFrame | None, problems: list[tuple[str, str]], device: str,
           ceil: dict[str, float] | None, args: argparse.Namespace, start: float) -> None:
    """gpu_suite.csv and gpu_suite.md under ``--out``, then the tables on stdout, the short one last."""
    out, dry = Path(args.out), args.dry_run
    short = summary(table) if len(table) else None
    table.to_csv(out / "gpu_suite.csv", index=False)
    cols = ["workload", "method", "time_us", "tflops", "gbs", "pct_roofline", "speedup_vs_vendor", "source"]
    said = f": {ESTIMATES}" if dry else ""
    lines = [f"# GPU suite on {device}{said}, {datetime.date.today().isoformat()}", ""]
    if ceil:
        lines += [f"Ceilings: copy {ceil['bandwidth'] / 1e9:.0f} GB/s; cuBLAS fp16 {ceil['fp16_flops'] / 1e12:.0f} "
                  f"TFLOP/s; fp32 {ceil['fp32_flops'] / 1e12:.1f} TFLOP/s.", ""]
    if dry:
        lines += [DRY_RUN_NOTE, ""]
    if len(table):
        lines += [f"## Summary: the fastest schedlib row per workload{' (' + ESTIMATES + ')' if dry else ''}", "",
                  markdown_table(short, SUMMARY), "", "## Every row", ""]
    lines += [markdown_table(table, cols) if len(table) else "(no results)", ""]
    where = " (dry run: one case per template on the CPU emulator, not on a GPU)" if dry else ""
    if check is not None and len(check):
        lines += [f"## Tensor-core self-check{where}", "",
                  markdown_table(check, ["template", "case", "ok", "max_err", "error"]), ""]
    lines += [f"- {label}: {what}" for label, what in problems]
    lines += ["", f"Wall time {time.time() - start:.0f} s."]
    (out / "gpu_suite.md").write_text("\n".join(lines))
    if len(table):
        print(f"\nEvery row{' (' + ESTIMATES + ')' if dry else ''}:")
        print(table[cols].to_string(index=False))
    if check is not None and len(check):
        print(f"\nTensor-core self-check{where}:")
        print(check[["template", "case", "ok", "max_err", "error"]].to_string(index=False))
    for label, what in problems:
        print(f"{label}: {what}")
    if len(table):  # last: the short table
        print("\nSummary (fastest schedlib row per workload against the vendor library"
              + (f"; dry run: {ESTIMATES}" if dry else "") + "):")
        print(short.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    sys.exit(main())
