"""The ctypes side of the emulator's C ABI (``sl_emu_launch_t`` in ``sl_emu_launch.h``).

Arguments travel with a kind tag (pointer / integer / float), the numpy dtype name of arrays and
their byte sizes, so the C side can check them against the kernel's real parameter types and
report a mismatch by parameter name instead of running a kernel on misread memory.
Arrays are passed in place; one whose data is not 256-byte aligned (like cudaMalloc memory) is
staged through an aligned copy, so vector-access alignment behaves as on the GPU, and so is one in
non-native byte order (its values are converted, and converted back on write-back).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from schedlib.codegen.kernel_spec import TensorMapSpec
from schedlib.errors import EmulatorError
from schedlib.runtime.tensor_map import emulator_encode

ABI_VERSION = 1  # SL_EMU_ABI_VERSION in sl_emu_launch.h; bump both when LaunchStruct changes
KIND_PTR, KIND_INT, KIND_FLOAT = 0, 1, 2
ALIGN = 256
ERR_BYTES = 8192
_INT64 = (-(2**63), 2**63 - 1)


class LaunchStruct(ctypes.Structure):
    """Mirror of ``sl_emu_launch_t``; field order and types must match the header exactly."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("dyn_smem", ctypes.c_ulonglong),
        ("threads", ctypes.c_int),
        ("stack_kb", ctypes.c_int),
        ("nargs", ctypes.c_int),
        ("names", ctypes.POINTER(ctypes.c_char_p)),
        ("kinds", ctypes.POINTER(ctypes.c_int)),
        ("dtypes", ctypes.POINTER(ctypes.c_char_p)),
        ("ptrs", ctypes.POINTER(ctypes.c_void_p)),
        ("nbytes", ctypes.POINTER(ctypes.c_ulonglong)),
        ("readonly", ctypes.POINTER(ctypes.c_int)),
        ("ivals", ctypes.POINTER(ctypes.c_longlong)),
        ("fvals", ctypes.POINTER(ctypes.c_double)),
    ]


def _aligned_empty(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start : start + nbytes]


@dataclass
class DeviceArrays:
    """The buffers kernels see for each caller array, kept for all launches of one emulate() call.

    Staged copies are written back by :meth:`write_back`, so aliasing (one array passed under two
    names) and persistence across launches behave like device memory.
    """

    _by_id: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def get(self, name: str, arr: np.ndarray) -> np.ndarray:
        if not arr.flags.c_contiguous:
            raise EmulatorError(f"argument {name!r}: the array must be C-contiguous (use np.ascontiguousarray)")
        if arr.dtype.hasobject:
            raise EmulatorError(f"argument {name!r}: object arrays cannot be passed to a kernel")
        hit = self._by_id.get(id(arr))
        if hit is not None:
            return hit[1]
        if arr.dtype.isnative and (arr.nbytes == 0 or arr.ctypes.data % ALIGN == 0):
            dev = arr
        else:  # misaligned, or byte-swapped (">f4" reads as garbage in C): a native, aligned staged copy
            dev = _aligned_empty(arr.nbytes).view(arr.dtype.newbyteorder("=")).reshape(arr.shape)
            dev[...] = arr
            if not arr.flags.writeable:
                dev.flags.writeable = False
        self._by_id[id(arr)] = (arr, dev)
        return dev

    def write_back(self) -> None:
        for host, dev in self._by_id.values():
            if dev is not host and host.flags.writeable:
                host[...] = dev


def pack_launch(
    kernel: str,
    grid: Sequence[int],
    block: Sequence[int],
    dynamic_smem: int,
    params: Sequence[str],
    args: Mapping[str, object],
    arrays: DeviceArrays,
    *,
    threads: int,
    stack_kb: int,
) -> tuple[LaunchStruct, list[object]]:
    """Build the launch struct; the returned list keeps every buffer it points to alive."""
    n = len(params)
    names = (ctypes.c_char_p * n)()
    kinds = (ctypes.c_int * n)()
    dtypes = (ctypes.c_char_p * n)()
    ptrs = (ctypes.c_void_p * n)()
    nbytes = (ctypes.c_ulonglong * n)()
    readonly = (ctypes.c_int * n)()
    ivals = (ctypes.c_longlong * n)()
    fvals = (ctypes.c_double * n)()
    keep: list[object] = [names, kinds, dtypes, ptrs, nbytes, readonly, ivals, fvals]
    for i, pname in enumerate(params):
        if pname not in args:
            raise EmulatorError(f"kernel {kernel!r}: parameter {i} {pname!r} has no entry in args")
        value = args[pname]
        bname = pname.encode()
        keep.append(bname)
        names[i] = bname
        if isinstance(value, np.ndarray):
            dev = arrays.get(pname, value)
            dname = dev.dtype.name.encode()
            keep.extend((dev, dname))
            kinds[i], dtypes[i], ptrs[i] = KIND_PTR, dname, dev.ctypes.data
            nbytes[i], readonly[i] = dev.nbytes, int(not dev.flags.writeable)
        elif isinstance(value, TensorMapSpec):
            if not isinstance(args.get(value.buffer), np.ndarray):
                raise EmulatorError(f"kernel {kernel!r}: tensor map {pname!r} describes {value.buffer!r}, "
                                    "which is not an array argument")
            dev = arrays.get(value.buffer, args[value.buffer])  # type: ignore[arg-type]
            words = emulator_encode(dev.ctypes.data, tuple(dev.shape), dev.itemsize, value)
            keep.extend((words, b"uint64"))
            kinds[i], dtypes[i], ptrs[i] = KIND_PTR, b"uint64", words.ctypes.data
            nbytes[i], readonly[i] = words.nbytes, 1
        elif isinstance(value, (bool, int, np.integer)):
            v = int(value)
            if not _INT64[0] <= v <= _INT64[1]:
                raise EmulatorError(f"kernel {kernel!r}: parameter {i} {pname!r}: {v} does not fit in 64 bits")
            kinds[i], ivals[i] = KIND_INT, v
        elif isinstance(value, (float, np.floating)):
            kinds[i], fvals[i] = KIND_FLOAT, float(value)
        else:
            raise EmulatorError(
                f"kernel {kernel!r}: parameter {i} {pname!r}: cannot pass a {type(value).__name__} "
                "(numpy arrays, ints and floats only)"
            )
    launch = LaunchStruct()
    launch.grid[:] = list(grid)
    launch.block[:] = list(block)
    launch.dyn_smem = dynamic_smem
    launch.threads = threads
    launch.stack_kb = stack_kb
    launch.nargs = n
    launch.names, launch.kinds, launch.dtypes, launch.ptrs = names, kinds, dtypes, ptrs
    launch.nbytes, launch.readonly, launch.ivals, launch.fvals = nbytes, readonly, ivals, fvals
    return launch, keep


def call_entry(lib: ctypes.CDLL, entry: str, launch: LaunchStruct) -> str | None:
    """Run one launch through its C entry point; the error message, or None on success."""
    fn = getattr(lib, entry)
    fn.argtypes = [ctypes.POINTER(LaunchStruct), ctypes.c_char_p, ctypes.c_ulonglong]
    fn.restype = ctypes.c_int
    err = ctypes.create_string_buffer(ERR_BYTES)
    rc = fn(ctypes.byref(launch), err, ERR_BYTES)
    return err.value.decode(errors="replace") if rc != 0 else None
