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


def _staged_rows(cols: int) -> sl.Schedule:
    """Each block copies a whole row of ``cols`` floats to shared memory."""
    X = sl.placeholder((4, cols), "float32", "X")
    s = sl.Schedule(sl.func([X, sl.compute((4, cols), lambda i, j: X[i, j] * 2.0, "Y")], "staged"))
    i, _ = s.get_loops("Y")
    s.bind(i, "blockIdx.x")
    s.compute_at(s.cache_read("Y", "X", "shared"), i)
    return s


def test_a_kernel_needing_more_shared_memory_than_the_target_has_is_refused() -> None:
    s = _staged_rows(45_000)  # 180,000 bytes: more than a T4 (64 KiB) or an A100 (163 KiB) gives a block
    for target, limit in (("t4", "65,536"), ("a100", "166,912")):
        with pytest.raises(sl.BuildError, match=rf"needs 180,000 bytes of shared memory per block; target "
                                                rf"{target} allows {limit}"):
            sl.build(s, target)
    assert sl.build(s, "h100").launch[0].dynamic_smem == 180_000  # 227 KiB with the opt-in


@pytest.mark.nvcc
def test_the_compile_report_counts_dynamic_shared_memory() -> None:
    from schedlib.runtime.nvcc import find_nvcc

    if find_nvcc() is None:
        pytest.skip("needs nvcc")
    kernel = sl.build(_staged_rows(20_000), "h100")
    report = kernel.compile_check("sm_90")
    assert report.kernels["staged_Y"].shared_dynamic_bytes == 80_000 == report.shared_dynamic_bytes
    with pytest.raises(sl.CompileError, match=r"arch=90 must be an architecture name such as 'sm_90'"):
        kernel.compile_check(90)  # type: ignore[arg-type]
