"""Every search test gets its own cache directory, so the default tuning database starts empty."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(cache))
    return cache
