"""Run generated CUDA kernels on the CPU, so they can be verified against numpy with no GPU.

The exact generated source (``cuda_prelude.cuh`` + kernels) is compiled by g++ against the
emulator header ``sl_cuda_emu.h``: CUDA threads become fibers, a block runs on one OS thread,
blocks spread over a pool of OS threads. ``cp.async`` is asynchronous per thread as on the GPU
(a copy lands at the issuing thread's ``cp.async.wait_group`` that completes its group), so a
pipeline that reads a stage too early computes with stale shared memory. Barrier deadlocks, a
thread exiting with ``cp.async`` copies in flight, and in ``bounds_check`` mode every out-of-range
global or shared access, come back as :class:`~schedlib.errors.EmulatorError` naming the kernel,
buffer, index, block and thread.

Environment: ``SCHEDLIB_EMU_THREADS`` (OS threads, default: all cores), ``SCHEDLIB_EMU_STACK_KB``
(fiber stack size, default 128), ``SCHEDLIB_GXX`` (compiler, default ``g++`` on PATH).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedlib.errors import EmulatorError
from schedlib.runtime.emulator.abi import DeviceArrays, call_entry, pack_launch
from schedlib.runtime.emulator.build import (
    ENTRY_PREFIX,
    HEADER_DIR,
    build_library,
    find_gxx,
    load_library,
)

__all__ = ["HEADER_DIR", "PRELUDE_PATH", "KernelLaunch", "cuda_prelude", "emulate", "find_gxx"]

PRELUDE_PATH = Path(__file__).resolve().parents[2] / "codegen" / "cuda_prelude.cuh"
DEFAULT_STACK_KB = 128


def cuda_prelude() -> str:
    """The text every generated kernel source starts with (``schedlib/codegen/cuda_prelude.cuh``)."""
    return PRELUDE_PATH.read_text()


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: which ``extern "C"`` kernel, its grid/block, and its arguments by name."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: tuple[str, ...]
    dynamic_smem: int = 0
    local_bytes: int = 0  # per thread, of the kernel's local arrays: the fiber stacks are made room for them

    def validate(self) -> None:
        """Reject malformed launches in Python, before any compile."""
        for what, dims in (("grid", self.grid), ("block", self.block)):
            if len(dims) != 3 or not all(isinstance(d, (int, np.integer)) and d >= 1 for d in dims):
                raise EmulatorError(f"launch of {self.name!r}: {what} must be three ints >= 1, got {dims!r}")
        if not isinstance(self.dynamic_smem, (int, np.integer)) or self.dynamic_smem < 0:
            raise EmulatorError(f"launch of {self.name!r}: dynamic_smem must be an int >= 0")
        if isinstance(self.params, str):
            raise EmulatorError(f"launch of {self.name!r}: params must be a tuple of names, not a string")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EmulatorError(f"${name}={raw!r} is not an integer") from None
    if value < 1:
        raise EmulatorError(f"${name}={raw!r} must be >= 1")
    return value


def emulate(
    source: str,
    launches: Sequence[KernelLaunch],
    args: Mapping[str, np.ndarray | int | float],
    *,
    bounds_check: bool = False,
    threads: int | None = None,
) -> None:
    """Run `launches` in order on the CPU; numpy arrays in `args` are read and written in place.

    Python ints are passed as C integers and floats as C floats (the kernel's own parameter type
    decides the width; a kind or dtype mismatch is an error naming the parameter). The compiled
    library is cached by content hash, so repeated calls with the same source skip g++.
    """
    launches = checked_launches(launches)
    threads = os_threads(threads)
    if launches:
        lib = load_library(build_library(source, (ln.name for ln in launches), bounds_check=bounds_check))
        run_launches(lib, launches, args, threads)


def checked_launches(launches: Sequence[KernelLaunch]) -> list[KernelLaunch]:
    out = list(launches)
    for launch in out:
        launch.validate()
    return out


def os_threads(threads: int | None) -> int:
    """The OS threads blocks spread over: `threads`, else $SCHEDLIB_EMU_THREADS, else every core."""
    if threads is None:
        return _env_int("SCHEDLIB_EMU_THREADS", os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise EmulatorError(f"threads must be an int >= 1 (OS threads), got {threads!r} ({type(threads).__name__})")
    if threads < 1:
        raise EmulatorError(f"threads must be >= 1, got {threads}")
    return threads


def run_launches(lib: ctypes.CDLL, launches: Sequence[KernelLaunch], args: Mapping[str, np.ndarray | int | float],
                 threads: int) -> None:
    """Launch each kernel of a loaded library in order; arrays are written back even when one fails."""
    base_kb = _env_int("SCHEDLIB_EMU_STACK_KB", DEFAULT_STACK_KB)
    arrays = DeviceArrays()
    try:
        for launch in launches:
            # A frame larger than the stack jumps past the canary the overflow check watches, and the process
            # dies: each thread's local arrays get their room on top of the stack the code itself needs.
            stack_kb = max(base_kb, -(-int(launch.local_bytes) // 1024) + base_kb)
            packed, _keep = pack_launch(
                launch.name,
                launch.grid,
                launch.block,
                int(launch.dynamic_smem),
                launch.params,
                args,
                arrays,
                threads=threads,
                stack_kb=stack_kb,
            )
            error = call_entry(lib, ENTRY_PREFIX + launch.name, packed)
            if error is not None:
                raise EmulatorError(error)
    finally:
        arrays.write_back()
