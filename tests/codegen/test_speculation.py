"""Speculative accumulation: a block that writes registers, reading only shared and register arrays inside
their bounds, runs at the padding points of its spatial axes without checking them.  What may not be
speculated keeps its checks: a reduction axis, a read of global memory, a read past a shared tile, a value
that can trap.  Each kernel runs on the emulator with bounds checks against the reference."""

from __future__ import annotations

import re

import numpy as np
import pytest

import schedlib as sl
from schedlib.codegen.speculation import may_trap
from schedlib.ir.expr import Cast, Const, Var, binary
from schedlib.rules import get_rule

MATMUL = get_rule("matmul")
SIMT = {"block_m": 32, "block_n": 32, "block_k": 16, "thread_m": 4, "thread_n": 4, "vector": 4, "split_k": 1,
        "stages": 1, "tensor_core": False, "raster": 1}


def statement_guards(source: str, store: str) -> list[str]:
    """The conditions each statement storing into ``store`` runs under, back to its ``// block`` line."""
    lines = source.split("\n")
    out = []
    for i, line in enumerate(lines):
        if re.match(rf"\s*{store}\[.*\] = ", line):
            conds = []
            for before in reversed(lines[:i]):
                if before.strip().startswith("// block"):
                    break
                if before.strip().startswith("if (") and before.rstrip().endswith("{"):
                    conds.append(before.strip()[4:-3])
            out.append(" && ".join(conds))
    return out


def run_checked(f: sl.Func, kernel: sl.Kernel, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ins = [rng.standard_normal([int(d.value) for d in f.buffer(n).shape]).astype(np.float32) for n in f.inputs]
    got = kernel.run_cpu(*ins, bounds_check=True)
    want = sl.run_reference(f, dict(zip(f.inputs, ins)))[f.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_full_tiles_drop_the_row_and_column_checks_of_the_accumulators() -> None:
    f = sl.workloads.matmul(40, 36, 64)  # tiles of 32 overhang M and N; K is whole steps
    kernel = sl.build(MATMUL.apply(f, "h100", SIMT), "h100")
    assert statement_guards(kernel.source, "C_local") == ["", ""]  # the init and the update
    write_back = statement_guards(kernel.source, "C")
    assert len(write_back) == 1 and "< 40" in write_back[0] and "< 36" in write_back[0]  # memory keeps them
    run_checked(f, kernel, 0)


def test_a_tile_cut_to_the_problem_keeps_the_checks_that_would_read_past_it() -> None:
    """N = 24 < 32: B's shared tile has 24 columns, so a padding column would read outside it."""
    f = sl.workloads.matmul(40, 24, 64)
    kernel = sl.build(MATMUL.apply(f, "h100", SIMT), "h100")
    update = statement_guards(kernel.source, "C_local")[1]
    assert "< 24" in update and "< 40" not in update  # the column check stays, the row check goes
    run_checked(f, kernel, 1)


def test_reads_of_global_memory_keep_their_checks() -> None:
    f = sl.workloads.matmul(10, 12, 7)
    s = sl.Schedule(f)
    i, _, _ = s.get_loops("C")
    bi, ti = s.split(i, [None, 4])
    s.bind(bi, "blockIdx.x")
    s.bind(ti, "threadIdx.x")
    s.reverse_compute_at(s.cache_write("C", "local"), ti)
    kernel = sl.build(s, "h100")
    assert all("< 10" in g for g in statement_guards(kernel.source, "C_local"))
    run_checked(f, kernel, 2)


def test_reduction_checks_stay() -> None:
    f = sl.workloads.matmul(64, 64, 40)  # K = 40: the last 16-deep step has 8 padding k
    kernel = sl.build(MATMUL.apply(f, "h100", SIMT), "h100")
    init, interior, edge = statement_guards(kernel.source, "C_local")  # the k loop is versioned
    assert init == interior == "" and "< 40" in edge and "C_k_1" in edge
    run_checked(f, kernel, 3)


@pytest.mark.parametrize(("expr", "traps"), [
    (binary("//", Var("a"), Var("b")), True),
    (binary("%", Var("a"), Const(0)), True),
    (binary("//", Var("a"), Const(4)), False),
    (Cast("int32", Var("x", "float32")), True),
    (Cast("float32", Var("a")), False),
    (binary("*", Var("x", "float32"), Var("y", "float32")), False),
])
def test_what_may_trap_on_a_stale_value(expr: sl.Expr, traps: bool) -> None:
    assert may_trap(expr) is traps
