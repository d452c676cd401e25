"""The smaller benchmark scripts: options checked up front as one line, and verdicts that mean what they say."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("args", "message"), [
    (["--strategies", "foo"], "--strategies: unknown strategy(s) foo; choose from random, grid, tpe"),
    (["--strategies", ","], "--strategies: unknown strategy(s) (none given)"),
    (["--jobs", "0"], "argument --jobs: 0 must be at least 1"),
])
def test_search_strategies_refuses_bad_options_before_the_pool(args: list[str], message: str) -> None:
    """Before: a misspelt strategy failed inside a pool worker, as a traceback."""
    proc = subprocess.run([sys.executable, str(BENCH / "search_strategies.py"), *args], capture_output=True,
                          text=True, timeout=300, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"search_strategies.py: error: {message}"), lines


@pytest.mark.parametrize(("threads", "status", "verdict"), [
    ("1", 1, "target <= 50 ms on 1 core: MISSED)"),
    ("2", 0, "target <= 50 ms on 1 core: not judged (threads=2, not 1))"),
])
def test_emulator_speed_judges_one_core_only(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                             threads: str, status: int, verdict: str) -> None:
    """A 5 s matmul is not "met" because more threads ran it: with threads != 1 there is no verdict."""
    script = _load("emulator_speed")
    monkeypatch.setattr(script, "time_matmul", lambda *a, **k: (5.0, 5.0))
    assert script.main(["--threads", threads]) == status
    first = " ".join(capsys.readouterr().out.splitlines()[0].split())
    assert first.startswith(f"matmul 64^3, threads={threads}: 5000.0 ms wall") and first.endswith(verdict), first
    assert "met" not in first
