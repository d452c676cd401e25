"""Hand-written schedules of every built-in workload (the cases the codegen tests run them on are in
``cg_cases.py``).

Every schedule here is written out primitive by primitive (none comes from ``sl.rules``) and between them
they use each feature the code generator has to get right: block/thread tiles, shared-memory tiles filled
cooperatively by all threads (``compute_at`` + fused/split/bound copy loops), register accumulators
(``cache_write`` local + ``reverse_compute_at``), cross-thread reductions over ``threadIdx.x`` (warp
shuffles, and shared memory across warps) and over ``threadIdx.y`` (the general shared-memory path),
padded shared tiles (``storage_align``), ``vectorize`` and ``unroll``.

"""

from __future__ import annotations

import schedlib as sl


# --------------------------------------------------------------------------------------------------
# matmul: 2-level tiles, A/B shared tiles (padded), register accumulators, epilogue folded in
# --------------------------------------------------------------------------------------------------
def schedule_matmul(func: sl.Func, BM: int = 32, BN: int = 32, BK: int = 8, TM: int = 4, TN: int = 2,
                    vec: int = 2, pad: int = 4) -> sl.Schedule:
    """Block tile BM x BN, each of the (BM/TM) x (BN/TN) threads owns a TM x TN register tile; A and B
    tiles of depth BK are fetched into shared memory by all threads, ``vec`` elements each; the row stride
    of each tile is padded to 16k + pad (A) and 32k + pad (B) elements."""
    s = sl.Schedule(func)
    i, j, k = s.get_loops("C")
    bi, ti, ii = s.split(i, [None, BM // TM, TM])
    bj, tj, jj = s.split(j, [None, BN // TN, TN])
    ko, ki = s.split(k, [None, BK])
    s.reorder(bi, bj, ti, tj, ko, ki, ii, jj)
    s.bind(bi, "blockIdx.y")
    s.bind(bj, "blockIdx.x")
    s.bind(ti, "threadIdx.y")
    s.bind(tj, "threadIdx.x")
    acc = s.cache_write("C", "local")
    s.reverse_compute_at(acc, tj)
    if "D" in s.blocks:  # epilogue / output cast: folded into the single store of the accumulator
        s.reverse_compute_inline("D")
    for buf, align in (("A", (0, 16, pad)), ("B", (0, 32, pad))):
        tile = s.cache_read("C", buf, "shared")
        s.compute_at(tile, ko)
        s.storage_align(tile, *align)
        fused = s.fuse(*s.get_loops(tile))
        _, ty, tx, v = s.split(fused, [None, BM // TM, BN // TN, vec])
        s.bind(ty, "threadIdx.y")
        s.bind(tx, "threadIdx.x")
        s.vectorize(v)
    s.decompose_reduction("C", ko)
    for lp in s.get_loops("C")[-3:]:
        s.unroll(lp)
    return s


# --------------------------------------------------------------------------------------------------
# GEMV, weight N x K (reduce the contiguous axis): x in shared, k across threadIdx.x (warp shuffles)
# --------------------------------------------------------------------------------------------------
def schedule_gemv_inner(func: sl.Func, rows: int = 4, threads: int = 32, unroll: int = 2) -> sl.Schedule:
    s = sl.Schedule(func)
    b, n, k = s.get_loops("C")
    bn, tn = s.split(n, [None, rows])
    ko, kt, ku = s.split(k, [None, threads, unroll])
    s.reorder(bn, tn, b, kt, ko, ku)
    s.bind(bn, "blockIdx.x")
    s.bind(tn, "threadIdx.y")
    s.bind(kt, "threadIdx.x")
    s.unroll(ku)
    acc = s.cache_write("C", "local")
    s.reverse_compute_at(acc, b)
    if "D" in s.blocks:
        s.reverse_compute_inline("D")
    xs = s.cache_read("C", "X", "shared")
    s.compute_at(xs, bn)
    fused = s.fuse(*s.get_loops(xs))
    _, ty, tx = s.split(fused, [None, rows, threads])
    s.bind(ty, "threadIdx.y")
    s.bind(tx, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# GEMV, weight K x N (reduce the outer axis): n along threadIdx.x (coalesced), k across threadIdx.y
# --------------------------------------------------------------------------------------------------
def schedule_gemv_outer(func: sl.Func, cols: int = 32, threads_k: int = 4) -> sl.Schedule:
    s = sl.Schedule(func)
    b, n, k = s.get_loops("C")
    bn, tn = s.split(n, [None, cols])
    ko, kt = s.split(k, [None, threads_k])
    s.reorder(bn, tn, b, kt, ko)
    s.bind(bn, "blockIdx.x")
    s.bind(tn, "threadIdx.x")
    s.bind(kt, "threadIdx.y")
    acc = s.cache_write("C", "local")
    s.reverse_compute_at(acc, b)
    if "D" in s.blocks:
        s.reverse_compute_inline("D")
    return s


# --------------------------------------------------------------------------------------------------
# Row reduction (last axis): two rows per block, 64 threads per row (shuffles + shared across warps)
# --------------------------------------------------------------------------------------------------
def schedule_reduce_rows(func: sl.Func, rows: int = 2, threads: int = 64) -> sl.Schedule:
    s = sl.Schedule(func)
    i, r = s.get_loops("R")
    bi, ti = s.split(i, [None, rows])
    ro, rt = s.split(r, [None, threads])
    s.reorder(bi, ti, rt, ro)
    s.bind(bi, "blockIdx.x")
    s.bind(ti, "threadIdx.y")
    s.bind(rt, "threadIdx.x")
    s.unroll(ro)
    return s


# --------------------------------------------------------------------------------------------------
# Column reduction (first axis) with a mean epilogue: columns on threadIdx.x, 3 threads (not a power
# of two) split the rows on threadIdx.y; each thread keeps a partial in a register
# --------------------------------------------------------------------------------------------------
def schedule_reduce_cols(func: sl.Func, cols: int = 32, threads_r: int = 3) -> sl.Schedule:
    s = sl.Schedule(func)
    j, r = s.get_loops("R")
    bj, tj = s.split(j, [None, cols])
    ro, rt = s.split(r, [None, threads_r])
    s.reorder(bj, tj, rt, ro)
    s.bind(bj, "blockIdx.x")
    s.bind(tj, "threadIdx.x")
    s.bind(rt, "threadIdx.y")
    acc = s.cache_write("R", "local")
    s.reverse_compute_at(acc, tj)
    if "D" in s.blocks:
        s.reverse_compute_inline("D")
    return s


# --------------------------------------------------------------------------------------------------
# Softmax, one row per block: the row max is broadcast through shared memory, exp(x - max) is staged
# in a shared row tile that both the sum and the output read, the sum lives in every thread's register
# --------------------------------------------------------------------------------------------------
def schedule_softmax(func: sl.Func, threads: int = 64) -> sl.Schedule:
    s = sl.Schedule(func)
    s.compute_inline(s.cache_write("T_max", "shared"))
    s.compute_inline(s.cache_write("T_exp", "shared"))
    s.compute_inline(s.cache_write("T_sum", "local"))
    i, j = s.get_loops("Y")
    jo, jt = s.split(j, [None, threads])
    s.reorder(i, jt, jo)
    s.bind(i, "blockIdx.x")
    s.bind(jt, "threadIdx.x")
    # Consumers first (compute_at needs every reader inside the loop); blocks attached at one loop run in
    # Func order: T_max, T_exp, T_sum, then Y's own body.
    for stage in ("T_sum", "T_exp", "T_max"):
        s.compute_at(stage, i)
        ko, kt = s.split(s.get_loops(stage)[-1], [None, threads])
        s.reorder(kt, ko)
        s.bind(kt, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# RMSNorm, one row per warp (4 rows per block): sum of squares reduced with warp shuffles into a
# register, the weight vector staged once per block in shared memory, output stores unrolled
# --------------------------------------------------------------------------------------------------
def schedule_rmsnorm(func: sl.Func, rows: int = 4, unroll: int = 2) -> sl.Schedule:
    s = sl.Schedule(func)
    s.compute_inline(s.cache_write("T_sumsq", "local"))
    i, j = s.get_loops("Y")
    bi, ti = s.split(i, [None, rows])
    jo, jt, ju = s.split(j, [None, 32, unroll])
    s.reorder(bi, ti, jt, jo, ju)
    s.bind(bi, "blockIdx.x")
    s.bind(ti, "threadIdx.y")
    s.bind(jt, "threadIdx.x")
    s.unroll(ju)
    s.compute_at("T_sumsq", ti)
    ko, kt = s.split(s.get_loops("T_sumsq")[-1], [None, 32])
    s.reorder(kt, ko)
    s.bind(kt, "threadIdx.x")
    ws = s.cache_read("Y", "W", "shared")
    s.compute_at(ws, bi)
    _, wy, wx = s.split(s.get_loops(ws)[0], [None, rows, 32])
    s.bind(wy, "threadIdx.y")
    s.bind(wx, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# LayerNorm, one row per block of 128 threads (4 warps): the row of X is cached in shared memory for
# the output stage, sum in a register, sum of squares broadcast through shared memory
# --------------------------------------------------------------------------------------------------
def schedule_layernorm(func: sl.Func, threads: int = 128) -> sl.Schedule:
    s = sl.Schedule(func)
    s.compute_inline(s.cache_write("T_sum", "local"))
    s.compute_inline(s.cache_write("T_sumsq", "shared"))
    i, j = s.get_loops("Y")
    jo, jt = s.split(j, [None, threads])
    s.reorder(i, jt, jo)
    s.bind(i, "blockIdx.x")
    s.bind(jt, "threadIdx.x")
    for red in ("T_sumsq", "T_sum"):
        s.compute_at(red, i)
        ko, kt = s.split(s.get_loops(red)[-1], [None, threads])
        s.reorder(kt, ko)
        s.bind(kt, "threadIdx.x")
    xs = s.cache_read("Y", "X", "shared")
    s.compute_at(xs, i)
    xo, xt = s.split(s.get_loops(xs)[-1], [None, threads])
    s.reorder(xt, xo)
    s.bind(xt, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# Element-wise chain: every stage inlined into the last, flattened, 128 threads x 4 elements each
# --------------------------------------------------------------------------------------------------
def schedule_elementwise(func: sl.Func, threads: int = 128, vec: int = 4) -> sl.Schedule:
    s = sl.Schedule(func)
    last = func.outputs[0]
    for blk in s.blocks:
        if blk != last:
            s.compute_inline(blk)
    flat = s.fuse(*s.get_loops(last))
    bx, tx, v = s.split(flat, [None, threads, vec])
    s.bind(bx, "blockIdx.x")
    s.bind(tx, "threadIdx.x")
    s.vectorize(v)
    return s


# --------------------------------------------------------------------------------------------------
# Transpose through a padded 32 x 32 shared tile (row stride 33): coalesced read and write, 32 x 8 threads
# --------------------------------------------------------------------------------------------------
def schedule_transpose(func: sl.Func, tile: int = 32, rows: int = 8) -> sl.Schedule:
    s = sl.Schedule(func)
    j, i = s.get_loops("Y")
    bj, jo, jt = s.split(j, [None, tile // rows, rows])
    bi, it = s.split(i, [None, tile])
    s.reorder(bj, bi, jo, jt, it)
    s.bind(bj, "blockIdx.y")
    s.bind(bi, "blockIdx.x")
    s.bind(jt, "threadIdx.y")
    s.bind(it, "threadIdx.x")
    s.unroll(jo)
    xs = s.cache_read("Y", "X", "shared")
    s.compute_at(xs, bi)
    s.storage_align(xs, 0, 32, 1)
    _, ty, tx = s.split(s.fuse(*s.get_loops(xs)), [None, rows, tile])
    s.bind(ty, "threadIdx.y")
    s.bind(tx, "threadIdx.x")
    return s


# --------------------------------------------------------------------------------------------------
# Row sums through a shared tile of X: [2, cols] float32 is 8 * cols bytes (static up to 48 KB, then dynamic)
# --------------------------------------------------------------------------------------------------
def reduce_through_shared(cols: int) -> sl.Schedule:
    f = sl.workloads.reduce(sl.var("M"), cols, "sum")
    s = schedule_reduce_rows(f, rows=2, threads=64)
    tile = s.cache_read("R", "X", "shared")
    s.compute_at(tile, s.get_loops("R")[0])
    _, ty, tx = s.split(s.fuse(*s.get_loops(tile)), [None, 2, 64])
    s.bind(ty, "threadIdx.y")
    s.bind(tx, "threadIdx.x")
    return s
