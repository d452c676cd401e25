"""The GPU side of TMA tensor maps: what is handed to the driver's ``cuTensorMapEncodeTiled`` (checked here
with a stand-in for the driver, since this path needs a device to run for real), and the refusals."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from schedlib.codegen.kernel_spec import TensorMapSpec
from schedlib.errors import BuildError, ShapeError
from schedlib.runtime import tensor_map
from schedlib.runtime.tensor_map import gpu_encode


class FakeDriver:
    """Records the arguments of each call the way the driver would read them, and writes 128 known bytes;
    like the driver, it refuses (CUDA_ERROR_INVALID_VALUE) a map address not aligned to 64 bytes."""

    def __init__(self, result: int = 0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.result = result

    def __call__(self, out: int, dtype: int, rank: int, address: ctypes.c_void_p, dims: Any, strides: Any,
                 box: Any, elem_strides: Any, interleave: int, swizzle: int, l2: int, oob: int) -> int:
        if out % 64:
            return 1
        self.calls.append({"dtype": dtype, "rank": rank, "address": address.value, "dims": list(dims),
                           "strides": list(strides), "box": list(box), "elem_strides": list(elem_strides),
                           "interleave": interleave, "swizzle": swizzle, "l2": l2, "oob": oob})
        ctypes.memmove(out, bytes(range(128)), 128)
        return self.result


def fake_cupy_array(shape: tuple[int, ...], ptr: int = 0x7F0000001000) -> Any:
    return SimpleNamespace(shape=shape, dtype=np.dtype(np.float16), data=SimpleNamespace(ptr=ptr))


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_map, "_CACHE", type(tensor_map._CACHE)())


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    fake = FakeDriver()
    monkeypatch.setattr(tensor_map, "_DRIVER", fake)
    return fake


FAKE_CP = SimpleNamespace(asarray=np.asarray)


def tmap(buffer: str, dtype: str, box: tuple[int, int, int], swizzle: int) -> TensorMapSpec:
    return TensorMapSpec(f"@tmap:{buffer}", buffer, dtype, box, swizzle)


def test_the_driver_gets_the_3d_view_box_and_swizzle(driver: FakeDriver) -> None:
    words = gpu_encode(FAKE_CP, fake_cupy_array((3, 200, 136)), tmap("A", "bfloat16", (64, 128, 1), 128))
    (call,) = driver.calls
    assert call == {"dtype": 9, "rank": 3, "address": 0x7F0000001000, "dims": [136, 200, 3], "strides": [272, 54400],
                    "box": [64, 128, 1], "elem_strides": [1, 1, 1], "interleave": 0, "swizzle": 3, "l2": 3, "oob": 0}
    assert words.dtype == np.uint64 and words.tobytes() == bytes(range(128))  # the driver's bytes, unchanged
    gpu_encode(FAKE_CP, fake_cupy_array((64, 48)), tmap("B", "float16", (32, 16, 1), 64))
    assert driver.calls[1]["dtype"] == 6 and driver.calls[1]["dims"] == [48, 64, 1] and driver.calls[1]["swizzle"] == 2


def test_relaunching_on_the_same_arrays_reuses_the_map(driver: FakeDriver) -> None:
    req = tmap("A", "float16", (64, 128, 1), 128)
    first = gpu_encode(FAKE_CP, fake_cupy_array((256, 64)), req)
    assert gpu_encode(FAKE_CP, fake_cupy_array((256, 64)), req) is first and len(driver.calls) == 1
    gpu_encode(FAKE_CP, fake_cupy_array((256, 64), ptr=0x7F0000100000), req)  # another array: a new map
    gpu_encode(FAKE_CP, fake_cupy_array((128, 64)), req)  # another shape at the same address: a new map
    assert len(driver.calls) == 3


def test_a_refusal_by_the_driver_names_the_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_map, "_DRIVER", FakeDriver(result=1))
    with pytest.raises(BuildError, match=r"refused the tensor map of A \(CUresult 1\): sizes \(64, 8, 1\)"):
        gpu_encode(FAKE_CP, fake_cupy_array((8, 64)), tmap("A", "float16", (64, 8, 1), 128))


def test_misaligned_arrays_are_refused_before_the_driver(driver: FakeDriver) -> None:
    with pytest.raises(ShapeError, match="16-byte aligned base address"):
        gpu_encode(FAKE_CP, fake_cupy_array((8, 64), ptr=0x1008), tmap("A", "float16", (64, 8, 1), 128))
    with pytest.raises(ShapeError, match="rows of 20 elements"):
        gpu_encode(FAKE_CP, fake_cupy_array((8, 20)), tmap("A", "float16", (16, 8, 1), 32))
    assert driver.calls == []


def test_no_driver_library_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(tensor_map, "_DRIVER", None)
    monkeypatch.setattr(tensor_map.ctypes, "CDLL", missing)
    with pytest.raises(BuildError, match=r"need the CUDA driver library \(libcuda.so.1\)"):
        gpu_encode(FAKE_CP, fake_cupy_array((8, 64)), tmap("A", "float16", (64, 8, 1), 128))


def test_the_map_is_written_to_a_128_byte_aligned_address(driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver needs 64 bytes (CUDA 13's CUtensorMap is 128-byte aligned); a ctypes array of 16 words sits
    48 bytes past a 64-byte line, so the map goes to an aligned place inside a larger buffer."""
    seen: list[int] = []

    def recording(out: int, *args: Any) -> int:
        seen.append(out)
        return driver(out, *args)

    monkeypatch.setattr(tensor_map, "_DRIVER", recording)
    for rows in range(8, 8 + 16 * 8, 8):  # sixteen maps: sixteen fresh buffers wherever the allocator puts them
        words = gpu_encode(FAKE_CP, fake_cupy_array((rows, 64)), tmap("A", "float16", (64, 8, 1), 128))
        assert words.tobytes() == bytes(range(128))
    assert len(seen) == 16 and all(out % 128 == 0 for out in seen), [out % 128 for out in seen]


def test_a_driver_without_tensor_maps_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_map, "_DRIVER", None)
    monkeypatch.setattr(tensor_map.ctypes, "CDLL", lambda name: SimpleNamespace())  # a pre-12.0 libcuda
    with pytest.raises(BuildError, match=r"need cuTensorMapEncodeTiled, which this CUDA driver does not have"):
        gpu_encode(FAKE_CP, fake_cupy_array((8, 64)), tmap("A", "float16", (64, 8, 1), 128))
