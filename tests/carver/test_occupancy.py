"""Blocks per SM against the CUDA occupancy calculator's rules, worked out by hand per profile."""

from __future__ import annotations

import pytest

from schedlib.carver import occupancy
from schedlib.hw import load


def test_brief_example_h100_256_threads_64_registers_16k_shared() -> None:
    # 8 warps/block.  Registers: 64 x 32 = 2048 per warp (already a multiple of 256); each of the 4
    # sub-partitions holds 16384 / 2048 = 8 warps -> 32 warps/SM -> 4 blocks.  Shared: 16384 + 1024
    # reserve = 17408 (a multiple of 128) -> 233472 // 17408 = 13 blocks.  Warps: 64 / 8 = 8 blocks.
    occ = occupancy(load("h100"), 256, 64, 16384)
    assert (occ.by_warps, occ.by_registers, occ.by_shared, occ.by_blocks) == (8, 4, 13, 32)
    assert occ.blocks_per_sm == 4 and occ.limiter == "registers"
    assert occ.warps_per_sm == 32 and occ.occupancy == 0.5
    assert occ.registers_per_warp == 2048 and occ.shared_per_block == 17408


def test_one_register_more_loses_a_whole_block() -> None:
    # 65 x 32 = 2080 -> rounded to 2304 per warp; 16384 // 2304 = 7 warps per sub-partition -> 28 -> 3 blocks.
    occ = occupancy(load("h100"), 256, 65, 16384)
    assert occ.registers_per_warp == 2304 and occ.by_registers == 3 and occ.blocks_per_sm == 3


def test_a100_register_heavy_block() -> None:
    # 255 x 32 = 8160 -> 8192 per warp; 2 warps per sub-partition -> 8 warps/SM -> 2 blocks of 4 warps.
    occ = occupancy(load("a100"), 128, 255, 0)
    assert occ.by_registers == 2 and occ.blocks_per_sm == 2 and occ.limiter == "registers"
    # No shared memory still costs the 1 KiB driver reserve per block: 167936 // 1024 = 164.
    assert occ.by_shared == 164


def test_a100_shared_limited() -> None:
    # 49152 + 1024 = 50176 (a multiple of 128); 167936 // 50176 = 3.  Registers allow 16 blocks.
    occ = occupancy(load("a100"), 128, 32, 49152)
    assert occ.by_shared == 3 and occ.by_registers == 16 and occ.blocks_per_sm == 3 and occ.limiter == "shared"


def test_rtx4090_cases_match_published_worked_examples() -> None:
    p = load("rtx4090")
    # 40000 B static + 1024 reserve = 41024 -> 41088 after 128-byte rounding; 102400 // 41088 = 2.
    assert occupancy(p, 64, 16, 40000).by_shared == 2
    # 128 regs, 2 warps: 4096 per warp, 4 warps per sub-partition -> 16 warps/SM -> 8 blocks.
    assert occupancy(p, 64, 128, 0).by_registers == 8
    # 40 regs: 1280 per warp, 12 per sub-partition -> 48 warps/SM -> 48 one-warp blocks, capped at 24/SM.
    occ = occupancy(p, 32, 40, 0)
    assert occ.by_registers == 48 and occ.blocks_per_sm == 24 and occ.limiter == "blocks"


def test_warp_and_block_limits() -> None:
    h100 = load("h100")
    occ = occupancy(h100, 1024, 32, 0)  # 32 warps: 2 blocks by warps; registers allow 2 as well
    assert occ.by_warps == 2 and occ.blocks_per_sm == 2 and occ.limiter == "warps"
    occ = occupancy(h100, 32, 16, 0)  # tiny blocks: the 32-blocks-per-SM cap binds
    assert occ.blocks_per_sm == 32 and occ.limiter == "blocks"
    occ = occupancy(load("t4"), 1024, 32, 0)  # T4 holds 1024 threads per SM
    assert occ.by_warps == 1 and occ.blocks_per_sm == 1


def test_launch_that_does_not_fit_reports_zero() -> None:
    # 66 registers -> 2304 per warp; the hardware check rounds 32 warps up to a multiple of 4 and needs
    # 2304 x 32 = 73728 > 65536 registers per block, so the launch fails.
    occ = occupancy(load("h100"), 1024, 66, 0)
    assert occ.by_registers == 0 and not occ.fits
    assert not occupancy(load("h100"), 128, 32, 232449).fits  # above the opt-in shared maximum
    assert not occupancy(load("h100"), 2048, 16, 0).fits  # above max_threads_per_block


def test_volta_has_no_shared_reserve() -> None:
    # V100: no per-block reserve, 256-byte allocation unit: 10000 -> 10240; 98304 // 10240 = 9.
    occ = occupancy(load("v100"), 64, 16, 10000)
    assert occ.shared_per_block == 10240 and occ.by_shared == 9


def test_rejects_empty_block() -> None:
    with pytest.raises(ValueError, match="occupancy: threads=0 must be positive"):
        occupancy(load("h100"), 0, 32, 0)
