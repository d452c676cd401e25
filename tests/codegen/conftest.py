"""Fixtures of the codegen tests: skipping of GPU / compiler-dependent tests.

Tests marked ``@pytest.mark.gpu`` run only when cupy sees a CUDA device; otherwise they are skipped with
the reason schedlib itself gives (no cupy, no driver, no device).  nvcc/NVRTC and g++ checks skip the same
way when the tool is missing, so the suite passes on a machine without them.
"""

from __future__ import annotations

from typing import Any

import pytest
from cg_support import gpu_skip_reason

from schedlib.runtime.emulator import find_gxx
from schedlib.runtime.gpu import require_cupy
from schedlib.runtime.nvcc import find_nvcc, nvrtc_available


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        reason = gpu_skip_reason()
        if reason is not None:
            pytest.skip(reason)
    if item.get_closest_marker("emulator") is not None and find_gxx() is None:
        pytest.skip("the CUDA emulator needs g++ (set $SCHEDLIB_GXX or install g++)")
    if item.get_closest_marker("nvcc") is not None and find_nvcc() is None and not nvrtc_available():
        pytest.skip("compile checks need nvcc or NVRTC (cupy + CUDA headers); neither was found")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "emulator: runs generated CUDA on the CPU emulator (needs g++)")
    config.addinivalue_line("markers", "nvcc: compile-checks generated CUDA (needs nvcc or NVRTC)")


@pytest.fixture
def cupy() -> Any:
    """cupy, on a machine where it sees a device (tests using this are marked gpu)."""
    return require_cupy()
