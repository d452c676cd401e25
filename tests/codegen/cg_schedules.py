"""Hand-written schedules of every built-in workload, and the cases the codegen tests run them on.

Every schedule here is written out primitive by primitive (none comes from ``sl.rules``) and between them
they use each feature the code generator has to get right: block/thread tiles, shared-memory tiles filled
cooperatively by all threads (``compute_at`` + fused/split/bound copy loops), register accumulators
(``cache_write`` local + ``reverse_compute_at``), cross-thread reductions over ``threadIdx.x`` (warp
shuffles, and shared memory across warps) and over ``threadIdx.y`` (the general shared-memory path),
padded shared tiles (``storage_align``), ``vectorize`` and ``unroll``.

A :class:`Case` knows how to make its Func at any sizes (ints or ``sl.var``), schedule it, draw random
inputs and compute the answer with plain numpy (never with schedlib's own reference executor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import schedlib as sl

Dims = Mapping[str, Any]  # size name -> int or sl.var


# --------------------------------------------------------------------------------------------------
# matmul: 2-level tiles, A/B shared tiles (padded), register accumulators, epilogue folded in
# --------------------------------------------------------------------------------------------------
def schedule_matmul(func: sl.Func, BM: int = 32, BN: int = 32, BK: int = 8, TM: int = 4, TN: int = 2,
                    vec: int = 2, pad: int = 4) -> sl.Schedule:
    """Block tile BM x BN, each of the (BM/TM) x (BN/TN) threads owns a TM x TN register tile; A and B
    tiles of depth BK are fetched into shared memory by all threads, ``vec`` elements each; the row stride
    of each tile is padded to 16k + pad (A) and 32k + pad (B) elements."""
    s = sl.Schedule(func)
    i, j, k = s.get_loops("C")
    bi, ti, ii = s.split(i, [None, BM // TM, TM])
    bj, tj, jj = s.split(j, [None, BN // TN, TN])
    ko, ki = s.split(k, [None, BK])
    s.reorder(bi, bj, ti, tj, ko, ki, ii, jj)
    s.bind(bi, "blockIdx.y")
    s.bind(bj, "blockIdx.x")
    s.bind(ti, "threadIdx.y")
    s.bind(tj, "threadIdx.x")
    acc = s.cache_write("C", "local")
    s.reverse_compute_at(acc, tj)
    if "D" in s.blocks:  # epilogue / output cast: folded into the single store of the accumulator
        s.reverse_compute_inline("D")
    for buf, align in (("A", (0, 16, pad)), ("B", (0, 32, pad))):
        tile = s.cache_read("C", buf, "shared")
        s.compute_at(tile, ko)
        s.storage_align(tile, *align)
        fused = s.fuse(*s.get_loops(tile))
        _, ty, tx, v = s.split(fused, [None, BM // TM, BN // TN, vec])
        s.bind(ty, "threadIdx.y")
        s.bind(tx, "threadIdx.x")
        s.vectorize(v)
    s.decompose_reduction("C", ko)
    for lp in s.get_loops("C")[-3:]:
        s.unroll(lp)
    return s


# --------------------------------------------------------------------------------------------------
# GEMV, weight N x K (reduce the contiguous axis): x in shared, k across threadIdx.x (warp shuffles)
# --------------------------------------------------------------------------------------------------
def schedule_gemv_inner(func: sl.Func, rows: int = 4, threads: int = 32, unroll: int = 2) -> sl.Schedule:
    s = sl.Schedule(func)
    b, n, k = s.get_loops("C")
    bn, tn = s.split(n, [None, rows])
    ko, kt, ku = s.split(k, [None, threads, unroll])
    s.reorder(bn, tn, b, kt, ko, ku)
    s.bind(bn, "blockIdx.x")
    s.bind(tn, "threadIdx.y")
    s.bind(kt, "threadIdx.x")
    s.unroll(ku)
    acc = s.cache_write("C", "local")
    s.reverse_compute_at(acc, b)
    if "D" in s.blocks:
        s.reverse_compute_inline("D")
    xs = s.cache_read("C", "X", "shared")
    s.compute_at(xs, bn)
    fused = s.fuse(*s.get_loops(xs))
    _, ty, tx = s.split(fused, [None, rows, threads])
    s.bind(ty, "threadIdx.y")
    s.bind(tx, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# GEMV, weight K x N (reduce the outer axis): n along threadIdx.x (coalesced), k across threadIdx.y
# --------------------------------------------------------------------------------------------------
def schedule_gemv_outer(func: sl.Func, cols: int = 32, threads_k: int = 4) -> sl.Schedule:
    s = sl.Schedule(func)
    b, n, k = s.get_loops("C")
    bn, tn = s.split(n, [None, cols])
    ko, kt = s.split(k, [None, threads_k])
    s.reorder(bn, tn, b, kt, ko)
    s.bind(bn, "blockIdx.x")
    s.bind(tn, "threadIdx.x")
    s.bind(kt, "threadIdx.y")
    acc = s.cache_write("C", "local")
    s.reverse_compute_at(acc, b)
    if "D" in s.blocks:
        s.reverse_compute_inline("D")
    return s


# --------------------------------------------------------------------------------------------------
# Row reduction (last axis): two rows per block, 64 threads per row (shuffles + shared across warps)
# --------------------------------------------------------------------------------------------------
def schedule_reduce_rows(func: sl.Func, rows: int = 2, threads: int = 64) -> sl.Schedule:
    s = sl.Schedule(func)
    i, r = s.get_loops("R")
    bi, ti = s.split(i, [None, rows])
    ro, rt = s.split(r, [None, threads])
    s.reorder(bi, ti, rt, ro)
    s.bind(bi, "blockIdx.x")
    s.bind(ti, "threadIdx.y")
    s.bind(rt, "threadIdx.x")
    s.unroll(ro)
    return s


# --------------------------------------------------------------------------------------------------
# Column reduction (first axis) with a mean epilogue: columns on threadIdx.x, 3 threads (not a power
# of two) split the rows on threadIdx.y; each thread keeps a partial in a register
# --------------------------------------------------------------------------------------------------
def schedule_reduce_cols(func: sl.Func, cols: int = 32, threads_r: int = 3) -> sl.Schedule:
    s = sl.Schedule(func)
    j, r = s.get_loops("R")
    bj, tj = s.split(j, [None, cols])
    ro, rt = s.split(r, [None, threads_r])
    s.reorder(bj, tj, rt, ro)
    s.bind(bj, "blockIdx.x")
    s.bind(tj, "threadIdx.x")
    s.bind(rt, "threadIdx.y")
    acc = s.cache_write("R", "local")
    s.reverse_compute_at(acc, tj)
    if "D" in s.blocks:
        s.reverse_compute_inline("D")
    return s


# --------------------------------------------------------------------------------------------------
# Softmax, one row per block: the row max is broadcast through shared memory, exp(x - max) is staged
# in a shared row tile that both the sum and the output read, the sum lives in every thread's register
# --------------------------------------------------------------------------------------------------
def schedule_softmax(func: sl.Func, threads: int = 64) -> sl.Schedule:
    s = sl.Schedule(func)
    s.compute_inline(s.cache_write("T_max", "shared"))
    s.compute_inline(s.cache_write("T_exp", "shared"))
    s.compute_inline(s.cache_write("T_sum", "local"))
    i, j = s.get_loops("Y")
    jo, jt = s.split(j, [None, threads])
    s.reorder(i, jt, jo)
    s.bind(i, "blockIdx.x")
    s.bind(jt, "threadIdx.x")
    # Consumers first (compute_at needs every reader inside the loop); blocks attached at one loop run in
    # Func order: T_max, T_exp, T_sum, then Y's own body.
    for stage in ("T_sum", "T_exp", "T_max"):
        s.compute_at(stage, i)
        ko, kt = s.split(s.get_loops(stage)[-1], [None, threads])
        s.reorder(kt, ko)
        s.bind(kt, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# RMSNorm, one row per warp (4 rows per block): sum of squares reduced with warp shuffles into a
# register, the weight vector staged once per block in shared memory, output stores unrolled
# --------------------------------------------------------------------------------------------------
def schedule_rmsnorm(func: sl.Func, rows: int = 4, unroll: int = 2) -> sl.Schedule:
    s = sl.Schedule(func)
    s.compute_inline(s.cache_write("T_sumsq", "local"))
    i, j = s.get_loops("Y")
    bi, ti = s.split(i, [None, rows])
    jo, jt, ju = s.split(j, [None, 32, unroll])
    s.reorder(bi, ti, jt, jo, ju)
    s.bind(bi, "blockIdx.x")
    s.bind(ti, "threadIdx.y")
    s.bind(jt, "threadIdx.x")
    s.unroll(ju)
    s.compute_at("T_sumsq", ti)
    ko, kt = s.split(s.get_loops("T_sumsq")[-1], [None, 32])
    s.reorder(kt, ko)
    s.bind(kt, "threadIdx.x")
    ws = s.cache_read("Y", "W", "shared")
    s.compute_at(ws, bi)
    _, wy, wx = s.split(s.get_loops(ws)[0], [None, rows, 32])
    s.bind(wy, "threadIdx.y")
    s.bind(wx, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# LayerNorm, one row per block of 128 threads (4 warps): the row of X is cached in shared memory for
# the output stage, sum in a register, sum of squares broadcast through shared memory
# --------------------------------------------------------------------------------------------------
def schedule_layernorm(func: sl.Func, threads: int = 128) -> sl.Schedule:
    s = sl.Schedule(func)
    s.compute_inline(s.cache_write("T_sum", "local"))
    s.compute_inline(s.cache_write("T_sumsq", "shared"))
    i, j = s.get_loops("Y")
    jo, jt = s.split(j, [None, threads])
    s.reorder(i, jt, jo)
    s.bind(i, "blockIdx.x")
    s.bind(jt, "threadIdx.x")
    for red in ("T_sumsq", "T_sum"):
        s.compute_at(red, i)
        ko, kt = s.split(s.get_loops(red)[-1], [None, threads])
        s.reorder(kt, ko)
        s.bind(kt, "threadIdx.x")
    xs = s.cache_read("Y", "X", "shared")
    s.compute_at(xs, i)
    xo, xt = s.split(s.get_loops(xs)[-1], [None, threads])
    s.reorder(xt, xo)
    s.bind(xt, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# Element-wise chain: every stage inlined into the last, flattened, 128 threads x 4 elements each
# --------------------------------------------------------------------------------------------------
def schedule_elementwise(func: sl.Func, threads: int = 128, vec: int = 4) -> sl.Schedule:
    s = sl.Schedule(func)
    last = func.outputs[0]
    for blk in s.blocks:
        if blk != last:
            s.compute_inline(blk)
    flat = s.fuse(*s.get_loops(last))
    bx, tx, v = s.split(flat, [None, threads, vec])
    s.bind(bx, "blockIdx.x")
    s.bind(tx, "threadIdx.x")
    s.vectorize(v)
    return s


# --------------------------------------------------------------------------------------------------
# Transpose through a padded 32 x 32 shared tile (row stride 33): coalesced read and write, 32 x 8 threads
# --------------------------------------------------------------------------------------------------
def schedule_transpose(func: sl.Func, tile: int = 32, rows: int = 8) -> sl.Schedule:
    s = sl.Schedule(func)
    j, i = s.get_loops("Y")
    bj, jo, jt = s.split(j, [None, tile // rows, rows])
    bi, it = s.split(i, [None, tile])
    s.reorder(bj, bi, jo, jt, it)
    s.bind(bj, "blockIdx.y")
    s.bind(bi, "blockIdx.x")
    s.bind(jt, "threadIdx.y")
    s.bind(it, "threadIdx.x")
    s.unroll(jo)
    xs = s.cache_read("Y", "X", "shared")
    s.compute_at(xs, bi)
    s.storage_align(xs, 0, 32, 1)
    _, ty, tx = s.split(s.fuse(*s.get_loops(xs)), [None, rows, tile])
    s.bind(ty, "threadIdx.y")
    s.bind(tx, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# Row sums through a shared tile of X: [2, cols] float32 is 8 * cols bytes (static up to 48 KB, then dynamic)
# --------------------------------------------------------------------------------------------------
def reduce_through_shared(cols: int) -> sl.Schedule:
    f = sl.workloads.reduce(sl.var("M"), cols, "sum")
    s = schedule_reduce_rows(f, rows=2, threads=64)
    tile = s.cache_read("R", "X", "shared")
    s.compute_at(tile, s.get_loops("R")[0])
    _, ty, tx = s.split(s.fuse(*s.get_loops(tile)), [None, 2, 64])
    s.bind(ty, "threadIdx.y")
    s.bind(tx, "threadIdx.x")
    return s


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
