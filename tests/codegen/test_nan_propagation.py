"""A NaN in the input reaches the output as numpy (and the reference executor) propagate it.

CUDA's fmaxf/fminf return the other operand when one is NaN, so kernels built on them dropped a NaN from a
max reduction (a softmax's row maximum) and turned it into 0 in a ReLU.  The kernels run on the CPU emulator,
whose fmaxf follows the same IEEE rule as the GPU's.
"""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl


def _with_nans(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    x[1, 5] = np.nan
    x[2, -1] = np.nan  # the last element: the tail of a vectorized or cross-thread pass
    return x


def _run(f: sl.Func, *inputs: np.ndarray) -> np.ndarray:
    return np.asarray(sl.build(sl.rules.apply_default(f, "h100"), "h100").run_cpu(*inputs, bounds_check=True))


@pytest.mark.parametrize("op", ["max", "min"])
def test_a_max_or_min_reduction_keeps_a_nan(op: str) -> None:
    x = _with_nans((4, 300))
    got = _run(sl.workloads.reduce(4, 300, op), x)
    np.testing.assert_array_equal(np.isnan(got), [False, True, True, False])
    np.testing.assert_allclose(got, getattr(np, op)(x, axis=1), rtol=1e-6)


def test_relu_keeps_a_nan() -> None:
    x = _with_nans((4, 64))
    got = _run(sl.workloads.elementwise((4, 64), ("relu",)), x)
    np.testing.assert_allclose(got, np.maximum(x, 0), rtol=1e-6)  # equal_nan: NaN where numpy has NaN
    assert np.isnan(got[1, 5]) and np.isnan(got[2, -1])


def test_softmax_of_a_row_with_a_nan_is_nan() -> None:
    x = _with_nans((4, 300))
    got = _run(sl.workloads.softmax(4, 300), x)
    np.testing.assert_array_equal(np.isnan(got).all(axis=1), [False, True, True, False])
    assert not np.isnan(got[[0, 3]]).any()


def test_a_tensor_core_relu_epilogue_keeps_a_nan() -> None:
    f = sl.workloads.matmul(64, 64, 32, "float16", epilogue="bias_relu")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 32)).astype("float16")
    b = rng.standard_normal((32, 64)).astype("float16")
    bias = np.zeros(64, "float16")
    bias[7] = np.nan
    got = _run(f, a, b, bias)
    assert np.isnan(got[:, 7]).all() and not np.isnan(np.delete(got, 7, axis=1)).any()
