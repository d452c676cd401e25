"""``tune`` and ``apply_best`` refuse bad arguments up front, with the error ``tune`` has always raised."""

from __future__ import annotations

from pathlib import Path

import pytest

import schedlib.search as S
from schedlib.errors import SchedlibError

from .helpers import toy_func


def test_a_func_is_required() -> None:
    with pytest.raises(TypeError, match=r"tune: expected a Func.*got str"):
        S.tune("matmul", "h100", trials=1, storage="memory", quiet=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"apply_best: expected a Func.*got str"):
        S.apply_best("matmul", "h100", "memory")  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"trials": True}, {"trials": 2.0}, {"timeout_per_trial": -1},
                                    {"timeout_per_trial": 0}, {"timeout_per_trial": float("nan")},
                                    {"timeout_per_trial": "5"}])
def test_bad_counts_and_timeouts_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        S.tune(toy_func(), "h100", storage="memory", quiet=True, **{"trials": 1, **kwargs})


def test_apply_best_names_a_rule_that_does_not_apply(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    S.tune(toy_func(), "h100", trials=2, strategy="random", storage=db, quiet=True, warm_start=False)
    with pytest.raises(SchedlibError, match="rule reduction does not apply to matmul"):
        S.apply_best(toy_func(), "h100", db, rule="reduction")


def test_apply_best_never_creates_a_storage(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    for storage in (f"sqlite:///{typo}", typo, tmp_path / "typo.journal"):
        with pytest.raises(S.NoRecordError, match="does not exist"):
            S.apply_best(toy_func(), "h100", storage)
    assert list(tmp_path.iterdir()) == []
