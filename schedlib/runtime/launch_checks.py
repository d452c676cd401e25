"""Checks shared by the emulator and GPU paths once a call's arrays are bound: symbol values, index ranges,
grids, and outputs that overlap inputs or one another.  Each refusal is a ShapeError naming the kernel."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schedlib.codegen.layout import check_index_range
from schedlib.errors import ShapeError
from schedlib.ir.func import Func
from schedlib.ir.reference import bind_symbols
from schedlib.runtime.index_range import INT32_MAX, INT32_MIN, check_iteration_cover, exact_int


def bound_symbols(func: Func, inputs: Mapping[str, Any]) -> dict[str, int]:
    """The symbol values of ``inputs``, refused where the kernel could not index with them."""
    symbols = bind_symbols(func, inputs)
    for name, value in symbols.items():
        # symbols are int32 kernel parameters; only zero-size arrays get this far with a larger one
        if not INT32_MIN <= int(value) <= INT32_MAX:
            holders = [n for n in func.inputs if name in {getattr(d, "name", None) for d in func.buffer(n).shape}]
            raise ShapeError(f"kernel {func.name}: dimension {name} = {value} (from input "
                             f"{' / '.join(holders) or '?'}) does not fit the kernel's 32-bit int parameter "
                             f"(at most {INT32_MAX:,})")
    if symbols:  # constant sizes were checked when the kernel was built
        check_index_range(func, symbols)
        check_iteration_cover(func, symbols, func.name)
    return symbols


def work_is_empty(func: Func, symbols: Mapping[str, int]) -> bool:
    """Whether some global buffer has no elements: then a loop bound to the grid may have no iterations."""
    return any(math.prod(exact_int(d, symbols) for d in buf.shape) == 0
               for buf in func.buffers if buf.scope == "global")


def launch_grids(func: Func, specs: Sequence[Any], symbols: Mapping[str, int]) -> list[tuple[int, int, int]]:
    empty = work_is_empty(func, symbols)
    return [spec.grid_for(symbols, empty=empty) for spec in specs]


def check_host_overlap(func: Func, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, Any]) -> None:
    """Refuse an output sharing memory with an input or another output: the kernel reads inputs while other
    blocks already write outputs, so the result would depend on the order blocks run in."""
    _check_pairs(func, inputs, outputs, lambda a, b: bool(np.shares_memory(a, b)))


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
