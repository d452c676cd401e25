"""The error family of schedlib.

Every error a user can provoke derives from :class:`SchedlibError`, so callers can catch one type.
Each error names *what* failed (a primitive, a file, a kernel), the offending argument and its value.
"""

from __future__ import annotations

from typing import Any


class SchedlibError(Exception):
    """Base class of every error raised on purpose by schedlib."""


class ScheduleError(SchedlibError):
    """A schedule primitive refused its arguments; the schedule is left exactly as it was.

    ``primitive``, ``argument`` and ``value`` are kept as attributes so tools can react to them.
    """

    def __init__(self, primitive: str, argument: str, value: Any, reason: str) -> None:
        self.primitive = primitive
        self.argument = argument
        self.value = value
        self.reason = reason
        super().__init__(f"{primitive}: argument {argument}={value!r}: {reason}")


class IRError(SchedlibError):
    """A compute definition is malformed (bad shape, bad dtype, unknown tensor, ...)."""


class BuildError(SchedlibError):
    """A scheduled Func cannot be turned into a kernel (unsupported structure, bad target)."""


class ProfileError(SchedlibError):
    """A hardware profile file is missing, unreadable or invalid: names the file, field and value."""


class EmulatorError(SchedlibError):
    """The CPU emulator failed: compile error, deadlock at a barrier, or an out-of-bounds access."""


class CompileError(SchedlibError):
    """nvcc or NVRTC rejected a kernel; carries the compiler log."""


class ShapeError(SchedlibError, ValueError):
    """Arrays given to a Func or kernel do not match its declared inputs (name, rank, shape or dtype)."""


class ExecutionError(SchedlibError):
    """The reference executor found the loop nest reading or writing outside a buffer."""
