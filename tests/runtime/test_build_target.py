"""``sl.build`` refuses a kernel its target cannot run: tensor-core instructions newer than the card."""

from __future__ import annotations

import pytest

import schedlib as sl

FP16 = sl.workloads.matmul(256, 256, 256, "float16")


@pytest.mark.parametrize(("scheduled_for", "target", "needs"), [
    ("h100", "a100", r"wgmma \(Hopper warpgroup MMA\), which needs sm_90a; target a100 is sm_80"),
    ("h100", "v100", r"wgmma .* target v100 is sm_70"),
    ("a100", "t4", r"mma.sync / cp.async, which needs sm_80\+; target t4 is sm_75"),
    ("a100", "sm_70", r"target sm_70 is sm_70"),
])
def test_a_kernel_newer_than_its_target_is_refused_with_the_way_out(scheduled_for: str, target: str,
                                                                    needs: str) -> None:
    sch = sl.rules.apply_default(FP16, scheduled_for)
    with pytest.raises(sl.BuildError, match=needs + r".*apply_default\(func, '?" + target):
        sl.build(sch, target)


@pytest.mark.parametrize("target", ["v100", "t4", "a100", "l4", "h100", "h200"])
def test_what_the_rules_pick_for_a_card_builds_for_it(target: str) -> None:
    for func in (FP16, sl.workloads.matmul(256, 256, 256), sl.workloads.softmax(64, 64)):
        assert sl.build(sl.rules.apply_default(func, target), target).launch


def test_an_mma_sync_kernel_runs_on_newer_cards() -> None:
    sch = sl.rules.apply_default(FP16, "a100")
    assert sl.build(sch, "h100").arch == "sm_90"
