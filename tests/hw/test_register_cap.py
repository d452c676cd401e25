"""A profile's ``max_registers_per_thread`` below 255 is a limit the kernels keep, not only the estimates: each
kernel whose block size would let ptxas go past it is compiled under it (``SL_MAX_REGISTERS``), and the
warp-specialized wgmma template, whose ``setmaxnreg`` counts cannot be capped, is refused and priced at the
registers ptxas really allots it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import schedlib as sl
from schedlib.codegen import PRELUDE_END, KernelSpec
from schedlib.codegen.register_cap import cap_registers
from schedlib.errors import BuildError, ScheduleError
from schedlib.hw import HardwareProfile
from schedlib.hw.registers import block_limit
from schedlib.ir.expr import Const
from schedlib.rules import get_rule
from schedlib.runtime.nvcc import find_nvcc, nvrtc_available

MATMUL = get_rule("matmul")
H100 = sl.hw.load("h100")
SHIPPED = Path(sl.hw.profile_dirs()[-1]) / "h100.yaml"
WS_128x64 = {"block_m": 128, "block_n": 64, "block_k": 32, "thread_m": 2, "thread_n": 16, "vector": 1,
             "split_k": 1, "stages": 4, "tensor_core": "wgmma_ws", "raster": 1}  # 2 accumulator warpgroups


def capped_h100(tmp_path: Path, registers: int, base: str = "h100") -> HardwareProfile:
    """A shipped profile with ``max_registers_per_thread`` lowered, loaded from a file as a user's is."""
    key = f"{base}r{registers}"
    text = SHIPPED.with_name(f"{base}.yaml").read_text().replace(f"key: {base}\n", f"key: {key}\n")
    text = text.replace("max_registers_per_thread: 255", f"max_registers_per_thread: {registers}")
    path = tmp_path / f"{key}.yaml"
    path.write_text(text)
    profile = sl.hw.load(path)
    assert profile.max_registers_per_thread == registers
    return profile


def kernels_text(kernel: sl.Kernel) -> str:
    return kernel.source.split(PRELUDE_END, 1)[1]


def test_a_capped_profile_writes_its_cap_into_the_kernel_and_the_emulator_still_runs_it(tmp_path: Path) -> None:
    f = sl.workloads.matmul(64, 64, 64)
    sch = sl.rules.apply_default(f, H100)
    assert "SL_MAX_REGISTERS(" not in kernels_text(sl.build(sch, H100))  # the shipped profiles: unchanged
    kernel = sl.build(sch, capped_h100(tmp_path, 64))
    assert "SL_MAX_REGISTERS(" in kernels_text(kernel) and ", 64) matmul_C(" in kernels_text(kernel)
    a, b = np.random.rand(64, 64).astype("float32"), np.random.rand(64, 64).astype("float32")
    np.testing.assert_allclose(kernel.run_cpu(a, b, bounds_check=True), a @ b, rtol=1e-4, atol=1e-4)


def test_a_cap_no_lower_than_what_the_block_size_leaves_changes_nothing() -> None:
    """1024 threads leave ptxas 64 registers each already: a cap of 64 or more adds nothing; 63 does."""
    spec = KernelSpec("k", (Const(1), Const(1), Const(1)), (32, 32, 1), (), 0, 0)
    text = 'extern "C" __global__ void __launch_bounds__(1024) k(int n) {\n}'
    assert block_limit(1024) == 64 and block_limit(384) == 168 and block_limit(64) == 255
    assert cap_registers(text, spec, None) == cap_registers(text, spec, 64) == text
    assert cap_registers(text, spec, 63).startswith('extern "C" __global__ void SL_MAX_REGISTERS(1024, 63) k(')


@pytest.mark.skipif(find_nvcc() is None and not nvrtc_available(), reason="needs nvcc or NVRTC for ptxas")
def test_ptxas_keeps_a_kernel_under_the_profiles_cap(tmp_path: Path) -> None:
    """Regression: the h100 default for a 1024^3 fp32 matmul (8x8 per thread) took 128 registers with the cap at
    64 (the build passed none); under the cap ptxas fits it in 64 and reports what it spills."""
    f = sl.workloads.matmul(1024, 1024, 1024)
    sch = sl.rules.apply_default(f, H100)
    assert sl.build(sch, H100).compile_check("sm_90").registers > 64  # what makes this a test of the cap
    report = sl.build(sch, capped_h100(tmp_path, 64)).compile_check("sm_90")
    assert 0 < report.registers <= 64


def test_the_producer_warp_template_is_refused_under_a_cap_its_setmaxnreg_passes(tmp_path: Path) -> None:
    f = sl.workloads.matmul(1024, 1024, 1024, "float16")
    capped = capped_h100(tmp_path, 64)
    with pytest.raises(ScheduleError, match=r"232 registers per thread \(setmaxnreg\)"):
        MATMUL.apply(f, capped, WS_128x64)
    with pytest.raises(BuildError, match="max_registers_per_thread=64"):  # a schedule made for another profile
        sl.build(MATMUL.apply(f, H100, WS_128x64), capped)
    ranked = sl.carver.carve(f, capped, topk=16)
    assert (ranked["registers_per_thread"] <= 64).all()
    assert not any(c["tensor_core"] == "wgmma_ws" and c["block_m"] * c["block_n"] // (64 * c["thread_n"]) > 1
                   for c in ranked["config"])


def test_the_producer_warp_template_is_priced_at_the_registers_ptxas_allots() -> None:
    """Regression: 2 accumulator warpgroups and a producer (384 threads) are compiled for 168 registers each
    (``__launch_bounds__(384, 1)``, then setmaxnreg); the model said 64 and let 4 blocks share an SM, not 1."""
    f = sl.workloads.matmul(1024, 1024, 1024, "float16")
    row = sl.carver.estimate(f, H100, WS_128x64)
    assert row["registers_per_thread"] == 168
    assert row["blocks_per_sm"] == 1


def test_the_simt_default_shrinks_its_thread_tile_to_fit_the_cap(tmp_path: Path) -> None:
    """Regression: under a cap of 64 the 8x8 thread tile (about 120 registers) was refused and the default fell
    to the space's first legal point, a 16x16 block at 1x2 per thread: 252 us estimated for 1024^3 fp32
    against 69 us for the carver's best."""
    capped = capped_h100(tmp_path, 64)
    f = sl.workloads.matmul(1024, 1024, 1024)
    config = MATMUL.default_config(f, capped)
    assert (config["block_m"], config["block_n"], config["thread_m"], config["thread_n"]) == (64, 64, 4, 4)
    best = sl.carver.carve(f, capped, topk=1)["est_time_us"][0]
    assert sl.carver.estimate(f, capped, config)["est_time_us"] < 1.1 * best


@pytest.mark.parametrize(("base", "size", "template"), [("a100", 1024, True), ("h100", 4096, "wgmma_tma")])
def test_the_tensor_core_default_shrinks_its_warp_tile_to_fit_the_cap(tmp_path: Path, base: str, size: int,
                                                                      template: bool | str) -> None:
    """Regression: under a cap of 64 the sized warp tile was refused and the fp16 default fell to SIMT: 143.9 us
    estimated against 17.6 us for the carver's best on the a100 (1024^3), 4304 us against 183 us on the h100
    (4096^3, where 128x256 wgmma at thread_n 64 needs about 160)."""
    capped = capped_h100(tmp_path, 64, base)
    f = sl.workloads.matmul(size, size, size, "float16")
    config = MATMUL.default_config(f, capped)
    assert config["tensor_core"] == template
    row = sl.carver.estimate(f, capped, config)
    assert row["registers_per_thread"] <= 64
    assert row["est_time_us"] < 1.3 * sl.carver.carve(f, capped, topk=1)["est_time_us"][0]
