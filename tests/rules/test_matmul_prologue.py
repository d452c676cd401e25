"""An operand computed from func inputs by element-wise stages (``relu(X) @ W``, a weight scaled per row, a
chain such as ``float(Wq) * s``) is a matmul operand: the SIMT template computes the stages as it copies the
inputs into shared memory, so they are never stored.  Emulated against the reference and compiled for
sm_80/sm_90 within the limits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib.ir.func import Func

from .helpers import check_schedule

MATMUL = rules.get_rule("matmul")
H100 = sl.hw.load("h100")


def relu_matmul(m: int, n: int, depth: int, dtype: str = "float32", scaled_weight: bool = False) -> Func:
    """``D = relu(relu(X) @ W')`` with ``W' = W * s[k]`` when ``scaled_weight`` (else W itself)."""
    X, W = sl.placeholder((m, depth), dtype, "X"), sl.placeholder((depth, n), dtype, "W")
    s = sl.placeholder((depth,), dtype, "s")
    A = sl.compute((m, depth), lambda i, k: sl.maximum(X[i, k], 0.0), "A")
    B = sl.compute((depth, n), lambda k, j: W[k, j] * s[k], "B") if scaled_weight else W
    k = sl.reduce_axis(depth, "k")
    C = sl.compute((m, n), lambda i, j: sl.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C")
    D = sl.compute((m, n), lambda i, j: sl.maximum(C[i, j], 0.0).astype(dtype), "D")
    return sl.func([X, W, *([s] if scaled_weight else []), D], "relu_matmul")


def dequant_chain(m: int, n: int, depth: int) -> Func:
    """``X @ (float16(Wq) * s[n])``: an int8 weight widened, then scaled per column, in two stages."""
    X, Wq = sl.placeholder((m, depth), "float16", "X"), sl.placeholder((depth, n), "int8", "Wq")
    s = sl.placeholder((n,), "float16", "s")
    Wf = sl.compute((depth, n), lambda k, j: Wq[k, j].astype("float16"), "Wf")
    Ws = sl.compute((depth, n), lambda k, j: Wf[k, j] * s[j], "Ws")
    k = sl.reduce_axis(depth, "k")
    C = sl.compute((m, n), lambda i, j: sl.sum(X[i, k].astype("float32") * Ws[k, j].astype("float32"), axis=k), "C")
    return sl.func([X, Wq, s, C], "dequant_chain")


def diamond(m: int, n: int, depth: int) -> Func:
    """``Q = R + 2 R`` with ``R = relu(X)``: a stage read twice within the operand's stages."""
    X, W = sl.placeholder((m, depth), "float32", "X"), sl.placeholder((depth, n), "float32", "W")
    R = sl.compute((m, depth), lambda i, k: sl.maximum(X[i, k], 0.0), "R")
    P = sl.compute((m, depth), lambda i, k: R[i, k] * 2.0, "P")
    Q = sl.compute((m, depth), lambda i, k: R[i, k] + P[i, k], "Q")
    k = sl.reduce_axis(depth, "k")
    return sl.func([X, W, sl.compute((m, n), lambda i, j: sl.sum(Q[i, k] * W[k, j], axis=k), "C")], "diamond")


SIMT = {"block_m": 32, "block_n": 32, "block_k": 16, "thread_m": 4, "thread_n": 4, "vector": 4, "split_k": 1,
        "stages": 2, "tensor_core": False, "raster": 1}


@pytest.mark.parametrize(("make", "config"), [
    (lambda: relu_matmul(48, 56, 40), None),
    (lambda: relu_matmul(96, 80, 64, "float16", scaled_weight=True), None),  # both operands computed
    (lambda: relu_matmul(100, 36, 72), {**SIMT, "stages": 1, "vector": 1}),  # ragged tiles, one buffer
    (lambda: relu_matmul(64, 64, 8192, scaled_weight=True), {**SIMT, "split_k": 8}),  # split-K
], ids=["fp32", "fp16-both", "ragged", "split-k"])
def test_computed_operands_are_computed_in_the_copy(make: Callable[[], Func], config: dict | None,
                                                     rng: np.random.Generator) -> None:
    """Regression: the matmul rule declined ("operands must be func inputs") and the serial fallback ran it."""
    f = make()
    facts = MATMUL.analyze(f, H100)
    assert not isinstance(facts, str), facts
    assert facts.prologue == (("A", "B") if "s" in f.inputs else ("A",))
    sch = rules.apply_default(f, "h100") if config is None else MATMUL.apply(f, H100, config)
    assert sch.rule == "matmul" and not set(facts.prologue) & set(sch.blocks)  # computed, never stored
    kernel = check_schedule(f, sch, rng)
    assert "A_shared" in kernel.source and not re.search(r"\bA\[", kernel.source)  # A never reaches memory
    assert math.isfinite(sl.carver.estimate(f, H100, sch.config)["est_time_us"])


@pytest.mark.parametrize(("make", "stages", "config"), [
    (lambda: dequant_chain(70, 64, 96), ("Ws", "Wf"), None),  # ragged rows
    (lambda: diamond(33, 40, 50), ("Q", "P", "R"), None),
    (lambda: dequant_chain(64, 64, 4096), ("Ws", "Wf"), {**SIMT, "split_k": 4}),
], ids=["dequant-chain", "diamond", "dequant-chain-split-k"])
def test_chains_of_stages_are_computed_in_the_copy(make: Callable[[], Func], stages: tuple[str, ...],
                                                   config: dict | None, rng: np.random.Generator) -> None:
    """Regression: an operand computed by two stages or more (a dequantised weight widened, then scaled) was
    declined and ran on the serial fallback."""
    f = make()
    facts = MATMUL.analyze(f, H100)
    assert not isinstance(facts, str), facts
    assert facts.prologue == stages  # readers first: the order they inline in
    sch = rules.apply_default(f, "h100") if config is None else MATMUL.apply(f, H100, config)
    assert sch.rule == "matmul" and not set(stages) & set(sch.blocks)
    check_schedule(f, sch, rng)
    plain = sl.workloads.matmul(64, 64, 4096, "float16")
    if config is not None:  # the stages' reads are the k loop's steps, not steps of their own
        assert sl.carver.estimate(f, H100, config)["round_trips_per_block"] == \
            sl.carver.estimate(plain, H100, config)["round_trips_per_block"]


def test_tensor_cores_are_not_offered_for_a_computed_operand() -> None:
    """cp.async and the TMA copy global memory as it is: the stage has nowhere to run, so the space is SIMT."""
    f = relu_matmul(128, 128, 64, "float16")
    assert MATMUL.space(f, H100).knob("tensor_core").values == (False,)
    assert MATMUL.space(sl.workloads.matmul(128, 128, 64, "float16"), H100).knob("tensor_core").values[-1] != False  # noqa: E712


def test_stages_the_copy_cannot_take_are_declined_with_the_reason() -> None:
    X, W = sl.placeholder((32, 32), "float32", "X"), sl.placeholder((32, 32), "float32", "W")
    A = sl.compute((32, 32), lambda i, k: sl.maximum(X[i, k], 0.0), "A")
    A2 = sl.compute((32, 32), lambda i, k: A[i, k] * 2.0, "A2")
    k = sl.reduce_axis(32, "k")
    # a stage of the chain that another block reads too (here the epilogue) must be stored
    C = sl.compute((32, 32), lambda i, j: sl.sum(A2[i, k] * W[k, j], axis=k), "C")
    D = sl.compute((32, 32), lambda i, j: C[i, j] + A[i, j], "D")
    why = MATMUL.applies(sl.func([X, W, D], "chain_read_twice"), H100)
    assert why is not None and "operand A2 must be a func input, or computed from func inputs by element-wise" in why
    assert why.endswith("(block D reads A too, so it must be stored)")
    # a reduction among the stages is no element-wise stage
    r = sl.reduce_axis(32, "r")
    rowsum = sl.compute((32,), lambda i: sl.sum(X[i, r], axis=r), "rowsum")
    A3 = sl.compute((32, 32), lambda i, k: X[i, k] / rowsum[i], "A3")
    C3 = sl.compute((32, 32), lambda i, j: sl.sum(A3[i, k] * W[k, j], axis=k), "C")
    assert MATMUL.applies(sl.func([X, W, C3], "normalised"), H100) is not None
    # the stage is also a func output: it must be stored, so it cannot live in the copy alone
    C2 = sl.compute((32, 32), lambda i, j: sl.sum(A[i, k] * W[k, j], axis=k), "C")
    why = MATMUL.applies(sl.func([X, W, A, C2], "stored"), H100)
    assert why is not None and "operand A must be" in why and why.endswith("(A is a func output, which must be stored)")


def test_one_stage_read_as_both_operands_and_a_small_side(rng: np.random.Generator) -> None:
    """Regression: ``relu(X) @ relu(X).T`` was declined with a reason that did not hold, and a computed
    operand with a side of 4 was sent to the GEMV rule, which cannot take it: both ran on the fallback."""
    X = sl.placeholder((40, 24), "float32", "X")
    A = sl.compute((40, 24), lambda i, k: sl.maximum(X[i, k], 0.0), "A")
    k = sl.reduce_axis(24, "k")
    gram = sl.func([X, sl.compute((40, 40), lambda i, j: sl.sum(A[i, k] * A[j, k], axis=k), "G")], "relu_gram")
    small = relu_matmul(4, 64, 256)
    for f in (gram, small):
        sch = rules.apply_default(f, "h100")
        assert sch.rule == "matmul", rules.explain(f, "h100")
        check_schedule(f, sch, rng)
    # a small side whose operands GEMV does take stays GEMV's
    assert "GEMV rule" in MATMUL.applies(sl.workloads.gemv(64, 256, "float16", weight_dtype="int8"), H100)


def test_the_carver_counts_the_prologue_in_the_matmul_k_steps() -> None:
    """Regression: the stage's reads were priced as loop steps of their own, on top of the k loop's (64.0 us
    and 128 round trips for relu(X) @ W against 41.9 us and 64 for X @ W, same config, 1024^3 fp32 on h100)."""
    config = {**SIMT, "block_m": 64, "block_n": 64, "thread_m": 8, "thread_n": 8}
    plain = sl.carver.estimate(sl.workloads.matmul(1024, 1024, 1024), H100, config)
    computed = sl.carver.estimate(relu_matmul(1024, 1024, 1024), H100, config)
    assert computed["round_trips_per_block"] == plain["round_trips_per_block"]
    assert computed["est_time_us"] < 1.1 * plain["est_time_us"]


def offset_and_back(m: int, n: int, depth: int, dtype: str) -> Func:
    """``((X + 1000) - 1000) @ W`` in ``dtype``: the first stage rounds to ``dtype`` where it is stored
    (0.3 + 1000 is 1000.5 in fp16), so the chain is not X itself."""
    X, W = sl.placeholder((m, depth), dtype, "X"), sl.placeholder((depth, n), dtype, "W")
    A1 = sl.compute((m, depth), lambda i, k: X[i, k] + 1000.0, "A1")
    A2 = sl.compute((m, depth), lambda i, k: A1[i, k] - 1000.0, "A2")
    k = sl.reduce_axis(depth, "k")
    C = sl.compute((m, n), lambda i, j: sl.sum(A2[i, k].astype("float32") * W[k, j].astype("float32"), axis=k), "C")
    return sl.func([X, W, C], "offset_and_back")


def zero_point_dequant(m: int, n: int, depth: int) -> Func:
    """``X @ ((float16(Wq) - z[n]) * s[n])``: a zero point and a scale per column, each stage rounded to fp16."""
    X, Wq = sl.placeholder((m, depth), "float16", "X"), sl.placeholder((depth, n), "int8", "Wq")
    z, s = sl.placeholder((n,), "float16", "z"), sl.placeholder((n,), "float16", "s")
    Wz = sl.compute((depth, n), lambda k, j: Wq[k, j].astype("float16") - z[j], "Wz")
    Ws = sl.compute((depth, n), lambda k, j: Wz[k, j] * s[j], "Ws")
    k = sl.reduce_axis(depth, "k")
    C = sl.compute((m, n), lambda i, j: sl.sum(X[i, k].astype("float32") * Ws[k, j].astype("float32"), axis=k), "C")
    return sl.func([X, Wq, z, s, C], "zero_point_dequant")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_each_stage_of_a_chain_rounds_to_its_type(dtype: str) -> None:
    """Inlined into the copy, a chain of fp16/bf16 stages rounded once, at the end (C = 0.3, not 0.5)."""
    f = offset_and_back(16, 16, 16, dtype)
    sch = MATMUL.apply(f, H100)
    assert sch.rule == "matmul" and MATMUL.analyze(f, H100).prologue == ("A2", "A1")
    arrays = np.float16 if dtype == "float16" else np.float32  # bf16 inputs are given as float32
    X, W = np.full((16, 16), 0.3, dtype=arrays), np.eye(16, dtype=arrays)
    expected = sl.run_reference(f, {"X": X, "W": W})["C"]
    got = sl.build(sch, "h100").run_cpu(X, W, bounds_check=True)
    assert expected[0, 0] == (0.5 if dtype == "float16" else 0.0)  # 1000.3 rounds to 1000.5 (fp16), 1000 (bf16)
    np.testing.assert_array_equal(got, expected)


def test_a_zero_point_dequant_chain_matches_the_reference(rng: np.random.Generator) -> None:
    f = zero_point_dequant(48, 64, 96)
    check_schedule(f, MATMUL.apply(f, H100), rng)


def test_a_stage_both_operands_reach_is_computed_in_each_copy(rng: np.random.Generator) -> None:
    """``(R * 2) @ (R * 3).T`` with ``R = relu(X)``: R is read by two stages of the operands' trees and by
    nothing else, so each operand's copy computes it (it was declined: Q reads R too)."""
    X = sl.placeholder((40, 24), "float32", "X")
    R = sl.compute((40, 24), lambda i, k: sl.maximum(X[i, k], 0.0), "R")
    P = sl.compute((40, 24), lambda i, k: R[i, k] * 2.0, "P")
    Q = sl.compute((40, 24), lambda i, k: R[i, k] * 3.0, "Q")
    k = sl.reduce_axis(24, "k")
    f = sl.func([X, sl.compute((40, 40), lambda i, j: sl.sum(P[i, k] * Q[j, k], axis=k), "G")], "shared_root")
    assert MATMUL.applies(f, H100) is None
    assert set(MATMUL.analyze(f, H100).prologue) == {"P", "Q", "R"}
    check_schedule(f, MATMUL.apply(f, H100), rng)
