"""The matmul rule's warp-specialized Hopper template (``tensor_core="wgmma_ws"``): a producer warpgroup feeds
the TMA ring and the accumulator warps release slots through mbarriers.  Where it exists and what it refuses,
the kernel's shape (no block barrier in the mainloop), kernels built from it (emulator vs numpy; nvcc for
sm_90a within the H100 profile), and its barrier discipline checked by breaking it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.errors import BuildError
from schedlib.hw.registers import producer_register_split as register_split
from schedlib.runtime.emulator import KernelLaunch, emulate

from .helpers import MatmulCase as Case
from .helpers import check_schedule, random_inputs
from .helpers import matmul_maker as mm

MATMUL = rules.get_rule("matmul")
H100 = sl.hw.load("h100")


def ws(bm: int, bn: int, bk: int, wn: int, stages: int, raster: int = 1) -> dict[str, Any]:
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": 2, "thread_n": wn // 4, "vector": 1,
            "split_k": 1, "stages": stages, "tensor_core": "wgmma_ws", "raster": raster}


@pytest.mark.parametrize("target, present", [("h100", True), ("h200", True), ("a100", False), ("l40s", False)])
def test_it_is_a_template_of_hopper_only_and_not_the_default(target: str, present: bool) -> None:
    f = wl.matmul(4096, 4096, 4096, "float16")
    assert ("wgmma_ws" in MATMUL.space(f, target).knob("tensor_core").values) == present
    assert MATMUL.default_config(f, target)["tensor_core"] != "wgmma_ws"  # unmeasured: the TMA kernel stays


def test_what_it_refuses() -> None:
    f = wl.matmul(4096, 4096, 4096, "float16")
    space = MATMUL.space(f, H100)
    assert "2 stages or more" in space.reason(ws(128, 256, 64, 256, 1))
    A = sl.placeholder((2, 3, 256, 256), "float16", name="A")
    B = sl.placeholder((2, 3, 256, 256), "float16", name="B")
    k = sl.reduce_axis(256, name="k")
    C = sl.compute((2, 3, 256, 256), lambda b, c, i, j: sl.sum(
        A[b, c, i, k].astype("float32") * B[b, c, k, j].astype("float32"), axis=k), name="C")
    batched = MATMUL.space(sl.func([A, B, C]), H100)  # two batch axes: a tensor map here takes one
    assert "batch axes" in batched.reason(ws(128, 128, 64, 128, 2))
    assert batched.reason({**ws(128, 128, 64, 128, 2), "tensor_core": "wgmma"}) is None
    # 1024 threads of accumulator warps leave no room for the producer warpgroup
    assert "threads per block" in space.reason(ws(128, 64, 64, 16, 2))


def test_the_default_sized_kernel() -> None:
    f = wl.matmul(4096, 4096, 4096, "float16")
    config = MATMUL.template_default(f, H100, "wgmma_ws")
    tma = MATMUL.template_default(f, H100, "wgmma_tma")
    assert config == {**tma, "tensor_core": "wgmma_ws"} == ws(128, 256, 64, 256, 4, tma["raster"])
    kernel = sl.build(MATMUL.apply(f, "h100", config), "h100")
    (spec,) = kernel.launch
    assert spec.block == (384, 1, 1)  # two accumulator warpgroups and the producer's
    t = MATMUL.tiling(f, H100, config)
    assert t.tma and spec.dynamic_smem == t.shared_bytes == MATMUL.tiling(f, H100, tma).shared_bytes + 4 * 8
    assert [m.param for m in spec.tensor_maps] == ["@tmap:A", "@tmap:B"]
    body = kernel.source.split('extern "C"')[-1]
    mainloop = body[body.index("if (sl_warp >= 8)"):body.index("sl_wgmma_wait<0>();")]
    assert "sl_mbar_arrive(&sl_empty[" in mainloop and "sl_mbar_wait(&sl_empty[" in mainloop
    # after the set-up's block barrier the roles never meet: the accumulator warps stage and write the output
    # tile behind their own named barrier, in their branch, which ends the kernel
    assert body.count("__syncthreads();") == 1 and body.index("__syncthreads();") < body.index("if (sl_warp >= 8)")
    epilogue = body[body.index("sl_wgmma_wait<0>();"):]
    assert epilogue.count("sl_named_barrier<1, 256>();") == 2 and "sl_i * 256;" in epilogue
    assert epilogue.rstrip().endswith("}\n  }\n}") and epilogue.count("\n  }\n") == 1


def test_the_producer_gives_its_registers_to_the_accumulator_warps(cuda_compiler: None) -> None:
    """At 384 threads ptxas may give each thread 168 registers; the producer warpgroup keeps 40 and the two
    accumulator warpgroups take the rest, 232 each, as CUTLASS splits such a block.  setmaxnreg.inc waits
    until the pool holds what it asks for, so the split must fit in what the block was given: ptxas gives
    a kernel that uses setmaxnreg the whole cap (168, where this kernel alone needs fewer)."""
    assert register_split(256) == (168, 232)
    assert register_split(384) == (128, 152)  # three accumulator warpgroups
    assert register_split(128) is None  # 256 threads may have 255 registers each already
    assert register_split(768) is None  # 72 each, and the producer's 32 x 128 give less than 8 more each
    f = wl.matmul(4096, 4096, 4096, "float16")
    kernel = sl.build(MATMUL.apply(f, "h100", MATMUL.template_default(f, H100, "wgmma_ws")), "h100")
    body = kernel.source.split('extern "C"')[-1]
    producer = body[body.index("if (sl_warp >= 8)"):body.index("  else {")]
    assert "sl_setmaxnreg_dec<40>();" in producer and "sl_setmaxnreg_inc<232>();" not in producer
    assert "sl_setmaxnreg_inc<232>();" in body[body.index("  else {"):]
    (res,) = kernel.compile_check("sm_90a").kernels.values()
    assert res.registers == 168  # the whole cap: the 40 x 128 + 232 x 256 of the split are in the block's pool
    assert res.spill_store_bytes == 0 and res.stack_frame_bytes == 0


def test_a_producer_warp_needs_the_tma() -> None:
    f = wl.matmul(256, 256, 256, "float16")
    sch = MATMUL.apply(f, "h100", MATMUL.template_default(f, H100, "wgmma"))
    root = sch.func.block(MATMUL.tiling(f, H100, MATMUL.template_default(f, H100, "wgmma")).main_block)
    sch.annotate(root.name, "producer", "warp")
    with pytest.raises(BuildError, match="through the TMA only"):
        sl.build(sch, "h100")


CASES = [
    # every operand layout; K-major swizzles of 32/64/128 bytes; MN-major atoms; edges in M/N/K filled by the
    # copies; a batch with shared weights; rings of 2..4 stages; a raster group; an output stored directly
    Case("f16-nn-200x320x136-default", mm(200, 320, 136, "float16")),
    Case("f16-nt-residual-100x72x40-k16-s2", mm(100, 72, 40, "float16", trans_b=True, epilogue="residual"),
         ws(64, 64, 16, 32, 2)),
    Case("f16-tn-bias_relu-96x80x48", mm(96, 80, 48, "float16", trans_a=True, epilogue="bias_relu"),
         ws(64, 64, 16, 64, 3)),
    Case("bf16-tt-128x128x160-k32-s4", mm(128, 128, 160, "bfloat16", trans_a=True, trans_b=True),
         ws(128, 128, 32, 64, 4)),
    Case("bf16-nn-gelu-n16-raster", mm(320, 128, 64, "bfloat16", epilogue="gelu"), ws(64, 64, 32, 16, 2, raster=4)),
    Case("f16-batch3-tn-s3", mm(64, 48, 72, "float16", batch=3, trans_a=True), ws(64, 64, 16, 64, 3)),
    Case("f16-nt-N100-direct", mm(96, 100, 64, "float16", trans_b=True), ws(64, 64, 32, 64, 2)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_matches_numpy_and_fits_the_gpu(case: Case, rng: np.random.Generator, toolchain: None) -> None:
    f = case.make()
    config = case.config or MATMUL.template_default(f, H100, "wgmma_ws")
    assert config["tensor_core"] == "wgmma_ws", config
    kernel = check_schedule(f, MATMUL.apply(f, "h100", config), rng, sizes=case.sizes, archs=("sm_90",))
    assert "sl_mbar_arrive" in kernel.source and kernel.arch == "sm_90a"
    assert ("sl_out_s" in kernel.source) == ("direct" not in case.id), case.id


def _run(source: str, spec: Any, inputs: dict[str, np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    out = np.full(shape, np.nan, np.float16)
    emulate(source, [KernelLaunch(spec.name, spec.grid_for({}), spec.block, spec.params, spec.dynamic_smem)],
            {**inputs, "D": out, **{m.param: m for m in spec.tensor_maps}}, bounds_check=True)
    return out


def test_breaking_the_barrier_discipline_is_caught(rng: np.random.Generator) -> None:
    """A producer that does not wait for released slots overwrites tiles in use (and completes phases nobody
    waits for); one that waits with the wrong parity never starts.  The emulator reports both."""
    f = wl.matmul(128, 64, 256, "float16")
    kernel = sl.build(MATMUL.apply(f, "h100", ws(128, 64, 32, 64, 3)), "h100")
    (spec,) = kernel.launch
    inputs = random_inputs(f, rng)
    want = sl.run_reference(f, inputs)["D"].astype(np.float64)
    good = _run(kernel.source, spec, inputs, (128, 64)).astype(np.float64)
    np.testing.assert_allclose(good, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    wait = re.search(r" *sl_mbar_wait\(&sl_empty\[sl_stage\], \(\(sl_kt / 3\) & 1\) \^ 1\);[^\n]*\n", kernel.source)
    assert wait is not None
    try:
        got = _run(kernel.source.replace(wait.group(0), ""), spec, inputs, (128, 64)).astype(np.float64)
    except sl.EmulatorError as exc:
        assert "mbarrier" in str(exc)
    else:
        assert not np.allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    wrong_parity = kernel.source.replace("((sl_kt / 3) & 1) ^ 1)", "(sl_kt / 3) & 1)")
    assert wrong_parity != kernel.source
    with pytest.raises(sl.EmulatorError, match="mbarrier phase"):
        _run(wrong_parity, spec, inputs, (128, 64))


def test_the_carver_sees_its_deeper_prefetch_only_where_latency_bounds() -> None:
    """A 4-slot ring runs 3 tiles ahead with a producer warp and 2 without (one slot stays with the wgmma group
    in flight).  The model shortens the latency chain by that depth: on a long-K, few-block problem the chain
    counts and the producer warp estimates faster (and leads the ranking); at 4096^3 the estimates are equal."""
    long_k = wl.matmul(256, 256, 8192, "float16")
    config = ws(64, 16, 64, 16, 4)  # 64 blocks of 64 x 16, each walking 128 k steps
    assert MATMUL.tiling(long_k, H100, config).ahead == 3
    assert MATMUL.tiling(long_k, H100, {**config, "tensor_core": "wgmma_tma"}).ahead == 2
    assert MATMUL.tiling(long_k, H100, {**config, "tensor_core": "wgmma_tma", "stages": 2}).ahead == 1
    with_producer = sl.carver.estimate(long_k, "h100", config)
    without = sl.carver.estimate(long_k, "h100", {**config, "tensor_core": "wgmma_tma"})
    assert with_producer["est_time_us"] < 0.8 * without["est_time_us"]
    # ranked on a K just short of the split-K SIMT template's (which leads where K >= 4x the output side:
    # tensor cores do not split K)
    top = sl.carver.carve(wl.matmul(256, 512, 2040, "float16"), "h100", topk=2)
    assert list(top["tensor_core"]) == ["wgmma_ws", "wgmma_ws"]
    big = wl.matmul(4096, 4096, 4096, "float16")
    config = MATMUL.template_default(big, H100, "wgmma_ws")
    assert sl.carver.estimate(big, "h100", config)["est_time_us"] == sl.carver.estimate(
        big, "h100", {**config, "tensor_core": "wgmma_tma"})["est_time_us"]
