"""A backend or worker that breaks its contract costs one trial, never the search: an exception out of
measure(), a malformed worker reply, a hang in an in-process backend, a best config the rule cannot build,
and a space that is used up before the budget is.  Each test ends on the old code too (it fails instead of
hanging): hangs are bounded by a thread join or an event."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import numpy as np
import optuna
import pytest

import schedlib.search as S
import schedlib.search.codec as codec_module
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config
from schedlib.search.backends.worker import measurement_from_reply
from schedlib.search.records import COUNTED

from . import malformed_handler
from .helpers import CountingReplay, ToyRule, toy_func, toy_table, toy_time

LEGAL = 45  # the toy space's legal points
BOUND_S = 60.0  # a test whose tune() has not ended by then fails (the old code looped forever)


def _tune_bounded(**kwargs: Any) -> S.TuneResult:
    """tune() in a daemon thread, failing the test if it does not end within BOUND_S."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = S.tune(toy_func(), "h100", rule=ToyRule(), quiet=True, warm_start=False, **kwargs)
        except BaseException as exc:  # handed to the test thread
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"tune({kwargs.get('strategy')}) did not end within {BOUND_S:g} s"
    if "error" in out:
        raise out["error"]
    return out["result"]


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "too-large-to-scan"])
@pytest.mark.parametrize("strategy", ["grid", "random", "tpe"])
def test_a_space_too_large_to_list_ends_when_used_up(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                                     strategy: str, scan: bool) -> None:
    monkeypatch.setattr(codec_module, "ENUMERATE_LIMIT", 3)  # stands for the fp16 matmul's 403,200 points
    if not scan:  # past SCAN_LIMIT the tuner cannot list the space either and stops on failed fills
        monkeypatch.setattr(codec_module, "SCAN_LIMIT", 3)
    backend = CountingReplay(toy_table())
    with caplog.at_level(logging.WARNING, logger="schedlib.search"):
        res = _tune_bounded(trials=LEGAL + 5, strategy=strategy, storage="memory", backend=backend, seed=1)
    assert res.exhausted and "space exhausted" in res.summary()
    assert any("space of matmul is exhausted" in r.getMessage() for r in caplog.records)
    if scan:  # an exact stop: every legal point measured once
        assert len(backend.measured) == LEGAL
    assert len({S.config_key(c) for c in backend.measured}) == len(backend.measured)
    assert len(res.trials) < 2 * LEGAL + 8 * 25, "the loop kept asking long after the space was used up"


def test_a_normal_run_is_not_marked_exhausted() -> None:
    res = S.tune(toy_func(), "h100", trials=LEGAL, strategy="grid", storage="memory",
                 backend=S.ReplayBackend(toy_table()), rule=ToyRule(), quiet=True, warm_start=False)
    assert not res.exhausted and (res.records["status"].isin(COUNTED)).sum() == LEGAL


class Raising(CountingReplay):
    def measure(self, config: Config, schedule: Schedule | None) -> S.Measurement:
        if config["a"] == 1:
            self.measured.append(dict(config))
            raise RuntimeError(f"kernel blew up for {config}")
        if config["a"] == 3:
            return "fast"  # type: ignore[return-value] - a contract a user backend can break too
        return super().measure(config, schedule)


def test_a_backend_that_raises_becomes_an_error_record_and_the_search_goes_on(tmp_path: Any) -> None:
    db = tmp_path / "raise.sqlite3"
    backend = Raising(toy_table())
    res = S.tune(toy_func(), "h100", trials=LEGAL, strategy="grid", storage=db, backend=backend, rule=ToyRule(),
                 quiet=True, warm_start=False)
    rec = res.records
    assert (rec["status"].isin(COUNTED)).sum() == LEGAL
    raised = rec[rec["a"] == 1]
    assert len(raised) == 12 and (raised["status"] == "error").all()
    assert (raised["error_type"] == "RuntimeError").all() and raised["error"].str.contains("kernel blew up").all()
    wrong = rec[rec["a"] == 3]
    assert (wrong["status"] == "error").all() and (wrong["error_type"] == "ProtocolError").all()
    assert wrong["error"].str.contains("returned str, not a Measurement").all()
    # recorded, not interrupted: a rerun measures none of them again
    again = Raising(toy_table())
    S.tune(toy_func(), "h100", trials=LEGAL, strategy="grid", storage=db, backend=again, rule=ToyRule(),
           quiet=True, warm_start=False)
    assert again.measured == []


class Interrupted(S.ReplayBackend):
    def measure(self, config: Config, schedule: Schedule | None) -> S.Measurement:
        raise KeyboardInterrupt


def test_ctrl_c_in_measure_still_abandons_the_trial() -> None:
    store = S.database.resolve_storage("memory")[0]
    with pytest.raises(KeyboardInterrupt):
        S.tune(toy_func(), "h100", trials=3, strategy="grid", storage=store, backend=Interrupted(toy_table()),
               rule=ToyRule(), quiet=True, warm_start=False)
    study = optuna.load_study(study_name=store.get_all_studies()[0].study_name, storage=store)
    assert [t.user_attrs["sl"]["status"] for t in study.trials] == ["interrupted"]


def test_malformed_worker_replies_become_protocol_errors_and_tuning_goes_on() -> None:
    backend = S.SubprocessBackend(f"{malformed_handler.__name__}:MalformedHandler", timeout_s=60, key="malformed")
    res = S.tune(toy_func(), "h100", trials=LEGAL, strategy="grid", storage="memory", backend=backend,
                 rule=ToyRule(), quiet=True, warm_start=False)
    rec = res.records.set_index(["a", "b", "c"])
    assert (res.records["status"].isin(COUNTED)).sum() == LEGAL, "tuning stopped early"
    for (a, c), mode in malformed_handler.MODES.items():
        row = rec.loc[(a, 1, c)]
        assert row["status"] == "error", (mode, row["status"])
        expected = {"zeros": "BelowTimerResolution", "some_zero": "BelowTimerResolution",
                    "unsendable": "TypeError", "none": "TypeError", "list": "TypeError",
                    "bad_status": "{'x': 1}"}.get(mode, "ProtocolError")
        assert row["error_type"] == expected, (mode, row["error_type"], row["error"])
    assert (res.records[res.records["b"] != 1]["status"] == "ok").all()


@pytest.mark.parametrize("reply", [None, [1], "text", {"status": "ok"}, {"status": "ok", "times_us": [0.0]},
                                   {"status": "ok", "times_us": ["1"]}, {"status": "ok", "times_us": [[1.0]]},
                                   {"status": "ok", "time_us": -1}, {"status": "ok", "time_us": True},
                                   {"status": "ok", "times_us": [1.0], "figures": [1]},
                                   {"status": {"a": 1}}])
def test_measurement_from_reply_never_raises(reply: Any) -> None:
    m = measurement_from_reply(reply, 0.5)
    if isinstance(reply, dict) and reply.get("figures") == [1]:
        assert m.ok and m.time_us == 1.0  # only the malformed figures are dropped
    else:
        assert m.status == "error" and m.error_type in ("ProtocolError", "BelowTimerResolution"), m


def test_a_valid_single_time_reply_keeps_its_spread() -> None:
    m = measurement_from_reply({"status": "ok", "time_us": 5.0, "p20_us": 4.0, "p80_us": 6.0}, 0.1)
    assert (m.time_us, m.p20_us, m.p80_us) == (5.0, 4.0, 6.0)


class Hanging(S.ReplayBackend):
    """Hangs on a=1 until released (so that the old code, which waited, ends the test by failing)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.release = threading.Event()
        self.threads: set[str] = set()

    def measure(self, config: Config, schedule: Schedule | None) -> S.Measurement:
        self.threads.add(threading.current_thread().name)
        if config["a"] == 1:
            self.release.wait(BOUND_S)
        return super().measure(config, schedule)


def test_timeout_per_trial_stops_a_hung_in_process_backend(tmp_path: Any) -> None:
    db = tmp_path / "hang.sqlite3"
    backend = Hanging(toy_table())
    try:
        with pytest.raises(S.InProcessTimeoutError, match=r"tune: .*Hanging.*timeout_per_trial=2 s"):
            S.tune(toy_func(), "h100", trials=LEGAL, strategy="grid", storage=db, backend=backend, rule=ToyRule(),
                   quiet=True, warm_start=False, timeout_per_trial=2.0)
    finally:
        backend.release.set()
    res = S.tune(toy_func(), "h100", trials=13, strategy="grid", storage=db, backend=S.ReplayBackend(toy_table()),
                 rule=ToyRule(), quiet=True, warm_start=False)
    timeouts = res.records[res.records["status"] == "timeout"]
    assert len(timeouts) == 1 and timeouts.iloc[0]["a"] == 1, "the hung config is recorded, so a rerun skips it"
    assert timeouts.iloc[0]["error_type"] == "InProcessTimeout"


def test_without_a_timeout_an_in_process_backend_runs_inline() -> None:
    backend = Hanging(toy_table())
    backend.release.set()
    S.tune(toy_func(), "h100", trials=4, strategy="grid", storage="memory", backend=backend, rule=ToyRule(),
           quiet=True, warm_start=False)
    assert backend.threads == {threading.current_thread().name}


class Picky(ToyRule):
    """Cannot build the two fastest points of the toy table."""

    def schedule(self, func: Any, facts: Any, config: Config, target: Any) -> Schedule:
        if (config["a"], config["b"]) in ((2, 3), (2, 2)) and config["c"] == 2:
            raise ValueError(f"cannot build this tile: {config}")
        return super().schedule(func, facts, config, target)


def test_a_best_config_the_rule_cannot_build_falls_back_to_the_next(tmp_path: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "picky.sqlite3"
    table = toy_table()
    buildable = sorted((r for r in table if not ((r["config"]["a"], r["config"]["b"]) in ((2, 3), (2, 2))
                                                 and r["config"]["c"] == 2)), key=lambda r: r["time_us"])
    with caplog.at_level(logging.WARNING, logger="schedlib.search"):
        res = S.tune(toy_func(), "h100", trials=LEGAL, strategy="grid", storage=db, backend=S.ReplayBackend(table),
                     rule=Picky(), quiet=True, warm_start=False)
    assert res.best_config == buildable[0]["config"] and res.best_time_us == pytest.approx(buildable[0]["time_us"])
    assert res.best_schedule is not None
    warned = [r.getMessage() for r in caplog.records if "cannot build the recorded config" in r.getMessage()]
    assert len(warned) == 2 and "cannot build this tile" in warned[0]
    assert S.apply_best(toy_func(), "h100", db, rule=Picky()).config == buildable[0]["config"]


def test_tune_and_apply_best_name_a_study_whose_records_none_can_build(tmp_path: Any) -> None:
    class Nothing(ToyRule):
        def schedule(self, func: Any, facts: Any, config: Config, target: Any) -> Schedule:
            raise ValueError("never")

    db = tmp_path / "nothing.sqlite3"
    res = S.tune(toy_func(), "h100", trials=4, strategy="grid", storage=db, backend=S.ReplayBackend(toy_table()),
                 rule=Nothing(), quiet=True, warm_start=False)
    assert res.best_config is None and res.best_schedule is None and math.isinf(res.best_time_us)
    with pytest.raises(S.NoRecordError, match="none succeeded that rule toy can build"):
        S.apply_best(toy_func(), "h100", db, rule=Nothing())


@pytest.mark.parametrize("strategy", ["tpe", "random", "evolutionary"])
def test_a_seed_beyond_32_bits_is_refused_by_name(strategy: str) -> None:
    with pytest.raises(ValueError, match=r"tune: seed=4294967296; expected an int with 0 <= seed < 2\*\*32"):
        S.tune(toy_func(), "h100", trials=2, strategy=strategy, storage="memory",
               backend=S.ReplayBackend(toy_table()), rule=ToyRule(), quiet=True, seed=2**32)


class Scripted(CountingReplay):
    """Counts its measurements and returns ``make(config)`` for each: what a backend of odd habits hands back."""

    def __init__(self, make: Any) -> None:
        super().__init__(toy_table())
        self.make = make

    def measure(self, config: Config, schedule: Schedule | None) -> S.Measurement:
        self.measured.append(dict(config))
        return self.make(config)


@pytest.mark.parametrize("status", ["interrupted", "cached", "weird", ["ok"]])
def test_a_measurement_with_a_status_that_is_no_record_becomes_an_error_record(status: Any) -> None:
    """A status that is no record: a bookkeeping one, an unknown one, a list."""
    backend = Scripted(lambda c: S.Measurement(status))
    res = _tune_bounded(trials=5, strategy="random", storage="memory", backend=backend, features="knobs")
    assert len(backend.measured) == 5, "a status that is no record left the config measurable: it looped"
    rec = res.records
    assert len(rec) == 5 and (rec["status"] == "error").all() and (rec["error_type"] == "ProtocolError").all()


class BadRebenchmark(S.ReplayBackend):
    """Measures from the toy table; its rebenchmark raises, returns junk, or returns junk beside a time."""

    def __init__(self, mode: str) -> None:
        super().__init__(toy_table())
        self.mode = mode

    def rebenchmark(self, items: list[tuple[Config, Schedule | None]]) -> list[S.Measurement] | None:
        if self.mode == "raise":
            raise RuntimeError("the device went away")
        if self.mode == "not-a-list":
            return 7  # type: ignore[return-value]
        return ["fast", *[S.Measurement("ok", 0.5) for _ in items[1:]]]  # type: ignore[list-item]


@pytest.mark.parametrize("mode", ["raise", "not-a-list", "junk-entry"])
def test_a_rebenchmark_that_breaks_its_contract_leaves_the_first_measurements(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, mode: str) -> None:
    db = tmp_path / "rebench.sqlite3"
    with caplog.at_level(logging.WARNING, logger="schedlib.search"):
        res = _tune_bounded(trials=6, strategy="grid", storage=db, backend=BadRebenchmark(mode), features="knobs")
    assert any("rebenchmark" in r.getMessage() for r in caplog.records)
    ok = res.records[res.records["status"] == "ok"]
    if mode == "junk-entry":  # the good entries are kept; the fastest record's junk entry leaves its time alone
        assert res.best_time_us == 0.5
    else:
        assert res.best_time_us == ok["time_us"].min()
    assert S.apply_best(toy_func(), "h100", db, rule=ToyRule()) is not None


NUMPY_FIELDS = {  # what a backend built on numpy/cupy hands back, and what a hurried one passes as its error
    "float32-time": lambda c: S.Measurement("ok", np.float32(toy_time(c))),
    "int64-time": lambda c: S.Measurement("ok", np.int64(toy_time(c))),
    "float32-spread": lambda c: S.Measurement("ok", toy_time(c), np.float32(1.0), np.float32(99.0)),
    "exception-as-error": lambda c: S.Measurement("error", error_type=ValueError, error=ValueError("boom")),
    "no-wall-no-figures": lambda c: S.Measurement("ok", toy_time(c), wall_s=None, figures=None),
}


@pytest.mark.parametrize("storage", ["memory", "db.journal"])
@pytest.mark.parametrize("case", list(NUMPY_FIELDS))
def test_a_measurement_of_numpy_scalars_or_objects_is_recorded_as_plain_json(tmp_path: Any, case: str,
                                                                            storage: str) -> None:
    where = storage if storage == "memory" else tmp_path / storage
    backend = Scripted(NUMPY_FIELDS[case])
    res = _tune_bounded(trials=4, strategy="grid", storage=where, backend=backend, features="knobs")
    rec = res.records
    assert len(rec) == 4 and len(backend.measured) == 4
    if case == "exception-as-error":
        assert (rec["status"] == "error").all() and (rec["error_type"] == "ValueError").all()
        assert (rec["error"] == "boom").all()
    else:  # every ok record is kept, its time a float equal to the table's
        assert (rec["status"] == "ok").all()
        assert [type(t) for t in rec["time_us"]] == [float] * 4
        assert res.best_time_us == min(toy_time(c) for c in rec["config"])
    if storage != "memory":  # recorded, not interrupted: a rerun measures nothing again
        again = Scripted(NUMPY_FIELDS[case])
        _tune_bounded(trials=4, strategy="grid", storage=where, backend=again, features="knobs")
        assert again.measured == []


class HangingRebenchmark(S.ReplayBackend):
    """Measures from the toy table at once; its rebenchmark never returns (until the test releases it)."""

    def __init__(self) -> None:
        super().__init__(toy_table())
        self.release = threading.Event()

    def rebenchmark(self, items: list[tuple[Config, Schedule | None]]) -> list[S.Measurement] | None:
        self.release.wait(BOUND_S * 2)
        return None


def test_timeout_per_trial_also_bounds_a_hanging_rebenchmark(caplog: pytest.LogCaptureFixture) -> None:
    backend = HangingRebenchmark()
    try:
        with caplog.at_level(logging.WARNING, logger="schedlib.search"):
            res = _tune_bounded(trials=4, strategy="grid", storage="memory", backend=backend, features="knobs",
                                timeout_per_trial=0.2, rebenchmark_top=2)
    finally:
        backend.release.set()
    assert len(res.records) == 4 and res.best_time_us == res.records["time_us"].min()
    assert any("rebenchmark did not return" in r.getMessage() for r in caplog.records)


class MutatesConfig(CountingReplay):
    """Turns the config it is handed into kernel arguments in place (pops a knob, adds a key)."""

    def measure(self, config: Config, schedule: Schedule | None) -> S.Measurement:
        m = super().measure(config, schedule)
        config.pop("fixed")
        config["stream"] = 0
        return m

    def rebenchmark(self, items: list[tuple[Config, Schedule | None]]) -> list[S.Measurement] | None:
        for config, _ in items:
            config.clear()
        return [S.Measurement("ok", 1.0) for _ in items]


def test_a_backend_that_changes_its_config_argument_does_not_change_the_record(tmp_path: Any) -> None:
    db = tmp_path / "mutate.journal"
    backend = MutatesConfig(toy_table())
    res = _tune_bounded(trials=5, strategy="grid", storage=db, backend=backend, features="knobs")
    assert len(res.records) == 5 and (res.records["status"] == "ok").all()
    assert all(c["fixed"] is True and "stream" not in c for c in res.records["config"])
    assert res.best_time_us == 1.0  # the re-benchmark is keyed by the record's own config
    again = MutatesConfig(toy_table())
    _tune_bounded(trials=5, strategy="grid", storage=db, backend=again, features="knobs")
    assert again.measured == []
