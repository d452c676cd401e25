"""The ``schedlib`` command end to end, in a subprocess, with no GPU."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest

import schedlib.search as S
from schedlib.report import COLUMNS
from schedlib.runtime.nvcc import find_nvcc, nvrtc_available
from schedlib.search.records import COUNTED, OK, trial_rows
from schedlib.search.storage import resolve_storage
from schedlib.suites import parse_workload

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "schedlib", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def test_demo_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = run("demo", "--out", str(out), "--trials", "4", "--limit", "33")
    assert proc.returncode == 0, proc.stderr
    assert "9/9 workloads verified" in proc.stdout
    assert str(out) in proc.stdout
    # the timed sizes are said (the verified ones are smaller)
    assert "  matmul_fp32              A[1024x1024] B[1024x1024]\n" in proc.stdout
    df = pd.read_csv(out / "report.csv")
    assert list(df.columns) == COLUMNS
    timed = df[df["method"] != "vendor"]
    assert len(timed) == 9 * 4  # rule, carver, carver_best_of_k, search per workload
    assert timed["time_us"].map(math.isfinite).all() and (timed["time_us"] > 0).all()
    assert (timed["source"] == "estimated").all() and not timed["measured"].any()
    assert (df[df["method"] == "vendor"]["source"] == "needs a GPU").all()
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 10  # one bar chart per workload + convergence
    assert (out / "report.md").read_text().startswith("# schedlib demo")


def test_schedule_with_emulate_and_explain() -> None:
    proc = run("schedule", "softmax:rows=$M,cols=48", "--explain", "--emulate")
    assert proc.returncode == 0, proc.stderr
    assert "rule: general_reduction" in proc.stdout
    assert "general_reduction: APPLIES" in proc.stdout
    assert "# trace" in proc.stdout and "# loop nest" in proc.stdout and "__global__" in proc.stdout
    err = float(proc.stdout.rsplit("max relative error", 1)[1].split()[0])
    assert err < 1e-5


def test_carve_prints_the_ranked_table() -> None:
    proc = run("carve", "matmul:M=512,N=512,K=512,dtype=float16", "--topk", "3")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert "est_time_us" in lines[0] and len(lines) == 4


@pytest.mark.skipif(find_nvcc() is None and not nvrtc_available(), reason="needs nvcc or NVRTC for ptxas")
def test_carve_compiled_shows_the_registers_ptxas_allots() -> None:
    proc = run("carve", "matmul:M=100,N=100,K=100", "--topk", "2", "--compiled")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 3 and all(c in lines[0] for c in ("registers_per_thread", "model_registers", "spill_bytes"))
    assert "compiling the model's best 8 configs for sm_90 (the next ones in place of any that fail) ..." in proc.stderr
    assert re.search(r"compiled 8 configs for sm_90: \d+ spill, 0 failed to compile, 0 cannot launch", proc.stderr)


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc, whose list of architectures leaves out sm_70")
def test_carve_compiled_for_an_architecture_the_compiler_cannot_build_is_one_line() -> None:
    proc = run("carve", "matmul:M=100,N=100,K=100", "--target", "v100", "--compiled")
    assert proc.returncode == 2
    assert proc.stderr.startswith("schedlib: error: ") and "cannot build sm_70: it builds sm_75" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""


def test_tune_on_the_estimate_backend(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    spec = "gemv:N=1024,K=1024,dtype=float16"
    proc = run("tune", spec, "--trials", "6", "--storage", storage, "--backend", "estimate", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("best: ")
    assert (tmp_path / "tune.db").exists()
    best_line, counts_line = proc.stdout.strip().splitlines()
    assert counts_line == "6 new configs measured"
    printed = re.fullmatch(r"best: (\S+) us \(estimated by the carver's model, not measured\)  config: (\{.*\})",
                           best_line)
    assert printed is not None, proc.stdout
    # the database holds the study the command printed: its best config, and one record per trial asked for
    func = parse_workload(spec).build()
    assert S.apply_best(func, "h100", storage, backend="estimate").config == json.loads(printed[2])
    store, _ = resolve_storage(storage, create=False)
    (name,) = optuna.get_all_study_names(store)
    rows = trial_rows(optuna.load_study(study_name=name, storage=store).get_trials(deepcopy=False), [])
    counted = [r for r in rows if r["status"] in COUNTED]
    assert len(counted) == 6 and len({r["config_key"] for r in counted}) == 6, rows
    best = min(r["time_us"] for r in counted if r["status"] == OK)
    assert printed[1] == f"{best:.3g}"


def test_compare_writes_csv_with_documented_columns(tmp_path: Path) -> None:
    proc = run("compare", "--workload", "reduce:rows=256,cols=512", "--workload", "transpose:M=128,N=64",
               "--methods", "rule", "carver", "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(tmp_path / "r" / "report.csv")
    assert list(df.columns) == COLUMNS
    assert set(df["method"]) == {"rule", "carver", "carver_best_of_k"}
    assert df["pct_roofline"].map(math.isfinite).all()


@pytest.mark.parametrize(("args", "needle"), [
    (("schedule", "nosuch:M=3"), "unknown workload 'nosuch'"),
    (("schedule", "matmul:M=-4"), "workload matmul: M='-4' must be a positive int"),
    (("schedule", "matmul:Q=4"), "workload matmul: unknown parameter(s) ['Q']"),
    (("schedule", "matmul:M"), "workload spec 'matmul:M': 'M' is not key=value"),
    (("schedule", "matmul:M=8", "--target", "nosuchgpu"), "unknown hardware profile 'nosuchgpu'"),
    (("carve", "matmul", "--topk", "0"), "argument --topk: 0 must be at least 1"),
    (("tune", "matmul", "--strategy", "annealing"), "argument --strategy: invalid choice: 'annealing'"),
    (("compare", "--suite", "nosuch"), "unknown suite 'nosuch'"),
    (("compare", "--workload", "transpose:M=8,N=8", "--methods", "rule", "--out", "/proc/forbidden/report"),
     "cannot write the report to /proc/forbidden/report"),
    (("profiles", "show", "nosuchgpu"), "unknown hardware profile 'nosuchgpu'"),
    (("frobnicate",), "argument command: invalid choice: 'frobnicate'"),
    (("schedule", "matmul:M=64,N=64,K=64", "--rule", "matmul", "--config", "[1]"),
     "--config must be a JSON object of knob values, got '[1]'"),
    (("schedule", "matmul:M=64,N=64,K=64,trans_a=maybe"), "workload matmul: trans_a='maybe' must be true or false"),
    (("schedule", "matmul:M=64,M=128"), "workload spec 'matmul:M=64,M=128': M is given twice"),
    (("schedule", "matmul:M=8192,N=8192,K=64", "--emulate"),
     "--emulate: the buffers hold 68,157,440 elements, more than the CPU emulator's 16,777,216"),
    (("demo", "--out", "/proc/version"), "cannot write the report to /proc/version"),
])
def test_bad_arguments_give_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("schedlib: error: "), proc.stderr
    assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in proc.stderr


def test_spec_round_trip() -> None:
    for text in ("matmul:M=64,N=32,K=16,dtype=float16,epilogue=bias_relu", "elementwise:shape=8x8,chain=add+gelu",
                 "softmax:rows=$M,cols=64"):
        assert parse_workload(text).text == text


def test_rule_without_config_uses_that_rules_default() -> None:
    # softmax is taken by general_reduction; --rule fallback must win over the dispatcher
    proc = run("schedule", "softmax:rows=8,cols=8", "--rule", "fallback", "--no-source")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("rule: fallback ")


def test_a_closed_pipe_ends_quietly() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"{sys.executable} -m schedlib schedule matmul:M=64,N=64,K=64 | head -n 1"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, env=env, timeout=300)
    assert proc.stdout.startswith("rule: matmul")
    assert proc.returncode == 0 and "error" not in proc.stderr, proc.stderr
