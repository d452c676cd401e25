"""What a failed or interrupted ``demo``/``compare`` leaves on disk, and options the command used to drop
silently: a run that stops (bad ``--target``, Ctrl-C, an error mid-way) leaves no new empty report folder and
never half of a new report over the previous one; ``--suite`` given with ``--workload`` is refused rather
than ignored; ``carve --compiled`` with an unusable cache is one error, not a "did not compile" per config,
and says how far its compiling has got."""

from __future__ import annotations

import io
import sys
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


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_compare_stopped_midway_removes_the_folder_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture,
                                                             stop: type[BaseException]) -> None:
    import schedlib.report

    def stopped(*args: object, **kwargs: object) -> None:
        raise stop("stopped")

    monkeypatch.setattr(schedlib.report, "compare", stopped)
    out = tmp_path / "rep"
    if stop is KeyboardInterrupt:
        assert cli.main([*COMPARE, "--out", str(out)]) == 130
    else:
        with pytest.raises(RuntimeError):  # a bug keeps its traceback; the folder still goes
            cli.main([*COMPARE, "--out", str(out)])
    assert list(tmp_path.iterdir()) == []


def test_a_stopped_run_keeps_a_folder_that_was_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import schedlib.report

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(schedlib.report, "compare", interrupted)
    out = tmp_path / "rep"
    out.mkdir()
    assert cli.main([*COMPARE, "--out", str(out)]) == 130
    assert out.is_dir()  # the user's own (empty) folder is not removed


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


# --suite and --workload together


def test_compare_refuses_suite_with_workload(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "rep"
    assert cli.main(["compare", "--suite", "llm-decoder", "--workload", SMALL, "--out", str(out)]) == 2
    line = error_line(capsys)
    assert line.startswith("--suite llm-decoder and --workload: "), line
    assert not out.exists()


def test_compare_still_takes_workload_alone(tmp_path: Path) -> None:
    assert cli.main([*COMPARE, "--out", str(tmp_path / "rep")]) == 0


# carve --compiled


def test_carve_compiled_with_an_unusable_cache_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(blocker))
    assert cli.main(["carve", SMALL, "--compiled", "--topk", "1"]) == 2
    line = error_line(capsys)  # before: a "did not compile, left out" warning for each of 8 configs, then this
    assert line.startswith(f"schedlib cache directory {blocker} (from $SCHEDLIB_CACHE_DIR) cannot be used"), line


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def fake_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """ptxas's answer for every config, with no compiler: 32 registers, no spill."""
    import schedlib.runtime.resources as resources
    from schedlib.runtime.resources import CompiledUsage

    class Fake:
        def __init__(self, profile: object, arch: str) -> None:
            self.profile, self.arch = profile, arch

        def __call__(self, schedule: object) -> CompiledUsage:
            return CompiledUsage(registers=32, spill_bytes=0, arch=self.arch)

    monkeypatch.setattr(resources, "compiled_resources", lambda target: Fake(target, "sm_90"))


@pytest.mark.usefixtures("fake_compiler")
def test_carve_compiled_says_how_far_it_has_got(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["carve", SMALL, "--compiled", "--topk", "2"]) == 0
    err = terminal.getvalue()
    # redrawn in place after each config (8: the pool for --topk 2), then the summary on a line of its own
    assert "\rcompiling for sm_90: 1/8 compiled" in err and "\rcompiling for sm_90: 8/8 compiled" in err, err
    assert "\ncompiled 8 configs for sm_90: 0 spill" in err, err


@pytest.mark.usefixtures("fake_compiler")
def test_carve_compiled_off_a_terminal_prints_no_redrawn_line(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["carve", SMALL, "--compiled", "--topk", "2"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and len(err.strip().splitlines()) == 2, err  # the first line and the summary


def test_an_extra_report_file_is_checked_before_any_is_replaced(tmp_path: Path) -> None:
    """write_report(extra=...) (the demo's verification.csv): a folder in an extra file's place is refused
    before report.csv and the rest are replaced, not after."""
    import pandas as pd

    from schedlib.errors import SchedlibError

    for name in writers.REPORT_FILES:
        (tmp_path / name).write_text("old")
    (tmp_path / "verification.csv").mkdir()
    df = pd.DataFrame({"workload": ["w"], "method": ["rule"], "config": [{}], "pct_roofline": [1.0]})
    with pytest.raises(SchedlibError, match=r"verification\.csv: it is a folder"):
        writers.write_report(df, tmp_path, extra={"verification.csv": "x"})
    assert {n: (tmp_path / n).read_text() for n in writers.REPORT_FILES} == dict.fromkeys(writers.REPORT_FILES, "old")


def test_carve_compiled_puts_a_failed_configs_warning_on_a_line_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import schedlib.runtime.resources as resources
    from schedlib.errors import CompileError
    from schedlib.runtime.resources import CompiledUsage

    class FirstFails:
        def __init__(self, profile: object) -> None:
            self.profile, self.arch, self.calls = profile, "sm_90", 0

        def __call__(self, schedule: object) -> CompiledUsage:
            self.calls += 1
            if self.calls == 1:
                raise CompileError("nvcc failed\nkernel.cu(1): error: made up")
            return CompiledUsage(registers=32, spill_bytes=0, arch=self.arch)

    monkeypatch.setattr(resources, "compiled_resources", lambda target: FirstFails(target))
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["carve", SMALL, "--compiled", "--topk", "2"]) == 0
    err = terminal.getvalue()
    assert "\rcompiling for sm_90: 0/8 compiled, 1 failed\nschedlib: warning: carve: gemv config " in err, err
    assert "\rcompiling for sm_90: 8/8 compiled, 1 failed\ncompiled 8 configs" in err, err


# A reader that leaves early (| head) does not stop the run


def test_a_run_piped_into_a_reader_that_has_left_still_writes_its_report(tmp_path: Path) -> None:
    import os
    import subprocess

    out = tmp_path / "rep"
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write to stdout fails
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # the demo prints a line per workload verified before it writes anything (it stopped at the first one)
    proc = subprocess.run([sys.executable, "-m", "schedlib", "demo", "--target", "h100", "--trials", "2",
                           "--limit", "16", "--out", str(out)], stdout=write, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=600, check=False)
    os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.csv", "report.html", "report.md", "verification.csv"]
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr, proc.stderr
