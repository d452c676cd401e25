"""Fixtures of the rule tests.  Every end-to-end case needs nvcc (compile check) and g++ (CPU emulator)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from schedlib.runtime.nvcc import find_nvcc


@pytest.fixture
def rng() -> np.random.Generator:
    """A freshly seeded generator; the seed is printed so a failure can be replayed."""
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def toolchain() -> None:
    """Skip (with the reason) when nvcc or g++ is missing; end-to-end cases need both."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found: the rule tests compile every schedule for sm_80 and sm_90")
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU emulator needs it")
