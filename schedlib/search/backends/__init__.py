"""Measurement backends: what turns a config into a time.

``estimate`` asks the carver's analytical model (no GPU, instant), ``replay`` looks the config up in a
recording of earlier measurements (Kernel Tuner's simulation mode: compare strategies with no GPU), ``gpu``
compiles, checks and times the kernel with cupy in a worker subprocess that may crash without taking the
tuner down.  :class:`SubprocessBackend` is that worker machinery for any handler.

A backend's :attr:`~Backend.key` goes into the study name: measurements made differently never mix.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Rule
from schedlib.search.records import Measurement


class Backend(ABC):
    """Measures configs of one workload.  ``open`` is called once before the first ``measure``."""

    name: str = "backend"
    needs_schedule: bool = False  # whether measure() needs the built Schedule (else only the config)
    # whether the backend stops a hung measurement itself after ``timeout_s`` (a worker process it can kill);
    # tune runs any other backend's measure() under a watchdog when timeout_per_trial is given (see guard.py)
    enforces_timeout: bool = False

    @property
    def key(self) -> str:
        """Study-name component: backends whose measurements are interchangeable share a key."""
        return self.name

    def study_key(self, target: HardwareProfile) -> str:
        """The key of this backend's measurements on ``target``; a backend whose result depends on more
        than the device's identity (the estimate: the profile's numbers) says so here."""
        return self.key

    def open(self, func: Func, target: Any, rule: Rule) -> None:  # noqa: B027 - optional hook
        """Prepare for measuring configs of ``func`` on ``target`` (start workers, load tables)."""

    @abstractmethod
    def measure(self, config: Config, schedule: Schedule | None) -> Measurement:
        """Measure one legal config; failures come back as a failed Measurement, never as an exception."""

    def rebenchmark(self, items: list[tuple[Config, Schedule | None]]) -> list[Measurement] | None:
        """Measure the final candidates again, more carefully (None: this backend is deterministic)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release workers and devices."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key}>"


def make_backend(spec: str | Backend, timeout_s: float) -> Backend:
    """A backend from its name: ``"estimate"``, ``"gpu"``, ``"replay:<path>"``; instances pass through."""
    if isinstance(spec, Backend):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"backend={spec!r}: expected 'estimate', 'gpu', 'replay:<file>' or a Backend instance")
    text = os.fspath(spec)
    if text == "estimate":
        from schedlib.search.backends.estimate import EstimateBackend

        return EstimateBackend()
    if text == "gpu":
        from schedlib.search.backends.gpu import GpuBackend

        return GpuBackend(timeout_s=timeout_s)
    if text == "replay":
        raise ValueError("backend='replay' needs a recording: backend='replay:<file.json|.csv>' or replay=<file>")
    if text.startswith("replay:"):
        from schedlib.search.backends.replay import ReplayBackend

        return ReplayBackend(text[len("replay:"):])
    raise ValueError(f"unknown backend {text!r}; expected 'estimate', 'gpu', 'replay:<file.json|.csv>' "
                     f"or a Backend instance")


__all__ = ["Backend", "make_backend"]
