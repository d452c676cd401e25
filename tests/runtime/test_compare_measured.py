"""``sl.report.compare`` on its measured path (what the GPU suite runs), with the cupy stand-in of
``fake_cupy.py``: kernels run on the CPU emulator, and the events read a clock that advances 10 us per
operation (a launch, a vendor matmul, a host-side conversion or allocation).  So a time of exactly 10 us means
that one kernel, and nothing else, ran between the events; the launch log shows which input set each
repetition used.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from emu_kernels import needs_gxx
from fake_cupy import US_PER_OPERATION, install

import schedlib as sl
from schedlib.report import compare
from schedlib.runtime.timing import rotation_copies
from schedlib.suites import WorkloadSpec

pytestmark = needs_gxx
SMALL_L2 = 1 << 16  # 64 KiB, so that the flush buffer (1 MiB at least) is cheap to write on the host


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    return install(monkeypatch)


def _profile(l2_bytes: int) -> sl.hw.HardwareProfile:
    return dataclasses.replace(sl.hw.load("a100"), l2_bytes=l2_bytes)


def _a_buffers(state: SimpleNamespace) -> list[int]:
    """The address of the A argument of every launch, in order."""
    return [params[0].ctypes.data for _, _, _, params, _ in state.launches]


def test_a_measured_row_times_one_kernel_per_repetition_over_rotated_inputs(device: SimpleNamespace) -> None:
    spec = WorkloadSpec("matmul", {"M": 32, "N": 32, "K": 32, "dtype": "float32"}, "mm32")
    copies = rotation_copies(3 * 32 * 32 * 4, SMALL_L2)
    assert copies == 8  # 12 KiB of arrays against a 64 KiB L2
    df = compare([spec], _profile(SMALL_L2), methods=("rule", "vendor"), backend="gpu")
    rule, vendor = (df[df["method"] == m].iloc[0] for m in ("rule", "vendor"))
    assert rule["time_us"] == vendor["time_us"] == US_PER_OPERATION and rule["measured"]
    assert rule["source"] == "measured" and rule["speedup_vs_vendor"] == 1.0
    addresses = _a_buffers(device)
    # one checked launch on the first set, then warm-up and timed repetitions cycling over the 8 sets
    assert len(addresses) == 1 + 5 + 20 and len(set(addresses)) == copies
    cycle = addresses[1:1 + copies]
    assert len(set(cycle)) == copies and addresses[1:] == (cycle * 4)[:25]
    assert addresses[0] == cycle[0]


def test_inputs_larger_than_the_l2_are_not_copied(device: SimpleNamespace) -> None:
    spec = WorkloadSpec("matmul", {"M": 32, "N": 32, "K": 32, "dtype": "float32"}, "mm32")
    df = compare([spec], _profile(4096), methods=("rule",), backend="gpu")
    assert df["time_us"].iloc[0] == US_PER_OPERATION
    assert len(set(_a_buffers(device))) == 1


def test_a_kernel_that_computes_something_else_is_a_failed_row(device: SimpleNamespace,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The result is checked against the vendor's before anything is timed."""
    import cupy  # the stand-in

    monkeypatch.setattr(cupy, "matmul", lambda a, b: np.matmul(a, b) + 1.0)
    spec = WorkloadSpec("matmul", {"M": 32, "N": 32, "K": 32, "dtype": "float32"}, "mm32")
    df = compare([spec], _profile(SMALL_L2), methods=("rule",), backend="gpu")
    assert np.isnan(df["time_us"].iloc[0])
    assert df["source"].iloc[0].startswith("failed: RuntimeError: matmul: kernel result differs from the vendor")
    assert len(device.launches) == 1  # checked once, never timed
