"""Built-in workloads.  Each returns a Func; any size may be an int or an ``sl.var``.

Names of stages are stable (rules never rely on them, but traces and reports do):
the reduction of a matmul/GEMV is ``C``, a fused epilogue or output cast is ``D``, a quantised
GEMV's dequantised weight is ``Wd``.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from schedlib.errors import IRError
from schedlib.ir import tensor as te
from schedlib.ir.dtype import canonical_dtype, check_dtype, is_float
from schedlib.ir.expr import Expr, ExprLike, binary
from schedlib.ir.func import Func, make_func

EPILOGUES = (None, "bias", "relu", "bias_relu", "gelu", "residual")
REDUCE_OPS = ("sum", "max", "min", "mean", "sumsq")
ELEMENTWISE_OPS = ("add", "mul", "relu", "gelu", "exp", "sigmoid", "tanh", "scale")
# Stages an elementwise chain may have: the IR's passes recurse once per stage, and a chain of ~1000 stages
# raised RecursionError (a traceback from the command); real chains have a handful.
MAX_CHAIN = 64


def _gelu(x: Expr) -> Expr:
    return x * 0.5 * (te.erf(x * (1.0 / math.sqrt(2.0))) + 1.0)


def _relu(x: Expr) -> Expr:
    return te.maximum(x, 0.0)


def _size(workload: str, name: str, value: Any) -> ExprLike:
    """A size argument as the IR takes it (an int >= 1 or an ``sl.var`` expression), or an error naming the
    workload's parameter: a placeholder's dimension number means little to whoever called ``matmul(M=0)``."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value < 1:
            raise IRError(f"{workload}: {name}={value!r} must be >= 1")
        if value >= 2**31:
            raise IRError(f"{workload}: {name}={value} does not fit the 32-bit index type (must be < 2^31)")
        return int(value)
    raise IRError(f"{workload}: {name}={value!r} must be an int or sl.var, got {type(value).__name__}")


def _accum(dtype: str, accum_dtype: str | None) -> str:
    """The accumulator of a sum over ``dtype``: float32 for the float types, int64 for int64 (narrower would
    drop its high bits), int32 for the narrower integers and bool."""
    if accum_dtype is not None:
        return check_dtype(accum_dtype, "accum_dtype")
    return "float32" if is_float(dtype) else "int64" if dtype == "int64" else "int32"


def _epilogue(x: Expr, epilogue: str | None, added: Expr | None, acc: str, out: str) -> Expr:
    """A matmul's or GEMV's element-wise epilogue of accumulator ``x``: ``added`` (a bias or residual element)
    first, then relu or gelu, cast to ``out``.  It computes in the accumulator's type, except that an integer
    accumulator under a float output is converted first, so that a float bias is added as it is rather than
    truncated to an integer."""
    ct = out if is_float(out) and not is_float(acc) else acc
    if ct != acc:
        x = x.astype(ct)
    if added is not None:
        x = x + added.astype(ct)
    if epilogue in ("relu", "bias_relu"):
        x = _relu(x)
    if epilogue == "gelu":
        x = _gelu(x)
    return x.astype(out)


def _numpy_dtypes(builder: Callable[..., Func]) -> Callable[..., Func]:
    """Let a builder's ``*dtype`` arguments be numpy dtypes too (``np.float16``), as ``placeholder``'s are."""
    signature = inspect.signature(builder)

    @functools.wraps(builder)
    def call(*args: Any, **kwargs: Any) -> Func:
        bound = signature.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            if name.endswith("dtype") and value is not None and not isinstance(value, str):
                bound.arguments[name] = canonical_dtype(value, name)
        return builder(*bound.args, **bound.kwargs)

    return call


@_numpy_dtypes
def matmul(M: ExprLike = 1024, N: ExprLike = 1024, K: ExprLike = 1024, dtype: str = "float32",
           accum_dtype: str | None = None, out_dtype: str | None = None, trans_a: bool = False,
           trans_b: bool = False, batch: ExprLike | None = None, epilogue: str | None = None) -> Func:
    """``D = epilogue(A @ B)``, A is MxK (KxM if trans_a), B is KxN (NxK if trans_b), optional batch."""
    M, N, K = (_size("matmul", n, v) for n, v in (("M", M), ("N", N), ("K", K)))
    batch = None if batch is None else _size("matmul", "batch", batch)
    check_dtype(dtype)
    if epilogue not in EPILOGUES:
        raise IRError(f"matmul: epilogue={epilogue!r}; expected one of {EPILOGUES}")
    acc = _accum(dtype, accum_dtype)
    out = check_dtype(out_dtype, "out_dtype") if out_dtype else (dtype if is_float(dtype) else acc)
    pre = () if batch is None else (batch,)
    A = te.placeholder((*pre, K, M) if trans_a else (*pre, M, K), dtype, "A")
    B = te.placeholder((*pre, N, K) if trans_b else (*pre, K, N), dtype, "B")
    k = te.reduce_axis(K, "k")

    def a_at(b: tuple, i: ExprLike) -> Expr:
        return A[(*b, k, i)] if trans_a else A[(*b, i, k)]

    def b_at(b: tuple, j: ExprLike) -> Expr:
        return B[(*b, j, k)] if trans_b else B[(*b, k, j)]

    if batch is None:
        C = te.compute((M, N), lambda i, j: te.sum(a_at((), i).astype(acc) * b_at((), j).astype(acc), axis=k), "C")
    else:
        C = te.compute((batch, M, N),
                       lambda b, i, j: te.sum(a_at((b,), i).astype(acc) * b_at((b,), j).astype(acc), axis=k), "C")
    extra: list[te.Tensor] = []
    if epilogue in ("bias", "bias_relu"):
        extra.append(te.placeholder((N,), out, "bias"))
    if epilogue == "residual":
        extra.append(te.placeholder((*pre, M, N), out, "residual"))
    if epilogue is None and out == acc:
        return make_func([A, B, C], "matmul")

    def epi(*idx: Expr) -> Expr:
        added = extra[0][idx[-1]] if epilogue in ("bias", "bias_relu") else extra[0][idx] if extra else None
        return _epilogue(C[idx], epilogue, added, acc, out)

    D = te.compute(C.shape, epi, "D")
    return make_func([A, B, *extra, D], "matmul" if epilogue is None else f"matmul_{epilogue}")


@_numpy_dtypes
def gemv(N: ExprLike = 4096, K: ExprLike = 4096, dtype: str = "float16", trans: bool = False,
         batch: ExprLike = 1, epilogue: str | None = None, accum_dtype: str | None = None,
         out_dtype: str | None = None, weight_dtype: str | None = None) -> Func:
    """``y[b, n] = sum_k x[b, k] * W[n, k]`` (W is KxN when ``trans``: a reduction over the outer axis).

    The output dtype follows :func:`matmul`: ``dtype`` for float inputs, the int32 accumulator for integer ones
    (an int8 dot product overflows int8), unless ``out_dtype`` says otherwise.

    ``weight_dtype="int8"`` (with float activations) makes a weight-only quantised GEMV: ``W`` holds
    integers and ``scale`` one accumulator-typed factor per output column, dequantised by a stage ``Wd``
    (``Wd[n, k] = W[n, k] * scale[n]``) that the GEMV rule inlines, so only the integers cross memory.
    """
    N, K, batch = (_size("gemv", n, v) for n, v in (("N", N), ("K", K), ("batch", batch)))
    check_dtype(dtype)
    if epilogue not in (None, "bias", "relu", "bias_relu", "gelu"):
        raise IRError(f"gemv: epilogue={epilogue!r}; expected None, bias, relu, bias_relu or gelu")
    acc = _accum(dtype, accum_dtype)
    out = check_dtype(out_dtype, "out_dtype") if out_dtype else (dtype if is_float(dtype) else acc)
    if weight_dtype is not None:
        check_dtype(weight_dtype, "weight_dtype")
        if weight_dtype != "int8" or not is_float(dtype):
            raise IRError(f"gemv: weight_dtype={weight_dtype!r} with dtype={dtype!r}: a quantised weight is int8 "
                          f"under float activations")
    X = te.placeholder((batch, K), dtype, "X")
    W = te.placeholder((K, N) if trans else (N, K), weight_dtype or dtype, "W")
    k = te.reduce_axis(K, "k")
    quant: list[te.Tensor] = []
    if weight_dtype is None:
        C = te.compute((batch, N), lambda b, n: te.sum(
            X[b, k].astype(acc) * (W[k, n] if trans else W[n, k]).astype(acc), axis=k), "C")
    else:
        scale = te.placeholder((N,), acc, "scale")
        Wd = te.compute((N, K), lambda n, c: (W[c, n] if trans else W[n, c]).astype(acc) * scale[n], "Wd")
        C = te.compute((batch, N), lambda b, n: te.sum(X[b, k].astype(acc) * Wd[n, k], axis=k), "C")
        quant = [scale]
    # the bias is in the output dtype, as matmul's is
    extra = [te.placeholder((N,), out, "bias")] if epilogue in ("bias", "bias_relu") else []
    name = ("gemv_t" if trans else "gemv") + ("_wq" if quant else "")
    if epilogue is None and out == acc:
        return make_func([X, W, *quant, C], name)

    def epi(b: Expr, n: Expr) -> Expr:
        return _epilogue(C[b, n], epilogue, extra[0][n] if extra else None, acc, out)

    D = te.compute((batch, N), epi, "D")
    return make_func([X, W, *quant, *extra, D], name)


def _norm_axis(workload: str, axis: Any) -> bool:
    """Whether a row-wise workload reduces its first axis (``axis=0``) rather than its last (-1 or 1)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or axis not in (-1, 0, 1):
        raise IRError(f"{workload}: axis={axis!r}; expected -1/1 (last) or 0 (first)")
    return axis == 0


@_numpy_dtypes
def reduce(rows: ExprLike = 4096, cols: ExprLike = 4096, op: str = "sum", axis: int = -1,
           dtype: str = "float32") -> Func:
    """Reduce a rows x cols matrix over its last (``axis=-1``/1) or first (``axis=0``) axis.

    ``mean`` of an integer matrix is float32 (sum in int32, then divided), like numpy's.
    """
    rows, cols = _size("reduce", "rows", rows), _size("reduce", "cols", cols)
    check_dtype(dtype)
    if op not in REDUCE_OPS:
        raise IRError(f"reduce: op={op!r}; expected one of {REDUCE_OPS}")
    last = not _norm_axis("reduce", axis)
    X = te.placeholder((rows, cols), dtype, "X")
    r = te.reduce_axis(cols if last else rows, "r")
    acc = _accum(dtype, None) if op in ("sum", "mean", "sumsq") else dtype
    kept = rows if last else cols

    def elem(i: Expr) -> Expr:
        x = (X[i, r] if last else X[r, i]).astype(acc)
        return x * x if op == "sumsq" else x

    combiner: Callable = {"sum": te.sum, "mean": te.sum, "sumsq": te.sum, "max": te.max, "min": te.min}[op]
    R = te.compute((kept,), lambda i: combiner(elem(i), axis=r), "R")
    if op != "mean":
        return make_func([X, R], f"reduce_{op}")
    n = cols if last else rows
    mean_dtype = acc if is_float(acc) else "float32"  # an integer mean is fractional, as numpy's is
    count = te.compute((kept,), lambda i: R[i].astype(mean_dtype) / binary("+", n, 0).astype(mean_dtype), "D")
    return make_func([X, count], "reduce_mean")


@_numpy_dtypes
def softmax(rows: ExprLike = 4096, cols: ExprLike = 4096, dtype: str = "float32", axis: int = -1) -> Func:
    """Softmax over each row (``axis=-1``) or each column (``axis=0``), computed in float32: max, exp, sum,
    normalise."""
    rows, cols = _size("softmax", "rows", rows), _size("softmax", "cols", cols)
    first = _norm_axis("softmax", axis)
    X = te.placeholder((rows, cols), check_dtype(dtype), "X")
    n, kept = (rows, cols) if first else (cols, rows)
    k1, k2 = te.reduce_axis(n, "k"), te.reduce_axis(n, "k")

    def at(i: Expr, k: Expr) -> tuple[Expr, Expr]:  # X's index of element k of the line i reduces
        return (k, i) if first else (i, k)

    def line(i: Expr, j: Expr) -> Expr:  # the reduced line element (i, j) belongs to
        return j if first else i

    mx = te.compute((kept,), lambda i: te.max(X[at(i, k1)].astype("float32"), axis=k1), "T_max")
    ex = te.compute((rows, cols), lambda i, j: te.exp(X[i, j].astype("float32") - mx[line(i, j)]), "T_exp")
    sm = te.compute((kept,), lambda i: te.sum(ex[at(i, k2)], axis=k2), "T_sum")
    # one reciprocal per line, then a multiply per element: nvcc hoists the loop-invariant 1 / sum, where
    # a division per element costs a reciprocal, a refinement and a slow-path check each
    Y = te.compute((rows, cols), lambda i, j: (ex[i, j] * (1.0 / sm[line(i, j)])).astype(dtype), "Y")
    return make_func([X, Y], "softmax")


@_numpy_dtypes
def rmsnorm(rows: ExprLike = 4096, cols: ExprLike = 4096, dtype: str = "float32", eps: float = 1e-6,
            axis: int = -1) -> Func:
    """``y = x * rsqrt(mean(x^2) + eps) * w`` over each row (``axis=-1``) or each column (``axis=0``); the
    weight ``W`` runs along the columns either way."""
    rows, cols = _size("rmsnorm", "rows", rows), _size("rmsnorm", "cols", cols)
    first = _norm_axis("rmsnorm", axis)
    X = te.placeholder((rows, cols), check_dtype(dtype), "X")
    Wt = te.placeholder((cols,), dtype, "W")
    n, kept = (rows, cols) if first else (cols, rows)
    k = te.reduce_axis(n, "k")

    def x(i: Expr, r: Expr) -> Expr:  # element r of line i, in float32
        return (X[r, i] if first else X[i, r]).astype("float32")

    ss = te.compute((kept,), lambda i: te.sum(x(i, k) * x(i, k), axis=k), "T_sumsq")
    count = binary("+", n, 0).astype("float32")
    Y = te.compute((rows, cols), lambda i, j: (X[i, j].astype("float32") * te.rsqrt(ss[j if first else i] / count
                                                                                   + eps)
                                               * Wt[j].astype("float32")).astype(dtype), "Y")
    return make_func([X, Wt, Y], "rmsnorm")


@_numpy_dtypes
def layernorm(rows: ExprLike = 4096, cols: ExprLike = 4096, dtype: str = "float32", eps: float = 1e-5,
              axis: int = -1) -> Func:
    """``y = (x - mean) * rsqrt(var + eps) * gamma + beta`` over each row (``axis=-1``) or each column
    (``axis=0``, a batch norm's statistics); one pass computes sum and sum of squares, ``gamma`` and ``beta``
    run along the columns either way."""
    rows, cols = _size("layernorm", "rows", rows), _size("layernorm", "cols", cols)
    first = _norm_axis("layernorm", axis)
    X = te.placeholder((rows, cols), check_dtype(dtype), "X")
    G = te.placeholder((cols,), dtype, "gamma")
    Bt = te.placeholder((cols,), dtype, "beta")
    n, kept = (rows, cols) if first else (cols, rows)
    k1, k2 = te.reduce_axis(n, "k"), te.reduce_axis(n, "k")

    def x(i: Expr, r: Expr) -> Expr:  # element r of line i, in float32
        return (X[r, i] if first else X[i, r]).astype("float32")

    s1 = te.compute((kept,), lambda i: te.sum(x(i, k1), axis=k1), "T_sum")
    s2 = te.compute((kept,), lambda i: te.sum(x(i, k2) * x(i, k2), axis=k2), "T_sumsq")
    count = binary("+", n, 0).astype("float32")

    def norm(i: Expr, j: Expr) -> Expr:
        line = j if first else i
        mean = s1[line] / count
        var = te.maximum(s2[line] / count - mean * mean, 0.0)
        y = (X[i, j].astype("float32") - mean) * te.rsqrt(var + eps)
        return (y * G[j].astype("float32") + Bt[j].astype("float32")).astype(dtype)

    Y = te.compute((rows, cols), norm, "Y")
    return make_func([X, G, Bt, Y], "layernorm")


@_numpy_dtypes
def elementwise(shape: Sequence[ExprLike] = (4096, 4096), chain: Sequence[str] = ("add", "relu"),
                dtype: str = "float32", scale: float = 0.5) -> Func:
    """A chain of element-wise stages; ``add``/``mul`` combine with a second input ``Y``.

    Every stage's result, and so the output, has ``dtype``: the unary ops and ``scale`` (multiply by ``scale``)
    compute in float32 and cast back, so an integer chain truncates toward zero after each of them
    (``scale`` of int8 5 by 0.5 is 2).
    """
    if isinstance(shape, np.ndarray) and shape.ndim == 1 and np.issubdtype(shape.dtype, np.integer):
        shape = [int(d) for d in shape]  # a numpy shape vector
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not shape:
        raise IRError(f"elementwise: shape={shape!r} must be a non-empty sequence of sizes")
    shape = tuple(_size("elementwise", f"shape[{i}]", d) for i, d in enumerate(shape))
    check_dtype(dtype)
    if not chain:
        raise IRError("elementwise: chain must name at least one op")
    bad = [op for op in chain if op not in ELEMENTWISE_OPS]
    if bad:
        raise IRError(f"elementwise: unknown op(s) {bad}; expected {ELEMENTWISE_OPS}")
    if len(chain) > MAX_CHAIN:
        raise IRError(f"elementwise: chain has {len(chain)} ops; at most {MAX_CHAIN} (split a longer chain into "
                      "several workloads)")
    shape = tuple(shape)
    X = te.placeholder(shape, dtype, "X")
    inputs = [X]
    Y = None
    if any(op in ("add", "mul") for op in chain):
        Y = te.placeholder(shape, dtype, "Y")
        inputs.append(Y)
    cur = X
    for n, op in enumerate(chain):
        prev = cur

        def f(*i: Expr, prev: te.Tensor = prev, op: str = op) -> Expr:
            x = prev[i]
            if op == "add":
                return x + Y[i]
            if op == "mul":
                return x * Y[i]
            xf = x.astype("float32")
            if op == "scale":  # cast back like the unary ops: the output dtype must not depend on the order
                return (xf * scale).astype(dtype)
            y = {"relu": lambda: _relu(xf), "gelu": lambda: _gelu(xf), "exp": lambda: te.exp(xf),
                 "sigmoid": lambda: te.sigmoid(xf), "tanh": lambda: te.tanh(xf)}[op]()
            return y.astype(dtype)

        cur = te.compute(shape, f, f"E{n}")
    return make_func([*inputs, cur], "elementwise_" + "_".join(chain))


@_numpy_dtypes
def transpose(M: ExprLike = 4096, N: ExprLike = 4096, dtype: str = "float32") -> Func:
    """``Y[j, i] = X[i, j]``."""
    M, N = _size("transpose", "M", M), _size("transpose", "N", N)
    X = te.placeholder((M, N), check_dtype(dtype), "X")
    Y = te.compute((N, M), lambda j, i: X[i, j], "Y")
    return make_func([X, Y], "transpose")


BUILTINS: dict[str, Callable[..., Func]] = {
    "matmul": matmul, "gemv": gemv, "reduce": reduce, "softmax": softmax, "rmsnorm": rmsnorm,
    "layernorm": layernorm, "elementwise": elementwise, "transpose": transpose,
}
