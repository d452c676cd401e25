"""Hopper wgmma.mma_async in the emulator, against the PTX ISA's shared-memory layouts and fragment layout.

The shared-memory images are built here in numpy from the layouts as the PTX ISA and TMA draw them (a swizzled
tile is rows of W bytes whose 16-byte chunk c sits at c ^ (its row's pattern index)), not from the emulator's
address-bit formula; the accumulators come back raw per thread and are placed here by the ISA's formula
(row 16w + l/4 + 8*((j%4)/2), column 8*(j/4) + 2*(l%4) + j%2). An emulator that is self-consistent but disagrees
with either layout fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from emu_kernels import bf16_bits, bf16_float, full, needs_gxx, poisoned

from schedlib.errors import EmulatorError
from schedlib.runtime.emulator import KernelLaunch, emulate

pytestmark = needs_gxx

# Copies a prepared image into dynamic shared memory, then runs `steps` wgmma k16 steps whose descriptors advance
# by adv_a / adv_b (already >> 4), and writes each thread's raw accumulators. Warpgroup g reads A at
# desc_a + g * group_a (its own 64 rows).
KERNEL = r"""
template <int N, int TA, int TB, int BF>
__device__ void wg_body(SL_GLOBAL(const uint4) image, int words, SL_GLOBAL(float) out,
                        unsigned long long da, unsigned long long db, int steps, int adv_a, int adv_b, int group_a,
                        int wait_early) {
  SL_DYN_SHARED(smem);
  const int tid = threadIdx.x;
  for (int i = tid; i < words; i += blockDim.x) SL_VSTORE(uint4, smem, 16 * i, image[i]);
  sl_fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  for (int j = 0; j < N / 2; ++j) d[j] = 1.0f;  // D starts at 1: the product is added to it
  const unsigned long long a0 = da + (unsigned long long)((tid / 128) * group_a);
  sl_wgmma_fence();
  for (int s = 0; s < steps; ++s) {
    const unsigned long long a = a0 + (unsigned long long)(s * adv_a), b = db + (unsigned long long)(s * adv_b);
    if (BF) sl_wgmma_bf16<N, TA, TB>(d, a, b); else sl_wgmma_f16<N, TA, TB>(d, a, b);
  }
  sl_wgmma_commit();
  if (wait_early) {  // read the accumulators before the wait: on the GPU undefined, here the old values
    for (int j = 0; j < N / 2; ++j) out[tid * (N / 2) + j] = d[j];
    sl_wgmma_wait<0>();
    return;
  }
  sl_wgmma_wait<0>();
  for (int j = 0; j < N / 2; ++j) out[tid * (N / 2) + j] = d[j];
}
"""
DISPATCH = r"""
template <int N, int TA, int TB> inline void sl_wgmma_f16(float* d, unsigned long long a, unsigned long long b) {
  if (N == 64) sl_wgmma_n64_f16<TA, TB>(d, a, b); else sl_wgmma_n128_f16<TA, TB>(d, a, b);
}
template <int N, int TA, int TB> inline void sl_wgmma_bf16(float* d, unsigned long long a, unsigned long long b) {
  if (N == 64) sl_wgmma_n64_bf16<TA, TB>(d, a, b); else sl_wgmma_n128_bf16<TA, TB>(d, a, b);
}
"""
ENTRY = r"""
extern "C" __global__ void wg_{name}(SL_GLOBAL(const uint4) image, int words, SL_GLOBAL(float) out,
    long long da, long long db, int steps, int adv_a, int adv_b, int group_a, int wait_early) {{
  wg_body<{n}, {ta}, {tb}, {bf}>(image, words, out, (unsigned long long)da, (unsigned long long)db, steps, adv_a,
                                 adv_b, group_a, wait_early);
}}
"""
SWIZZLE_MODE = {128: 1, 64: 2, 32: 3, 0: 0}


def pattern_row(row: np.ndarray | int, width: int) -> np.ndarray | int:
    """The XOR a swizzled row of ``width`` bytes applies to its chunk index (TMA / CuTe Swizzle<b,4,3>)."""
    return {128: row % 8, 64: (row % 8) // 2, 32: (row % 8) // 4}[width]


def k_major_image(x: np.ndarray, width: int) -> tuple[np.ndarray, int, int]:
    """x[mn, k] stored K-major; returns (byte offsets per element, LBO, SBO)."""
    mn, k = np.meshgrid(np.arange(x.shape[0]), np.arange(x.shape[1]), indexing="ij")
    if width:  # rows of `width` bytes (one swizzle atom across K), groups of 8 rows dense
        assert x.shape[1] * 2 == width
        chunk = (k * 2) // 16 ^ pattern_row(mn, width)
        return (mn // 8) * 8 * width + (mn % 8) * width + chunk * 16 + (k % 8) * 2, 16, 8 * width
    # interleaved: 8 x 16-byte core matrices, K-adjacent ones LBO apart, MN-adjacent ones SBO apart
    lbo, sbo = 128, 128 * (x.shape[1] // 8)
    return (mn // 8) * sbo + (k // 8) * lbo + (mn % 8) * 16 + (k % 8) * 2, lbo, sbo


def mn_major_image(x: np.ndarray, width: int) -> tuple[np.ndarray, int, int]:
    """x[mn, k] stored MN-major (mn contiguous); returns (byte offsets per element, LBO, SBO)."""
    mn, k = np.meshgrid(np.arange(x.shape[0]), np.arange(x.shape[1]), indexing="ij")
    groups = x.shape[1] // 8
    if width:  # atoms of (width / 2) mn x 8 k rows of `width` bytes; k groups SBO apart, mn atoms LBO apart
        per = width // 2
        sbo, lbo = 8 * width, 8 * width * groups
        chunk = ((mn % per) * 2) // 16 ^ pattern_row(k, width)
        return (mn // per) * lbo + (k // 8) * sbo + (k % 8) * width + chunk * 16 + (mn % 8) * 2, lbo, sbo
    lbo, sbo = 128, 128 * groups  # core matrices of 8 mn x 8 k: k groups LBO apart, mn groups SBO apart
    return (mn // 8) * sbo + (k // 8) * lbo + (k % 8) * 16 + (mn % 8) * 2, lbo, sbo


def descriptor(start: int, lbo: int, sbo: int, width: int) -> int:
    """The 64-bit descriptor, as the signed value with the same bits (kernel arguments travel as int64)."""
    bits = (start >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (SWIZZLE_MODE[width] << 62)
    return bits - (1 << 64) if bits >> 63 else bits


def place(image: np.ndarray, base: int, offsets: np.ndarray, bits: np.ndarray) -> None:
    flat = base + offsets.ravel()
    assert np.all(image[flat] == 0xFFFF), "two elements share a byte address"
    image[flat] = bits.ravel()


def run_wgmma(a_bits: np.ndarray, b_bits: np.ndarray, *, trans_a: bool, trans_b: bool, width_a: int, width_b: int,
              bf16: bool = False, wait_early: bool = False, bounds: bool = True) -> np.ndarray:
    """D = 1 + A @ B through the emulator; A is M x K (M = 64 per warpgroup), B is K x N, both 16-bit bits."""
    m, k = a_bits.shape
    n = b_bits.shape[1]
    a_off, a_lbo, a_sbo = (mn_major_image if trans_a else k_major_image)(a_bits, width_a)
    b_off, b_lbo, b_sbo = (mn_major_image if trans_b else k_major_image)(b_bits.T, width_b)
    b_base = -(-(int(a_off.max()) + 2) // 1024) * 1024
    total = -(-(b_base + int(b_off.max()) + 2) // 1024) * 1024
    image = np.full(total // 2, 0xFFFF, np.uint16)
    place(image, 0, a_off // 2, a_bits)
    place(image, b_base // 2, b_off // 2, b_bits.T)
    image[image == 0xFFFF] = 0  # gaps
    # advancing one k16 step: 32 bytes along a swizzled K-major row, else two k groups (2 x LBO or 2 x SBO)
    def advance(trans: bool, width: int, lbo: int, sbo: int) -> int:
        if not trans:
            return 32 if width else 2 * lbo
        return 2 * sbo if width else 2 * lbo
    # the next warpgroup's 64 rows of A: 8 row groups (K-major) or one 64-wide MN atom (MN-major)
    group_a = 8 * a_sbo if not trans_a else (a_lbo if width_a == 128 else 8 * a_sbo if not width_a else 2 * a_lbo)
    name = f"{n}_{int(trans_a)}{int(trans_b)}_{int(bf16)}"
    source = full(DISPATCH, KERNEL, ENTRY.format(name=name, n=n, ta=int(trans_a), tb=int(trans_b), bf=int(bf16)))
    out = poisoned(m // 64 * 128 * (n // 2))
    args = {"image": image.view(np.uint32).reshape(-1, 4).copy(), "words": total // 16, "out": out,
            "da": descriptor(0, a_lbo, a_sbo, width_a), "db": descriptor(b_base, b_lbo, b_sbo, width_b),
            "steps": k // 16, "adv_a": advance(trans_a, width_a, a_lbo, a_sbo) >> 4,
            "adv_b": advance(trans_b, width_b, b_lbo, b_sbo) >> 4, "group_a": group_a >> 4,
            "wait_early": int(wait_early)}
    params = tuple(args)
    emulate(source, [KernelLaunch(f"wg_{name}", (1, 1, 1), (m // 64 * 128, 1, 1), params, total)], args,
            bounds_check=bounds)
    # place thread t's register j by the PTX ISA's accumulator layout
    D = np.full((m, n), np.nan, np.float32)
    t = np.arange(m // 64 * 128)[:, None]
    j = np.arange(n // 2)[None, :]
    warp, lane = t // 32, t % 32
    rows = 16 * warp + lane // 4 + 8 * ((j % 4) // 2)
    cols = 8 * (j // 4) + 2 * (lane % 4) + j % 2
    D[rows, cols] = out.reshape(-1, n // 2)
    return D


CASES = [  # (trans_a, trans_b, width_a, width_b, K)
    (False, False, 128, 128, 64),  # A M x K, B N x K (both K-major), 128-byte swizzle
    (False, True, 128, 128, 64),  # B stored K x N: N-major
    (True, True, 128, 128, 64),  # A stored K x M: M-major
    (True, False, 128, 64, 32),
    (False, True, 64, 128, 32),  # 64-byte swizzle on A's K-major rows
    (False, False, 32, 32, 16),
    (False, True, 0, 0, 32),  # interleaved (no swizzle) core matrices
    (True, False, 0, 0, 32),
]


@pytest.mark.parametrize("trans_a, trans_b, width_a, width_b, k", CASES)
@pytest.mark.parametrize("m, n", [(64, 64), (128, 128)])
def test_wgmma_matches_numpy(rng: np.random.Generator, trans_a: bool, trans_b: bool, width_a: int, width_b: int,
                             k: int, m: int, n: int) -> None:
    A = rng.standard_normal((m, k)).astype(np.float16)
    B = rng.standard_normal((k, n)).astype(np.float16)
    D = run_wgmma(A.view(np.uint16), B.view(np.uint16), trans_a=trans_a, trans_b=trans_b, width_a=width_a,
                  width_b=width_b)
    want = 1.0 + A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(D, want, rtol=1e-5, atol=1e-4)


def test_wgmma_bf16(rng: np.random.Generator) -> None:
    A = rng.standard_normal((64, 64)).astype(np.float32)
    B = rng.standard_normal((64, 128)).astype(np.float32)
    a_bits, b_bits = bf16_bits(A), bf16_bits(B)
    D = run_wgmma(a_bits, b_bits, trans_a=False, trans_b=True, width_a=128, width_b=128, bf16=True)
    want = 1.0 + bf16_float(a_bits).astype(np.float64) @ bf16_float(b_bits).astype(np.float64)
    np.testing.assert_allclose(D, want, rtol=1e-5, atol=1e-4)


def test_accumulators_change_only_at_the_wait(rng: np.random.Generator) -> None:
    """Reading the accumulators between commit and wait sees their old values: the operation is in flight."""
    A = rng.standard_normal((64, 64)).astype(np.float16)
    B = rng.standard_normal((64, 64)).astype(np.float16)
    D = run_wgmma(A.view(np.uint16), B.view(np.uint16), trans_a=False, trans_b=False, width_a=128, width_b=128,
                  wait_early=True)
    np.testing.assert_array_equal(D, np.ones((64, 64), np.float32))


EXIT = r"""
extern "C" __global__ void wg_leak(SL_GLOBAL(float) out, long long desc) {
  SL_DYN_SHARED(smem);
  SL_VSTORE(uint4, smem, 16 * threadIdx.x, make_uint4(0u, 0u, 0u, 0u));
  __syncthreads();
  float d[32] = {};
  sl_wgmma_fence();
  sl_wgmma_n64_f16<0, 0>(d, (unsigned long long)desc, (unsigned long long)desc);
  sl_wgmma_commit();
  out[threadIdx.x] = 0.0f;
}
"""


def test_exiting_with_wgmma_in_flight_is_reported() -> None:
    args = {"out": poisoned(128), "desc": descriptor(0, 16, 1024, 128)}
    with pytest.raises(EmulatorError, match=r"wg_leak.*exits with 1 wgmma.mma_async operation\(s\) never completed"):
        emulate(full(EXIT), [KernelLaunch("wg_leak", (1, 1, 1), (128, 1, 1), ("out", "desc"), 2048)], args)


@pytest.mark.parametrize("start, sbo, why", [
    (4096, 1024, r"the descriptor of A starts at shared address 4096, past the 2048 bytes"),  # at the issue
    (0, 1024, r"A element \(\d+, 0\) lies at shared address \d+, past the 2048 bytes"),  # rows 16.. at the wait
])
def test_descriptor_outside_shared_memory_is_reported(start: int, sbo: int, why: str) -> None:
    """A descriptor whose start or strides reach past the launch's dynamic shared memory names the operand."""
    args = {"out": poisoned(128), "desc": descriptor(start, 16, sbo, 128)}
    with pytest.raises(EmulatorError, match="sl_wgmma: " + why):
        emulate(full(EXIT.replace("sl_wgmma_commit();", "sl_wgmma_commit(); sl_wgmma_wait<0>();")),
                [KernelLaunch("wg_leak", (1, 1, 1), (128, 1, 1), ("out", "desc"), 2048)], args)


def test_wgmma_needs_whole_warpgroups() -> None:
    args = {"out": poisoned(128), "desc": descriptor(0, 16, 1024, 128)}
    with pytest.raises(EmulatorError, match=r"the block has 96 threads; wgmma runs on warpgroups of 4 full warps"):
        emulate(full(EXIT), [KernelLaunch("wg_leak", (1, 1, 1), (96, 1, 1), ("out", "desc"), 2048)], args)
