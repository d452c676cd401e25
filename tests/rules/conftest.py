"""Fixtures of the rule tests.  End-to-end cases need g++ (the CPU emulator); their compile checks need nvcc or
NVRTC and run only where one is found (``helpers.compiler_available``), so a machine without the CUDA toolkit
still runs every numeric comparison.  Compile-only tests ask for ``cuda_compiler`` and skip without one."""

from __future__ import annotations

import pytest

from schedlib.runtime.emulator import find_gxx

from .helpers import compiler_available


@pytest.fixture(scope="session")
def toolchain() -> None:
    """Skip (with the reason) when g++ is missing: the CPU emulator needs it.  The compile checks of these
    cases run only where nvcc or NVRTC is found (``helpers.check_resources``)."""
    if find_gxx() is None:
        pytest.skip("the CPU emulator needs g++ (set $SCHEDLIB_GXX or install g++)")


@pytest.fixture(scope="session")
def cuda_compiler() -> None:
    """Skip (with the reason) when neither nvcc nor NVRTC is found: for tests that only compile-check."""
    if not compiler_available():
        pytest.skip("compile checks need nvcc or NVRTC (cupy + CUDA headers); neither was found")
