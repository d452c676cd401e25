"""Measuring one config so that a misbehaving backend costs one trial, not the search.

:meth:`Backend.measure` promises to report failures as a failed :class:`Measurement`, but nothing makes a
user's backend keep that promise.  Why it matters: an exception out of ``measure`` used to abort ``tune``, and
the trial ended as ``interrupted`` - not a record - so the same config was proposed first on every rerun and
aborted it again.  Here an exception (or a result that is not a Measurement) becomes an ``error`` record, so
the search goes on and the config is never measured again.  ``BaseException`` (Ctrl-C, SystemExit) is not
caught: it still abandons the trial, which stays measurable.

Hangs: a worker backend (:class:`~schedlib.search.backends.worker.SubprocessBackend`) kills its worker after
``timeout_s``.  An in-process backend cannot be killed, so an explicit ``timeout_per_trial`` runs its
``measure`` in a watchdog thread.  A call that outlives the limit is recorded as a ``timeout`` and tuning then
stops with :class:`InProcessTimeoutError`: a Python thread cannot be stopped, and measuring the next config
next to a call that is still running (on the same backend object, maybe the same device) would be neither
safe nor a fair timing.  A rerun skips the recorded config.
"""

from __future__ import annotations

import threading

from schedlib.errors import SchedlibError
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config
from schedlib.search.backends import Backend
from schedlib.search.records import RECORDS, Measurement

HUNG = "InProcessTimeout"  # error_type of a timeout the watchdog recorded (the tuner stops on it)


class InProcessTimeoutError(SchedlibError):
    """An in-process backend's measure() outlived ``timeout_per_trial``; it was recorded, tuning stopped."""


def _checked(backend: Backend, config: Config, schedule: Schedule | None) -> Measurement:
    try:
        m = backend.measure(config, schedule)
    except Exception as exc:  # the backend broke its contract: a typed failure, never an aborted search
        return Measurement.failure("error", type(exc).__name__, f"{backend!r}.measure raised: {exc}")
    if not isinstance(m, Measurement):
        return Measurement.failure("error", "ProtocolError",
                                   f"{backend!r}.measure returned {type(m).__name__}, not a Measurement")
    if not isinstance(m.status, str) or m.status not in RECORDS:  # a list status is unhashable
        # A bookkeeping status (interrupted, cached, duplicate) or an unknown one is not a record: the config
        # would stay untaken and unbudgeted, so the strategy proposed it again and tune looped forever.  The
        # worker path (measurement_from_reply) already turns such statuses into an error record.
        return Measurement.failure("error", "ProtocolError",
                                   f"{backend!r}.measure returned status {str(m.status)[:100]!r}, not ok or a "
                                   f"measured failure")
    return m


def guarded_measure(backend: Backend, config: Config, schedule: Schedule | None,
                    timeout_s: float | None = None) -> Measurement:
    """``backend.measure(config, schedule)`` with exceptions turned into failures; with ``timeout_s``, under a
    watchdog thread (a call past it is a ``timeout`` failure whose error_type is :data:`HUNG`)."""
    if timeout_s is None:
        return _checked(backend, config, schedule)
    box: list[Measurement] = []
    # daemon: a call that never returns must not keep the interpreter from exiting
    thread = threading.Thread(target=lambda: box.append(_checked(backend, config, schedule)),
                              name="schedlib-measure", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return Measurement.failure("timeout", HUNG, f"{backend!r}.measure did not return within {timeout_s:g} s "
                                   f"(timeout_per_trial); it runs in this process and cannot be stopped",
                                   wall_s=float(timeout_s))
    if not box:  # the thread ended by a BaseException (SystemExit) that _checked leaves alone
        return Measurement.failure("error", "ProtocolError", f"{backend!r}.measure ended without a result")
    return box[0]
