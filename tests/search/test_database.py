"""The tuning database: keys, storages, resuming without re-measuring, and apply_best's refusals."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest

import schedlib
import schedlib.search as S
from schedlib.cache import cache_dir
from schedlib.search.records import COUNTED

from .helpers import CountingReplay, matmul_table


def test_key_round_trips_through_the_study_name() -> None:
    func, _ = matmul_table(256, 256, 256)
    key = S.TuningKey.for_workload(func, "h100", "matmul", "replay-abc", "0123456789ab")
    assert S.TuningKey.parse(key.study_name) == key
    assert key.version == schedlib.__version__ and key.schema == S.SCHEMA_VERSION
    assert key.workload == S.workload_hash(func) != S.workload_hash(matmul_table(256, 256, 512)[0])
    assert S.TuningKey.parse("some other study") is None


def test_default_storage_is_sqlite_in_the_cache_and_resume_never_remeasures(private_cache: Path) -> None:
    func, table = matmul_table(512, 512, 512)
    first = CountingReplay(table)
    res1 = S.tune(func, "h100", trials=12, strategy="random", backend=first, quiet=True, seed=1)
    assert (cache_dir("tuning") / "tuning.sqlite3").is_file()
    assert len(first.measured) == 12 and res1.measured_now == 12
    second = CountingReplay(table)
    res2 = S.tune(func, "h100", trials=25, strategy="random", backend=second, quiet=True, seed=1)
    assert len(second.measured) == 13 and res2.measured_now == 13
    before = {S.config_key(c) for c in first.measured}
    assert not before & {S.config_key(c) for c in second.measured}, "a recorded config was measured again"
    counted = res2.records[res2.records["status"].isin(COUNTED)]
    assert len(counted) == 25 and counted["config_key"].is_unique
    first_rows = res1.records.set_index("config_key")["time_us"]
    assert counted.set_index("config_key")["time_us"].loc[first_rows.index].equals(first_rows)
    third = CountingReplay(table)
    res3 = S.tune(func, "h100", trials=25, strategy="random", backend=third, quiet=True)
    assert third.measured == [] and res3.best_config == res2.best_config  # complete: nothing to do


@pytest.mark.parametrize("kind", ["sqlite-path", "sqlite-url", "journal"])
def test_storages_by_path_or_url(tmp_path: Path, kind: str) -> None:
    storage = {"sqlite-path": str(tmp_path / "t.db"), "sqlite-url": f"sqlite:///{tmp_path / 'u.db'}",
               "journal": str(tmp_path / "t.log")}[kind]
    func, table = matmul_table(256, 256, 256)
    res = S.tune(func, "h100", trials=6, strategy="tpe", storage=storage, backend=S.ReplayBackend(table),
                 quiet=True)
    names = optuna.get_all_study_names(S.database.resolve_storage(storage)[0])
    assert names == [res.key.study_name]
    sch = S.apply_best(func, "h100", storage)
    assert sch.config == res.best_config and sch.rule == "matmul"


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://", "sqlite:///:memory:"])
def test_in_memory_sqlite_urls_tune_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.chdir(tmp_path)  # where a lock file named after ":memory:" would appear
    func, table = matmul_table(256, 256, 256)
    res = S.tune(func, "h100", trials=3, strategy="random", storage=url, backend=S.ReplayBackend(table), quiet=True)
    assert res.measured_now == 3
    store, lock = S.database.resolve_storage(url)
    assert lock is None and optuna.get_all_study_names(store) == []  # each open is a new, empty database
    first = CountingReplay(table)
    S.tune(func, "h100", trials=3, strategy="random", storage=store, backend=first, quiet=True)
    again = CountingReplay(table)
    S.tune(func, "h100", trials=5, strategy="random", storage=store, backend=again, quiet=True)
    assert len(first.measured) == 3 and len(again.measured) == 2, "the database kept the first records"
    assert list(tmp_path.iterdir()) == []


def test_apply_best_returns_the_recorded_best_and_refuses_other_shapes(tmp_path: Path) -> None:
    storage = tmp_path / "db.log"
    func, table = matmul_table(512, 512, 512)
    backend = S.ReplayBackend(table)
    res = S.tune(func, "h100", trials=20, strategy="evolutionary", storage=storage, backend=backend, quiet=True)
    best_row = res.records.loc[res.records["time_us"].idxmin()]
    assert res.best_config == best_row["config"] and res.best_time_us == best_row["time_us"]
    sch = S.apply_best(func, "h100", storage)
    assert isinstance(sch, schedlib.Schedule) and sch.config == res.best_config
    assert sch.trace == res.best_schedule.trace
    other, _ = matmul_table(512, 512, 1024)
    with pytest.raises(S.NoRecordError, match=r"no tuning record for func matmul\(A: float32\[512, 1024\]") as info:
        S.apply_best(other, "h100", storage)
    assert "float32[512, 512]" in str(info.value), "the error should list what is recorded"
    with pytest.raises(S.NoRecordError, match="on a100") as info:
        S.apply_best(func, "a100", storage)
    assert "a record for another shape, target or schedlib version is never reused" in str(info.value)
    assert "for this shape and target" in str(info.value)
    with pytest.raises(S.NoRecordError, match="from backend gpu"):
        S.apply_best(func, "h100", storage, backend="gpu")
    with pytest.raises(S.NoRecordError, match="does not exist"):
        S.apply_best(func, "h100", tmp_path / "missing.db")


def test_apply_best_refuses_records_of_another_schedlib_version(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    storage = tmp_path / "db.sqlite3"
    func, table = matmul_table(256, 256, 256)
    S.tune(func, "h100", trials=4, strategy="random", storage=storage, backend=S.ReplayBackend(table), quiet=True)
    recorded = schedlib.__version__
    monkeypatch.setattr(schedlib, "__version__", "99.0.0")
    with pytest.raises(S.NoRecordError, match=rf"schedlib 99\.0\.0.*schedlib {re.escape(recorded)}"):
        S.apply_best(func, "h100", storage)


def test_apply_best_prefers_gpu_records_over_estimates(tmp_path: Path) -> None:
    storage = tmp_path / "db.log"
    func, table = matmul_table(256, 256, 256)
    slow = [{"config": r["config"], "time_us": r["time_us"] * (3 if i else 1)} for i, r in enumerate(table)]
    gpu_like = S.ReplayBackend(table)
    gpu_like._key = "gpu"  # pretend these are GPU measurements
    a = S.tune(func, "h100", trials=8, strategy="random", storage=storage, backend=gpu_like, quiet=True, seed=1)
    S.tune(func, "h100", trials=8, strategy="random", storage=storage, backend=S.ReplayBackend(slow), quiet=True,
           seed=2, warm_start=False)
    assert S.apply_best(func, "h100", storage).config == a.best_config


def test_a_study_refuses_a_func_with_the_same_hash_but_other_text(tmp_path: Path) -> None:
    func, table = matmul_table(256, 256, 256)
    res = S.tune(func, "h100", trials=2, strategy="random", storage=tmp_path / "x.log",
                 backend=S.ReplayBackend(table), quiet=True)
    res.study.set_user_attr("func_text", "something else")
    with pytest.raises(schedlib.SchedlibError, match="different func with the same hash") as tuned:
        S.tune(func, "h100", trials=3, strategy="random", storage=tmp_path / "x.log",
               backend=S.ReplayBackend(table), quiet=True)
    with pytest.raises(S.NoRecordError) as applied:  # the same reason, not "none succeeded that it can build"
        S.apply_best(func, "h100", tmp_path / "x.log")
    assert str(applied.value) == f"apply_best: {tuned.value}"


def test_records_of_another_knob_space_are_neither_resumed_nor_applied(tmp_path: Path) -> None:
    """A template that gained a knob is another template: its old configs lack the knob and cannot be built
    (an upgraded matmul rule once crashed `schedlib demo` on a stale record in the default storage)."""
    from schedlib.rules.base import Knob, Space

    from .helpers import ToyRule, toy_func, toy_table

    class ToyRuleWithUnroll(ToyRule):
        def space(self, func, target):
            old = super().space(func, target)
            return Space(old.rule, (*old.knobs, Knob("unroll", (1, 2))), old.check)

        def default_config(self, func, target):
            return {**super().default_config(func, target), "unroll": 1}

    storage, func = str(tmp_path / "t.sqlite3"), toy_func()
    old = S.tune(func, "h100", trials=6, strategy="random", storage=storage, rule=ToyRule(),
                 backend=S.ReplayBackend(toy_table()), quiet=True)
    new_rule = ToyRuleWithUnroll()
    assert old.key.space != S.database.space_digest(new_rule.space(func, schedlib.hw.load("h100")))
    with pytest.raises(S.NoRecordError, match="another knob space"):
        S.apply_best(func, "h100", storage, rule=new_rule)
    table = [{"config": {**r["config"], "unroll": u}, "time_us": r["time_us"] * u} for r in toy_table() for u in (1, 2)]
    backend = CountingReplay(table)
    res = S.tune(func, "h100", trials=4, strategy="random", storage=storage, rule=new_rule, backend=backend,
                 quiet=True)
    assert res.key != old.key and res.measured_now == 4, "the new space starts its own study"
    assert all("unroll" in c for c in backend.measured)
    assert S.apply_best(func, "h100", storage, rule=new_rule).config["unroll"] in (1, 2)
    assert S.apply_best(func, "h100", storage, rule=ToyRule()).config == old.best_config


class PipedKey(CountingReplay):
    """A user backend whose key holds the study name's separator."""

    @property
    def key(self) -> str:
        return "cuda|v2"


def test_a_backend_key_with_a_bar_is_found_by_apply_best(tmp_path: Path) -> None:
    func, table = matmul_table(256, 256, 256)
    db = tmp_path / "bar.sqlite3"
    res = S.tune(func, "h100", trials=4, strategy="random", storage=db, backend=PipedKey(table), quiet=True,
                 topk=0, features="knobs")
    assert S.TuningKey.parse(res.key.study_name) == res.key
    best = S.apply_best(func, "h100", db, backend="cuda|v2")
    assert best is not None and S.apply_best(func, "h100", db) is not None
