"""Trace: JSON round trip, replay, digest, and every way a tampered trace is refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import schedlib as sl
from schedlib.ir.schedule import TRACE_VERSION, Trace

from .helpers import assert_same_result
from .test_primitives_placement import gemm_schedule


def _scheduled() -> sl.Schedule:
    s = gemm_schedule(sl.workloads.matmul(9, 7, 5, epilogue="bias"), tile=4, ktile=2)
    s.reverse_compute_inline("D")
    s.storage_align("A_shared", 0, 32, 1)
    s.annotate(s.get_loops("C")[2], "pipeline_stages", 2)
    s.unroll(s.get_loops("C")[-1])
    return s


def test_round_trip_gives_an_identical_func_and_digest() -> None:
    s = _scheduled()
    text = s.trace.to_json()
    replay = sl.Schedule.from_trace(s.original, text)
    assert replay.func == s.func
    assert str(replay.func) == str(s.func)
    assert replay.trace == s.trace
    assert replay.trace.digest() == s.trace.digest()
    assert hash(replay.trace) == hash(s.trace)
    assert replay.trace.to_json() == text
    assert_same_result(s.original, replay)


def test_round_trip_of_every_primitive_kind() -> None:
    s = sl.Schedule(sl.workloads.reduce(5, 33, "sum"))
    i, r = s.get_loops("R")
    ro, ri = s.split(r, [None, 8])
    rf = s.rfactor(ri, 1)
    s.decompose_reduction(rf, ro)
    s.bind(i, "blockIdx.x")
    s.fuse(*s.get_loops("R"))
    s.cache_write("R", "local")
    s.unroll(s.get_loops("R_local")[-1])
    text = s.trace.to_json(indent=2)
    assert json.loads(text)["version"] == TRACE_VERSION
    replay = sl.Schedule.from_trace(s.original, Trace.from_json(text))
    assert replay.func == s.func and replay.trace.digest() == s.trace.digest()
    assert [step["primitive"] for step in json.loads(text)["steps"]] == [
        "split", "rfactor", "decompose_reduction", "bind", "fuse", "cache_write", "unroll"]


def test_digest_depends_on_the_steps_only() -> None:
    a, b = _scheduled(), _scheduled()
    assert a.trace.digest() == b.trace.digest() and a.trace == b.trace
    b.unroll(b.get_loops("C_local")[-1])
    assert a.trace.digest() != b.trace.digest() and a.trace != b.trace
    assert len(b.trace) == len(a.trace) + 1


def test_equal_traces_hash_alike_and_true_is_not_one() -> None:
    """Regression: ``==`` compared Python values (``True == 1``) while the hash read the JSON text, so two
    traces could be equal with different hashes, and steps that replay differently compared equal."""
    a, b, c = (sl.Schedule(sl.workloads.matmul(8, 8, 8)) for _ in range(3))
    a.annotate("C", "note", True)
    b.annotate("C", "note", 1)
    c.annotate("C", "note", True)
    assert a.trace != b.trace
    assert a.trace == c.trace and hash(a.trace) == hash(c.trace)
    assert len({a.trace, b.trace, c.trace}) == 2


def test_trace_text_lists_calls_and_results() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    s.split("R.r", [None, 4])
    s.bind("R.i", "blockIdx.x")
    assert str(s.trace) == ("split(loop='R.r', factors=[None, 4]) -> ['R.r_0', 'R.r_1']\n"
                            "bind(loop='R.i', thread='blockIdx.x')")


def test_trace_keeps_its_own_copies_of_arguments_and_results() -> None:
    # Regression: the trace held the caller's factor list and returned name list by reference, so changing
    # either afterwards rewrote the recorded step and the replay no longer matched.
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    factors = [None, 4]
    names = s.split("R.r", factors)
    factors[1] = 2
    names.append("R.x")
    assert s.trace.steps[0]["args"]["factors"] == [None, 4]
    assert s.trace.steps[0]["result"] == ["R.r_0", "R.r_1"]
    assert sl.Schedule.from_trace(s.original, s.trace.to_json()).func == s.func


def test_copy_is_independent() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    s.split("R.r", [None, 4])
    c = s.copy()
    c.bind("R.i", "blockIdx.x")
    assert len(s.trace) == 1 and len(c.trace) == 2
    assert s.func.block("R").loops[0].thread is None


def test_schedule_needs_a_func() -> None:
    with pytest.raises(sl.ScheduleError, match="Schedule needs a Func"):
        sl.Schedule("matmul")  # type: ignore[arg-type]


# tampered traces --------------------------------------------------------------------------------

def _steps() -> list[dict[str, Any]]:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    s.split("R.r", [None, 4])
    s.bind("R.i", "blockIdx.x")
    return json.loads(s.trace.to_json())["steps"]


def _text(steps: Any, version: Any = TRACE_VERSION) -> str:
    return json.dumps({"version": version, "steps": steps})


def _with(k: int, **changes: Any) -> str:
    steps = _steps()
    steps[k].update(changes)
    return _text(steps)


_DEEP = '{"version": 1, "steps": ' + "[" * 100_000 + "]" * 100_000 + "}"


@dataclass(frozen=True)
class BadTrace:
    id: str
    trace: Callable[[], Any]
    argument: str
    value: Any
    reason: str


BAD_TRACES = [
    BadTrace("not-json", lambda: "{steps: [", "trace", "{steps: [", "is not valid JSON"),
    BadTrace("not-an-object", lambda: "[1, 2]", "trace", "[1, 2]", "must be an object with a 'steps' list"),
    BadTrace("steps-not-a-list", lambda: json.dumps({"version": 1, "steps": {}}), "trace",
             '{"version": 1, "steps": {}}', "'steps' list"),
    BadTrace("wrong-version", lambda: _text(_steps(), version=99), "version", 99, "reads trace version 1"),
    BadTrace("missing-version", lambda: json.dumps({"steps": []}), "version", None, "reads trace version 1"),
    BadTrace("step-not-an-object", lambda: _text([1]), "steps[0]", 1, "must be an object"),
    BadTrace("step-a-string", lambda: _text(["split"]), "steps[0]", "split", "must be an object"),
    BadTrace("unknown-primitive", lambda: _with(1, primitive="explode"), "steps[1].primitive", "explode",
             "unknown primitive"),
    BadTrace("lookup-is-not-a-primitive", lambda: _with(0, primitive="get_loops"), "steps[0].primitive",
             "get_loops", "unknown primitive"),
    BadTrace("args-not-an-object", lambda: _with(0, args=["R.r"]), "steps[0].args", ["R.r"], "must be an object"),
    BadTrace("unknown-argument", lambda: _with(0, args={"loop": "R.r", "factors": [None, 4], "depth": 2}),
             "steps[0].args", {"loop": "R.r", "factors": [None, 4], "depth": 2}, "unexpected keyword argument"),
    BadTrace("missing-argument", lambda: _with(1, args={"loop": "R.i"}), "steps[1].args", {"loop": "R.i"},
             "missing 1 required"),
    BadTrace("wrong-result", lambda: _with(0, result=["R.r_0", "R.r_x"]), "steps[0].result", ["R.r_0", "R.r_x"],
             "replay produced ['R.r_0', 'R.r_1']"),
    BadTrace("not-a-trace", lambda: {"steps": []}, "trace", {"steps": []}, "must be JSON text or a Trace"),
    # Regression: a list here was looked up in the primitive table and raised TypeError (unhashable).
    BadTrace("primitive-not-a-string", lambda: _with(0, primitive=["split"]), "steps[0].primitive", ["split"],
             "must be the name of a primitive"),
    # Regression: the JSON parser's RecursionError escaped.
    BadTrace("nested-too-deeply", lambda: _DEEP, "trace", _DEEP[:60], "nested too deeply"),
    # Regression: True == 1 and 1.0 == 1, so both passed the version check.
    BadTrace("version-true", lambda: _text(_steps(), version=True), "version", True, "reads trace version 1"),
    BadTrace("version-float", lambda: _text(_steps(), version=1.0), "version", 1.0, "reads trace version 1"),
    BadTrace("rule-not-a-name", lambda: json.dumps({"version": 1, "steps": [], "rule": ["matmul"]}), "rule",
             ["matmul"], "must be a rule name (str), or absent"),
    BadTrace("config-not-knob-values", lambda: json.dumps({"version": 1, "steps": [], "rule": "matmul",
                                                           "config": {"block_m": [64]}}), "config",
             {"block_m": [64]}, "must be an object of knob values"),
]


@pytest.mark.parametrize("case", BAD_TRACES, ids=lambda c: c.id)
def test_tampered_trace_is_refused(case: BadTrace) -> None:
    with pytest.raises(sl.ScheduleError) as info:
        sl.Schedule.from_trace(sl.workloads.reduce(4, 8), case.trace())
    err = info.value
    assert (err.primitive, err.argument, err.value) == ("from_trace", case.argument, case.value)
    assert str(err).startswith(f"from_trace: argument {case.argument}={case.value!r}: ")
    assert case.reason in str(err)


def test_trace_whose_step_the_primitive_rejects() -> None:
    with pytest.raises(sl.ScheduleError) as info:
        sl.Schedule.from_trace(sl.workloads.reduce(4, 8), _with(1, args={"loop": "R.i", "thread": "warp"}))
    assert (info.value.primitive, info.value.argument, info.value.value) == ("bind", "thread", "warp")


def test_trace_for_another_func_is_refused() -> None:
    with pytest.raises(sl.ScheduleError) as info:
        sl.Schedule.from_trace(sl.workloads.matmul(4, 4, 4), _text(_steps()))
    assert (info.value.primitive, info.value.argument, info.value.value) == ("split", "loop", "R.r")


def test_result_may_be_omitted() -> None:
    steps = _steps()
    del steps[0]["result"]
    replay = sl.Schedule.from_trace(sl.workloads.reduce(4, 8), _text(steps))
    assert replay.get_loops("R") == ["R.i", "R.r_0", "R.r_1"]


def test_a_rule_schedule_keeps_its_rule_and_config_through_its_trace() -> None:
    f = sl.workloads.matmul(64, 64, 64)
    sch = sl.rules.apply_default(f, "h100")
    text = sch.trace.to_json()
    for replayed in (sl.Schedule.from_trace(f, text), sl.Schedule.from_trace(f, sch.trace)):
        assert (replayed.rule, replayed.config) == ("matmul", sch.config) and str(replayed) == str(sch)
        assert replayed.config is not sch.config
    # what the steps build decides equality and the digest, not who chose them
    bare = sl.Schedule.from_trace(f, json.dumps({"version": 1, "steps": json.loads(text)["steps"]}))
    assert bare.rule is None and bare.config is None
    assert bare.trace == sch.trace and bare.trace.digest() == sch.trace.digest()
    assert "rule" not in sl.Schedule(f).trace.to_json()


@pytest.mark.parametrize("meta", [{"rule": 3, "config": {}}, {"rule": ["matmul"]}, {"config": [1]},
                                  {"rule": "matmul", "config": {"block_m": [64]}}])
def test_malformed_rule_metadata_is_refused(meta: dict) -> None:
    f = sl.workloads.matmul(64, 64, 64)
    with pytest.raises(sl.ScheduleError, match="rule"):
        sl.Schedule.from_trace(f, json.dumps({"version": 1, "steps": [], **meta}))


def test_every_rule_and_config_a_schedule_takes_round_trip() -> None:
    """Regression: ``rule``/``config`` took any value, and the trace written with it was refused on reading."""
    f = sl.workloads.matmul(64, 64, 64)
    for rule, config in (("handmade", None), (None, {"tile": 8}), ("mine", {"tile": 8, "fast": True})):
        s = sl.Schedule(f)
        s.split("C.i", [None, 8])
        s.rule, s.config = rule, config
        back = sl.Schedule.from_trace(f, s.trace.to_json())
        assert (back.rule, back.config) == (rule, config) and back.trace == s.trace
    s = sl.Schedule(f)
    for attr, value in (("rule", 3), ("config", {"tile": [8, 8]}), ("config", {"split_k": None}), ("config", [1])):
        with pytest.raises(sl.ScheduleError, match=f"argument {attr}="):
            setattr(s, attr, value)
    assert s.rule is None and s.config is None
