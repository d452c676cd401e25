"""Lowering of a scheduled Func to CUDA C (``generate``), with the shared prelude of SL_* macros."""

from schedlib.codegen.kernel_spec import KernelSpec
from schedlib.codegen.module import PRELUDE_END, CudaModule, generate, prelude

__all__ = ["PRELUDE_END", "CudaModule", "KernelSpec", "generate", "prelude"]
