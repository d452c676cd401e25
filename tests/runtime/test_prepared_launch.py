"""``Kernel.prepare``: a call's host work done once, so a timing loop repeats only the kernels.

There is no GPU here, so a stand-in for cupy (``fake_cupy.py``) holds arrays in host memory and its
"module" runs each launch on the CPU emulator with exactly the grid, block and parameters it was given.  That
checks what the GPU path binds (the parameter order, symbols, outputs, bfloat16 conversion) and, with
counters on every conversion, allocation and module load, that ``launch()`` does nothing but enqueue kernels.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from emu_kernels import needs_gxx
from fake_cupy import install
from fake_cupy import on_device as _device

import schedlib as sl
from schedlib.errors import ShapeError
from schedlib.ir.reference import run_reference
from schedlib.runtime.kernel import Kernel

pytestmark = needs_gxx


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    return install(monkeypatch)


def _kernel(func: sl.Func) -> Kernel:
    return sl.build(sl.rules.apply_default(func, "h100"), "h100")


def test_launch_repeats_only_the_kernels(device: SimpleNamespace, rng: np.random.Generator) -> None:
    func = sl.workloads.rmsnorm(rows=6, cols=200)
    kernel = _kernel(func)
    inputs = [rng.standard_normal(tuple(int(d.value) for d in func.buffer(n).shape)).astype(np.float32)
              for n in func.inputs]
    prepared = kernel.prepare(*(_device(x) for x in inputs))
    host_work = (dict(device.cp.calls), device.loads)
    assert device.launches == []  # preparing enqueues nothing
    for _ in range(3):
        prepared.launch()
    assert (dict(device.cp.calls), device.loads) == host_work  # no conversion, allocation or load per launch
    assert len(device.launches) == 3 * len(kernel.launch)
    first = device.launches[: len(kernel.launch)]
    for i, call in enumerate(device.launches):  # the very same bound launch every time
        assert call[1:3] == first[i % len(first)][1:3]
        assert all(a is b for a, b in zip(call[3], first[i % len(first)][3]))
    want = run_reference(func, dict(zip(func.inputs, inputs)))
    np.testing.assert_allclose(np.asarray(prepared.result()), want[func.outputs[0]], rtol=1e-4, atol=1e-5)


def test_a_call_is_prepare_launch_result_and_loads_the_module_once(device: SimpleNamespace,
                                                                   rng: np.random.Generator) -> None:
    func = sl.workloads.matmul(M=40, N=24, K=32)
    kernel = _kernel(func)
    a, b = (rng.standard_normal((40, 32)).astype(np.float32), rng.standard_normal((32, 24)).astype(np.float32))
    first = kernel(_device(a), _device(b))
    np.testing.assert_allclose(np.asarray(first), a @ b, rtol=1e-4, atol=1e-4)
    out = _device(np.zeros((40, 24), np.float32))
    got = kernel(_device(2 * a), _device(b), out)
    assert got is out  # a given output is written in place and returned
    np.testing.assert_allclose(np.asarray(out), 2 * (a @ b), rtol=1e-4, atol=1e-4)
    assert device.loads == 1  # the kernel keeps its module; the source is not hashed again per call


def test_bfloat16_outputs_are_converted_after_the_kernels(device: SimpleNamespace, rng: np.random.Generator) -> None:
    func = sl.workloads.elementwise((300,), chain=("add", "relu"), dtype="bfloat16")
    kernel = _kernel(func)
    x = rng.standard_normal(300).astype(np.float32)
    prepared = kernel.prepare(*(_device(x) for _ in func.inputs))
    prepared.launch()
    got = np.asarray(prepared.result())
    want = run_reference(func, {n: x for n in func.inputs})[func.outputs[0]]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_bad_arguments_are_refused_before_anything_is_loaded(device: SimpleNamespace) -> None:
    func = sl.workloads.matmul(M=16, N=16, K=16)
    kernel = _kernel(func)
    with pytest.raises(ShapeError, match="takes 2 inputs"):
        kernel.prepare(_device(np.zeros((16, 16), np.float32)))
    with pytest.raises(ShapeError, match="host numpy array"):
        kernel.prepare(np.zeros((16, 16), np.float32), np.zeros((16, 16), np.float32))
    with pytest.raises(ShapeError, match="output C must be"):
        kernel.prepare(*(_device(np.zeros((16, 16), np.float32)) for _ in range(2)),
                       _device(np.zeros((16, 8), np.float32)))
    assert device.loads == 0 and device.launches == []


class GradTensor:
    """What a torch tensor that requires grad does: both exports raise, naming the fix."""

    @property
    def __cuda_array_interface__(self) -> dict:
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad. Use var.detach()")

    def __dlpack__(self, stream: object = None) -> object:
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")


def test_an_array_that_refuses_to_export_is_a_shape_error_naming_why(device: SimpleNamespace) -> None:
    kernel = _kernel(sl.workloads.matmul(M=16, N=16, K=16))
    with pytest.raises(ShapeError, match=r"argument A: cannot take it through DLPack \(.*use tensor.detach\(\)\)"):
        kernel.prepare(GradTensor(), _device(np.zeros((16, 16), np.float32)))
    assert device.loads == 0 and device.launches == []
