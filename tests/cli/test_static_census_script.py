"""benchmarks/static_census.py: the suite's memory-bound kernels, as nvcc sees them, move their bytes with
16-byte loads and keep nothing in local memory (a regression here costs bandwidth no CPU test would see)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from schedlib.runtime.nvcc import find_nvcc
from schedlib.runtime.sass import find_nvdisasm

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "static_census.py"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="the census compiles with nvcc, which was not found")


def census(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          check=False)


@needs_nvcc
def test_memory_bound_kernels_load_16_bytes_at_a_time(tmp_path: Path) -> None:
    names = ["gemv_fp16_inner", "rmsnorm_4096", "softmax_32000"]
    proc = census("--only", *names, "--out", str(tmp_path), "--no-banks")
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = pd.read_csv(tmp_path / "census.csv").set_index("workload")
    assert sorted(df.index) == sorted(names)
    for name in names:
        loads = df.loc[name, "global_loads"]
        assert all(" v4." in f" {part.split(' ', 1)[1]}" for part in loads.split(", ")), (name, loads)
    assert (df["local"] == 0).all() and (df["spill_bytes"] == 0).all()
    assert df.loc["softmax_32000", "global_stores"].endswith("v4.f32")
    assert "| gemv_fp16_inner | sm_90 |" in (tmp_path / "census.md").read_text()
    assert "bank_conflict" not in df.columns


@needs_nvcc
def test_the_bank_census_runs_the_first_block_on_the_emulator(tmp_path: Path) -> None:
    proc = census("--only", "row_sum_4096", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = pd.read_csv(tmp_path / "census.csv").set_index("workload").loc["row_sum_4096"]
    assert row["bank_conflict"] == "1.0 (sl_red_buf1 load/store)"  # the cross-warp scratch, one word per lane


def test_an_unknown_workload_is_refused_with_the_known_ones() -> None:
    proc = census("--only", "gemv_fp16_innr")
    assert proc.returncode == 2
    assert "unknown workloads gemv_fp16_innr; the suite has" in proc.stderr and "gemv_fp16_inner" in proc.stderr


@needs_nvcc
@pytest.mark.skipif(find_nvdisasm() is None, reason="needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
def test_the_main_loop_column_reads_the_sass(tmp_path: Path) -> None:
    proc = census("--only", "matmul_fp32_4096", "softmax_4096", "--out", str(tmp_path), "--no-banks")
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = pd.read_csv(tmp_path / "census.csv").set_index("workload")
    # 8 x 8 results per thread and 16-deep k steps: 1024 FFMA per iteration, nearly all of the loop
    hot = df.loc["matmul_fp32_4096", "main_loop"]
    assert re.fullmatch(r"\d+ instr, (9\d|8[5-9])% math: FFMA 1024, LDS \d+, .*", hot), hot
    assert df.loc["softmax_4096", "main_loop"] == "no loop"  # two steps per pass, unrolled


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "nope"], "--target: unknown hardware profile 'nope'"),
    (["--out", "FILE", "--no-banks"], "--out: cannot write the report to FILE: it is a file, not a folder"),
])
def test_a_bad_target_or_out_is_one_line_before_any_compile(tmp_path: Path, args: list[str], message: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    proc = census("--only", "row_sum_4096", *[a.replace("FILE", str(afile)) for a in args])
    assert proc.returncode == 2 and "compiling" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("static_census.py: error: " + message.replace("FILE", str(afile)))
