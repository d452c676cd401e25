"""Damage that reaches tune() through the storage: a RUNNING trial with edited attributes, a journal line that is
JSON but no operation, tables set up by another Optuna version, and a claim whose worker died mid-run.  Each
costs that row or gives a StorageError naming the file - never a raw TypeError, KeyError or AssertionError."""

from __future__ import annotations

import datetime
import socket
import sqlite3
from pathlib import Path
from typing import Any

import optuna
import pytest

import schedlib.search as S
from schedlib.rules.base import Config
from schedlib.search.database import resolve_storage, worker_alive
from schedlib.search.storage import StorageError

from .helpers import CountingReplay, ToyRule, toy_func, toy_table

HOST = socket.gethostname()


def _tune(storage: Any, trials: int, backend: Any = None) -> S.TuneResult:
    return S.tune(toy_func(), "h100", trials=trials, strategy="random", storage=storage, rule=ToyRule(),
                  backend=backend or S.ReplayBackend(toy_table()), quiet=True, warm_start=False)


def _study(storage: Any) -> optuna.Study:
    store, _ = resolve_storage(storage)
    return optuna.load_study(study_name=store.get_all_studies()[0].study_name, storage=store)


@pytest.mark.parametrize("attrs", [{"worker": f"{HOST}:12x:7"}, {"worker": 17}, {"worker": f"{HOST}:0:?"},
                                   {"worker": f"{HOST}:99999999999999999999:?"},
                                   {"worker": f"{HOST}:1:?", "config_key": [1, 2]}, ["not", "an", "object"]],
                         ids=["pid-not-a-number", "worker-not-a-string", "pid-zero", "pid-overflow",
                              "config-key-a-list", "attrs-a-list"])
def test_a_damaged_running_trial_costs_that_row_only(tmp_path: Path, attrs: Any) -> None:
    db = tmp_path / "run.sqlite3"
    _tune(db, 5)
    _study(db).ask().set_user_attr("sl", attrs)  # a RUNNING trial whose stored claim was edited
    res = _tune(db, 8)
    assert (res.records["status"] == "ok").sum() >= 7  # the damaged claim may hold one budget slot, no more


def test_worker_alive_judges_malformed_owners_by_age() -> None:
    fresh = datetime.datetime.now()
    old = fresh - datetime.timedelta(hours=5)
    for worker in (17, None, "", f"{HOST}:12x:7", f"{HOST}:0:?", f"{HOST}:-1:?", ["a:b:c"]):
        assert worker_alive(worker, fresh, 3600.0), worker
        assert not worker_alive(worker, old, 3600.0), worker
    assert not worker_alive(f"{HOST}:99999999999999999999:?", fresh, 3600.0)  # no process has that pid


@pytest.mark.parametrize("line, where", [("[1, 2]", "line 4 is not a journal operation"),
                                         ('{"op_code": 99, "worker_id": "x"}', "line 4 is not a journal operation"),
                                         ('{"op_code": true}', "line 4 is not a journal operation"),
                                         ('{"op_code": 6, "worker_id": "x"}',
                                          "an operation in it is malformed \\(KeyError")])
def test_a_journal_line_that_is_no_operation_names_the_file(tmp_path: Path, line: str, where: str) -> None:
    journal = tmp_path / "db.journal"
    _tune(journal, 3)
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join([*lines[:3], line + "\n", *lines[3:]]))
    with pytest.raises(StorageError, match=rf"tuning storage {journal} cannot be read: {where}"):
        S.apply_best(toy_func(), "h100", journal, rule=ToyRule())
    with pytest.raises(StorageError, match=rf"{journal}"):
        _tune(journal, 4)


def test_tables_of_another_optuna_version_name_the_file_and_the_upgrade(tmp_path: Path) -> None:
    db = tmp_path / "ver.sqlite3"
    _tune(db, 2)
    con = sqlite3.connect(db)
    con.execute("UPDATE alembic_version SET version_num = 'v9.9.9.a'")
    con.commit()
    con.close()
    with pytest.raises(StorageError, match=rf"{db} was set up by another Optuna version.*optuna storage upgrade"):
        S.apply_best(toy_func(), "h100", db, rule=ToyRule())
    with pytest.raises(StorageError, match=rf"{db} was set up by another Optuna version"):
        _tune(db, 3)


class PeerDiesMidRun(CountingReplay):
    """On its third measurement, a peer on this host claims a config and is killed -9 while measuring it."""

    def __init__(self, db: Path) -> None:
        super().__init__(toy_table())
        self.db = db

    def measure(self, config: Config, schedule: Any) -> S.Measurement:
        if len(self.measured) == 2:
            trial = _study(self.db).ask()
            claim = {"a": 3, "b": 1, "c": 4, "fixed": True}
            trial.set_user_attr("sl", {"config": claim, "config_key": S.config_key(claim),
                                       "worker": f"{HOST}:999999:x"})  # no process has pid 999999
        return super().measure(config, schedule)


def test_a_claim_whose_worker_died_mid_run_does_not_cost_a_trial(tmp_path: Path) -> None:
    db = tmp_path / "dead.sqlite3"
    backend = PeerDiesMidRun(db)
    res = _tune(db, 10, backend)
    assert (res.records["status"] == "ok").sum() == 10 and res.measured_now == 10
