"""What the compiler allots a schedule: registers per thread and spilled bytes, read from ptxas.

Why: the carver prices a config from the rule's register *estimate*, and ptxas may allot more (an unrolled
k step kept in two versions for ragged tiles takes 20-50 registers beyond the estimate), which can cost a
resident block per SM.  :func:`compiled_resources` gives ``sl.carver.carve(..., resources=...)`` the real
figures for its best configs.  It needs nvcc (or NVRTC), not a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlib.errors import CompileError
from schedlib.hw import HardwareProfile, resolve
from schedlib.runtime.kernel import build
from schedlib.runtime.nvcc import check_arch, find_nvcc, nvrtc_available

__all__ = ["CompiledResources", "CompiledUsage", "compiled_resources"]


@dataclass(frozen=True)
class CompiledUsage:
    """ptxas's figures for one schedule: the most registers any of its kernels takes per thread (the one
    that limits residency), and the bytes spilled to local memory by all of them (stores plus loads)."""

    registers: int
    spill_bytes: int
    arch: str


@dataclass(frozen=True)
class CompiledResources:
    """Called with a Schedule, builds it for ``profile`` and returns its :class:`CompiledUsage` on ``arch``.
    The carver reads ``profile`` and ``arch`` too: to refuse a ranking for another target, and to say which
    architecture failed when nothing compiled."""

    profile: HardwareProfile
    arch: str

    def __call__(self, schedule: Any) -> CompiledUsage:
        report = build(schedule, self.profile).compile_check(self.arch)
        kernels = list(report.kernels.values())
        if not kernels:
            raise CompileError(f"the compiler's report for {self.arch} named no kernel, so it gave no register "
                               "count to read")
        return CompiledUsage(max(k.registers for k in kernels),
                             sum(k.spill_store_bytes + k.spill_load_bytes for k in kernels), self.arch)


def compiled_resources(target: Any = "h100", arch: str | None = None) -> CompiledResources:
    """A function from a Schedule to its :class:`CompiledUsage`, built for ``target`` (a profile name, file
    or HardwareProfile) and compiled for its architecture (or ``arch``).  Fails at once, with what to do,
    when neither nvcc nor NVRTC is found or the compiler cannot build that architecture."""
    profile = resolve(target)
    chosen = profile.arch if arch is None else arch
    check_arch(chosen)
    if find_nvcc() is None and not nvrtc_available():
        raise CompileError("compiled_resources: neither nvcc nor NVRTC was found; install the CUDA toolkit (nvcc "
                           "on PATH or in $CUDA_HOME/bin) to read registers and spills from ptxas")
    return CompiledResources(profile, chosen)
