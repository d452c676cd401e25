"""Cross-thread reductions with lanes: spatial loops innermost in the reduction, one partial per point.

The outer-layout GEMV is the reason: a thread owning two neighbouring columns used to walk its rows once per
column; now it walks them once, reading both columns with one 4-byte load.  Every combine path is covered
(warp shuffles, shuffles plus shared memory, the shared-memory fold), each against numpy on the emulator
with bounds and alignment checked.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from cg_support import kernel_bodies, random_inputs

import schedlib as sl
from schedlib.suites import parse_workload

LANES = re.compile(r"cross-thread reduction over (threadIdx\.[xyz]), (\d+) results per thread")


def lanes_of(k: sl.Kernel) -> list[tuple[str, int]]:
    body = "\n".join(kernel_bodies(k.source).values())
    return [(m.group(1), int(m.group(2))) for m in LANES.finditer(body)]


def passes_over_rows(k: sl.Kernel) -> int:
    """How many times the kernel walks the reduction: one per cross-thread reduction it emits."""
    return "\n".join(kernel_bodies(k.source).values()).count("cross-thread reduction over")


def assert_matches_reference(k: sl.Kernel, f: sl.Func, rng: np.random.Generator, tol: float) -> None:
    """The kernel on the emulator (bounds and alignment checked) against the reference on random inputs."""
    inputs = random_inputs(f, rng)
    want = sl.run_reference(f, dict(zip(f.inputs, inputs)))[f.outputs[0]]
    np.testing.assert_allclose(np.asarray(k.run_cpu(*inputs, bounds_check=True), np.float64),
                               np.asarray(want, np.float64), rtol=tol, atol=tol)


@pytest.mark.emulator
@pytest.mark.parametrize(("spec", "batch"), [("gemv:N=192,K=96,dtype=float16,trans=True", 1),
                                             ("gemv:N=200,K=100,dtype=float32,trans=True,batch=3", 3),
                                             ("gemv:N=256,K=64,dtype=bfloat16,trans=True,epilogue=bias_relu", 1),
                                             ("gemv:N=64,K=40,dtype=float16,trans=True,batch=8", 8)])
def test_outer_gemv_reads_its_columns_in_one_pass(spec: str, batch: int, rng: np.random.Generator) -> None:
    """vector columns x batch rows of partials per thread (16 at most), all from one pass over the weight."""
    f = parse_workload(spec).build()
    s = sl.rules.apply_default(f, "h100")
    vec = sl.rules.find_rule(f, "h100").default_config(f, "h100")["vector"]
    assert vec > 1
    k = sl.build(s, "sm_90")
    assert lanes_of(k) == [("threadIdx.y", vec * batch)] and passes_over_rows(k) == 1
    assert_matches_reference(k, f, rng, 1e-4 if "float32" in spec else 3e-2)


@pytest.mark.emulator
def test_outer_gemv_keeps_a_batch_outside_when_its_partials_would_not_fit(rng: np.random.Generator) -> None:
    """4 columns x 8 rows would be 32 partials: the batch stays outside, one pass per activation row."""
    f = parse_workload("gemv:N=256,K=32,dtype=float16,trans=True,batch=8").build()
    config = {"threads_n": 32, "vector": 4, "threads_k": 4, "unroll": 2}
    k = sl.build(sl.rules.find_rule(f, "h100").apply(f, "h100", config), "sm_90")
    assert lanes_of(k) == [("threadIdx.y", 4)] and passes_over_rows(k) == 1  # one reduction, run per row b
    assert_matches_reference(k, f, rng, 3e-2)


@pytest.mark.emulator
def test_outer_gemv_loads_both_columns_at_once() -> None:
    k = sl.build(sl.rules.apply_default(parse_workload("gemv:N=192,K=96,dtype=float16,trans=True").build(),
                                        "h100"), "sm_90")
    body = "\n".join(kernel_bodies(k.source).values())
    assert re.search(r"SL_VLOAD_REGS\(unsigned int, \w+, W, ", body)  # 2 x fp16 = one 4-byte load per row


@pytest.mark.emulator
@pytest.mark.parametrize(("threads", "tag"), [(16, "threadIdx.x"), (64, "threadIdx.x"), (8, "threadIdx.y")])
def test_every_combine_path_with_two_dimensional_lanes(threads: int, tag: str, rng: np.random.Generator) -> None:
    """R[i] = max_r X[i, r] with i split into 2 x 3 lanes per thread (6 partials), r across ``threads``:
    shuffles within a warp (16), shuffles and shared memory (64 = 2 warps), the shared fold (threadIdx.y)."""
    s = sl.Schedule(sl.workloads.reduce(12, 40, "max"))
    i, r = s.get_loops("R")
    ib, ia, ic = s.split(i, [None, 2, 3])
    ro, rt = s.split(r, [None, threads])
    s.reorder(ib, rt, ro, ia, ic)
    s.bind(ib, "blockIdx.x")
    s.bind(rt, tag)
    (X,) = random_inputs(s.func, rng)
    k = sl.build(s, "sm_90")
    assert lanes_of(k) == [(tag, 6)]
    np.testing.assert_array_equal(k.run_cpu(X, bounds_check=True), X.max(axis=1))
    np.testing.assert_array_equal(sl.run_reference(s, {"X": X})["R"], X.max(axis=1))


@pytest.mark.emulator
def test_lanes_beyond_the_register_budget_are_refused_with_the_reason() -> None:
    s = sl.Schedule(sl.workloads.reduce(64, 32, "sum"))
    i, r = s.get_loops("R")
    s.reorder(r, i)  # 64 partials per thread: more than a thread keeps
    s.bind(r, "threadIdx.x")
    with pytest.raises(sl.BuildError, match=r"spatial loop R\.i lies inside a cross-thread reduction.*at most 16"):
        sl.build(s, "sm_90")


@pytest.mark.emulator
@pytest.mark.parametrize(("spec", "lanes"), [("gemv:N=96,K=256,dtype=float16,batch=4", 4),
                                             ("matmul:M=5,N=33,K=64,batch=3,trans_b=True", 5)])
def test_a_small_batch_shares_each_weight_load(spec: str, lanes: int, rng: np.random.Generator) -> None:
    """Inner layout with m activation rows: one pass over the weight row, m partials per thread (the batched
    matmul's rows are fused (batch, n): each thread still owns one of them)."""
    f = parse_workload(spec).build()
    k = sl.build(sl.rules.apply_default(f, "h100"), "sm_90")
    assert lanes_of(k) == [("threadIdx.x", lanes)] and passes_over_rows(k) == 1
    assert_matches_reference(k, f, rng, 3e-2 if "float16" in spec else 1e-4)


@pytest.mark.emulator
def test_lanes_between_reduce_loops(rng: np.random.Generator) -> None:
    """A lane loop need not be innermost: 8 rows between the thread loop and the serial part of the row."""
    s = sl.Schedule(sl.workloads.reduce(8, 100, "sum"))
    i, r = s.get_loops("R")
    ro, rt = s.split(r, [None, 32])
    s.reorder(rt, i, ro)
    s.bind(rt, "threadIdx.x")
    (X,) = random_inputs(s.func, rng)
    k = sl.build(s, "sm_90")
    assert lanes_of(k) == [("threadIdx.x", 8)]
    np.testing.assert_allclose(k.run_cpu(X, bounds_check=True), X.astype(np.float64).sum(axis=1), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.emulator
def test_a_partial_last_warp_shuffles_with_only_the_lanes_it_has(rng: np.random.Generator) -> None:
    """A hand-written schedule of 16 x 3 threads: the second warp has 16 lanes, and shfl.sync waits for every
    lane its mask names, so that warp's mask names those 16 (the first warp's names all 32)."""
    f = sl.workloads.reduce(30, 16)
    s = sl.Schedule(f)
    i, k = s.get_loops("R")
    io, ii = s.split(i, [None, 3])
    s.bind(io, "blockIdx.x")
    s.bind(ii, "threadIdx.y")
    s.bind(k, "threadIdx.x")
    kernel = sl.build(s, "h100")
    body = "\n".join(kernel_bodies(kernel.source).values())
    assert "__shfl_xor_sync(((threadIdx.x + 16 * (threadIdx.y + 3 * threadIdx.z)) < 32 ? 0xffffffffu : 65535u)" \
        in body, body
    x = rng.standard_normal((30, 16)).astype(np.float32)
    np.testing.assert_allclose(kernel.run_cpu(x, bounds_check=True), x.sum(axis=1), rtol=1e-5, atol=1e-5)
