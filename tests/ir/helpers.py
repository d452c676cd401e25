"""Shared helpers of the IR tests: random inputs, result comparison, and rejection checks."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.dtype import is_float, numpy_dtype
from schedlib.ir.func import Func
from schedlib.ir.reference import evaluate_int


def input_shapes(func: Func, symbols: Mapping[str, int] | None = None) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every input of ``func`` with its symbolic dimensions set to ``symbols``."""
    env = dict(symbols or {})
    missing = [s for s in func.symbols if s not in env]
    if missing:
        raise ValueError(f"no value given for symbolic dimension(s) {missing}")
    return {name: tuple(evaluate_int(d, env) for d in func.buffer(name).shape) for name in func.inputs}


def random_inputs(func: Func, rng: np.random.Generator, symbols: Mapping[str, int] | None = None
                  ) -> dict[str, np.ndarray]:
    """Fresh random arrays for every input: normal floats, small integers (no overflow), random bools."""
    out: dict[str, np.ndarray] = {}
    for name, shape in input_shapes(func, symbols).items():
        dtype = func.buffer(name).dtype
        if is_float(dtype):
            arr = rng.standard_normal(shape).astype(numpy_dtype(dtype))
        elif dtype == "bool":
            arr = rng.integers(0, 2, shape).astype(bool)
        else:
            arr = rng.integers(-4, 5, shape).astype(numpy_dtype(dtype))
        out[name] = arr
    return out


def tolerance(func: Func, name: str) -> tuple[float, float]:
    """(rtol, atol) for comparing output ``name`` of two schedules of ``func`` (reordered float sums)."""
    dtype = func.buffer(name).dtype
    if dtype in ("float16", "bfloat16"):
        return 2e-2, 2e-2
    return 1e-4, 1e-4


def outputs_match(func: Func, expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> str | None:
    """None if every output agrees (bit-identical for integers, allclose for floats), else a description."""
    for name in func.outputs:
        a, b = np.asarray(expected[name]), np.asarray(got[name])
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{name}: shape/dtype {b.shape}/{b.dtype}, expected {a.shape}/{a.dtype}"
        if is_float(func.buffer(name).dtype):
            rtol, atol = tolerance(func, name)
            if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=False):
                bad = ~np.isclose(a, b, rtol=rtol, atol=atol)
                return f"{name}: {int(bad.sum())} of {a.size} elements differ, e.g. {b[bad][:3]} vs {a[bad][:3]}"
        elif not np.array_equal(a, b):
            return f"{name}: integer results differ at {int((a != b).sum())} of {a.size} elements"
    return None


def assert_same_result(original: Func, scheduled: Func | sl.Schedule, seed: int = 0,
                       symbols: Mapping[str, int] | None = None) -> None:
    """Run both funcs on the same fresh random inputs and compare every output."""
    inputs = random_inputs(original, np.random.default_rng(seed), symbols)
    expected = sl.run_reference(original, inputs)
    got = sl.run_reference(scheduled, inputs)
    problem = outputs_match(original, expected, got)
    assert problem is None, problem


def assert_rejected(s: sl.Schedule, action: Callable[[], Any], primitive: str, argument: str, value: Any,
                    reason: str | None = None) -> sl.ScheduleError:
    """``action`` must raise ScheduleError naming primitive/argument/value and leave ``s`` untouched."""
    before, steps, text = s.func, len(s.trace), str(s.func)
    with pytest.raises(sl.ScheduleError) as info:
        action()
    err = info.value
    assert err.primitive == primitive, err
    assert err.argument == argument, err
    same_nan = isinstance(value, float) and math.isnan(value) and math.isnan(err.value)
    assert same_nan or err.value == value, err
    message = str(err)
    assert message.startswith(f"{primitive}: argument {argument}={value!r}: "), message
    if reason is not None:
        assert reason in message, message
    assert s.func is before
    assert len(s.trace) == steps
    assert str(s.func) == text
    return err


def loop_nest(s: sl.Schedule | Func) -> str:
    """The printed func without its signature line (the part the goldens compare)."""
    func = s.func if isinstance(s, sl.Schedule) else s
    return textwrap.dedent("\n".join(str(func).splitlines()[1:]))


def well_formed_problems(func: Func) -> list[str]:
    """Structural invariants every primitive must keep; an empty list when all hold."""
    from schedlib.ir.simplify import free_vars

    problems: list[str] = []
    blocks = [b.name for b in func.blocks]
    buffers = [b.name for b in func.buffers]
    loops = [lp.name for b in func.blocks for lp in b.loops]
    for kind, names in (("block", blocks), ("buffer", buffers), ("loop", loops)):
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            problems.append(f"duplicate {kind} names {dup}")
    for name in (*func.inputs, *func.outputs):
        if name not in buffers:
            problems.append(f"input/output {name} has no buffer")
    for blk in func.blocks:
        if blk.attach is not None:
            if blk.attach.block not in blocks:
                problems.append(f"{blk.name} attached to missing block {blk.attach.block}")
                continue
            host = func.block(blk.attach.block)
            if blk.attach.loop not in [lp.name for lp in host.loops]:
                problems.append(f"{blk.name} attached to missing loop {blk.attach.loop}")
                continue
        if blk.store not in buffers or blk.store in func.inputs:
            problems.append(f"{blk.name} stores {blk.store}, which is missing or an input")
        for ld in blk.reads:
            if ld.buffer not in buffers:
                problems.append(f"{blk.name} reads missing buffer {ld.buffer}")
            elif len(ld.indices) != len(func.buffer(ld.buffer).shape):
                problems.append(f"{blk.name} reads {ld.buffer} with {len(ld.indices)} indices")
        if blk.store in buffers and len(blk.store_indices) != len(func.buffer(blk.store).shape):
            problems.append(f"{blk.name} stores {blk.store} with {len(blk.store_indices)} indices")
        in_scope = {lp.name for lp in func.all_loops(blk)} | set(func.symbols)
        for b in blk.bindings:
            if not free_vars(b) <= in_scope:
                problems.append(f"{blk.name}: binding {b} uses unbound {sorted(free_vars(b) - in_scope)}")
        with_axes = in_scope | {a.name for a in blk.axes}
        exprs = [*blk.store_indices, blk.value, *(x for x in (blk.init, blk.predicate) if x is not None)]
        for e in exprs:
            if not free_vars(e) <= with_axes:
                problems.append(f"{blk.name}: {e} uses unbound {sorted(free_vars(e) - with_axes)}")
    return problems


@dataclass(frozen=True)
class Reject:
    """One error path: build a schedule, call a primitive that must refuse, and what the error must name."""

    id: str
    make: Callable[[], sl.Schedule]
    call: Callable[[sl.Schedule], Any]
    primitive: str
    argument: str
    value: Any
    reason: str

    def check(self) -> sl.ScheduleError:
        s = self.make()
        return assert_rejected(s, lambda: self.call(s), self.primitive, self.argument, self.value, self.reason)


def schedule(func: Func, *steps: Callable[[sl.Schedule], Any]) -> sl.Schedule:
    """A Schedule of ``func`` with ``steps`` applied (each a function of the schedule)."""
    s = sl.Schedule(func)
    for step in steps:
        step(s)
    return s


def vector_func(n: Any = 40, dtype: str = "float32") -> Func:
    """``C[i] = A[i] * 2``: the smallest func, for goldens."""
    A = sl.placeholder((n,), dtype, "A")
    C = sl.compute((n,), lambda i: A[i] * 2.0, "C")
    return sl.func([A, C], "scale")


def chain_func(n: Any = 8) -> Func:
    """``B = A * 2; C = B + 1`` over a vector: a producer/consumer pair."""
    A = sl.placeholder((n,), "float32", "A")
    B = sl.compute((n,), lambda i: A[i] * 2.0, "B")
    C = sl.compute((n,), lambda i: B[i] + 1.0, "C")
    return sl.func([A, C], "chain")


def moments_func(rows: Any = 8, cols: int = 16) -> Func:
    """A row's sum ``S`` and its sum of squares ``Q``, each an output nothing reads: two blocks that share
    only their input (what ``compute_with`` places side by side)."""
    A = sl.placeholder((rows, cols), "float32", "A")
    k1, k2 = sl.reduce_axis(cols, "k"), sl.reduce_axis(cols, "k")
    S = sl.compute((rows,), lambda i: sl.sum(A[i, k1], axis=k1), "S")
    Q = sl.compute((rows,), lambda i: sl.sum(A[i, k2] * A[i, k2], axis=k2), "Q")
    return sl.func([A, S, Q], "moments")
