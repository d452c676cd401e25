"""The matmul rule's tensor-core template: where its knobs exist, their legality, the default, the tiling the
carver sees, and kernels built from it (emulator vs numpy, nvcc for sm_80 and sm_90 within the profiles).

Emulator sizes stay at or below 160 x 256 x 96: every CUDA thread is a fiber, and each distinct kernel costs a
g++ build (cached by content hash).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from kernel_batch import run_together

import schedlib as sl
import schedlib.carver
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.ir.func import Func

from .helpers import MatmulCase as Case
from .helpers import check_resources_together, check_schedule, compare, random_inputs
from .helpers import matmul_maker as mm

MATMUL = rules.get_rule("matmul")
H100 = sl.hw.load("h100")
A100 = sl.hw.load("a100")  # defaults come from here: on Hopper the default is the wgmma template's


def tc(bm: int, bn: int, bk: int, wm: int, wn: int, stages: int, raster: int = 1) -> dict[str, Any]:
    """A tensor-core config from its block tile, warp tile, pipeline depth and raster group."""
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": wm // 8, "thread_n": wn // 4, "vector": 1,
            "split_k": 1, "stages": stages, "tensor_core": True, "raster": raster}


# ---- the space ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, target, present", [
    ("float16", "h100", True), ("bfloat16", "h100", True), ("float16", "a100", True), ("bfloat16", "l4", True),
    ("float32", "h100", False),  # no fp32 (TF32) template here: the fp32 space is the SIMT one
    ("float16", "v100", False),  # sm_70: only mma.m8n8k4, no cp.async
    ("float16", "t4", False),  # sm_75: m16n8k8 but no m16n8k16 and no cp.async
    ("bfloat16", "t4", False),
])
def test_tensor_core_is_in_the_space_only_where_it_can_run(dtype: str, target: str, present: bool) -> None:
    f = wl.matmul(512, 512, 512, dtype)
    space = MATMUL.space(f, sl.hw.load(target))
    assert (True in space.knob("tensor_core").values) == present
    if not present:  # the tensor-core knobs collapse to the SIMT values: single or double buffering, no raster
        assert space.knob("stages").values == (1, 2) and space.knob("raster").values == (1,)
        assert space.knob("thread_n").values == (1, 2, 4, 8)
        # no tensor-core template of any kind (mma.sync or wgmma): only the SIMT value is left
        assert space.knob("tensor_core").values == (False,)


def test_the_fp32_space_keeps_its_shape() -> None:
    space = MATMUL.space(wl.matmul(256, 256, 256), H100)
    assert {k.name: k.values for k in space.knobs if len(k.values) == 1} == {
        "split_k": (1,), "tensor_core": (False,), "raster": (1,)}
    assert space.knob("stages").values == (1, 2)
    assert space.size == 4 * 4 * 3 * 4 * 4 * 3 * 2


@pytest.mark.parametrize("make, why", [
    (lambda: wl.matmul(333, 200, 77, "float16", trans_b=True), "A's contiguous extent 77 is not a multiple of 8"),
    (lambda: wl.matmul(64, 100, 64, "float16"), "B's contiguous extent 100 is not a multiple of 8"),
    (lambda: wl.matmul(100, 64, 64, "float16", trans_a=True), "A's contiguous extent 100 is not a multiple of 8"),
    (lambda: wl.matmul(64, 64, sl.var("K"), "bfloat16"), "A's contiguous extent K is symbolic"),
])
def test_misaligned_operands_make_tensor_core_illegal_with_the_reason(make: Callable[[], Func], why: str) -> None:
    f = make()
    space = MATMUL.space(f, H100)
    assert True in space.knob("tensor_core").values and space.knob("stages").values == (1, 2)
    config = tc(64, 64, 32, 32, 32, 1)
    assert why in space.reason(config)
    with pytest.raises(sl.ScheduleError, match=r"16-byte cp\.async"):
        MATMUL.apply(f, "h100", config)
    assert not MATMUL.default_config(f, H100)["tensor_core"]


def test_legal_points_never_differ_only_in_a_knob_their_template_ignores() -> None:
    f = wl.matmul(1024, 1024, 1024, "float16")
    points = list(MATMUL.space(f, H100).enumerate())
    simt = [c for c in points if not c["tensor_core"]]
    mma = [c for c in points if c["tensor_core"]]
    assert simt and mma
    assert all(c["stages"] in (1, 2) and c["raster"] == 1 and c["thread_n"] <= 8 for c in simt)
    assert {c["stages"] for c in simt} == {1, 2}
    assert all(c["vector"] == 1 and c["block_k"] % 16 == 0 for c in mma)
    # a raster group that cannot change the block order is a duplicate of a smaller one
    small = wl.matmul(64, 256, 64, "float16")  # 64 x 32 tiles: 2 block rows
    space = MATMUL.space(small, H100)
    assert space.is_legal(tc(32, 32, 32, 16, 16, 2, raster=4))
    assert "same order as raster=4" in space.reason(tc(32, 32, 32, 16, 16, 2, raster=8))
    assert "reorders nothing" in space.reason(tc(64, 32, 32, 32, 16, 2, raster=4))
    # a ring deeper than the k loop holds nothing
    assert "exceeds the 2 k-step(s)" in space.reason(tc(32, 32, 32, 16, 16, 3))


@pytest.mark.parametrize("config, why", [
    (tc(64, 64, 16, 32, 32, 2) | {"vector": 4}, "keep vector=1"),
    (tc(64, 64, 16, 32, 32, 2) | {"thread_m": 1}, "thread_m must be one of"),
    (tc(64, 64, 8, 32, 32, 2), "not a multiple of the mma k=16"),
    (tc(32, 64, 32, 64, 32, 2), "larger than the block tile"),
    (tc(128, 128, 32, 64, 64, 4), "exceed 49152"),
    (tc(64, 64, 32, 32, 32, 2, raster=4) | {"tensor_core": False}, "SIMT configs keep it at 1"),
    (tc(64, 64, 32, 32, 32, 3) | {"tensor_core": False}, "single- or double-buffered (stages 1 or 2), not 3"),
])
def test_illegal_tensor_core_points_say_why(config: dict, why: str) -> None:
    space = MATMUL.space(wl.matmul(1024, 1024, 1024, "float16"), H100)
    assert why in (space.reason(config) or ""), space.reason(config)


# ---- default and tiling -------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["a100", "l40s"])  # Hopper's default is the wgmma template's
def test_default_is_the_cutlass_like_tensor_core_tile(target: str) -> None:
    profile = sl.hw.load(target)
    for dtype in ("float16", "bfloat16"):
        c = MATMUL.default_config(wl.matmul(4096, 4096, 4096, dtype), profile)
        assert c == tc(128, 128, 32, 64, 64, 3, c["raster"]), c  # 2x2 warps of 64x64, 3 x 16 KiB in 48 KiB
    wide = MATMUL.default_config(wl.matmul(4096, 16384, 4096, "float16"), profile)
    assert wide["raster"] == 8  # 128 block columns: a wave of row-major blocks would span 1-2 rows only
    assert not MATMUL.default_config(wl.matmul(4096, 4096, 4096), profile)["tensor_core"]


def test_default_shrinks_so_every_sm_gets_a_block() -> None:
    for m, n, k in ((512, 512, 512), (256, 1024, 128), (64, 64, 64)):
        f = wl.matmul(m, n, k, "float16")
        c = MATMUL.default_config(f, A100)
        blocks = -(-m // c["block_m"]) * -(-n // c["block_n"])
        assert c["tensor_core"] is True and MATMUL.space(f, A100).is_legal(c)
        assert blocks >= min(A100.sm_count, (m // 32) * (n // 32)), (c, blocks)


def test_tiling_describes_the_launched_kernel() -> None:
    f = wl.matmul(4096, 4096, 4096, "float16")
    config = MATMUL.default_config(f, A100)
    t = MATMUL.tiling(f, H100, config)
    assert t.tensor_core and t.stages == 3 and t.threads == 128 and t.warp_tile == {"i": 64, "j": 64}
    assert t.shared_bytes == 3 * (128 + 128) * 32 * 2 and t.vector == 8 and t.raster == config["raster"]
    assert t.thread_tile == {"i": 8, "j": 16}  # 128 fp32 accumulators per thread
    kernel = sl.build(MATMUL.apply(f, "h100", config), "h100")
    (spec,) = kernel.launch
    assert spec.block == (32, 2, 2) and spec.dynamic_smem == 0


# ---- kernels ------------------------------------------------------------------------------------------------

M = sl.var("M")
CASES = [
    # every layout in both dtypes; epilogues none / bias_relu / residual; edges in m, n and k
    Case("f16-nn-64", mm(64, 64, 64, "float16")),
    Case("f16-tn-bias_relu-96x80x48", mm(96, 80, 48, "float16", trans_a=True, epilogue="bias_relu")),
    Case("f16-nt-residual-100x72x40", mm(100, 72, 40, "float16", trans_b=True, epilogue="residual")),
    Case("f16-tt-bias_relu-128x256x64-w32x64-s3", mm(128, 256, 64, "float16", trans_a=True, trans_b=True,
                                                     epilogue="bias_relu"), tc(64, 128, 16, 32, 64, 3)),
    Case("bf16-nn-residual-160x64x48-s1-raster4", mm(160, 64, 48, "bfloat16", epilogue="residual"),
         tc(32, 32, 16, 16, 16, 1, raster=4)),  # 5 block rows: a partial last raster group
    Case("bf16-tn-f32out-64", mm(64, 64, 64, "bfloat16", trans_a=True, out_dtype="float32"), tc(32, 32, 16, 16, 16, 2)),
    Case("bf16-nt-bias_relu-100x72x40", mm(100, 72, 40, "bfloat16", trans_b=True, epilogue="bias_relu")),
    Case("bf16-tt-residual-128x256x64-w64x64-raster4", mm(128, 256, 64, "bfloat16", trans_a=True, trans_b=True,
                                                          epilogue="residual"), tc(64, 64, 32, 64, 64, 2, raster=4)),
    # batch, gelu and a symbolic M (not a contiguous extent, so the path stays legal) in one kernel
    Case("f16-batch2-gelu-symM", mm(M, 40, 32, "float16", batch=2, epilogue="gelu"), None,
         ({"M": 1}, {"M": 37})),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_tensor_core_kernel_matches_numpy_and_fits_the_gpu(case: Case, rng: np.random.Generator,
                                                          toolchain: None) -> None:
    f = case.make()
    config = case.config or MATMUL.default_config(f, A100)
    assert config["tensor_core"] is True, config
    sch = MATMUL.apply(f, "h100", config)
    kernel = check_schedule(f, sch, rng, sizes=case.sizes)  # emulator (bounds-checked) + sm_80/sm_90 limits
    assert "sl_mma_m16n8k16" in kernel.source and "sl_cp_async_16" in kernel.source


def test_carver_ranks_tensor_cores_and_its_top10_runs(toolchain: None) -> None:
    """fp16 4096^3 on A100: the top 10 are mma.sync configs priced at the tensor-core peak, and each builds,
    fits sm_90 without spills and matches numpy at a size where every one of them is legal.  (On Hopper the
    top 10 are wgmma configs: test_matmul_wgmma.)"""
    df = sl.carver.carve(wl.matmul(4096, 4096, 4096, "float16"), "a100", topk=10)
    peak = A100.peak_flops("float16", True)
    assert len(df) == 10 and (df["tensor_core"] == True).all() and df.attrs["method"] == "exhaustive"  # noqa: E712
    assert (df["compute_unit"] == "tensor core float16").all() and (df["peak_flops"] == peak).all()
    assert df["est_time_us"].iloc[0] < 2 * 2 * 4096**3 / peak * 1e6  # within 2x of the tensor-core roofline
    # 5 x 2 blocks of 128 (partial at both edges): raster 8 and 3 stages of block_k 32 are legal here
    small = wl.matmul(520, 136, 96, "float16", epilogue="bias_relu")
    kernels = [sl.build(MATMUL.apply(small, "h100", c), "h100") for c in df["config"]]
    check_resources_together(kernels, archs=("sm_90",))
    # The ten kernels compile in one nvcc run and run from one emulator library, each into its own output.
    inputs = random_inputs(small, np.random.default_rng(0))
    expected = sl.run_reference(small, inputs)
    for i, (config, outputs) in enumerate(zip(df["config"], run_together(kernels, inputs, bounds_check=True))):
        compare(small, expected, outputs["D"], f"carver rank {i}: {config}")


def test_carver_fp32_ranking_stays_simt() -> None:
    df = sl.carver.carve(wl.matmul(4096, 4096, 4096), "h100", topk=10)
    assert not df["tensor_core"].any() and df["stages"].isin([1, 2]).all() and (df["raster"] == 1).all()
    assert (df["compute_unit"] == "SIMT fp32").all()


def test_operand_copies_are_guarded_only_where_a_tile_reaches_past_the_operand() -> None:
    # every tile inside both operands: unconditional cp.async, no compare and no zero-fill store
    whole = sl.build(MATMUL.apply(mm(128, 256, 64, "float16")(), "h100", tc(64, 128, 32, 32, 64, 2)), "h100").source
    assert whole.count("sl_cp_async_16(&") == 2 and "sl_gr <" not in whole and "make_uint4(0u" not in whole
    # K = 40 in k tiles of 32: A's columns and B's rows are guarded, M and N (whole tiles) are not
    ragged = sl.build(MATMUL.apply(mm(128, 256, 40, "float16")(), "h100", tc(64, 128, 32, 32, 64, 2)), "h100").source
    assert "if (sl_gc < 40) sl_cp_async_16(&A_shared" in ragged
    assert "if (sl_gr < 40) sl_cp_async_16(&B_shared" in ragged
    assert ragged.count("make_uint4(0u, 0u, 0u, 0u)") == 2


def _matmul_then(activation: Callable[[Any], Any]) -> Func:
    """fp16 64^3 with ``activation`` applied straight to the fp32 accumulator in the write-back stage."""
    A = sl.placeholder((64, 64), "float16", "A")
    B = sl.placeholder((64, 64), "float16", "B")
    k = sl.reduce_axis(64, "k")
    C = sl.compute((64, 64), lambda i, j: sl.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C")
    Y = sl.compute((64, 64), lambda i, j: activation(C[i, j]).astype("float16"), "Y")
    return sl.func([A, B, Y], "mm_act")


@pytest.mark.parametrize("activation", [sl.tanh, sl.exp, sl.sigmoid], ids=["tanh", "exp", "sigmoid"])
def test_a_math_call_on_the_accumulator_builds_in_every_tensor_core_template(activation: Callable[[Any], Any],
                                                                           toolchain: None) -> None:
    # Regression: the fragment epilogue stood the accumulator in as an untyped (int32) variable, so rebuilding
    # tanh(C[i, j]) around it raised "tanh() needs a floating-point argument" and even the Hopper default of a
    # user's matmul + tanh failed to build.
    g = _matmul_then(activation)
    space = sl.carver.carve(g, "h100", topk=None, method="exhaustive")["config"]
    kernels = [sl.build(sl.rules.apply_default(g, "h100"), "h100")]
    for template in (True, "wgmma", "wgmma_tma", "wgmma_ws"):
        config = next(c for c in space if c["tensor_core"] == template and type(c["tensor_core"]) is type(template))
        kernels.append(sl.build(MATMUL.apply(g, "h100", config), "h100"))
    # inputs scaled so that the accumulator stays near 1 and exp's results well inside fp16
    inputs = {name: (x * 0.25).astype(np.float16) for name, x in random_inputs(g, np.random.default_rng(0)).items()}
    expected = sl.run_reference(g, inputs)
    for kernel, outputs in zip(kernels, run_together(kernels, inputs, bounds_check=True)):
        compare(g, expected, outputs["Y"], f"{activation.__name__} {kernel.launch[0].name}")
