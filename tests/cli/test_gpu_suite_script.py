"""benchmarks/gpu_suite.py in dry-run mode (no GPU): workloads run in child processes under time limits, and a
workload that times out or does not fit the budget is reported without losing the others."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.py"


def suite(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--trials", "2",
                           "--topk", "2", *extra], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, out


def test_dry_run_writes_the_tables_with_the_template_row(tmp_path: Path) -> None:
    proc, out = suite(tmp_path, "--only", "matmul_fp16_4096", "row_sum_4096")
    df = pd.read_csv(out / "gpu_suite.csv")
    fp16 = df[df["workload"] == "matmul_fp16_4096"]
    assert list(fp16["method"]) == ["rule", "carver", "carver_best_of_k", "search", "rule[tensor_core=wgmma]",
                                    "rule[tensor_core=wgmma_ws]", "rule[tensor_core=True]", "vendor"]
    assert "rule[tensor_core=True]" not in set(df[df["workload"] == "row_sum_4096"]["method"])
    assert (df[df["method"] != "vendor"]["source"] == "estimated").all()
    page = (out / "gpu_suite.md").read_text()
    assert page.startswith("# GPU suite on none (dry run)") and "| matmul_fp16_4096 | rule |" in page
    assert "matmul_fp16_4096: ok in" in proc.stdout and "row_sum_4096: ok in" in proc.stdout
    # the tensor-core self-check ran first, in its own process (a dry run: one case per template, emulated)
    assert "tensor-core self-check: ok in" in proc.stdout
    assert "## Tensor-core self-check" in page
    assert "| wgmma_tma | nn_f16 | True |" in page and "| wgmma | nn_f16 | True |" in page
    assert "| wgmma_ws | nn_f16 | True |" in page
    assert "| True | nn_f16 | True |" in page
    # the short table comes last on stdout, and first in the page: one row per workload
    tail = proc.stdout.rstrip().splitlines()[-3:]
    assert re.match(r"\s*workload\s+best\s+best_us\s+vendor_us\s+vs_vendor\s+pct_roofline", tail[0]), tail
    assert [line.split()[0] for line in tail[1:]] == ["matmul_fp16_4096", "row_sum_4096"]
    best = df[df["method"] != "vendor"].groupby("workload")["time_us"].min()
    assert float(tail[1].split()[2]) == float(f"{best['matmul_fp16_4096']:.3g}")
    assert page.index("## Summary") < page.index("## Every row") < page.index("## Tensor-core self-check")


def test_a_workload_past_its_time_limit_is_reported_and_the_budget_is_kept(tmp_path: Path) -> None:
    proc, out = suite(tmp_path, "--only", "row_sum_4096", "softmax_4096", "--workload-timeout", "0.5")
    page = (out / "gpu_suite.md").read_text()
    assert "- row_sum_4096: timed out after 0.5 s" in page and "- softmax_4096: timed out after 0.5 s" in page
    assert "(no results)" in page and "- tensor-core self-check: timed out after 0.5 s" in page
    proc, out = suite(tmp_path, "--only", "row_sum_4096", "--budget", "10")
    assert re.search(r"row_sum_4096: skipped: \d+ s of the 10 s budget left", proc.stdout), proc.stdout
