"""The matmul rule's TMA-fed Hopper template (``tensor_core="wgmma_tma"``): where it exists, that it is the
Hopper default, and kernels built from it (emulator vs numpy; nvcc for sm_90a within the H100 profile), with
the pipeline's mbarrier discipline checked by breaking it (a ring refilled too early is caught for both
Hopper templates in ``test_matmul_wgmma.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.runtime.emulator import KernelLaunch, emulate

from .helpers import MatmulCase as Case
from .helpers import check_schedule
from .helpers import matmul_maker as mm

MATMUL = rules.get_rule("matmul")
H100 = sl.hw.load("h100")


def tma(bm: int, bn: int, bk: int, wn: int, stages: int, raster: int = 1) -> dict[str, Any]:
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": 2, "thread_n": wn // 4, "vector": 1,
            "split_k": 1, "stages": stages, "tensor_core": "wgmma_tma", "raster": raster}


@pytest.mark.parametrize("target, present", [("h100", True), ("h200", True), ("a100", False), ("l40s", False)])
def test_tma_is_a_template_of_hopper_only(target: str, present: bool) -> None:
    values = MATMUL.space(wl.matmul(512, 512, 512, "float16"), target).knob("tensor_core").values
    assert ("wgmma_tma" in values) == present and ("wgmma" in values) == present


def test_it_is_the_hopper_default_and_the_cp_async_variant_stays_a_template() -> None:
    f = wl.matmul(4096, 4096, 4096, "float16")
    default = MATMUL.default_config(f, H100)
    assert default == tma(128, 256, 64, 256, 4, default["raster"])
    assert MATMUL.template_default(f, "h100", "wgmma") == {**default, "tensor_core": "wgmma"}
    t = MATMUL.tiling(f, H100, default)
    assert t.tma and t.warpgroup and t.shared_bytes == 4 * (128 + 256) * 64 * 2 + 4 * 8 + 1024
    assert not MATMUL.tiling(f, H100, {**default, "tensor_core": "wgmma"}).tma
    kernel = sl.build(MATMUL.apply(f, "h100", default), "h100")
    (spec,) = kernel.launch
    assert spec.dynamic_smem == t.shared_bytes and kernel.arch == "sm_90a"
    assert [m.param for m in spec.tensor_maps] == ["@tmap:A", "@tmap:B"] and spec.params[-2:] == ("@tmap:A", "@tmap:B")
    assert [(m.box, m.swizzle) for m in spec.tensor_maps] == [((64, 128, 1), 128), ((64, 64, 1), 128)]
    assert "sl_tma_load_3d" in kernel.source and "sl_cp_async" not in kernel.source.split("extern \"C\"")[-1]


def test_the_carver_prefers_tma_at_equal_estimates() -> None:
    df = sl.carver.carve(wl.matmul(4096, 4096, 4096, "float16"), "h100", topk=4)
    assert df["tensor_core"].isin(["wgmma_tma", "wgmma_ws"]).all()  # both fed by the TMA
    row = sl.carver.estimate(wl.matmul(4096, 4096, 4096, "float16"), "h100", df["config"].iloc[0])
    cp = sl.carver.estimate(wl.matmul(4096, 4096, 4096, "float16"), "h100",
                            {**df["config"].iloc[0], "tensor_core": "wgmma"})
    assert row["instructions"] < cp["instructions"]  # no per-thread copy instructions


CASES = [
    # every operand layout; K-major swizzles of 32/64/128 bytes; MN-major atoms of 32/64/128 bytes (narrow
    # warpgroups); edges in M/N/K filled by the copies; batch with shared or batched weights; ring depths 1..4
    Case("f16-nn-200x320x136-default", mm(200, 320, 136, "float16")),
    Case("f16-nt-residual-100x72x40-k16", mm(100, 72, 40, "float16", trans_b=True, epilogue="residual"),
         tma(64, 64, 16, 32, 3)),
    Case("f16-tn-bias_relu-96x80x48", mm(96, 80, 48, "float16", trans_a=True, epilogue="bias_relu"),
         tma(64, 64, 16, 64, 3)),
    Case("bf16-tt-128x128x96-k32-s2", mm(128, 128, 96, "bfloat16", trans_a=True, trans_b=True),
         tma(128, 128, 32, 64, 2)),
    Case("bf16-nn-n16-raster", mm(320, 128, 64, "bfloat16", epilogue="gelu"), tma(64, 64, 32, 16, 1, raster=4)),
    Case("f16-batch3-tn-s4", mm(64, 48, 72, "float16", batch=3, trans_a=True), tma(64, 64, 16, 64, 4)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_tma_kernel_matches_numpy_and_fits_the_gpu(case: Case, rng: np.random.Generator, toolchain: None) -> None:
    f = case.make()
    config = case.config or MATMUL.default_config(f, H100)
    assert config["tensor_core"] == "wgmma_tma", config
    kernel = check_schedule(f, MATMUL.apply(f, "h100", config), rng, sizes=case.sizes, archs=("sm_90",))
    assert "sl_tma_load_3d" in kernel.source and kernel.arch == "sm_90a"


def test_a_slot_waited_with_the_wrong_parity_hangs_and_is_reported(toolchain: None) -> None:
    f = wl.matmul(64, 64, 256, "float16")
    kernel = sl.build(MATMUL.apply(f, "h100", tma(64, 64, 64, 64, 2)), "h100")
    wait = "sl_mbar_wait(&sl_full[sl_stage], (C_k_0 / 2) & 1);"
    assert wait in kernel.source
    broken = kernel.source.replace(wait, "sl_mbar_wait(&sl_full[sl_stage], ((C_k_0 / 2) & 1) ^ 1);")
    (spec,) = kernel.launch
    a, b = np.ones((64, 256), np.float16), np.ones((256, 64), np.float16)
    maps = {m.param: m for m in spec.tensor_maps}
    with pytest.raises(sl.EmulatorError, match="mbarrier phase"):
        emulate(broken, [KernelLaunch(spec.name, spec.grid_for({}), spec.block, spec.params, spec.dynamic_smem)],
                {"A": a, "B": b, "D": np.zeros((64, 64), np.float16), **maps})


@pytest.mark.parametrize("template", ["wgmma_tma", "wgmma_ws"])
def test_every_thread_runs_the_tensor_map_fence(template: str) -> None:
    """A proxy fence orders the operations of the thread that runs it, and the warp-specialized kernel issues
    its copies from the producer warp: the fences are statements of the kernel body, outside any guard.
    (The emulator cannot see a missing fence, so the source is what is checked.)"""
    f = wl.matmul(1024, 1024, 1024, "float16")
    body = sl.build(MATMUL.apply(f, "h100", MATMUL.template_default(f, H100, template)), "h100").source
    body = body[body.index('extern "C"'):]  # the kernel, after the preludes (which define the fence)
    fences = [line for line in body.splitlines() if "sl_tmap_acquire(" in line]
    # at the kernel body's own level (two spaces in), so inside no `if` and no loop
    assert len(fences) == 2 and all(line.startswith("  sl_tmap_acquire(") for line in fences), fences
