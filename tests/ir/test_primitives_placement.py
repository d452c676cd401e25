"""compute_at, reverse_compute_at, compute_inline, reverse_compute_inline: goldens and numerics (the
rejections are in ``test_primitives_placement_errors.py``)."""

from __future__ import annotations

import re

import pytest

import schedlib as sl
from schedlib.ir.func import Func

from .helpers import assert_same_result, chain_func, loop_nest, schedule, vector_func
from .test_primitives_loops import golden

# goldens ----------------------------------------------------------------------------------------


def test_compute_at_compacts_a_shared_tile() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 16))
    s.split("R.r", [None, 8])
    s.cache_read("R", "X", "shared")
    assert s.compute_at("X_shared", "R.r_0") is None
    assert loop_nest(s) == golden("""
        alloc X_shared: float32[1, 8] shared
        for R.i in range(4):
          for R.r_0 in range(2):
            for X_shared.ax0 in range(1):
              for X_shared.ax1 in range(8):
                block X_shared SS (ax0=R.i + X_shared.ax0, ax1=R.r_0 * 8 + X_shared.ax1):
                  X_shared[X_shared.ax0, X_shared.ax1] = X[ax0, ax1]
            for R.r_1 in range(8):
              block R SR (i=R.i, r=R.r_0 * 8 + R.r_1):
                init R[i] = 0.0
                R[i] += X_shared[i - R.i, r - R.r_0 * 8]
        """)
    assert_same_result(s.original, s)


def test_reverse_compute_at_compacts_the_written_tile() -> None:
    s = sl.Schedule(vector_func(64))
    s.split("C.i", [None, 16])
    s.cache_write("C", "local")
    assert s.reverse_compute_at("C_local", "C.i_0") is None
    assert loop_nest(s) == golden("""
        alloc C_local: float32[16] local
        for C.i_0 in range(4):
          for C.i_1 in range(16):
            block C S (i=C.i_0 * 16 + C.i_1):
              C_local[i - C.i_0 * 16] = A[i] * 2.0
          for C_local.ax0 in range(16):
            block C_local S (ax0=C.i_0 * 16 + C_local.ax0):
              C[ax0] = C_local[ax0 - C.i_0 * 16]
        """)
    assert_same_result(s.original, s)


def test_compute_inline_golden() -> None:
    s = sl.Schedule(chain_func(8))
    assert s.compute_inline("B") is None
    assert loop_nest(s) == golden("""
        for C.i in range(8):
          block C S (i=C.i):
            C[i] = A[i] * 2.0 + 1.0
        """)
    assert_same_result(s.original, s)


def test_reverse_compute_inline_golden() -> None:
    s = sl.Schedule(sl.workloads.matmul(4, 4, 4, epilogue="relu"))
    s.cache_write("C", "local")
    assert s.reverse_compute_inline("D") is None
    assert loop_nest(s) == golden("""
        alloc C_local: float32[4, 4] local
        for C.i in range(4):
          for C.j in range(4):
            for C.k in range(4):
              block C SSR (i=C.i, j=C.j, k=C.k):
                init C_local[i, j] = 0.0
                C_local[i, j] += A[i, k] * B[k, j]
        for C_local.ax0 in range(4):
          for C_local.ax1 in range(4):
            block C_local SS (ax0=C_local.ax0, ax1=C_local.ax1):
              D[ax0, ax1] = max(C_local[ax0, ax1], 0.0)
        """)
    assert "C" not in [b.name for b in s.func.buffers]
    assert_same_result(s.original, s)


# numerics ---------------------------------------------------------------------------------------

def gemm_schedule(f: Func, tile: int = 8, ktile: int = 4) -> sl.Schedule:
    """The classic tiled GEMM: block tiles, a local accumulator, shared A/B tiles per K step."""
    s = sl.Schedule(f)
    i, j, k = s.get_loops("C")[-3:]
    io, ii = s.split(i, [None, tile])
    jo, ji = s.split(j, [None, tile])
    ko, ki = s.split(k, [None, ktile])
    s.reorder(io, jo, ko, ii, ji, ki)
    s.bind(io, "blockIdx.x")
    s.bind(jo, "blockIdx.y")
    local = s.cache_write("C", "local")
    s.reverse_compute_at(local, jo)
    a = s.cache_read("C", 0, "shared")
    b = s.cache_read("C", 1, "shared")
    s.compute_at(a, ko)
    s.compute_at(b, ko)
    s.decompose_reduction("C", ko)
    return s


@pytest.mark.parametrize("m,n,k", [(33, 20, 40), (1, 7, 3), (7, 33, 1), (3, 3, 33)])
def test_tiled_gemm_matches_reference(m: int, n: int, k: int) -> None:
    s = gemm_schedule(sl.workloads.matmul(m, n, k))
    assert s.func.buffer("A_shared").shape[1] == sl.ir.Const(min(k, 4))  # a K tile, or all of a short K
    assert_same_result(s.original, s, seed=m * n + k)


def test_tiled_gemm_int8_batch_trans_is_bit_identical() -> None:
    f = sl.workloads.matmul(7, 9, 33, dtype="int8", trans_a=True, trans_b=True, batch=2)
    s = gemm_schedule(f, tile=4, ktile=8)
    assert_same_result(f, s, seed=2)


def test_tiled_gemm_symbolic_sizes() -> None:
    M, N, K = sl.var("M"), sl.var("N"), sl.var("K")
    s = gemm_schedule(sl.workloads.matmul(M, N, K), tile=4, ktile=2)
    for m, n, k in [(1, 3, 7), (7, 7, 3), (33, 1, 5)]:
        assert_same_result(s.original, s, seed=m, symbols={"M": m, "N": n, "K": k})


@pytest.mark.parametrize("epilogue", ["bias", "relu", "bias_relu", "gelu", "residual"])
def test_epilogue_folded_into_write_back(epilogue: str) -> None:
    s = gemm_schedule(sl.workloads.matmul(9, 7, 5, epilogue=epilogue), tile=4, ktile=2)
    s.reverse_compute_inline("D")
    assert "D" not in s.blocks
    assert_same_result(s.original, s)


def test_softmax_row_schedule() -> None:
    s = sl.Schedule(sl.workloads.softmax(3, 33))
    (row, _) = s.get_loops("Y")
    s.compute_at("T_sum", row)
    s.compute_at("T_exp", row)  # read by T_sum and Y, both under the row loop now
    s.compute_at("T_max", s.get_loops("T_exp")[0])
    s.bind(row, "blockIdx.x")
    assert_same_result(s.original, s)


@pytest.mark.parametrize("family", ["rmsnorm", "layernorm"])
def test_norm_reductions_computed_per_row(family: str) -> None:
    s = sl.Schedule(getattr(sl.workloads, family)(sl.var("rows"), 7))
    yi, yj = s.get_loops("Y")
    for blk in [b for b in s.blocks if b.startswith("T_")]:
        s.compute_at(blk, yi)
    s.cache_read("Y", "X", "local")
    s.compute_at("X_local", yj)
    for rows in (1, 3):
        assert_same_result(s.original, s, seed=rows, symbols={"rows": rows})


def test_compute_at_inner_loop_of_a_symbolic_nest() -> None:
    n = sl.var("n")
    s = sl.Schedule(chain_func(n))
    co, _ci = s.split("C.i", [None, 4])
    s.cache_read("C", "B", "local")
    s.compute_at("B_local", co)
    s.compute_at("B", co)
    for value in (1, 3, 7, 33):
        assert_same_result(s.original, s, seed=value, symbols={"n": value})


def test_compute_at_twice_for_a_global_stage() -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 5, 3, epilogue="gelu"))
    d0, d1 = s.get_loops("D")
    s.compute_at("C", d0)
    s.compute_at("C", d1)  # a global stage stores at its axes, so it may move again
    assert s.func.block("C").attach.loop == d1
    assert_same_result(s.original, s)


def test_compute_inline_chain_of_elementwise_stages() -> None:
    s = sl.Schedule(sl.workloads.elementwise((3, 7), ("add", "mul", "gelu", "scale")))
    for blk in ("E0", "E1", "E2"):
        s.compute_inline(blk)
    assert s.blocks == ["E3"]
    assert_same_result(s.original, s)


def test_compute_inline_into_several_consumers() -> None:
    s = sl.Schedule(sl.workloads.softmax(3, 7))
    s.compute_inline("T_exp")
    assert s.blocks == ["T_max", "T_sum", "Y"]
    assert_same_result(s.original, s)


def _transposing_chain() -> Func:
    """``B = A * 2; T[j, i] = B[i, j]; O = T + 1``: inlining T into B stores B at (j, i)."""
    A = sl.placeholder((3, 5), "float32", "A")
    B = sl.compute((3, 5), lambda i, j: A[i, j] * 2.0, "B")
    T = sl.compute((5, 3), lambda j, i: B[i, j], "T")
    O = sl.compute((5, 3), lambda j, i: T[j, i] + 1.0, "O")
    return sl.func([A, O], "transposing")


def test_reverse_compute_inline_transposing_consumer() -> None:
    s = sl.Schedule(_transposing_chain())
    s.reverse_compute_inline("T")
    assert_same_result(s.original, s)


def test_reverse_compute_at_strided_region_is_not_compacted() -> None:
    # Regression: i = i_0 * 4 + i_1 with i_0 varying under C.i_1 writes every 4th row, but C_local was
    # compacted to the 5-row box, so the write-back copied rows of an earlier iteration (NaN/garbage).
    s = sl.Schedule(sl.workloads.matmul(8, 3, 3))
    local = s.cache_write("C", "local")
    i0, i1 = s.split("C.i", [None, 4])
    s.reorder(i1, i0)
    s.reverse_compute_at(local, i1)
    assert s.func.buffer(local).shape == s.func.buffer("C").shape
    assert_same_result(s.original, s)


def test_reverse_compute_at_of_a_thread_s_dense_register_tile_is_compacted() -> None:
    # the refusal of tiles strided across threads (test_primitives_placement_errors) spares dense ones
    s = sl.Schedule(sl.workloads.matmul(4, 16, 4))
    tx, jo, jv = s.split("C.j", [4, 2, 2])
    s.reorder("C.i", tx, "C.k", jo, jv)
    s.bind(tx, "threadIdx.x")
    local = s.cache_write("C", "local")
    s.reverse_compute_at(local, tx)
    assert [int(d.value) for d in s.func.buffer(local).shape] == [1, 4]  # type: ignore[attr-defined]
    assert_same_result(s.original, s)


def test_reverse_compute_at_dense_multi_level_region_is_compacted() -> None:
    s = sl.Schedule(sl.workloads.matmul(24, 3, 3))
    local = s.cache_write("C", "local")
    i0, _, _ = s.split("C.i", [None, 3, 4])
    s.reverse_compute_at(local, i0)
    assert [int(d.value) for d in s.func.buffer(local).shape] == [12, 3]
    assert_same_result(s.original, s)


def test_reverse_compute_at_under_overshooting_split() -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 33, 3, epilogue="bias"))
    jo, _ = s.split("C.j", [None, 8])
    s.reverse_compute_at("D", jo)
    s.split(jo, [2, None])
    assert_same_result(s.original, s)


def test_reverse_compute_at_with_an_inner_overshooting_split_is_not_compacted() -> None:
    # Regression: i = i_1 * 4 + i_2 with i_2 split [3, 2] (6 > 4) masks i_2 = 4, 5, which alias valid rows
    # of the next i_1.  In those masked iterations the write-back copied a stale compacted slot over them.
    s = sl.Schedule(sl.workloads.reduce(8, 5, "max"))
    _, i2 = s.split("R.i", [2, 4])
    i20, i21 = s.split(i2, [3, 2])
    s.reorder(i21, i20)
    s.cache_write("R", "shared")
    s.reverse_compute_at("R_shared", i20)
    assert s.func.buffer("R_shared").shape == s.func.buffer("R").shape
    assert_same_result(s.original, s)


def test_reverse_compute_at_window_wider_than_the_dim_keeps_its_offset() -> None:
    # Regression: j = j_0 * 2 + j_1 (+ j_2) over N = 1 gave a window as wide as the dim, which region
    # inference widened to the whole dim at base 0.  The write-back then ran in the iterations where the host
    # wrote nothing (j_0 * 2 + j_1 >= 1) and copied a stale compacted slot over C (on a GPU: a thread's
    # unwritten registers).  The write-back now keeps the window's offset and guard.
    s = sl.Schedule(sl.workloads.matmul(7, 1, 33, batch=2, trans_b=True))
    s.split("C.j", [3, 2, 1])
    s.split("C.b", [2, 1, 2])
    s.reorder("C.j_1", "C.b_0", "C.b_2", "C.b_1", "C.j_0")
    s.cache_write("C", "local")
    s.reverse_compute_at("C_local", "C.j_0")
    assert [int(d.value) for d in s.func.buffer("C_local").shape] == [1, 1, 1]
    assert "C.j_0 * 2 + C.j_1 + C_local.ax2 < 1" in str(s.func.block("C_local").predicate)
    assert_same_result(s.original, s)


def test_reverse_compute_at_tile_overhanging_a_small_dim() -> None:
    s = gemm_schedule(sl.workloads.matmul(1, 33, 7, epilogue="bias_relu"), tile=4, ktile=4)
    assert [int(d.value) for d in s.func.buffer("C_local").shape] == [4, 4]
    assert_same_result(s.original, s)


def test_reverse_compute_at_edge_guards_keep_compaction() -> None:
    s = gemm_schedule(sl.workloads.matmul(33, 20, 7))  # guards i < 33, j < 20 only trim the edge tiles
    assert [int(d.value) for d in s.func.buffer("C_local").shape] == [8, 8]
    assert_same_result(s.original, s)


@pytest.mark.parametrize("thread_loop", ["C.i", "C.j"])
def test_reverse_compute_at_shared_tile_widened_over_threads(thread_loop: str) -> None:
    # Regression: a shared region spans every thread; with C.i (threads) outside the fixed C.j, the tile of
    # one column was filled across all C.i iterations while other columns reused its compacted place.
    s = sl.Schedule(sl.workloads.matmul(4, 3, 2))
    s.cache_write("C", "shared")
    s.bind(thread_loop, "threadIdx.x")
    s.reverse_compute_at("C_shared", "C.j")
    shape = [int(d.value) for d in s.func.buffer("C_shared").shape]
    assert shape == ([4, 3] if thread_loop == "C.i" else [1, 3])  # compacted only when not interleaved
    assert_same_result(s.original, s)


def test_compute_at_shared_tile_covers_all_threads() -> None:
    s = sl.Schedule(sl.workloads.matmul(8, 8, 8))
    ty, i1 = s.split("C.i", [2, 4])
    ko, _ = s.split("C.k", [None, 4])
    s.reorder(ty, "C.j", ko, i1)
    s.bind(ty, "threadIdx.y")
    shared = s.cache_read("C", "A", "shared")
    s.compute_at(shared, ko)
    assert [int(d.value) for d in s.func.buffer(shared).shape] == [8, 4]  # every ty's rows, one K tile
    assert_same_result(s.original, s)


def test_reverse_compute_at_keeps_a_tile_with_a_second_writer_whole() -> None:
    # Regression: compaction shifted the host's store but not the decomposed init's, which then wrote
    # T_sum_shared[i] into a 1-element buffer (ExecutionError).
    s = sl.Schedule(sl.workloads.layernorm(3, 1))
    s.cache_write("T_sum", "shared")
    s.cache_read("T_sum_shared", "T_sum_shared", "shared")
    s.compute_at("T_sum_shared", "Y.i")
    s.decompose_reduction("T_sum", "T_sum.k")
    s.reverse_compute_at("T_sum_shared_shared", "T_sum.i")
    assert s.func.buffer("T_sum_shared").shape == s.func.buffer("T_sum").shape
    assert_same_result(s.original, s)


def test_compute_at_after_decompose_is_rejected() -> None:
    # Regression: C_init moved into D's loop and zeroed C after C was computed (D read zeros), and
    # compute_inline(C_init) deleted buffer C while C still wrote it (KeyError in the executor).
    s = schedule(sl.workloads.softmax(1, 3), lambda s: s.decompose_reduction("T_max", "T_max.i"))
    with pytest.raises(sl.ScheduleError, match="also written by T_max"):
        s.compute_at("T_max_init", "T_exp.i")
    with pytest.raises(sl.ScheduleError, match="also written by T_max"):
        s.compute_inline("T_max_init")
    with pytest.raises(sl.ScheduleError, match="also written by T_max_init"):
        s.compute_at("T_max", "T_exp.i")
    assert len(s.trace) == 1
    assert_same_result(s.original, s)


@pytest.mark.parametrize("scope", ["shared", "local"])
def test_reverse_compute_at_bounds_a_tile_of_a_symbolic_split_per_cuda_block(scope: str) -> None:
    """``split(i, [2, 2, None])`` over a symbolic n writes ``(i_0 * 2 + i_1) * ((n + 3) // 4) + i_2``: a loop
    times a symbolic step.  The write-back of one blockIdx.x iteration covers its 2 * ((n + 3) // 4) elements;
    a region of the whole of n made each CUDA block copy the other block's part from its own (never written)
    shared memory or registers: NaN for half the outputs of the reference run, and for a global buffer a
    cross-block race on the GPU."""
    n = sl.var("n")
    A = sl.placeholder((n,), "float32", "A")
    f = sl.func([A, sl.compute((n,), lambda i: A[i] * 2.0, "C")], "scale")
    s = sl.Schedule(f)
    i0, _, _ = s.split("C.i", [2, 2, None])
    s.bind(i0, "blockIdx.x")
    s.reverse_compute_at(s.cache_write("C", scope), i0)
    assert f"for C_{scope}.ax0 in range((n + 3) // 4 * 2):" in str(s)
    for value in (1, 5, 8, 33):
        assert_same_result(f, s, seed=value, symbols={"n": value})


@pytest.mark.parametrize("scope", ["shared", "global"])
def test_reverse_compute_at_refuses_a_fused_symbolic_tile_it_cannot_bound_per_cuda_block(scope: str) -> None:
    """fuse(i0, i1) over (m, 3), split in two over blockIdx.x: the write-back's indices are ``f // 3`` and
    ``f % 3`` of a walk of (3m + 1) // 2 points, which region inference does not bound, so the region is the
    whole buffer.  Accepted, every CUDA block copied the other block's half from its own never-written shared
    memory (NaN for 8 of 15 outputs at m = 5); now refused, and the schedule is left as it was."""
    f = sl.workloads.elementwise((sl.var("m"), 3), ("relu",))
    s = sl.Schedule(f)
    blocks, _ = s.split(s.fuse("E0.i0", "E0.i1"), [2, None])
    s.bind(blocks, "blockIdx.x")
    cache = s.cache_write("E0", scope)
    before = str(s)
    with pytest.raises(sl.ScheduleError, match=re.escape(f"also spans what other iterations of {blocks} write")):
        s.reverse_compute_at(cache, blocks)
    assert str(s) == before
    # attached at the innermost loop instead (a thread's), each iteration's one point is its own: accepted, right
    s = sl.Schedule(f)
    blocks, _, threads = s.split(s.fuse("E0.i0", "E0.i1"), [2, None, 32])
    s.bind(blocks, "blockIdx.x")
    s.bind(threads, "threadIdx.x")
    s.reverse_compute_at(s.cache_write("E0", "local"), threads)
    assert_same_result(f, s, seed=5, symbols={"m": 5})
