"""Expression evaluation for the numpy reference executor (:mod:`schedlib.ir.reference`).

Every expression is evaluated for a whole grid of iteration points at once.  Numbers follow the generated
CUDA: fp16/bf16 arithmetic runs in float32 and rounds where a value is stored or cast.

A buffer held per *instance* (a shared or local buffer while the walker runs many CUDA threads or blocks side
by side, :mod:`schedlib.ir.reference_walk`) has a leading axis of instances; its loads and stores are indexed
by the point's instance first, which every other index and bounds message leaves out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from schedlib.errors import ExecutionError
from schedlib.ir.dtype import numpy_dtype, round_to_dtype
from schedlib.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Var

INSTANCE = "@instance"  # the env key of each point's instance (no IR name starts with "@")
_erf = np.frompyfunc(math.erf, 1, 1)


def evaluate_int(e: Expr, env: Mapping[str, int]) -> int:
    """``e`` for the symbol and loop values in ``env`` (an extent, a shape, an index)."""
    return int(Evaluator({}, dict(env)).eval(e))


def compute_dtype(dtype: str) -> Any:
    """The numpy type arithmetic of ``dtype`` runs in: fp16 and bf16 in float32, as generated CUDA computes
    them (operands widened, one rounding where a value is stored or cast), so the reference gives the
    kernel's bits rather than a rounding after every operation."""
    return np.float32 if dtype in ("float16", "bfloat16") else numpy_dtype(dtype)



def accumulate_rounded(out: np.ndarray, idx: tuple[np.ndarray, ...], value: np.ndarray, dtype: str) -> None:
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


class Evaluator:
    def __init__(self, buffers: Mapping[str, np.ndarray], env: Mapping[str, Any], block: str = "",
                 private: Collection[str] = ()) -> None:
        self.buffers = buffers
        self.env = env
        self.block = block
        self.private = private  # buffers with a leading axis of instances, indexed by env[INSTANCE]
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

    def index(self, name: str, indices: tuple[Expr, ...], shape: tuple[int, ...], verb: str
              ) -> tuple[np.ndarray, ...]:
        """The numpy index of ``name[indices]`` at every point, checked against ``shape`` (a private buffer's
        instance axis first, which the point's instance selects).  A read out of range only in lanes whose
        value is unused is clamped; in a used lane it raises."""
        idx = [np.asarray(self.eval(i), dtype=np.int64) for i in indices]
        private = name in self.private
        if private:
            idx.insert(0, np.asarray(self.env[INSTANCE], dtype=np.int64))
        idx = list(np.broadcast_arrays(*idx)) if idx else []
        dims = slice(1, None) if private else slice(None)
        if not self.check_bounds(name, tuple(idx[dims]), shape[dims], verb):
            idx[dims] = [np.clip(i, 0, n - 1) for i, n in zip(idx[dims], shape[dims])]
        return tuple(idx)

    def eval(self, e: Expr) -> Any:
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=compute_dtype(e.dtype))
        if isinstance(e, Var):
            if e.name not in self.env:
                raise ExecutionError(f"block {self.block}: variable {e.name} is not bound here")
            return self.env[e.name]
        if isinstance(e, Load):
            arr = self.buffers[e.buffer]
            return arr[self.index(e.buffer, e.indices, arr.shape, "reads")]
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
            return np.where(cond, then, other).astype(compute_dtype(e.dtype))
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
        dt = compute_dtype(e.dtype)
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
            x = x.astype(compute_dtype(e.dtype), copy=False)
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
                r = np.asarray(_erf(x.astype(np.float64)), dtype=np.float64)  # a Python float for one value
        return np.asarray(r).astype(compute_dtype(e.dtype), copy=False) if e.fn != "not" else r
