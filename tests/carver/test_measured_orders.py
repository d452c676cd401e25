"""Pairs of configs the first GPU run timed (NVIDIA H200, 2026-11-28, ``benchmarks/results/h200-2026-11-28.md``)
where the model ranked them the other way round or called them equal: the model must now order each pair as
the card did.  Times in the comments are the measured medians."""

from __future__ import annotations

import pytest

import schedlib as sl
from schedlib import workloads as wl

H200 = sl.hw.load("h200")


def estimate(func: sl.Func, config: dict) -> float:
    return float(sl.carver.estimate(func, H200, config)["est_time_us"])


@pytest.mark.parametrize(("func", "faster", "slower"), [
    # a row sum split 16 ways into 65,536 blocks of 64 threads (48.8 us) against one block per row (24.3 us)
    (wl.reduce(4096, 4096), {"rows_per_block": 1, "threads_k": 256, "vector": 4, "blocks_per_row": 1},
     {"rows_per_block": 1, "threads_k": 64, "vector": 4, "blocks_per_row": 16}),
    # 64 threads keep 35 MB of rows in flight, which L2 does not hold for the later passes (70.7 against 36.1 us)
    (wl.softmax(4096, 4096), {"threads": 512, "unroll": 4, "stage_row": False},
     {"threads": 64, "unroll": 4, "stage_row": False}),
    # 128 KB rows re-read from L2 unstaged (331.6 us) against staged in shared memory (276.9 us)
    (wl.rmsnorm(4096, 32000), {"threads": 1024, "unroll": 4, "stage_row": True},
     {"threads": 1024, "unroll": 4, "stage_row": False}),
], ids=["row-sum-split", "softmax-threads", "rmsnorm-staged"])
def test_the_model_orders_measured_pairs_as_the_card_did(func: sl.Func, faster: dict, slower: dict) -> None:
    assert estimate(func, faster) < estimate(func, slower)


def test_the_carver_no_longer_splits_rows_that_fill_the_card() -> None:
    """Its top-1 was 1024 blocks per row (2546 us measured against the rule's 24.3 us)."""
    ranked = sl.carver.carve(wl.reduce(4096, 4096), H200, 5)
    assert all(c["blocks_per_row"] == 1 for c in ranked["config"]), ranked["config"].tolist()


def test_equal_estimates_go_to_the_deeper_k_step() -> None:
    """fp16 4096^3 on wgmma_tma: block_k 64 ran 195.7 us, 32 ran 231.9 us; the model calls them equal."""
    func = wl.matmul(4096, 4096, 4096, "float16")
    top = sl.carver.carve(func, H200, 1)["config"].iloc[0]
    deeper, shallower = dict(top), {**top, "block_k": 32}
    assert top["block_k"] == 64
    assert estimate(func, deeper) == pytest.approx(estimate(func, shallower))
