"""Faults in the measuring worker (abort, segfault, exception, hang) become typed failures, the worker is
restarted, and tuning goes on to the end."""

from __future__ import annotations

import pytest

import schedlib.search as S
from schedlib.search.records import COUNTED

from . import faulty_handler
from .helpers import ToyRule, toy_func

HANDLER = f"{faulty_handler.__name__}:FaultyHandler"


def test_every_kind_of_worker_fault_is_recorded_and_tuning_goes_on() -> None:
    rule, func = ToyRule(), toy_func()
    backend = S.SubprocessBackend(HANDLER, timeout_s=600, key="faulty")
    legal = list(rule.space(func, "h100").enumerate())
    res = S.tune(func, "h100", trials=len(legal), strategy="grid", storage="memory", backend=backend, rule=rule,
                 quiet=True, warm_start=False, timeout_per_trial=1.5)  # overrides the backend's 600 s
    rec = res.records.set_index(["a", "b", "c"])
    assert (res.records["status"].isin(COUNTED)).sum() == len(legal), "tuning stopped early"
    for c in (1, 2, 4):
        abort, segv = rec.loc[(0, 2, c)], rec.loc[(1, 2, c)]
        assert abort["status"] == "crash" and "SIGABRT" in abort["error"]
        assert segv["status"] == "crash" and "SIGSEGV" in segv["error"]
        raised = rec.loc[(2, 2, c)]
        assert raised["status"] == "error" and raised["error_type"] == "RuntimeError"
        assert "simulated failure" in raised["error"]
        hung = rec.loc[(3, 2, c)]
        assert hung["status"] == "timeout" and "1.5 s" in hung["error"]
    ok = res.records[res.records["status"] == "ok"]
    assert len(ok) == len(legal) - 4 * 3  # b == 2 faults for every a and c; everything else measured
    assert res.best_config == {"a": 2, "b": 1, "c": 1, "fixed": True}
    assert ok["p20_us"].le(ok["time_us"]).all() and ok["time_us"].le(ok["p80_us"]).all()


def test_a_worker_that_cannot_set_up_stops_tuning_with_a_clear_error() -> None:
    backend = S.SubprocessBackend(f"{faulty_handler.__name__}:NoSuchHandler", timeout_s=5)
    with pytest.raises(S.WorkerSetupError, match=r"NoSuchHandler.*failed to set up: AttributeError"):
        S.tune(toy_func(), "h100", trials=3, storage="memory", backend=backend, rule=ToyRule(), quiet=True)
