"""Running a Kernel on the GPU through cupy: argument conversion, module cache, launches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from schedlib.cache import content_hash
from schedlib.errors import BuildError, ShapeError
from schedlib.ir.dtype import bfloat16_bits, numpy_dtype
from schedlib.runtime.index_range import exact_int
from schedlib.runtime.launch_checks import bound_symbols, check_device_overlap, launch_grids
from schedlib.runtime.nvcc import build_cubin
from schedlib.runtime.tensor_map import gpu_encode

_MODULES: dict[str, Any] = {}
STATIC_SMEM_LIMIT = 48 * 1024


def require_cupy() -> Any:
    """cupy with at least one visible device, or a BuildError saying what is missing."""
    try:
        import cupy
    except ImportError:
        raise BuildError("running on the GPU needs cupy: pip install 'schedlib[cuda12]' or 'schedlib[cuda13]'; "
                         "without a GPU use Kernel.run_cpu to emulate") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # cupy raises CUDARuntimeError without a driver
        raise BuildError(f"no usable CUDA device ({exc}); use Kernel.run_cpu to emulate") from None
    if count < 1:
        raise BuildError("no CUDA device is visible; use Kernel.run_cpu to emulate")
    return cupy


def gpu_available() -> bool:
    try:
        require_cupy()
    except BuildError:
        return False
    return True


def to_device(cp: Any, x: Any, name: str, kernel: str = "") -> Any:
    if isinstance(x, cp.ndarray):
        return x
    try:
        exported = getattr(x, "__cuda_array_interface__", None) is not None
    except Exception:  # torch raises RuntimeError for a tensor that requires grad: DLPack below says why
        exported = False
    if exported:
        return cp.asarray(x)
    if isinstance(x, np.ndarray):  # before DLPack: numpy arrays export it too, from host memory
        raise ShapeError(f"{_of(kernel)}argument {name} is a host numpy array; pass cupy.asarray(x), "
                         "or use run_cpu")
    if hasattr(x, "__dlpack__"):
        try:
            return cp.from_dlpack(x)
        except Exception as exc:
            raise ShapeError(f"{_of(kernel)}argument {name}: cannot take it through DLPack ({exc})") from None
    raise ShapeError(f"{_of(kernel)}argument {name} ({type(x).__name__}) is not a device array")


def _of(kernel: str) -> str:
    return f"kernel {kernel}: " if kernel else ""


def module_for(cp: Any, source: str, arch: str | None = None) -> Any:
    """The loaded module of ``source``; ``arch``: the one architecture it builds for (None: cupy's JIT)."""
    key = content_hash(source)
    mod = _MODULES.get(key)
    if mod is None:
        if arch is None:
            mod = cp.RawModule(code=source, options=("-std=c++17",))
        else:  # cupy's JIT builds for the device's plain architecture (sm_90), which has no wgmma
            major, minor = _capability(cp)
            if arch != f"sm_{major}{minor}a":
                raise BuildError(f"this kernel needs {arch}; the device is sm_{major}{minor}")
            mod = cp.RawModule(path=str(build_cubin(source, arch)))
        _MODULES[key] = mod
    return mod


def _capability(cp: Any) -> tuple[str, str]:
    cc = str(cp.cuda.Device().compute_capability)  # "90"
    return cc[:-1], cc[-1]


class PreparedLaunch:
    """One call of a kernel with its arguments checked, converted and bound once.

    :meth:`launch` only enqueues the kernels on the current stream, with no argument checks, conversions,
    allocations or lookups, so a timed loop repeats exactly the device work (host work between a start event
    and the kernel would be counted as device time whenever it outlasts the work queued before the event).
    :meth:`result` gives the outputs of the latest launch.  Arrays the preparation had to convert (bfloat16
    inputs, non-contiguous or misaligned ones) are bound as the copies made then: later writes to the
    originals are not seen; contiguous arrays of the kernel's own types are bound as they are.
    """

    def __init__(self, kernel: Any, launches: list[tuple[Any, tuple[int, int, int], tuple[int, int, int],
                                                         tuple[Any, ...], int]],
                 outputs: dict[str, Any], bf16_outputs: dict[str, Any]) -> None:
        self.kernel = kernel
        self._launches = launches
        self.outputs = outputs
        self._bf16_outputs = bf16_outputs  # output name -> the 16-bit buffer the kernel writes

    def launch(self) -> None:
        for fn, grid, block, params, smem in self._launches:
            fn(grid, block, params, shared_mem=smem)

    def result(self) -> Any:
        for name, bits in self._bf16_outputs.items():
            self.outputs[name][...] = (bits.astype("uint32") << 16).view("float32")
        return self.kernel._result(self.outputs)

    def __repr__(self) -> str:
        return f"<PreparedLaunch {self.kernel.func.name}: {len(self._launches)} kernel(s)>"


def prepare_on_gpu(kernel: Any, arrays: Sequence[Any]) -> PreparedLaunch:
    """Check and convert ``arrays`` for ``kernel``, allocate its outputs and scratch, encode its tensor maps and
    load its module: everything a call does except enqueueing the kernels."""
    cp = require_cupy()
    func = kernel.func
    names = [*func.inputs, *func.outputs]
    kernel._split_args(arrays)  # count check first, so extra arrays are refused rather than dropped
    arrays = [to_device(cp, a, n, func.name) for a, n in zip(arrays, names)]
    n_in = len(func.inputs)
    given_in, given_out = kernel._split_args(arrays)
    if given_out is not None:  # the arrays as given: an input copied below would hide the overlap it has
        check_device_overlap(func, given_in, given_out)
    for i, (a, n) in enumerate(zip(arrays, names)):
        if a.data.ptr % 16:
            if i >= n_in:
                raise ShapeError(f"kernel {func.name}: output {n} starts at an address that is not 16-byte "
                                 "aligned; pass a freshly allocated array")
            arrays[i] = cp.array(a, copy=True)  # vector loads need 16-byte alignment
    inputs, outputs = kernel._split_args(arrays)
    symbols = bound_symbols(func, inputs, kernel._launch_cache, kernel.declared)
    args: dict[str, Any] = {}
    for name, arr in inputs.items():
        args[name] = _device_bf16(cp, arr) if func.buffer(name).dtype == "bfloat16" else cp.ascontiguousarray(arr)
    if outputs is None:
        outputs = {n: cp.empty(s, dtype=numpy_dtype(func.buffer(n).dtype))
                   for n, s in kernel._shapes(symbols, func.outputs).items()}
    else:
        kernel._check_outputs(outputs, symbols)
    bf16_outputs: dict[str, Any] = {}
    for name, arr in outputs.items():
        if func.buffer(name).dtype == "bfloat16":
            args[name] = bf16_outputs[name] = cp.empty(arr.shape, dtype=cp.uint16)
        else:
            if not arr.flags.c_contiguous:
                raise ShapeError(f"kernel {func.name}: output {name} must be C-contiguous")
            args[name] = arr
    for buf in kernel.module.scratch:
        shape = tuple(exact_int(d, symbols) for d in buf.shape)
        args[buf.name] = cp.empty(shape, dtype=cp.uint16 if buf.dtype == "bfloat16" else numpy_dtype(buf.dtype))
    for spec in kernel.launch:
        for tm in spec.tensor_maps:  # in device memory, encoded from the very arrays launched with
            args[tm.param] = gpu_encode(cp, args[tm.buffer], tm)
    module = kernel._gpu_module
    if module is None:
        module = kernel._gpu_module = module_for(cp, kernel.source, kernel.module.arch)
    launches = []
    for spec, grid in zip(kernel.launch, launch_grids(func, kernel.launch, symbols, kernel._launch_cache)):
        fn = module.get_function(spec.name)
        if spec.dynamic_smem > STATIC_SMEM_LIMIT:
            fn.max_dynamic_shared_size_bytes = spec.dynamic_smem
        # symbol values were checked to fit int32 (bound_symbols)
        params = tuple(np.int32(symbols[p[1:]]) if p.startswith("$") else args[p] for p in spec.params)
        launches.append((fn, grid, spec.block, params, spec.dynamic_smem))
    return PreparedLaunch(kernel, launches, outputs, bf16_outputs)


def launch_on_gpu(kernel: Any, arrays: Sequence[Any]) -> Any:
    """One call: prepare, enqueue, return the outputs."""
    prepared = prepare_on_gpu(kernel, arrays)
    prepared.launch()
    return prepared.result()


def _device_bf16(cp: Any, arr: Any) -> Any:
    """float32 values -> bfloat16 bit patterns (round to nearest even), on the device, as the host does."""
    return bfloat16_bits(arr, cp)
