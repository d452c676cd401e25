"""``sl.report.write_report``: the three files of a comparison, and an output folder that cannot be one."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import schedlib as sl
from schedlib.report import compare, write_report


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return compare(["reduce:rows=64,cols=4096", "transpose:M=64,N=32"], "h100", methods=("rule", "carver"),
                   backend="estimate")


def test_the_report_has_its_three_files(table: pd.DataFrame, tmp_path: Path) -> None:
    paths = write_report(table, tmp_path / "nested" / "out", title="two workloads")
    assert {k: p.name for k, p in paths.items()} == {"csv": "report.csv", "markdown": "report.md",
                                                     "html": "report.html"}
    csv = pd.read_csv(paths["csv"])
    assert len(csv) == len(table) and set(csv["workload"]) == set(table["workload"])
    assert all(isinstance(json.loads(c), dict) for c in csv["config"].dropna())  # JSON, not Python reprs
    md = paths["markdown"].read_text()
    assert md.startswith("# two workloads") and "estimated by the carver model (no GPU)" in md
    page = paths["html"].read_text()
    assert page.startswith("<!doctype html>") and "<h1>two workloads</h1>" in page and "data:image/png" in page


def test_a_file_where_the_folder_should_be_is_refused(table: pd.DataFrame, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("keep me")
    with pytest.raises(sl.SchedlibError, match=f"cannot write the report to {target}: it is a file, not a folder"):
        write_report(table, target)
    assert target.read_text() == "keep me"
    with pytest.raises(sl.SchedlibError, match="Not a directory"):
        write_report(table, target / "sub")


def test_anything_but_a_comparison_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"needs the DataFrame sl\.report\.compare returns, got dict"):
        write_report({"rows": []}, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"with columns \['a'\]"):
        write_report(pd.DataFrame({"a": [1]}), tmp_path)
    assert list(tmp_path.iterdir()) == []
