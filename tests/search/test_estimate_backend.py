"""The estimate backend and the carver warm start."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import schedlib as sl
import schedlib.search as S
from schedlib.carver import carve, estimate


def test_estimate_backend_measures_the_carver_estimate() -> None:
    func = sl.workloads.matmul(1024, 1024, 1024)
    res = S.tune(func, "h100", trials=12, strategy="evolutionary", storage="memory", quiet=True, seed=0)
    assert res.key.backend == S.database.estimate_key(sl.hw.resolve("h100"))
    assert res.key.backend.startswith("estimate-") and res.key.backend_kind() == "estimate"
    ok = res.records[res.records["status"] == "ok"]
    assert len(ok) == 12
    for _, row in ok.head(4).iterrows():
        assert row["time_us"] == pytest.approx(estimate(func, "h100", row["config"])["est_time_us"])


def test_warm_start_enqueues_the_default_and_the_carver_top_k() -> None:
    func = sl.workloads.matmul(2048, 2048, 512)
    res = S.tune(func, "h100", trials=6, strategy="random", storage="memory", quiet=True, topk=5)
    sources = list(res.records["source"])
    assert sources[0] == "default" and sources[1:6].count("carver") >= 4, sources
    top = carve(func, "h100", topk=5)
    best_carved = float(top["est_time_us"].min())
    assert res.best_time_us == pytest.approx(best_carved), "the carver's best must be among the warm-start trials"


def test_without_warm_start_nothing_is_enqueued() -> None:
    func = sl.workloads.matmul(512, 512, 512)
    res = S.tune(func, "h100", trials=5, strategy="random", storage="memory", quiet=True, warm_start=False)
    assert set(res.records["source"]) == {"random"}


def test_estimates_from_other_profile_numbers_are_not_reused(tmp_path: Path) -> None:
    """An edited copy of a profile under the same key feeds the model other numbers: its estimates are
    another study, and apply_best does not hand out the estimates made from the old numbers."""
    func, db = sl.workloads.matmul(128, 128, 128), tmp_path / "db.sqlite3"
    h100 = sl.hw.resolve("h100")
    small = dataclasses.replace(h100, sm_count=16)
    first = S.tune(func, h100, trials=4, strategy="random", storage=db, quiet=True, warm_start=False)
    second = S.tune(func, small, trials=4, strategy="random", storage=db, quiet=True, warm_start=False)
    assert second.measured_now == 4 and second.key.backend != first.key.backend
    again = S.tune(func, dataclasses.replace(h100, source=("elsewhere https://example.com",)), trials=4,
                   storage=db, quiet=True, warm_start=False)
    assert again.measured_now == 0, "provenance is not an input of the model"
    assert S.apply_best(func, small, db, backend="estimate").config == second.best_config
    with pytest.raises(S.NoRecordError, match="other profile numbers"):
        S.apply_best(func, dataclasses.replace(h100, sm_count=8), db)
