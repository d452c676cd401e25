"""Fixtures every test directory uses.  This file also puts ``tests/`` on ``sys.path`` (pytest's default
import mode inserts a root conftest's folder), which is how test modules anywhere import ``kernel_batch``."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A freshly seeded generator; the seed is printed so a failure can be replayed."""
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)
