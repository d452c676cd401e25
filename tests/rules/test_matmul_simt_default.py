"""The SIMT matmul's default tile: how it sizes blocks against the SMs.  Short of a wave, small tiles with deep
k steps (latency); with enough blocks, the tile whose busiest SM has the least work (balance).  Checked against
the carver's estimates, which model both."""

from __future__ import annotations

import pytest

import schedlib as sl
from schedlib import workloads as wl
from schedlib.rules import get_rule
from schedlib.rules.matmul_simt import balanced_tile

MATMUL = get_rule("matmul")
H100 = sl.hw.load("h100")
A100 = sl.hw.load("a100")


@pytest.mark.parametrize(("shape", "tile"), [
    ((256, 256, 256), (16, 16, 32, 2, 2)),  # 256 blocks of 64 threads instead of 64 blocks of 256
    ((512, 512, 2047), (32, 32, 32, 4, 4)),  # (K = 8192 would split K instead: test_matmul_split_k)
    ((77, 333, 129), (16, 16, 32, 2, 2)),
    ((1024, 1024, 1024), (64, 64, 8, 8, 8)),  # a 64x64 tile keeps its 8-deep step (no estimated gain)
    ((4096, 4096, 4096), (128, 128, 16, 8, 8)),  # more than a wave: 16-deep single-buffered steps
])
def test_small_fp32_grids_get_small_tiles_and_deep_k_steps(shape: tuple[int, int, int],
                                                           tile: tuple[int, ...]) -> None:
    """Short of a wave of blocks, a block's k loop is the kernel's time and each k step waits on a global
    round trip: the default spreads smaller tiles over more SMs and takes 32-deep steps."""
    f = wl.matmul(*shape)
    c = MATMUL.default_config(f, H100)
    assert (c["block_m"], c["block_n"], c["block_k"], c["thread_m"], c["thread_n"]) == tile, c
    m, n, _ = shape
    blocks = -(-m // c["block_m"]) * -(-n // c["block_n"])
    assert c["stages"] == (2 if blocks < 2 * H100.sm_count else 1) and MATMUL.space(f, H100).is_legal(c)
    assert -(-m // c["block_m"]) * -(-n // c["block_n"]) >= min(H100.sm_count, -(-m // 16) * -(-n // 16) // 2)


def test_the_deep_small_tile_default_is_the_faster_by_the_carver() -> None:
    f = wl.matmul(256, 256, 256)
    new = MATMUL.default_config(f, H100)
    old = {**new, "block_m": 32, "block_n": 32, "block_k": 8, "vector": 1}  # the default before
    assert MATMUL.space(f, H100).is_legal(old)
    est_new = sl.carver.estimate(f, "h100", new)["est_time_us"]
    est_old = sl.carver.estimate(f, "h100", old)["est_time_us"]
    assert est_new < est_old / 3, (est_new, est_old)


@pytest.mark.parametrize(("shape", "sms", "tile", "want"), [
    ((1024, 1024, 1), 108, (64, 128), (64, 64)),  # 128 blocks: 20 SMs run two; 256 of 64x64 run at most three
    ((4096, 4096, 1), 132, (128, 128), (128, 128)),  # 1024 blocks: 8 per SM either way, the larger tile stays
    ((4096, 4096, 1), 108, (128, 128), (128, 64)),  # 10 x 16384 outputs on the busiest SM -> 19 x 8192
    ((1536, 1536, 1), 132, (128, 128), (64, 64)),  # 144 blocks on 132 SMs: two rounds of 128x128 for 12 SMs
    ((512, 512, 1), 132, (64, 64), (64, 64)),  # 64 blocks, short of a wave: latency-bound, kept
    ((1024, 1024, 1), 108, (32, 64), (32, 64)),  # already small: kept
])
def test_balanced_tile_evens_out_the_busiest_sm(shape: tuple[int, int, int], sms: int, tile: tuple[int, int],
                                                want: tuple[int, int]) -> None:
    m, n, batch = shape
    assert balanced_tile(m, n, batch, sms, tile) == want


@pytest.mark.parametrize(("shape", "target"), [((1024, 1024, 1024), "a100"), ((1536, 1536, 1536), "h100"),
                                               ((2048, 2048, 512), "a100")])
def test_the_balanced_default_is_the_faster_by_the_carver(shape: tuple[int, int, int], target: str) -> None:
    f = wl.matmul(*shape)
    profile = sl.hw.load(target)
    new = MATMUL.default_config(f, profile)
    old = {**new, "block_m": 128 if shape[0] > 1024 else 64, "block_n": 128}  # the unbalanced tile before
    assert MATMUL.space(f, profile).is_legal(old) and new != old
    assert sl.carver.estimate(f, target, new)["est_time_us"] < 0.9 * sl.carver.estimate(f, target, old)["est_time_us"]
