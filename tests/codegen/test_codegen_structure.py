"""The shape of generated CUDA: barriers, warp shuffles, launch geometry, parameters, multi-kernel modules;
plus regression tests of bugs found (and since fixed) while writing these tests: plain tests asserting the
fixed behaviour, no xfail markers.  Vector copies and dynamic shared memory: ``test_codegen_memory.py``."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from cg_cases import CASE_BY_NAME, CASES, Case
from cg_schedules import reduce_through_shared, schedule_matmul, schedule_reduce_rows
from cg_support import code_lines, enclosed, events, forced, kernel_bodies, random_inputs, signature

import schedlib as sl
from schedlib import rules
from schedlib.codegen import generate
from schedlib.ir.expr import as_int
from schedlib.ir.reference import evaluate_int

STATIC_LIMIT = 48 * 1024


def only_body(k: sl.Kernel) -> str:
    (body,) = kernel_bodies(k.source).values()
    return body


def case_kernel(name: str) -> tuple[Case, sl.Kernel]:
    case = CASE_BY_NAME[name]
    return case, sl.build(case.schedule(case.symbolic_func()), "sm_90")


# --------------------------------------------------------------------------------------------------
# barriers around shared-memory stages
# --------------------------------------------------------------------------------------------------
def test_matmul_shared_tiles_are_fenced_by_barriers() -> None:
    """Each iteration of the k loop: barrier, fill A tile, barrier, fill B tile, barrier, use both.  The
    leading barrier keeps the fill from overwriting a tile other threads still read from the last iteration."""
    k = sl.build(schedule_matmul(sl.workloads.matmul(64, 64, 24)), "sm_90")
    body = only_body(k)
    assert events(enclosed(body, "for (int C_k_0 = 0;")) == ["sync", "A_shared", "sync", "B_shared", "sync", "C"]
    # Nothing outside the k loop touches shared memory, so no other barrier is emitted.
    assert body.count("__syncthreads();") == 3


def test_transpose_tile_is_complete_before_it_is_read() -> None:
    _, k = case_kernel("transpose")
    assert events(only_body(k)) == ["sync", "X_shared", "sync", "Y"]


def test_storage_align_pads_the_shared_tile() -> None:
    """storage_align(X_shared, 0, 32, 1): the 32 x 32 transpose tile gets a row stride of 33 floats."""
    _, k = case_kernel("transpose")
    body = only_body(k)
    assert "SL_SHARED(float, X_shared, 1056);" in body  # 32 rows x 33
    assert re.search(r"X_shared\[.*\* 33\)", body), "tile rows must be indexed with the padded stride"


def test_register_only_kernel_has_no_barrier() -> None:
    _, k = case_kernel("elementwise_add_gelu_scale")
    body = only_body(k)
    assert "__syncthreads" not in body and "SL_SHARED" not in body
    assert events(body) == ["E2"]


# --------------------------------------------------------------------------------------------------
# cross-thread reductions
# --------------------------------------------------------------------------------------------------
def test_single_warp_reduction_uses_shuffles_only() -> None:
    """32 threads of threadIdx.x reduce each GEMV row: a butterfly of __shfl_xor_sync, no shared memory."""
    _, k = case_kernel("gemv_fp16")
    body = only_body(k)
    assert "__shfl_xor_sync(0xffffffffu, sl_red, sl_off, 32)" in body
    assert "for (int sl_off = 16; sl_off > 0; sl_off >>= 1)" in body
    assert "sl_red_buf" not in body
    # The register result is stored once per row, by lane 0.
    lines = code_lines(body)
    at = next(n for n, ln in enumerate(lines) if re.match(r"D\[", ln))
    assert lines[at - 1].startswith("if (") and "threadIdx.x == 0" in lines[at - 1], lines[at - 1]


def test_multi_warp_reduction_combines_warps_through_shared_memory() -> None:
    """64 threads per row (two warps), two rows per block: shuffles inside each warp, then one partial per
    warp in shared memory between barriers."""
    _, k = case_kernel("reduce_rows_sum")
    body = only_body(k)
    assert "__shfl_xor_sync(0xffffffffu, sl_red, sl_off, 32)" in body
    assert "SL_SHARED(float, sl_red_buf1, 4);" in body  # 2 rows x 2 warps
    region = body[body.index("cross-thread reduction"):]
    assert events(region)[:2] == ["sync", "sync"]
    assert re.search(r"if \(.*threadIdx\.x == 0\) R\[", body), "the row total must be stored by one thread"


def test_reduction_over_threadidx_y_uses_shared_memory() -> None:
    """3 threads of threadIdx.y (not a power of two) split a column sum: no shuffle, one slot per thread."""
    _, k = case_kernel("reduce_cols_mean")
    body = only_body(k)
    assert "__shfl" not in body
    assert "SL_SHARED(float, sl_red_buf1, 96);" in body  # 32 x 3 threads
    assert k.launch[0].block == (32, 3, 1)


@pytest.mark.emulator
@pytest.mark.parametrize(("rows", "threads", "width", "mask"), [
    (4, 8, 8, "0xffffffffu"),  # 8 lanes per row, 4 rows in one warp
    (2, 4, 4, "255u"),  # 8 threads in the block: the mask names only those
    (3, 48, None, None),  # not a power of two: shared memory, no shuffle
    (1, 256, 32, "0xffffffffu"),  # 8 warps
], ids=["x8-y4", "x4-y2", "x48-y3", "x256"])
def test_reduction_width_and_mask_follow_the_launch(rows: int, threads: int, width: int | None, mask: str | None,
                                                    rng: np.random.Generator) -> None:
    f = sl.workloads.reduce(sl.var("M"), 75, "max")
    k = sl.build(schedule_reduce_rows(f, rows=rows, threads=threads), "sm_90")
    body = only_body(k)
    assert k.launch[0].block == (threads, rows, 1)
    if width is None:
        assert "__shfl" not in body
    else:
        assert f"__shfl_xor_sync({mask}, sl_red, sl_off, {width})" in body
    (X,) = random_inputs(f, rng, {"M": 9})
    np.testing.assert_array_equal(k.run_cpu(X, bounds_check=True), X.max(axis=1))


# --------------------------------------------------------------------------------------------------
# launch geometry and parameters
# --------------------------------------------------------------------------------------------------
def _bound_extents(func: sl.Func, root: str, prefix: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for blk in func.subtree(root, 0):
        for lp in blk.loops:
            if lp.thread and lp.thread.startswith(prefix):
                out.setdefault(lp.thread, []).append(lp.extent)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_launch_geometry_matches_the_bindings(case: Case) -> None:
    """blockDim is the largest extent bound to each threadIdx.*, the grid the extent bound to each
    blockIdx.* (evaluated at the run-time size), and __launch_bounds__ their product."""
    func = case.schedule(case.symbolic_func()).func
    k = sl.build(func, "sm_90")
    roots = func.root_blocks()
    assert [spec.name for spec in k.launch] == [f"{func.name}_{r.name}" for r in roots]
    for spec, root in zip(k.launch, roots):
        threads = _bound_extents(func, root.name, "threadIdx")
        want = tuple(max((as_int(e) for e in threads.get(f"threadIdx.{d}", [])), default=1) for d in "xyz")
        assert spec.block == want
        blocks = _bound_extents(func, root.name, "blockIdx")
        for value in case.values:
            env = {case.symbolic: value}
            grid = tuple(evaluate_int(blocks[f"blockIdx.{d}"][0], env)
                         if f"blockIdx.{d}" in blocks else 1 for d in "xyz")
            assert spec.grid_for(env) == grid
        assert f"__launch_bounds__({math.prod(spec.block)})" in kernel_bodies(k.source)[spec.name]


def test_matmul_launch_numbers() -> None:
    """BM=32, BN=32 block tiles with 4x2 register tiles: 16 x 8 threads, ceil(N/32) x ceil(M/32) blocks."""
    M = sl.var("M")
    k = sl.build(schedule_matmul(sl.workloads.matmul(M, 100, 24)), "sm_90")
    (spec,) = k.launch
    assert spec.block == (16, 8, 1)
    assert spec.grid_for({"M": 1}) == (4, 1, 1)
    assert spec.grid_for({"M": 65}) == (4, 3, 1)
    assert spec.dynamic_smem == 0


@pytest.mark.emulator
def test_every_symbolic_dim_becomes_an_int_parameter(rng: np.random.Generator) -> None:
    M, N, K = sl.var("M"), sl.var("N"), sl.var("K")
    f = sl.workloads.matmul(M, N, K, epilogue="bias")
    k = sl.build(schedule_matmul(f), "sm_90")
    (spec,) = k.launch
    assert spec.params == ("A", "B", "bias", "D", *(f"${s}" for s in f.symbols))
    head = signature(only_body(k))
    for name in f.symbols:
        assert f"int {name}" in head
    assert head.count("SL_GLOBAL(") == 4  # A, B, bias, D: pointers; the sizes are plain ints
    assert "SL_GLOBAL(float) D" in head  # the output is written, so it is not const
    for m, n, kk in ((7, 33, 1), (33, 1, 45)):
        A, B, bias = random_inputs(f, rng, {"M": m, "N": n, "K": kk})
        np.testing.assert_allclose(k.run_cpu(A, B, bias, bounds_check=True),
                                   A.astype(np.float64) @ B + bias, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------------
# several kernels
# --------------------------------------------------------------------------------------------------
SOFTMAX_KERNELS = ["softmax_T_max", "softmax_T_exp", "softmax_T_sum", "softmax_Y"]


def _softmax_module_checks(k: sl.Kernel) -> None:
    assert [spec.name for spec in k.launch] == SOFTMAX_KERNELS
    assert [b.name for b in k.module.scratch] == ["T_max", "T_exp", "T_sum"]
    assert all(b.scope == "global" for b in k.module.scratch)
    params = {spec.name: spec.params for spec in k.launch}
    # Each kernel gets the scratch it writes or reads; the writer is launched before every reader.
    assert set(params["softmax_T_max"]) == {"X", "T_max", "$M"}
    assert set(params["softmax_T_exp"]) == {"X", "T_max", "T_exp", "$M"}
    assert set(params["softmax_T_sum"]) == {"T_exp", "T_sum", "$M"}
    assert set(params["softmax_Y"]) == {"T_exp", "T_sum", "Y", "$M"}
    bodies = kernel_bodies(k.source)
    assert list(bodies) == SOFTMAX_KERNELS  # defined in launch order too
    assert "SL_GLOBAL(float) T_exp" in signature(bodies["softmax_Y"])


@pytest.mark.emulator
@pytest.mark.parametrize("how", ["unscheduled", "fallback"])
def test_unfused_softmax_runs_as_kernels_in_order(how: str, rng: np.random.Generator) -> None:
    f = sl.workloads.softmax(sl.var("M"), 45)
    s = sl.Schedule(f) if how == "unscheduled" else rules.get_rule("fallback").apply(f, "h100")
    k = sl.build(s, "sm_90")
    _softmax_module_checks(k)
    if how == "unscheduled":  # nothing bound: each stage is one thread of one block
        assert all(spec.block == (1, 1, 1) and spec.grid_for({"M": 9}) == (1, 1, 1) for spec in k.launch)
    else:
        assert all(spec.block == (256, 1, 1) for spec in k.launch)
        assert k.launch[1].grid_for({"M": 70}) == (math.ceil(70 * 45 / 256), 1, 1)
    for m in (1, 9):
        (X,) = random_inputs(f, rng, {"M": m})
        x = X.astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        np.testing.assert_allclose(k.run_cpu(X, bounds_check=True), e / e.sum(axis=1, keepdims=True),
                                   rtol=1e-5, atol=1e-6)


def test_fused_softmax_needs_no_scratch() -> None:
    _, k = case_kernel("softmax")
    assert [spec.name for spec in k.launch] == ["softmax_Y"]
    assert k.module.scratch == ()
    assert k.launch[0].params == ("X", "Y", "$rows")


@pytest.mark.emulator
def test_global_scratch_inside_one_kernel_is_fenced_by_barriers(rng: np.random.Generator) -> None:
    """Softmax fused into one kernel without caching its stages: T_max/T_exp/T_sum stay global scratch that
    threads share, so each stage is surrounded by barriers like a shared-memory stage."""
    f = sl.workloads.softmax(sl.var("M"), 100)
    s = sl.Schedule(f)
    i, j = s.get_loops("Y")
    jo, jt = s.split(j, [None, 64])
    s.reorder(i, jt, jo)
    s.bind(i, "blockIdx.x")
    s.bind(jt, "threadIdx.x")
    for stage in ("T_sum", "T_exp", "T_max"):
        s.compute_at(stage, i)
        ko, kt = s.split(s.get_loops(stage)[-1], [None, 64])
        s.reorder(kt, ko)
        s.bind(kt, "threadIdx.x")
    k = sl.build(s, "sm_90")
    assert [spec.name for spec in k.launch] == ["softmax_Y"]
    assert [b.name for b in k.module.scratch] == ["T_max", "T_exp", "T_sum"]
    assert set(k.launch[0].params) == {"X", "Y", "T_max", "T_exp", "T_sum", "$M"}
    order = [e for e in events(only_body(k)) if e == "sync" or e.startswith(("T_", "Y"))]
    stages = [e for e in order if e != "sync"]
    assert stages == ["T_max", "T_exp", "T_sum", "Y"]
    for name in ("T_max", "T_exp", "T_sum"):
        at = order.index(name)
        assert order[at - 1] == "sync" and order[at + 1] == "sync", order
    (X,) = random_inputs(f, rng, {"M": 7})
    x = X.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(k.run_cpu(X, bounds_check=True), e / e.sum(axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


def test_generate_is_deterministic_and_names_kernels_after_root_blocks() -> None:
    f = sl.workloads.softmax(sl.var("M"), 45)
    a, b = generate(f), generate(f)
    assert a.source == b.source
    assert [s.name for s in a.kernels] == SOFTMAX_KERNELS
    assert a.source.startswith("// Generated by schedlib for func softmax.")


# --------------------------------------------------------------------------------------------------
# bugs found while writing these tests, since fixed: each test asserts the correct behaviour (no xfail
# marker), so it fails if its bug comes back
# --------------------------------------------------------------------------------------------------
def _overhanging_writeback() -> sl.Schedule:
    """C = A @ B with M = 1: 2 threadIdx.y x 8 threadIdx.x threads, each owning a 4 x 2 register tile
    written back with reverse_compute_at.  Only thread row 0 has rows to compute."""
    s = sl.Schedule(sl.workloads.matmul(1, 16, 8))
    i, j, _ = s.get_loops("C")
    _, ti, ii = s.split(i, [None, 2, 4])
    tj, jj = s.split(j, [None, 2])
    s.reorder(ti, tj, s.get_loops("C")[-1], ii, jj)
    s.bind(ti, "threadIdx.y")
    s.bind(tj, "threadIdx.x")
    acc = s.cache_write("C", "local")
    s.reverse_compute_at(acc, tj)
    return s


@pytest.mark.emulator
def test_register_writeback_of_a_tile_overhanging_a_constant_dim(rng: np.random.Generator) -> None:
    s = _overhanging_writeback()
    A, B = random_inputs(s.func, rng)
    want = A.astype(np.float64) @ B
    k = sl.build(s, "sm_90")
    np.testing.assert_allclose(k.run_cpu(A, B, bounds_check=True), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(sl.run_reference(s, {"A": A, "B": B})["C"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.nvcc
def test_shared_tiles_of_exactly_48kb_plus_reduction_scratch_compile() -> None:
    k = sl.build(reduce_through_shared(6144), "sm_90")  # a [2, 6144] float32 tile: exactly 49152 bytes
    report = k.compile_check("sm_90")
    (res,) = report.kernels.values()
    assert res.shared_static_bytes <= STATIC_LIMIT


@pytest.mark.nvcc
def test_static_shared_size_of_the_spec_covers_what_ptxas_allocates() -> None:
    _, k = case_kernel("softmax")  # 4 B + 400 B of tiles, two cross-warp reductions with 8 B of scratch each
    (spec,) = k.module.kernels
    (res,) = k.compile_check("sm_90").kernels.values()
    assert spec.static_smem >= res.shared_static_bytes


def test_threadidx_z_over_64_is_a_build_error() -> None:
    s = sl.Schedule(sl.workloads.elementwise((sl.var("M"), 128), ("relu",)))
    i, j = s.get_loops("E0")
    s.bind(i, "blockIdx.x")
    with pytest.raises(sl.ScheduleError, match=r"extent 128 exceeds the 64 threads CUDA allows along threadIdx\.z"):
        s.bind(j, "threadIdx.z")  # refused where the call is
    with pytest.raises(sl.BuildError, match=re.escape("kernel elementwise_relu_E0: threadIdx.z extent 128 exceeds 64")):
        sl.build(forced(s.func, j, thread="threadIdx.z"), "sm_90")  # and again by the build


@pytest.mark.nvcc
def test_generated_source_compiles_without_warnings() -> None:
    _, k = case_kernel("transpose")
    log = k.compile_check("sm_90").log
    assert "warning" not in log.lower(), log
