"""A target's cap on registers per thread, written into each kernel's signature.

Why: a profile may set ``max_registers_per_thread`` below the 255 every CUDA GPU allows (a custom profile that
keeps kernels at 64 or 128 registers so that more blocks stay resident).  The rules and the carver only
*estimate* registers; ptxas decides, and without a cap in the source it may give a kernel whose estimate fits
far more (a SIMT matmul estimated at 120 took 128, a warp-specialized wgmma estimated at 64 took 168).  So a
kernel whose block size would let ptxas exceed the cap is compiled under the cap (``SL_MAX_REGISTERS`` in the
prelude: ``__maxnreg__``, or on a compiler older than CUDA 12.4 a ``__launch_bounds__`` minimum of resident
blocks that implies it); what does not fit is spilled, which ptxas reports and the carver's compiled
re-ranking sees.  Kernels under the shipped profiles (cap 255) are left exactly as they were.
"""

from __future__ import annotations

import re

from schedlib.codegen.kernel_spec import KernelSpec
from schedlib.errors import BuildError
from schedlib.hw.registers import block_limit

_SETMAXNREG = re.compile(r"sl_setmaxnreg_(?:inc|dec)<(\d+)>")


def cap_registers(text: str, spec: KernelSpec, cap: int | None) -> str:
    """``text`` (one kernel, as a writer made it) compiled under ``cap`` registers per thread, where its block
    size would allow more; unchanged where ``cap`` is None or no lower than that.

    A warp-specialized kernel hands registers between warpgroups with ``setmaxnreg``, whose counts are fixed in
    its text and need ``__launch_bounds__(threads, 1)``: it cannot be capped, so one whose counts pass the cap is
    refused (the rules refuse such configs already; this catches a hand-written schedule)."""
    threads = spec.block[0] * spec.block[1] * spec.block[2]
    if cap is None or cap >= block_limit(threads):
        return text
    given = [int(n) for n in _SETMAXNREG.findall(text)]
    if given:
        most = max([block_limit(threads), *given])
        raise BuildError(f"build: kernel {spec.name} gives its threads up to {most} registers each through "
                         f"setmaxnreg (a producer warp, tensor_core='wgmma_ws'), more than the target's "
                         f"max_registers_per_thread={cap}; use tensor_core='wgmma_tma', which can be capped")
    head = re.compile(rf"__launch_bounds__\({threads}(?:, 1)?\) {re.escape(spec.name)}\(")
    capped, found = head.subn(f"SL_MAX_REGISTERS({threads}, {cap}) {spec.name}(", text, count=1)
    if not found:  # every writer opens its kernel with __launch_bounds__ of its block size
        raise BuildError(f"build: kernel {spec.name}'s signature has no __launch_bounds__({threads}) to replace "
                         f"with the target's cap of {cap} registers per thread")
    return capped
