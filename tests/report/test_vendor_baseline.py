"""The vendor baseline computes what each workload computes.

On the GPU, ``compare`` checks every kernel against the vendor result before timing it, so a baseline that
drops an epilogue or wraps an int8 product would fail correct kernels.  Here numpy stands in for cupy (the
calls the baseline makes exist in both with the same meaning) and each baseline is held to the reference
executor's result for the same inputs.
"""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest

import schedlib as sl
from schedlib.ir.dtype import is_float, numpy_dtype
from schedlib.report.vendor import vendor_fn
from schedlib.suites import WorkloadSpec, parse_workload

SPECS = [
    "matmul:M=24,N=40,K=32",
    "matmul:M=24,N=40,K=32,dtype=float16,epilogue=bias_relu",
    "matmul:M=16,N=24,K=40,trans_a=true,trans_b=true,epilogue=gelu",
    "matmul:M=16,N=24,K=40,epilogue=residual,batch=2",
    "matmul:M=16,N=24,K=64,dtype=int8",
    "gemv:N=64,K=96,dtype=float32",
    "gemv:N=64,K=96,dtype=float16,trans=true,epilogue=bias",
    "gemv:N=64,K=96,dtype=float32,batch=3,epilogue=bias_relu",
    "gemv:N=64,K=96,dtype=float32,epilogue=gelu",
    "gemv:N=64,K=128,dtype=int8",
    "gemv:N=64,K=96,dtype=float16,weight_dtype=int8",
    "gemv:N=64,K=96,dtype=float32,weight_dtype=int8,trans=true,batch=2,epilogue=relu",
    "matmul:M=16,N=24,K=40,dtype=int8,epilogue=gelu",
    "matmul:M=16,N=24,K=40,dtype=int8,epilogue=bias,out_dtype=float32",
    "gemv:N=64,K=96,dtype=int8,epilogue=bias_relu,out_dtype=float32",
    "matmul:M=16,N=24,K=40,dtype=int8,out_dtype=int8",
    "reduce:rows=20,cols=50,op=sumsq,dtype=int8",
    "reduce:rows=20,cols=50,op=sumsq",
    "reduce:rows=20,cols=50,op=max,axis=0",
    "softmax:rows=6,cols=70",
    "rmsnorm:rows=6,cols=70",
    "layernorm:rows=6,cols=70",
    "softmax:rows=70,cols=6,axis=0",
    "rmsnorm:rows=70,cols=6,axis=0,eps=0.5",
    "layernorm:rows=70,cols=6,axis=0,eps=0.25",
    "rmsnorm:rows=6,cols=70,eps=2.0",
    "transpose:M=12,N=20",
    "elementwise:shape=8x30,chain=add+gelu",
]


@pytest.fixture
def numpy_as_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    special = types.ModuleType("cupyx.scipy.special")
    special.erf = np.vectorize(math.erf, otypes=[np.float64])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", np)
    for name in ("cupyx", "cupyx.scipy"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "cupyx.scipy.special", special)


def _inputs(func: sl.Func, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name in func.inputs:
        buf = func.buffer(name)
        shape = tuple(int(d.value) for d in buf.shape)
        if is_float(buf.dtype):
            out[name] = rng.standard_normal(shape).astype(numpy_dtype(buf.dtype))
        else:
            out[name] = rng.integers(-100, 101, shape).astype(numpy_dtype(buf.dtype))  # x * x passes int8
    return out


@pytest.mark.parametrize("text", SPECS)
def test_the_vendor_baseline_matches_the_reference(text: str, numpy_as_cupy: None,
                                                   rng: np.random.Generator) -> None:
    spec: WorkloadSpec = parse_workload(text)
    func = spec.build()
    inputs = _inputs(func, rng)
    baseline = vendor_fn(spec, inputs)
    assert baseline is not None
    got = np.asarray(baseline(), dtype=np.float64)
    want = np.asarray(sl.run_reference(func, inputs)[func.outputs[0]], dtype=np.float64)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    if is_float(func.buffer(func.outputs[0]).dtype):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * scale)
    else:
        np.testing.assert_array_equal(got, want)
