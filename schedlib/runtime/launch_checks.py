"""Checks shared by the emulator and GPU paths once a call's arrays are bound: symbol values, index ranges,
grids, and outputs that overlap inputs or one another.  Each refusal is a ShapeError naming the kernel."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schedlib.errors import ShapeError
from schedlib.ir.func import Func
from schedlib.ir.layout import check_index_range
from schedlib.ir.reference import bind_symbols, check_reductions_nonempty
from schedlib.runtime.index_range import INT32_MAX, INT32_MIN, check_iteration_cover, exact_int


class LaunchCache:
    """Per kernel: the symbol values already checked, and the grids they give.  The index-range and cover
    checks walk the whole func (about 100 us), which a GPU call would otherwise pay on every launch of the
    same sizes; bounded, since a symbolic kernel may see many sizes."""

    LIMIT = 256

    def __init__(self) -> None:
        # sizes checked -> their grids (None until a launch asks for them)
        self.entries: dict[tuple[tuple[str, int], ...], list[tuple[int, int, int]] | None] = {}

    def remember(self, key: tuple[tuple[str, int], ...]) -> None:
        if len(self.entries) >= self.LIMIT:
            self.entries.clear()
        self.entries[key] = None


def bound_symbols(func: Func, inputs: Mapping[str, Any], cache: LaunchCache | None = None,
                  declared: Func | None = None) -> dict[str, int]:
    """The symbol values of ``inputs``, refused where the kernel could not index with them (checked once per
    set of values when a ``cache`` is given).  ``declared`` is ``func`` before scheduling: an empty reduction
    is named by its axes there (the user's names, not those of the split loops)."""
    symbols = bind_symbols(func, inputs)
    key = tuple(sorted(symbols.items()))
    if cache is not None and key in cache.entries:
        return symbols
    for name, value in symbols.items():
        # symbols are int32 kernel parameters; only zero-size arrays get this far with a larger one
        if not INT32_MIN <= int(value) <= INT32_MAX:
            holders = [n for n in func.inputs if name in {getattr(d, "name", None) for d in func.buffer(n).shape}]
            raise ShapeError(f"kernel {func.name}: dimension {name} = {value} (from input "
                             f"{' / '.join(holders) or '?'}) does not fit the kernel's 32-bit int parameter "
                             f"(at most {INT32_MAX:,})")
    if symbols:  # constant sizes were checked when the kernel was built
        check_reductions_nonempty(declared if declared is not None else func, symbols)
        check_index_range(func, symbols)
        check_iteration_cover(func, symbols, func.name)
    if cache is not None:
        cache.remember(key)
    return symbols


def work_is_empty(func: Func, symbols: Mapping[str, int]) -> bool:
    """Whether some global buffer has no elements: then a loop bound to the grid may have no iterations."""
    return any(math.prod(exact_int(d, symbols) for d in buf.shape) == 0
               for buf in func.buffers if buf.scope == "global")


def launch_grids(func: Func, specs: Sequence[Any], symbols: Mapping[str, int],
                 cache: LaunchCache | None = None) -> list[tuple[int, int, int]]:
    key = tuple(sorted(symbols.items()))
    known = cache.entries.get(key) if cache is not None else None
    if known is not None:
        return known
    empty = work_is_empty(func, symbols)
    grids = [spec.grid_for(symbols, empty=empty) for spec in specs]
    if cache is not None and key in cache.entries:  # only sizes bound_symbols checked
        cache.entries[key] = grids
    return grids


def check_host_overlap(func: Func, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
    """Refuse an output sharing memory with an input or another output: the kernel reads inputs while other
    blocks already write outputs, so the result would depend on the order blocks run in."""
    _check_pairs(func, inputs, outputs, _host_overlap)


_TOO_HARD = np.exceptions.TooHardError if hasattr(np, "exceptions") else np.TooHardError  # numpy < 1.25


def _host_overlap(a: Any, b: Any) -> bool:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or not np.may_share_memory(a, b):
        return False  # disjoint bounds (or not arrays: a list is copied, it cannot alias an output)
    try:  # exact answer for interleaved views, within a bounded effort (unbounded took 10 s on 6-d views)
        return bool(np.shares_memory(a, b, max_work=100_000))
    except _TOO_HARD:
        return True  # overlapping bounds and no proof otherwise: refuse rather than risk a race


def check_device_overlap(func: Func, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
    """As :func:`check_host_overlap`, for device arrays: their ``[data.ptr, data.ptr + nbytes)`` ranges."""
    def overlap(a: Any, b: Any) -> bool:
        (a0, a1), (b0, b1) = _span(a), _span(b)
        return a0 < b1 and b0 < a1

    _check_pairs(func, inputs, outputs, overlap)


def _span(arr: Any) -> tuple[int, int]:
    """The bytes an array's elements occupy, strided views (negative strides too) included."""
    start = int(arr.data.ptr)
    low = sum(min(0, s * (n - 1)) for s, n in zip(arr.strides, arr.shape))
    high = sum(max(0, s * (n - 1)) for s, n in zip(arr.strides, arr.shape))
    return start + low, start + high + int(arr.itemsize)


def _check_pairs(func: Func, inputs: Mapping[str, Any], outputs: Mapping[str, Any], overlap: Any) -> None:
    outs = list(outputs.items())
    for i, (oname, out) in enumerate(outs):
        if getattr(out, "size", 1) == 0:
            continue  # nothing is written
        others = [("input", n, a) for n, a in inputs.items()] + [("output", n, a) for n, a in outs[i + 1:]]
        for kind, name, arr in others:
            if getattr(arr, "size", 1) and overlap(out, arr):
                raise ShapeError(f"kernel {func.name}: output {oname} overlaps {kind} {name} in memory; outputs "
                                 "must not share memory with inputs or other outputs (blocks would read "
                                 "values other blocks already overwrote); pass a separate array")
