"""Hopper mbarrier phases and TMA tensor copies in the emulator.

The expected shared-memory images are built here in numpy from the layout TMA is specified to write (the box
row-major, 16-byte chunk c of each swizzle row at c ^ (that row's pattern index), zeros outside the tensor),
not from the emulator's address-bit formula.
"""

from __future__ import annotations

import numpy as np
import pytest
from emu_kernels import full, needs_gxx
from test_emulator_wgmma import pattern_row

from schedlib.codegen.kernel_spec import TensorMapSpec
from schedlib.errors import EmulatorError, ShapeError
from schedlib.runtime.emulator import KernelLaunch, emulate
from schedlib.runtime.tensor_map import geometry

pytestmark = needs_gxx

# Thread 0 makes the barrier; the LAST thread requests the box, so every other thread reaches the wait first
# and must sleep until the copy completes the phase.  Then the block copies the shared image out.
COPY = r"""
extern "C" __global__ void tma_copy(SL_GLOBAL(const half) X, SL_GLOBAL(half) out, int n,
                                    SL_GLOBAL(const unsigned long long) tmap, int c0, int c1, int c2, int bytes,
                                    int parity) {
  SL_DYN_SHARED(smem);
  SL_SHARED_VIEW(half, tile, smem, 0, n);
  SL_SHARED_VIEW(unsigned long long, bar, smem, 2 * n, 1);
  if (threadIdx.x == 0) { sl_mbar_init(&bar[0], 1); sl_mbar_init_fence(); sl_tmap_acquire(&tmap[0]); }
  __syncthreads();
  if (threadIdx.x == blockDim.x - 1) {
    sl_mbar_expect_tx(&bar[0], bytes);
    sl_tma_load_3d(&tile[0], &tmap[0], c0, c1, c2, &bar[0]);
  }
  sl_mbar_wait(&bar[0], parity);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = tile[i];
}
"""


def expected_image(x: np.ndarray, origin: tuple[int, int, int], box: tuple[int, int, int], swizzle: int
                   ) -> np.ndarray:
    """The box of ``x`` (viewed [batch, rows, cols]) at ``origin`` (cols, rows, batch), zero outside, as TMA
    lays it out in shared memory with a ``swizzle``-byte pattern."""
    x3 = x.reshape((-1, *x.shape[-2:])) if x.ndim >= 2 else x.reshape(1, 1, -1)
    out = np.zeros((box[2], box[1], box[0]), x.dtype)
    for b in range(box[2]):
        for r in range(box[1]):
            for c in range(box[0]):
                g = (origin[2] + b, origin[1] + r, origin[0] + c)
                if all(0 <= v < s for v, s in zip(g, x3.shape)):
                    out[b, r, c] = x3[g]
    flat = out.reshape(-1)
    if not swizzle:
        return flat
    chunks = flat.reshape(-1, swizzle // 16, 8)  # rows of `swizzle` bytes, 16-byte chunks of 8 halves
    result = np.empty_like(chunks)
    for row in range(chunks.shape[0]):
        for ch in range(chunks.shape[1]):
            result[row, ch ^ pattern_row(row, swizzle)] = chunks[row, ch]
    return result.reshape(-1)


def run_copy(x: np.ndarray, origin: tuple[int, int, int], box: tuple[int, int, int], swizzle: int, *,
             parity: int = 0, announce: int | None = None, threads: int = 64) -> np.ndarray:
    n = int(np.prod(box))
    out = np.full(n, np.nan, np.float16)
    req = TensorMapSpec("tmap", "X", "float16", box, swizzle)
    args = {"X": x, "out": out, "n": n, "tmap": req, "c0": origin[0], "c1": origin[1], "c2": origin[2],
            "bytes": 2 * n if announce is None else announce, "parity": parity}
    params = ("X", "out", "n", "tmap", "c0", "c1", "c2", "bytes", "parity")
    emulate(full(COPY), [KernelLaunch("tma_copy", (1, 1, 1), (threads, 1, 1), params, 2 * n + 8)], args,
            bounds_check=True)
    return out


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_a_box_lands_swizzled_with_zeros_outside(swizzle: int) -> None:
    rng = np.random.default_rng(swizzle)
    x = rng.standard_normal((2, 40, 72)).astype(np.float16)  # batch 2, 40 rows of 72 (144-byte rows)
    cols = swizzle // 2 if swizzle else 24
    for origin in ((0, 0, 0), (64 - cols // 2, 32, 1), (-8, -3, 0)):  # inside, over the far edges, before 0
        box = (cols, 16, 1)
        got = run_copy(x, origin, box, swizzle)
        np.testing.assert_array_equal(got, expected_image(x, origin, box, swizzle), err_msg=f"{origin}")


def test_a_batch_of_boxes_and_two_dimensional_tensors() -> None:
    x = np.arange(48 * 16, dtype=np.float16).reshape(48, 16) / 64
    got = run_copy(x, (8, 40, 0), (8, 16, 1), 0)  # rows 40..55 of 48: the last 8 are zeros
    np.testing.assert_array_equal(got, expected_image(x, (8, 40, 0), (8, 16, 1), 0))
    y = np.arange(3 * 8 * 32, dtype=np.float16).reshape(3, 8, 32) / 256
    got = run_copy(y, (0, 0, 1), (32, 8, 2), 64)  # batch 1 and 2 (2 past the end: zeros)
    np.testing.assert_array_equal(got, expected_image(y, (0, 0, 1), (32, 8, 2), 64))


def test_waiting_for_a_phase_nobody_completes_is_a_deadlock() -> None:
    x = np.ones((16, 64), np.float16)
    with pytest.raises(EmulatorError, match="wait on an mbarrier phase that no arrival or copy completes"):
        run_copy(x, (0, 0, 0), (64, 16, 1), 128, parity=1)  # the second phase never comes
    with pytest.raises(EmulatorError, match="mbarrier phase"):
        run_copy(x, (0, 0, 0), (64, 16, 1), 128, announce=4096)  # announces more bytes than the box brings


def test_a_swizzle_needs_rows_of_its_width() -> None:
    with pytest.raises(EmulatorError, match="a 128-byte swizzle needs boxes whose rows are exactly that wide"):
        run_copy(np.ones((16, 64), np.float16), (0, 0, 0), (32, 16, 1), 128)


def test_tensor_maps_need_whole_16_byte_rows() -> None:
    assert geometry((2, 40, 72), 2, "X") == ((72, 40, 2), (144, 5760))
    assert geometry((64,), 2, "v") == ((64, 1, 1), (128, 128))
    with pytest.raises(ShapeError, match=r"rows of 36 elements \(72 bytes\) are not whole 16-byte units"):
        geometry((8, 36), 2, "X")
    with pytest.raises(ShapeError, match="at most 3 dimensions"):
        geometry((2, 2, 8, 8), 2, "X")
