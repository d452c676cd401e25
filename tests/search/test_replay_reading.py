"""Replay recordings written by other tools: values are typed per record, and bad files are named."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import schedlib.search as S
from schedlib.errors import SchedlibError
from schedlib.rules.base import Config, Knob, Space

from .helpers import ToyRule, toy_func, toy_table


def _tune(path: Path) -> S.TuneResult:
    return S.tune(toy_func(), "h100", trials=45, strategy="grid", storage="memory", backend="replay",
                  replay=path, rule=ToyRule(), quiet=True, warm_start=False)


def test_a_gap_in_a_csv_column_does_not_turn_knobs_into_floats(tmp_path: Path) -> None:
    table = toy_table()
    rows = [{**r["config"], "time_us": r["time_us"]} for r in table] + [{"time_us": 1.0}]
    pd.DataFrame(rows).to_csv(tmp_path / "gap.csv", index=False)  # the gap makes pandas write 2.0, 3.0, ...
    assert "2.0" in (tmp_path / "gap.csv").read_text()
    res = _tune(tmp_path / "gap.csv")
    assert (res.records["status"] == "ok").all()
    assert res.best_time_us == min(r["time_us"] for r in table)


def test_csv_text_values_are_typed_per_record(tmp_path: Path) -> None:
    path = tmp_path / "text.csv"
    path.write_text("a,b,c,fixed,time_us\n 2 ,3,2.0,true,7.5\n\n0,0,1,True,9\n")
    rec = S.ReplayBackend(path)
    assert rec.best == ({"a": 2, "b": 3, "c": 2, "fixed": True}, 7.5)
    assert rec.measure({"a": 0, "b": 0, "c": 1, "fixed": True}, None).time_us == 9


@pytest.mark.parametrize(("name", "content", "message"), [
    ("empty.csv", b"", "is empty"),
    ("header.csv", b"a,b,c,fixed,time_us\n", "holds no records"),
    ("word.csv", b"a,b,c,fixed,time_us\n0,0,1,True,9\n1,0,1,True,fast\n", r"record 1 .*time_us='fast'"),
    ("hole.csv", b"a,b,c,fixed,time_us\n0,,1,True,9\n", r"record 0 has no value for knob\(s\) \['b'\]"),
    ("word.json", b'[{"config": {"a": 0}, "time_us": "fast"}]', r"record 0 .*time_us='fast' is not a number"),
    ("latin1.json", b'[{"config": {"a": "\xe9"}, "time_us": 1}]', "cannot be read as UTF-8"),
    ("binary.json", b"\xff\xfe\x00\x01", "cannot be read as UTF-8"),
])
def test_bad_recordings_name_the_file_and_record(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(SchedlibError, match=message) as info:
        S.read_recording(path)
    assert str(path) in str(info.value)


def test_integral_json_floats_match_int_knobs(tmp_path: Path) -> None:
    path = tmp_path / "floats.json"
    path.write_text('[{"config": {"a": 2.0, "b": 3.0, "c": 2.0, "fixed": true}, "time_us": 4}]')
    rec = S.ReplayBackend(path)
    rec.open(toy_func(), "h100", ToyRule())
    m = rec.measure({"a": 2, "b": 3, "c": 2, "fixed": True}, None)
    assert m.ok and m.time_us == 4 and not math.isinf(m.time_us)


CSV_HEADER = "a,b,c,fixed,time_us,status\n"


def test_a_config_recorded_with_two_outcomes_is_refused_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "conflict.csv"
    path.write_text(CSV_HEADER + "0,0,1,True,9,ok\n2,3,2,true,1.0,\n2,3,2,True,2.0,ok\n")
    with pytest.raises(SchedlibError, match=r"records 1 and 2 are the same config .*\"a\":2.*\(ok, 1 us vs ok, 2 us\)"
                       ) as info:
        S.ReplayBackend(path)
    assert str(path) in str(info.value)
    path.write_text(CSV_HEADER + "2,3,2,True,,timeout\n2,3,2,True,,crash\n")
    with pytest.raises(SchedlibError, match=r"records 0 and 1 .*\(timeout vs crash\)"):
        S.read_recording(path)


def test_a_config_recorded_twice_with_one_outcome_counts_once(tmp_path: Path) -> None:
    path = tmp_path / "twice.csv"
    path.write_text(CSV_HEADER + "2,3,2,True,7.5,ok\n0,0,1,True,9,\n2,3,2,true,7.50,\n")
    assert len(S.read_recording(path)["records"]) == 2
    assert S.ReplayBackend(path).best == ({"a": 2, "b": 3, "c": 2, "fixed": True}, 7.5)


def test_an_unknown_status_is_refused_naming_the_allowed_ones(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text('[{"config": {"a": 0}, "time_us": 1}, {"config": {"a": 1}, "time_us": 1, "status": "weird"}]')
    with pytest.raises(SchedlibError, match=r"record 1: status='weird' is not a known status; expected one of "
                                            r"\[.*'compile_error'.*'ok'.*\]") as info:
        S.read_recording(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match="status='weird'"):  # nor is such a file written
        S.write_recording(tmp_path / "out.json", [{"config": {"a": 0}, "time_us": 1, "status": "weird"}])


class PairRule(ToyRule):
    """A knob whose values are tuples: a recording may spell one as a list or as its text."""

    def space(self, func: Any, target: Any) -> Space:
        return Space("pair", (Knob("pair", ((1, 2), (2, 1))),), lambda c: None)

    def default_config(self, func: Any, target: Any) -> Config:
        return {"pair": (1, 2)}


def test_two_spellings_of_one_config_with_two_outcomes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "spellings.json"
    path.write_text('[{"config": {"pair": [1, 2]}, "time_us": 3}, {"config": {"pair": "(1, 2)"}, "time_us": 4}]')
    rec = S.ReplayBackend(path)  # as read, two configs: only the space says they are one
    with pytest.raises(SchedlibError, match=rf"{re.escape(str(path))}: the records of .* are the same config "
                                            r"\{\"pair\":\[1,2\]\} .*\(ok, 3 us vs ok, 4 us\)"):
        rec.open(toy_func(), "h100", PairRule())
