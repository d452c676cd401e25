"""Measuring in a worker subprocess, so that a kernel that crashes, faults or hangs costs one trial only.

Why a process: an illegal memory access poisons the CUDA context for good, a segfault in a driver or an
emulated kernel kills the process, and a hung kernel never returns.  The worker is a fresh interpreter
(``python -c ...worker_main``: the semantics of multiprocessing's ``spawn`` - no forked
CUDA state - without re-importing the caller's ``__main__``, so ``tune`` works from scripts that lack an
``if __name__ == "__main__"`` guard).  Parent and worker exchange JSON text over a socket pair - never
pickles - so nothing the worker sends can execute code in the tuner.  When the worker dies, hangs past the
timeout or reports a fatal fault, the trial is recorded as a typed failure, the worker is killed, and the
next trial starts a fresh one.

A handler is named ``"package.module:Class"``; the worker imports it, builds it from the JSON ``init``
message and answers each request with ``handler.handle(request) -> dict``.  A reply with
``"restart": true`` makes the worker exit after answering (the context is unusable).  POSIX only.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from schedlib.errors import SchedlibError
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Rule
from schedlib.search.backends import Backend
from schedlib.search.records import MEASURED_FAILURES, OK, Measurement

STARTUP_TIMEOUT_S = 300.0  # imports plus the handler's setup (e.g. computing the reference output)
_ENTRY = ("import sys; from multiprocessing.connection import Connection; "
          "from schedlib.search.backends.worker import worker_main; "
          "worker_main(Connection(int(sys.argv[1])), sys.argv[2])")


class WorkerSetupError(SchedlibError):
    """The measuring worker could not start or set up (so no trial could be measured)."""


def _send(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message, allow_nan=True).encode())


def _recv(conn: Connection) -> dict[str, Any]:
    data = json.loads(conn.recv_bytes().decode())
    if not isinstance(data, dict):
        raise ValueError(f"worker protocol: expected a JSON object, got {type(data).__name__}")
    return data


def _error_reply(exc: BaseException) -> dict[str, Any]:
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    return {"status": "error", "error_type": type(exc).__name__, "error": f"{exc}\n{tail}"[:4000]}


def worker_main(conn: Connection, handler_path: str) -> None:
    """The worker's loop: build the handler from the first (init) message, then answer requests."""
    import faulthandler

    faulthandler.enable()  # a segfault leaves a Python traceback on stderr
    try:
        init = _recv(conn)
        module_name, _, attr = handler_path.partition(":")
        handler = getattr(importlib.import_module(module_name), attr)(init)
    except BaseException as exc:
        _send(conn, {"ready": False, **_error_reply(exc)})
        return
    _send(conn, {"ready": True, "info": dict(getattr(handler, "info", {}) or {})})
    while True:
        try:
            request = _recv(conn)
        except (EOFError, OSError):
            return
        if request.get("op") == "exit":
            return
        try:
            reply = handler.handle(request)
            if not isinstance(reply, dict):
                raise TypeError(f"handler {handler_path} returned a {type(reply).__name__}, not a dict")
            text = json.dumps(reply, allow_nan=True)  # here: an unsendable reply is the handler's error
        except Exception as exc:
            reply = _error_reply(exc)
            text = json.dumps(reply)
        conn.send_bytes(text.encode())
        if reply.get("restart"):
            return


def _death(process: subprocess.Popen) -> str:
    try:
        code = process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "worker stopped answering"
    if code < 0:
        try:
            return f"worker died from signal {signal.Signals(-code).name}"
        except ValueError:
            return f"worker died from signal {-code}"
    return f"worker exited with code {code}"


class WorkerProcess:
    """One worker interpreter running ``handler``; restarted transparently after a fault."""

    def __init__(self, handler: str, init: dict[str, Any], startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.handler, self.init, self.startup_timeout_s = handler, init, startup_timeout_s
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self.starts = 0
        self.info: dict[str, Any] = {}  # what the handler reported at start (e.g. the device name)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        mine, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # what spawn does: the parent's path
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _ENTRY, str(theirs.fileno()), self.handler],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._conn = Connection(mine.detach())
        self.starts += 1
        try:
            _send(self._conn, self.init)
            ready = self._conn.poll(self.startup_timeout_s)
            hello = _recv(self._conn) if ready else None
        except (EOFError, OSError):
            why = _death(self._process)
            self.kill()
            raise WorkerSetupError(f"measuring worker {self.handler} died while starting: {why}") from None
        if hello is None:
            self.kill()
            raise WorkerSetupError(f"measuring worker {self.handler} did not become ready within "
                                   f"{self.startup_timeout_s:.0f} s")
        if not hello.get("ready"):
            self.kill()
            raise WorkerSetupError(f"measuring worker {self.handler} failed to set up: "
                                   f"{hello.get('error_type')}: {hello.get('error')}")
        self.info = hello.get("info") or {}

    def kill(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request; a hang, a death or a fatal fault comes back as a failure reply."""
        if not self.alive:
            self.kill()
            self.start()
        assert self._conn is not None and self._process is not None
        try:
            _send(self._conn, message)
            if not self._conn.poll(timeout_s):
                self.kill()
                return {"status": "timeout", "error_type": "Timeout",
                        "error": f"no answer within {timeout_s:g} s; the worker was killed"}
            reply = _recv(self._conn)
        except (EOFError, OSError):
            why = _death(self._process)
            self.kill()
            return {"status": "crash", "error_type": "WorkerCrash", "error": why}
        except ValueError as exc:  # not JSON, not UTF-8, not an object: the worker no longer speaks the protocol
            self.kill()  # a fresh worker answers the next request, in step
            return {"status": "error", "error_type": "ProtocolError",
                    "error": f"unreadable reply from worker {self.handler} ({exc}); the worker was restarted"}
        if reply.get("restart"):
            self.kill()
        return reply

    def close(self) -> None:
        if self.alive and self._conn is not None and self._process is not None:
            try:
                _send(self._conn, {"op": "exit"})
                self._process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def _number(value: Any) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)


def _reply_times(reply: dict[str, Any]) -> list[float] | str:
    """The timings of an ok reply (``times_us``, or a single ``time_us``), or why there are none."""
    raw = reply.get("times_us")
    if raw is None:
        raw = [reply.get("time_us")]
    if not isinstance(raw, list) or not raw:
        return f"times_us={raw!r} is not a non-empty list"
    times = [_number(t) for t in raw]
    if any(t is None or not math.isfinite(t) or t < 0 for t in times):
        return f"timings must be finite numbers >= 0, got {raw[:8]!r}"
    return times  # type: ignore[return-value]  (no None left)


def measurement_from_reply(reply: Any, wall_s: float) -> Measurement:
    """The worker's JSON answer as a Measurement.  Never raises: a reply that breaks the protocol (not an
    object, an ok without valid timings) is an ``error`` record of type ProtocolError, unknown statuses are
    ``error``, so one misbehaving handler costs one trial, never the search."""
    if not isinstance(reply, dict):
        return Measurement.failure("error", "ProtocolError", f"the reply is a {type(reply).__name__}, not an "
                                   f"object: {str(reply)[:200]}", wall_s)
    status = reply.get("status")
    if status == OK:
        raw_figures = reply.get("figures")
        figures = {str(k): v for k, v in raw_figures.items() if _number(v) is not None and math.isfinite(v)
                   } if isinstance(raw_figures, dict) else {}
        times = _reply_times(reply)
        if isinstance(times, str):
            return Measurement.failure("error", "ProtocolError", f"ok reply without valid times: {times}", wall_s)
        # A 0.0 reading is what CUDA events give a kernel shorter than their resolution (about 0.5 us), not a
        # time: clamping it to a tiny positive value would make the config "the fastest" by an artefact of the
        # timer, so the config is recorded as an error that says why instead.
        if 0.0 in times:
            return Measurement.failure("error", "BelowTimerResolution", f"{times.count(0.0)} of {len(times)} "
                                       f"timings read 0.0 us: the kernel ran faster than the timer resolves, so "
                                       f"its time is unknown", wall_s)
        if reply.get("times_us") is not None:
            return Measurement.from_times(times, wall_s, **figures)
        t = times[0]  # one summarised time, with its spread when the handler gives a usable one
        p20, p80 = _number(reply.get("p20_us", t)), _number(reply.get("p80_us", t))
        return Measurement(OK, t, p20 if p20 is not None and 0 < p20 <= t else t,
                           p80 if p80 is not None and t <= p80 < math.inf else t, wall_s=wall_s, figures=figures)
    error_type, error = reply.get("error_type"), str(reply.get("error") or "")
    if not (isinstance(status, str) and status in MEASURED_FAILURES):
        if error_type is None:  # nothing says what went wrong: the status itself is the fault
            error_type, error = "ProtocolError", error or f"unknown status {str(status)[:100]!r} in the reply"
        status = "error"
    return Measurement.failure(status, None if error_type is None else str(error_type)[:200], error, wall_s)


class SubprocessBackend(Backend):
    """Measures each config by a request to a worker process running ``handler``.

    The request is ``{"op": "measure", "config": ..., **payload(config, schedule)}``; subclasses add what the
    handler needs (the GPU backend sends the kernel source and launch geometry).
    """

    name = "subprocess"
    enforces_timeout = True  # the worker is killed after timeout_s

    def __init__(self, handler: str, *, init: dict[str, Any] | None = None, timeout_s: float = 30.0,
                 key: str | None = None) -> None:
        self.handler, self.timeout_s = handler, timeout_s
        self._init = dict(init or {})
        self._key = key or f"subprocess-{handler.rsplit(':', 1)[-1].lower()}"
        self.worker: WorkerProcess | None = None

    @property
    def key(self) -> str:
        return self._key

    def init_message(self, func: Func, target: Any, rule: Rule) -> dict[str, Any]:
        return self._init

    def payload(self, config: Config, schedule: Schedule | None) -> dict[str, Any]:
        return {}

    def open(self, func: Func, target: Any, rule: Rule) -> None:
        self.worker = WorkerProcess(self.handler, self.init_message(func, target, rule))
        self.worker.start()

    def request(self, message: dict[str, Any]) -> Measurement:
        if self.worker is None:
            raise RuntimeError(f"{type(self).__name__}.measure called before open()")
        start = time.perf_counter()
        reply = self.worker.request(message, self.timeout_s)
        return measurement_from_reply(reply, time.perf_counter() - start)

    def measure(self, config: Config, schedule: Schedule | None) -> Measurement:
        try:
            payload = self.payload(config, schedule)
        except Exception as exc:
            status = "build_error" if type(exc).__name__ in ("BuildError", "ShapeError") else "error"
            return Measurement.failure(status, type(exc).__name__, str(exc))
        return self.request({"op": "measure", "config": config, **payload})

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

