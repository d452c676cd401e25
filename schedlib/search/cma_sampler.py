"""Optuna's CMA-ES sampler with its state kept in memory, never read back from storage.

Optuna's ``CmaEsSampler`` saves its optimizer after each generation as a pickle (hex-encoded, split over
trial attributes) and unpickles the newest one when a study resumes.  A pickle runs code when loaded, so a
tampered tuning database would run whatever it holds.  This sampler stores a token in place of the pickle and
keeps the optimizer it stands for in memory: a study resumed in a new process starts a fresh CMA-ES state
(the measured trials stay in the study; the search only re-adapts its distribution), and no attribute read
from disk is ever unpickled.
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any

import optuna

# Optuna's private hooks this relies on: checked at construction, so that an Optuna without them fails loudly
# instead of falling back to unpickling what the storage holds.
HOOKS = ("_restore_optimizer", "_split_optimizer_str", "_attr_key_optimizer")
TOKEN_PREFIX = "schedlib-in-memory:"


class InMemoryCmaEsSampler(optuna.samplers.CmaEsSampler):
    """``CmaEsSampler`` whose optimizer state never leaves the process (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        missing = [h for h in HOOKS if not hasattr(optuna.samplers.CmaEsSampler, h)]
        if missing:
            raise RuntimeError(f"strategy 'cmaes': Optuna {optuna.__version__}'s CmaEsSampler lacks {missing}, "
                               "which keep its state off the disk; use another strategy or Optuna 3.5-5.x")
        super().__init__(**kwargs)
        self._states: dict[str, str] = {}  # token -> the optimizer this process pickled itself

    def _split_optimizer_str(self, optimizer_str: str) -> dict[str, str]:
        token = TOKEN_PREFIX + uuid.uuid4().hex
        self._states = {token: optimizer_str}  # the newest is the one a restore looks for first
        return {f"{self._attr_key_optimizer}:0": token}

    def _restore_optimizer(self, completed_trials: list[optuna.trial.FrozenTrial]) -> Any:
        for trial in reversed(completed_trials):
            token = trial.system_attrs.get(f"{self._attr_key_optimizer}:0")
            if isinstance(token, str) and token in self._states:
                # bytes this process produced from its own optimizer: nothing from storage is unpickled
                return pickle.loads(bytes.fromhex(self._states[token]))
        return None
