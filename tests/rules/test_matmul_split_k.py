"""Split-K in the SIMT matmul (``split_k`` > 1): where the space offers it, its legality, the default, the
carver's price for it, and kernels built from it (two kernels: partial results, then their sum with the
epilogue), emulated against the reference and compile-checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl

from .helpers import check_schedule

MATMUL = rules.get_rule("matmul")
H100 = sl.hw.load("h100")


def simt(split: int, bm: int = 16, bn: int = 32, bk: int = 16, stages: int = 2, vector: int = 2) -> dict[str, Any]:
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": 2, "thread_n": 2, "vector": vector,
            "split_k": split, "stages": stages, "tensor_core": False, "raster": 1}


@pytest.mark.parametrize(("shape", "values"), [
    ((64, 64, 65536), (1, 2, 4, 8, 16)),
    ((64, 48, 1024), (1, 2, 4)),  # slices of at least 256
    ((1024, 1024, 1024), (1,)),  # the output alone fills the GPU
    ((256, 300, 1199), (1,)),  # K under 4x the longer side
    ((64, 64, sl.var("K")), (1,)),  # an unknown K is never split
])
def test_the_space_offers_split_k_only_for_a_long_k(shape: tuple, values: tuple) -> None:
    assert MATMUL.space(wl.matmul(*shape), H100).knob("split_k").values == values


def test_split_k_fits_the_grid_and_tensor_core_slices_are_whole_k_steps() -> None:
    space = MATMUL.space(wl.matmul(64, 64, 8192, "float16"), H100)
    tc = {"block_m": 64, "block_n": 64, "block_k": 32, "thread_m": 4, "thread_n": 8, "vector": 1,
          "split_k": 1, "stages": 3, "tensor_core": True, "raster": 1}
    assert space.is_legal(tc)
    assert space.is_legal({**tc, "split_k": 16})  # slices of 512: 16 k steps of 32
    # K = 8000 = 125 x 64: two slices of 4000 are whole 32-wide k steps, sixteen of 500 are not
    ragged = MATMUL.space(wl.matmul(64, 64, 8000, "float16"), H100)
    assert ragged.is_legal({**tc, "split_k": 2})
    assert "multiple of split_k x block_k = 512" in ragged.reason({**tc, "split_k": 16})
    assert ragged.is_legal(simt(16))  # the SIMT copies guard k: any slice length
    # the slices share blockIdx.z with the batch
    big_batch = MATMUL.space(wl.matmul(16, 16, 65536, batch=5000), H100)
    assert "exceed the grid's 65535 along z" in big_batch.reason(simt(16, bn=16))
    assert big_batch.is_legal(simt(8, bn=16))


@pytest.mark.parametrize(("shape", "tile", "split"), [
    ((64, 64, 65536), (32, 32), 16),  # 4 tiles: the tile shrinks to 32 x 32 and still needs every slice
    ((64, 64, 4096), (32, 32), 8),  # slices keep at least 512 of K
    ((256, 256, 8192), (64, 64), 16),  # 64 x 64 tiles with 16 slices fill the SMs: no smaller tile needed
    ((512, 512, 8192), (128, 128), 16),
    ((2048, 512, 8192), (128, 128), 4),  # 64 tiles, 4 slices make 256 blocks
])
def test_the_default_keeps_big_tiles_and_fills_the_sms_with_slices(shape: tuple, tile: tuple, split: int) -> None:
    config = MATMUL.default_config(wl.matmul(*shape), H100)
    assert ((config["block_m"], config["block_n"]), config["split_k"]) == (tile, split)
    assert config["tensor_core"] is False and MATMUL.space(wl.matmul(*shape), H100).is_legal(config)


def test_the_default_stays_one_kernel_where_the_space_has_no_split() -> None:
    for f in (wl.matmul(1024, 1024, 1024), wl.matmul(64, 64, sl.var("K")), wl.matmul(300, 256, 1024)):
        assert MATMUL.default_config(f, H100)["split_k"] == 1


def test_the_carver_charges_the_partials_and_prefers_the_split_where_it_pays() -> None:
    f = wl.matmul(64, 64, 65536)
    one = sl.carver.estimate(f, H100, simt(1, 32, 32, 32))
    sixteen = sl.carver.estimate(f, H100, simt(16, 32, 32, 32))
    assert sixteen["grid_blocks"] == 16 * one["grid_blocks"]
    # the 16 partials of every output are written and read back once each (fp32)
    assert sixteen["dram_bytes"] - one["dram_bytes"] >= 2 * 16 * 64 * 64 * 4
    assert sixteen["est_time_us"] < one["est_time_us"] / 4
    top = sl.carver.carve(f, H100, topk=3)
    assert (top["split_k"] > 1).all()
    # where the output fills the GPU, the partials only cost: the carver keeps one kernel
    big = wl.matmul(4096, 1024, 16384)
    assert MATMUL.space(big, H100).knob("split_k").values[-1] == 16
    assert sl.carver.carve(big, H100, topk=1).iloc[0]["split_k"] == 1


@pytest.mark.parametrize(("make", "config", "sizes"), [
    (lambda: wl.matmul(64, 64, 4096), None, ({},)),  # the rule default (split_k 4)
    (lambda: wl.matmul(64, 48, 2048, epilogue="bias_relu"), simt(8), ({},)),
    (lambda: wl.matmul(100, 36, 2500), simt(4, stages=1), ({},)),  # ragged tiles and a ragged last slice
    (lambda: wl.matmul(48, 40, 2048, batch=3), simt(2), ({},)),
    (lambda: wl.matmul(40, 24, 2048, "float16", epilogue="gelu"), simt(8), ({},)),
    (lambda: wl.matmul(33, 65, 1999, trans_a=True, trans_b=True), simt(4, bk=8, vector=1), ({},)),
    # a symbolic side is planned at 4096: K = 16384 is long against it
    (lambda: wl.matmul(sl.var("M"), 40, 16384, epilogue="bias"), simt(16), ({"M": 37}, {"M": 5})),
], ids=["default", "bias_relu", "ragged", "batch", "fp16-gelu", "transposed", "symbolic-M"])
def test_split_k_kernels_match_the_reference(make: Any, config: dict | None, sizes: tuple,
                                             rng: np.random.Generator) -> None:
    f = make()
    if config is None:
        config = MATMUL.default_config(f, H100)
        assert config["split_k"] > 1
    sch = MATMUL.apply(f, H100, config)
    kernel = check_schedule(f, sch, rng, sizes=sizes)
    # two kernels: the partial results, then their sum carrying the epilogue
    assert len(kernel.launch) == 2
    assert str(sl.Schedule.from_trace(f, sch.trace.to_json())) == str(sch)


def test_a_batch_of_unknown_size_is_never_split() -> None:
    """The slices share blockIdx.z with the batch: split 16 of a symbolic batch could not launch past 4095."""
    f = wl.matmul(64, 64, 8192, batch=sl.var("B"))
    assert MATMUL.space(f, H100).knob("split_k").values == (1,)
    assert MATMUL.default_config(f, H100)["split_k"] == 1


def test_partials_past_32_bit_offsets_are_illegal() -> None:
    f = wl.matmul(12000, 12000, 48000)
    big = simt(16, 128, 128, 8, vector=4) | {"thread_m": 8, "thread_n": 8}
    assert "reach 2^31 elements" in MATMUL.space(f, H100).reason(big)
    assert MATMUL.space(f, H100).is_legal({**big, "split_k": 8})  # 8 x 144M partials fit


# Hopper's split default is the producer-warp kernel (13% faster than wgmma_tma split 16 on an H200)
@pytest.mark.parametrize(("target", "template"), [("h100", "wgmma_ws"), ("a100", True)])
def test_fp16_with_few_output_tiles_splits_on_tensor_cores_and_the_carver_finds_it(target: str,
                                                                                   template: Any) -> None:
    f = wl.matmul(128, 96, 8192, "float16")
    config = MATMUL.default_config(f, target)
    assert config["tensor_core"] == template and config["split_k"] == 16
    unsplit = MATMUL.template_default(wl.matmul(128, 96, 256, "float16"), target, template)
    assert unsplit["split_k"] == 1  # K = 256 is not long against 128: no slices offered
    assert sl.carver.estimate(f, target, config)["est_time_us"] < sl.carver.estimate(
        f, target, {**config, "split_k": 1})["est_time_us"] / 3
    top = sl.carver.carve(f, target, topk=1)
    assert top.attrs["method"] == "grow" and top.iloc[0]["split_k"] > 1
    # K = 8000 splits into whole k steps only twice on tensor cores: the split SIMT template takes it
    ragged = MATMUL.default_config(wl.matmul(128, 96, 8000, "float16"), target)
    assert ragged["tensor_core"] is False and ragged["split_k"] == 8
    # a large output keeps the tensor cores (and one kernel)
    assert MATMUL.default_config(wl.matmul(512, 512, 8192, "float16"), target)["tensor_core"] is not False


def test_seeds_skip_a_template_without_a_legal_point() -> None:
    """Regression: an fp16 matmul whose rows are not 16-byte aligned (100 x 36) lists the tensor-core
    templates, none of whose points are legal; seeding the carver from the other side's default raised."""
    f = wl.matmul(100, 36, 12288, "float16")
    assert MATMUL.space(f, H100).knob("split_k").values[-1] > 1
    assert [c["tensor_core"] for c in MATMUL.seed_configs(f, H100)] == [False]
