"""The package's version is stated twice (the install metadata and ``schedlib.__version__``); tuned records
are keyed by it, so that kernels measured with other generated code are not reused: the two must agree."""

from __future__ import annotations

import re
from pathlib import Path

import schedlib as sl


def test_pyproject_and_package_state_the_same_version() -> None:
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    (stated,) = re.findall(r'(?m)^version = "([^"]+)"$', text)
    assert stated == sl.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", stated)
