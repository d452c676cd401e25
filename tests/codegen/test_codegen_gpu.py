"""The same hand-scheduled kernels on a real GPU through cupy (and torch / DLPack when available).

Every test here is marked ``gpu``: conftest.py skips it, with schedlib's own reason, when cupy sees no device.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cg_cases import CASES, Case
from cg_schedules import reduce_through_shared
from cg_support import assert_close, random_inputs

import schedlib as sl
from schedlib import rules

pytestmark = pytest.mark.gpu


def _symbolic_kernel(case: Case) -> tuple[sl.Func, sl.Kernel]:
    func = case.symbolic_func()
    return func, sl.build(case.schedule(func), "sm_90")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_on_gpu_matches_numpy(cupy: Any, case: Case, rng: np.random.Generator) -> None:
    func, k = _symbolic_kernel(case)
    for value in case.values:
        inputs = random_inputs(func, rng, {case.symbolic: value})
        got = k(*[cupy.asarray(x) for x in inputs])
        assert isinstance(got, cupy.ndarray)
        assert_close(cupy.asnumpy(got), case.expected(*inputs), case.tol, f"{case.name} on the GPU at {value}")


def test_dynamic_shared_memory_on_gpu(cupy: Any, rng: np.random.Generator) -> None:
    s = reduce_through_shared(8192)  # 64 KB of dynamic shared memory: needs the opt-in attribute
    k = sl.build(s, "sm_90")
    (X,) = random_inputs(s.func, rng, {"M": 5})
    got = cupy.asnumpy(k(cupy.asarray(X)))
    np.testing.assert_allclose(got, X.astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-3)


def test_unfused_softmax_kernels_on_gpu(cupy: Any, rng: np.random.Generator) -> None:
    f = sl.workloads.softmax(sl.var("M"), 45)
    k = sl.build(rules.get_rule("fallback").apply(f, "h100"), "sm_90")
    assert len(k.launch) == 4
    (X,) = random_inputs(f, rng, {"M": 33})
    x = X.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(cupy.asnumpy(k(cupy.asarray(X))), e / e.sum(axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


def test_given_output_is_written_in_place_on_gpu(cupy: Any, rng: np.random.Generator) -> None:
    func, k = _symbolic_kernel(CASES[0])  # matmul + bias + relu
    A, B, bias = random_inputs(func, rng, {"M": 7})
    out = cupy.full((7, 45), cupy.nan, dtype=cupy.float32)
    got = k(cupy.asarray(A), cupy.asarray(B), cupy.asarray(bias), out)
    assert got is out
    assert_close(cupy.asnumpy(out), CASES[0].expected(A, B, bias), CASES[0].tol, "in-place output")


def test_host_arrays_are_refused_with_a_pointer_to_run_cpu(cupy: Any, rng: np.random.Generator) -> None:
    func, k = _symbolic_kernel(CASES[0])
    A, B, bias = random_inputs(func, rng, {"M": 7})
    with pytest.raises(sl.ShapeError, match=r"argument A is a host numpy array; .*run_cpu"):
        k(A, B, bias)


def test_too_many_arrays_are_refused_on_gpu(cupy: Any, rng: np.random.Generator) -> None:
    func, k = _symbolic_kernel(CASES[0])
    arrays = [cupy.asarray(x) for x in random_inputs(func, rng, {"M": 7})]
    out = cupy.empty((7, 45), dtype=cupy.float32)
    with pytest.raises(sl.ShapeError, match=r"got 5 arrays"):
        k(*arrays, out, out)


MISALIGNED = textwrap.dedent("""
    import sys
    sys.path[:0] = [{repo!r}, {here!r}]
    import cupy, numpy as np, schedlib as sl
    from cg_schedules import schedule_matmul
    f = sl.workloads.matmul(sl.var("M"), 64, 32)
    k = sl.build(schedule_matmul(f, BM=32, BN=64, BK=16, TM=4, TN=4, vec=4), "sm_90")
    assert "SL_VLOAD(uint4, B," in k.source
    rng = np.random.default_rng()
    A = rng.standard_normal((37, 32), dtype=np.float32)
    B = rng.standard_normal((32, 64), dtype=np.float32)
    flat = cupy.empty(B.size + 1, dtype=cupy.float32)
    flat[1:] = cupy.asarray(B.ravel())
    view = flat[1:].reshape(B.shape)  # C-contiguous, but 4 bytes past a 16-byte boundary
    assert view.flags.c_contiguous and view.data.ptr % 16 == 4
    try:
        got = cupy.asnumpy(k(cupy.asarray(A), view))
    except sl.ShapeError as exc:  # refusing the view with a clear message is fine too
        assert "align" in str(exc), exc
    else:
        np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    print("OK")
""")


def test_misaligned_device_views_are_safe(cupy: Any) -> None:
    """Run in a child process: a misaligned-address fault poisons the CUDA context for every later test."""
    here = Path(__file__).resolve().parent
    code = MISALIGNED.format(repo=str(here.parents[1]), here=str(here))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


class DLPackOnly:
    """An array that offers nothing but the DLPack protocol (no cupy type, no __cuda_array_interface__)."""

    def __init__(self, arr: Any) -> None:
        self._arr = arr
        self.shape = arr.shape
        self.dtype = arr.dtype

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._arr.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._arr.__dlpack_device__()


def test_dlpack_objects_are_accepted(cupy: Any, rng: np.random.Generator) -> None:
    case = next(c for c in CASES if c.name == "layernorm")
    func, k = _symbolic_kernel(case)
    inputs = random_inputs(func, rng, {"rows": 9})
    wrapped = [DLPackOnly(cupy.asarray(x)) for x in inputs]
    assert not any(hasattr(w, "__cuda_array_interface__") for w in wrapped)
    got = cupy.asnumpy(k(*wrapped))
    assert_close(got, case.expected(*inputs), case.tol, "layernorm through DLPack")


@pytest.fixture
def torch_cuda() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch cannot see a CUDA device")
    return torch


@pytest.mark.parametrize("name", ["matmul_fp16", "softmax", "gemv_t_bias_relu"])
def test_torch_tensors_are_accepted(cupy: Any, torch_cuda: Any, name: str, rng: np.random.Generator) -> None:
    case = next(c for c in CASES if c.name == name)
    func, k = _symbolic_kernel(case)
    inputs = random_inputs(func, rng, {case.symbolic: 33})
    tensors = [torch_cuda.from_numpy(x).cuda() for x in inputs]
    got = cupy.asnumpy(k(*tensors))
    assert_close(got, case.expected(*inputs), case.tol, f"{name} from torch tensors")


def test_torch_output_tensor_is_written_in_place(cupy: Any, torch_cuda: Any, rng: np.random.Generator) -> None:
    case = next(c for c in CASES if c.name == "transpose")
    func, k = _symbolic_kernel(case)
    (X,) = random_inputs(func, rng, {"M": 50})
    out = torch_cuda.zeros((40, 50), dtype=torch_cuda.float32, device="cuda")
    k(torch_cuda.from_numpy(X).cuda(), out)
    torch_cuda.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), X.T)


def test_tensor_core_templates_on_gpu(cupy: Any) -> None:
    """Every tensor-core template this GPU has (wgmma on Hopper, mma.sync on sm_80+), every operand layout, fp16
    and bf16: the same self-check the GPU suite runs first."""
    df = sl.report.tensor_core_selfcheck(sl.hw.detect(), backend="gpu")
    ran = df[~df["error"].str.startswith("not available")]
    if ran.empty:
        pytest.skip(f"this GPU has no tensor-core matmul template: {df['error'].iloc[0]}")
    assert ran["ok"].all(), ran[["template", "case", "max_err", "error"]].to_string()


def test_prepared_launch_on_gpu(cupy: Any, rng: np.random.Generator) -> None:
    """``prepare`` binds once; each ``launch()`` recomputes the same output (the buffer is cleared between)."""
    func, k = _symbolic_kernel(CASES[0])
    inputs = random_inputs(func, rng, {CASES[0].symbolic: CASES[0].values[-1]})
    prepared = k.prepare(*[cupy.asarray(x) for x in inputs])
    for _ in range(2):
        for out in prepared.outputs.values():
            out.fill(float("nan"))
        prepared.launch()
        assert_close(cupy.asnumpy(prepared.result()), CASES[0].expected(*inputs), CASES[0].tol, "prepared launch")
