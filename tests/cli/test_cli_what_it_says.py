"""What the command says, checked against what a new user meets: ``profiles detect`` without a GPU in the
command's terms (not the library's ``pass properties=...``), ``tune --help`` naming every kind of
``--storage``, compare's table printed as demo's, tune naming the size a symbolic workload is estimated at,
and compare's search row saying why it found nothing (not an AttributeError)."""

from __future__ import annotations

import pytest

from schedlib import cli

NO_GPU = cli._gpu_problem() is not None


@pytest.mark.skipif(not NO_GPU, reason="checks what happens when no GPU can be used")
def test_profiles_detect_without_a_gpu(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["profiles", "detect"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("schedlib: error: profiles detect: no GPU found ("), line
    assert "properties=" not in line and "detect()" not in line, line  # Python API hints, not options
    assert "'schedlib profiles list'" in line, line


def test_tune_help_names_each_kind_of_storage(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli.main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # as one line: argparse wraps the help
    for kind in ("an SQLite file", "a journal file (.log or .journal)", "SQLAlchemy URL", "'memory'"):
        assert kind in text, kind


# compare's table on stdout


def test_compare_prints_times_as_demo_does(tmp_path: object, capsys: pytest.CaptureFixture) -> None:
    """Three significant figures and n/a for a row with no time (the vendor library without a GPU), as demo and
    the report show them, not 0.637341 and NaN."""
    assert cli.main(["compare", "--workload", "gemv:N=64,K=64", "--methods", "rule", "vendor", "--backend",
                     "estimate", "--target", "h100", "--quiet", "--out", str(tmp_path)]) == 0
    rows = {line.split()[1]: line.split() for line in capsys.readouterr().out.splitlines()[1:3]}
    assert rows["rule"][2:4] == ["0.637", "0.396"], rows
    assert rows["vendor"][2:4] == ["n/a", "n/a"], rows


# tune on a symbolic workload


def test_tune_names_the_values_a_symbolic_workload_is_estimated_at(capsys: pytest.CaptureFixture) -> None:
    """As carve says "ranked at M=4096": the model's time holds at that size only."""
    assert cli.main(["tune", "softmax:rows=$M,cols=1024", "--trials", "2", "--storage", "memory", "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "estimated at M=4096 (the symbolic sizes' values for these times)", out
    assert out[1].startswith("best: "), out
    assert cli.main(["tune", "softmax:rows=64,cols=1024", "--trials", "2", "--storage", "memory", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("best: ")  # concrete sizes: nothing to say


# compare: a search that found nothing buildable


def test_compare_says_why_a_search_found_nothing(tmp_path: object, capsys: pytest.CaptureFixture) -> None:
    """Sizes past 2^31 iterations: the model prices configs the rule then refuses to build, so tune has no best
    schedule; the search row said "failed: AttributeError: 'NoneType' object has no attribute 'rule'"."""
    import pandas as pd

    huge = "matmul:M=2147483647,N=2147483647,K=2147483647"
    assert cli.main(["compare", "--workload", huge, "--methods", "search", "--trials", "2", "--target", "h100",
                     "--quiet", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    (source,) = pd.read_csv(f"{tmp_path}/report.csv")["source"]
    assert "AttributeError" not in source, source
    assert "records hold no config that ran and that the rule can build" in source, source


def test_compare_cuts_a_long_source_short_on_stdout(tmp_path: object, capsys: pytest.CaptureFixture) -> None:
    """A failed row's message (hundreds of characters) padded every line of the printed table to its width."""
    huge = "matmul:M=2147483647,N=2147483647,K=2147483647"
    assert cli.main(["compare", "--workload", huge, "--workload", "gemv:N=64,K=64", "--methods", "rule",
                     "--target", "h100", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in out) < 200, out
    assert "(a source cut short with ... is whole in report.csv)" in out, out


# no home directory


def test_no_home_directory_is_one_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    """A container run as an arbitrary uid: no $HOME and no passwd entry, so Path.home() raises RuntimeError,
    which reached the user as a traceback."""
    from pathlib import Path

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    for name in ("SCHEDLIB_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cli.main(["tune", "gemv:N=64,K=64", "--trials", "2", "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("schedlib: error: no schedlib cache directory: "), lines
    assert "set SCHEDLIB_CACHE_DIR" in lines[0], lines


# a chain too long for the IR's recursive passes


def test_a_very_long_elementwise_chain_is_refused(capsys: pytest.CaptureFixture) -> None:
    """1000 relus raised RecursionError in make_func: a traceback from the command."""
    chain = "+".join(["relu"] * 1000)
    assert cli.main(["schedule", f"elementwise:shape=8x8,chain={chain}", "--no-source"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["schedlib: error: elementwise: chain has 1000 ops; at most 64 (split a longer chain into "
                     "several workloads)"], lines
    assert cli.main(["schedule", "elementwise:shape=8x8,chain=" + "+".join(["relu"] * 64), "--no-source"]) == 0
