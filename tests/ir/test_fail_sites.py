"""Every error path of the primitives and of trace replay is exercised by some negative test.

The sites are found mechanically: each ``fail(...)`` call in ``schedlib/ir/primitives/`` and each
``raise ScheduleError(...)`` in ``schedlib/ir/schedule.py``.  Running every negative case of the test
modules and reading where its ScheduleError came from must reach all of them, so a new error path
without a test fails here.
"""

from __future__ import annotations

import ast
import itertools
import traceback
from pathlib import Path

import pytest

import schedlib as sl
import schedlib.ir.primitives as primitives_pkg
import schedlib.ir.schedule as schedule_mod

from . import (
    test_primitives_annotate,
    test_primitives_cache,
    test_primitives_compute_with,
    test_primitives_loops,
    test_primitives_pipeline,
    test_primitives_placement_errors,
    test_primitives_reduction,
    test_primitives_storage,
    test_schedule,
    test_trace,
)

PRIMITIVES_DIR = Path(primitives_pkg.__file__).parent
SCHEDULE_FILE = Path(schedule_mod.__file__)
NEGATIVE = [case for mod in (test_primitives_loops, test_primitives_annotate, test_primitives_cache,
                             test_primitives_compute_with, test_primitives_pipeline,
                             test_primitives_placement_errors, test_primitives_reduction, test_primitives_storage,
                             test_schedule)
            for case in mod.NEGATIVE]

Site = tuple[str, int]


def fail_sites() -> set[Site]:
    """(file name, line) of every fail(...) call in the primitives and ScheduleError raise in schedule.py."""
    sites: set[Site] = set()
    for path in sorted(PRIMITIVES_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "fail":
                sites.add((path.name, node.lineno))
    for node in ast.walk(ast.parse(SCHEDULE_FILE.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                getattr(node.exc.func, "id", None) == "ScheduleError":
            sites.add((SCHEDULE_FILE.name, node.lineno))
    return sites


def site_of(err: BaseException) -> Site:
    """Where the error was raised: the caller of ``fail``, or the raise in schedule.py."""
    frames = traceback.extract_tb(err.__traceback__)
    for outer, inner in itertools.pairwise(frames):
        if inner.name == "fail" and Path(inner.filename).parent == PRIMITIVES_DIR:
            return Path(outer.filename).name, outer.lineno or 0
    last = frames[-1]
    return Path(last.filename).name, last.lineno or 0


def reached_sites() -> dict[Site, list[str]]:
    reached: dict[Site, list[str]] = {}
    for case in NEGATIVE:
        err = case.check()
        reached.setdefault(site_of(err), []).append(case.id)
    for bad in test_trace.BAD_TRACES:
        with pytest.raises(sl.ScheduleError) as info:
            sl.Schedule.from_trace(sl.workloads.reduce(4, 8), bad.trace())
        reached.setdefault(site_of(info.value), []).append(bad.id)
    return reached


def test_every_error_path_has_a_negative_test() -> None:
    sites = fail_sites()
    assert len(sites) > 80  # sanity: the scan found the primitives' checks
    reached = reached_sites()
    missing = sorted(sites - reached.keys())
    assert not missing, f"error paths without a negative test: {missing}"
    stray = sorted(set(reached) - sites)
    assert not stray, f"negative tests failing somewhere that is not a known error path: {stray}"


def test_negative_case_ids_are_unique() -> None:
    ids = [case.id for case in NEGATIVE] + [bad.id for bad in test_trace.BAD_TRACES]
    assert len(ids) == len(set(ids))
