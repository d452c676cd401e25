"""Split-K on tensor cores: every tensor-core template (mma.sync, wgmma, wgmma_tma, wgmma_ws) reduces its own
slice of K into partial results, then the sum kernel adds them and applies the epilogue.  Kernels are emulated
against the reference and compiled for sm_80/sm_90 (sm_90a for wgmma) within the profiles' limits; the lowering
refuses slices that are not whole k steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.errors import BuildError
from schedlib.ir.expr import as_int
from schedlib.rules import matmul_split_k as sk

from .helpers import MatmulCase as Case
from .helpers import check_schedule
from .helpers import matmul_maker as mm

MATMUL = rules.get_rule("matmul")
H100 = sl.hw.load("h100")


def mma(split: int, bm: int = 64, bn: int = 32, bk: int = 32, stages: int = 2) -> dict[str, Any]:
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": 4, "thread_n": 4, "vector": 1,
            "split_k": split, "stages": stages, "tensor_core": True, "raster": 1}


def hopper(template: str, split: int, bn: int = 64, stages: int = 2) -> dict[str, Any]:
    return {"block_m": 64, "block_n": bn, "block_k": 64, "thread_m": 2, "thread_n": bn // 4, "vector": 1,
            "split_k": split, "stages": stages, "tensor_core": template, "raster": 1}


CASES = [
    Case("default-wgmma_tma", mm(64, 64, 4096, "float16")),  # the Hopper default: TMA-fed wgmma, 16 slices
    Case("mma-bias_relu", mm(64, 48, 2048, "float16", epilogue="bias_relu"), mma(4)),
    Case("wgmma-gelu-bf16-trans_b", mm(72, 40, 4096, "bfloat16", trans_b=True, epilogue="gelu"),
         hopper("wgmma", 16)),
    Case("wgmma_tma-batch", mm(64, 64, 1024, "float16", batch=2), hopper("wgmma_tma", 2)),
    Case("wgmma_ws-trans_a", mm(128, 64, 2048, "float16", trans_a=True), hopper("wgmma_ws", 8, stages=3)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_tensor_core_split_k_kernels_match_the_reference(case: Case, rng: np.random.Generator) -> None:
    f = case.make()
    config = case.config or MATMUL.default_config(f, H100)
    assert config["split_k"] > 1 and config["tensor_core"] is not False
    assert MATMUL.space(f, H100).is_legal(config), MATMUL.space(f, H100).reason(config)
    sch = MATMUL.apply(f, H100, config)
    kernel = check_schedule(f, sch, rng, sizes=case.sizes)
    partial, total = kernel.launch
    # the partial kernel's grid z covers the slices (times the batch); the sum kernel carries the epilogue
    head = kernel.source[kernel.source.index(f") {partial.name}("):kernel.source.index(f") {total.name}(")]
    assert ("wgmma" if "wgmma" in str(config["tensor_core"]) else "mma_m16n8k16") in head
    assert str(sl.Schedule.from_trace(f, sch.trace.to_json())) == str(sch)


def test_the_partial_grid_is_slices_times_tiles_and_the_carver_prices_the_partials() -> None:
    f = wl.matmul(128, 96, 8192, "float16")
    split = hopper("wgmma_tma", 16, stages=4) | {"block_m": 128}
    one = sl.carver.estimate(f, H100, {**split, "split_k": 1})
    sixteen = sl.carver.estimate(f, H100, split)
    assert sixteen["grid_blocks"] == 16 * one["grid_blocks"] == 16 * 2
    assert sixteen["dram_bytes"] - one["dram_bytes"] >= 2 * 16 * 128 * 96 * 4  # fp32 partials, out and back
    assert sixteen["est_time_us"] < one["est_time_us"] / 3


def test_slices_that_are_not_whole_k_steps_are_refused_by_the_rule_and_the_lowering(
        monkeypatch: pytest.MonkeyPatch) -> None:
    f = wl.matmul(64, 64, 2000, "float16")  # slices of 500: not whole 32-wide k steps
    config = mma(4, bn=64)
    assert "multiple of split_k x block_k = 128" in MATMUL.space(f, H100).reason(config)
    # scheduled anyway, the rule rounds the slices up to whole steps (512, the last one ragged): the lowering
    # refuses the ragged slice's guarded product
    with pytest.raises(BuildError, match="its value is not a product"):
        sl.build(MATMUL.schedule(f, MATMUL.analyze(f, H100), config, H100), "h100")
    # slices cut without that rounding (500 long): the lowering says they are not whole k steps
    factor = sk.factor
    monkeypatch.setattr(sk, "factor", lambda s, facts, loops, split, block_k: factor(s, facts, loops, split, 1))
    sch = MATMUL.schedule(f, MATMUL.analyze(f, H100), config, H100)
    with pytest.raises(BuildError, match=r"k slices \(500 long, split-K over axis v_k_0\) are not whole k steps"):
        sl.build(sch, "h100")


def test_slices_are_rounded_up_to_whole_k_steps() -> None:
    """K = 4099 in 8 slices of 32-wide steps: slices of 544 (not 513), so only the last one ends inside a step;
    each block's last step read past its slice before, guarded twice per element."""
    f = wl.matmul(24, 33, 4099)
    config = {"block_m": 32, "block_n": 32, "block_k": 32, "thread_m": 4, "thread_n": 4, "vector": 4,
              "split_k": 8, "stages": 2, "tensor_core": False, "raster": 1}
    sch = MATMUL.apply(f, H100, config)
    partial = sch.func.block("C_rf")
    assert [as_int(lp.extent) for lp in partial.loops if lp.thread == "blockIdx.z"] == [8]
    assert as_int(partial.axis("v_k_1").extent) == 544
    assert "< 544" not in sl.build(sch, "h100").source  # no guard inside a slice
