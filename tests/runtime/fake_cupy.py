"""A stand-in for cupy on a machine without a GPU, for the tests of the GPU paths (``Kernel.prepare``, the
report's measured timing).

Arrays live in host memory; a loaded kernel runs each launch on the CPU emulator with exactly the grid, block
and parameters it was given; CUDA events read a clock that advances 10 us per operation the stand-in sees: a
kernel launch, a vendor matmul, and also a host-side conversion or allocation (on a GPU, host work between two
events delays the kernel and is measured as if it were device time).  Every such call and module load is
counted, and every launch is logged, so a test can check what happens between two events.
"""

from __future__ import annotations

import types
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from schedlib.runtime import gpu, timing
from schedlib.runtime.emulator import KernelLaunch, emulate

US_PER_OPERATION = 10.0


class DeviceArray(np.ndarray):
    """A host array that answers ``.data.ptr`` like a cupy array."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=self.ctypes.data)


def on_device(x: Any) -> DeviceArray:
    return np.ascontiguousarray(x).view(DeviceArray)


class FakeCupy(types.ModuleType):
    """The part of cupy schedlib uses; a module, so that it can stand in for ``import cupy``."""

    ndarray = DeviceArray
    uint16, uint32, uint64, float32 = np.uint16, np.uint32, np.uint64, np.float32
    isnan = staticmethod(np.isnan)

    def __init__(self) -> None:
        super().__init__("cupy")
        self.calls: Counter[str] = Counter()
        self.operations = 0  # operations so far: what the fake events read
        fake = self

        class Event:
            def __init__(self) -> None:
                self.at: int | None = None

            def record(self) -> None:
                self.at = fake.operations

            def synchronize(self) -> None:
                pass

        def elapsed_ms(start: Event, stop: Event) -> float:
            assert start.at is not None and stop.at is not None, "an event was never recorded"
            return (stop.at - start.at) * US_PER_OPERATION / 1000

        self.cuda = SimpleNamespace(Event=Event, get_elapsed_time=elapsed_ms,
                                    runtime=SimpleNamespace(getDeviceCount=lambda: 1))

    def asarray(self, x: Any) -> DeviceArray:
        self.calls["asarray"] += 1
        self.operations += 1
        return on_device(x)

    def ascontiguousarray(self, x: Any, dtype: Any = None) -> DeviceArray:
        self.calls["ascontiguousarray"] += 1
        self.operations += 1
        return on_device(np.asarray(x, dtype=dtype))

    def empty(self, shape: Any, dtype: Any) -> DeviceArray:
        self.calls["empty"] += 1
        self.operations += 1
        return on_device(np.full(shape, 0xFF if np.dtype(dtype).kind in "iu" else np.nan, dtype=dtype))

    def array(self, x: Any, copy: bool = True) -> DeviceArray:
        self.calls["array"] += 1
        self.operations += 1
        return on_device(np.array(x, copy=copy))

    def where(self, condition: Any, x: Any, y: Any) -> DeviceArray:
        self.operations += 1
        return on_device(np.where(condition, x, y))

    def from_dlpack(self, x: Any) -> DeviceArray:
        self.calls["from_dlpack"] += 1
        self.operations += 1
        return on_device(np.from_dlpack(x))

    def matmul(self, a: Any, b: Any) -> DeviceArray:
        self.operations += 1
        return on_device(np.matmul(a, b))

    maximum = staticmethod(np.maximum)


class EmulatedFunction:
    """A loaded kernel: each call runs it on the emulator with the launch it was given, and is logged."""

    def __init__(self, cp: FakeCupy, source: str, spec: Any, log: list[tuple[Any, ...]]) -> None:
        self.cp, self.source, self.spec, self.log = cp, source, spec, log
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int], params: tuple[Any, ...],
                 shared_mem: int = 0) -> None:
        self.cp.operations += 1
        self.log.append((self.spec.name, grid, block, params, shared_mem))
        args = {name: (int(v) if name.startswith("$") else np.asarray(v)) for name, v in zip(self.spec.params, params)}
        emulate(self.source, [KernelLaunch(self.spec.name, grid, block, self.spec.params, shared_mem)], args)


def install(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Put the stand-in where schedlib looks for cupy; returns the state a test inspects: ``cp``, ``loads``
    (modules loaded), ``launches`` (the log) and ``kernel`` (the latest one prepared)."""
    cp = FakeCupy()
    state = SimpleNamespace(cp=cp, loads=0, launches=[], kernel=None)
    prepare = gpu.prepare_on_gpu

    def prepare_on_gpu(kernel: Any, arrays: Any) -> Any:
        state.kernel = kernel  # the loaded module below needs its launch specs (parameter names)
        return prepare(kernel, arrays)

    def module_for(_cp: Any, source: str, arch: str | None = None) -> Any:
        state.loads += 1
        specs = {s.name: s for s in state.kernel.launch}
        return SimpleNamespace(get_function=lambda name: EmulatedFunction(cp, source, specs[name], state.launches))

    monkeypatch.setitem(__import__("sys").modules, "cupy", cp)
    for module in (gpu, timing):
        monkeypatch.setattr(module, "require_cupy", lambda: cp)
    monkeypatch.setattr(gpu, "prepare_on_gpu", prepare_on_gpu)
    monkeypatch.setattr(gpu, "module_for", module_for)
    return state
