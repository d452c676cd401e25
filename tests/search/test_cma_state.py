"""The cmaes strategy keeps its CMA-ES state in memory: the database holds a token, never a pickle, and a
pickle planted in the database is not loaded when the study resumes (loading one would run its code)."""

from __future__ import annotations

import importlib
import pickle
import sqlite3
from pathlib import Path

import numpy as np
import pytest

import schedlib as sl
import schedlib.search as S
from schedlib.search.cma_sampler import TOKEN_PREFIX, InMemoryCmaEsSampler
from schedlib.search.strategies import make_strategy

FUNC = sl.workloads.matmul(256, 256, 256)
tune_module = importlib.import_module("schedlib.search.tune")  # the package exports the function by that name


def optimizer_attrs(db: Path) -> list[tuple[int, str, str]]:
    con = sqlite3.connect(db)
    rows = con.execute("SELECT trial_system_attribute_id, key, value_json FROM trial_system_attributes "
                       "WHERE key LIKE '%optimizer%'").fetchall()
    con.close()
    return rows


def test_a_pickle_planted_in_the_database_is_never_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path / "cache"))
    db = tmp_path / "cma.sqlite3"
    first = S.tune(FUNC, "h100", trials=30, strategy="cmaes", storage=db, quiet=True, warm_start=False)
    assert first.measured_now == 30
    stored = optimizer_attrs(db)
    assert stored, "CMA-ES told its optimizer at least one generation"
    assert all(TOKEN_PREFIX in value for _, _, value in stored), stored[:2]

    planted = tmp_path / "planted"

    class Payload:
        def __reduce__(self) -> tuple:
            return (Path.touch, (planted,))

    evil = '"' + pickle.dumps(Payload()).hex() + '"'
    con = sqlite3.connect(db)
    con.executemany("UPDATE trial_system_attributes SET value_json = ? WHERE trial_system_attribute_id = ?",
                    [(evil, row_id) for row_id, _, _ in stored])
    con.commit()
    con.close()
    resumed = S.tune(FUNC, "h100", trials=40, strategy="cmaes", storage=db, quiet=True, warm_start=False)
    assert not planted.exists(), "a pickle read from the database was loaded"
    assert resumed.measured_now == 10
    assert np.isfinite(resumed.best_time_us)


def test_within_a_process_the_state_carries_over_generations(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list = []

    def keep(*args: object, **kwargs: object) -> object:
        made.append(make_strategy(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(tune_module, "make_strategy", keep)
    result = S.tune(FUNC, "h100", trials=40, strategy="cmaes", storage="memory", quiet=True, warm_start=False)
    assert result.measured_now == 40
    sampler = made[0].sampler
    assert isinstance(sampler, InMemoryCmaEsSampler)
    tokens = list(sampler._states)
    assert len(tokens) == 1 and tokens[0].startswith(TOKEN_PREFIX)
    restored = pickle.loads(bytes.fromhex(sampler._states[tokens[0]]))
    assert restored.generation >= 2  # told several generations, each resumed from memory
