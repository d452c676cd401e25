"""Default schedules at the sizes they are meant for (4096-class, LLM shapes): compile for sm_80 and sm_90
within the profile's limits, with no spills and a launchable grid.  Compile-only: these are far too big for
the emulator, whose correctness checks run at small sizes in ``test_workloads``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.ir.expr import as_int
from schedlib.ir.func import Func

from .helpers import check_resources, thread_count

SCALE: list[tuple[str, Callable[[], Func], str]] = [
    ("matmul-4096-fp16", lambda: wl.matmul(4096, 4096, 4096, "float16"), "matmul"),
    ("matmul-4096-fp32-bias_relu", lambda: wl.matmul(4096, 4096, 4096, epilogue="bias_relu"), "matmul"),
    ("matmul-batch8-1024-bf16-gelu", lambda: wl.matmul(1024, 1024, 1024, "bfloat16", batch=8, epilogue="gelu"),
     "matmul"),
    ("gemv-14336x4096-fp16", lambda: wl.gemv(14336, 4096, "float16"), "gemv"),
    ("gemv-t-14336x4096-fp16", lambda: wl.gemv(14336, 4096, "float16", trans=True), "gemv"),
    ("gemv-b8-14336x4096-bf16", lambda: wl.gemv(14336, 4096, "bfloat16", batch=8, epilogue="bias"), "gemv"),
    ("softmax-4096x32000-fp16", lambda: wl.softmax(4096, 32000, "float16"), "general_reduction"),
    ("rmsnorm-4096-fp16", lambda: wl.rmsnorm(4096, 4096, "float16"), "general_reduction"),
    ("layernorm-4096", lambda: wl.layernorm(4096, 4096), "general_reduction"),
    ("reduce-sum-4096", lambda: wl.reduce(4096, 4096), "reduction"),
    ("reduce-max-first-4096", lambda: wl.reduce(4096, 4096, "max", axis=0), "reduction"),
    ("transpose-4096", lambda: wl.transpose(4096, 4096, "float16"), "transpose"),
    ("elementwise-4096", lambda: wl.elementwise((4096, 4096), ("add", "gelu"), "float16"), "elementwise"),
]


@pytest.mark.parametrize("make, rule", [pytest.param(m, r, id=i) for i, m, r in SCALE])
def test_default_at_scale_compiles_within_limits(make, rule: str, cuda_compiler: None) -> None:
    func = make()
    sch = rules.apply_default(func, "h100")
    assert sch.rule == rule
    kernel = sl.build(sch, "h100")
    profile = sl.hw.load("h100")
    for spec in kernel.launch:
        grid = [as_int(g) for g in spec.grid]
        if all(g is not None for g in grid):
            assert 1 <= grid[0] <= 2**31 - 1 and 1 <= grid[1] <= 65535 and 1 <= grid[2] <= 65535, spec
        assert thread_count(spec.block) <= profile.max_threads_per_block
    check_resources(kernel)
