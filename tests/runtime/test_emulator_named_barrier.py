"""Named barriers (``sl_named_barrier<ID, COUNT>``, PTX ``bar.sync ID, COUNT``) on the emulator: only the
threads that arrive wait for each other, each barrier is reusable, and the ways to misuse one are reported
(a count never reached, a count larger than the block, the ID of ``__syncthreads``)."""

from __future__ import annotations

import numpy as np
import pytest
from emu_kernels import full, needs_gxx, poisoned

from schedlib.errors import EmulatorError
from schedlib.runtime.emulator import KernelLaunch, emulate

pytestmark = needs_gxx

THREADS = 128

# Two groups of two warps, each rotating its 64 values through shared memory twice behind its own barrier;
# `groups_then_exit` lets the second group leave at once, as a producer warpgroup does once its work is done.
KERNELS = r"""
extern "C" __global__ void __launch_bounds__(128) two_groups(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  SL_SHARED(float, s, 128);
  const int t = threadIdx.x, base = t & ~63, at = blockIdx.x * 128;
  float v = x[at + t];
  for (int round = 0; round < 2; ++round) {  // the second round reuses both barriers
    s[t] = v;
    if (t < 64) { SYNC_A } else { SYNC_B }
    v = s[base + ((t - base + 1) & 63)];
    if (t < 64) { SYNC_A } else { SYNC_B }  // everyone has read before the next round writes
  }
  y[at + t] = v;
}
extern "C" __global__ void __launch_bounds__(128) groups_then_exit(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  SL_SHARED(float, s, 64);
  const int t = threadIdx.x, at = blockIdx.x * 128;
  if (t >= 64) return;
  s[t] = x[at + t];
  SYNC_A
  y[at + t] = s[(t + 1) & 63];
}
extern "C" __global__ void __launch_bounds__(128) count_too_high(SL_GLOBAL(float) y) {
  if (threadIdx.x < 64) sl_named_barrier<1, 96>();
  y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void __launch_bounds__(128) count_over_block(SL_GLOBAL(float) y) {
  sl_named_barrier<3, 256>();
  y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void __launch_bounds__(128) exited_lanes(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  SL_SHARED(float, s, 64);
  const int t = threadIdx.x, at = blockIdx.x * 128;
  if (t >= 48) return;  // warp 1 arrives with its 16 lanes that have not exited, and counts 32
  s[t] = x[at + t];
  sl_named_barrier<1, 64>();
  y[at + t] = s[(t + 1) % 48];
}
extern "C" __global__ void __launch_bounds__(128) half_warps(SL_GLOBAL(float) y) {
  if ((threadIdx.x & 31) < 16) sl_named_barrier<1, 32>();  // 16 lanes of each warp: 64 threads, no whole warp
  __syncthreads();  // the other lanes have not exited
  y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void __launch_bounds__(128) whole_and_half(SL_GLOBAL(float) y) {
  if (threadIdx.x < 32 || (threadIdx.x & 31) < 16) sl_named_barrier<1, 32>();  // warp 0 completes it
  __syncthreads();
  y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void __launch_bounds__(128) two_counts(SL_GLOBAL(float) y) {
  if (threadIdx.x < 32) sl_named_barrier<1, 64>();
  else if (threadIdx.x < 64) sl_named_barrier<1, 96>();
  y[threadIdx.x] = 1.0f;
}
"""
SYNCED = {"SYNC_A": "sl_named_barrier<1, 64>();", "SYNC_B": "sl_named_barrier<2, 64>();"}


def _source(synced: bool) -> str:
    text = KERNELS
    for mark, call in SYNCED.items():
        text = text.replace(mark, call if synced else "")
    return full(text)


def _run(kernel: str, blocks: int, synced: bool, bounds: bool) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(1, blocks * THREADS + 1, dtype=np.float32)
    y = poisoned(blocks * THREADS)
    emulate(_source(synced), [KernelLaunch(kernel, (blocks, 1, 1), (THREADS, 1, 1), ("x", "y"))],
            {"x": x, "y": y}, bounds_check=bounds)
    groups = x.reshape(blocks, 2, 64)
    shift = 2 if kernel == "two_groups" else 1  # two rounds of one place each
    want = np.roll(groups, -shift, axis=2).reshape(blocks, THREADS)
    return y.reshape(blocks, THREADS), want


@pytest.mark.parametrize("bounds", [True, False])
def test_each_group_waits_for_its_own_threads_only(bounds: bool) -> None:
    got, want = _run("two_groups", blocks=2, synced=True, bounds=bounds)
    np.testing.assert_array_equal(got, want)


def test_threads_outside_the_count_may_exit() -> None:
    got, want = _run("groups_then_exit", blocks=2, synced=True, bounds=True)
    np.testing.assert_array_equal(got[:, :64], want[:, :64])
    assert np.isnan(got[:, 64:]).all()


def test_without_the_barriers_a_checked_run_reads_unwritten_shared_memory() -> None:
    """Thread t reads what thread t + 1 wrote: in the block that runs first-first it reads it too early."""
    got, _ = _run("groups_then_exit", blocks=2, synced=False, bounds=True)
    assert np.isnan(got[1, :63]).all(), got[1, :64]


def test_a_count_the_threads_never_reach_is_a_reported_deadlock() -> None:
    with pytest.raises(EmulatorError) as err:
        emulate(_source(True), [KernelLaunch("count_too_high", (1, 1, 1), (THREADS, 1, 1), ("y",))],
                {"y": poisoned(THREADS)})
    msg = str(err.value)
    assert "kernel 'count_too_high' block (0,0,0)" in msg and "deadlock" in msg, msg
    assert "64 thread(s) wait at a named barrier" in msg and "barrier 1)" in msg, msg
    assert "64 thread(s) already exited" in msg, msg


def test_a_count_over_the_block_size_is_refused() -> None:
    with pytest.raises(EmulatorError, match=r"sl_named_barrier<3, 256>: counts more threads than the block's 128"):
        emulate(_source(True), [KernelLaunch("count_over_block", (1, 1, 1), (THREADS, 1, 1), ("y",))],
                {"y": poisoned(THREADS)})


@pytest.mark.parametrize(("call", "why"), [("sl_named_barrier<0, 64>()", "barrier 0 is __syncthreads'"),
                                           ("sl_named_barrier<1, 48>()", "counts whole warps")])
def test_the_barrier_id_and_count_are_checked_when_compiled(call: str, why: str) -> None:
    source = full('extern "C" __global__ void bad(SL_GLOBAL(float) y) { ' + call + "; y[threadIdx.x] = 1.0f; }")
    with pytest.raises(EmulatorError, match=rf"(?s)g\+\+ failed.*{why}"):
        emulate(source, [KernelLaunch("bad", (1, 1, 1), (64, 1, 1), ("y",))], {"y": poisoned(64)})


@pytest.mark.parametrize(("kernel", "block", "message"), [
    ("half_warps", THREADS, r"deadlock.* 64 thread\(s\) wait at a named barrier \(sl_named_barrier\) for warps "
                            r"that never arrive \(first \(\d+,0,0\), barrier 1\)"),
    ("whole_and_half", 64, r"sl_named_barrier<1, 32>: completed while lanes of warp 1 wait there without thread "
                           r"\(48,0,0\) \(a named barrier counts whole warps"),
    ("two_counts", THREADS, r"sl_named_barrier<1, (64|96)>: other threads wait at barrier 1 with count (64|96)"),
    ("count_over_block", 48, r"sl_named_barrier<3, 256>: the emulator models named barriers in blocks of whole "
                             r"warps, not 48 threads"),
])
def test_what_the_gpu_leaves_undefined_is_refused(kernel: str, block: int, message: str) -> None:
    with pytest.raises(EmulatorError, match=message):
        emulate(_source(True), [KernelLaunch(kernel, (1, 1, 1), (block, 1, 1), ("y",))], {"y": poisoned(block)},
                bounds_check=True)


@pytest.mark.parametrize("bounds", [True, False])
def test_a_warp_arrives_with_the_lanes_it_has_left(bounds: bool) -> None:
    """Warp 1's lanes 48..63 exit before or after its lanes 32..47 arrive, depending on the order the threads
    run in (last-first in the checked run's first block, first-first in its second, the queue's order in a
    fast run): either way the warp arrives, as on the GPU."""
    x = np.arange(1, 2 * THREADS + 1, dtype=np.float32)
    y = poisoned(2 * THREADS)
    emulate(_source(True), [KernelLaunch("exited_lanes", (2, 1, 1), (THREADS, 1, 1), ("x", "y"))],
            {"x": x, "y": y}, bounds_check=bounds)
    for at in (0, THREADS):
        np.testing.assert_array_equal(y[at:at + 48], np.roll(x[at:at + 48], -1))
