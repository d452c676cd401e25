"""Damage the other storage tests do not reach: hand-edited fields that are unhashable (a list status, an object
config key), a journal whose last line a crash cut short, and stored values nested too deeply to decode.

Each costs the damaged row (with the "skipped N malformed record(s)" warning) or comes out as a StorageError
naming the file - never a TypeError or RecursionError, and never a journal made unreadable by the next append.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import schedlib.search as S
from schedlib.search.records import OK
from schedlib.search.storage import StorageError

from .helpers import ToyRule, toy_func, toy_table
from .test_damaged_storage import _edit_best

DEEP = "[" * 100_000 + "]" * 100_000  # far past json's recursion limit


def _tune(storage: Any, trials: int) -> S.TuneResult:
    return S.tune(toy_func(), "h100", trials=trials, strategy="random", storage=storage, rule=ToyRule(),
                  backend=S.ReplayBackend(toy_table()), quiet=True, warm_start=False, features="knobs")


def _apply(storage: Any) -> Any:
    return S.apply_best(toy_func(), "h100", storage, rule=ToyRule())


UNHASHABLE: dict[str, Callable[[dict[str, Any]], None]] = {
    "status-list": lambda a: a.update(status=["ok"]),
    "status-object": lambda a: a.update(status={"ok": 1}),
    "config-key-object": lambda a: a.update(config_key={"a": 1}),
    "config-key-list": lambda a: a.update(config_key=["x"]),
}


@pytest.mark.parametrize("edit", list(UNHASHABLE))
def test_an_unhashable_status_or_config_key_is_skipped_everywhere(tmp_path: Path, edit: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "db.sqlite3"
    before = _tune(db, 6)
    bad_key = _edit_best(db, UNHASHABLE[edit])
    with caplog.at_level(logging.WARNING, logger="schedlib.search"):
        sch = _apply(db)
    assert S.config_key(sch.config) != bad_key, "the damaged record is not used"
    warned = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert warned and "skipped 1 malformed record" in warned[0] and str(db) in warned[0]
    res = _tune(db, 8)  # reads the study through RecordIndex, records_frame and ranked_records
    assert all(isinstance(v, str) for v in res.records["status"]), "the damaged row is not in the records"
    assert all(isinstance(v, str) for v in res.records["config_key"])
    assert (res.records["status"] == OK).sum() == 8
    assert len(res.trials) >= len(before.records)  # the flat table of every trial is built too


def _cut_short_journal(tmp_path: Path, trials: int = 6, cut: int = 30) -> tuple[Path, S.TuneResult, bytes]:
    """A tuned journal whose last ``cut`` bytes are gone (a crash mid-append); returns the bytes that remain
    of its last line."""
    journal = tmp_path / "db.journal"
    res = _tune(journal, trials)
    data = journal.read_bytes()
    with open(journal, "r+b") as fh:
        fh.truncate(len(data) - cut)
    kept = data[:len(data) - cut]
    return journal, res, kept[kept.rindex(b"\n") + 1:]


def test_a_journal_line_cut_short_is_set_aside_before_appending(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    journal, first, partial = _cut_short_journal(tmp_path)
    with caplog.at_level(logging.WARNING, logger="schedlib.search"):
        res = _tune(journal, 8)
    side = tmp_path / "db.journal.partial-1"
    assert side.read_bytes() == partial, "the partial line is kept, byte for byte"
    assert journal.read_bytes().endswith(b"\n")
    warned = [r.getMessage() for r in caplog.records if "cut short" in r.getMessage()]
    assert len(warned) == 1 and str(journal) in warned[0] and str(side) in warned[0]
    assert f"{len(partial)} byte(s)" in warned[0]
    assert (res.records["status"] == OK).sum() == 8
    # every trial the crash did not interrupt survives (the cut one was finishing the last trial)
    completed = set(first.records["config_key"][:-1])
    assert completed <= set(res.records["config_key"])
    assert res.measured_now <= 8 - len(completed)
    again = _tune(journal, 9)  # the repaired journal stays readable and appendable
    assert (again.records["status"] == OK).sum() == 9
    assert _apply(journal).config == again.best_config
    assert not (tmp_path / "db.journal.partial-2").exists(), "a complete journal is left alone"


def test_a_second_cut_short_line_goes_to_a_new_side_file(tmp_path: Path) -> None:
    journal, _, _ = _cut_short_journal(tmp_path)
    _tune(journal, 8)
    with open(journal, "ab") as fh:
        fh.write(b'{"op_code": 6, "worker_id": "x", "tri')
    _tune(journal, 9)
    assert (tmp_path / "db.journal.partial-1").exists()
    assert (tmp_path / "db.journal.partial-2").read_bytes() == b'{"op_code": 6, "worker_id": "x", "tri'


def test_apply_best_reads_a_cut_short_journal_without_changing_it(tmp_path: Path) -> None:
    journal, _, _ = _cut_short_journal(tmp_path)
    data = journal.read_bytes()
    assert _apply(journal) is not None
    assert journal.read_bytes() == data and not list(tmp_path.glob("*.partial-*"))


def test_a_last_line_that_is_no_operation_is_not_moved(tmp_path: Path) -> None:
    journal, _, _ = _cut_short_journal(tmp_path, cut=0)
    with open(journal, "ab") as fh:
        fh.write(b"these are my notes")
    data = journal.read_bytes()
    with pytest.raises(StorageError, match=rf"{journal}: its last line b'these are my notes' has no line end"):
        _tune(journal, 8)
    assert journal.read_bytes() == data and not list(tmp_path.glob("*.partial-*"))


def test_a_value_nested_too_deeply_in_sqlite_names_the_storage(tmp_path: Path) -> None:
    db = tmp_path / "deep.sqlite3"
    _tune(db, 4)
    con = sqlite3.connect(db)
    con.execute("update trial_user_attributes set value_json=? where trial_user_attribute_id=(select "
                "min(trial_user_attribute_id) from trial_user_attributes where key='sl')", (DEEP,))
    con.commit()
    con.close()
    for call in (lambda: _apply(db), lambda: _tune(db, 6)):
        with pytest.raises(StorageError, match=rf"{db} cannot be read: a stored value is nested too deeply"):
            call()


def test_a_journal_line_nested_too_deeply_names_file_and_line(tmp_path: Path) -> None:
    journal = tmp_path / "deep.journal"
    _tune(journal, 3)
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join([*lines[:3], '{"op_code": 6, "x": ' + DEEP + "}\n", *lines[3:]]))
    for call in (lambda: _apply(journal), lambda: _tune(journal, 4)):
        with pytest.raises(StorageError, match=rf"{journal} cannot be read: line 4 is nested too deeply") as info:
            call()
        assert "\n" not in str(info.value)
