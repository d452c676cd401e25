"""The general-reduction rule's ``stage_row`` knob: one shared copy of the row for every pass.

Checked here: the numbers (emulator against numpy) for softmax, RMSNorm and LayerNorm in three dtypes and
ragged rows; that the staged kernel reads the input from global memory in the copy only; the space's
refusals (symbolic rows, rows larger than a block's shared memory); and the carver's view: later passes
cost L2 traffic when the rows in flight outgrow L1 and nothing when the row is staged.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import schedlib as sl
from schedlib import workloads as wl
from schedlib.carver import analyze, evaluate
from schedlib.ir.dtype import numpy_dtype
from schedlib.ir.expr import as_int
from schedlib.rules import get_rule

RULE = get_rule("general_reduction")
H100 = sl.hw.load("h100")


def _inputs(func: sl.Func, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {n: rng.standard_normal([as_int(d) for d in func.buffer(n).shape]).astype(numpy_dtype(func.buffer(n).dtype))
            for n in func.inputs}


@pytest.mark.parametrize("make, threads, unroll", [
    (lambda: wl.softmax(3, 70), 32, 4),  # ragged row: the last step's lanes are guarded
    (lambda: wl.softmax(2, 1000, "float16"), 128, 8),
    (lambda: wl.rmsnorm(5, 100), 64, 1),
    (lambda: wl.rmsnorm(3, 300, "bfloat16"), 32, 2),
    (lambda: wl.layernorm(4, 256), 64, 4),
], ids=["softmax-ragged", "softmax-fp16", "rmsnorm-scalar", "rmsnorm-bf16", "layernorm"])
def test_staged_row_matches_numpy(make, threads: int, unroll: int, toolchain: None) -> None:
    func = make()
    sch = RULE.apply(func, "h100", {"threads": threads, "unroll": unroll, "stage_row": True})
    kernel = sl.build(sch, "h100")
    ins = _inputs(func, np.random.default_rng(threads + unroll))
    want = sl.run_reference(func, ins)[func.outputs[0]].astype("float64")
    got = kernel.run_cpu(*(ins[n] for n in func.inputs)).astype("float64")
    tol = 1e-5 if func.buffer(func.outputs[0]).dtype == "float32" else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_staged_kernel_reads_global_memory_once_per_row(cuda_compiler: None) -> None:
    func = wl.softmax(64, 32000)
    staged = sl.build(RULE.apply(func, "h100", {"threads": 1024, "unroll": 4, "stage_row": True}), "h100")
    plain = sl.build(RULE.apply(func, "h100", {"threads": 1024, "unroll": 4, "stage_row": False}), "h100")
    global_reads = re.compile(r"SL_VLOAD(?:_REGS)?\((?:uint4, (?:sl_vec\d+, )?)X,")
    assert len(global_reads.findall(plain.source)) == 3  # max, sum and output passes
    assert len(global_reads.findall(staged.source)) == 1  # the copy; the passes read X_shared
    assert staged.source.count("X_shared") >= 4
    (spec,) = staged.launch
    assert spec.dynamic_smem >= 32000 * 4  # more than the 48 KiB static limit: a dynamic allocation
    assert staged.compile_check().spill_bytes == 0


def test_space_refuses_rows_it_cannot_stage() -> None:
    symbolic = wl.softmax(sl.var("R"), sl.var("C"))
    space = RULE.space(symbolic, H100)
    assert "symbolic" in space.reason({"threads": 256, "unroll": 4, "stage_row": True})
    assert space.reason({"threads": 256, "unroll": 4, "stage_row": False}) is None
    too_long = wl.softmax(4, 70000)  # 280 kB of fp32 per row
    why = RULE.space(too_long, H100).reason({"threads": 256, "unroll": 4, "stage_row": True})
    assert why is not None and "281024 bytes" in why and "232448" in why
    assert RULE.space(wl.softmax(4, 70000, "float16"), H100).is_legal({"threads": 256, "unroll": 4,
                                                                       "stage_row": True})
    assert RULE.default_config(wl.softmax(4, 4096), H100)["stage_row"] is False
    # each input read by one pass only: nothing to share between passes
    X = sl.placeholder((4, 64), "float32", "X")
    W = sl.placeholder((4, 64), "float32", "W")
    k = sl.reduce_axis(64, "k")
    R = sl.compute((4,), lambda i: sl.sum(W[i, k], axis=k), "R")
    once = sl.func([X, W, sl.compute((4, 64), lambda i, j: X[i, j] * R[i], "Y")])
    why = RULE.space(once, H100).reason({"threads": 32, "unroll": 1, "stage_row": True})
    assert why == "stage_row needs an input that several passes read (none is read more than once per row)"
    assert RULE.tiling(once, H100, {"threads": 32, "unroll": 1, "stage_row": False}).rereads == {}


def _figures(func: sl.Func, config: dict) -> dict:
    return evaluate(analyze(func, "Y", {}), RULE.tiling(func, H100, config), H100, explain=False)


def test_carver_charges_later_passes_where_the_rows_live() -> None:
    func = wl.softmax(4096, 32000)
    compulsory = 2 * 4096 * 32000 * 4
    # 512 threads: 4 blocks per SM hold 512 kB of rows, more than L1: two more passes through L2, and the
    # 67 MB a wave keeps in flight exceed the usable L2, so part of them comes from DRAM again.
    plain = _figures(func, {"threads": 512, "unroll": 4, "stage_row": False})
    assert plain["blocks_per_sm"] == 4
    assert plain["l2_bytes"] == pytest.approx(compulsory + 2 * 4096 * 32000 * 4)
    assert compulsory < plain["dram_bytes"] < plain["l2_bytes"]
    staged = _figures(func, {"threads": 512, "unroll": 4, "stage_row": True})
    assert staged["blocks_per_sm"] == 1 and staged["staged_in_shared"] == "X"
    assert staged["l2_bytes"] == pytest.approx(compulsory) and staged["dram_bytes"] == pytest.approx(compulsory)
    assert staged["shared_bytes"] > plain["shared_bytes"] / 2  # the passes now read shared memory
    assert staged["est_time_us"] < plain["est_time_us"]
    # short rows stay in L1: the later passes cost no L2 traffic either way
    short = _figures(wl.softmax(4096, 1024), {"threads": 256, "unroll": 4, "stage_row": False})
    assert short["l2_bytes"] == pytest.approx(2 * 4096 * 1024 * 4)


@pytest.mark.parametrize(("func", "staged"), [
    (wl.rmsnorm(4096, 32000), True),  # two 128 KB rows per SM outgrow L1 (H200: 332 -> 276 us staged)
    (wl.softmax(4096, 32000), True),
    (wl.softmax(4096, 4096), False),  # four 16 KB rows fit (staging cost 2-7% on the H200)
    (wl.rmsnorm(64, 4096, "float16"), False),
    (wl.softmax(8, 80000), False),  # 320 KB: no block may hold it in shared memory
])
def test_the_default_stages_rows_that_outgrow_l1(func: sl.Func, staged: bool) -> None:
    for target in ("h100", "h200", "a100"):
        config = RULE.default_config(func, sl.hw.load(target))
        assert config["stage_row"] is staged, (target, config)
        assert RULE.space(func, target).is_legal(config)


def test_staged_rows_read_back_in_one_access_per_thread_step() -> None:
    """fp32 at unroll 8 would read a thread's 32 bytes as scalars 8 words apart across the warp (8-way bank
    conflicts; 4.2x slower on an H200); fp16 at unroll 8 is one 16-byte access."""
    fp32 = RULE.space(wl.rmsnorm(4096, 32000), "h100")
    reason = fp32.reason({"threads": 1024, "unroll": 8, "stage_row": True})
    assert reason is not None and "bank conflicts" in reason and "32-byte" in reason
    assert fp32.reason({"threads": 1024, "unroll": 8, "stage_row": False}) is None
    assert fp32.reason({"threads": 1024, "unroll": 4, "stage_row": True}) is None
    fp16 = RULE.space(wl.rmsnorm(4096, 32000, "float16"), "h100")
    assert fp16.reason({"threads": 1024, "unroll": 8, "stage_row": True}) is None
