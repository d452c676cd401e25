"""Lowering of a scheduled Func to CUDA C (``generate``), with the shared prelude of SL_* macros."""

from schedlib.codegen.kernel_spec import KernelSpec
from schedlib.codegen.module import CudaModule, generate, prelude

__all__ = ["CudaModule", "KernelSpec", "generate", "prelude"]
