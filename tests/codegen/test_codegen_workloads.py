"""Every built-in workload, scheduled by hand, becomes CUDA that nvcc compiles and the emulator runs right.

For each case of :mod:`cg_schedules`:

* concrete odd sizes (1, 7, 33 mixed over the dimensions) are built and run on the emulator with bounds
  checking, against numpy;
* one dimension is an ``sl.var``: a single kernel source is built once and run at 1, 7, 33 and 70, the
  symbolic size becoming an ``int`` kernel parameter and (for a spatial size) changing the grid only;
* the symbolic kernel compiles with nvcc for sm_80 and sm_90 and ptxas' resource lines are parsed.
"""

from __future__ import annotations

import numpy as np
import pytest
from cg_cases import CASES, Case
from cg_support import assert_close, kernel_bodies, random_inputs, signature

import schedlib as sl
from schedlib import rules
from schedlib.ir.layout import const_bytes


def _static_params() -> list:
    out = []
    for case in CASES:
        for dims in case.static:
            ident = f"{case.name}-" + "-".join(f"{k}{v}" for k, v in dims.items())
            out.append(pytest.param(case, dims, id=ident))
    return out


def _run(case: Case, k: sl.Kernel, func: sl.Func, rng: np.random.Generator, symbols: dict[str, int]) -> None:
    inputs = random_inputs(func, rng, symbols)
    got = k.run_cpu(*inputs, bounds_check=True)
    assert_close(got, case.expected(*inputs), case.tol, f"{case.name} at {symbols or 'static sizes'}")


@pytest.mark.emulator
@pytest.mark.parametrize(("case", "dims"), _static_params())
def test_static_sizes_match_numpy(case: Case, dims: dict[str, int], rng: np.random.Generator) -> None:
    func = case.func(dims)
    k = sl.build(case.schedule(func), "sm_90")
    assert not func.symbols and "int " not in signature(kernel_bodies(k.source)[k.launch[0].name])
    _run(case, k, func, rng, {})


@pytest.mark.emulator
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_symbolic_dim_one_source_for_every_size(case: Case, rng: np.random.Generator) -> None:
    func = case.symbolic_func()
    assert func.symbols == (case.symbolic,)
    k = sl.build(case.schedule(func), "sm_90")
    # Regenerating gives the very same text: the source never depends on the run-time size.
    assert sl.build(case.schedule(case.symbolic_func()), "sm_90").source == k.source
    for spec in k.launch:
        head = signature(kernel_bodies(k.source)[spec.name])
        assert head.rstrip().endswith(f"int {case.symbolic})"), head
        assert spec.params[-1] == f"${case.symbolic}"  # symbolic sizes are keyed "$name"
    blocks = {}
    for value in case.values:
        _run(case, k, func, rng, {case.symbolic: value})
        blocks[value] = sum(int(np.prod(spec.grid_for({case.symbolic: value}))) for spec in k.launch)
    if case.symbolic_reduces:  # a reduction extent: the same grid, only the loop bound reads the parameter
        assert len(set(blocks.values())) == 1, blocks
    else:  # a spatial extent: more blocks for more rows/columns
        sizes = sorted(blocks)
        assert [blocks[v] for v in sizes] == sorted(blocks[v] for v in sizes), blocks
        assert blocks[sizes[-1]] > blocks[sizes[0]], blocks


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nvcc_compiles_and_reports_resources(case: Case, arch: str) -> None:
    func = case.symbolic_func()
    k = sl.build(case.schedule(func), "sm_90")
    report = k.compile_check(arch)
    assert report.arch == arch
    assert set(report.kernels) == {spec.name for spec in k.launch}
    tiles = sum(const_bytes(b) for b in k.func.buffers if b.scope == "shared")
    for spec in k.launch:
        res = report.kernels[spec.name]
        assert res.registers > 0, res
        assert res.registers <= 255
        # Spills are parsed (not just defaulted): ptxas prints a frame line for every entry.
        assert f"Function properties for {spec.name}" in report.log
        assert (res.spill_store_bytes, res.spill_load_bytes) == (0, 0), f"{case.name} spills on {arch}: {res}"
        if spec.dynamic_smem == 0:
            assert res.shared_static_bytes >= tiles, (res, tiles)
    assert report.spill_bytes == 0
    assert report.registers == max(r.registers for r in report.kernels.values())


def test_hand_schedules_cover_the_codegen_features() -> None:
    """Between them the hand-written schedules use every primitive the code generator lowers specially, and
    the sources show each lowering (so simplifying a schedule cannot silently drop coverage)."""
    used: set[str] = set()
    text = []
    for case in CASES:
        s = case.schedule(case.symbolic_func())
        used |= {step["primitive"] for step in s.trace}
        text.append(sl.build(s, "sm_90").source)
    assert used >= {"split", "fuse", "reorder", "bind", "vectorize", "unroll", "cache_read", "cache_write",
                    "compute_at", "reverse_compute_at", "compute_inline", "reverse_compute_inline",
                    "storage_align", "decompose_reduction"}
    source = "\n".join(text)
    for needle in ("__syncthreads();", "__shfl_xor_sync(", "sl_red_buf", "SL_SHARED(float, ", "SL_SHARED(half, ",
                   "#pragma unroll", "threadIdx.y", "blockIdx.y"):
        assert needle in source, needle


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hand_schedule_is_not_the_rule_schedule(case: Case) -> None:
    func = case.symbolic_func()
    assert case.schedule(func).trace != rules.apply_default(func, "h100").trace
