"""Real processes on a shared storage: a tuner killed with SIGKILL loses nothing it recorded and its rerun
repeats nothing; two tuners on one JournalStorage file split the work without losing or duplicating a record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import schedlib.search as S
from schedlib.search.database import ATTR, resolve_storage
from schedlib.search.records import COUNTED, INTERRUPTED

from .helpers import CountingReplay, matmul_table

CHILD = Path(__file__).with_name("child_tune.py")
ROOT = Path(__file__).resolve().parents[2]


def _spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(CHILD), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finished(storage: str) -> list[optuna.trial.FrozenTrial]:
    store, _ = resolve_storage(storage)
    names = optuna.get_all_study_names(store)
    if not names:
        return []
    return [t for t in optuna.load_study(study_name=names[0], storage=store).get_trials(deepcopy=False)
            if t.state.is_finished()]


def _counted(trials: list) -> dict[str, tuple[int, float | None]]:
    out = {}
    for t in trials:
        attrs = t.user_attrs.get(ATTR) or {}
        if attrs.get("status") in COUNTED:
            assert attrs["config_key"] not in out, f"config {attrs['config_key']} recorded twice"
            out[attrs["config_key"]] = (t.number, attrs.get("time_us"))
    return out


@pytest.mark.parametrize("suffix", [".sqlite3", ".journal"])
def test_kill_9_mid_run_then_resume_loses_and_repeats_nothing(tmp_path: Path, suffix: str) -> None:
    storage = str(tmp_path / f"tuning{suffix}")
    trials = 30
    child = _spawn("--storage", storage, "--trials", str(trials), "--delay", "0.15", "--strategy", "random")
    deadline = time.time() + 120
    try:
        while len(_counted(_finished(storage))) < 6:
            assert child.poll() is None, f"the tuner exited early: {child.communicate()}"
            assert time.time() < deadline, "the tuner recorded nothing within 120 s"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    before = _counted(_finished(storage))
    assert 6 <= len(before) < trials

    func, table = matmul_table(512, 512, 512)
    backend = CountingReplay(table)
    res = S.tune(func, "h100", trials=trials, strategy="random", storage=storage, backend=backend, quiet=True)

    after = _counted(_finished(storage))
    assert len(after) == trials
    assert {k: after[k] for k in before} == before, "a completed trial was lost or changed"
    remeasured = {S.config_key(c) for c in backend.measured} & set(before)
    assert not remeasured, f"recorded configs measured again: {remeasured}"
    assert len(backend.measured) == trials - len(before) == res.measured_now
    statuses = [(t.user_attrs.get(ATTR) or {}).get("status") for t in _finished(storage)]
    assert statuses.count(INTERRUPTED) <= 1  # the trial being measured at the kill, if any
    study = optuna.load_study(study_name=res.key.study_name, storage=resolve_storage(storage)[0])
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,)), "the killed trial was never closed"
    counted = res.records[res.records["status"].isin(COUNTED)]
    assert len(counted) == trials and counted["config_key"].is_unique


def test_two_tuners_share_one_journal_without_losing_or_duplicating(tmp_path: Path) -> None:
    storage = str(tmp_path / "shared.journal")
    go = tmp_path / "go"
    trials = 24
    children = [_spawn("--storage", storage, "--trials", str(trials), "--delay", "0.1", "--strategy", strategy,
                       "--seed", str(i), "--ready", str(tmp_path / f"ready{i}"), "--wait-for", str(go))
                for i, strategy in enumerate(("random", "evolutionary"))]
    try:
        deadline = time.time() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            assert all(c.poll() is None for c in children), [c.communicate() for c in children]
            assert time.time() < deadline
            time.sleep(0.02)
        go.write_text("go")
        outs = [c.communicate(timeout=180) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
    assert all(c.returncode == 0 for c in children), outs
    measured = [int(out.split("measured_now=")[1]) for out, _ in outs]
    trials_done = _finished(storage)
    counted = _counted(trials_done)  # asserts no config is recorded twice
    assert len(counted) == trials == sum(measured), (measured, len(counted))
    assert all(m > 0 for m in measured), f"one tuner did all the work: {measured}"
    workers = {(t.user_attrs.get(ATTR) or {}).get("worker") for t in trials_done}
    assert len(workers) == 2


@pytest.mark.parametrize("suffix", [".sqlite3", ".journal"])
def test_a_trial_asked_but_never_claimed_is_reaped_on_resume(tmp_path: Path, suffix: str) -> None:
    """A process killed between Optuna's ask and writing its claim leaves a RUNNING trial with no owner;
    the resumed run must close it and still reach the full budget (it once stopped one trial short)."""
    storage = str(tmp_path / f"tuning{suffix}")
    func, table = matmul_table(512, 512, 512)
    first = S.tune(func, "h100", trials=5, strategy="random", storage=storage, backend=CountingReplay(table),
                   quiet=True)
    study = optuna.load_study(study_name=first.key.study_name, storage=resolve_storage(storage)[0])
    orphan = study.ask()  # as if killed right here, before the claim
    assert ATTR not in orphan.user_attrs
    S.tune(func, "h100", trials=9, strategy="random", storage=storage, backend=CountingReplay(table), quiet=True)
    assert len(_counted(_finished(storage))) == 9
    study = optuna.load_study(study_name=first.key.study_name, storage=resolve_storage(storage)[0])
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,)), "the orphaned trial was never closed"
    reaped = study.trials[orphan.number]
    assert reaped.state == optuna.trial.TrialState.FAIL
    assert (reaped.user_attrs.get(ATTR) or {}).get("status") == INTERRUPTED
