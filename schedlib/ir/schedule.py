"""The Schedule: a thin recorder over the pure primitives, and its JSON trace.

``Schedule`` holds the current Func.  Each method calls the matching pure primitive; only when that
succeeds does it swap in the new Func and append a plain-data step to the trace.  A failing primitive
therefore leaves the schedule exactly as it was.  Traces are JSON, replay through
:meth:`Schedule.from_trace`, and hash stably.
"""

from __future__ import annotations

import copy
import hashlib
import json
import numbers
from collections.abc import Iterator, Sequence
from typing import Any

from schedlib.errors import ScheduleError
from schedlib.ir import primitives as P
from schedlib.ir.func import Func
from schedlib.ir.primitives.common import get_block as _lookup_block

TRACE_VERSION = 1


class Trace:
    """An ordered list of steps ``{"primitive": name, "args": {...}, "result": ...}``."""

    def __init__(self, steps: Sequence[dict[str, Any]] = ()) -> None:
        # Checked here, not only on replay, so printing or hashing a malformed trace fails clearly too.
        for k, s in enumerate(steps):
            if not isinstance(s, dict):
                raise ScheduleError("from_trace", f"steps[{k}]", s, "must be an object with primitive/args/result")
            if not isinstance(s.get("primitive"), str):
                raise ScheduleError("from_trace", f"steps[{k}].primitive", s.get("primitive"),
                                    "must be the name of a primitive (a string)")
            if not isinstance(s.get("args"), dict):
                raise ScheduleError("from_trace", f"steps[{k}].args", s.get("args"), "must be an object")
        self.steps: list[dict[str, Any]] = [dict(s) for s in steps]
        # Which rule and config made the schedule (None for a hand-written one): saved with the steps so a
        # replayed rule schedule still says where it came from.  Not part of the digest or equality, which
        # are about what the steps build.
        self.rule: str | None = None
        self.config: dict[str, Any] | None = None

    def append(self, primitive: str, args: dict[str, Any], result: Any) -> None:
        self.steps.append({"primitive": primitive, "args": args, "result": result})

    def to_json(self, indent: int | None = None) -> str:
        data: dict[str, Any] = {"version": TRACE_VERSION, "steps": self.steps}
        if self.rule is not None or self.config is not None:
            data.update(rule=self.rule, config=self.config)
        return json.dumps(data, indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Trace:
        if not isinstance(text, (str, bytes, bytearray)):
            raise ScheduleError("from_trace", "trace", text, "must be JSON text (str)")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ScheduleError("from_trace", "trace", text[:60], f"is not valid JSON ({exc})") from None
        except RecursionError:
            raise ScheduleError("from_trace", "trace", text[:60], "is nested too deeply to be a trace") from None
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise ScheduleError("from_trace", "trace", text[:60], "must be an object with a 'steps' list")
        version = data.get("version")
        # ``True == 1`` and ``1.0 == 1`` in Python, so the type is checked as well as the value.
        if type(version) is not int or version != TRACE_VERSION:
            raise ScheduleError("from_trace", "version", version,
                                f"this schedlib reads trace version {TRACE_VERSION}")
        trace = cls(data["steps"])
        rule, config = data.get("rule"), data.get("config")
        if rule is not None and not isinstance(rule, str):
            raise ScheduleError("from_trace", "rule", rule, "must be a rule name (str), or absent")
        if config is not None and not is_knob_values(config):
            raise ScheduleError("from_trace", "config", config, "must be an object of knob values (str, int, "
                                "float or bool, as a rule's schedule saves them), or absent")
        trace.rule, trace.config = rule, None if config is None else dict(config)
        return trace

    def _steps_json(self) -> str:
        return json.dumps({"version": TRACE_VERSION, "steps": self.steps}, sort_keys=True)

    def digest(self) -> str:
        """A stable content hash (hex) of the steps (not of the rule and config that chose them)."""
        return hashlib.sha256(self._steps_json().encode()).hexdigest()

    def __hash__(self) -> int:
        return int(self.digest()[:16], 16)

    def __eq__(self, other: object) -> bool:
        # By the JSON text, as the hash: Python's ``True == 1`` would make steps that replay differently equal.
        return isinstance(other, Trace) and self._steps_json() == other._steps_json()

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.steps)

    def __str__(self) -> str:
        lines = []
        for s in self.steps:
            args = ", ".join(f"{k}={v!r}" for k, v in s["args"].items())
            res = f" -> {s['result']!r}" if s.get("result") is not None else ""
            lines.append(f"{s['primitive']}({args}){res}")
        return "\n".join(lines)


def is_knob_values(config: Any) -> bool:
    """A config a trace can keep: a dict of names to str, int, float or bool values."""
    return isinstance(config, dict) and all(isinstance(k, str) and isinstance(v, (str, int, float, bool))
                                            for k, v in config.items())


class Schedule:
    """Records primitives applied to a Func.  ``rule``/``config`` are set by whoever chose the schedule."""

    def __init__(self, func: Func) -> None:
        if not isinstance(func, Func):
            raise ScheduleError("Schedule", "func", func,
                                f"Schedule needs a Func (from sl.func or sl.workloads), got {type(func).__name__}")
        self.original = func
        self.func = func
        self.trace = Trace()

    @property
    def rule(self) -> str | None:
        """The rule that chose this schedule (None: written by hand); kept in the trace."""
        return self.trace.rule

    @rule.setter
    def rule(self, name: str | None) -> None:
        if name is not None and not isinstance(name, str):
            raise ScheduleError("Schedule.rule", "rule", name, "must be a rule name (str) or None")
        self.trace.rule = name

    @property
    def config(self) -> dict[str, Any] | None:
        """The rule's knob values for this schedule; kept in the trace."""
        return self.trace.config

    @config.setter
    def config(self, values: dict[str, Any] | None) -> None:
        # checked as from_trace reads it, so that every trace written can be read back
        if values is not None and not is_knob_values(values):
            raise ScheduleError("Schedule.config", "config", values, "must be a dict of knob values (str, int, "
                                "float or bool) or None")
        self.trace.config = values

    # recording --------------------------------------------------------------------------------
    def _apply(self, primitive: str, **args: Any) -> Any:
        args = {k: _plain_ints(v) for k, v in args.items()}
        new, result = P.PRIMITIVES[primitive](self.func, **args)
        self.func = new
        # The trace keeps its own copies: a caller changing its factor list, or the loop-name list it got
        # back, afterwards must not rewrite the history (the replay would then differ).
        plain = {k: list(v) if isinstance(v, tuple) else copy.deepcopy(v) for k, v in args.items()}
        self.trace.append(primitive, plain, copy.deepcopy(result))
        return result

    def copy(self) -> Schedule:
        other = Schedule(self.original)
        other.func = self.func
        other.trace = Trace(self.trace.steps)
        other.rule, other.config = self.rule, None if self.config is None else dict(self.config)
        return other

    @classmethod
    def from_trace(cls, func: Func, trace: str | Trace) -> Schedule:
        """Replay a trace (JSON text or Trace) on ``func``; raises ScheduleError if it does not apply."""
        if not isinstance(trace, (str, bytes, bytearray, Trace)):
            raise ScheduleError("from_trace", "trace", trace, "must be JSON text or a Trace")
        # A Trace's steps list may have been edited since it was built, so it is checked again.
        steps = Trace(trace.steps) if isinstance(trace, Trace) else Trace.from_json(trace)
        sch = cls(func)
        for k, step in enumerate(steps):
            name = step.get("primitive")
            if name not in P.PRIMITIVES:
                raise ScheduleError("from_trace", f"steps[{k}].primitive", name, "unknown primitive")
            args = step["args"]
            try:
                result = sch._apply(name, **args)
            except TypeError as exc:
                raise ScheduleError("from_trace", f"steps[{k}].args", args, str(exc)) from None
            expected = step.get("result")
            if isinstance(result, tuple):
                result = list(result)
            if "result" in step and expected != result:
                raise ScheduleError("from_trace", f"steps[{k}].result", expected,
                                    f"replay produced {result!r}; the func differs from the recorded one")
        source = trace if isinstance(trace, Trace) else steps
        sch.rule, sch.config = source.rule, None if source.config is None else dict(source.config)
        return sch

    # lookups ----------------------------------------------------------------------------------
    def get_block(self, name: str) -> str:
        """Return ``name`` if the func has such a block (ScheduleError otherwise)."""
        return _lookup_block(self.func, "get_block", name, "name").name

    def get_loops(self, block: str) -> list[str]:
        """Names of the loops ``block`` owns, outermost first."""
        return [lp.name for lp in _lookup_block(self.func, "get_loops", block).loops]

    @property
    def blocks(self) -> list[str]:
        return [b.name for b in self.func.blocks]

    # primitives -------------------------------------------------------------------------------
    def split(self, loop: str, factors: Sequence[int | None]) -> list[str]:
        return self._apply("split", loop=loop, factors=list(factors) if isinstance(factors, tuple) else factors)

    def fuse(self, *loops: str) -> str:
        return self._apply("fuse", loops=_loop_list(loops))

    def reorder(self, *loops: str) -> None:
        self._apply("reorder", loops=_loop_list(loops))

    def bind(self, loop: str, thread: str) -> None:
        self._apply("bind", loop=loop, thread=thread)

    def vectorize(self, loop: str) -> None:
        self._apply("vectorize", loop=loop)

    def unroll(self, loop: str) -> None:
        self._apply("unroll", loop=loop)

    def annotate(self, target: str, key: str, value: Any) -> None:
        self._apply("annotate", target=target, key=key, value=value)

    def storage_align(self, block: str, dim: int, factor: int, offset: int) -> None:
        self._apply("storage_align", block=block, dim=dim, factor=factor, offset=offset)

    def storage_permute(self, block: str, dim: int, factors: Sequence[int], order: Sequence[int]) -> None:
        # Passed as given: the primitive names a non-list argument itself (list("48") would split a string).
        self._apply("storage_permute", block=block, dim=dim, factors=factors, order=order)

    def cache_read(self, block: str, buffer: str | int, scope: str, consumers: Sequence[str] | None = None,
                   occurrence: int | None = None) -> str:
        extra: dict[str, Any] = {}  # traces of single-reader, every-load copies keep their old form
        if consumers is not None:
            extra["consumers"] = list(consumers) if isinstance(consumers, tuple) else consumers
        if occurrence is not None:
            extra["occurrence"] = occurrence
        return self._apply("cache_read", block=block, buffer=buffer, scope=scope, **extra)

    def double_buffer(self, block: str) -> None:
        self._apply("double_buffer", block=block)

    def cache_write(self, block: str, scope: str, consumers: Sequence[str] | None = None) -> str:
        extra: dict[str, Any] = {}  # traces without consumers keep their old form
        if consumers is not None:
            extra["consumers"] = list(consumers) if isinstance(consumers, tuple) else consumers
        return self._apply("cache_write", block=block, scope=scope, **extra)

    def compute_at(self, block: str, loop: str) -> None:
        self._apply("compute_at", block=block, loop=loop)

    def reverse_compute_at(self, block: str, loop: str) -> None:
        self._apply("reverse_compute_at", block=block, loop=loop)

    def compute_with(self, block: str, loop: str) -> None:
        self._apply("compute_with", block=block, loop=loop)

    def compute_inline(self, block: str) -> None:
        self._apply("compute_inline", block=block)

    def reverse_compute_inline(self, block: str) -> None:
        self._apply("reverse_compute_inline", block=block)

    def rfactor(self, loop: str, factor_axis: int = 0) -> str:
        return self._apply("rfactor", loop=loop, factor_axis=factor_axis)

    def decompose_reduction(self, block: str, loop: str) -> str:
        return self._apply("decompose_reduction", block=block, loop=loop)

    def __str__(self) -> str:
        return str(self.func)

    def __repr__(self) -> str:
        return f"<Schedule {self.func.name}: {len(self.trace)} steps, rule={self.rule}>"


# The methods show the same before/after loop nests as the pure primitives they record.
for _name, _fn in P.PRIMITIVES.items():
    getattr(Schedule, _name).__doc__ = _fn.__doc__


def _plain_ints(value: Any) -> Any:
    """numpy's integer scalars (a shape entry, a factor from an array) as Python ints, in lists too: the
    primitives check for int, and the trace must stay JSON."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_ints(v) for v in value)
    return value


def _loop_list(loops: tuple[Any, ...]) -> list[Any]:
    """``fuse("a", "b")`` or, as users also write it, ``fuse(["a", "b"])``."""
    if len(loops) == 1 and isinstance(loops[0], (list, tuple)):
        return list(loops[0])
    return list(loops)
