"""Every search test gets its own cache directory, so the default tuning database starts empty.

The compiled artifacts are another matter: a kernel compiles to the same library, cubin and ptxas report
whichever test builds it, and building them again in every test's private cache cost this suite minutes
(with the emulator's precompiled headers, 1.5 s per flag set per test).  So the private cache links those
kinds to the session's cache; only the tuning database, and whatever else a test writes there, is its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlib.cache import cache_dir

SHARED_KINDS = ("emulator", "emulator-headers", "compile", "cubin")  # content-addressed: safe to share


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("cache")  # not in tmp_path: tests check what they leave there
    cache.chmod(0o700)
    for kind in SHARED_KINDS:
        (cache / kind).symlink_to(cache_dir(kind), target_is_directory=True)  # the session's, before the switch
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(cache))
    return cache
