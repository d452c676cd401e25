"""``tune`` and ``apply_best`` refuse bad arguments up front, with the error ``tune`` has always raised."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import schedlib as sl
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
    ((k, v),) = kwargs.items()
    expected = "an int >= 1" if k == "trials" else "a finite number of seconds > 0"
    with pytest.raises(ValueError, match=re.escape(f"tune: {k}={v!r}; expected {expected}")):
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


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"topk": -1}, "topk=-1"), ({"topk": 1.5}, "topk=1.5"), ({"topk": True}, "topk=True"),
    ({"screen": -1}, "screen=-1"), ({"screen": "x"}, "screen='x'"), ({"seed": "x"}, "seed='x'"),
    ({"stop_below_us": -1.0}, "stop_below_us=-1.0"), ({"stop_below_us": float("nan")}, "stop_below_us=nan"),
])
def test_counts_and_thresholds_are_checked(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        S.tune(sl.workloads.matmul(64, 64, 64), "h100", trials=1, storage="memory", quiet=True, **kwargs)


def test_cost_model_evaluation_refuses_what_it_cannot_rank() -> None:
    res = S.tune(sl.workloads.matmul(64, 64, 64), "h100", trials=12, strategy="random", storage="memory",
                 quiet=True)
    with pytest.raises(ValueError, match="every record has the same time"):
        res.cost_model.evaluate(res.records.assign(time_us=1.0))
    with pytest.raises(ValueError, match="missing \\['config'\\]"):
        res.cost_model.evaluate(res.records.drop(columns=["config"]))
    other = S.tune(sl.workloads.softmax(8, 64), "h100", trials=4, strategy="random", storage="memory", quiet=True)
    with pytest.raises(ValueError, match="not a point of this model's matmul space"):
        res.cost_model.evaluate(other.records)


def test_numpy_integer_counts_are_the_ints_they_hold() -> None:
    """A count taken from a DataFrame is a numpy integer: tune, carve and compare take it."""
    import numpy as np

    func = sl.workloads.matmul(64, 64, 64)
    assert S.tune(func, "h100", trials=np.int64(3), storage="memory", quiet=True).measured_now == 3
    assert len(sl.carver.carve(func, "h100", np.int32(2))) == 2
    df = sl.report.compare("matmul:M=64,N=64,K=64", "h100", methods=("carver",), topk=np.int64(2),
                           backend="estimate")
    assert df["method"].tolist() == ["carver", "carver_best_of_k"]


def test_numpy_times_are_the_floats_they_hold() -> None:
    """A time taken from a record or a DataFrame is a numpy float (or integer): tune takes it as a time limit
    or a target, and a numpy NaN is still refused."""
    import numpy as np

    func = sl.workloads.matmul(64, 64, 64)
    res = S.tune(func, "h100", trials=3, storage="memory", quiet=True, timeout_per_trial=np.float32(30.0),
                 stop_below_us=np.float64(1e-3))
    assert res.measured_now == 3
    again = S.tune(func, "h100", trials=2, storage="memory", quiet=True, timeout_per_trial=np.int64(30))
    assert again.measured_now == 2
    with pytest.raises(ValueError, match=r"timeout_per_trial=(np\.float32\()?nan"):
        S.tune(func, "h100", trials=1, storage="memory", quiet=True, timeout_per_trial=np.float32("nan"))
    with pytest.raises(ValueError, match=r"timeout_per_trial=(np\.)?True"):
        S.tune(func, "h100", trials=1, storage="memory", quiet=True, timeout_per_trial=np.bool_(True))
