"""Every rule on its workloads: dispatch, nvcc resource limits (sm_80 and sm_90), and emulator vs numpy.

Each case names the rule that must take the func through ``apply_default``.  Sizes cover 1, 7, 33, 127 and
1000, non-power-of-two reduction lengths and symbolic dimensions (``sl.var``) bound from the input shapes
at run time; one symbolic kernel is run at several sizes.  Matmul sizes stay at or below ~130 per spatial
dimension to keep the emulator fast.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.ir.func import Func

from .helpers import check_schedule

# symbol names must not be buffer names (see test_symbol_named_like_a_buffer)
M, N, K, R, C = (sl.var(n) for n in ("M", "N", "K", "Rows", "Cols"))


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], Func]
    rule: str
    sizes: tuple[Mapping[str, int], ...] = ({},)
    marks: tuple = ()
    spill_bytes: int = 0  # what ptxas may spill (each way) in the default's kernel


def mm(*args, **kw) -> Callable[[], Func]:
    return lambda: wl.matmul(*args, **kw)


def gv(*args, **kw) -> Callable[[], Func]:
    return lambda: wl.gemv(*args, **kw)


def red(*args, **kw) -> Callable[[], Func]:
    return lambda: wl.reduce(*args, **kw)


MATMUL = [
    # every fused epilogue, non-power-of-two K
    *(Case(f"epilogue-{e}", mm(33, 40, 17, epilogue=e), "matmul") for e in wl.EPILOGUES),
    # operand layouts
    Case("trans_b-bias", mm(37, 45, 29, trans_b=True, epilogue="bias"), "matmul"),
    Case("trans_ab-relu", mm(37, 45, 29, trans_a=True, trans_b=True, epilogue="relu"), "matmul"),
    # batch
    Case("batch2-trans_b-residual", mm(24, 19, 40, batch=2, trans_b=True, epilogue="residual"), "matmul"),
    # half types (bf16 arrays are float32 holding bf16-rounded values)
    Case("fp16-bias_relu-trans_b", mm(48, 64, 24, dtype="float16", trans_b=True, epilogue="bias_relu"), "matmul"),
    # ptxas 13.0 keeps this kernel at 40 registers on sm_90 and spills one 64-bit pointer around the register
    # prefetch (one STL.64 / LDL.LU.64 pair in the SASS); sm_80 spills nothing
    Case("bf16", mm(40, 56, 33, dtype="bfloat16"), "matmul", spill_bytes=8),
    Case("bf16-gelu-trans_a", mm(56, 40, 72, dtype="bfloat16", trans_a=True, epilogue="gelu"), "matmul"),
    # sizes: 1, 7, 127, 1000, the smallest m/n the matmul rule keeps (9)
    Case("127x9x1000", mm(127, 9, 1000), "matmul"),
    Case("9x127x7", mm(9, 127, 7, epilogue="bias"), "matmul"),
    Case("33x40x1", mm(33, 40, 1), "matmul"),
    # symbolic dims, bound at run time (the default plans for 4096: big register tiles)
    Case("sym-M-bias", mm(M, 40, 24, epilogue="bias"), "matmul", ({"M": 1}, {"M": 37}, {"M": 128})),
    Case("sym-N-trans_a", mm(33, N, 20, trans_a=True), "matmul", ({"N": 7}, {"N": 100})),
    Case("sym-K-fp16", mm(36, 40, K, dtype="float16"), "matmul", ({"K": 1}, {"K": 127})),
    Case("sym-MNK", mm(M, N, K), "matmul", ({"M": 130, "N": 70, "K": 33}, {"M": 1, "N": 1, "K": 1})),
    Case("sym-batch-residual", mm(17, 24, 9, batch=M, epilogue="residual"), "matmul", ({"M": 1}, {"M": 3})),
]

GEMV = [
    # both weight layouts over sizes 1, 7, 33, 127, 1000 (N x K); more sizes through the symbolic cases below.
    # N = 1 (and matmul 1x1x1, reduce 1x1 / 1000x1-first below): a kept extent of 1 under several rows of
    # threads, whose local write-back lost its row guard at d2cc58e (every thread row stored out[0])
    Case("inner-fp16-1x1000", gv(1, 1000, "float16"), "gemv"),
    Case("inner-fp16-7x127", gv(7, 127, "float16"), "gemv"),
    Case("inner-fp16-1000x1", gv(1000, 1, "float16"), "gemv"),
    Case("outer-fp16-1x1000", gv(1, 1000, "float16", trans=True), "gemv"),
    Case("outer-fp16-127x7", gv(127, 7, "float16", trans=True), "gemv"),
    # batch 1-8 with the epilogues
    Case("inner-b2-bias", gv(1000, 70, "float32", batch=2, epilogue="bias"), "gemv"),
    Case("outer-b3-relu", gv(300, 65, "float32", batch=3, trans=True, epilogue="relu"), "gemv"),
    Case("inner-b5-bias_relu", gv(64, 33, "float32", batch=5, epilogue="bias_relu"), "gemv"),
    Case("outer-b8-gelu", gv(64, 33, "float32", batch=8, trans=True, epilogue="gelu"), "gemv"),
    Case("inner-b8-small-n", gv(7, 100, "float32", batch=8), "gemv"),
    Case("bf16-inner-gelu", gv(200, 129, "bfloat16", epilogue="gelu"), "gemv"),
    Case("bf16-outer-b4-bias", gv(200, 129, "bfloat16", batch=4, trans=True, epilogue="bias"), "gemv"),
    # a matmul with a small m or n is a GEMV
    Case("matmul-m4", mm(4, 100, 64), "gemv"),
    Case("matmul-n3-trans_b", mm(100, 3, 64, trans_b=True, epilogue="relu"), "gemv"),
    Case("matmul-1x1x1", mm(1, 1, 1), "gemv"),
    Case("matmul-m7-trans_a-fp16", mm(7, 90, 50, dtype="float16", trans_a=True), "gemv"),
    # batched, with the small m between batch and n in the loop nest (every config used to fail to fuse)
    Case("matmul-b2-m8-bias", mm(8, 40, 24, batch=2, epilogue="bias"), "gemv"),
    Case("matmul-b3-m5-trans_b", mm(5, 33, 20, batch=3, trans_b=True), "gemv"),
    # symbolic N and K, one kernel run at several sizes
    Case("sym-NK-inner-bias", gv(N, K, "float16", epilogue="bias"), "gemv",
         ({"N": 1, "K": 1}, {"N": 33, "K": 1000}, {"N": 1000, "K": 33}, {"N": 127, "K": 7})),
    Case("sym-NK-outer-b2", gv(N, K, "float32", batch=2, trans=True), "gemv",
         ({"N": 1, "K": 1}, {"N": 7, "K": 1000}, {"N": 1000, "K": 127}, {"N": 33, "K": 33})),
    # (the former default, 64 x 4 threads with 4 columns each, spilled here on sm_80; the current one does not)
    Case("sym-N-outer-fp16", gv(N, 256, "float16", trans=True), "gemv", ({"N": 7}, {"N": 1000})),
]

REDUCTION = [
    *(Case(f"{op}-last", red(33, 127, op), "reduction") for op in wl.REDUCE_OPS),
    *(Case(f"{op}-first", red(127, 33, op, axis=0), "reduction") for op in wl.REDUCE_OPS),
    Case("max-1x1000", red(1, 1000, "max"), "reduction"),
    Case("mean-first-7x1000", red(7, 1000, "mean", axis=0), "reduction"),
    Case("sum-1x1", red(1, 1, "sum"), "reduction"),
    Case("sumsq-first-1000x1", red(1000, 1, "sumsq", axis=0), "reduction"),
    Case("fp16-sum-7x1000", red(7, 1000, "sum", dtype="float16"), "reduction"),
    Case("fp16-max-first", red(127, 33, "max", axis=0, dtype="float16"), "reduction"),
    Case("bf16-min-300", red(9, 300, "min", dtype="bfloat16"), "reduction"),
    Case("bf16-sumsq-first", red(65, 20, "sumsq", axis=0, dtype="bfloat16"), "reduction"),
    Case("sym-rows-sum", red(R, 100, "sum"), "reduction", ({"Rows": 1}, {"Rows": 7}, {"Rows": 1000})),
    Case("sym-cols-mean", red(5, C, "mean"), "reduction", ({"Cols": 1}, {"Cols": 33}, {"Cols": 1000})),
    Case("sym-both-first-max", red(R, C, "max", axis=0), "reduction",
         ({"Rows": 1, "Cols": 1}, {"Rows": 127, "Cols": 33})),
]

GENERAL = [
    Case("softmax-7x1000", lambda: wl.softmax(7, 1000), "general_reduction"),
    Case("softmax-fp16-1x7", lambda: wl.softmax(1, 7, "float16"), "general_reduction"),
    Case("softmax-bf16-5x33", lambda: wl.softmax(5, 33, "bfloat16"), "general_reduction"),
    Case("rmsnorm-7x1000", lambda: wl.rmsnorm(7, 1000), "general_reduction"),
    Case("rmsnorm-33x1", lambda: wl.rmsnorm(33, 1), "general_reduction"),
    Case("rmsnorm-fp16-4x127", lambda: wl.rmsnorm(4, 127, "float16"), "general_reduction"),
    Case("rmsnorm-bf16-3x300", lambda: wl.rmsnorm(3, 300, "bfloat16"), "general_reduction"),
    Case("layernorm-7x1000", lambda: wl.layernorm(7, 1000), "general_reduction"),
    Case("layernorm-5x33", lambda: wl.layernorm(5, 33), "general_reduction"),
    Case("layernorm-fp16-3x127", lambda: wl.layernorm(3, 127, "float16"), "general_reduction"),
    Case("layernorm-bf16-1x7", lambda: wl.layernorm(1, 7, "bfloat16"), "general_reduction"),
    Case("softmax-sym", lambda: wl.softmax(R, C), "general_reduction",
         ({"Rows": 1, "Cols": 1}, {"Rows": 3, "Cols": 1000}, {"Rows": 33, "Cols": 127})),
    Case("layernorm-sym-cols", lambda: wl.layernorm(4, C), "general_reduction", ({"Cols": 7}, {"Cols": 1000})),
    Case("rmsnorm-sym-rows", lambda: wl.rmsnorm(R, 64), "general_reduction", ({"Rows": 1}, {"Rows": 127})),
]

TRANSPOSE = [
    Case("1x7", lambda: wl.transpose(1, 7), "transpose"),
    Case("7x1", lambda: wl.transpose(7, 1), "transpose"),
    Case("33x127", lambda: wl.transpose(33, 127), "transpose"),
    Case("fp16-127x33", lambda: wl.transpose(127, 33, "float16"), "transpose"),
    Case("bf16-1000x7", lambda: wl.transpose(1000, 7, "bfloat16"), "transpose"),
    Case("sym", lambda: wl.transpose(M, N), "transpose", ({"M": 1, "N": 1}, {"M": 70, "N": 45}, {"M": 7, "N": 1000})),
]

ELEMENTWISE = [
    Case("add-relu-1000", lambda: wl.elementwise((1000,), ("add", "relu")), "elementwise"),
    Case("exp-1", lambda: wl.elementwise((1,), ("exp",)), "elementwise"),
    Case("mul-sigmoid-7", lambda: wl.elementwise((7,), ("mul", "sigmoid")), "elementwise"),
    Case("scale-tanh-gelu-33x127", lambda: wl.elementwise((33, 127), ("scale", "tanh", "gelu")), "elementwise"),
    Case("add-mul-exp-3d", lambda: wl.elementwise((3, 7, 33), ("add", "mul", "exp")), "elementwise"),
    Case("fp16-add-gelu", lambda: wl.elementwise((127, 9), ("add", "gelu"), "float16"), "elementwise"),
    Case("bf16-mul-relu-tanh", lambda: wl.elementwise((1000,), ("mul", "relu", "tanh"), "bfloat16"), "elementwise"),
    Case("sym", lambda: wl.elementwise((M, 33), ("add", "sigmoid")), "elementwise", ({"M": 1}, {"M": 127})),
]

ALL = [*(("matmul", c) for c in MATMUL), *(("gemv", c) for c in GEMV), *(("reduction", c) for c in REDUCTION),
       *(("general", c) for c in GENERAL), *(("transpose", c) for c in TRANSPOSE),
       *(("elementwise", c) for c in ELEMENTWISE)]


def _sizes(func: Func, case: Case) -> Sequence[Mapping[str, int]]:
    assert set(func.symbols) == set().union(*case.sizes), f"{case.id}: bind every symbol {func.symbols}"
    return case.sizes


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{g}-{c.id}", marks=c.marks) for g, c in ALL])
def test_default_rule_end_to_end(case: Case, rng: np.random.Generator, toolchain: None) -> None:
    func = case.make()
    sch = rules.apply_default(func, "h100")
    assert isinstance(sch, sl.Schedule)
    assert sch.rule == case.rule, f"{case.id}: taken by {sch.rule}\n{rules.explain(func, 'h100')}"
    assert rules.find_rule(func, "h100").name == case.rule
    rule = rules.get_rule(case.rule)
    profile = sl.hw.load("h100")
    assert sch.config == rule.default_config(func, profile)
    assert rule.space(func, profile).reason(sch.config) is None, "the default config is not a legal point"
    check_schedule(func, sch, rng, sizes=_sizes(func, case), spills_allowed=case.spill_bytes)


FALLBACK = [
    Case("softmax", lambda: wl.softmax(5, 70), "fallback"),
    Case("matmul-bias", mm(20, 17, 9, epilogue="bias"), "fallback"),
    Case("batch-matmul-trans_a", mm(9, 12, 5, batch=2, trans_a=True, dtype="float16"), "fallback"),
    Case("reduce-mean-first", red(9, 20, "mean", axis=0), "fallback"),
    Case("layernorm-bf16", lambda: wl.layernorm(3, 33, "bfloat16"), "fallback"),
    Case("elementwise-sym", lambda: wl.elementwise((M, 7), ("add", "exp")), "fallback", ({"M": 1}, {"M": 100})),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in FALLBACK])
def test_fallback_applied_explicitly(case: Case, rng: np.random.Generator, toolchain: None) -> None:
    func = case.make()
    fallback = rules.get_rule("fallback")
    sch = fallback.apply(func, "h100", {"threads": 64})
    assert sch.rule == "fallback" and sch.config == {"threads": 64}
    kernel = check_schedule(func, sch, rng, sizes=_sizes(func, case))
    assert all(spec.block == (64, 1, 1) for spec in kernel.launch), [spec.block for spec in kernel.launch]


def test_symbol_named_like_a_buffer(rng: np.random.Generator, toolchain: None) -> None:
    """The rows symbol is called R, like the output buffer: it still builds and matches the reference."""
    func = wl.reduce(sl.var("R"), 100, "sum")
    assert func.symbols == ("R",) and "R" in func.outputs
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "reduction", f"taken by {sch.rule}\n{rules.explain(func, 'h100')}"
    assert sch.config == rules.get_rule("reduction").default_config(func, sl.hw.load("h100"))
    check_schedule(func, sch, rng, sizes=({"R": 7},))


@pytest.mark.parametrize(("make", "message"), [
    (lambda: wl.matmul(0, 64, 64), "matmul: M=0 must be >= 1"),
    (lambda: wl.matmul(64, 64, 2.5), "matmul: K=2.5 must be an int or sl.var, got float"),
    (lambda: wl.matmul(64, 64, 64, batch=-2), "matmul: batch=-2 must be >= 1"),
    (lambda: wl.matmul(2**31, 64, 64), "matmul: M=2147483648 does not fit the 32-bit index type (must be < 2^31)"),
    (lambda: wl.gemv(4096, True), "gemv: K=True must be an int or sl.var, got bool"),
    (lambda: wl.softmax(8, 0), "softmax: cols=0 must be >= 1"),
    (lambda: wl.elementwise((4, 0)), "elementwise: shape[1]=0 must be >= 1"),
    (lambda: wl.elementwise("4x4"), "elementwise: shape='4x4' must be a non-empty sequence of sizes"),
    (lambda: wl.transpose(64, "64"), "transpose: N='64' must be an int or sl.var, got str"),
])
def test_bad_sizes_name_the_workload_parameter(make: Callable[[], Func], message: str) -> None:
    """Not 'placeholder A: dimension 0': the caller wrote M, so the error says M."""
    with pytest.raises(sl.IRError, match=f"^{re.escape(message)}$"):
        make()


def test_numpy_sizes_are_plain_ints() -> None:
    f = wl.matmul(np.int64(64), np.int32(32), 16)
    assert [int(d.value) for d in f.buffer("A").shape] == [64, 16]
    assert [int(d.value) for d in f.buffer("B").shape] == [16, 32]
    g = wl.elementwise(np.array([4, 6]), ("relu",))  # a numpy shape vector, as an array's .shape is used
    assert [int(d.value) for d in g.buffer("X").shape] == [4, 6]
