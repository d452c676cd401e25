"""The vendor-library equivalent of each built-in workload on the GPU: cuBLAS through ``cupy.matmul`` for
matmul/GEMV, cupy's own reductions and element-wise kernels otherwise.  Used as the baseline and as the
correctness reference on the GPU."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from schedlib.ir.dtype import is_float, numpy_dtype
from schedlib.suites import WorkloadSpec


def vendor_fn(spec: WorkloadSpec, inputs: Mapping[str, Any], out_dtype: str | None = None
              ) -> Callable[[], Any] | None:
    """A zero-argument callable computing ``spec`` with cupy on ``inputs`` (device arrays), or None.

    An integer output is converted to its type at the end, as the workload's final cast does (a gelu of an
    int8 matmul truncates to int32).  ``out_dtype`` is the workload's output dtype where the caller has built
    it (else it is built here)."""
    fn = _vendor(spec, inputs)
    if out_dtype is None:
        func = spec.build()
        out_dtype = func.buffer(func.outputs[0]).dtype
    out = out_dtype
    if fn is None or is_float(out):
        return fn

    def narrowed() -> Any:
        y = fn()
        # the kernel rounds its float math to float32 before the cast (gelu(8) is 8 there, 7.99.. in float64)
        return (y.astype("float32") if y.dtype.kind == "f" else y).astype(numpy_dtype(out))
    return narrowed


def _vendor(spec: WorkloadSpec, inputs: Mapping[str, Any]) -> Callable[[], Any] | None:
    import cupy as cp

    p = spec.params
    x = inputs.get("X")
    if x is not None and x.dtype.kind in "iu" and spec.kind == "reduce":
        x = x.astype("int32")  # the workload sums (and squares) in int32, where int8 would wrap
    if spec.kind == "matmul":
        A, B = inputs["A"], inputs["B"]
        a = A.swapaxes(-1, -2) if p.get("trans_a") else A
        b = B.swapaxes(-1, -2) if p.get("trans_b") else B
        if A.dtype.kind in "iu":  # the workload accumulates in int32, where an int8 product would wrap
            a, b = a.astype("int32"), b.astype("int32")
        return lambda: _epilogue(cp, cp.matmul(a, b), p.get("epilogue"), inputs)
    if spec.kind == "gemv":
        return _gemv(cp, p, inputs)
    line = 0 if p.get("axis") == 0 else 1  # the axis a reduce, softmax or norm workload reduces
    if spec.kind == "reduce":
        op = p.get("op", "sum")
        table = {"sum": lambda: x.sum(axis=line), "max": lambda: x.max(axis=line), "min": lambda: x.min(axis=line),
                 "mean": lambda: x.mean(axis=line), "sumsq": lambda: (x * x).sum(axis=line)}
        return table[op]
    if spec.kind == "softmax":
        def softmax() -> Any:
            e = cp.exp(x - x.max(axis=line, keepdims=True))
            return e / e.sum(axis=line, keepdims=True)
        return softmax
    if spec.kind == "rmsnorm":
        w = inputs["W"]
        eps = p.get("eps", 1e-6)
        return lambda: x * (1 / cp.sqrt((x * x).mean(axis=line, keepdims=True) + eps)) * w
    if spec.kind == "layernorm":
        g, b = inputs["gamma"], inputs["beta"]
        eps = p.get("eps", 1e-5)
        return lambda: ((x - x.mean(axis=line, keepdims=True)) / cp.sqrt(x.var(axis=line, keepdims=True) + eps)
                        * g + b)
    if spec.kind == "transpose":
        return lambda: cp.ascontiguousarray(x.T)
    if spec.kind == "elementwise":
        return lambda: _chain(cp, x, inputs.get("Y"), p.get("chain", ("add", "relu")), p.get("scale", 0.5))
    return None


def _epilogue(cp: Any, c: Any, epi: str | None, inputs: Mapping[str, Any]) -> Any:
    """The workloads' fused epilogues as separate cupy operations (what a user without fusion runs)."""
    if epi in ("bias", "bias_relu"):
        c = c + inputs["bias"]
    if epi == "residual":
        c = c + inputs["residual"]
    if epi in ("relu", "bias_relu"):
        c = cp.maximum(c, 0)
    if epi == "gelu":
        from cupyx.scipy.special import erf

        c = 0.5 * c * (1 + erf(c / math.sqrt(2)))
    return c


def _gemv(cp: Any, p: Mapping[str, Any], inputs: Mapping[str, Any]) -> Callable[[], Any]:
    """cuBLAS through ``cupy.matmul``: integer inputs widened to int32 first (an int8 product would wrap, and
    the workload accumulates in int32); a quantised weight dequantised by cupy on every call (cuBLAS takes no
    int8 weight under float activations), then multiplied in the activation dtype."""
    x, W = inputs["X"], inputs["W"]
    trans, quant = p.get("trans"), p.get("weight_dtype")
    integer = x.dtype.kind in "iu"

    def weight() -> Any:
        if quant:
            scale = inputs["scale"]
            return (W * (scale[None, :] if trans else scale[:, None])).astype(x.dtype)
        return W.astype("int32") if integer else W

    def gemv() -> Any:
        w = weight()
        c = cp.matmul(x.astype("int32") if integer else x, w if trans else w.T)
        return _epilogue(cp, c, p.get("epilogue"), inputs)
    return gemv


def _chain(cp: Any, x: Any, y: Any, chain: tuple[str, ...], scale: float) -> Any:
    from cupyx.scipy.special import erf

    ops = {"add": lambda v: v + y, "mul": lambda v: v * y, "scale": lambda v: v * scale,
           "relu": lambda v: cp.maximum(v, 0), "gelu": lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))),
           "exp": cp.exp, "sigmoid": lambda v: 1 / (1 + cp.exp(-v)), "tanh": cp.tanh}
    for op in chain:
        x = ops[op](x)
    return x
