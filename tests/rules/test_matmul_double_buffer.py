"""The SIMT matmul's ``stages=2``: A and B double-buffered in shared memory, the next k tile loaded into
registers while the current one is multiplied.  Numbers on the emulator, the shape of the loop, the space and
the default."""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
from schedlib import workloads as wl
from schedlib.rules import get_rule

MATMUL = get_rule("matmul")
H100 = sl.hw.load("h100")
# 128 x 128 x 8, 8 x 8 per thread, float4 copies, double-buffered (the default takes 16-deep single-buffered
# steps at this size; it double-buffers short grids only)
BIG = {**MATMUL.default_config(wl.matmul(4096, 4096, 4096), H100), "block_k": 8, "stages": 2}


def test_the_fp32_default_double_buffers_short_grids_when_k_has_several_steps() -> None:
    """Two or more blocks per SM hide each other's round trips, and the second buffer then costs (measured on
    an H200: 4096^3 4508 us double-, 3840 us single-buffered); fewer blocks than that wait on every step."""
    assert MATMUL.default_config(wl.matmul(4096, 4096, 4096), H100)["stages"] == 1  # 1024 blocks
    assert MATMUL.default_config(wl.matmul(256, 256, 4096), H100)["stages"] == 2  # 64 tiles x a split of K
    assert MATMUL.default_config(wl.matmul(512, 512, 512), H100)["stages"] == 2  # 64 blocks of 64 x 64
    assert MATMUL.default_config(wl.matmul(256, 256, 8), H100)["stages"] == 1  # one k step: nothing to overlap
    one_step = MATMUL.default_config(wl.matmul(256, 256, 12), H100)  # one 32-deep step, not two of 8
    assert (one_step["block_k"], one_step["stages"]) == (32, 1)
    tiling = MATMUL.tiling(wl.matmul(4096, 4096, 4096), H100, BIG)
    assert tiling.stages == 2 and tiling.shared_bytes == 2 * (128 + 128) * 8 * 4


@pytest.mark.parametrize("m, n, k, kw", [
    (256, 256, 64, {}),
    (200, 136, 76, {"epilogue": "bias_relu"}),  # ragged in every axis: the last k tile is partial
    (128, 128, 40, {"trans_a": True, "trans_b": True, "batch": 2}),
], ids=["even", "ragged-bias-relu", "transposed-batch"])
def test_double_buffered_simt_matmul_matches_numpy(m: int, n: int, k: int, kw: dict, toolchain: None) -> None:
    f = wl.matmul(m, n, k, **kw)
    config = {**BIG, "block_m": 64, "block_n": 64, "thread_m": 4, "thread_n": 4, "vector": 2}  # 256 threads
    sch = MATMUL.apply(f, "h100", config)
    kernel = sl.build(sch, "h100")
    rng = np.random.default_rng(m + n + k)
    ins = {name: rng.standard_normal([int(d.value) for d in f.buffer(name).shape]).astype(np.float32)
           for name in f.inputs}
    want = sl.run_reference(f, ins)[f.outputs[0]]
    got = kernel.run_cpu(*(ins[name] for name in f.inputs), bounds_check=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_k_loop_prefetches_and_meets_one_barrier(cuda_compiler: None) -> None:
    sch = MATMUL.apply(wl.matmul(4096, 4096, 4096), "h100", BIG)
    assert [step["args"]["block"] for step in sch.trace.steps if step["primitive"] == "double_buffer"] == [
        "A_shared", "B_shared"]
    kernel = sl.build(sch, "h100")
    body = kernel.source[kernel.source.index("for (int C_k_0 = 0;"):]
    body = body[:body.index("C_local_ax0")]
    assert body.count("__syncthreads();") == 1
    assert "uint4 sl_pf_A_shared[1];" in body and "uint4 sl_pf_B_shared[1];" in body
    assert "SL_SHARED(float, A_shared, 2048);" in kernel.source  # two 128 x 8 slots
    resources = kernel.compile_check()
    assert resources.spill_bytes == 0 and resources.registers <= 128  # still two 256-thread blocks per SM


@pytest.mark.parametrize(("dtype", "register"), [("bfloat16", "float"), ("float16", "float"), ("int8", "int")])
def test_prefetch_registers_are_32_bit(dtype: str, register: str) -> None:
    """A register array of 16-bit elements written one at a time under a bounds guard went to local memory
    (bf16, K = 33: 20 bytes of spills at 40 registers); widened to 32 bits it stays in registers.  (The bf16
    default of this shape runs on the emulator in test_workloads; the int8 one below.)"""
    f = wl.matmul(40, 56, 33, dtype)
    config = {**MATMUL.default_config(f, H100), "vector": 1}
    src = sl.build(MATMUL.apply(f, "h100", config), "h100").source
    assert f"{register} sl_pf_A_shared[" in src and f"{register} sl_pf_B_shared[" in src


def test_widened_int8_prefetch_matches_numpy(toolchain: None) -> None:
    f = wl.matmul(40, 56, 33, "int8")
    kernel = sl.build(MATMUL.apply(f, "h100", {**MATMUL.default_config(f, H100), "vector": 1}), "h100")
    rng = np.random.default_rng(8)
    a = rng.integers(-128, 128, (40, 33), dtype=np.int8)
    b = rng.integers(-128, 128, (33, 56), dtype=np.int8)
    np.testing.assert_array_equal(kernel.run_cpu(a, b, bounds_check=True), a.astype(np.int32) @ b.astype(np.int32))
