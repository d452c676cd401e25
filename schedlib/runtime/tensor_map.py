"""TMA tensor maps for the launch parameters a kernel declares
(:class:`schedlib.codegen.kernel_writer.TensorMapSpec`).

A tensor map describes a global array to the Tensor Memory Accelerator: its base address, sizes and strides,
the box one copy moves and the swizzle it applies in shared memory.  Kernels view every operand as
``[batch, rows, cols]`` (innermost last), so the map is three-dimensional: ``cols`` innermost, then ``rows``,
then the product of any leading dimensions.

* On the GPU the driver encodes it (``cuTensorMapEncodeTiled``, called through ctypes on ``libcuda``: cupy
  does not wrap it) into its opaque 128-byte object, which is copied to device memory and passed by pointer.
* On the CPU emulator it is schedlib's own 128-byte layout, read by ``sl_emu_tma.h``.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from typing import Any

import numpy as np

from schedlib.codegen.kernel_spec import TensorMapSpec
from schedlib.errors import BuildError, ShapeError

WORDS = 16  # 128 bytes, as uint64
MAP_BYTES = 8 * WORDS
EMULATOR_MAGIC = 0x3130504D544C53  # "SLTMP01": sl_emu_tma.h refuses anything else
# cuda.h enumerations (CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion, ...)
_DTYPE = {"float16": 6, "bfloat16": 9}
_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
_L2_PROMOTION_256B = 3
_INTERLEAVE_NONE = 0
_OOB_FILL_ZERO = 0


def geometry(shape: tuple[int, ...], itemsize: int, name: str) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """(sizes innermost first, byte strides of dimensions 1 and 2) of a C-contiguous array seen as 3-D.

    Tensor maps need every stride a multiple of 16 bytes: a ``ShapeError`` says which array breaks that."""
    if not 1 <= len(shape) <= 3:
        raise ShapeError(f"{name}: a tensor map views at most 3 dimensions, the array has shape {list(shape)}")
    dims = [1, 1, 1]
    for i, d in enumerate(reversed(shape)):
        dims[i] = int(d)
    row = dims[0] * itemsize
    if row % 16:
        raise ShapeError(f"{name}: rows of {dims[0]} elements ({row} bytes) are not whole 16-byte units, which TMA "
                         "copies need; use the cp.async template (tensor_core='wgmma') for this shape")
    return (dims[0], dims[1], dims[2]), (row, row * dims[1])


def emulator_encode(address: int, shape: tuple[int, ...], itemsize: int, req: TensorMapSpec) -> np.ndarray:
    """The emulator's 128-byte tensor map of the array at host ``address``."""
    dims, strides = geometry(shape, itemsize, req.buffer)
    words = np.zeros(WORDS, dtype=np.uint64)
    words[0] = EMULATOR_MAGIC
    words[1] = address
    words[2] = 3 | (itemsize << 8) | (req.swizzle << 16)
    words[3:6] = dims
    words[6:8] = strides
    words[8] = req.box[0] | (req.box[1] << 16) | (req.box[2] << 32)
    return words


_DRIVER: Any = None


def _driver() -> Any:
    global _DRIVER
    if _DRIVER is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BuildError(f"TMA tensor maps need the CUDA driver library (libcuda.so.1): {exc}") from None
        try:
            fn = lib.cuTensorMapEncodeTiled
        except AttributeError:
            raise BuildError("TMA tensor maps need cuTensorMapEncodeTiled, which this CUDA driver does not have "
                             "(it came with CUDA 12.0): update the NVIDIA driver") from None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                       ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        _DRIVER = fn
    return _DRIVER


# Encoded maps by what they describe: a timed loop relaunching one kernel on the same arrays must not pay a
# driver call and a host-to-device copy (which would land inside its CUDA-event interval) on every launch.
_CACHE: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_CACHE_SIZE = 64


def gpu_encode(cp: Any, array: Any, req: TensorMapSpec) -> Any:
    """The driver's tensor map of a cupy ``array``, in device memory (a cupy uint64 array of 16 words); the same
    address, shape, dtype, box and swizzle give the same (cached) map."""
    key = (int(array.data.ptr), tuple(array.shape), str(array.dtype), req)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    words = _encode(cp, array, req)
    _CACHE[key] = words
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return words


def _encode(cp: Any, array: Any, req: TensorMapSpec) -> Any:
    itemsize = int(array.dtype.itemsize)
    dims, strides = geometry(tuple(array.shape), itemsize, req.buffer)
    if array.data.ptr % 16:
        raise ShapeError(f"{req.buffer}: a tensor map needs a 16-byte aligned base address")
    # The driver writes the map only to a 64-byte aligned address (CUDA 13 declares CUtensorMap 128-byte
    # aligned).  A ctypes array of 16 words is not: CPython's allocator puts it 48 bytes past a 64-byte line.
    raw = (ctypes.c_uint8 * (2 * MAP_BYTES))()
    out = -ctypes.addressof(raw) % MAP_BYTES + ctypes.addressof(raw)
    c64, c32 = ctypes.c_uint64, ctypes.c_uint32
    rc = _driver()(out, _DTYPE[req.dtype], 3, ctypes.c_void_p(array.data.ptr),
                   (c64 * 3)(*dims), (c64 * 2)(*strides), (c32 * 3)(*req.box), (c32 * 3)(1, 1, 1),
                   _INTERLEAVE_NONE, _SWIZZLE[req.swizzle], _L2_PROMOTION_256B, _OOB_FILL_ZERO)
    if rc != 0:
        raise BuildError(f"cuTensorMapEncodeTiled refused the tensor map of {req.buffer} (CUresult {rc}): "
                         f"sizes {dims}, byte strides {strides}, box {req.box}, swizzle {req.swizzle} bytes")
    return cp.asarray(np.frombuffer(ctypes.string_at(out, MAP_BYTES), dtype=np.uint64))
