"""What a failed or interrupted ``demo``/``compare`` leaves on disk: an unknown ``--target`` creates no
report folder, and a run stopped while its report is written leaves the previous report whole."""

from __future__ import annotations

from pathlib import Path

import pytest

import schedlib.report.writers as writers
from schedlib import cli

SMALL = "gemv:N=64,K=64"
COMPARE = ["compare", "--workload", SMALL, "--methods", "rule", "--quiet", "--target", "h100"]


def error_line(capsys: pytest.CaptureFixture) -> str:
    """The one ``schedlib: error:`` line on stderr (and nothing else there)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("schedlib: error: "), lines
    return lines[0].removeprefix("schedlib: error: ")


# A stopped run leaves no empty report folder it created


def test_demo_with_an_unknown_target_creates_no_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "rep" / "deeper"
    assert cli.main(["demo", "--target", "nope", "--out", str(out)]) == 2
    assert error_line(capsys).startswith("unknown hardware profile 'nope'")
    assert list(tmp_path.iterdir()) == []  # neither rep/ nor rep/deeper/


# The report is replaced whole or not at all


@pytest.mark.parametrize("stage", ["roofline_bars", "convergence_plot"])
def test_a_report_interrupted_while_written_leaves_the_old_one_whole(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    stage: str) -> None:
    out = tmp_path / "rep"
    out.mkdir()
    for name in writers.REPORT_FILES:
        (out / name).write_text("old")

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(writers, stage, interrupted)
    # convergence_plot runs only with a search; the search method gives it one
    assert cli.main([*COMPARE[:4], "rule", "search", "--trials", "2", "--quiet", "--target", "h100",
                     "--out", str(out)]) == 130
    assert sorted(p.name for p in out.iterdir()) == sorted(writers.REPORT_FILES)  # no temporary files left
    assert {p.name: p.read_text() for p in out.iterdir()} == dict.fromkeys(writers.REPORT_FILES, "old")


def test_a_report_is_written_in_full(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    assert cli.main([*COMPARE, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(writers.REPORT_FILES)
    assert (out / "report.html").read_text().endswith("</body></html>")
    assert (out / "report.csv").read_text().startswith("workload,")


