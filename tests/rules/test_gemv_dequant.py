"""The GEMV rule on weight-only quantised matrix-vector products (decode-time linear layers).

``y[m, n] = sum_k x[m, k] * (float(Wq[n, k]) * scale[n])`` with the dequantised weight written as stages of
its own: the rule inlines them, so the int8 weight is read once, widened and scaled in registers, and never
stored as floats.  Both weight layouts (inner: ``Wq[n, k]``, outer: ``Wq[k, n]``), a batch of one and of
several rows, and a fused epilogue, each built, emulated against the reference and compile-checked.
"""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib.ir.func import Func

from .helpers import check_schedule


def dequant_gemv(m: int = 1, n: int = 96, kk: int = 128, trans: bool = False, epilogue: bool = False,
                 act: str = "float16") -> Func:
    """``Wq`` is int8, stored n x k (``trans``: k x n); one float32 scale per output column."""
    x = sl.placeholder((m, kk), act, "x")
    Wq = sl.placeholder((kk, n) if trans else (n, kk), "int8", "Wq")
    scale = sl.placeholder((n,), "float32", "scale")

    def wq(j, c):
        return Wq[c, j] if trans else Wq[j, c]

    W = sl.compute((n, kk), lambda j, c: wq(j, c).astype("float32") * scale[j], "W")
    k = sl.reduce_axis(kk, "k")
    C = sl.compute((m, n), lambda i, j: sl.sum(x[i, k].astype("float32") * W[j, k], axis=k), "C")
    out = [x, Wq, scale, C]
    if epilogue:
        b = sl.placeholder((n,), "float32", "bias")
        D = sl.compute((m, n), lambda i, j: sl.maximum(C[i, j] + b[j], 0.0), "D")
        out = [x, Wq, scale, b, D]
    return sl.func(out, "dequant_gemv")


CASES = {
    "inner-m1": dict(m=1, n=96, kk=256),
    "inner-m4-relu": dict(m=4, n=40, kk=128, epilogue=True),
    "outer-m1": dict(m=1, n=128, kk=72, trans=True),
    "outer-m3": dict(m=3, n=64, kk=50, trans=True, act="float32"),
}


@pytest.mark.parametrize("key", list(CASES))
def test_gemv_rule_takes_dequantised_weights(key: str, rng: np.random.Generator, toolchain: None) -> None:
    kw = CASES[key]
    func = dequant_gemv(**kw)
    assert rules.find_rule(func, "h100").name == "gemv", rules.explain(func, "h100")
    facts = rules.get_rule("gemv").analyze(func, sl.hw.load("h100"))
    assert facts.prologue == ("W",) and facts.inner is not kw.get("trans", False)
    sch = rules.apply_default(func, "h100")
    assert "W" not in sch.blocks
    kernel = check_schedule(func, sch, rng)
    assert "Wq" in kernel.source and "float W[" not in kernel.source


def test_a_large_dequantised_matmul_takes_the_matmul_rule_which_dequantises_in_its_copy(
        rng: np.random.Generator) -> None:
    """A large dequantised matmul is not a GEMV (no small axis): the matmul rule takes it, its SIMT template
    computing the weight stage as it copies the int8 weight into shared memory (it declined before: its
    operands had to be func inputs).  Tensor cores copy global memory as it is, so the space has none."""
    func = dequant_gemv(m=64, n=64, kk=64)
    assert "no small axis" in rules.get_rule("gemv").applies(func, "h100")
    matmul = rules.get_rule("matmul")
    assert matmul.applies(func, "h100") is None and matmul.analyze(func, sl.hw.load("h100")).prologue == ("W",)
    assert matmul.space(func, "h100").knob("tensor_core").values == (False,)
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "matmul" and "W" not in sch.blocks
    kernel = check_schedule(func, sch, rng)
    assert "Wq" in kernel.source and "float W[" not in kernel.source


def test_gemv_declines_a_factor_that_is_no_broadcast() -> None:
    """``x[m, k] * w[n, k] * t[m, n]``: the third factor indexes both sides, so it is not a scale of either."""
    x = sl.placeholder((2, 64), "float32", "x")
    w = sl.placeholder((48, 64), "float32", "w")
    t = sl.placeholder((2, 48), "float32", "t")
    k = sl.reduce_axis(64, "k")
    C = sl.compute((2, 48), lambda i, j: sl.sum(x[i, k] * w[j, k] * t[i, j], axis=k), "C")
    func = sl.func([x, w, t, C], "three")
    assert rules.get_rule("gemv").applies(func, "h100") == "factor t[i, j] is not a broadcast of an operand"


@pytest.mark.parametrize("trans", [False, True], ids=["inner", "outer"])
def test_the_built_in_quantised_gemv(trans: bool, rng: np.random.Generator, toolchain: None) -> None:
    """``workloads.gemv(weight_dtype="int8")`` (also ``gemv:...,weight_dtype=int8`` in a spec string)."""
    from schedlib.suites import parse_workload

    func = parse_workload(f"gemv:N=80,K=192,batch=2,weight_dtype=int8,trans={trans},epilogue=bias").build()
    assert func.name == ("gemv_t_wq" if trans else "gemv_wq")
    assert list(func.inputs) == ["X", "W", "scale", "bias"] and func.buffer("W").dtype == "int8"
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "gemv" and "Wd" not in sch.blocks
    check_schedule(func, sch, rng)


@pytest.mark.parametrize("kw, why", [
    (dict(weight_dtype="float16"), "weight_dtype='float16' with dtype='float16': a quantised weight is int8"),
    (dict(weight_dtype="int32"), "a quantised weight is int8 under float activations"),
    (dict(dtype="int8", weight_dtype="int8"), "weight_dtype='int8' with dtype='int8'"),
    (dict(weight_dtype="int3"), "weight_dtype"),
])
def test_the_quantised_gemv_refuses_bad_dtypes(kw: dict, why: str) -> None:
    with pytest.raises(sl.IRError, match=why.replace("(", r"\(")):
        sl.workloads.gemv(64, 64, **kw)


def test_an_fp16_scaled_weight_rounds_where_its_stage_did(rng: np.random.Generator) -> None:
    """``float16(Wq) * s`` stored as fp16, four rows: the matmul rule leaves the small side to GEMV, whose
    inlined stage rounded the product only in float32 (1-3 of 256 outputs off on every seed)."""
    m, n, kk = 4, 64, 256
    x, Wq = sl.placeholder((m, kk), "float16", "x"), sl.placeholder((n, kk), "int8", "Wq")
    s = sl.placeholder((n,), "float16", "s")
    Wf = sl.compute((n, kk), lambda j, c: Wq[j, c].astype("float16"), "Wf")
    Ws = sl.compute((n, kk), lambda j, c: Wf[j, c] * s[j], "Ws")
    k = sl.reduce_axis(kk, "k")
    C = sl.compute((m, n), lambda i, j: sl.sum(x[i, k].astype("float32") * Ws[j, k].astype("float32"), axis=k), "C")
    f = sl.func([x, Wq, s, C], "scaled_weight_gemv")
    sch = sl.rules.apply_default(f, "h100")
    assert sch.rule == "gemv"
    for _ in range(3):
        check_schedule(f, sch, rng, archs=())
