"""benchmarks/gpu_suite.py in dry-run mode (no GPU): workloads run in child processes under time limits, and a
workload that times out or does not fit the budget is reported without losing the others."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.py"


def suite(tmp_path: Path, *extra: str, status: int = 0) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--trials", "2",
                           "--topk", "2", *extra], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == status, proc.stderr[-2000:]
    return proc, out


ESTIMATES = "carver-model estimates for the h100 profile, not measurements"


def test_dry_run_writes_the_tables_with_the_template_row(tmp_path: Path) -> None:
    proc, out = suite(tmp_path, "--only", "matmul_fp16_4096", "row_sum_4096")
    df = pd.read_csv(out / "gpu_suite.csv")
    fp16 = df[df["workload"] == "matmul_fp16_4096"]
    assert list(fp16["method"]) == ["rule", "carver", "carver_best_of_k", "search", "rule[tensor_core=wgmma]",
                                    "rule[tensor_core=wgmma_ws]", "rule[tensor_core=True]", "vendor"]
    assert (out / "parts" / "matmul_fp16_4096.csv").is_file() and not list((out / "parts").glob("*.tmp"))
    assert "rule[tensor_core=True]" not in set(df[df["workload"] == "row_sum_4096"]["method"])
    assert (df[df["method"] != "vendor"]["source"] == "estimated").all()
    configs = [json.loads(c) for c in df["config"].dropna()]  # JSON, as report.csv writes them
    assert True in {c.get("tensor_core") for c in configs}  # JSON's true, where a repr would say True
    page = (out / "gpu_suite.md").read_text()
    assert page.startswith(f"# GPU suite on none (dry run): {ESTIMATES}, ") and "| matmul_fp16_4096 | rule |" in page
    # every place the numbers appear says they are estimates: the page, its summary, stdout's summary
    assert "Dry run, no GPU: every time is the carver model's estimate for the h100 profile" in page
    assert "ran one case (nn_f16) per template on the CPU emulator" in page
    assert f"## Summary: the fastest schedlib row per workload ({ESTIMATES})" in page
    assert f"Summary (fastest schedlib row per workload against the vendor library; dry run: {ESTIMATES}):" \
        in proc.stdout
    assert proc.stdout.startswith(f"dry run, no GPU: {ESTIMATES}")
    assert "matmul_fp16_4096: ok in" in proc.stdout and "row_sum_4096: ok in" in proc.stdout
    # the tensor-core self-check ran first, a process per template (a dry run: one case each, emulated)
    for name in ("wgmma_tma", "wgmma", "wgmma_ws", "mma_sync"):
        assert f"tensor-core self-check of {name}: ok in" in proc.stdout
    assert "## Tensor-core self-check" in page
    assert "## Tensor-core self-check (dry run: one case per template on the CPU emulator, not on a GPU)" in page
    assert "| wgmma_tma | nn_f16 | True |" in page and "| wgmma | nn_f16 | True |" in page
    assert not re.search(r"\| nn_f16 \| True \| [^|]+ \| n/a \|", page)  # no error is "", not "n/a"
    assert "| wgmma_ws | nn_f16 | True |" in page
    assert "| True | nn_f16 | True |" in page
    # the short table comes last on stdout, and first in the page: one row per workload
    tail = proc.stdout.rstrip().splitlines()[-3:]
    header = r"\s*workload\s+best\s+best_us\s+vendor_us\s+vs_vendor\s+pct_roofline\s+pct_same_bytes_copy\s+source"
    assert re.match(header, tail[0]), tail
    assert [line.split()[0] for line in tail[1:]] == ["row_sum_4096", "matmul_fp16_4096"]  # the suite's order
    assert [line.split()[-1] for line in tail[1:]] == ["estimated", "estimated"]
    best = df[df["method"] != "vendor"].groupby("workload")["time_us"].min()
    assert float(tail[2].split()[2]) == float(f"{best['matmul_fp16_4096']:.3g}")
    assert page.index("## Summary") < page.index("## Every row") < page.index("## Tensor-core self-check")


def test_a_workload_past_its_time_limit_is_reported_and_the_budget_is_kept(tmp_path: Path) -> None:
    """...and with no workload's rows the exit status says the run showed nothing (a dry run checks the script)."""
    proc, out = suite(tmp_path, "--only", "row_sum_4096", "softmax_4096", "--workload-timeout", "0.5", status=1)
    # which of the two depends on whether a workload wrote its first rows within the 0.5 s
    last = proc.stderr.strip().splitlines()[-1]
    assert last in (f"gpu_suite.py: error: {why} (see the list above and {out / 'gpu_suite.md'})"
                    for why in ("no workload produced rows", "every workload failed or was skipped")), last
    page = (out / "gpu_suite.md").read_text()
    assert "- row_sum_4096: timed out after 0.5 s" in page and "- softmax_4096: timed out after 0.5 s" in page
    # each self-check child gets the same 0.5 s: whether one finishes in it depends on the machine, so either
    # outcome is right here (what a timed-out check turns off is tested with a fake child below)
    for name in ("wgmma_tma", "wgmma", "wgmma_ws", "True"):
        late = re.search(rf"- tensor-core self-check of {'mma_sync' if name == 'True' else name}: timed out after "
                         r"0.5 s[^\n]*; turned off for the workloads", page)
        assert late or f"| {name} | nn_f16 | True |" in page, page
    proc, out = suite(tmp_path, "--only", "row_sum_4096", "--budget", "10", status=1)
    assert re.search(r"row_sum_4096: skipped: \d+ s of the 10 s budget left", proc.stdout), proc.stdout


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_suite_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(out: Path, disable: str = "") -> argparse.Namespace:
    return argparse.Namespace(out=str(out), trials=2, topk=2, dry_run=True, disable=disable)


def test_a_template_whose_self_check_does_not_run_is_turned_off_for_the_workloads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that hangs, or a case that does not run, turns the template off; a case whose result differs is
    reported and the template kept (the workloads check their results); a template the card does not have
    ("not available") is no failure."""
    gs = _script()
    cases = {"wgmma_tma": (True, ""), "wgmma_ws": (False, "ExecutionError: an illegal memory access"),
             "mma_sync": (False, "result differs: max error 0.5 of the largest |value|")}

    def fake(label: str, *_: Any) -> tuple[Any, str]:
        name = label.removeprefix("selfcheck-")
        if name == "wgmma":
            return None, "timed out after 46 s"
        ok, error = cases[name]
        rows = [{"template": name, "case": "nn_f16", "ok": ok, "max_err": 0.5, "error": error},
                {"template": name, "case": "tt_f16", "ok": False, "max_err": float("nan"),
                 "error": "not available: no such layout here"}]
        return pd.DataFrame(rows), "ok"

    monkeypatch.setattr(gs, "run_isolated", fake)
    rows, off, problems = gs.selfcheck_all(_args(tmp_path), None, 46.0)
    assert off == ["wgmma", "wgmma_ws"] and len(rows) == 6
    assert dict(problems) == {
        "tensor-core self-check of wgmma": "timed out after 46 s; turned off for the workloads",
        "tensor-core self-check of wgmma_ws": "1 of 2 cases did not run (nn_f16): ExecutionError: an illegal "
                                              "memory access; turned off for the workloads",
        "tensor-core self-check of mma_sync": "1 of 2 cases differ from numpy (nn_f16); kept, the workloads "
                                              "check their own results"}
    # the workload then never builds them: not a template row, not a carver pick, not a search trial
    (tmp_path / "parts").mkdir()
    spec = next(s for s in gs.SUITE if s.label == "matmul_fp16_4096")
    gs.run_one(spec, _args(tmp_path, ",".join(off)), None)
    df = pd.read_csv(tmp_path / "parts" / "matmul_fp16_4096.csv")
    assert list(df["method"]) == ["rule", "carver", "carver_best_of_k", "search", "rule[tensor_core=True]",
                                  "vendor"]
    used = {json.loads(c)["tensor_core"] for c in df["config"].dropna()}
    assert not used & {"wgmma", "wgmma_ws"} and "wgmma_tma" in used, used
    # the default's template off too: the rule falls back to the next one
    gs.run_one(spec, _args(tmp_path, "wgmma_tma,wgmma_ws"), None)
    df = pd.read_csv(tmp_path / "parts" / "matmul_fp16_4096.csv")
    assert {json.loads(c)["tensor_core"] for c in df["config"].dropna()} == {"wgmma", True}


def test_templates_turned_off_by_hand_join_those_the_self_check_turns_off(tmp_path: Path) -> None:
    _, out = suite(tmp_path, "--only", "matmul_fp16_4096", "--disable", "mma_sync")
    df = pd.read_csv(out / "gpu_suite.csv")
    assert "rule[tensor_core=True]" not in set(df["method"]) and "rule[tensor_core=wgmma_ws]" in set(df["method"])


def test_an_unreadable_part_file_is_reported_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gs = _script()
    (tmp_path / "parts").mkdir()

    def killed_while_writing(cmd: list[str], limit: float) -> tuple[int, str]:
        (tmp_path / "parts" / "w.csv").write_text("")  # what a writer killed mid-way would leave
        raise subprocess.TimeoutExpired(cmd, limit)

    monkeypatch.setattr(gs, "run_child", killed_while_writing)
    rows, what = gs.run_isolated("w", _args(tmp_path), None, 3.0)
    assert rows is None and what.startswith("timed out after 3 s; its rows are unreadable (")


ROWS = pd.DataFrame({"workload": ["w", "w", "w"], "method": ["vendor", "rule", "carver"], "time_us": [10.0, 20.0, 5.0]})


@pytest.mark.parametrize(("outcome", "what"), [
    ("timeout", "timed out after 3 s; the rows written before it are kept"),
    ("crash", "failed (exit 1): Traceback (most recent call last): |   ... | CUDARuntimeError: an illegal memory "
              "access; the rows written before it are kept"),
])
def test_a_workload_that_stops_early_keeps_the_rows_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            outcome: str, what: str) -> None:
    """A kernel that hangs, or faults and takes the CUDA context down with it, in the carver's or the search's
    step: the rows of the steps before it are in the table."""
    gs = _script()
    (tmp_path / "parts").mkdir()

    def stopped_after_the_first_steps(cmd: list[str], limit: float) -> tuple[int, str]:
        gs.write_rows(ROWS, tmp_path / "parts" / "w.csv")
        if outcome == "timeout":
            raise subprocess.TimeoutExpired(cmd, limit)
        return 1, "Traceback (most recent call last):\n  ...\nCUDARuntimeError: an illegal memory access\n"

    monkeypatch.setattr(gs, "run_child", stopped_after_the_first_steps)
    df, got = gs.run_isolated("w", _args(tmp_path), None, 3.0)
    assert got == what
    assert list(df["method"]) == ["rule", "carver", "vendor"]  # the table's order
    assert list(df["speedup_vs_vendor"]) == [0.5, 2.0, 1.0]


def test_a_timed_out_child_is_killed_with_what_it_started(tmp_path: Path) -> None:
    """The search measures in worker processes of the workload's child: a timeout kills the whole session."""
    gs = _script()
    marker = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    with pytest.raises(subprocess.TimeoutExpired):
        gs.run_child([sys.executable, "-c", script], 6.0)  # room to start on a loaded machine
    grandchild = int(marker.read_text())
    for _ in range(50):  # the kill is asynchronous: wait for the process table to say so
        if not Path(f"/proc/{grandchild}").exists() or "Z" in _state(grandchild):
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in _state(grandchild)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_unknown_templates_to_turn_off_are_refused(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path), "--disable", "tma"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "--disable: unknown template(s) ['tma']; choose from wgmma_tma" in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "row_sum", "gemv_fp16"], "--only: unknown workload(s) row_sum, gemv_fp16; the suite has "
                                         "gemv_fp16_inner, gemv_fp16_outer, "),
    (["--trials", "0"], "argument --trials: 0 must be at least 1"),
    (["--topk", "0"], "argument --topk: 0 must be at least 1"),
    (["--topk", "x"], "argument --topk: 'x' is not an integer"),
    (["--budget", "-5"], "argument --budget: -5 must be above 0"),
    (["--budget", "nan"], "argument --budget: nan must be above 0"),
    (["--budget", "700"], "--budget 700: at most 590 s, since one device call is cut at 600 s"),
    (["--workload-timeout", "0"], "argument --workload-timeout: 0 must be above 0"),
    (["--only"], "argument --only: expected at least one argument"),
    (["--out", "FILE"], "--out: cannot write the report to FILE: it is a file, not a folder"),
    (["--out", "FILE/sub"], "--out: cannot write the report to FILE/sub: Not a directory"),
])
def test_bad_options_are_one_line_before_any_work(tmp_path: Path, args: list[str], message: str,
                                                  capsys: pytest.CaptureFixture) -> None:
    """Checked before the self-checks: on a GPU those take minutes of the one device call."""
    gs = _script()
    afile = tmp_path / "afile"
    afile.write_text("")
    args = [a.replace("FILE", str(afile)) for a in args]
    message = message.replace("FILE", str(afile))
    argv = ["--dry-run", *([] if "--out" in args else ["--out", str(tmp_path / "o")]), *args]
    with pytest.raises(SystemExit) as stop:
        gs.parse_args(argv)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpu_suite.py: error: {message}"), lines


def test_a_misspelt_workload_runs_nothing(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path), "--only", "row_sum"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""  # no self-check ran (it prints its table)
    assert proc.stderr.startswith("gpu_suite.py: error: --only: unknown workload(s) row_sum;")
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "parts").exists()


def test_each_variant_flips_the_knob_of_the_rule_default() -> None:
    """The variant row measures the other setting than the default's, whichever that is on the profile."""
    gs = _script()
    import schedlib as sl

    h200 = sl.hw.load("h200")
    by_label = {spec.label: spec for spec in gs.SUITE}
    assert gs.variants(by_label["matmul_fp32_4096"], h200) == [{"stages": 2}]  # default single-buffered
    assert gs.variants(by_label["matmul_fp32_long_k"], h200) == [{"stages": 1}]  # 256 blocks: double-buffered
    assert gs.variants(by_label["rmsnorm_32000"], h200) == [{"stage_row": False}]  # 128 KB rows staged
    assert gs.variants(by_label["softmax_4096"], h200) == [{"stage_row": True}]
    assert gs.variants(by_label["gemv_fp16_inner"], h200) == []


def test_the_same_bytes_copy_moves_what_the_rule_default_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for cupy: the copy gets half the rule row's bytes each way and an L2 flush per run."""
    import numpy as np

    import schedlib.runtime.timing as timing

    gs = _script()
    seen: dict[str, Any] = {}
    fake_cupy = ModuleType("cupy")
    fake_cupy.float32 = np.float32  # type: ignore[attr-defined]
    fake_cupy.ones = lambda n, dtype: seen.setdefault("elements", n) and np.ones(n, dtype)  # type: ignore[attr-defined]
    fake_cupy.empty_like = np.empty_like  # type: ignore[attr-defined]

    def fake_benchmark(fn: Any, *, repeat: int, flush: Any) -> dict[str, float]:
        fn()
        seen.update(repeat=repeat, flush=flush)
        return {"median_us": 12.5}

    def fake_flush(nbytes: int) -> str:
        seen["flush_bytes"] = nbytes
        return "flush buffer"

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(timing, "benchmark", fake_benchmark)
    monkeypatch.setattr(timing, "l2_flush_buffer", fake_flush)
    rows = pd.DataFrame({"method": ["vendor", "rule"], "time_us": [50.0, 40.0], "gbs": [0.0, 3000.0]})
    assert gs.same_bytes_copy_us(rows, 50 << 20) == 12.5
    # 3000 GB/s for 40 us is 120 MB: 60 MB read and 60 MB written, 15 M float32 each way
    assert seen == {"elements": 15_000_000, "repeat": 20, "flush": "flush buffer", "flush_bytes": 50 << 20}
    assert np.isnan(gs.same_bytes_copy_us(rows.assign(gbs=float("nan")), 1))  # no rule figure: no copy


def test_the_summary_sets_the_best_row_against_the_same_bytes_copy() -> None:
    gs = _script()
    table = pd.DataFrame({"workload": ["w"] * 3, "method": ["rule", "search", "vendor"],
                          "time_us": [40.0, 32.0, 36.0], "pct_roofline": [70.0, 87.5, 77.8],
                          "copy_us": [28.8] * 3, "source": ["measured"] * 3})
    short = gs.summary(table)
    assert list(short.columns) == gs.SUMMARY
    row = short.iloc[0]
    assert row["best"] == "search" and row["pct_same_bytes_copy"] == pytest.approx(90.0)
    assert row["vs_vendor"] == pytest.approx(36.0 / 32.0)
