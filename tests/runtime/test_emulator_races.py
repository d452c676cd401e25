"""Missing barriers on the emulator.  Its threads run one at a time between barriers, so a thread that reads
shared memory another thread writes, with no barrier between, reads the right value whenever the writer
happened to run first.  Checked runs (``bounds_check=True``) keep one order per block through every barrier
and warp operation, and alternate it by block: the first block runs its threads last-first, the second
first-first, and so on, so that the reader runs first in one of them and reads the poisoned (NaN) shared
memory.  Fast runs keep neither, and such a race can pass there."""

from __future__ import annotations

import numpy as np
import pytest
from emu_kernels import full, needs_gxx, poisoned

from schedlib.runtime.emulator import KernelLaunch, emulate

pytestmark = needs_gxx

THREADS = 64

RACES = r"""
extern "C" __global__ void __launch_bounds__(64) broadcast(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  SL_SHARED(float, s, 1);
  if (threadIdx.x == 0) s[0] = x[blockIdx.x * 64];
  SYNC_HERE
  y[blockIdx.x * 64 + threadIdx.x] = s[0];  // thread 0 wrote it: the lowest id
}
extern "C" __global__ void __launch_bounds__(64) after_barriers(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  SL_SHARED(float, s, 1);
  __syncthreads();  // releases: the order must hold after them too
  const float one = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  __syncthreads();
  if (threadIdx.x == 0) s[0] = x[blockIdx.x * 64];
  SYNC_HERE
  y[blockIdx.x * 64 + threadIdx.x] = s[0] * one;
}
extern "C" __global__ void __launch_bounds__(64) rotate(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  SL_SHARED(float, s, 64);
  const int t = threadIdx.x;
  s[t] = x[blockIdx.x * 64 + t];
  SYNC_HERE
  y[blockIdx.x * 64 + t] = s[(t + 1) % 64];  // the next thread wrote it: a higher id
}
"""


def _run(kernel: str, blocks: int, synced: bool, bounds: bool) -> tuple[np.ndarray, np.ndarray]:
    source = full(RACES.replace("SYNC_HERE", "__syncthreads();" if synced else ""))
    x = np.arange(1, blocks * THREADS + 1, dtype=np.float32)
    y = poisoned(blocks * THREADS)
    emulate(source, [KernelLaunch(kernel, (blocks, 1, 1), (THREADS, 1, 1), ("x", "y"))], {"x": x, "y": y},
            bounds_check=bounds)
    rows = x.reshape(blocks, THREADS)
    want = np.roll(rows, -1, axis=1) if kernel == "rotate" else np.repeat(rows[:, :1], THREADS, axis=1)
    return y.reshape(blocks, THREADS), want


@pytest.mark.parametrize("kernel", ["broadcast", "after_barriers", "rotate"])
def test_with_the_barrier_both_orders_give_the_answer(kernel: str) -> None:
    got, want = _run(kernel, blocks=4, synced=True, bounds=True)
    np.testing.assert_array_equal(got, want)


def test_a_race_on_a_value_the_lowest_thread_writes_shows_in_a_one_block_grid() -> None:
    got, _ = _run("broadcast", blocks=1, synced=False, bounds=True)
    assert np.isnan(got).any(), "the first block runs last-first, so some thread reads before thread 0 writes"


def test_the_order_holds_after_earlier_barriers_and_warp_operations() -> None:
    """The thread that completes a barrier used to run on first, so after one barrier thread 0 ran before every
    other thread of a last-first block, and a read of its write with no barrier passed."""
    got, _ = _run("after_barriers", blocks=1, synced=False, bounds=True)
    assert np.isnan(got[0, 1:]).all(), got


def test_a_race_on_values_higher_threads_write_shows_in_the_second_block() -> None:
    got, want = _run("rotate", blocks=2, synced=False, bounds=True)
    # last-first: every writer ran before its reader but thread 0, whom thread 63 reads
    np.testing.assert_array_equal(got[0, :-1], want[0, :-1])
    assert np.isnan(got[0, -1])
    assert np.isnan(got[1, :-1]).all(), "first-first: thread t reads s[t + 1] before thread t + 1 writes it"


def test_fast_runs_keep_one_order_and_can_miss_such_a_race() -> None:
    """What checked runs are for: the same racy kernel passes a fast run."""
    got, want = _run("broadcast", blocks=2, synced=False, bounds=False)
    np.testing.assert_array_equal(got, want)
