"""A measuring-worker handler that misbehaves on purpose, keyed by the toy rule's knob ``a``:
a=0 aborts (SIGABRT), a=1 dereferences a null pointer (SIGSEGV), a=2 raises, a=3 with b=0 hangs; every other
config answers ``toy_time``.  Runs inside the worker process started by SubprocessBackend."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any


class FaultyHandler:
    def __init__(self, init: dict[str, Any]) -> None:
        self.info = {"device": "faulty test device", "pid": os.getpid()}
        self.faults = init.get("faults", True)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        c = request["config"]
        if self.faults and c["b"] == 2:
            if c["a"] == 0:
                os.abort()
            if c["a"] == 1:
                ctypes.string_at(0)  # null dereference: SIGSEGV
            if c["a"] == 2:
                raise RuntimeError(f"simulated failure for {c}")
            if c["a"] == 3:
                time.sleep(3600)
        t = 10.0 + (c["a"] - 2) ** 2 * 3 + abs(c["b"] - 1) * 2 + c["c"]
        return {"status": "ok", "times_us": [t, t * 1.01, t * 0.99], "figures": {"pid": os.getpid()}}
