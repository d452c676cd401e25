"""What the ``schedlib`` command tells its user: whole error messages, notes, warnings, help and --version."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import schedlib
from schedlib import cli
from schedlib.errors import SchedlibError
from schedlib.rules import get_rule
from schedlib.suites import parse_workload
from schedlib.workloads import BUILTINS

ROOT = Path(__file__).resolve().parents[2]
SMALL = "matmul:M=64,N=64,K=64"
NO_GPU = cli._gpu_problem() is not None
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="checks the messages given when no GPU can be used")


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "schedlib", *args], capture_output=True, text=True, env=full,
                          timeout=timeout)


def one_line(proc: subprocess.CompletedProcess, prefix: str = "schedlib: error: ") -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), proc.stderr
    return lines[0]


def flat(text: str) -> str:
    return " ".join(text.split())


# 1. error messages in full


def test_a_multi_line_error_is_printed_whole(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def fail(args: argparse.Namespace) -> int:
        raise SchedlibError("first line\nsecond line\n\nfourth line")

    monkeypatch.setattr(cli, "cmd_profiles", fail)
    assert cli.main(["profiles", "list"]) == 2
    assert capsys.readouterr().err == "schedlib: error: first line\n  second line\n\n  fourth line\n"


def test_a_yaml_suite_error_names_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloads: [\n")
    proc = run("compare", "--suite", str(bad), "--methods", "rule", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert one_line(proc) == (f"schedlib: error: suite file {bad}: line 2, column 1: not valid YAML "
                              "(expected the node content, but found '<stream end>')")
    bad.write_text("workloads:\n  - matmul:M=8\n  - {kind: gemv: N}\n")
    proc = run("compare", "--suite", str(bad), "--methods", "rule", "--out", str(tmp_path / "r"))
    assert "line 3, column " in one_line(proc) and "{kind: gemv: N}" in proc.stderr


# 2. partial and misspelt --config


def test_a_partial_config_is_merged_over_the_rules_default() -> None:
    proc = run("schedule", SMALL, "--rule", "matmul", "--config", '{"stages": 1}', "--no-source")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout.splitlines()[0].split("config: ", 1)[1])
    default = get_rule("matmul").default_config(parse_workload(SMALL).build(), "h100")
    assert default["stages"] != 1 and printed == {**default, "stages": 1}


def test_a_tensor_core_value_starts_from_that_templates_default() -> None:
    spec = "matmul:M=256,N=256,K=256,dtype=float16"
    proc = run("schedule", spec, "--rule", "matmul", "--config", '{"tensor_core": true}', "--no-source")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout.splitlines()[0].split("config: ", 1)[1])
    assert printed == get_rule("matmul").template_default(parse_workload(spec).build(), "h100", True)


def test_an_unknown_knob_is_named_with_the_valid_ones() -> None:
    proc = run("schedule", SMALL, "--rule", "matmul", "--config", '{"nope": 1, "stages": 1}', "--no-source")
    assert proc.returncode == 2
    names = get_rule("matmul").space(parse_workload(SMALL).build(), "h100").names
    assert one_line(proc) == f"schedlib: error: --config: unknown knob 'nope' for rule matmul; its knobs are " \
                             f"{', '.join(names)}"


def test_a_bad_knob_value_is_reported_without_the_whole_config() -> None:
    proc = run("schedule", SMALL, "--rule", "matmul", "--config", '{"tensor_core": "wgmma"}', "--no-source")
    assert proc.returncode == 2
    assert one_line(proc) == ("schedlib: error: --config: knob tensor_core='wgmma' is not one of [False] "
                              "(rule matmul on h100)")


def test_config_help_says_it_is_merged() -> None:
    proc = run("schedule", "--help")
    assert "knobs left out keep the rule's default for this workload and target" in flat(proc.stdout)


# 3. tune says where its figure comes from and what a rerun did


def test_tune_says_what_a_rerun_and_an_exhausted_space_measured(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    """One study, three runs (in-process): 4 trials; the same 4 again (nothing new); then more trials than
    the space has legal configs, where the search stops early and raising --trials would not help."""
    spec = "elementwise:shape=64x64"
    legal = sum(1 for _ in get_rule("elementwise").space(parse_workload(spec).build(), "h100").enumerate())
    assert 4 < legal < 50

    def tune(trials: int) -> list[str]:
        assert cli.main(["tune", spec, "--trials", str(trials), "--storage", f"sqlite:///{tmp_path / 't.db'}",
                         "--quiet"]) == 0
        return capsys.readouterr().out.splitlines()

    first, again, more = tune(4), tune(4), tune(50)
    assert first[1] == "4 new configs measured"
    assert again[0] == first[0]
    assert again[0].startswith("best: ")
    assert " us (estimated by the carver's model, not measured)  config: {" in again[0]
    assert again[1] == ("0 new configs measured; 4 recorded trials reused "
                        "(the study already holds --trials 4; raise --trials to search further)")
    assert more[1] == (f"{legal - 4} new configs measured; 4 recorded trials reused; every legal config of the "
                       f"space is recorded ({legal}), so more trials find nothing new")


def test_tune_help_names_the_default_backend() -> None:
    assert "'estimate' asks the carver's analytical model (no GPU; the default)" in flat(run("tune", "--help").stdout)


# 4. --target auto without a GPU


@needs_no_gpu
def test_target_auto_says_which_profile_it_falls_back_to() -> None:
    proc = run("schedule", SMALL, "--target", "auto", "--no-source")
    assert proc.returncode == 0, proc.stderr
    note = one_line(proc, "schedlib: note: --target auto: no GPU found (")
    assert "so using the h100 profile (NVIDIA H100" in note
    quiet = run("schedule", SMALL, "--target", "h100", "--no-source")
    assert quiet.returncode == 0 and quiet.stderr == ""


# 5. help for every argument, --version


def test_every_argument_has_help() -> None:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [f"{name} {action.dest}" for name, command in sub.choices.items() for action in command._actions
               if not action.help]
    assert missing == []
    assert [a.dest for a in sub._choices_actions if not a.help] == []


def test_version() -> None:
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"schedlib {schedlib.__version__}"


def test_workload_help_lists_the_kinds_and_their_parameters() -> None:
    text = run("schedule", "--help").stdout
    assert "kind:key=value,..." in flat(text)
    for kind in BUILTINS:
        assert f"\n  {kind:12s} " in text
    assert "matmul       M=1024, N=1024, K=1024, dtype=float32" in text


# 6. tune --backend gpu without a GPU


@needs_no_gpu
def test_tune_on_a_missing_gpu_says_what_compare_says(tmp_path: Path) -> None:
    tune = run("tune", SMALL, "--backend", "gpu", "--trials", "2", "--storage", f"sqlite:///{tmp_path / 't.db'}")
    compare = run("compare", "--workload", SMALL, "--methods", "rule", "--backend", "gpu", "--out", str(tmp_path))
    assert tune.returncode == 2 and compare.returncode == 2
    assert one_line(tune) == one_line(compare)
    assert "--backend gpu: " in tune.stderr and "--backend estimate" in tune.stderr
    assert "worker" not in tune.stderr and "ModuleNotFoundError" not in tune.stderr
    assert not (tmp_path / "t.db").exists()  # checked before any work


# 7. a note before a long emulation


def test_a_long_emulation_is_announced(capsys: pytest.CaptureFixture) -> None:
    for text, long in (("matmul", True), (SMALL, False), ("softmax:rows=$M,cols=48", False)):
        spec = parse_workload(text)
        cli._emulation_note(spec, spec.build())
        err = capsys.readouterr().err
        assert bool(err) == long, (text, err)
    spec = parse_workload("matmul")
    cli._emulation_note(spec, spec.build())
    assert capsys.readouterr().err == (
        "schedlib: note: --emulate: matmul (A[1024x1024], B[1024x1024], C[1024x1024]) runs 1,073,741,824 loop "
        "iterations on the CPU emulator, which can take minutes; for a quick check pass smaller sizes, "
        "e.g. matmul:M=64,N=64,K=64\n")


def test_the_emulation_note_comes_before_the_work(capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The note is on stderr before anything is built or emulated (here the build stops the command)."""
    class Stop(Exception):
        pass

    def stop(*args: object, **kwargs: object) -> None:
        assert capsys.readouterr().err.startswith("schedlib: note: --emulate: matmul (A[1024x1024]")
        raise Stop

    monkeypatch.setattr("schedlib.runtime.kernel.build", stop)
    with pytest.raises(Stop):
        cli.main(["schedule", "matmul", "--emulate", "--no-source"])


# 8. profile warnings as schedlib lines


def test_profile_warnings_are_schedlib_lines(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("name: [\n")
    missing = tmp_path / "no-such-dir"
    proc = run("profiles", "list", env={"SCHEDLIB_HWPROFILE_PATH": os.pathsep.join([str(tmp_path), str(missing)])})
    assert proc.returncode == 0, proc.stderr
    assert "h100 " in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and all(ln.startswith("schedlib: warning: ") for ln in lines), proc.stderr
    assert f"SCHEDLIB_HWPROFILE_PATH names {missing}, which is not a directory" in proc.stderr
    assert f"skipped a hardware profile that does not load: {tmp_path / 'broken.yaml'}" in proc.stderr
    assert "ProfileWarning" not in proc.stderr and "cli.py" not in proc.stderr
