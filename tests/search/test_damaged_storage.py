"""A damaged or edited tuning database costs the damaged rows only, and an unreadable one is named.

Each test copies one small study (tuned once per module with the estimate backend) and edits it the way a
crash, a bad copy or a hand edit would, through sqlite3 directly.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import schedlib.search as S
from schedlib.errors import SchedlibError
from schedlib.hw import resolve
from schedlib.rules import find_rule
from schedlib.search.records import OK
from schedlib.search.storage import StorageError

from .helpers import toy_func

TRIALS = 8


@pytest.fixture(scope="module")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, float]]]:
    """A tuned SQLite study and its ok records (config key -> time)."""
    root = tmp_path_factory.mktemp("study")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCHEDLIB_CACHE_DIR", str(root / "cache"))
        res = S.tune(toy_func(), "h100", trials=TRIALS, strategy="random", storage=root / "base.sqlite3",
                     quiet=True, warm_start=False, features="knobs", seed=3)
    con = sqlite3.connect(root / "base.sqlite3")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the copies below take the main file only
    con.close()
    ok = res.records[res.records["status"] == OK]
    assert len(ok) >= 3
    yield root / "base.sqlite3", dict(zip(ok["config_key"], ok["time_us"]))


def _copy(study_db: tuple[Path, dict[str, float]], tmp_path: Path) -> Path:
    db = tmp_path / "db.sqlite3"
    shutil.copy(study_db[0], db)
    return db


def _edit_best(db: Path, change: Callable[[dict[str, Any]], Any]) -> str:
    """Apply ``change`` to the stored attributes of the fastest ok trial; returns its config key."""
    con = sqlite3.connect(db)
    rows = [(tid, json.loads(v)) for tid, v in
            con.execute("select trial_id, value_json from trial_user_attributes where key='sl'")]
    tid, attrs = min(((t, a) for t, a in rows if a.get("status") == OK), key=lambda r: r[1]["time_us"])
    key = attrs["config_key"]
    new = change(attrs)
    con.execute("update trial_user_attributes set value_json=? where trial_id=? and key='sl'",
                (json.dumps(attrs if new is None else new), tid))
    con.commit()
    con.close()
    return key


EDITS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "config_removed": lambda a: a.pop("config") and None,
    "config_list": lambda a: a.update(config=[1, 2]),
    "config_none": lambda a: a.update(config=None),
    "config_not_in_space": lambda a: a["config"].update(block_m=7),
    "time_text": lambda a: a.update(time_us="fast"),
    "time_negative": lambda a: a.update(time_us=-5),
    "time_nan": lambda a: a.update(time_us=float("nan")),
    "attrs_list": lambda a: [1],
    # another legal point under the best record's key, with a forged time
    "config_not_its_key": lambda a: a.update(config=_other_point(a["config"]), time_us=1e-3),
}


def _other_point(config: dict[str, Any]) -> dict[str, Any]:
    """A legal config of the study's space other than ``config``."""
    func = toy_func()
    profile = resolve("h100")
    space = find_rule(func, profile).space(func, profile)
    return next(c for c in space.enumerate() if c != config)


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_tampered_best_record_is_skipped_with_one_warning(
        study_db: tuple[Path, dict[str, float]], tmp_path: Path, edit: str, caplog: pytest.LogCaptureFixture) -> None:
    db = _copy(study_db, tmp_path)
    bad_key = _edit_best(db, EDITS[edit])
    rest = {k: t for k, t in study_db[1].items() if k != bad_key}
    with caplog.at_level(logging.WARNING, logger="schedlib.search"):
        sch = S.apply_best(toy_func(), "h100", db)
    assert rest[S.config_key(sch.config)] == min(rest.values()), "the best of the intact records is used"
    warned = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warned) == 1 and "skipped 1 malformed record" in warned[0] and str(db) in warned[0]
    res = S.tune(toy_func(), "h100", trials=TRIALS + 1, strategy="random", storage=db, quiet=True,
                 warm_start=False, features="knobs")
    assert 0 < res.best_time_us <= min(rest.values())
    assert (res.records["time_us"] > 1e-3).all(), "the skipped record is not in the records table either"


def test_a_bad_rebenchmark_time_is_skipped(study_db: tuple[Path, dict[str, float]], tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    db = _copy(study_db, tmp_path)
    con = sqlite3.connect(db)
    best = min(study_db[1], key=study_db[1].__getitem__)
    for name, value in ((f"rebench:{best}", {"time_us": "abc"}), ("rebench:x", {"time_us": -1.0})):
        con.execute("insert into study_user_attributes(study_id, key, value_json) values (1, ?, ?)",
                    (name, json.dumps(value)))
    con.commit()
    con.close()
    with caplog.at_level(logging.WARNING, logger="schedlib.search"):
        sch = S.apply_best(toy_func(), "h100", db)
    assert S.config_key(sch.config) == best
    assert any("skipped 2 malformed" in r.getMessage() for r in caplog.records)


def test_a_row_that_is_not_json_names_the_storage(study_db: tuple[Path, dict[str, float]], tmp_path: Path) -> None:
    db = _copy(study_db, tmp_path)
    con = sqlite3.connect(db)
    con.execute("update trial_user_attributes set value_json='{bad' where key='sl'")
    con.commit()
    con.close()
    with pytest.raises(StorageError, match=rf"{db}.*cannot be read.*not valid JSON"):
        S.apply_best(toy_func(), "h100", db)
    with pytest.raises(StorageError, match=str(db)):
        S.tune(toy_func(), "h100", trials=TRIALS + 1, storage=db, quiet=True, warm_start=False)


@pytest.mark.parametrize("damage", ["truncated", "zeros", "text"])
def test_a_file_that_is_no_database_names_the_storage(study_db: tuple[Path, dict[str, float]], tmp_path: Path,
                                                      damage: str) -> None:
    db = _copy(study_db, tmp_path)
    if damage == "truncated":
        with open(db, "r+b") as fh:
            fh.truncate(4096)
    else:
        db.write_bytes(b"\0" * 8192 if damage == "zeros" else b"these are my notes\n" * 20)
    with pytest.raises(StorageError, match=str(db)):
        S.apply_best(toy_func(), "h100", db)
    with pytest.raises(StorageError, match=str(db)):
        S.tune(toy_func(), "h100", trials=2, storage=db, quiet=True, warm_start=False)


def test_a_journal_with_a_garbage_line_names_file_and_line(tmp_path: Path) -> None:
    journal = tmp_path / "db.journal"
    tuned = S.tune(toy_func(), "h100", trials=3, strategy="random", storage=journal, quiet=True, warm_start=False,
                   features="knobs")
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join([*lines[:2], '{"op_code": 6, "wor' + lines[2], *lines[3:]]))
    with pytest.raises(StorageError, match=rf"{journal}.*line 3 is not a JSON record"):
        S.apply_best(toy_func(), "h100", journal)
    # a last line cut short by a crash is no damage: everything before it is read
    journal.write_text("".join(lines) + '{"op_code": 6, "wor')
    assert S.apply_best(toy_func(), "h100", journal).config == tuned.best_config


@pytest.mark.parametrize("kind", ["bogus-scheme", "missing-dir-url", "directory", "proc", "not-a-db"])
def test_unusable_storage_arguments_name_the_storage(tmp_path: Path, kind: str) -> None:
    (tmp_path / "notes.sqlite3").write_text("not a database\n")
    storage = {"bogus-scheme": "bogus://x", "missing-dir-url": f"sqlite:///{tmp_path}/nodir/x.db",
               "directory": str(tmp_path), "proc": "/proc/schedlib-test.sqlite3",
               "not-a-db": str(tmp_path / "notes.sqlite3")}[kind]
    with pytest.raises(StorageError, match=storage.replace("/", ".")) as info:
        S.tune(toy_func(), "h100", trials=1, storage=storage, quiet=True, warm_start=False)
    assert isinstance(info.value, SchedlibError)


def test_an_empty_storage_argument_is_refused() -> None:
    with pytest.raises(ValueError, match="storage='' is empty"):
        S.tune(toy_func(), "h100", trials=1, storage="", quiet=True)
    with pytest.raises(ValueError, match="storage='' is empty"):
        S.apply_best(toy_func(), "h100", "")


def test_a_database_another_process_is_creating_is_opened_once_its_schema_is_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers opening one new SQLite file at the same moment both insert the schema's version row; the
    loser's insert fails on its unique key.  It opens the database again instead of failing the run."""
    import optuna
    import sqlalchemy

    import schedlib.search.storage as storage_mod

    calls = []

    def racing(url: str, **kwargs: Any) -> optuna.storages.RDBStorage:
        calls.append(url)
        if len(calls) == 1:
            optuna.storages.RDBStorage(url, **kwargs)  # the other worker creates the schema first
            raise sqlalchemy.exc.IntegrityError("INSERT INTO alembic_version", (), Exception("UNIQUE constraint"))
        return optuna.storages.RDBStorage(url, **kwargs)

    monkeypatch.setattr(storage_mod, "RDBStorage", racing)
    opened, _ = storage_mod.resolve_storage(str(tmp_path / "new.sqlite3"))
    assert len(calls) == 2 and isinstance(opened, optuna.storages.RDBStorage)
    assert opened.get_all_studies() == []

    def always(url: str, **kwargs: Any) -> optuna.storages.RDBStorage:
        calls.append(url)
        raise sqlalchemy.exc.IntegrityError("INSERT INTO alembic_version", (), Exception("UNIQUE constraint"))

    calls.clear()
    monkeypatch.setattr(storage_mod, "RDBStorage", always)
    monkeypatch.setattr(storage_mod.time, "sleep", lambda _s: None)
    with pytest.raises(StorageError, match="cannot be opened as an SQLite database"):
        storage_mod.resolve_storage(str(tmp_path / "other.sqlite3"))
    assert len(calls) == storage_mod.SCHEMA_RACE_TRIES


@pytest.mark.parametrize("form", ["path", "url"])
def test_another_programs_sqlite_database_is_refused_and_left_unchanged(tmp_path: Path, form: str) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE trials (x INTEGER)")  # a name Optuna's schema uses too
        conn.execute("INSERT INTO trials VALUES (1)")
    storage = str(db) if form == "path" else f"sqlite:///{db}"
    with pytest.raises(StorageError, match=r"SQLite database of something else.*trials"):
        S.apply_best(toy_func(), "h100", storage)
    with pytest.raises(StorageError, match="SQLite database of something else"):
        S.tune(toy_func(), "h100", trials=1, storage=storage, quiet=True, warm_start=False)
    with sqlite3.connect(db) as conn:  # neither call added Optuna's tables to it
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["trials"]


def test_apply_best_on_an_empty_file_writes_no_schema(tmp_path: Path) -> None:
    db = tmp_path / "empty.sqlite3"
    db.touch()
    with pytest.raises(S.NoRecordError, match="is empty"):
        S.apply_best(toy_func(), "h100", db)
    assert db.stat().st_size == 0
    res = S.tune(toy_func(), "h100", trials=1, storage=db, quiet=True, warm_start=False)  # tune may start it
    assert S.apply_best(toy_func(), "h100", db) is not None and len(res.records) == 1
