"""The cases the codegen tests run: each :class:`Case` knows how to make its Func at any sizes (ints or
``sl.var``), schedule it (with the hand-written schedules of ``cg_schedules.py``), draw random inputs and
compute the answer with plain numpy (never with schedlib's own reference executor)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from cg_schedules import (
    schedule_elementwise,
    schedule_gemv_inner,
    schedule_gemv_outer,
    schedule_layernorm,
    schedule_matmul,
    schedule_reduce_cols,
    schedule_reduce_rows,
    schedule_rmsnorm,
    schedule_softmax,
    schedule_transpose,
)

import schedlib as sl

Dims = Mapping[str, Any]  # size name -> int or sl.var


# --------------------------------------------------------------------------------------------------
# numpy answers (float64 where it matters; half inputs are widened exactly as the kernels do)
# --------------------------------------------------------------------------------------------------
def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def np_matmul(A, B, bias=None, epilogue=None, out_dtype=np.float32):
    c = _f32(A) @ _f32(B)
    if bias is not None:
        c = c + _f32(bias)
    if epilogue in ("relu", "bias_relu"):
        c = np.maximum(c, 0.0)
    return c.astype(out_dtype)


def np_gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return x * 0.5 * (erf(x / math.sqrt(2.0)) + 1.0)


def np_softmax(X):
    x = _f32(X)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(X.dtype)


def np_rmsnorm(X, W, eps=1e-6):
    x = _f32(X)
    return (x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * _f32(W)).astype(X.dtype)


def np_layernorm(X, G, Bt, eps=1e-5):
    x = _f32(X)
    mean = x.mean(axis=1, keepdims=True)
    var = np.maximum((x * x).mean(axis=1, keepdims=True) - mean * mean, 0.0)
    return ((x - mean) / np.sqrt(var + eps) * _f32(G) + _f32(Bt)).astype(X.dtype)


# --------------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One workload with its hand-written schedule.

    ``make(dims)`` builds the Func; ``schedule(func)`` schedules it; ``expected(*inputs)`` is numpy's
    answer; ``static`` lists concrete size sets (odd ones included); ``symbolic`` names the size that
    becomes ``sl.var`` and ``values`` the sizes it is run at, with the other sizes in ``fixed``.
    """

    name: str
    make: Callable[[Dims], sl.Func]
    schedule: Callable[[sl.Func], sl.Schedule]
    expected: Callable[..., np.ndarray]
    static: tuple[dict[str, int], ...]
    symbolic: str
    fixed: dict[str, int]
    values: tuple[int, ...] = (1, 7, 33, 70)
    tol: tuple[float, float] = (1e-4, 1e-4)
    symbolic_reduces: bool = False  # the symbolic size is a reduction extent (the grid does not change)

    def func(self, dims: Dims) -> sl.Func:
        return self.make(dims)

    def symbolic_func(self) -> sl.Func:
        return self.make({**self.fixed, self.symbolic: sl.var(self.symbolic)})


def _gemv_expected(trans: bool, epilogue: str | None):
    def expected(X, W, *rest):
        c = _f32(X) @ (_f32(W) if trans else _f32(W).T)
        if epilogue in ("bias", "bias_relu"):
            c = c + _f32(rest[0])
        if epilogue in ("relu", "bias_relu"):
            c = np.maximum(c, 0.0)
        return c.astype(X.dtype)
    return expected


def _reduce_expected(op: str, axis: int):
    def expected(X):
        x = _f32(X)
        r = {"sum": np.sum, "max": np.max, "mean": np.mean}[op](x, axis=1 if axis == -1 else 0)
        return r.astype(X.dtype)
    return expected


def _elementwise_expected(X, Y):
    return (np_gelu(_f32(X) + _f32(Y)) * 0.5).astype(X.dtype)


CASES: tuple[Case, ...] = (
    Case("matmul_bias_relu",
         lambda d: sl.workloads.matmul(d["M"], d["N"], d["K"], epilogue="bias_relu"),
         schedule_matmul,
         lambda A, B, bias: np_matmul(A, B, bias, "bias_relu"),
         static=({"M": 33, "N": 7, "K": 1}, {"M": 1, "N": 33, "K": 7}, {"M": 64, "N": 64, "K": 24}),
         symbolic="M", fixed={"N": 45, "K": 37}),
    Case("matmul_fp16",
         lambda d: sl.workloads.matmul(d["M"], d["N"], d["K"], dtype="float16"),
         lambda f: schedule_matmul(f, BM=32, BN=64, BK=16, TM=4, TN=4, vec=4),
         lambda A, B: np_matmul(A, B, out_dtype=np.float16),
         static=({"M": 7, "N": 33, "K": 33}, {"M": 33, "N": 1, "K": 7}),
         symbolic="N", fixed={"M": 40, "K": 24}, tol=(1e-2, 1e-2)),
    Case("gemv_fp16",
         lambda d: sl.workloads.gemv(d["N"], d["K"], dtype="float16", batch=2),
         schedule_gemv_inner,
         _gemv_expected(False, None),
         static=({"N": 7, "K": 33}, {"N": 1, "K": 33}),
         symbolic="N", fixed={"K": 96}, tol=(1e-2, 1e-2)),
    Case("gemv_t_bias_relu",
         lambda d: sl.workloads.gemv(d["N"], d["K"], dtype="float32", trans=True, epilogue="bias_relu"),
         schedule_gemv_outer,
         _gemv_expected(True, "bias_relu"),
         static=({"N": 33, "K": 7}, {"N": 7, "K": 1}),
         symbolic="K", fixed={"N": 40}, symbolic_reduces=True),
    Case("reduce_rows_sum",
         lambda d: sl.workloads.reduce(d["rows"], d["cols"], "sum", axis=-1),
         schedule_reduce_rows,
         _reduce_expected("sum", -1),
         static=({"rows": 7, "cols": 33}, {"rows": 1, "cols": 1}),
         symbolic="rows", fixed={"cols": 150}),
    Case("reduce_cols_mean",
         lambda d: sl.workloads.reduce(d["rows"], d["cols"], "mean", axis=0),
         schedule_reduce_cols,
         _reduce_expected("mean", 0),
         static=({"rows": 33, "cols": 7}, {"rows": 1, "cols": 33}),
         symbolic="rows", fixed={"cols": 45}, symbolic_reduces=True),
    Case("reduce_cols_max",
         lambda d: sl.workloads.reduce(d["rows"], d["cols"], "max", axis=0),
         schedule_reduce_cols,
         _reduce_expected("max", 0),
         static=({"rows": 7, "cols": 33},),
         symbolic="cols", fixed={"rows": 13}),
    Case("softmax",
         lambda d: sl.workloads.softmax(d["rows"], d["cols"]),
         schedule_softmax,
         np_softmax,
         static=({"rows": 7, "cols": 33}, {"rows": 1, "cols": 1}),
         symbolic="rows", fixed={"cols": 100}),
    Case("rmsnorm",
         lambda d: sl.workloads.rmsnorm(d["rows"], d["cols"]),
         schedule_rmsnorm,
         np_rmsnorm,
         static=({"rows": 7, "cols": 33}, {"rows": 1, "cols": 7}),
         symbolic="rows", fixed={"cols": 72}),
    Case("layernorm",
         lambda d: sl.workloads.layernorm(d["rows"], d["cols"]),
         schedule_layernorm,
         np_layernorm,
         static=({"rows": 7, "cols": 33}, {"rows": 1, "cols": 1}),
         symbolic="rows", fixed={"cols": 200}, tol=(1e-4, 2e-4)),
    Case("elementwise_add_gelu_scale",
         lambda d: sl.workloads.elementwise((d["M"], d["N"]), ("add", "gelu", "scale")),
         schedule_elementwise,
         _elementwise_expected,
         static=({"M": 7, "N": 33}, {"M": 1, "N": 1}),
         symbolic="M", fixed={"N": 9}),
    Case("transpose",
         lambda d: sl.workloads.transpose(d["M"], d["N"]),
         schedule_transpose,
         lambda X: X.T.copy(),
         static=({"M": 33, "N": 7}, {"M": 1, "N": 33}),
         symbolic="M", fixed={"N": 40}, tol=(0.0, 0.0)),
)

CASE_BY_NAME = {c.name: c for c in CASES}
