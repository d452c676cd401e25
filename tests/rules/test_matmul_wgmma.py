"""The matmul rule's Hopper template fed by cp.async (``tensor_core="wgmma"``): where it exists, its legality,
its default, the tiling the carver sees, and kernels built from it (emulator vs numpy; nvcc for sm_90a within
the H100 profile).  The TMA-fed variant, the Hopper default, is tested in ``test_matmul_wgmma_tma.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kernel_batch import run_together

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.runtime.emulator import KernelLaunch, emulate
from schedlib.runtime.nvcc import compile_check

from .helpers import MatmulCase as Case
from .helpers import check_resources_together, check_schedule, compare, random_inputs
from .helpers import matmul_maker as mm

MATMUL = rules.get_rule("matmul")
H100 = sl.hw.load("h100")


def wg(bm: int, bn: int, bk: int, wn: int, stages: int, raster: int = 1) -> dict[str, Any]:
    """A wgmma config from its block tile, warpgroup width (the wgmma N), ring depth and raster group."""
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": 2, "thread_n": wn // 4, "vector": 1,
            "split_k": 1, "stages": stages, "tensor_core": "wgmma", "raster": raster}


# ---- the space ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, target, present", [
    ("float16", "h100", True), ("bfloat16", "h200", True), ("float16", "h100_pcie", True),
    ("float16", "a100", False), ("bfloat16", "l40s", False),  # sm_80 / sm_89: no warpgroup MMA
    ("float32", "h100", False),  # the fp32 space has no tensor-core template at all
])
def test_wgmma_is_in_the_space_only_on_hopper(dtype: str, target: str, present: bool) -> None:
    f, profile = wl.matmul(512, 512, 512, dtype), sl.hw.load(target)
    space = MATMUL.space(f, profile)
    assert ("wgmma" in space.knob("tensor_core").values) == present
    assert (256 in space.knob("block_n").values) == present and (64 in space.knob("block_k").values) == present
    # The template's own default agrees: a legal wgmma point where the knob offers it, an error elsewhere.
    if present:
        default = MATMUL.template_default(f, profile, "wgmma")
        assert default["tensor_core"] == "wgmma" and space.is_legal(default)
    else:
        with pytest.raises(ValueError, match="tensor_core='wgmma' is not in this matmul's space"):
            MATMUL.template_default(f, profile, "wgmma")


def test_a_template_the_profile_turns_off_is_nowhere() -> None:
    """Not in the space, so not in the carver's ranking nor the search; the default falls back to the next
    template, and asking for a disabled one says what the space has."""
    f = wl.matmul(4096, 4096, 4096, "float16")
    without_tma = H100.without_templates(["wgmma_tma", "wgmma_ws"])
    assert MATMUL.space(f, without_tma).knob("tensor_core").values == (False, True, "wgmma")
    assert MATMUL.default_config(f, without_tma) == MATMUL.template_default(f, H100, "wgmma")
    assert {c["tensor_core"] for c in sl.carver.carve(f, without_tma, topk=8)["config"]} == {"wgmma"}
    with pytest.raises(ValueError, match=r"tensor_core='wgmma_ws' is not in this matmul's space \(it has \[False, "
                                         r"True, 'wgmma'\]\)"):
        MATMUL.template_default(f, without_tma, "wgmma_ws")
    simt_only = H100.without_templates(["mma_sync", "wgmma", "wgmma_tma", "wgmma_ws"])
    assert MATMUL.space(f, simt_only).knob("tensor_core").values == (False,)
    assert MATMUL.default_config(f, simt_only)["tensor_core"] is False
    a100 = sl.hw.load("a100").without_templates(["mma_sync"])
    assert MATMUL.space(f, a100).knob("tensor_core").values == (False,)


def test_the_wgmma_knob_values_are_its_own() -> None:
    """block_n=256, block_k=64 and thread_n 32/64 exist for wgmma configs only, so no SIMT or mma.sync point
    duplicates another by differing in a value its template could not use."""
    f = wl.matmul(2048, 2048, 2048, "float16")
    points = list(MATMUL.space(f, H100).enumerate())
    hopper = [c for c in points if c["tensor_core"] in ("wgmma", "wgmma_tma", "wgmma_ws")]
    others = [c for c in points if c["tensor_core"] not in ("wgmma", "wgmma_tma", "wgmma_ws")]
    assert hopper and others
    assert all(c["block_n"] <= 128 and c["block_k"] <= 32 and c["thread_n"] <= 16 for c in others)
    assert all(c["thread_m"] == 2 and c["block_m"] % 64 == 0 and c["vector"] == 1 for c in hopper)
    assert {c["thread_n"] * 4 for c in hopper} == {16, 32, 64, 128, 256}
    space = MATMUL.space(f, H100)
    assert "block_n=256 belongs to the wgmma template" in space.reason(wg(128, 256, 32, 64, 2) | {"tensor_core": True,
                                                                                                 "thread_m": 8})


@pytest.mark.parametrize("config, why", [
    (wg(128, 128, 64, 128, 3) | {"thread_m": 4}, "a wgmma warp tile is 16 rows"),
    (wg(32, 64, 64, 64, 2), "block_m=32 is not a whole number of 64-row warpgroups"),
    (wg(64, 64, 64, 128, 2), "warp tile width 128 is wider than block_n=64"),
    (wg(128, 128, 16, 64, 2) | {"block_k": 8}, "K-major wgmma rows are 32, 64 or 128 bytes"),
    (wg(128, 256, 64, 256, 4) | {"vector": 2}, "keep vector=1"),
    (wg(128, 256, 64, 64, 4), "threads x about"),  # 8 warpgroups... 1024 threads: registers or threads refuse
])
def test_illegal_wgmma_points_say_why(config: dict, why: str) -> None:
    space = MATMUL.space(wl.matmul(4096, 4096, 4096, "float16"), H100)
    reason = space.reason(config) or ""
    assert why in reason or (why == "threads x about" and "threads per block exceed" in reason), reason


def test_the_ring_may_use_the_opt_in_shared_memory() -> None:
    space = MATMUL.space(wl.matmul(4096, 4096, 4096, "float16"), H100)
    assert space.is_legal(wg(128, 256, 64, 256, 4))  # 4 x 48 KiB + 1 KiB: past 48 KiB, within 227 KiB
    five = MATMUL.space(wl.matmul(4096, 4096, 4096, "float16"), H100).reason(wg(128, 256, 64, 256, 4) | {"stages": 5})
    assert "stages=5 is not one of" in five


# ---- default and tiling -------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["h100", "h200"])
def test_default_on_hopper_is_two_warpgroups_of_64x256(target: str) -> None:
    profile = sl.hw.load(target)
    for dtype in ("float16", "bfloat16"):
        c = MATMUL.template_default(wl.matmul(4096, 4096, 4096, dtype), profile, "wgmma")
        assert c == wg(128, 256, 64, 256, 4, c["raster"]), c
    small = MATMUL.template_default(wl.matmul(64, 64, 64, "float16"), profile, "wgmma")
    assert small["tensor_core"] == "wgmma" and small["block_m"] == 64 and small["block_n"] == 64
    assert MATMUL.default_config(wl.matmul(4096, 4096, 4096, "float16"), sl.hw.load("a100"))["tensor_core"] is True


def test_tiling_describes_the_launched_kernel() -> None:
    f = wl.matmul(4096, 4096, 4096, "float16")
    config = MATMUL.template_default(f, H100, "wgmma")
    t = MATMUL.tiling(f, H100, config)
    assert t.tensor_core and t.warpgroup and t.stages == 4 and t.threads == 256
    assert t.shared_bytes == 4 * (128 + 256) * 64 * 2 + 1024 and t.warp_tile == {"i": 64, "j": 256}
    kernel = sl.build(MATMUL.apply(f, "h100", config), "h100")
    (spec,) = kernel.launch
    assert kernel.arch == "sm_90a" and spec.block == (256, 1, 1) and spec.dynamic_smem == t.shared_bytes
    assert "sl_wgmma_n256_f16<0, 1>" in kernel.source and "wgmma.mma_async" in kernel.source


def test_a_wgmma_kernel_builds_for_sm_90a_only() -> None:
    kernel = sl.build(MATMUL.apply(wl.matmul(64, 64, 64, "float16"), "h100", wg(64, 64, 64, 64, 1)), "h100")
    with pytest.raises(sl.CompileError, match="uses wgmma, which exists on sm_90a only; cannot build for sm_80"):
        kernel.compile_check("sm_80")


# ---- kernels ------------------------------------------------------------------------------------------------

M = sl.var("M")
CASES = [
    # every operand layout (K-major / MN-major A and B), both dtypes, the three K-major swizzle widths,
    # narrow warpgroups (MN-major B atoms of 32 and 64 bytes), epilogues, M/N/K edges, batch, symbolic M
    Case("f16-nn-128x256x128-default", mm(128, 256, 128, "float16"), wg(128, 256, 64, 256, 2)),
    Case("f16-nn-64", mm(64, 64, 64, "float16")),
    Case("f16-nt-residual-100x72x40-k16", mm(100, 72, 40, "float16", trans_b=True, epilogue="residual"),
         wg(64, 64, 16, 32, 3)),
    Case("f16-tn-bias_relu-96x80x48", mm(96, 80, 48, "float16", trans_a=True, epilogue="bias_relu"),
         wg(64, 64, 16, 64, 3)),
    Case("bf16-tt-128x128x96-k32-s3", mm(128, 128, 96, "bfloat16", trans_a=True, trans_b=True),
         wg(128, 128, 32, 64, 3)),
    Case("bf16-nn-gelu-f32out-320x128x64-n16", mm(320, 128, 64, "bfloat16", epilogue="gelu", out_dtype="float32"),
         wg(64, 64, 32, 16, 2, raster=4)),  # 5 x 2 blocks of 4 warpgroup columns of 16: a partial raster group
    Case("f16-batch2-symM", mm(M, 128, 64, "float16", batch=2, epilogue="bias_relu"), wg(64, 128, 32, 128, 2),
         ({"M": 1}, {"M": 70})),
    # rows of 100 halves are not whole 16-byte chunks: the output is stored straight from registers
    Case("f16-nt-N100-direct", mm(96, 100, 64, "float16", trans_b=True), wg(64, 64, 32, 64, 2)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_wgmma_kernel_matches_numpy_and_fits_the_gpu(case: Case, rng: np.random.Generator, toolchain: None) -> None:
    f = case.make()
    config = case.config or MATMUL.template_default(f, H100, "wgmma")
    assert config["tensor_core"] == "wgmma", config
    kernel = check_schedule(f, MATMUL.apply(f, "h100", config), rng, sizes=case.sizes, archs=("sm_90",))
    assert "sl_wgmma_n" in kernel.source and "sl_cp_async_16" in kernel.source and kernel.arch == "sm_90a"
    # the output tile goes out through shared memory in 16-byte chunks where its rows are whole chunks
    assert ("sl_out_s" in kernel.source) == ("direct" not in case.id), case.id


@pytest.mark.parametrize("template", ["wgmma", "wgmma_tma"])
def test_a_pipeline_that_refills_slots_in_use_is_caught(template: str, rng: np.random.Generator,
                                                        toolchain: None) -> None:
    """The generated 3-stage ring keeps one wgmma group in flight and refills only slots whose wgmmas every
    warpgroup has waited for.  Drop the in-loop wait and the refills land under wgmmas still pending: the
    emulator, which performs a wgmma at its wait (and lands a TMA copy when issued), then multiplies later
    tiles and the result is wrong."""
    f = wl.matmul(128, 64, 256, "float16")
    kernel = sl.build(MATMUL.apply(f, "h100", {**wg(128, 64, 32, 64, 3), "tensor_core": template}), "h100")
    (spec,) = kernel.launch
    in_loop = "    sl_wgmma_wait<1>();\n"
    assert kernel.source.count(in_loop) == 1
    inputs = random_inputs(f, rng)
    want = sl.run_reference(f, inputs)["D"].astype(np.float64)
    maps = {m.param: m for m in spec.tensor_maps}
    assert len(maps) == (2 if template == "wgmma_tma" else 0)
    for variant, source in (("ok", kernel.source), ("no_wait", kernel.source.replace(in_loop, ""))):
        out = np.full((128, 64), np.nan, np.float16)
        emulate(source, [KernelLaunch(spec.name, spec.grid_for({}), spec.block, spec.params, spec.dynamic_smem)],
                {"A": inputs["A"], "B": inputs["B"], "D": out, **maps}, bounds_check=True)
        close = np.allclose(out.astype(np.float64), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
        assert close == (variant == "ok"), variant


def test_carver_ranks_wgmma_on_hopper_and_its_top10_runs(rng: np.random.Generator, toolchain: None) -> None:
    """fp16 4096^3 on H100: the top 10 are wgmma configs priced at the full tensor-core peak (mma.sync gets the
    model's share of it), fed by the TMA (no per-thread copy instructions).  A producer warp runs the ring one
    tile further ahead, so the model never prices it slower than the single-role kernel of the same tile:
    they tie where L2 bounds both, and a shallow ring (block_k 16) leaves the single-role kernel latency-bound.
    One config of each (block_k, feed) pair, together covering every raster group of the ten, builds for
    sm_90a within the profile and matches numpy on the emulator at a size where all ten are legal."""
    f = wl.matmul(4096, 4096, 4096, "float16")
    df = sl.carver.carve(f, "h100", topk=10)
    # the two feeds tie; ties go to fewer registers, and the producer warp's 384-thread block is compiled for
    # 168 per thread (setmaxnreg hands them on), so the single-role kernel (160) takes them
    assert set(df["tensor_core"]) <= {"wgmma_tma", "wgmma_ws"}
    assert df.attrs["method"] == "grow"  # 403k points: past the limit
    for config, time in zip(df["config"], df["est_time_us"]):
        single_role = sl.carver.estimate(f, "h100", {**config, "tensor_core": "wgmma_tma"})["est_time_us"]
        producer_warp = sl.carver.estimate(f, "h100", {**config, "tensor_core": "wgmma_ws"})["est_time_us"]
        assert producer_warp <= single_role and time == min(single_role, producer_warp), config
    everything = sl.carver.carve(wl.matmul(4096, 4096, 4096, "float16"), "h100", topk=1, method="exhaustive")
    assert everything["config"].iloc[0] == df["config"].iloc[0]  # the growth finds the exhaustive top-1
    assert (df["compute_unit"] == "tensor core float16").all() and (df["peak_flops"] == 989.4e12).all()
    small = wl.matmul(520, 264, 256, "float16", epilogue="bias_relu")  # 5 x 2 blocks of 128 x 256, partial edges
    space = MATMUL.space(small, H100)
    configs = [*df["config"], *({**c, "tensor_core": feed} for c in df["config"] for feed in ("wgmma_tma", "wgmma_ws")
                                if c["tensor_core"] != feed)]  # each of the ten in both feeds
    assert all(space.is_legal(c) for c in configs)
    by_pair: dict[tuple, dict] = {}  # one config per (block_k, feed); the rarest raster groups placed first
    for raster in sorted({c["raster"] for c in configs}, key=lambda r: sum(c["raster"] == r for c in configs)):
        pick = next((c for c in configs if c["raster"] == raster and (c["block_k"], c["tensor_core"]) not in by_pair),
                    None)
        if pick is not None:
            by_pair[(pick["block_k"], pick["tensor_core"])] = pick
    for c in configs:
        by_pair.setdefault((c["block_k"], c["tensor_core"]), c)
    picked = list(by_pair.values())
    assert len(picked) == 4 and {c["raster"] for c in picked} == {c["raster"] for c in df["config"]}, picked
    kernels = [sl.build(MATMUL.apply(small, "h100", c), "h100") for c in picked]
    check_resources_together(kernels, archs=("sm_90",))
    inputs = random_inputs(small, rng)
    expected = sl.run_reference(small, inputs)
    for config, outputs in zip(picked, run_together(kernels, inputs, bounds_check=True)):
        compare(small, expected, outputs["D"], f"carver config {config}")


def test_the_default_keeps_its_wgmmas_asynchronous(cuda_compiler: None) -> None:
    """ptxas keeps wgmma asynchronous only if nothing touches the accumulators between issue and wait; when
    something does, it injects waits (C7517) or serializes the wgmmas (C7514, C7515) and says so.  The default
    kernels (with a fused epilogue, a transposed operand, each template) draw none of them, and a variant
    touching one accumulator in the loop does.  (The epilogue once rounded each value to half, back to float
    and to half again, which drew C7514 from the default fp16 kernel; and the producer-warp kernel with fp32
    output drew it while its accumulators were zeroed by every thread, the producer's too.)"""
    for kw, template in (({}, "wgmma"), ({"epilogue": "bias_relu"}, "wgmma"), ({}, "wgmma_tma"),
                         ({}, "wgmma_ws"), ({"out_dtype": "float32"}, "wgmma_ws"), ({"epilogue": "bias_relu"}, None),
                         ({}, None), ({"trans_b": True}, None),
                         ({"trans_a": True, "dtype": "bfloat16"}, None)):
        f = wl.matmul(4096, 4096, 4096, kw.get("dtype", "float16"), **{k: v for k, v in kw.items() if k != "dtype"})
        kernel = sl.build(MATMUL.apply(f, "h100", MATMUL.template_default(f, H100, template)), "h100")
        report = kernel.compile_check("sm_90a")
        assert not [c for c in ("C7514", "C7515", "C7517") if c in report.log], (kw, template, report.log)
        (res,) = report.kernels.values()
        assert res.stack_frame_bytes == 0 and res.spill_store_bytes == 0 and res.registers <= 255
    f = wl.matmul(4096, 4096, 4096, "float16")
    kernel = sl.build(MATMUL.apply(f, "h100", MATMUL.template_default(f, H100, "wgmma")), "h100")
    commit = "    sl_wgmma_commit();\n    sl_wgmma_wait<1>();"
    assert kernel.source.count(commit) == 1
    touch = "    sl_wgmma_commit();\n    sl_acc[0][1][1] += 1.0f;\n    sl_wgmma_wait<1>();"
    touched = kernel.source.replace(commit, touch)
    assert "warpgroup.wait is injected" in compile_check(touched, "sm_90a").log


@pytest.mark.parametrize("out_dtype", ["int8", "bool", "int64"])
def test_a_one_or_eight_byte_output_is_staged_element_by_element(out_dtype: str, toolchain: None) -> None:
    # Regression: the staged output tile of every wgmma template stored neighbouring columns as 4/8-byte pairs
    # and had no pair type for a 1-byte (int8, bool) or 8-byte (int64) output: KeyError 1 from the code
    # generator, for the Hopper default of an fp16 matmul whose result is quantised or compared.
    A = sl.placeholder((64, 64), "float16", "A")
    B = sl.placeholder((64, 64), "float16", "B")
    k = sl.reduce_axis(64, "k")
    C = sl.compute((64, 64), lambda i, j: sl.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C")
    out = {"int8": lambda c: sl.minimum(sl.maximum(c * 20.0, -127.0), 127.0).astype("int8"),
           "bool": lambda c: c > 0.0, "int64": lambda c: (c * 1000.0).astype("int64")}[out_dtype]
    f = sl.func([A, B, sl.compute((64, 64), lambda i, j: out(C[i, j]), "Y")], "mm_q")
    default = MATMUL.default_config(f, H100)
    assert default["tensor_core"] == "wgmma_tma"
    kernels = [sl.build(MATMUL.apply(f, "h100", {**default, "tensor_core": t, "block_k": 32, "stages": 2}), "h100")
               for t in ("wgmma", "wgmma_tma", "wgmma_ws")]  # 2 stages of 32: wgmma_ws needs 2
    rng = np.random.default_rng(0)
    inputs = {n: (rng.integers(-4, 5, (64, 64)) / 8).astype(np.float16) for n in ("A", "B")}  # exact sums
    expected = sl.run_reference(f, inputs)
    for kernel, outputs in zip(kernels, run_together(kernels, inputs, bounds_check=True)):
        np.testing.assert_array_equal(outputs["Y"], expected["Y"], err_msg=kernel.launch[0].name)
