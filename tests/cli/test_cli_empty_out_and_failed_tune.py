"""``--out ''`` is refused as ``--storage ''`` is (it meant the current folder), and a ``tune`` in which no
config ran says so and fails, instead of ``best: inf us ... config: null`` with status 0."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import schedlib as sl
from schedlib import cli
from schedlib.carver import carve
from schedlib.report.writers import prepare_out_dir
from schedlib.search import write_recording
from schedlib.suites import parse_workload

ROOT = Path(sl.__file__).resolve().parents[1]  # the schedlib this test imported, for the subprocess too
SMALL = "matmul:M=64,N=64,K=64"


def error_line(capsys: pytest.CaptureFixture) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("schedlib: error: "), lines
    return lines[0].removeprefix("schedlib: error: ")


@pytest.mark.parametrize("out", ["", "  "])
@pytest.mark.parametrize("command", [["compare", "--workload", SMALL, "--methods", "rule"], ["demo"]])
def test_an_empty_out_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                 command: list[str], out: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main([*command, "--out", out]) == 2
    assert error_line(capsys) == (f"--out {out!r} is empty: give the folder for the report "
                                  f"(e.g. --out report)")
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder


@pytest.mark.parametrize("out", ["", " "])  # (Path("") is Path("."): the current folder, given explicitly)
def test_the_library_refuses_an_empty_report_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    out: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(sl.SchedlibError, match=r"the report folder '\s*' is empty: give a folder name"):
        prepare_out_dir(out)
    assert list(tmp_path.iterdir()) == []


def test_an_explicit_current_folder_is_still_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert prepare_out_dir(".") == Path(".")


# tune: every config failed


@pytest.fixture
def all_failed(tmp_path: Path) -> Path:
    """A recording of the rule's top configs in which every one failed to compile."""
    func = parse_workload(SMALL).build()
    configs = carve(func, "h100", topk=6)["config"]
    return write_recording(tmp_path / "failed.json", [{"config": c, "time_us": None, "status": "compile_error"}
                                                      for c in configs], func=func)


def test_tune_in_which_no_config_ran_fails(all_failed: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["tune", SMALL, "--trials", "6", "--replay", str(all_failed), "--storage", "memory",
                     "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "inf us" not in captured.out and "null" not in captured.out, captured.out
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("schedlib: error: tune: no config of matmul ran successfully ("), line
    counts = line.split("(", 1)[1].split(")")[0]  # e.g. "6 compile_error" or "5 compile_error, 1 not_recorded"
    assert counts.startswith(("6 compile_error", "5 compile_error", "4 compile_error")), line
    assert sum(int(part.split()[0]) for part in counts.split(", ")) == 6, line


def test_tune_in_which_no_config_ran_fails_in_a_subprocess(all_failed: Path, tmp_path: Path) -> None:
    """As a user sees it: one error line on stderr (not also the library's log line), status 1."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "schedlib", "tune", SMALL, "--trials", "6", "--replay",
                           str(all_failed), "--storage", "memory", "--quiet"], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("schedlib: error: tune: no config of matmul ran successfully"), \
        proc.stderr
    assert "best:" not in proc.stdout, proc.stdout


def test_tune_whose_measured_configs_cannot_be_built_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    func = parse_workload(SMALL).build()
    configs = list(carve(func, "h100", topk=3)["config"])
    rec = write_recording(tmp_path / "ok.json", [{"config": c, "time_us": 10.0 + i} for i, c in enumerate(configs)],
                          func=func)
    tune_module = importlib.import_module("schedlib.search.tune")  # (schedlib.search.tune is also the function)
    monkeypatch.setattr(tune_module, "build_best", lambda *a, **k: None)  # the rule refuses every one
    assert cli.main(["tune", SMALL, "--trials", "3", "--replay", str(rec), "--storage", "memory", "--quiet"]) == 1
    line = error_line(capsys)  # the search may also propose a config the recording lacks (not_recorded)
    assert re.match(r"tune: [23] configs of matmul ran, but the rule matmul builds none of them", line), line
