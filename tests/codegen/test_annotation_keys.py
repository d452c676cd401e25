"""Annotations the code generator reads take effect, and the ones it would ignore are refused: an
``unroll_limit`` unrolls its loop that many iterations at a time; a tensor-core key in a SIMT kernel (where
it would change nothing) is a BuildError naming the loop and what to use instead."""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
from schedlib.runtime.nvcc import find_nvcc


def _simt(annotate: tuple[str, object] | None = None, on: int = 2) -> sl.Schedule:
    s = sl.Schedule(sl.workloads.matmul(64, 48, 40))
    loops = s.get_loops("C")
    s.bind(loops[0], "blockIdx.x")
    s.bind(loops[1], "threadIdx.x")
    if annotate:
        s.annotate(loops[on], *annotate)
    return s


def test_unroll_limit_emits_a_partial_unroll_and_computes_the_same() -> None:
    plain, limited = sl.build(_simt(), "h100"), sl.build(_simt(("unroll_limit", 4)), "h100")
    assert "#pragma unroll 4" in limited.source and "#pragma unroll 4" not in plain.source
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 40)).astype("float32"), rng.standard_normal((40, 48)).astype("float32")
    np.testing.assert_array_equal(limited.run_cpu(a, b), plain.run_cpu(a, b))
    if find_nvcc() is not None:
        assert limited.compile_check("sm_90") is not None


def test_unroll_limit_in_a_cross_thread_reduction() -> None:
    s = sl.Schedule(sl.workloads.reduce(8, 1000))
    i, k = s.get_loops("R")
    ko, ki = s.split(k, [None, 32])
    s.reorder(i, ki, ko)
    s.bind(i, "blockIdx.x")
    s.bind(ki, "threadIdx.x")
    s.annotate(ko, "unroll_limit", 2)
    kernel = sl.build(s, "h100")
    assert "#pragma unroll 2" in kernel.source
    x = np.random.default_rng(1).standard_normal((8, 1000)).astype("float32")
    np.testing.assert_allclose(kernel.run_cpu(x), x.sum(axis=1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("key", "value"), [("pipeline_stages", 2), ("raster", 4), ("loader", "tma")])
def test_a_tensor_core_key_in_a_simt_kernel_is_refused(key: str, value: object) -> None:
    with pytest.raises(sl.BuildError, match=f"C.k: {key} is read only in a kernel whose root block is annotated "
                                            "tensor_core.*double_buffer"):
        sl.build(_simt((key, value)), "h100")
    # a note of any other name is just printed
    s = _simt(("why", "long k"))
    assert "for C.k in range(40):  # why='long k'" in str(s)
    sl.build(s, "h100")
