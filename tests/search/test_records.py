"""Statuses, tables, the knob codec and the replay recordings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedlib.search as S
from schedlib.errors import SchedlibError
from schedlib.hw import resolve
from schedlib.rules import find_rule
from schedlib.search.records import history_series, records_frame

from .helpers import ToyRule, toy_func, toy_table


def test_measurement_statuses() -> None:
    m = S.Measurement.from_times([3.0, 1.0, 2.0, 4.0, 5.0])
    assert m.ok and m.time_us == 3.0 and m.p20_us == pytest.approx(1.8) and m.p80_us == pytest.approx(4.2)
    fail = S.Measurement.failure("crash", "WorkerCrash", "worker died from signal SIGSEGV")
    assert not fail.ok and math.isinf(fail.time_us) and fail.user_attrs()["time_us"] is None
    with pytest.raises(ValueError, match="unknown failure status 'oops'"):
        S.Measurement.failure("oops", None, "")
    with pytest.raises(ValueError, match="finite positive"):
        S.Measurement("ok", math.inf)
    with pytest.raises(ValueError, match="finite and positive"):
        S.Measurement.from_times([1.0, math.nan])


def test_config_key_is_canonical() -> None:
    assert S.config_key({"b": 2, "a": 1}) == S.config_key({"a": 1, "b": 2}) == '{"a":1,"b":2}'
    assert S.config_key({"a": True}) != S.config_key({"a": 1})


class _T:  # the bits of an Optuna FrozenTrial that records_frame reads
    def __init__(self, number: int, **attrs: object) -> None:
        self.number, self.user_attrs = number, {"sl": attrs}


def test_records_keep_one_row_per_config_and_number_only_budget_rows() -> None:
    def t(n: int, a: int, status: str, time: float | None = None) -> _T:
        return _T(n, config={"a": a}, config_key=S.config_key({"a": a}), status=status, time_us=time)

    trials = [t(0, 1, "ok", 5.0), t(1, 2, "illegal"), t(2, 1, "cached", 5.0), t(3, 3, "crash"),
              t(4, 4, "interrupted"), t(5, 4, "ok", 2.0), _T(6)]
    frame = records_frame(trials, ["a"])
    assert list(frame["a"]) == [1, 2, 3, 4]
    assert list(frame["status"]) == ["ok", "illegal", "crash", "ok"]
    assert frame["trial"].tolist()[0] == 1 and frame["trial"].isna()[1] and frame["trial"].tolist()[2:] == [2, 3]
    hist = history_series(frame)
    assert hist.to_dict() == {1: 5.0, 2: 5.0, 3: 2.0}
    assert S.trials_to_reach(hist, 4.0) == 3 and S.trials_to_reach(hist, 1.0) is None


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_codec_round_trips_every_legal_config(data: st.DataObject) -> None:
    func, profile = toy_func(256), resolve("h100")
    space = find_rule(func, profile).space(func, profile)
    codec = S.SpaceCodec(space)
    config = data.draw(st.sampled_from(codec.legal()))
    params = codec.encode(config)
    assert set(params) == {k.name for k in space.knobs if len(k.values) > 1}
    assert codec.decode(params) == config
    for nb in codec.neighbours(config):
        assert sum(nb[k] != config[k] for k in config) == 1


def test_codec_errors_name_the_knob() -> None:
    codec = S.SpaceCodec(ToyRule().space(toy_func(), "h100"))
    with pytest.raises(ValueError, match="knob a=7 is not one of"):
        codec.encode({"a": 7, "b": 0, "c": 1, "fixed": True})
    with pytest.raises(KeyError, match="lack knob 'b'"):
        codec.decode({"a": 0, "c": 0})
    assert "fixed" not in codec.distributions and codec.decode({"a": 0, "b": 0, "c": 0})["fixed"] is True


def test_replay_reads_json_and_csv(tmp_path: Path) -> None:
    func = toy_func()
    table = toy_table()
    fastest = min(table, key=lambda r: r["time_us"])
    assert [r["time_us"] for r in table].count(fastest["time_us"]) == 1  # one optimum: (a=2, b=3, c=2)
    path = S.write_recording(tmp_path / "toy.json", table, func=func, device="h100", origin="toy")
    back = S.ReplayBackend(path)
    assert back.meta["origin"] == "toy" and back.meta["device"] == "h100"
    frame = pd.DataFrame([{**r["config"], "time_us": r["time_us"]} for r in table])
    frame.to_csv(tmp_path / "toy.csv", index=False)
    csv = S.ReplayBackend(tmp_path / "toy.csv")
    for replay in (back, csv):  # every row comes back with its config, time and status
        assert len(replay.table) == len(table)
        for r in table:
            got = replay.table[S.config_key(r["config"])]
            assert (got["config"], got["time_us"], got["status"]) == (r["config"], r["time_us"], "ok"), got
        assert replay.best == (fastest["config"], fastest["time_us"])
    assert csv.key == back.key
    m = csv.measure({"a": 9, "b": 9, "c": 9, "fixed": True}, None)
    assert m.status == "not_recorded"


def test_replay_refuses_another_workload_and_bad_files(tmp_path: Path) -> None:
    path = S.write_recording(tmp_path / "toy.json", toy_table(), func=toy_func(64))
    with pytest.raises(SchedlibError, match=r"was made for func matmul\(A: float32\[64, 64\]"):
        S.tune(toy_func(128), "h100", trials=2, storage="memory", backend=S.ReplayBackend(path), rule=ToyRule(),
               quiet=True)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SchedlibError, match="not valid JSON"):
        S.ReplayBackend(tmp_path / "bad.json")
    (tmp_path / "nocfg.json").write_text(json.dumps([{"time_us": 1.0}]))
    with pytest.raises(SchedlibError, match="record 0 has no 'config'"):
        S.ReplayBackend(tmp_path / "nocfg.json")
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        S.make_backend("tpu", 1.0)


def test_replay_by_name_with_a_file(tmp_path: Path) -> None:
    path = S.write_recording(tmp_path / "toy.json", toy_table(), func=toy_func())
    by_spec = S.tune(toy_func(), "h100", trials=5, storage="memory", backend=f"replay:{path}", rule=ToyRule(),
                     quiet=True, strategy="grid")
    by_kw = S.tune(toy_func(), "h100", trials=5, storage="memory", backend="replay", replay=path, rule=ToyRule(),
                   quiet=True, strategy="grid")
    assert by_spec.records["time_us"].tolist() == by_kw.records["time_us"].tolist()
    assert by_spec.key.backend == by_kw.key.backend == S.ReplayBackend(path).key
    with pytest.raises(ValueError, match="needs a recording"):
        S.tune(toy_func(), "h100", trials=2, storage="memory", backend="replay", rule=ToyRule(), quiet=True)


def test_replay_refuses_another_device(tmp_path: Path) -> None:
    """Times measured on one card are not another's: a recording says where it was measured."""
    path = S.write_recording(tmp_path / "toy.json", toy_table(), func=toy_func(), device="h100")
    with pytest.raises(SchedlibError, match=r"was measured on h100, not on a100; tune with --target h100"):
        S.tune(toy_func(), "a100", trials=2, storage="memory", backend=S.ReplayBackend(path), rule=ToyRule(),
               quiet=True)
    done = S.tune(toy_func(), "h100", trials=2, storage="memory", backend=S.ReplayBackend(path), rule=ToyRule(),
                  quiet=True)
    assert done.measured_now == 2


def test_the_records_frame_tune_returns_can_be_saved_as_a_recording(tmp_path: Path) -> None:
    func = toy_func()
    first = S.tune(func, "h100", trials=4, storage="memory", backend=S.ReplayBackend(toy_table()), rule=ToyRule(),
                   quiet=True)
    path = S.write_recording(tmp_path / "again.json", first.records, func=func, device="h100")
    again = S.tune(func, "h100", trials=4, storage="memory", backend=S.ReplayBackend(path), rule=ToyRule(),
                   quiet=True)
    assert (again.best_config, again.best_time_us) == (first.best_config, first.best_time_us)
