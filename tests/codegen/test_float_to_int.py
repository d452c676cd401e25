"""Float -> integer conversions follow the GPU (cvt.rzi): toward zero, NaN to 0, saturated to the 32-bit range
(64-bit for int64), int8 keeping the low byte.  C++ leaves NaN and out-of-range values undefined and x86 gives
INT_MIN, so before, the reference and the emulator agreed with each other and not with the GPU."""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
from schedlib.runtime.nvcc import find_nvcc

X_VALUES = np.array([1e10, -1e10, np.nan, 3.9, -3.9, 300.7, np.inf, -np.inf, -2147483520.0], np.float32)
GPU = {  # what cvt.rzi.s32/s64.f32 and a byte store give on the device
    "int32": [2147483647, -2147483648, 0, 3, -3, 300, 2147483647, -2147483648, -2147483520],
    "int8": [-1, 0, 0, 3, -3, 44, -1, 0, -128],
    "int64": [10_000_000_000, -10_000_000_000, 0, 3, -3, 300, 2**63 - 1, -(2**63), -2147483520],
}


@pytest.mark.parametrize("dtype", list(GPU))
def test_reference_and_emulator_convert_as_the_gpu(dtype: str) -> None:
    X = sl.placeholder((len(X_VALUES),), "float32", "X")
    f = sl.func([X, sl.compute(X.shape, lambda i: X[i].astype(dtype), "Y")])
    want = np.array(GPU[dtype], dtype=dtype)
    np.testing.assert_array_equal(sl.run_reference(f, {"X": X_VALUES})["Y"], want)
    kernel = sl.build(f, "h100")
    assert f"sl_f2i<{ {'int32': 'int', 'int8': 'signed char', 'int64': 'long long'}[dtype]}>" in kernel.source
    np.testing.assert_array_equal(kernel.run_cpu(X_VALUES, bounds_check=True), want)


def test_the_conversion_helper_compiles_for_the_gpu_and_stays_out_of_other_kernels() -> None:
    X = sl.placeholder((8,), "float16", "X")
    f = sl.func([X, sl.compute((8,), lambda i: X[i].astype("int8") + X[i].astype("int32").astype("int8"), "Y")])
    kernel = sl.build(f, "h100")
    assert kernel.source.count("T sl_f2i(float x)") == 1
    assert "sl_f2i" not in sl.build(sl.workloads.matmul(64, 64, 64), "h100").source
    if find_nvcc() is None:
        pytest.skip("nvcc not found: the GPU build of the helper is not checked")
    assert kernel.compile_check("sm_90") is not None
