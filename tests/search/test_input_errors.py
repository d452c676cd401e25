"""Errors that name what is wrong: a replay recording nested too deeply, a bad percentile field, a directory given
as a recording, and configs the cost model cannot read; and no cost model before it has enough records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import schedlib.search as S
from schedlib.errors import SchedlibError
from schedlib.rules.base import Config, Knob, Space
from schedlib.search.tune import MODEL_MIN_TRAIN

from .helpers import ToyRule, toy_func, toy_table


def _tune(trials: int, **kwargs: object) -> S.TuneResult:
    return S.tune(toy_func(), "h100", trials=trials, strategy="random", storage="memory", rule=ToyRule(),
                  quiet=True, warm_start=False, features="knobs", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '[{"config": {"a": ' + "[" * 5000 + "]" * 5000 + '}, "time_us": 1}]'],
                         ids=["brackets", "deep-knob-value"])
def test_a_recording_nested_too_deeply_is_a_schedlib_error_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(SchedlibError, match=rf"replay recording {path} .*nested too deeply") as info:
        S.read_recording(path)
    assert "\n" not in str(info.value)
    with pytest.raises(SchedlibError, match=str(path)):
        _tune(2, backend="replay", replay=path)


@pytest.mark.parametrize(("record", "needle"), [
    ('{"time_us": 3, "p20_us": "x"}', "p20_us='x' is not a number"),
    ('{"time_us": 3, "p80_us": [1]}', r"p80_us=\[1\] is not a number"),
    ('{"time": "slow"}', "time='slow' is not a number"),
    ('{"time_us": "slow", "p20_us": 1}', "time_us='slow' is not a number"),
])
def test_a_bad_number_field_is_named(tmp_path: Path, record: str, needle: str) -> None:
    path = tmp_path / "rec.json"
    path.write_text('[{"config": {"a": 1}, ' + record[1:] + "]")
    with pytest.raises(SchedlibError, match=rf"{path}: record 0 .*{needle}"):
        S.read_recording(path)


def test_a_directory_is_not_reported_missing(tmp_path: Path) -> None:
    with pytest.raises(SchedlibError, match=rf"replay recording {tmp_path} is a directory") as info:
        S.read_recording(tmp_path)
    assert "does not exist" not in str(info.value)
    with pytest.raises(SchedlibError, match="does not exist"):
        S.read_recording(tmp_path / "missing.json")


def test_no_cost_model_before_it_has_min_train_records() -> None:
    backend = S.ReplayBackend(toy_table())
    assert _tune(MODEL_MIN_TRAIN - 1, backend=backend).cost_model is None
    res = _tune(MODEL_MIN_TRAIN, backend=S.ReplayBackend(toy_table()))
    assert res.cost_model is not None and res.cost_model.n_train == MODEL_MIN_TRAIN


def test_predict_names_what_a_config_lacks() -> None:
    model = _tune(12, backend=S.ReplayBackend(toy_table())).cost_model
    assert model is not None
    with pytest.raises(ValueError, match=r"config 0 \{'foo': 1\} lacks knob\(s\) \['a', 'b', 'c', 'fixed'\] of "
                                         r"this model's toy space \(it has unknown knob\(s\) \['foo'\]\)"):
        model.predict([{"foo": 1}])
    good = {"a": 0, "b": 0, "c": 1, "fixed": True}
    with pytest.raises(ValueError, match=r"config 1 .* lacks knob\(s\) \['c'\]"):
        model.predict([good, {"a": 0, "b": 0, "fixed": True}])
    with pytest.raises(ValueError, match="config 0 is a str, not a mapping"):
        model.predict(["a=1"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"knob a='x' is not one of \[0, 1, 2, 3\]"):
        model.predict([{**good, "a": "x"}])
    illegal = {"a": 3, "b": 3, "c": 1, "fixed": True}  # a + b > 5: not a point, still a candidate to rank
    assert len(model.predict([good, illegal])) == 2


class NumpyKnobs(ToyRule):
    """A user rule whose knob values were built with numpy (np.arange, an array of floats)."""

    name = "numpy-knobs"

    def space(self, func: Any, target: Any) -> Space:
        import numpy as np

        return Space(self.name, (Knob("a", tuple(np.arange(1, 5))), Knob("b", tuple(np.array([0.5, 1.0, 2.0])))))

    def default_config(self, func: Any, target: Any) -> Config:
        return {"a": 1, "b": 0.5}


class ByKnobs(S.Backend):
    name = "by-knobs"

    def measure(self, config: Config, schedule: Any) -> S.Measurement:
        return S.Measurement("ok", 1.0 + config["a"] * config["b"])


@pytest.mark.parametrize("storage", ["memory", "db.journal"])
def test_a_rule_with_numpy_knob_values_is_tuned_and_applied(tmp_path: Path, storage: str) -> None:
    where = storage if storage == "memory" else tmp_path / storage
    res = S.tune(toy_func(), "h100", trials=5, strategy="grid", storage=where, backend=ByKnobs(), rule=NumpyKnobs(),
                 quiet=True, topk=0, features="knobs")
    assert len(res.records) == 5 and (res.records["status"] == "ok").all(), res.records["status"].tolist()
    assert res.best_config == {"a": 1, "b": 0.5} and type(res.best_config["a"]) is int
    if storage != "memory":
        assert S.apply_best(toy_func(), "h100", where, rule=NumpyKnobs()) is not None


class ClashingKnob(ToyRule):
    """A user rule with a knob named like a column of the records table."""

    name = "clashing"

    def __init__(self, knob: str) -> None:
        self.knob = knob

    def space(self, func: Any, target: Any) -> Space:
        return Space(self.name, (Knob(self.knob, (1, 2, 4)), Knob("b", (1, 2))))

    def default_config(self, func: Any, target: Any) -> Config:
        return {self.knob: 1, "b": 1}


@pytest.mark.parametrize("knob", ["status", "trial", "source", "config"])
def test_a_knob_named_like_a_records_column_is_refused_by_name(knob: str) -> None:
    with pytest.raises(ValueError, match=f"knob\\(s\\) \\['{knob}'\\] named like columns of the records table"):
        S.tune(toy_func(), "h100", trials=3, strategy="random", storage="memory", backend=ByKnobs(),
               rule=ClashingKnob(knob), quiet=True, topk=0, features="knobs")
