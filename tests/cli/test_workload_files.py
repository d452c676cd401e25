"""A WORKLOAD argument may be a YAML/JSON suite file: ``schedule``, ``carve`` and ``tune`` take one holding a
single workload (and say how many a longer one holds), ``compare --workload`` takes every workload in it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from schedlib import cli

ONE = "- matmul:M=64,N=64,K=64\n"
TWO = ONE + "- kind: softmax\n  rows: 8\n  cols: 100\n  label: small softmax\n"


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("command", [["schedule"], ["carve", "--topk", "2"]])
def test_a_suite_file_of_one_workload_is_that_workload(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       command: list[str]) -> None:
    assert cli.main([command[0], _file(tmp_path, "one.yaml", ONE), *command[1:], "--target", "h100"]) == 0
    out = capsys.readouterr().out
    assert ("rule: matmul" in out) if command[0] == "schedule" else ("est_time_us" in out)


def test_a_longer_suite_file_is_refused_with_its_size_and_the_way_out(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    two = _file(tmp_path, "two.json", '["matmul:M=64,N=64,K=64", "softmax:rows=8,cols=100"]')
    assert cli.main(["schedule", two, "--target", "h100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"schedlib: error: suite file {two} holds 2 workloads (matmul:M=64,N=64,K=64, "
                   f"softmax:rows=8,cols=100); this command takes one: give its workload string, or run them all "
                   f"with schedlib compare --suite {two}")


def test_compare_takes_every_workload_of_a_file(tmp_path: Path) -> None:
    out = tmp_path / "report"
    code = cli.main(["compare", "--workload", _file(tmp_path, "two.yaml", TWO), "--workload",
                     "gemv:N=64,K=64", "--methods", "rule", "--target", "h100", "--out", str(out)])
    assert code == 0
    table = pd.read_csv(out / "report.csv")
    assert list(table["workload"]) == ["matmul:M=64,N=64,K=64", "small softmax", "gemv:N=64,K=64"]
