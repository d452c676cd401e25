"""Problems the ``schedlib`` command must report in one clear line: a target where no config is legal, a failing
tuning storage, a bad ``--out`` found before the work, suite files read as strictly as profiles, non-finite
parameters; and what it must say besides: the sizes a symbolic ranking is at, library warnings with their
``schedlib: warning:`` prefix."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy

import schedlib.search
from schedlib import cli
from schedlib.errors import IRError
from schedlib.suites import load_suite_file, parse_workload

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "schedlib", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def error_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("schedlib: error: "), text
    return lines[0].removeprefix("schedlib: error: ")


# carve: no legal config, and the sizes of a symbolic ranking


def test_carve_says_that_no_config_is_legal_on_the_target(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = (ROOT / "hwprofiles" / "h100.yaml").read_text()
    starved = text.replace("registers_per_sm: 65536", "registers_per_sm: 8192")
    starved = starved.replace("max_registers_per_thread: 255", "max_registers_per_thread: 32")
    (tmp_path / "h100.yaml").write_text(starved)
    assert cli.main(["carve", "matmul:M=512,N=512,K=512", "--target", str(tmp_path / "h100.yaml")]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # not "Empty DataFrame"
    assert error_line(err) == ("carve: no config of rule matmul for matmul:M=512,N=512,K=512 is legal on h100: its "
                               "knob space has no point within the target's limits (registers, shared memory, "
                               "threads per block)")


def test_carve_names_the_values_a_symbolic_workload_is_ranked_at(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["carve", "softmax:rows=$M,cols=1024", "--topk", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ranked at M=4096 (the symbolic sizes' values for this ranking)"
    assert cli.main(["carve", "softmax:rows=64,cols=1024", "--topk", "2"]) == 0
    assert not capsys.readouterr().out.startswith("ranked at")  # concrete sizes: nothing to say


# errors of the tuning storage's packages: one line; a bug in the library keeps its traceback


@pytest.mark.parametrize(("error", "said"), [
    (optuna.exceptions.StorageInternalError("An exception is raised during the commit.\nmore detail"),
     "optuna (the search library) raised StorageInternalError (with --storage sqlite:///): An exception is raised "
     "during the commit."),
    (sqlalchemy.exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError("no such table: studies")),
     "the tuning storage's database raised OperationalError (with --storage sqlite:///): no such table: studies"),
    (sqlite3.DatabaseError("database disk image is malformed"),
     "the tuning storage's database raised DatabaseError (with --storage sqlite:///): database disk image is "
     "malformed"),
])
def test_a_storage_error_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                     error: Exception, said: str) -> None:
    def tune(*_: object, **__: object) -> None:
        raise error

    monkeypatch.setattr(schedlib.search, "tune", tune)
    assert cli.main(["tune", "softmax:rows=64,cols=64", "--trials", "2", "--storage", "sqlite:///", "--quiet"]) == 2
    assert error_line(capsys.readouterr().err) == said


def test_a_programming_error_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def tune(*_: object, **__: object) -> None:
        raise AttributeError("'NoneType' object has no attribute 'trials'")

    monkeypatch.setattr(schedlib.search, "tune", tune)
    with pytest.raises(AttributeError):
        cli.main(["tune", "softmax:rows=64,cols=64", "--trials", "2", "--storage", "memory", "--quiet"])


# --out checked before the work


def test_compare_refuses_a_folder_named_report_html_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "report.html").mkdir()
    (tmp_path / "report.csv").write_text("earlier")
    proc = run("compare", "--workload", "softmax:rows=64,cols=1024", "--methods", "rule", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert error_line(proc.stderr) == (f"cannot write the report to {tmp_path / 'report.html'}: it is a folder; "
                                       "move it or choose another folder")
    assert (tmp_path / "report.csv").read_text() == "earlier" and not (tmp_path / "report.md").exists()


def test_out_as_a_dangling_symlink_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    os.symlink(tmp_path / "gone", tmp_path / "out")
    assert cli.main(["compare", "--workload", "softmax:rows=64,cols=64", "--methods", "rule", "--out",
                     str(tmp_path / "out")]) == 2
    assert error_line(capsys.readouterr().err) == (f"cannot write the report to {tmp_path / 'out'}: it is a symbolic "
                                                   f"link to {tmp_path / 'gone'}, which does not exist; create that "
                                                   "folder or choose another")


# library warnings and log records


def test_the_searchs_warnings_have_the_prefix(tmp_path: Path) -> None:
    """A real one, in a process of its own (where nothing else handles the library's log records): more trials
    than the space has legal configs."""
    proc = run("tune", "elementwise:shape=64x64", "--trials", "500", "--storage", str(tmp_path / "t.db"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    exhausted = [ln for ln in proc.stderr.splitlines() if "is exhausted" in ln]
    assert len(exhausted) == 1 and exhausted[0].startswith("schedlib: warning: tune: the "), proc.stderr


def test_log_records_of_the_library_have_the_prefix(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    def cmd(_: object) -> int:
        logging.getLogger("schedlib.search").warning("study %s: skipped %d malformed record(s)\nfirst: x", "s", 2)
        logging.getLogger("schedlib.rules").error("rule r raised")
        logging.getLogger("schedlib.rules").info("not shown")
        return 0

    monkeypatch.setattr(cli, "cmd_profiles", cmd)
    assert cli.main(["profiles"]) == 0
    assert capsys.readouterr().err == ("schedlib: warning: study s: skipped 2 malformed record(s)\n  first: x\n"
                                       "schedlib: error: rule r raised\n")
    assert cli.main(["profiles", "list"]) == 0  # the handler is gone once the command ends
    logging.getLogger("schedlib.search").warning("after")
    assert "schedlib: warning: after" not in capsys.readouterr().err


# non-finite parameters


@pytest.mark.parametrize(("spec", "said"), [
    ("layernorm:rows=4,cols=64,eps=nan", "eps='nan' must be a finite number"),
    ("layernorm:rows=4,cols=64,eps=inf", "eps='inf' must be a finite number"),
    ("elementwise:shape=4x64,chain=scale,scale=-inf", "scale='-inf' must be a finite number"),
    ("elementwise:shape=4x64,chain=scale,scale=1e300", "scale='1e300' must be a finite number"),
    ("layernorm:rows=4,cols=64,eps=-1", "eps='-1' must be a number above 0"),
    ("rmsnorm:rows=4,cols=64,eps=0", "eps='0' must be a number above 0"),
])
def test_non_finite_and_non_positive_parameters_are_refused(spec: str, said: str) -> None:
    with pytest.raises(IRError) as info:
        parse_workload(spec)
    assert said in str(info.value)


def test_finite_parameters_are_kept() -> None:
    assert parse_workload("elementwise:shape=4x64,chain=scale,scale=-2").params["scale"] == -2.0
    assert parse_workload("layernorm:rows=4,cols=64,eps=1e-3").params["eps"] == 1e-3


@pytest.mark.emulator
def test_emulate_agrees_where_both_overflow(capsys: pytest.CaptureFixture) -> None:
    """A finite scale that takes about a quarter of the outputs past float32's range: +-inf in the same places,
    the others finite, so kernel and numpy agree (inf - inf is no NaN error)."""
    assert cli.main(["schedule", "elementwise:shape=4x64,chain=scale,scale=3e38", "--emulate", "--no-source"]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("emulator vs numpy: max relative error 0.00e+00 (tolerance 1e-04): ok")
    assert "RuntimeWarning" not in err


# suite files read as strictly as profiles


@pytest.mark.parametrize(("name", "text", "said"), [
    ("dup.yaml", "- {kind: matmul, M: 64, M: 128}\n",
     "line 1, column 25: not valid YAML (duplicate key 'M', first given on line 1)"),
    ("dup.json", '[{"kind": "matmul", "M": 64, "M": 128}]', "not valid JSON (duplicate key 'M' in one object)"),
    ("sexagesimal.yaml", "- {kind: matmul, M: 1:04}\n", "entry 0: workload matmul: M='1:04' must be a positive int"),
    ("exponent.yaml", "- {kind: softmax, rows: 1e3}\n", "entry 0: workload softmax: rows=1000.0 must be a positive "
                                                        "int or $name (a symbolic size) (write 1000)"),
    ("nan.yaml", "- {kind: layernorm, eps: .nan}\n", "entry 0: workload layernorm: eps=nan must be a finite number"),
    ("nan.json", '[{"kind": "layernorm", "eps": NaN}]', "entry 0: workload layernorm: eps=nan must be a finite"),
    ("string.yaml", "- matmul:M=64\n- matmul:M=abc\n", "entry 1: workload matmul: M='abc' must be a positive int"),
    ("octal.yaml", "- {kind: softmax, rows: 010}\n", "entry 0: workload softmax: rows=10.0 must be a positive int "
                                                     "or $name (a symbolic size) (write 10)"),  # not YAML 1.1's 8
])
def test_a_bad_suite_file_is_refused_naming_file_and_entry(tmp_path: Path, name: str, text: str, said: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(IRError) as info:
        load_suite_file(path)
    assert str(info.value).startswith(f"suite file {path}: {said}"), str(info.value)


def test_yaml_1_2_numbers_in_a_suite_file(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("- {kind: layernorm, rows: 0x40, cols: 64, eps: 1e-3}\n")
    assert load_suite_file(path)[0].params == {"rows": 64, "cols": 64, "eps": 1e-3}
