"""Many generated kernels checked at once: one nvcc run and one emulator library for a whole ranking.

Why: nvcc spends about 0.4 s on every call before it reaches the kernel (its driver, cicc's start-up and the
CUDA headers), more than ptxas needs for a small kernel, so ten kernels in one translation unit compile in
about a sixth of the time of ten calls (0.86 s against 5.2 s); one g++ build of ten kernels took 2.0 s against
1.35 s for one.
ptxas allocates registers and shared memory per entry function, so each kernel gets the figures it gets
when compiled alone.

Kernel ``i``'s entry points are renamed with the suffix ``__i`` in the source; its outputs, scratch buffers and
tensor maps get the same suffix among the emulator's arguments (parameters are passed by position, so the
source keeps their names).
Kernels are merged only when the text between the prelude and their first kernel (their helpers) is the same,
so nothing is defined twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import schedlib as sl
from schedlib.runtime.emulator import KernelLaunch, emulate
from schedlib.runtime.nvcc import KernelResources, compile_check

PRELUDE_END = "// ---- end of the schedlib CUDA prelude ----"


@dataclass
class _Merged:
    """One translation unit holding several kernels, and which kernel's entry point each renamed one is."""

    source: str
    members: list[int] = field(default_factory=list)
    entries: dict[str, tuple[int, str]] = field(default_factory=dict)  # renamed entry -> (kernel, own name)


def _suffix(name: str, i: int) -> str:
    return f"{name}__{i}"


def _merge(kernels: list[sl.Kernel]) -> list[_Merged]:
    """The kernels' sources merged, kernels with the same helpers into the same translation unit."""
    merged: dict[str, _Merged] = {}
    for i, k in enumerate(kernels):
        head, marker, body = k.source.partition(PRELUDE_END)
        if not marker:
            raise ValueError(f"kernel {i} ({k.func.name}) does not start with the schedlib CUDA prelude")
        helpers, first, rest = body.partition('extern "C"')
        text = first + rest
        unit = merged.setdefault(helpers, _Merged(head + PRELUDE_END + helpers))
        for spec in k.launch:
            text = text.replace(f" {spec.name}(", f" {_suffix(spec.name, i)}(")
            unit.entries[_suffix(spec.name, i)] = (i, spec.name)
        unit.source += text
        unit.members.append(i)
    return list(merged.values())


def compile_together(kernels: list[sl.Kernel], arch: str) -> list[dict[str, KernelResources]]:
    """Each kernel's resources as ptxas reports them for ``arch`` (read as ``sm_90a`` for a wgmma kernel, as
    ``Kernel.compile_check`` does), keyed by its own entry-point names, from one nvcc (or NVRTC) run per
    architecture and group of kernels with the same helpers.  A kernel missing from ptxas's report has an
    empty dict."""
    out: list[dict[str, KernelResources]] = [{} for _ in kernels]
    by_arch: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        by_arch.setdefault(k._arch_for(arch), []).append(i)
    for build_arch, members in by_arch.items():
        group = [kernels[i] for i in members]
        for unit in _merge(group):
            if len(unit.members) == 1:  # a kernel on its own compiles from its own source, names unchanged
                out[members[unit.members[0]]] = dict(compile_check(group[unit.members[0]].source, build_arch).kernels)
                continue
            report = compile_check(unit.source, build_arch)
            for entry, (j, name) in unit.entries.items():
                if entry in report.kernels:
                    out[members[j]][name] = report.kernels[entry]
    return out


def run_together(kernels: list[sl.Kernel], inputs: dict[str, np.ndarray], *,
                 bounds_check: bool = False) -> list[dict[str, np.ndarray]]:
    """Every kernel's outputs on the same inputs (bf16 outputs widened to float32), from one emulator
    library per group of kernels with the same helpers."""
    results: list[dict[str, np.ndarray]] = [{} for _ in kernels]
    for unit in _merge(kernels):
        launches, args = [], {}
        for i in unit.members:
            k = kernels[i]
            k_launches, k_args, outputs = k._emulator_launch([inputs[n] for n in k.func.inputs])
            own = {*outputs, *(b.name for b in k.module.scratch),
                   *(tm.param for spec in k.launch for tm in spec.tensor_maps)}
            rename = {name: _suffix(name, i) for name in own}
            for launch in k_launches:
                launches.append(KernelLaunch(_suffix(launch.name, i), launch.grid, launch.block,
                                             tuple(rename.get(p, p) for p in launch.params), launch.dynamic_smem))
            args.update({rename.get(name, name): value for name, value in k_args.items()})
            results[i] = {name: args[rename[name]] for name in outputs}
        emulate(unit.source, launches, args, bounds_check=bounds_check)
    for k, outputs in zip(kernels, results):
        for name in outputs:
            if k.func.buffer(name).dtype == "bfloat16":  # the emulator's bf16 arrays hold the raw 16 bits
                outputs[name] = (outputs[name].astype(np.uint32) << 16).view(np.float32)
    return results
