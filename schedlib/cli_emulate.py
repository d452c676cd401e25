"""``schedlib schedule --emulate``: the checks made before a workload runs on the CPU emulator, which runs every
GPU thread on the CPU, so that a size too large is refused, or announced, before any work (apart from
:mod:`schedlib.cli` only to keep that file short)."""

from __future__ import annotations

import sys
from typing import Any

from schedlib.cli_args import UsageError

__all__ = ["EMULATE_LIMIT", "EMULATE_NOTE", "check_emulator_size", "emulation_note"]


def _note(message: str) -> None:
    print(f"schedlib: note: {message}", file=sys.stderr)


# The emulator runs every thread on the CPU: beyond this many elements in all buffers it takes hours.
EMULATE_LIMIT = 1 << 24


def check_emulator_size(func: Any) -> None:
    """Refuse (status 2) buffers too large to emulate, before any output."""
    from schedlib.report.demo import SYMBOLIC_DEFAULT

    total = 0
    for name in (*func.inputs, *func.outputs):
        n = 1
        for d in func.buffer(name).shape:
            n *= int(getattr(d, "value", SYMBOLIC_DEFAULT))
        total += n
    if total > EMULATE_LIMIT:
        raise UsageError(f"--emulate: the buffers hold {total:,} elements, more than the CPU emulator's "
                         f"{EMULATE_LIMIT:,}; pass smaller sizes (the schedule is the same rule at any size)")


# Loop iterations beyond which the CPU emulator takes long enough (~10 s and up) to say so before starting.
EMULATE_NOTE = 1 << 26


def emulation_note(spec: Any, func: Any) -> None:
    """A note on stderr before an emulation long enough to look hung, with smaller sizes to try."""
    from schedlib.ir.reference import evaluate_int
    from schedlib.report.demo import SYMBOLIC_DEFAULT

    env = dict.fromkeys(func.symbols, SYMBOLIC_DEFAULT)
    points = 0
    for blk in func.blocks:
        n = 1
        for axis in blk.axes:
            n *= evaluate_int(axis.extent, env)
        points += n
    if points <= EMULATE_NOTE:
        return
    small = spec.scaled(64).text  # the builder's default sizes are capped too
    shapes = ", ".join(f"{n}[{'x'.join(str(getattr(d, 'value', SYMBOLIC_DEFAULT)) for d in func.buffer(n).shape)}]"
                       for n in (*func.inputs, *func.outputs))
    _note(f"--emulate: {spec.text} ({shapes}) runs {points:,} loop iterations on the CPU emulator, which can take "
          f"minutes; for a quick check pass smaller sizes, e.g. {small}")
