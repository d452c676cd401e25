"""The measuring worker of the ``gpu`` backend: check, then time, one kernel at a time.

The logic (check against the reference, warm up, flush L2 before every timed repetition, percentiles,
typed failures) is written once against a small device interface, with two devices: :class:`CupyDevice`
(CUDA events on the GPU) and :class:`EmulatorDevice` (the CPU emulator with a host timer).  Tests drive the
same logic with a fake device, so this code path is exercised without a GPU.

Everything arrives as JSON (see ``gpu.py``): buffer specs, the reference kernel, the candidate kernel.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from schedlib.codegen.kernel_spec import TensorMapSpec
from schedlib.ir.dtype import numpy_dtype
from schedlib.runtime.timing import event_timer, repetitions, rotation_copies, round_robin

INT_SENTINEL = -123456789  # an output element no kernel wrote keeps this (ints) or NaN (floats)
TOLERANCE = {"float32": 1e-4, "float64": 1e-9}  # relative to max|ref| + |ref|; 16-bit floats get 1e-2


def _unwritten(dtype: np.dtype) -> Any:
    """What a fresh output holds before the kernel writes it: NaN for floats (bf16 bits 0xFFFF are a NaN);
    an unlikely value for integers, within the type's range (numpy refuses to overflow an int8); True for
    bools, which have no unlikely value."""
    if dtype == np.uint16:  # bfloat16 storage
        return 0xFFFF
    if dtype.kind == "i":
        return max(INT_SENTINEL, int(np.iinfo(dtype).min))
    return True if dtype.kind == "b" else math.nan


class DeviceFault(Exception):
    """A device operation failed; ``status`` is the record's failure type, ``fatal`` means restart."""

    def __init__(self, status: str, message: str, fatal: bool) -> None:
        super().__init__(message)
        self.status, self.fatal = status, fatal


def kernel_dtype(dtype: str) -> np.dtype:
    """The element type a kernel sees: bfloat16 travels as its 16-bit pattern."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(numpy_dtype(dtype))


def host_input(spec: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Small integers (times 0.5 for floats): exact in every dtype and in fp32 sums of thousands of terms."""
    shape, dtype = tuple(spec["shape"]), spec["dtype"]
    ints = rng.integers(-2, 3, size=shape)
    if dtype == "bfloat16":
        return ((ints * 0.5).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    want = np.dtype(numpy_dtype(dtype))
    return (ints * 0.5).astype(want) if want.kind == "f" else ints.astype(want)


class CupyDevice:
    """The GPU through cupy; timings are CUDA events on the current stream."""

    def __init__(self) -> None:
        import cupy

        self.xp = cupy
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        # id(function) -> (the function, kept so that its id is not reused; dynamic shared memory allowed)
        self._opted_in: dict[int, tuple[Any, int]] = {}

    def compile(self, source: str, names: Sequence[str], arch: str | None = None) -> dict[str, Any]:
        from schedlib.runtime.gpu import module_for

        try:
            module = module_for(self.xp, source, arch)
            return {n: module.get_function(n) for n in names}
        except Exception as exc:
            raise self.fault(exc) from None

    def tensor_map(self, array: Any, spec: TensorMapSpec) -> Any:
        from schedlib.runtime.tensor_map import gpu_encode

        return gpu_encode(self.xp, array, spec)

    def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], params: list[tuple[str, Any]],
               smem: int) -> None:
        if smem > 48 * 1024 and self._opted_in.get(id(fn), (None, 0))[1] < smem:  # a driver call: not per run
            fn.max_dynamic_shared_size_bytes = smem
            self._opted_in[id(fn)] = (fn, smem)
        fn(tuple(grid), tuple(block), tuple(v if hasattr(v, "shape") else np.int32(v) for _, v in params),
           shared_mem=smem)

    def sync(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def flush(self, buffer: Any, value: int) -> None:
        buffer.fill(value)  # a memset kernel on the same stream, before the start event

    def time_us(self, run: Callable[[], None]) -> float:
        return event_timer(run)()

    def fault(self, exc: BaseException) -> DeviceFault:
        """Classify a cupy/CUDA exception by its error name (cudaErrorIllegalAddress, CUDA_ERROR_...)."""
        text = f"{type(exc).__name__}: {exc}"
        norm = re.sub(r"[^A-Z]", "", text.upper())
        if "COMPILE" in type(exc).__name__.upper() or "COMPILEEXCEPTION" in norm or "NVRTC" in norm:
            return DeviceFault("compile_error", text, fatal=False)
        if any(s in norm for s in ("ILLEGALADDRESS", "ILLEGALMEMORY", "MISALIGNED", "ILLEGALINSTRUCTION",
                                   "HARDWARESTACK", "ASSERT")):
            return DeviceFault("illegal_address", text, fatal=True)  # sticky: the context is gone
        if any(s in norm for s in ("OUTOFRESOURCES", "INVALIDVALUE", "INVALIDCONFIGURATION", "TOOMANYRESOURCES")):
            return DeviceFault("launch_error", text, fatal=False)
        if "LAUNCHTIMEOUT" in norm:
            return DeviceFault("timeout", text, fatal=True)
        return DeviceFault("launch_error", text, fatal=True)


class EmulatorDevice:
    """The CPU emulator (bounds-checked) with a host timer: the pipeline without a GPU."""

    name = "schedlib CPU emulator"

    def __init__(self) -> None:
        self.xp = np

    def compile(self, source: str, names: Sequence[str], arch: str | None = None) -> dict[str, Any]:
        from schedlib.runtime.emulator.build import build_library

        try:
            build_library(source, names, bounds_check=True)
        except Exception as exc:
            raise DeviceFault("compile_error", f"{type(exc).__name__}: {exc}", fatal=False) from None
        return {n: (source, n) for n in names}

    def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], params: list[tuple[str, Any]],
               smem: int) -> None:
        from schedlib.runtime.emulator import KernelLaunch, emulate

        source, name = fn
        launch = KernelLaunch(name, tuple(grid), tuple(block), tuple(n for n, _ in params), smem)
        emulate(source, [launch], dict(params), bounds_check=True)

    def tensor_map(self, array: Any, spec: TensorMapSpec) -> Any:
        return spec  # the emulator encodes it from the array it launches with

    def sync(self) -> None:
        return None

    def flush(self, buffer: Any, value: int) -> None:
        buffer.fill(value)

    def time_us(self, run: Callable[[], None]) -> float:
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e6

    def fault(self, exc: BaseException) -> DeviceFault:
        text = f"{type(exc).__name__}: {exc}"
        if "out of bounds" in text:
            return DeviceFault("illegal_address", text, fatal=False)
        return DeviceFault("launch_error", text, fatal=False)


DEVICES: dict[str, Callable[[], Any]] = {"cuda": CupyDevice, "emulator": EmulatorDevice}


class KernelBench:
    """Worker handler: holds inputs, the reference output and the L2-flush buffer for one workload."""

    def __init__(self, init: dict[str, Any], device: Any = None) -> None:
        self.dev = device if device is not None else DEVICES[init["device"]]()
        xp = self.dev.xp
        rng = np.random.default_rng(int(init.get("seed", 0)))
        self.inputs = {s["name"]: xp.asarray(host_input(s, rng)) for s in init["inputs"]}
        self.outputs = init["outputs"]
        self.timing = {k: float(init[k]) for k in ("warmup_ms", "target_ms", "min_repeats", "max_repeats")}
        self.flush_buffer = xp.zeros(int(init["flush_bytes"]), dtype=np.uint8)
        # sets of arrays smaller than the L2 (the flush is twice its size) are timed in turns with copies
        set_bytes = sum(int(np.prod(s["shape"])) * kernel_dtype(s["dtype"]).itemsize
                        for s in (*init["inputs"], *init["outputs"]))
        copies = rotation_copies(set_bytes, int(init["flush_bytes"]) // 2)
        self.input_sets = [self.inputs] + [{n: a.copy() for n, a in self.inputs.items()} for _ in range(copies - 1)]
        self.reference = self._run_once(init["reference"], what="reference kernel")
        self.info = {"device": self.dev.name}

    # one run -----------------------------------------------------------------------------------
    def _fresh_outputs(self) -> dict[str, Any]:
        xp, out = self.dev.xp, {}
        for spec in self.outputs:
            dtype = kernel_dtype(spec["dtype"])
            out[spec["name"]] = xp.full(tuple(spec["shape"]), _unwritten(dtype), dtype=dtype)
        return out

    def _compile(self, kernel: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.dev.compile(kernel["source"], [ln["name"] for ln in kernel["launches"]], kernel.get("arch"))
        except Exception as exc:
            raise self._fault(exc) from None

    def _prepare(self, kernel: dict[str, Any], inputs: dict[str, Any] | None = None,
                 fns: dict[str, Any] | None = None) -> tuple[dict[str, Any], Callable[[], None], dict[str, Any]]:
        """The kernel's functions and a run of it on ``inputs`` (default: the first set) with fresh outputs."""
        fns = self._compile(kernel) if fns is None else fns
        xp = self.dev.xp
        outputs = self._fresh_outputs()
        args: dict[str, Any] = {**(self.inputs if inputs is None else inputs), **outputs}
        for spec in kernel.get("scratch", []):
            args[spec["name"]] = xp.zeros(tuple(spec["shape"]), dtype=kernel_dtype(spec["dtype"]))
        try:
            for ln in kernel["launches"]:
                for m in ln.get("tensor_maps", []):
                    spec = TensorMapSpec(m["param"], m["buffer"], m["dtype"], tuple(m["box"]), int(m["swizzle"]))
                    args[spec.param] = self.dev.tensor_map(args[spec.buffer], spec)
        except Exception as exc:
            raise self._fault(exc) from None

        # looked up once: what a timed run does on the host is the launches themselves (timed too)
        bound = [(fns[ln["name"]], ln["grid"], ln["block"], [(p, args[p]) for p in ln["params"]], int(ln["smem"]))
                 for ln in kernel["launches"]]

        def run() -> None:
            for fn, grid, block, params, smem in bound:
                self.dev.launch(fn, grid, block, params, smem)

        return fns, run, outputs

    def _run_once(self, kernel: dict[str, Any], what: str) -> dict[str, Any]:
        _, run, outputs = self._prepare(kernel)
        try:
            run()
            self.dev.sync()
        except Exception as exc:
            fault = self._fault(exc)
            raise DeviceFault(fault.status, f"{what}: {fault}", fault.fatal) from None
        return outputs

    # checking ----------------------------------------------------------------------------------
    def _as_float(self, arr: Any, dtype: str) -> Any:
        xp = self.dev.xp
        if dtype == "bfloat16":
            return (arr.astype(xp.uint32) << 16).view(xp.float32).astype(xp.float64)
        return arr.astype(xp.float64)

    def check(self, outputs: dict[str, Any]) -> tuple[bool, float, str]:
        """(all outputs match the reference, worst error as a multiple of the tolerance, what differs)."""
        xp, worst = self.dev.xp, 0.0
        for spec in self.outputs:
            name, dtype = spec["name"], spec["dtype"]
            got, ref = self._as_float(outputs[name], dtype), self._as_float(self.reference[name], dtype)
            if ref.size == 0:
                continue
            unwritten = int(xp.count_nonzero(xp.isnan(got) & ~xp.isnan(ref)))
            if unwritten:
                return False, math.inf, f"output {name}: {unwritten} elements are NaN (never written?)"
            diff = xp.abs(got - ref)
            if kernel_dtype(dtype).kind in "iu" and dtype != "bfloat16":
                wrong = int(xp.count_nonzero(diff))
                if wrong:
                    return False, math.inf, f"output {name}: {wrong} elements differ from the reference"
                continue
            tol = TOLERANCE.get(dtype, 1e-2)
            scale = max(1.0, float(xp.max(xp.abs(ref))))
            err = float(xp.max(diff / (tol * scale + tol * xp.abs(ref))))
            if not err <= 1.0:
                return False, err, (f"output {name}: max abs error {float(xp.max(diff)):.3g} exceeds the "
                                    f"tolerance {tol:g} x (max|ref| {scale:.3g} + |ref|)")
            worst = max(worst, err)
        return True, worst, ""

    # timing ------------------------------------------------------------------------------------
    def time_kernel(self, run: Callable[[], None], factor: float = 1.0) -> list[float]:
        """Warm up for ``warmup_ms``, then time repetitions, each after flushing L2 (the project's one policy,
        :func:`schedlib.runtime.timing.repetitions`)."""
        t = self.timing
        # writing 2x L2 between repetitions: every timed run starts with a cold L2
        return repetitions(lambda: self.dev.time_us(run), lambda i: self.dev.flush(self.flush_buffer, i & 0xFF),
                           warmup_ms=t["warmup_ms"], target_ms=t["target_ms"], min_repeats=int(t["min_repeats"]),
                           max_repeats=int(t["max_repeats"]), factor=factor)

    def _fault(self, exc: Exception) -> DeviceFault:
        return exc if isinstance(exc, DeviceFault) else self.dev.fault(exc)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("op") != "measure":
            return {"status": "error", "error_type": "ProtocolError", "error": f"unknown op {request.get('op')!r}"}
        try:
            fns, run, outputs = self._prepare(request)
            try:
                run()
                self.dev.sync()
            except Exception as exc:
                raise self._fault(exc) from None
            ok, err, message = self.check(outputs)
            if not ok:
                return {"status": "wrong_result", "error_type": "WrongResult", "error": message}
            # the other input sets, each with outputs of its own (checked once, on the first set)
            runs = [run] + [self._prepare(request, inputs, fns)[1] for inputs in self.input_sets[1:]]
            try:
                times = self.time_kernel(round_robin(runs), float(request.get("repeat_factor", 1)))
            except Exception as exc:
                raise self._fault(exc) from None
        except DeviceFault as fault:
            return {"status": fault.status, "error_type": fault.status, "error": str(fault)[:4000],
                    "restart": fault.fatal}
        return {"status": "ok", "times_us": times, "figures": {"max_rel_error": err}}
