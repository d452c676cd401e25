"""``setmaxnreg`` on the emulator: the registers themselves are not modelled, but the CTA's pool is, so that a
split that does not add up hangs (is reported) here as it would hang on the GPU, where ptxas checks nothing
of it.  A block of 384 threads starts with 168 registers per thread (what ptxas gives such a kernel under
``__launch_bounds__(384, 1)``): one warpgroup going down to 40 frees 128 x 128 registers, enough for two
warpgroups to go up to 232."""

from __future__ import annotations

import numpy as np
import pytest
from emu_kernels import full, needs_gxx, poisoned

from schedlib.errors import EmulatorError
from schedlib.runtime.emulator import KernelLaunch, emulate

pytestmark = needs_gxx

THREADS = 384

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(384, 1) split(SL_GLOBAL(float) y) {
  const int group = threadIdx.x / 128;
  if (group == 2) {
    DEC
  } else {
    INC
  }
  y[threadIdx.x] = (float)group;
}
"""


def _run(dec: str, inc: str, threads: int = THREADS) -> np.ndarray:
    y = poisoned(threads)
    source = full(KERNEL.replace("DEC", dec).replace("INC", inc))
    emulate(source, [KernelLaunch("split", (2, 1, 1), (threads, 1, 1), ("y",))], {"y": y}, bounds_check=True)
    return y


def test_the_cutlass_split_completes() -> None:
    y = _run("sl_setmaxnreg_dec<40>();", "sl_setmaxnreg_inc<232>();")
    np.testing.assert_array_equal(y, np.repeat(np.arange(3, dtype=np.float32), 128))


@pytest.mark.parametrize(("dec", "inc"), [
    ("sl_setmaxnreg_dec<40>();", "sl_setmaxnreg_inc<240>();"),  # 2 x 128 x 72 > 128 x 128
    ("", "sl_setmaxnreg_inc<232>();"),  # nobody gives registers back
    ("if (threadIdx.x % 128 < 32) sl_setmaxnreg_dec<40>();", "sl_setmaxnreg_inc<232>();"),  # one warp of four
])
def test_a_split_that_does_not_add_up_is_a_reported_deadlock(dec: str, inc: str) -> None:
    with pytest.raises(EmulatorError, match=r"deadlock.*thread\(s\) wait in setmaxnreg"):
        _run(dec, inc)


@pytest.mark.parametrize(("dec", "inc", "message"), [
    ("sl_setmaxnreg_dec<40>();", "if (threadIdx.x % 128 < 64) sl_setmaxnreg_inc<232>(); "
     "else sl_setmaxnreg_inc<224>();",
     r"setmaxnreg.inc 2\d\d: other threads of warpgroup \d wait in setmaxnreg.inc 2\d\d \(every thread"),
    ("sl_setmaxnreg_dec<40>();", "sl_setmaxnreg_inc<160>();",
     r"setmaxnreg.inc 160: warpgroup \d has 168 registers per thread; inc may not lower them"),
    ("sl_setmaxnreg_dec<176>();", "", r"setmaxnreg.dec 176: warpgroup 2 has 168 registers per thread"),
])
def test_what_ptx_leaves_undefined_is_refused(dec: str, inc: str, message: str) -> None:
    with pytest.raises(EmulatorError, match=message):
        _run(dec, inc)


def test_a_block_of_part_warpgroups_is_refused() -> None:
    with pytest.raises(EmulatorError, match=r"setmaxnreg.dec 40: needs a block of whole warpgroups \(128 threads\), "
                                             r"not 320"):
        _run("sl_setmaxnreg_dec<40>();", "", threads=320)


@pytest.mark.parametrize("count", [16, 260, 100])
def test_the_count_is_checked_when_compiled(count: int) -> None:
    with pytest.raises(EmulatorError, match=r"(?s)g\+\+ failed.*setmaxnreg takes a multiple of 8 in \[24, 256\]"):
        _run(f"sl_setmaxnreg_dec<{count}>();", "")


ORDER = r"""
extern "C" __global__ void __launch_bounds__(384, 1) order(SL_GLOBAL(int) seen, SL_GLOBAL(int) next) {
  if (threadIdx.x >= 256) sl_setmaxnreg_dec<40>(); else sl_setmaxnreg_inc<232>();
  seen[atomicAdd(&next[0], 1)] = threadIdx.x;  // the order the threads run on in
}
"""


def test_a_checked_run_keeps_the_block_order_through_setmaxnreg() -> None:
    """A checked run's one-block grid runs last-first; a warpgroup released from setmaxnreg runs on in that order
    (a race behind it would otherwise see a different order than behind any other barrier)."""
    seen, counter = np.full(THREADS, -1, np.int32), np.zeros(1, np.int32)
    emulate(full(ORDER), [KernelLaunch("order", (1, 1, 1), (THREADS, 1, 1), ("seen", "next"))],
            {"seen": seen, "next": counter}, bounds_check=True)
    assert sorted(seen) == list(range(THREADS))
    for group in range(3):
        mine = [t for t in seen if t // 128 == group]
        assert mine == sorted(mine, reverse=True), (group, mine[:8])
