"""Every top-10 config the carver ranks, for every built-in workload with a rule, on H100 and A100:
builds, compiles with nvcc within the profile's register and shared-memory limits (no spills, at least
one resident block with the real register count), and matches numpy on the CPU emulator.

Emulator-sized shapes keep this affordable; kernels of one (workload, target) are compiled and run in
parallel threads (nvcc and g++ are subprocesses), and both compilers cache by content hash.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import schedlib as sl
import schedlib.carver
from schedlib.carver import occupancy
from schedlib.hw import load
from schedlib.ir.dtype import is_float, numpy_dtype
from schedlib.ir.func import Func
from schedlib.ir.reference import evaluate_int
from schedlib.rules import find_rule, get_rule
from schedlib.runtime.emulator.build import find_gxx
from schedlib.runtime.nvcc import find_nvcc, nvrtc_available
from schedlib.workloads import BUILTINS

TARGETS = ("h100", "a100")
TOPK = 10

# Emulator-sized instances of every built-in workload (64 x 48 x 40 style: odd enough to exercise edges).
CASES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "matmul": [
        ("f32_batch_residual", dict(M=40, N=24, K=40, batch=2, epilogue="residual")),
        ("f16_bias_relu", dict(M=64, N=48, K=40, dtype="float16", epilogue="bias_relu")),
        ("bf16_trans_gelu", dict(M=64, N=48, K=40, dtype="bfloat16", trans_a=True, trans_b=True, epilogue="gelu")),
    ],
    "gemv": [("f16_bias", dict(N=48, K=64, dtype="float16", epilogue="bias"))],
    "reduce": [("sum_last", dict(rows=64, cols=40)), ("max_first", dict(rows=40, cols=48, op="max", axis=0))],
    "softmax": [("f32", dict(rows=64, cols=40))],
    "rmsnorm": [("f16", dict(rows=64, cols=40, dtype="float16"))],
    "layernorm": [("f32", dict(rows=64, cols=40))],
    "elementwise": [("add_gelu", dict(shape=(64, 48), chain=("add", "gelu")))],
    "transpose": [("f32", dict(M=64, N=48))],
}
# Problems found by this test outside the carver, tolerated only while they are the *only* problem.
PARAMS = [pytest.param(builder, name, kwargs, target, id=f"{builder}-{name}-{target}")
          for builder, cases in CASES.items() for name, kwargs in cases for target in TARGETS]

needs_compilers = pytest.mark.skipif(
    find_gxx() is None or (find_nvcc() is None and not nvrtc_available()),
    reason="needs g++ for the CPU emulator and nvcc (or NVRTC) for the compile check")


def test_every_builtin_workload_has_cases() -> None:
    assert set(CASES) == set(BUILTINS), "add emulator-sized cases for new built-in workloads"


def _inputs(func: Func, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name in func.inputs:
        buf = func.buffer(name)
        shape = tuple(evaluate_int(d, {}) for d in buf.shape)
        if is_float(buf.dtype):
            out[name] = rng.standard_normal(shape).astype(numpy_dtype(buf.dtype))
        else:
            out[name] = rng.integers(-4, 5, shape).astype(numpy_dtype(buf.dtype))
    return out


def _tolerance(dtype: str) -> tuple[float, float]:
    return (2e-2, 2e-2) if dtype in ("float16", "bfloat16") else (1e-4, 1e-4)


def _check(func: Func, target: str, rule_name: str, config: dict, inputs: dict, expected: dict) -> str | None:
    """None when the config's kernel is sound, else what is wrong with it."""
    profile = load(target)

    sch = get_rule(rule_name).apply(func, profile, config)
    kernel = sl.build(sch, profile)
    report = kernel.compile_check(profile.arch)
    problems = []
    if report.registers > profile.max_registers_per_thread:
        problems.append(f"{report.registers} registers > {profile.max_registers_per_thread}")
    if report.spill_bytes:
        problems.append(f"{report.spill_bytes} bytes of spills")
    for spec in kernel.launch:
        res = report.kernels.get(spec.name)
        if res is None:
            problems.append(f"nvcc reported nothing for kernel {spec.name}")
            continue
        smem = res.shared_static_bytes + spec.dynamic_smem
        if smem > profile.shared_memory_per_block:
            problems.append(f"{spec.name}: {smem} B shared > {profile.shared_memory_per_block}")
        if not occupancy(profile, math.prod(spec.block), max(res.registers, 1), smem).fits:
            problems.append(f"{spec.name}: {math.prod(spec.block)} threads x {res.registers} registers "
                            f"and {smem} B shared do not fit an SM")
    got = kernel.run_cpu(*(inputs[n] for n in func.inputs))
    got = got if isinstance(got, tuple) else (got,)
    for name, value in zip(func.outputs, got):
        dtype = func.buffer(name).dtype
        want = expected[name]
        if is_float(dtype):
            rtol, atol = _tolerance(dtype)
            ok = np.allclose(np.asarray(value, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol)
        else:
            ok = np.array_equal(value, want)
        if not ok:
            err = np.nanmax(np.abs(np.asarray(value, np.float64) - np.asarray(want, np.float64)))
            problems.append(f"output {name} differs from numpy (max abs error {err:.3g})")
    return "; ".join(problems) or None


@needs_compilers
@pytest.mark.parametrize(("builder", "case", "kwargs", "target"), PARAMS)
def test_top_configs_build_compile_and_match_numpy(builder: str, case: str, kwargs: dict, target: str,
                                                   rng: np.random.Generator) -> None:
    func = BUILTINS[builder](**kwargs)
    try:
        rule = find_rule(func, target)
    except LookupError as exc:
        pytest.skip(f"no rule in schedlib.rules.RULES takes {func.name} yet ({exc})")
    df = sl.carver.carve(func, target, topk=TOPK)
    assert len(df) >= 1, f"the {rule.name} space has no launchable point for {func.name}"
    inputs = _inputs(func, rng)
    expected = sl.run_reference(func, inputs)
    configs = list(df["config"])
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda c: _check(func, target, rule.name, c, inputs, expected), configs))
    failures = [f"rank {i} {c}: {why}" for i, (c, why) in enumerate(zip(configs, results)) if why]
    assert not failures, "\n".join(failures)
