"""``profiles detect`` without a GPU says so in the command's terms (not the library's ``pass properties=...``),
and ``tune --help`` names every kind of ``--storage`` the command takes (a plain path and ``memory`` too)."""

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
