"""The mma lowering (schedlib.codegen.tensor_core): what it emits per operand layout, the loop-nest check that
guards it, the shared-memory swizzle, and that the annotated schedule still means the same computation."""

from __future__ import annotations

import numpy as np
import pytest
from cg_support import forced

import schedlib as sl
from schedlib.codegen.operand_copy import swizzle
from schedlib.rules import get_rule
from schedlib.rules import matmul_tc as tc
from schedlib.rules.matmul_facts import analyze_matmul

MATMUL = get_rule("matmul")


def tc_config(bm: int, bn: int, bk: int, wm: int, wn: int, stages: int, raster: int = 1) -> dict:
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": wm // 8, "thread_n": wn // 4, "vector": 1,
            "split_k": 1, "stages": stages, "tensor_core": True, "raster": raster}


@pytest.mark.parametrize("cols", [16, 32, 64, 128])
def test_swizzle_makes_every_ldmatrix_conflict_free(cols: int) -> None:
    """ldmatrix reads 8 consecutive rows (starting at a multiple of 8) at one 16-byte chunk column; the 8
    physical chunks must fall in 8 different 16-byte bank groups (bytes / 16 mod 8), and each row's chunks
    must stay a permutation (the copy writes every chunk once)."""
    per_row = cols // 8
    xor = swizzle("r", cols)
    for base in range(0, 64, 8):
        for chunk in range(per_row):
            groups = {((base + r) * per_row + (chunk ^ eval(xor, {"r": base + r}))) % 8 for r in range(8)}
            assert len(groups) == 8, (cols, base, chunk)
    for r in range(16):
        assert sorted(c ^ eval(xor, {"r": r}) for c in range(per_row)) == list(range(per_row))
    # without the XOR a 64-element (128-byte) row puts all 8 rows in one bank group
    if cols >= 64:
        assert len({(r * per_row) % 8 for r in range(8)}) == 1


def test_the_swizzle_permutes_each_row_at_every_tile_width() -> None:
    """Every width a hand-written schedule may give a tile (multiples of 8 halves), not only the rule's powers
    of two: a row of 6 chunks once XORed with up to 5 and wrote into the next row.  The XOR depends on the row
    modulo 8 only, since ldmatrix addresses rows from 8-aligned bases."""
    for cols in range(8, 520, 8):
        per_row, xor = cols // 8, swizzle("r", cols)
        for r in range(16):
            assert sorted(c ^ eval(xor, {"r": r}) for c in range(per_row)) == list(range(per_row)), (cols, r)
            assert eval(xor, {"r": r}) == eval(xor, {"r": r % 8}), (cols, r)


@pytest.mark.parametrize(("shape", "changes"), [((64, 64, 96), {"block_k": 48}), ((64, 96, 64), {"block_n": 48}),
                                                ((64, 64, 160), {"block_k": 160, "stages": 1})],
                         ids=["block_k48", "block_n48", "block_k160"])
def test_tiles_of_any_chunk_count_stay_inside_their_rows(shape: tuple[int, int, int], changes: dict,
                                                         rng: np.random.Generator) -> None:
    """Tiles 48 and 160 halves wide (6 and 20 chunks; the rule's knobs never make them, a schedule written by
    hand can): the copies stay inside the shared tiles (bounds-checked) and the result is right."""
    f = sl.workloads.matmul(*shape, "float16")
    config = {**MATMUL.apply(f, "a100").config, **changes}
    kernel = sl.build(tc.schedule(f, analyze_matmul(f), config), "a100")
    inputs = [rng.standard_normal([int(d.value) for d in f.buffer(n).shape]).astype(np.float16) for n in f.inputs]
    got = kernel.run_cpu(*inputs, bounds_check=True)
    want = sl.run_reference(f, dict(zip(f.inputs, inputs)))["D"]
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_each_layout_gets_the_ldmatrix_it_needs(trans_a: bool, trans_b: bool) -> None:
    f = sl.workloads.matmul(64, 64, 96, "float16", trans_a=trans_a, trans_b=trans_b)
    src = sl.build(MATMUL.apply(f, "h100", tc_config(64, 64, 32, 32, 32, 3)), "h100").source
    src = src.split("end of the schedlib CUDA prelude ----")[-1]
    assert ("sl_ldmatrix_x4_trans(sl_a" in src) == trans_a  # A stored K x M is transposed on load
    assert ("sl_ldmatrix_x4_trans(sl_b" in src) == (not trans_b)  # so is B stored K x N
    assert "sl_cp_async_wait<1>();" in src and src.count("sl_cp_async_16(") == 2
    assert "sl_mma_m16n8k16_f16f32(" in src and "bf16f32" not in src


def test_one_stage_is_a_synchronous_single_buffer_and_raster_renumbers_blocks() -> None:
    f = sl.workloads.matmul(256, 256, 64, "bfloat16")
    src = sl.build(MATMUL.apply(f, "h100", tc_config(64, 64, 32, 32, 32, 1, raster=4)), "h100").source
    body = src.split("prelude ----")[-1]
    assert "sl_cp_async_wait<0>();" in body and "sl_mma_m16n8k16_bf16f32(" in body
    assert "SL_SHARED(__nv_bfloat16, A_shared, 2048);" in body  # one 64 x 32 tile, no ring
    assert "sl_span = 4 * gridDim.x" in body


def test_the_annotated_schedule_still_computes_the_same(rng: np.random.Generator) -> None:
    """Annotations change how the nest is lowered, never what it computes: the reference executor runs the
    tensor-core schedule (lanes, warps and all) to the unscheduled func's answer."""
    f = sl.workloads.matmul(40, 48, 32, "float16", trans_b=True, epilogue="bias_relu")
    sch = MATMUL.apply(f, "h100", tc_config(32, 32, 16, 16, 16, 2))
    inputs = {n: rng.standard_normal([int(d.value) for d in f.buffer(n).shape]).astype(np.float16)
              for n in f.inputs}
    got = sl.run_reference(sch, inputs)["D"].astype(np.float64)
    want = sl.run_reference(f, inputs)["D"].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def _simt_with_annotation(value: str = "m16n8k16") -> sl.Schedule:
    f = sl.workloads.matmul(64, 64, 64, "float16")
    sch = MATMUL.apply(f, "h100", {"block_m": 32, "block_n": 32, "block_k": 16, "thread_m": 4, "thread_n": 4,
                                   "vector": 1, "split_k": 1, "stages": 1, "tensor_core": False, "raster": 1})
    sch.annotate("C", "tensor_core", value)
    return sch


def _warp_tiled(lane_order: tuple[int, int]) -> sl.Schedule:
    """The rule's 32x32 tile with 2x2 warps of 16x16, with the lane fused from (groupID, threadID_in_group)
    in ``lane_order`` ((0, 1) is the mma layout lane = g * 4 + t; (1, 0) is lane = t * 8 + g)."""
    f = sl.workloads.matmul(64, 64, 32, "float16")
    s = sl.Schedule(f)
    i, j, k = s.get_loops("C")
    by, wy, mt, h, g = s.split(i, [None, 2, 1, 2, 8])
    bx, wx, nt, t, e = s.split(j, [None, 2, 2, 4, 2])
    ko, kk, ki = s.split(k, [None, 1, 16])
    lane_parts = (g, t) if lane_order == (0, 1) else (t, g)
    s.reorder(by, bx, wy, wx, *lane_parts, ko, kk, mt, nt, h, e, ki)
    lane = s.fuse(*lane_parts)
    for loop, tag in ((by, "blockIdx.y"), (bx, "blockIdx.x"), (wy, "threadIdx.z"), (wx, "threadIdx.y"),
                      (lane, "threadIdx.x")):
        s.bind(loop, tag)
    wb = s.cache_write("C", "local")
    s.reverse_compute_at(wb, wx)
    for operand in ("A", "B"):
        s.compute_at(s.cache_read("C", operand, "shared"), ko)
    s.annotate("C", "tensor_core", "m16n8k16")
    return s


def test_the_loop_nest_is_checked_before_lowering(rng: np.random.Generator) -> None:
    good = _warp_tiled((0, 1))
    assert "sl_mma_m16n8k16_f16f32(" in sl.build(good, "h100").source  # a hand-written nest lowers too
    with pytest.raises(sl.BuildError, match=r"axis i uses the lane as \{'C.j_3_i_4_fused % 8': 1\}, not as an "
                                            r"mma fragment row or column"):
        sl.build(_warp_tiled((1, 0)), "h100")  # lanes own the wrong elements: refused, not miscompiled
    with pytest.raises(sl.BuildError, match=r"but it is not a single sum reduction with its init"):
        sl.build(_simt_with_annotation(), "h100")
    with pytest.raises(sl.ScheduleError, match=r"tensor_core must be one of \['m16n8k16', 'wgmma'\]"):
        _simt_with_annotation("m16n8k8")  # refused where the call is
    with pytest.raises(sl.BuildError, match=r"only 'm16n8k16' and 'wgmma' are supported"):
        sl.build(forced(_simt_with_annotation().func, "C", annotate=("tensor_core", "m16n8k8")), "h100")


def test_fp32_operands_and_bad_annotations_are_refused() -> None:
    f = sl.workloads.matmul(64, 64, 64)  # float32: the rule never offers this; a hand schedule may try
    facts = analyze_matmul(f)
    sch = tc.schedule(f, facts, tc_config(64, 64, 32, 32, 32, 2))
    with pytest.raises(sl.BuildError, match=r"copies A \(float32\), not a float16/bfloat16 input"):
        sl.build(sch, "h100")
    g = sl.workloads.matmul(64, 64, 64, "float16")
    sch = MATMUL.apply(g, "h100", tc_config(64, 64, 32, 32, 32, 2))
    by = sch.get_loops("C")[0]
    with pytest.raises(sl.ScheduleError, match=r"raster must be an integer in 1\.\.16"):
        sch.annotate(by, "raster", 0)  # refused where the call is
    with pytest.raises(sl.BuildError, match=r"annotation raster=0 is not an integer in 1\.\.16"):
        sl.build(forced(sch.func, by, annotate=("raster", 0)), "h100")


@pytest.mark.parametrize(("m", "n", "guard"), [(128, 128, None), (100, 128, "if (sl_row < 100)"),
                                               (128, 72, "if (sl_col < 72)"),
                                               (100, 72, "if (sl_row < 100 && sl_col < 72)")])
def test_the_epilogue_guards_only_the_dims_the_tiles_do_not_divide(m: int, n: int, guard: str | None) -> None:
    """A guard that always holds keeps nvcc from sharing a bias load between the rows of a fragment."""
    f = sl.workloads.matmul(m, n, 64, "float16", epilogue="bias_relu")
    src = sl.build(MATMUL.apply(f, "a100", tc_config(64, 64, 32, 32, 32, 2)), "a100").source
    epilogue = src.split("sl_mma_m16n8k16_f16f32(")[-1].split("\n")
    guards = [line.strip() for line in epilogue if line.strip().startswith(("if (sl_row", "if (sl_col"))]
    assert guards == ([] if guard is None else [guard + " {"]), epilogue
    # whole blocks along N: each thread's two neighbouring columns go out as one 4-byte store
    paired = "SL_VSTORE_REGS(unsigned, D," in src
    assert paired == (n % 64 == 0)
    assert ("= sl_acc[sl_mt][sl_nt][sl_e];" in src) == (not paired)


@pytest.mark.parametrize(("shape", "config", "a_path", "b_path"), [
    # 128 threads, A 64x32 and B 32x64 in rows 32 and 8 apart: a pointer per k step, slot offsets hoisted
    ((128, 128, 128), (64, 64, 32, 32, 32), "pointer", "pointer"),
    # M = 100: A's rows are guarded, so its chunk addresses are formed only under the guard
    ((100, 128, 128), (64, 64, 32, 32, 32), "guarded", "pointer"),
    # 64 threads over 16-chunk rows of B: rows 4 apart, inside the 8-row swizzle period, so each chunk's
    # shared offset is computed; its source is still the pointer plus a constant
    ((64, 256, 128), (32, 128, 32, 32, 64), "pointer", "swizzled"),
    # A's 16x16 tile is 32 chunks for 128 threads: the generic guarded chunk loop
    ((64, 128, 64), (16, 64, 16, 16, 16), "chunks", "pointer"),
])
def test_copy_addresses_are_loop_invariants_where_the_threads_tile_the_rows(
        shape: tuple[int, int, int], config: tuple[int, int, int, int, int], a_path: str, b_path: str) -> None:
    """Each k step's copy should cost one address per operand, not one per chunk: a thread's chunks of an
    operand lie whole rows apart, so its first row, chunk and (when the swizzle repeats) shared offset are
    computed before the k loop.  The ring slots advance by compares, never by ``% stages``."""
    f = sl.workloads.matmul(*shape, "float16")
    src = sl.build(MATMUL.apply(f, "a100", tc_config(*config, 3)), "a100").source.split("prelude ----")[-1]
    k_loop = src.split("for (int C_k_0 = 0;")[1]
    assert "% 3" not in k_loop and "sl_read = sl_read == 2 ? 0 : sl_read + 1;" in k_loop
    for key, path in (("a", a_path), ("b", b_path)):
        load = src.split("auto sl_load")[1].split("};")[0]
        shared = key.upper() + "_shared"
        copies = [line.strip() for line in load.splitlines() if f"sl_cp_async_16(&{shared}" in line]
        assert len(copies) == 1, load
        assert (f"sl_{key}_src + sl_i * " in copies[0]) == (path in ("pointer", "swizzled")), copies
        assert (f"const int sl_{key}_r0 = sl_tid / " in src) == (path != "chunks")
        assert (f"const int sl_{key}_dst0 = " in src) == (path in ("pointer", "guarded"))
        assert copies[0].startswith("if (") == (path == "guarded")
    assert ("if (sl_c < 32)" in src) == ("chunks" in (a_path, b_path))


def test_the_printed_nest_says_the_accumulator_lives_in_mma_fragments() -> None:
    """The IR keeps a tensor-core accumulator at the problem's shape (the lane layout is no dense per-thread
    tile); the printed nest says so, and a SIMT accumulator, compacted to its tile, gets no such note."""
    tc_nest = str(MATMUL.apply(sl.workloads.matmul(256, 256, 64, "float16"), "h100", tc_config(64, 64, 32, 32, 32, 2)))
    assert ("  alloc C_local: float32[256, 256] local  # held as mma fragments in registers, each lane its own "
            "elements") in tc_nest.splitlines()
    simt_nest = str(MATMUL.apply(sl.workloads.matmul(256, 256, 64), "h100", None))
    assert "  alloc C_local: float32[2, 2] local" in simt_nest.splitlines()
