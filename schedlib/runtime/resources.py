"""What the compiler allots a schedule: registers per thread and spilled bytes, read from ptxas.

Why: the carver prices a config from the rule's register *estimate*, and ptxas may allot more (an unrolled
k step kept in two versions for ragged tiles takes 20-50 registers beyond the estimate), which can cost a
resident block per SM.  :func:`compiled_resources` gives ``sl.carver.carve(..., resources=...)`` the real
figures for its best configs.  It needs nvcc (or NVRTC), not a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedlib.errors import CompileError
from schedlib.hw import resolve
from schedlib.runtime.kernel import build
from schedlib.runtime.nvcc import find_nvcc, nvrtc_available

__all__ = ["CompiledUsage", "compiled_resources"]


@dataclass(frozen=True)
class CompiledUsage:
    """ptxas's figures for one schedule: the most registers any of its kernels takes per thread (the one
    that limits residency), and the bytes spilled to local memory by all of them (stores plus loads)."""

    registers: int
    spill_bytes: int
    arch: str


def compiled_resources(target: Any = "h100", arch: str | None = None) -> Callable[[Any], CompiledUsage]:
    """A function from a Schedule to its :class:`CompiledUsage`, built for ``target`` (a profile name, file
    or HardwareProfile) and compiled for its architecture (or ``arch``).  Fails at once, with what to
    install, when neither nvcc nor NVRTC is found."""
    profile = resolve(target)
    chosen = profile.arch
    if arch is not None:
        if not isinstance(arch, str) or not arch.startswith("sm_"):
            raise CompileError(f"compiled_resources: arch={arch!r} must be an architecture name such as 'sm_90'")
        chosen = arch
    if find_nvcc() is None and not nvrtc_available():
        raise CompileError("compiled_resources: neither nvcc nor NVRTC was found; install the CUDA toolkit (nvcc "
                           "on PATH or in $CUDA_HOME/bin) to read registers and spills from ptxas")

    def usage(schedule: Any) -> CompiledUsage:
        report = build(schedule, profile).compile_check(chosen)
        kernels = list(report.kernels.values())
        return CompiledUsage(max(k.registers for k in kernels),
                             sum(k.spill_store_bytes + k.spill_load_bytes for k in kernels), chosen)

    return usage
