"""The numpy reference executor: runs any Func, scheduled or not, exactly as its loop nest says.

Loops that carry attached blocks are walked (:mod:`schedlib.ir.reference_walk`: one iteration at a time, or
CUDA threads and blocks side by side where no value can tell); below the last attachment every remaining
loop is evaluated at once as a numpy grid (:mod:`schedlib.ir.reference_eval`).  Guards, compacted caches,
rfactor partials and reduction initialisation all follow the IR's semantics, so a wrong schedule gives a wrong
answer here rather than only on the GPU.

Numbers follow the generated CUDA: fp16/bf16 arithmetic runs in float32 and rounds where a value is stored
or cast, and a float -> integer conversion is the GPU's (NaN to 0, saturated), so for element-wise work the
reference gives the emulated kernel's bits; sums may still differ in the last place where the kernel adds in
another order.  On a GPU, nvcc also fuses ``a * b + c`` into one FMA (one rounding where the reference and
the emulator make two), so a GPU result can differ from both in the last place; GPU checks use tolerances.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from schedlib.errors import ExecutionError, ShapeError
from schedlib.ir.dtype import is_float, numpy_dtype, round_to_dtype
from schedlib.ir.expr import Const, Var
from schedlib.ir.func import Func
from schedlib.ir.reference_eval import evaluate_int
from schedlib.ir.reference_walk import Runner
from schedlib.ir.shape_solve import solve_dim

__all__ = ["bind_symbols", "check_reductions_nonempty", "evaluate_int", "run_reference"]


def bind_symbols(func: Func, inputs: Mapping[str, Any]) -> dict[str, int]:
    """Bind symbolic dimensions from input shapes; check every input's name, rank, shape and dtype."""
    if not isinstance(inputs, Mapping):
        raise ShapeError(f"{func.name}: inputs must be a mapping from input name to array, e.g. "
                         f"{{{', '.join(repr(n) + ': ...' for n in func.inputs)}}}; got {type(inputs).__name__}")
    missing = [n for n in func.inputs if n not in inputs]
    if missing:
        raise ShapeError(f"{func.name}: missing input(s) {missing}; expected {list(func.inputs)}")
    unknown = [n for n in inputs if n not in func.inputs]
    if unknown:
        raise ShapeError(f"{func.name}: unknown input(s) {unknown}; expected {list(func.inputs)}")
    env: dict[str, int] = {}
    for name in func.inputs:
        buf = func.buffer(name)
        arr = inputs[name]
        if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
            arr = np.asarray(arr)  # host containers; device arrays keep their memory
        shape, dtype = tuple(arr.shape), np.dtype(arr.dtype)
        if len(shape) != len(buf.shape):
            raise ShapeError(f"{func.name}: input {name} has rank {len(shape)}, expected {len(buf.shape)}")
        want = numpy_dtype(buf.dtype)
        if dtype != want and not (buf.dtype == "bfloat16" and dtype.name in ("float32", "bfloat16")):
            raise ShapeError(f"{func.name}: input {name} has dtype {dtype}, expected {buf.dtype}")
        for d, (dim, size) in enumerate(zip(buf.shape, shape)):
            if isinstance(dim, Var):
                if env.setdefault(dim.name, size) != size:
                    raise ShapeError(f"{func.name}: input {name} dim {d} is {size}, but {dim.name}="
                                     f"{env[dim.name]} from an earlier input")
    _solve_compound_dims(func, inputs, env)
    for s in func.symbols:
        if s not in env:
            raise ShapeError(f"{func.name}: dimension {s} cannot be inferred from the input shapes")
    for name in func.inputs:
        buf = func.buffer(name)
        for d, (dim, size) in enumerate(zip(buf.shape, tuple(inputs[name].shape) if hasattr(inputs[name], "shape")
                                            else np.shape(inputs[name]))):
            expect = evaluate_int(dim, env)
            if expect != size:  # a symbolic dimension also says how it was computed: "expected 64 (2 * N)"
                how = "" if isinstance(dim, Const) else f" ({dim})"
                raise ShapeError(f"{func.name}: input {name} dim {d} is {size}, expected {expect}{how}")
    return env


def _solve_compound_dims(func: Func, inputs: Mapping[str, Any], env: dict[str, int]) -> None:
    """Bind the symbols that only appear in affine dimensions (``N + 1``, ``2 * N``), one at a time, until none
    is left that one input dimension determines; ``bind_symbols`` checks every dimension afterwards."""
    progress = True
    while progress and any(s not in env for s in func.symbols):
        progress = False
        for name in func.inputs:
            arr = inputs[name]
            for d, (dim, size) in enumerate(zip(func.buffer(name).shape, getattr(arr, "shape", None) or np.shape(arr))):
                solved = None if isinstance(dim, (Var, Const)) else solve_dim(dim, int(size), env)
                if solved is None:
                    continue
                symbol, value = solved
                if value.denominator != 1 or value < 0:
                    raise ShapeError(f"{func.name}: input {name} dim {d} is {size}, which no {symbol} >= 0 "
                                     f"gives for {dim}")
                env[symbol] = int(value)
                progress = True


def check_reductions_nonempty(func: Func, env: Mapping[str, int]) -> None:
    """Refuse symbol values that leave a reduction with outputs to write but nothing to reduce.

    The max of nothing has no value, and a sum of nothing would need its init hoisted out of loops that
    never run: the kernels initialise a reduction on its first step, so they would leave the output
    unwritten.  An error names the axis instead of returning memory nobody wrote.
    """
    if not env:  # constant extents are at least 1 by construction
        return
    for block in func.blocks:
        if block.reducer is None:
            continue
        extents = [(a, evaluate_int(a.extent, env)) for a in block.axes]
        empty = [a for a, n in extents if a.kind == "R" and n <= 0]
        if empty and all(n > 0 for a, n in extents if a.kind == "S"):
            axis = empty[0]
            sizes = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
            raise ShapeError(f"{func.name}: block {block.name} reduces over axis {axis.name} of extent "
                             f"{axis.extent} = 0 for these inputs ({sizes}); a reduction needs at least one "
                             "element")




def run_reference(target: Any, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Execute ``target`` (a Func or Schedule) on numpy ``inputs``; returns the outputs by name."""
    func: Func = getattr(target, "func", target)
    if not isinstance(func, Func):
        raise ExecutionError(f"run_reference needs a Func or Schedule, got {type(target).__name__}")
    symbols = bind_symbols(func, inputs)
    check_reductions_nonempty(func, symbols)
    buffers: dict[str, np.ndarray] = {}
    private: set[str] = set()
    for buf in func.buffers:
        if buf.name in func.inputs:
            buffers[buf.name] = round_to_dtype(np.array(inputs[buf.name]), buf.dtype)
            continue
        shape = tuple(evaluate_int(s, symbols) for s in buf.shape)
        if buf.scope != "global":  # one copy per instance of the loops walked side by side (reference_walk)
            private.add(buf.name)
            shape = (1, *shape)
        arr = np.empty(shape, dtype=numpy_dtype(buf.dtype))
        arr.fill(np.nan if is_float(buf.dtype) else -7)  # poison: unwritten elements show up
        buffers[buf.name] = arr
    runner = Runner(func, buffers, private)
    for blk in func.root_blocks():
        runner.chain(blk, 0, dict(symbols))
    return {name: buffers[name][0] if name in private else buffers[name] for name in func.outputs}
