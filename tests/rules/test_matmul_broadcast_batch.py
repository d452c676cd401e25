"""Matmuls whose batch axes index only one operand: a linear layer over ``X[b, s, k]`` with one weight.

The matmul rule treats the axes of an operand besides its innermost spatial one as batch axes that the other
operand is broadcast over, in every template (SIMT, mma.sync, wgmma and its TMA-fed variants); the GEMV
rule, for a short sequence, reads each weight element once for all of ``b x s`` activation rows while they
stay few, and once per batch row past that.  Each case is built, emulated against the reference and
compile-checked.
"""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib.ir.func import Func

from .helpers import check_schedule


def linear(B: int = 2, S: int = 40, K: int = 64, N: int = 48, dtype: str = "float16", trans_w: bool = False) -> Func:
    """``Y[b, s, n] = X[b, s, :] . W[n, :]`` (``W[:, n]`` when ``trans_w``), output in ``dtype``."""
    X = sl.placeholder((B, S, K), dtype, "X")
    W = sl.placeholder((K, N) if trans_w else (N, K), dtype, "W")
    k = sl.reduce_axis(K, "k")
    C = sl.compute((B, S, N), lambda b, i, j: sl.sum(
        X[b, i, k].astype("float32") * (W[k, j] if trans_w else W[j, k]).astype("float32"), axis=k), "C")
    if dtype == "float32":
        return sl.func([X, W, C], "linear")
    Y = sl.compute((B, S, N), lambda b, i, j: C[b, i, j].astype(dtype), "Y")
    return sl.func([X, W, Y], "linear")


# every template with the weight stored N x K; K x N (B read along n) with one SIMT and one TMA-fed template
TEMPLATES = [("float32", False, False), ("float16", False, False), ("float16", True, False),
             ("float16", "wgmma", False), ("float16", "wgmma_tma", False), ("float16", "wgmma_ws", False),
             ("float32", False, True), ("float16", "wgmma_tma", True)]


@pytest.mark.parametrize("dtype, template, trans_w", TEMPLATES,
                         ids=[f"{d}-{t}-{'w-kn' if w else 'w-nk'}" for d, t, w in TEMPLATES])
def test_every_matmul_template_takes_a_linear_layer(dtype: str, template: bool | str, trans_w: bool,
                                                    rng: np.random.Generator, toolchain: None) -> None:
    func = linear(dtype=dtype, trans_w=trans_w)
    rule = rules.get_rule("matmul")
    facts = rule.analyze(func, sl.hw.load("h100"))
    assert (facts.batch, facts.m, facts.n) == (("b",), "i", "j")
    config = rule.template_default(func, "h100", template)
    check_schedule(func, rule.apply(func, "h100", config), rng, archs=("sm_90",))


def test_the_weight_may_be_the_batched_side(rng: np.random.Generator, toolchain: None) -> None:
    """``C[b, m, n] = A[m, :] . B[b, :, n]``: the first operand is the one broadcast."""
    A = sl.placeholder((24, 32), "float32", "A")
    B = sl.placeholder((3, 32, 40), "float32", "B")
    k = sl.reduce_axis(32, "k")
    C = sl.compute((3, 24, 40), lambda b, i, j: sl.sum(A[i, k] * B[b, k, j], axis=k), "C")
    func = sl.func([A, B, C], "shared_a")
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "matmul"
    check_schedule(func, sch, rng, archs=("sm_90",))


def test_two_batch_axes_over_one_weight(rng: np.random.Generator, toolchain: None) -> None:
    """Heads and batch over one weight: the TMA-fed templates take one batch axis, so they are not chosen."""
    X = sl.placeholder((2, 3, 24, 32), "float16", "X")
    W = sl.placeholder((40, 32), "float16", "W")
    k = sl.reduce_axis(32, "k")
    C = sl.compute((2, 3, 24, 40), lambda b, h, i, j: sl.sum(
        X[b, h, i, k].astype("float32") * W[j, k].astype("float32"), axis=k), "C")
    func = sl.func([X, W, C], "heads")
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "matmul" and sch.config["tensor_core"] not in ("wgmma_tma", "wgmma_ws")
    with pytest.raises(ValueError, match="no legal tensor_core='wgmma_tma' config: 2 batch axes; the TMA tensor "
                                         "maps here take at most one"):
        rules.get_rule("matmul").template_default(func, "h100", "wgmma_tma")
    check_schedule(func, sch, rng, archs=("sm_90",))


def test_batch_axes_after_m_are_declined() -> None:
    X = sl.placeholder((3, 24, 32), "float32", "X")
    W = sl.placeholder((40, 32), "float32", "W")
    k = sl.reduce_axis(32, "k")
    C = sl.compute((24, 3, 40), lambda i, b, j: sl.sum(X[b, i, k] * W[j, k], axis=k), "C")
    func = sl.func([X, W, C], "late_batch")
    assert rules.get_rule("matmul").applies(func, "h100") == \
        "spatial axes ['i', 'b', 'j']: the batch axes ['b'] must come first in the output"


@pytest.mark.parametrize("B, S, trans_w, small", [(2, 3, False, ("b", "i")), (4, 1, True, ("b", "i")),
                                                  (17, 1, False, ("i",))])
def test_gemv_reads_the_weight_once_for_a_few_rows(B: int, S: int, trans_w: bool, small: tuple[str, ...],
                                                   rng: np.random.Generator, toolchain: None) -> None:
    """Up to 16 activation rows (b x s) are lanes of one pass over the weight; 17 rows of one token each (no
    divisor to make passes of) are 17 passes (rows of the grid), still correct."""
    func = linear(B, S, 96, 64, trans_w=trans_w)
    facts = rules.get_rule("gemv").analyze(func, sl.hw.load("h100"))
    assert facts.small == small and facts.inner is not trans_w
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "gemv"
    check_schedule(func, sch, rng, archs=("sm_90",))


@pytest.mark.parametrize("template, shared", [(False, False), (True, False), ("wgmma", False),
                                              ("wgmma_tma", False), ("wgmma_ws", False), (True, True),
                                              ("wgmma_tma", True)],
                         ids=["simt", "mma", "wgmma", "wgmma_tma", "wgmma_ws", "shared-mma", "shared-wgmma_tma"])
def test_a_batch_of_one_matrix_builds_in_every_template(template: bool | str, shared: bool,
                                                        rng: np.random.Generator, toolchain: None) -> None:
    """A batch axis of extent 1 (a prefill of one sequence): its block loop only holds 0, which the tensor-core
    lowering's tile-origin check took for a misplaced tile."""
    func = sl.workloads.matmul(40, 48, 64, "float16", batch=1) if shared else linear(B=1, S=40, K=64, N=48)
    rule = rules.get_rule("matmul")
    check_schedule(func, rule.apply(func, "h100", rule.template_default(func, "h100", template)), rng,
                   archs=("sm_90",))


def test_operands_whose_batch_axes_do_not_lead_are_declined(rng: np.random.Generator, toolchain: None) -> None:
    """Per-head weights over [batch, seq, heads, dim] activations: the head axis sits between the activation's
    rows and k, which the templates cannot stage; and an operand read at a repeated axis."""
    X = sl.placeholder((2, 24, 3, 32), "float16", "X")
    W = sl.placeholder((3, 40, 32), "float16", "W")
    k = sl.reduce_axis(32, "k")
    C = sl.compute((2, 3, 24, 40), lambda b, h, s, n: sl.sum(
        X[b, s, h, k].astype("float32") * W[h, n, k].astype("float32"), axis=k), "C")
    func = sl.func([X, W, C], "per_head")
    assert rules.get_rule("matmul").applies(func, "h100") == (
        "operand X is read at [b, s, h, k]: its batch axes ['b', 'h'] must come before its two matrix dimensions")
    sch = rules.apply_default(func, "h100")
    check_schedule(func, sch, rng, archs=("sm_90",))
    A = sl.placeholder((12, 12, 16), "float32", "A")
    B = sl.placeholder((20, 16), "float32", "B")
    kk = sl.reduce_axis(16, "kk")
    D = sl.compute((12, 20), lambda i, j: sl.sum(A[i, i, kk] * B[j, kk], axis=kk), "D")
    diag = sl.func([A, B, D], "diag")
    assert rules.get_rule("matmul").applies(diag, "h100") == "operand A is read at a repeated axis (i, i, kk)"
    assert rules.find_rule(diag, "h100").name == "fallback"


def test_up_to_16_activation_rows_share_one_pass_over_the_weight(rng: np.random.Generator, toolchain: None) -> None:
    func = linear(B=12, S=1, K=64, N=40)
    facts = rules.get_rule("gemv").analyze(func, sl.hw.load("h100"))
    assert facts.small == ("b", "i") and facts.rows == ("j",)
    check_schedule(func, rules.apply_default(func, "h100"), rng, archs=("sm_90",))


@pytest.mark.parametrize("B, S, trans_w, lanes", [(32, 1, False, 16), (24, 1, True, 12), (40, 2, False, 8)])
def test_more_rows_than_lanes_pass_over_the_weight_in_groups(B: int, S: int, trans_w: bool, lanes: int,
                                                            rng: np.random.Generator, toolchain: None) -> None:
    """Past 16 activation rows, the batch axis is split: passes of as many rows as divide it and fit in a
    thread's lanes (blockIdx.y), each reading the weight once."""
    func = linear(B, S, 96, 64, trans_w=trans_w)
    facts = rules.get_rule("gemv").analyze(func, sl.hw.load("h100"))
    assert facts.lane_split == ("b", lanes) and facts.small == ("b", "i")
    kernel = check_schedule(func, rules.apply_default(func, "h100"), rng, archs=("sm_90",))
    (spec,) = kernel.launch
    assert [int(g.value) for g in spec.grid][1] == B // lanes
