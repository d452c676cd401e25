"""What a generated kernel needs at launch: its grid, block, parameters and shared memory (``KernelSpec``),
and the TMA tensor maps among its parameters (``TensorMapSpec``)."""

from __future__ import annotations

from dataclasses import dataclass

from schedlib.codegen.cuda_expr import mangle
from schedlib.ir.expr import Expr


@dataclass(frozen=True)
class TensorMapSpec:
    """A launch parameter that is a TMA tensor map of ``buffer`` (of 2-byte ``dtype``, viewed as
    ``[batch, rows, cols]``): boxes of ``box`` elements (innermost first), rows swizzled over ``swizzle`` bytes.
    The runtime builds it from the array it launches with (the driver's encoding on the GPU, the emulator's own
    layout on the CPU); the spec itself is the argument value the emulator's launch takes for the parameter."""

    param: str
    buffer: str
    dtype: str
    box: tuple[int, int, int]
    swizzle: int


def tmap_param(buffer: str) -> str:
    """The C name of the kernel parameter holding the tensor map of ``buffer``."""
    return f"sl_tmap_{mangle(buffer)}"


@dataclass(frozen=True)
class KernelSpec:
    name: str
    grid: tuple[Expr, Expr, Expr]
    block: tuple[int, int, int]
    params: tuple[str, ...]
    dynamic_smem: int
    static_smem: int
    tensor_maps: tuple[TensorMapSpec, ...] = ()
    local_bytes: int = 0  # per thread, of the kernel's local arrays (the emulator sizes its stacks by it)
