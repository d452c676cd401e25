"""Edge cases of the ``schedlib`` command: a wrong kernel fails ``--emulate``, a replayed figure says it was
replayed, options that would be ignored are refused, symbolic workloads compare, and ``compare`` says how
far it has got.  In-process where possible (``cli.main``), which is fast and sees the same output."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from schedlib import cli
from schedlib.carver import carve
from schedlib.runtime.kernel import Kernel
from schedlib.search import write_recording
from schedlib.suites import parse_workload

SMALL = "matmul:M=64,N=64,K=64"
NO_GPU = cli._gpu_problem() is not None
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="checks what happens when no GPU can be used")


def error_line(capsys: pytest.CaptureFixture) -> str:
    """The one ``schedlib: error:`` line on stderr (and nothing else there)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("schedlib: error: "), lines
    return lines[0].removeprefix("schedlib: error: ")


# M1: --emulate applies the demo's tolerance


def test_emulate_fails_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["schedule", SMALL, "--emulate", "--no-source"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("(tolerance 1e-04): ok")
    right = Kernel.run_cpu
    monkeypatch.setattr(Kernel, "run_cpu", lambda self, *a, **k: np.asarray(right(self, *a, **k)) + 1.0)
    assert cli.main(["schedule", SMALL, "--emulate", "--no-source"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].endswith("(tolerance 1e-04): MISMATCH"), captured.out
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("schedlib: error: --emulate: the kernel's result differs from numpy's (max relative "
                           "error "), line


def test_emulate_says_ok_within_the_tolerance(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["schedule", "softmax:rows=$M,cols=48", "--emulate", "--no-source"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("emulator vs numpy at M=33: max relative error ") and last.endswith(
        "(tolerance 1e-04): ok"), last


# M2 and L8: tune --replay is labelled as replayed; replay without a file, or a file without replay, is refused


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    spec = "elementwise:shape=64x64"
    func = parse_workload(spec).build()
    configs = carve(func, "h100", topk=6)["config"]
    return write_recording(tmp_path / "rec.json", [{"config": c, "time_us": 1000.0 + i}
                                                   for i, c in enumerate(configs)], func=func)


def test_tune_with_replay_says_the_time_was_replayed(tmp_path: Path, recording: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["tune", "elementwise:shape=64x64", "--trials", "3", "--replay", str(recording), "--quiet",
                     "--storage", str(tmp_path / "t.db")]) == 0
    best = capsys.readouterr().out.splitlines()[0]
    assert f" us (replayed from {recording})  config: " in best and "carver" not in best, best
    assert float(best.split()[1]) >= 1000.0  # the recording's times, not the model's (about 2 us here)


@pytest.mark.parametrize(("extra", "message"), [
    (["--backend", "replay"], "--backend replay needs --replay FILE (recorded measurements, .json or .csv)"),
    (["--backend", "estimate", "--replay", "REC"],
     "--replay FILE goes with --backend replay (or no --backend), not --backend estimate"),
])
def test_tune_refuses_replay_options_that_do_not_go_together(tmp_path: Path, recording: Path, extra: list[str],
                                                            message: str, capsys: pytest.CaptureFixture) -> None:
    extra = [str(recording) if a == "REC" else a for a in extra]
    db = tmp_path / "t.db"
    assert cli.main(["tune", "elementwise:shape=64x64", "--trials", "2", "--storage", str(db), *extra]) == 2
    assert error_line(capsys) == message
    assert not db.exists()  # before any work


# L4: any spelling of auto falls back without a GPU


@needs_no_gpu
@pytest.mark.parametrize("spelling", ["AUTO", " Auto "])
def test_target_auto_in_any_case_falls_back(spelling: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["schedule", SMALL, "--target", spelling, "--no-source"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("schedlib: note: --target auto: no GPU found (") and "h100 profile" in err


# L6: vendor alone has no time without a GPU


@needs_no_gpu
@pytest.mark.parametrize("backend", [["--backend", "estimate"], []])
def test_compare_refuses_vendor_alone_without_a_gpu(tmp_path: Path, backend: list[str],
                                                    capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "vend"
    assert cli.main(["compare", "--workload", "transpose:M=64,N=64", "--methods", "vendor", *backend,
                     "--out", str(out)]) == 2
    assert error_line(capsys).startswith("--methods vendor: the vendor library has no time without a GPU")
    assert not out.exists()


# L7: a NAME that list and detect would ignore


@pytest.mark.parametrize("action", ["list", "detect"])
def test_profiles_refuses_a_name_it_would_ignore(action: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["profiles", action, "h100"]) == 2
    assert error_line(capsys) == (f"profiles {action} takes no NAME (got 'h100'); 'schedlib profiles show NAME' "
                                  "shows one profile")
    assert capsys.readouterr().out == ""


# L9: a damaged journal is named


@pytest.mark.parametrize(("content", "reason"), [
    ("garbage\n", "a stored value is not valid JSON"),
    ("[1, 2]\n", "line 1 is not a journal operation"),
])
def test_a_damaged_journal_is_named_in_the_error(tmp_path: Path, content: str, reason: str,
                                                 capsys: pytest.CaptureFixture) -> None:
    journal = tmp_path / "j.log"
    journal.write_text(content)
    assert cli.main(["tune", "elementwise:shape=64x64", "--trials", "2", "--quiet", "--storage", str(journal)]) == 2
    line = error_line(capsys)
    assert line.startswith(f"tuning storage {journal} cannot be read: {reason}"), line


# L10: demo --limit applies on the GPU too


def test_demo_limit_help_covers_the_gpu(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "largest size of the verification step, on the GPU or the CPU emulator alike" in text


# M6 and L2: a symbolic workload compares at the carver's size, and compare says how far it has got


def test_compare_runs_a_symbolic_workload_at_the_carvers_size(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sym"
    spec = "softmax:rows=$M,cols=1024"
    assert cli.main(["compare", "--workload", spec, "--workload", "transpose:M=64,N=64", "--target", "h100",
                     "--methods", "rule", "carver", "--backend", "estimate", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"schedlib: compare: workload 1/2: {spec} (rule, carver; 0 s so far)",
                   err[1]] and err[1].startswith("schedlib: compare: workload 2/2: transpose:M=64,N=64 ("), err
    df = pd.read_csv(out / "report.csv")
    sym = df[df["workload"] == spec]
    assert set(sym["shape"]) == {"X[Mx1024] at M=4096"}
    assert sym["pct_roofline"].map(math.isfinite).all() and (sym["time_us"] > 0).all()
    top = carve(parse_workload(spec).build(), "h100", topk=1)  # the same figure carve prints
    assert float(sym[sym["method"] == "carver"]["time_us"].iloc[0]) == pytest.approx(float(top["est_time_us"][0]))
    assert set(df[df["workload"] != spec]["shape"]) == {"X[64x64]"}


def test_compare_quiet_prints_no_progress(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["compare", "--workload", "transpose:M=64,N=64", "--target", "h100", "--methods", "rule",
                     "--backend", "estimate", "--out", str(tmp_path / "q"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_compare_with_an_unknown_target_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "never"
    assert cli.main(["compare", "--workload", "transpose:M=64,N=64", "--target", "nosuch", "--methods", "rule",
                     "--backend", "estimate", "--out", str(out)]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert not out.exists()
