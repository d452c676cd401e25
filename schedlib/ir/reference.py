"""The numpy reference executor: runs any Func, scheduled or not, exactly as its loop nest says.

Loops that carry attached blocks run one iteration at a time (a shared tile must be refilled before the
loop body reads it); below the last attachment every remaining loop is evaluated at once as a numpy
grid.  Guards, compacted caches, rfactor partials and reduction initialisation all follow the IR's
semantics, so a wrong schedule gives a wrong answer here rather than only on the GPU.

Numbers follow the generated CUDA: fp16/bf16 arithmetic runs in float32 and rounds where a value is stored
or cast, and a float -> integer conversion is the GPU's (NaN to 0, saturated), so for element-wise work the
reference gives the emulated kernel's bits; sums may still differ in the last place where the kernel adds in
another order.  On a GPU, nvcc also fuses ``a * b + c`` into one FMA (one rounding where the reference and
the emulator make two), so a GPU result can differ from both in the last place; GPU checks use tolerances.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from schedlib.errors import ExecutionError, ShapeError
from schedlib.ir.dtype import is_float, numpy_dtype, round_to_dtype
from schedlib.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Var
from schedlib.ir.func import Block, Func
from schedlib.ir.shape_solve import solve_dim

CHUNK = 1 << 20  # iteration points evaluated at once
_erf = np.frompyfunc(math.erf, 1, 1)


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


def evaluate_int(e: Expr, env: Mapping[str, int]) -> int:
    value = _Evaluator({}, dict(env)).eval(e)
    return int(value)


def run_reference(target: Any, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Execute ``target`` (a Func or Schedule) on numpy ``inputs``; returns the outputs by name."""
    func: Func = getattr(target, "func", target)
    if not isinstance(func, Func):
        raise ExecutionError(f"run_reference needs a Func or Schedule, got {type(target).__name__}")
    symbols = bind_symbols(func, inputs)
    check_reductions_nonempty(func, symbols)
    buffers: dict[str, np.ndarray] = {}
    for buf in func.buffers:
        if buf.name in func.inputs:
            buffers[buf.name] = round_to_dtype(np.array(inputs[buf.name]), buf.dtype)
            continue
        shape = tuple(evaluate_int(s, symbols) for s in buf.shape)
        arr = np.empty(shape, dtype=numpy_dtype(buf.dtype))
        arr.fill(np.nan if is_float(buf.dtype) else -7)  # poison: unwritten elements show up
        buffers[buf.name] = arr
    runner = _Runner(func, buffers, symbols)
    for blk in func.root_blocks():
        runner.chain(blk, 0, dict(symbols))
    return {name: buffers[name] for name in func.outputs}



def _compute_dtype(dtype: str) -> Any:
    """The numpy type arithmetic of ``dtype`` runs in: fp16 and bf16 in float32, as generated CUDA computes
    them (operands widened, one rounding where a value is stored or cast), so the reference gives the
    kernel's bits rather than a rounding after every operation."""
    return np.float32 if dtype in ("float16", "bfloat16") else numpy_dtype(dtype)

class _Runner:
    def __init__(self, func: Func, buffers: dict[str, np.ndarray], symbols: dict[str, int]) -> None:
        self.func = func
        self.buffers = buffers
        self.symbols = symbols
        attach_loops: dict[str, set[str]] = {}
        for b in func.blocks:
            if b.attach is not None:
                attach_loops.setdefault(b.attach.block, set()).add(b.attach.loop)
        self.attach_loops = attach_loops

    def _sequential_from(self, block: Block) -> int:
        """Index just past the innermost loop of ``block`` that carries attachments."""
        names = self.attach_loops.get(block.name, set())
        last = -1
        for i, lp in enumerate(block.loops):
            if lp.name in names:
                last = i
        return last + 1

    def chain(self, block: Block, level: int, env: dict[str, Any]) -> None:
        loops = block.loops
        if level < self._sequential_from(block):
            lp = loops[level]
            for v in range(evaluate_int(lp.extent, env)):
                inner = {**env, lp.name: v}
                for b in self.func.attached_at(block.name, lp.name, "before"):
                    self.chain(b, 0, inner)
                self.chain(block, level + 1, inner)
                for b in self.func.attached_at(block.name, lp.name, "after"):
                    self.chain(b, 0, inner)
            return
        rest = loops[level:]
        extents = [evaluate_int(lp.extent, env) for lp in rest]
        if rest and math.prod(extents) > CHUNK and len(rest) > 1:
            p = self._split_at(block, rest)
            for v in range(extents[p]):
                self._grid(block, rest[:p] + rest[p + 1:], extents[:p] + extents[p + 1:], {**env, rest[p].name: v})
            return
        self._grid(block, rest, extents, env)

    def _split_at(self, block: Block, loops) -> int:
        """Which of ``loops`` a grid too large to evaluate at once is cut along: the first, except for an fp16/bf16
        sum, which rounds at every step and so adds its terms one step at a time (vectorised over the elements
        a chunk holds): it is cut along its first reducing loop when only spatial loops come before, so each
        chunk holds many elements and one step of each, and each element still takes its terms in order."""
        if block.reducer == "sum" and self.func.buffer(block.store).dtype in ("float16", "bfloat16"):
            kinds = [block.loop_kind(lp.name) for lp in loops]
            first = next((p for p, kind in enumerate(kinds) if kind != "S"), 0)
            if kinds[first] == "R":
                return first
        return 0

    def _grid(self, block: Block, loops, extents: list[int], env: dict[str, Any]) -> None:
        if any(e <= 0 for e in extents):
            return
        shape = tuple(extents)
        full = dict(env)
        for k, (lp, ext) in enumerate(zip(loops, extents)):
            view = [1] * len(shape)
            view[k] = ext
            full[lp.name] = np.broadcast_to(np.arange(ext, dtype=np.int64).reshape(view), shape)
        ev = _Evaluator(self.buffers, full, block.name)
        for a, b in zip(block.axes, block.bindings):
            full[a.name] = np.broadcast_to(np.asarray(ev.eval(b)), shape)
        mask = np.ones(shape, dtype=bool)
        if block.predicate is not None:
            mask = np.broadcast_to(np.asarray(_Evaluator(self.buffers, full, block.name).eval(block.predicate)),
                                   shape)
        points = {k: (v[mask] if isinstance(v, np.ndarray) and v.shape == shape else v) for k, v in full.items()}
        if not mask.any():
            return
        ev = _Evaluator(self.buffers, points, block.name)
        count = int(mask.sum())
        out = self.buffers[block.store]
        dtype = self.func.buffer(block.store).dtype
        idx = tuple(np.broadcast_to(np.asarray(ev.eval(i), dtype=np.int64), (count,)) for i in block.store_indices)
        if out.ndim == 0:  # a single value: written through a one-element view, so every point has an index
            out, idx = out.reshape(1), (np.zeros(count, dtype=np.int64),)
        ev.check_bounds(block.store, idx, out.shape, "writes")
        value = np.broadcast_to(np.asarray(ev.eval(block.value)), (count,))
        if block.reducer is None:
            out[idx] = round_to_dtype(value, dtype)
            return
        if block.init is not None:
            first = np.ones(count, dtype=bool)
            for a in block.axes:
                if a.kind == "R":
                    first &= np.broadcast_to(points[a.name], (count,)) == 0
            out[tuple(i[first] for i in idx)] = round_to_dtype(np.asarray(ev.eval(block.init)), dtype)
        ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[block.reducer]
        if dtype in ("float16", "bfloat16") and block.reducer == "sum":
            # the kernel adds the term as computed (in float) to the widened sum and rounds the sum once a
            # step: the term itself is not rounded first
            _accumulate_rounded(out, idx, np.asarray(value, dtype=np.float32), dtype)
        else:
            # max/min return one of their operands: rounding the term first gives the same bits
            ufunc.at(out, idx, round_to_dtype(value, dtype))


def _accumulate_rounded(out: np.ndarray, idx: tuple[np.ndarray, ...], value: np.ndarray, dtype: str) -> None:
    """``out[idx] += value`` one step at a time, rounding every partial sum to ``dtype``.

    bfloat16 is held in float32, where ``np.add.at`` would add a whole grid chunk's contributions to an
    element before rounding once; the kernel rounds after every step, so the result would depend on how
    the schedule chunks the loops.  Contributions to one element are applied in loop order (the grid's
    flat order), step ``r`` adding the r-th contribution of every element at once, so the work stays
    vectorised over elements and loops only as often as the most contributions one element receives.
    """
    lin = np.ravel_multi_index(idx, out.shape)
    order = np.argsort(lin, kind="stable")
    lin_sorted = lin[order]
    starts = np.r_[0, np.flatnonzero(np.diff(lin_sorted)) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, lin_sorted.size]))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size) - group_start
    by_rank = np.argsort(rank, kind="stable")  # step r's contributions form one contiguous run
    bounds = np.r_[0, np.cumsum(np.bincount(rank))]
    for lo, hi in itertools.pairwise(bounds):
        step = by_rank[lo:hi]
        target = tuple(i[step] for i in idx)  # at most one contribution per element in a step
        out[target] = round_to_dtype(out[target] + value[step], dtype)


class _Evaluator:
    def __init__(self, buffers: Mapping[str, np.ndarray], env: Mapping[str, Any], block: str = "") -> None:
        self.buffers = buffers
        self.env = env
        self.block = block
        # Lanes whose value is used: inside a select branch, only those where the branch is taken.
        self.active: Any = True

    def check_bounds(self, name: str, idx: tuple[np.ndarray, ...], shape: tuple[int, ...], verb: str) -> bool:
        """Raise for an out-of-range index in an active lane; False if only inactive lanes are out of range."""
        ok = True
        for d, (i, n) in enumerate(zip(idx, shape)):
            bad = (i < 0) | (i >= n)
            if np.any(bad):
                used, index = np.broadcast_arrays(bad & self.active, i)
                if np.any(used):
                    raise ExecutionError(f"block {self.block} {verb} {name} out of bounds: dim {d} index "
                                         f"{int(index[used].flat[0])} not in [0, {n})")
                ok = False
        return ok

    def eval(self, e: Expr) -> Any:
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=_compute_dtype(e.dtype))
        if isinstance(e, Var):
            if e.name not in self.env:
                raise ExecutionError(f"block {self.block}: variable {e.name} is not bound here")
            return self.env[e.name]
        if isinstance(e, Load):
            arr = self.buffers[e.buffer]
            idx = [np.asarray(self.eval(i), dtype=np.int64) for i in e.indices]
            idx = list(np.broadcast_arrays(*idx)) if idx else []
            if not self.check_bounds(e.buffer, tuple(idx), arr.shape, "reads"):
                idx = [np.clip(i, 0, n - 1) for i, n in zip(idx, arr.shape)]
            return arr[tuple(idx)]
        if isinstance(e, Select):
            cond = np.asarray(self.eval(e.cond), dtype=bool)
            # Each branch is evaluated for every lane, but a lane's out-of-range read only matters (and
            # only raises) where that branch is the one selected; the other lanes are clamped.
            saved = self.active
            try:
                self.active = saved & cond
                then = self.eval(e.then)
                self.active = saved & ~cond
                other = self.eval(e.other)
            finally:
                self.active = saved
            return np.where(cond, then, other).astype(_compute_dtype(e.dtype))
        if isinstance(e, Cast):
            return round_to_dtype(np.asarray(self.eval(e.value)), e.dtype)
        if isinstance(e, Binary):
            return self._binary(e)
        if isinstance(e, Call):
            return self._call(e)
        raise ExecutionError(f"block {self.block}: cannot evaluate {e!r}")

    def _binary(self, e: Binary) -> Any:
        a, b = self.eval(e.a), self.eval(e.b)
        if e.op in ("and", "or"):
            return np.logical_and(a, b) if e.op == "and" else np.logical_or(a, b)
        if e.op in ("<", "<=", ">", ">=", "==", "!="):
            import operator

            fn = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
                  "==": operator.eq, "!=": operator.ne}[e.op]
            return fn(a, b)
        dt = _compute_dtype(e.dtype)
        a, b = np.asarray(a).astype(dt, copy=False), np.asarray(b).astype(dt, copy=False)
        with np.errstate(all="ignore"):
            if e.op == "+":
                r = a + b
            elif e.op == "-":
                r = a - b
            elif e.op == "*":
                r = a * b
            elif e.op == "/":
                r = a / b
            elif e.op == "//":
                r = np.floor_divide(a, b)
            elif e.op == "%":
                r = np.mod(a, b)
            elif e.op == "min":
                r = np.minimum(a, b)
            else:
                r = np.maximum(a, b)
        return r

    def _call(self, e: Call) -> Any:
        x = np.asarray(self.eval(e.args[0]))
        if e.fn != "not":  # a loaded fp16 operand is widened first, as the kernel's sqrtf/expf take floats
            x = x.astype(_compute_dtype(e.dtype), copy=False)
        with np.errstate(all="ignore"):
            if e.fn == "neg":
                r = -x
            elif e.fn == "not":
                r = np.logical_not(x)
            elif e.fn == "abs":
                r = np.abs(x)
            elif e.fn == "exp":
                r = np.exp(x)
            elif e.fn == "log":
                r = np.log(x)
            elif e.fn == "sqrt":
                r = np.sqrt(x)
            elif e.fn == "rsqrt":
                r = 1 / np.sqrt(x)
            elif e.fn == "tanh":
                r = np.tanh(x)
            elif e.fn == "sigmoid":
                r = 1 / (1 + np.exp(-x))
            else:  # erf
                r = _erf(x.astype(np.float64)).astype(np.float64)
        return np.asarray(r).astype(_compute_dtype(e.dtype), copy=False) if e.fn != "not" else r
