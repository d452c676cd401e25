"""The cost model: footprints and traffic worked out by hand, the func analysis, and invariants that any
config on any profile must satisfy."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest
from carver_fakes import TensorCoreMatmul
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedlib as sl
import schedlib.carver
from schedlib.carver import analyze, occupancy
from schedlib.carver.model import BLOCK_LAUNCH_S
from schedlib.carver.problem import Access, Dim, Term
from schedlib.carver.traffic import access_traffic, contiguous_run, geometry, sectors_per_run, wave_tile
from schedlib.hw import list as profile_keys
from schedlib.hw import load
from schedlib.rules import get_rule
from schedlib.rules.base import Tiling

MATMUL = get_rule("matmul")


def _config(bm: int, bn: int, bk: int, tm: int, tn: int, vector: int) -> dict:
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": tm, "thread_n": tn, "vector": vector,
            "split_k": 1, "stages": 1, "tensor_core": False, "raster": 1}


# ---- sectors and contiguous runs ---------------------------------------------------------------------


def test_sectors_per_run_by_hand() -> None:
    assert sectors_per_run(32, 32, 32) == 1.0  # aligned whole sector
    assert sectors_per_run(16, 16, 32) == 1.0  # half a sector, never straddles
    # 24-byte runs at multiples of 24: start offsets 0, 24, 16, 8 -> 1, 2, 2, 1 sectors.
    assert sectors_per_run(24, 24, 32) == 1.5
    # 64-byte runs at multiples of 8: offsets 0, 8, 16, 24 -> 2, 3, 3, 3 sectors.
    assert sectors_per_run(64, 8, 32) == 2.75


def _access(rows: int, cols: int, nbytes: int = 4) -> Access:
    return Access("X", nbytes, (Dim((Term("i", rows),), rows), Dim((Term("j", cols),), cols)), False)


def test_contiguous_run_and_sector_rounding_of_a_tile() -> None:
    x = _access(100, 30)
    # A 10 x 6 fp32 tile: 24-byte row segments; starts are multiples of gcd(24, 120-byte rows) -> 8 bytes
    # mod 32, so on average 1.5 sectors (48 bytes) move per 24 useful bytes.
    assert contiguous_run(x, {"i": 10, "j": 6}) == (6, 24)
    geo = geometry_for({"i": 100, "j": 30}, {"i": 10, "j": 6})
    t = access_traffic(x, geo, wave_tile(geo, {"i": 1, "j": 1}), 32)
    assert t.factor == pytest.approx(2.0)
    assert t.block_bytes == pytest.approx(10 * 6 * 4 * 2.0)
    # 10 x 5 blocks, each 60 elements: the whole 3000-element buffer once, doubled by rounding.
    assert t.total_bytes == pytest.approx(100 * 30 * 4 * 2.0)
    # A tile spanning whole rows merges them: 10 rows x 120 B = 1200 B at multiples of 1200 (16 mod 32):
    # 38 sectors either way, 1216 bytes per 1200.
    assert contiguous_run(x, {"i": 10, "j": 30}) == (300, 1200)
    geo = geometry_for({"i": 100, "j": 30}, {"i": 10, "j": 30})
    t = access_traffic(x, geo, wave_tile(geo, {"i": 1, "j": 1}), 32)
    assert t.factor == pytest.approx(1216 / 1200)


def geometry_for(extents: dict[str, int], tile: dict[str, int]) -> schedlib.carver.traffic.Geometry:
    """Geometry of a 2-d spatial problem, built through the real code path from a bare Tiling."""
    problem = dataclasses.replace(
        analyze(sl.workloads.elementwise((extents["i"], extents["j"]), ("relu",)), "E0", {}),
        axes=("i", "j"), kinds={"i": "S", "j": "S"}, extents=extents)
    tiling = Tiling("E0", tile, {}, {}, 32, 0, 32)
    return geometry(problem, tiling)


# ---- whole-model known answers ----------------------------------------------------------------------


def test_matmul_footprints_and_traffic_by_hand() -> None:
    f = sl.workloads.matmul(256, 256, 256)
    e = sl.carver.estimate(f, "h100", _config(64, 64, 16, 4, 4, 4))
    assert e["grid_blocks"] == 16 and e["threads_per_block"] == 256
    # Per block: A 64x256, B 256x64, C 64x64 fp32 tiles.
    assert e["global_bytes_per_block"] == (64 * 256 + 256 * 64 + 64 * 64) * 4
    # A is re-read by the 4 block columns, B by the 4 block rows, C written once.
    assert e["l2_bytes"] == 4 * 256 * 256 * 4 * 2 + 256 * 256 * 4
    assert e["transactions"] == e["l2_bytes"] / 32
    assert e["compulsory_bytes"] == 3 * 256 * 256 * 4
    assert e["dram_bytes"] == e["compulsory_bytes"]  # 3 x 256 KiB fits any L2
    assert e["smem_bytes_per_block"] == (64 + 64) * 16 * 4
    assert e["reg_bytes_per_block"] == 256 * (16 + 8 + 40) * 4
    assert e["flops"] == 2 * 256**3
    assert e["staged_in_shared"] == "A,B"
    # Shared/L1 port per block: each thread reads 4 A and 4 B values per k (4-byte slots) for all 256
    # k, the copies write both 64 KiB tiles, and the C tile is stored once.
    per_block = 256 * (4 + 4) * 256 * 4 + 2 * 64 * 256 * 4 + 64 * 64 * 4
    assert e["shared_bytes"] == 16 * per_block
    assert e["arithmetic_intensity"] == pytest.approx(2 * 256**3 / (3 * 256 * 256 * 4))
    occ = occupancy(load("h100"), 256, 64, (64 + 64) * 16 * 4)
    assert e["blocks_per_sm"] == occ.blocks_per_sm and e["occupancy_limiter"] == occ.limiter


def test_wave_working_set_and_l2_overflow_by_hand() -> None:
    f = sl.workloads.matmul(4096, 4096, 4096, "float16")
    e = sl.carver.estimate(f, "h100", _config(128, 128, 16, 8, 8, 4))
    # 120 registers -> 3840 per warp -> 4 warps per sub-partition -> 16 warps -> 2 blocks of 8 warps.
    assert e["blocks_per_sm"] == 2
    assert e["grid_blocks"] == 32 * 32
    assert e["waves"] == pytest.approx(1024 / 264) and e["wave_efficiency"] == pytest.approx(1024 / 264 / 4)
    # One wave = 264 consecutive blocks with blockIdx.x over the 32 block columns: all 32 columns of B
    # (the whole 32 MiB) and 9 block rows of A (9 x 128 x 4096 fp16).  The output streams, not counted.
    wave = 9 * 128 * 4096 * 2 + 4096 * 4096 * 2
    assert e["wave_working_set_bytes"] == wave
    # The wave set exceeds 75% of the 50 MiB L2 by a fraction f of itself; that fraction of the re-reads
    # of data an earlier wave read goes to DRAM.  Each of the 1024 / 264 waves reads its footprint once:
    # all of B every wave, the 9 rows of A (one shared with the next wave); beyond the first reads of A
    # and B those are re-reads from earlier waves.  Blocks of one wave re-reading what another block of
    # the wave reads (A by 32 block columns, B by 9 block rows) need only the in-flight k slices: 4 steps
    # of 16 of the wave's A rows and B columns, far below the L2, so those are L2 hits.
    over = 1 - 0.75 * 52428800 / wave
    size = 4096 * 4096 * 2
    later_wave = 1024 / 264 * wave - 2 * size
    compulsory = 3 * size
    assert e["dram_bytes"] == pytest.approx(compulsory + over * later_wave)
    assert e["l2_bytes"] == 2 * 32 * 4096 * 4096 * 2 + 4096 * 4096 * 2


def test_unaligned_step_is_flagged() -> None:
    f = sl.workloads.matmul(1024, 1024, 1024, "float16")
    e = sl.carver.estimate(f, "h100", _config(64, 64, 8, 4, 4, 2))
    assert not e["aligned"] and "A" in e["alignment"] and "32-byte" in e["alignment"]
    # With A stored K x M the step's rows run along m (64 halves = 128 B), B's along n: aligned.
    ft = sl.workloads.matmul(1024, 1024, 1024, "float16", trans_a=True)
    e = sl.carver.estimate(ft, "h100", _config(64, 64, 8, 4, 4, 2))
    assert e["aligned"], e["alignment"]
    # ... but B stored N x K is read along k again, 8 halves per step.
    ftb = sl.workloads.matmul(1024, 1024, 1024, "float16", trans_a=True, trans_b=True)
    assert "B" in sl.carver.estimate(ftb, "h100", _config(64, 64, 8, 4, 4, 2))["alignment"]


# ---- func analysis ------------------------------------------------------------------------------------


def _loads(func: sl.Func, main: str) -> dict[str, tuple[tuple[str | None, ...], ...]]:
    p = analyze(func, main, {})
    return {a.buffer: tuple(tuple(t.axis for t in d.terms) for d in a.dims) for a in p.loads}


def test_epilogue_axes_follow_the_data_flow() -> None:
    f = sl.workloads.matmul(64, 48, 40, epilogue="bias_relu")
    assert _loads(f, "C") == {"A": (("i",), ("k",)), "B": (("k",), ("j",)), "bias": (("j",),)}
    p = analyze(f, "C", {})
    assert [(s.buffer, tuple(d.terms[0].axis for d in s.dims)) for s in p.stores] == [("D", ("i", "j"))]
    main = next(w for w in p.work if w.main)
    assert (main.flops, main.instructions) == (2, 1)  # a multiply-add is one FMA
    # Batched with a transposed A: the batch axis indexes everything, A's rows are k.
    fb = sl.workloads.matmul(64, 48, 40, batch=3, trans_a=True)
    assert _loads(fb, "C")["A"] == (("b",), ("k",), ("i",))


def test_multi_stage_funcs_read_each_input_once() -> None:
    # softmax reads X in T_max (as X[i, k]) and T_exp (as X[i, j]): one access, on the main axes i, j.
    assert _loads(sl.workloads.softmax(64, 100), "Y") == {"X": (("i",), ("j",))}
    assert _loads(sl.workloads.layernorm(64, 100), "Y") == {"X": (("i",), ("j",)), "gamma": (("j",),),
                                                            "beta": (("j",),)}
    assert _loads(sl.workloads.gemv(48, 40), "C") == {"X": (("b",), ("k",)), "W": (("n",), ("k",))}


def test_symbols_are_bound_for_the_ranking() -> None:
    M = sl.var("M")
    f = sl.workloads.matmul(M, 256, 128)
    p = analyze(f, "C", {"M": 1000})
    assert p.extents == {"i": 1000, "j": 256, "k": 128} and p.symbolic_axes == {"i"}
    assert p.symbolic_label() == "M=1000"


# ---- invariants over random configs, shapes and profiles -------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(9, 5000), n=st.integers(9, 5000), k=st.integers(1, 5000),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    profile=st.sampled_from(profile_keys()), seed=st.integers(0, 2**31),
)  # fmt: skip
def test_model_invariants(m: int, n: int, k: int, dtype: str, profile: str, seed: int) -> None:
    f = sl.workloads.matmul(m, n, k, dtype)
    p = load(profile)
    config = MATMUL.space(f, p).sample(random.Random(seed))
    e = sl.carver.estimate(f, p, config)
    if e["blocks_per_sm"] == 0:
        assert math.isnan(e["est_time_us"]) and e["reason"].startswith("cannot launch")
        return
    # The time is never below any roofline term at full machine rates, so pct_of_peak <= 100.
    for term in ("t_compute_us", "t_dram_us", "t_l2_us", "t_shared_us"):
        assert e["est_time_us"] >= e[term] * (1 - 1e-9)
    assert 0 < e["pct_of_peak"] <= 100 + 1e-6
    assert e["compulsory_bytes"] <= e["dram_bytes"] <= max(e["l2_bytes"], e["compulsory_bytes"]) * (1 + 1e-12)
    assert e["l2_bytes"] >= e["compulsory_bytes"] * (1 - 1e-12)
    assert 0 < e["sector_efficiency"] <= 1 + 1e-12
    tile = e["block_tile"]
    slices = math.ceil(k / math.ceil(k / config["split_k"]))  # split-K blocks each reduce a slice of K
    assert e["grid_blocks"] == math.ceil(m / tile["i"]) * math.ceil(n / tile["j"]) * slices
    assert 0 < e["wave_efficiency"] <= 1
    assert e["bound"] in ("compute", "dram", "l2", "shared", "latency")
    assert e["reason"] and e["symbolic"] == ""


def test_faster_memory_never_slows_an_estimate() -> None:
    f = sl.workloads.matmul(2048, 2048, 512, "float16")
    h100 = load("h100")
    fast = dataclasses.replace(h100, bandwidth_gbs=dataclasses.replace(h100.bandwidth_gbs, dram=2 * 3350.0))
    space = MATMUL.space(f, h100)
    for config in list(space.enumerate())[::37]:
        slow_t = sl.carver.estimate(f, h100, config)["est_time_us"]
        fast_t = sl.carver.estimate(f, fast, config)["est_time_us"]
        assert fast_t <= slow_t * (1 + 1e-12)


def test_tensor_core_peak_and_mma_alignment() -> None:
    rule = TensorCoreMatmul()
    f = sl.workloads.matmul(4096, 4096, 4096, "float16")
    config = dict(_config(128, 128, 16, 8, 8, 4), tensor_core=True)
    e = sl.carver.estimate(f, "h100", config, rule=rule)
    # H100's listed tensor peak is wgmma's; this mma.sync tiling is priced at the model's share of it.
    assert e["compute_unit"] == "tensor core float16 (mma.sync)" and e["peak_flops"] == 989.4e12 / 2
    # The product on tensor cores, the fp16 output cast (one instruction per element) on the FP32 lanes.
    assert e["t_compute_us"] == pytest.approx((2 * 4096**3 / 494.7e12 + 2 * 4096**2 / 66.9e12) * 1e6)
    a100 = sl.carver.estimate(f, "a100", config, rule=rule)
    assert a100["compute_unit"] == "tensor core float16" and a100["peak_flops"] == load("a100").peak_flops(
        "float16", True)
    assert e["aligned"], e["alignment"]
    # A k-step of 8 is half an m16n8k16 instruction (the trans_a layout keeps the sector rule out of it).
    ft = sl.workloads.matmul(4096, 4096, 4096, "float16", trans_a=True)
    e8 = sl.carver.estimate(ft, "h100", dict(_config(64, 64, 8, 4, 4, 2), tensor_core=True), rule=rule)
    assert "MMA k=16" in e8["alignment"]
    # V100 has fp16 tensor cores but none for bf16: the model falls back to SIMT and says so.
    fb = sl.workloads.matmul(1024, 1024, 1024, "bfloat16")
    eb = sl.carver.estimate(fb, "v100", dict(_config(64, 64, 16, 4, 4, 2), tensor_core=True), rule=rule)
    assert "no bfloat16 tensor cores" in eb["compute_unit"]


def test_a_tail_round_charges_dram_for_the_blocks_it_has() -> None:
    """Regression: the last partial round was charged DRAM bytes for ceil(rest / SMs) blocks on every SM,
    so one block more than the SMs (two per SM fitting) cost twice the bytes: 1.98x bytes/bandwidth."""
    h100 = load("h100")
    config = {"rows_per_block": 1, "threads_k": 512, "vector": 8}
    for n in (h100.sm_count + 1, 3 * h100.sm_count // 2, 2 * h100.sm_count):
        e = sl.carver.estimate(sl.workloads.gemv(n, 1 << 20, "float16"), h100, config)
        assert e["blocks_per_sm"] >= 2 and e["grid_blocks"] == n
        # one round, so the DRAM term is the bytes at full bandwidth; the latency floor (and the busiest SM
        # starting its two blocks one after the other) may exceed it
        starts = 2 * BLOCK_LAUNCH_S * 1e6
        assert e["est_time_us"] == pytest.approx(max(e["t_dram_us"], e["t_latency_us"] + starts), rel=1e-9)
        assert e["t_dram_us"] == pytest.approx(e["compulsory_bytes"] / h100.dram_bytes_per_s * 1e6, rel=0.01)


def test_a_longer_k_loop_never_lowers_the_predicted_throughput() -> None:
    """Regression: the L2 working set counted each block's whole K panel, so at K >> L2 every re-read of
    the same wave came from DRAM: 4096 x 4096 fp16 fell from ~810 to ~300 TFLOPS as K grew to 65536."""
    h100 = load("h100")
    rates = []
    for k in (1024, 4096, 16384, 65536):
        best = sl.carver.carve(sl.workloads.matmul(4096, 4096, k, "float16"), h100, topk=1).iloc[0]
        rates.append(best["flops"] / best["est_time_us"])
        assert best["dram_bytes"] < 3 * best["compulsory_bytes"]
    assert all(b >= a * 0.999 for a, b in itertools.pairwise(rates)), rates


@pytest.mark.parametrize(("small", "big", "target"), [
    ((128, 128, 16, "float16"), (128, 128, 32, "float16"), "h100"),
    ((64, 1024, 1024, "float16"), (256, 1024, 1024, "float16"), "h100"),
    ((256, 256, 256, "float32"), (256, 256, 512, "float32"), "a100"),
    ((512, 512, 512, "float32"), (1024, 512, 512, "float32"), "a100"),
], ids=["k16-k32-h100", "m64-m256-h100", "k256-k512-a100", "m512-m1024-a100"])
def test_one_config_on_a_bigger_problem_is_never_faster(small: tuple, big: tuple, target: str) -> None:
    """Regression: each round trip's latency was L2's or DRAM's by the share of all L2 traffic that hit,
    and blocks of one wave re-reading each other's tiles counted as hits: more blocks sharing A made every
    trip cheaper, so M=64 came out faster than M=1 with the same config (369 of 3113 configs on h100
    got faster when K doubled)."""
    profile = load(target)
    f_small, f_big = sl.workloads.matmul(*small), sl.workloads.matmul(*big)
    space_big = MATMUL.space(f_big, profile)
    checked = 0
    for config in list(MATMUL.space(f_small, profile).enumerate())[::5]:
        if not space_big.is_legal(config):
            continue
        a = sl.carver.estimate(f_small, profile, config)
        b = sl.carver.estimate(f_big, profile, config)
        if a["blocks_per_sm"] == 0:
            continue
        checked += 1
        assert b["est_time_us"] >= a["est_time_us"] * 0.999, (config, a["est_time_us"], b["est_time_us"])
    assert checked > 50


def test_the_vector_width_is_that_of_the_loads_carrying_the_traffic() -> None:
    """An int8-weight GEMV's fp32 per-row scale is not loaded in vectors: 8 int8/fp16 elements per thread are a
    16-byte access, not 8 x 4 bytes; the scale's share of the traffic is what makes it minor."""
    f = sl.workloads.gemv(14336, 4096, "float16", weight_dtype="int8")
    e = sl.carver.estimate(f, "h100", {"rows_per_block": 1, "threads_k": 256, "vector": 8}, rule="gemv")
    assert e["aligned"], e["alignment"]
    assert "not a 1/2/4/8/16-byte access" in sl.carver.estimate(
        sl.workloads.gemv(14336, 4096, "float32"), "h100", {"rows_per_block": 1, "threads_k": 256, "vector": 8},
        rule="gemv")["alignment"]


def test_pct_of_peak_is_one_scale_for_every_config_of_a_problem() -> None:
    """% of the card's peak for this problem (its useful flops at the fastest unit for its dtype, or its
    compulsory bytes at DRAM bandwidth), so it falls as the estimate grows: a SIMT fp16 matmul point is a few
    percent of an H100, not 78% of the SIMT peak it was measured against before."""
    import numpy as np

    df = sl.carver.carve(sl.workloads.matmul(4096, 4096, 4096, "float16"), "h100", None)
    assert np.all(np.diff(df["pct_of_peak"].to_numpy()) <= 1e-9)  # best first: never rising
    simt = df[df["config"].map(lambda c: c["tensor_core"] is False)]
    assert float(simt["pct_of_peak"].max()) < 10
    gemv = sl.carver.carve(sl.workloads.gemv(14336, 4096, "float16"), "h100", 1)
    assert float(gemv["pct_of_peak"].iloc[0]) == pytest.approx(100.0, abs=0.5)  # at its DRAM floor
