"""The reference executor's walk of CUDA threads and blocks side by side (schedlib/ir/reference_walk.py).

Walking a bound loop's iterations as instances must give exactly the values the one-at-a-time walk gives,
and must be refused where the iterations could see one another."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import schedlib as sl
from schedlib import workloads as wl
from schedlib.ir import reference_walk
from schedlib.ir.func import Func
from schedlib.rules import apply_default

from .helpers import assert_same_result, random_inputs


def _run_counting(monkeypatch: pytest.MonkeyPatch, target: Any, inputs: dict[str, np.ndarray], instances: int
                  ) -> tuple[dict[str, np.ndarray], int]:
    """The reference's outputs with at most ``instances`` side by side, and how many grids it evaluated."""
    calls = []
    grid = reference_walk.Runner._grid

    def counted(self: Any, *args: Any) -> None:
        calls.append(1)
        grid(self, *args)

    with monkeypatch.context() as m:
        m.setattr(reference_walk, "MAX_INSTANCES", instances)
        m.setattr(reference_walk.Runner, "_grid", counted)
        return sl.run_reference(target, inputs), len(calls)


@pytest.mark.parametrize("func", [wl.matmul(64, 48, 40), wl.matmul(33, 17, 40, epilogue="bias_relu"),
                                  wl.gemv(96, 128), wl.softmax(6, 200), wl.rmsnorm(7, 256)],
                         ids=lambda f: f.name)
def test_rule_schedules_walk_side_by_side_with_the_same_bits(func: Func, monkeypatch: pytest.MonkeyPatch) -> None:
    s = apply_default(func, "h100")
    inputs = random_inputs(func, np.random.default_rng(3))
    together, few = _run_counting(monkeypatch, s, inputs, reference_walk.MAX_INSTANCES)
    alone, many = _run_counting(monkeypatch, s, inputs, 1)
    for name in func.outputs:
        np.testing.assert_array_equal(together[name], alone[name])
        assert not np.isnan(together[name]).any()
    assert many >= 4 * few, (few, many)  # threads (and blocks) one at a time evaluate many more grids
    assert_same_result(func, s)


def test_the_simt_matmul_default_walks_its_threads_together(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 x 8 blocks of 8 x 8 threads (a 2 x 2 register tile each) and 4 k steps: one at a time, a grid per
    # thread, k step and stage (8192 and more); side by side, a few per k step
    f = wl.matmul(128, 128, 128)
    inputs = random_inputs(f, np.random.default_rng(0))
    out, grids = _run_counting(monkeypatch, apply_default(f, "h100"), inputs, reference_walk.MAX_INSTANCES)
    assert grids <= 40, grids
    np.testing.assert_allclose(out["C"], inputs["A"].astype(np.float64) @ inputs["B"], rtol=1e-4, atol=1e-4)


def test_a_few_instances_at_a_time_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    # a batch cut short (by MAX_INSTANCES or the private memory it would take) walks a loop in pieces
    f = wl.matmul(40, 36, 20)
    s = apply_default(f, "h100")
    inputs = random_inputs(f, np.random.default_rng(1))
    whole, _ = _run_counting(monkeypatch, s, inputs, reference_walk.MAX_INSTANCES)
    for instances in (3, 7):
        pieces, _ = _run_counting(monkeypatch, s, inputs, instances)
        np.testing.assert_array_equal(pieces["C"], whole["C"])
    monkeypatch.setattr(reference_walk, "MAX_PRIVATE_ELEMENTS", 5000)
    np.testing.assert_array_equal(sl.run_reference(s, inputs)["C"], whole["C"])


def _independent(s: sl.Schedule, block: str, loop: str) -> bool:
    func = s.func
    private = {b.name for b in func.buffers if b.scope != "global"}
    runner = reference_walk.Runner(func, {b.name: np.zeros((1, 1)) for b in func.buffers}, private)
    level = [lp.name for lp in func.block(block).loops].index(loop)
    return runner._iterations_independent(func.block(block), level)


def test_threads_filling_one_shared_tile_are_walked_one_at_a_time() -> None:
    # each thread writes its row of C_shared; the copy after C.j reads every row (the walk's earlier threads'
    # rows): as instances with a copy each, the other rows would be the poison
    s = sl.Schedule(wl.matmul(4, 3, 2))
    s.cache_write("C", "shared")
    s.bind("C.i", "threadIdx.x")
    s.reverse_compute_at("C_shared", "C.j")
    assert not _independent(s, "C", "C.i")
    assert_same_result(s.original, s)


def test_a_register_tile_under_thread_loops_is_walked_side_by_side() -> None:
    s = apply_default(wl.matmul(64, 64, 64), "h100")
    thread_loops = [lp.name for lp in s.func.block("C").loops if lp.thread is not None]
    assert len(thread_loops) == 4 and all(_independent(s, "C", name) for name in thread_loops)


def test_a_global_stage_read_inside_the_loop_is_walked_one_at_a_time() -> None:
    # B = A * 2 placed in each iteration of C's loop: C reads the global B that B's block writes there
    x = sl.placeholder((8, 8), "float32", "X")
    b = sl.compute((8, 8), lambda i, j: x[i, j] * 2.0, "B")
    c = sl.compute((8, 8), lambda i, j: b[i, j] + 1.0, "C")
    s = sl.Schedule(sl.func([x, c], "twice"))
    i, _ = s.get_loops("C")
    s.bind(i, "blockIdx.x")
    s.compute_at("B", i)
    assert not _independent(s, "C", i)
    assert_same_result(s.original, s)


def test_a_global_reduction_along_its_own_spatial_loop_is_walked_side_by_side() -> None:
    # each block reduces its own rows of C: instances add into distinct elements
    s = sl.Schedule(wl.matmul(8, 8, 32))
    i, j, _ = s.get_loops("C")
    s.bind(i, "blockIdx.x")
    shared = s.cache_read("C", "A", "shared")
    s.compute_at(shared, j)
    assert _independent(s, "C", i)
    assert_same_result(s.original, s)
