"""Tensor-core path of the emulator: ldmatrix, mma.m16n8k16 and cp.async against the PTX ISA.

The fragment tests build the expected per-lane registers straight from the PTX ISA formulas
(groupID = lane >> 2, threadID_in_group = lane % 4), independently of the emulator's code, so an
emulator that is self-consistent but disagrees with the hardware layout fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
from emu_kernels import LDMATRIX_RAW, MMA_RAW, bf16_bits, bf16_float, full, mma_kernel, needs_gxx, poisoned

from schedlib.runtime.emulator import KernelLaunch, emulate

pytestmark = needs_gxx
WARP = ((1, 1, 1), (32, 1, 1))


def pack(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Two 16-bit values per 32-bit register, the lower-indexed element in the low half."""
    return lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)


def test_ldmatrix_fragments_follow_ptx_layout(rng: np.random.Generator) -> None:
    m = (rng.permutation(256) + 1000).astype(np.uint16).reshape(16, 16)  # distinct values
    out, out_t = poisoned(128, np.uint32), poisoned(128, np.uint32)
    launch = KernelLaunch("ldm_raw", *WARP, ("M", "out", "out_t"))
    emulate(full(LDMATRIX_RAW), [launch], {"M": m, "out": out, "out_t": out_t})
    lane = np.arange(32)
    g, t = lane >> 2, lane % 4
    for i in range(4):  # matrix i: rows 8*(i&1).., columns 8*(i>>1).. (the kernel's row addresses)
        r0, c0 = 8 * (i & 1), 8 * (i >> 1)
        # ldmatrix: thread l holds row l/4, elements 2*(l%4) and 2*(l%4)+1 of each 8x8 matrix
        np.testing.assert_array_equal(out[i::4], pack(m[r0 + g, c0 + 2 * t], m[r0 + g, c0 + 2 * t + 1]))
        # .trans delivers the transposed matrix in the same layout
        np.testing.assert_array_equal(out_t[i::4], pack(m[r0 + 2 * t, c0 + g], m[r0 + 2 * t + 1, c0 + g]))


def test_mma_fragments_follow_ptx_layout(rng: np.random.Generator) -> None:
    A = rng.standard_normal((16, 16)).astype(np.float16)
    B = rng.standard_normal((16, 8)).astype(np.float16)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    lane = np.arange(32)
    g, t = lane >> 2, lane % 4
    ab, bb = A.view(np.uint16), B.view(np.uint16)
    afrag = np.empty((32, 4), np.uint32)
    for j in range(4):  # register j holds a_{2j}, a_{2j+1}: rows g / g+8, columns 2t(+1) / +8
        row = g + 8 * (j % 2)
        col = 2 * t + 8 * (j // 2)
        afrag[:, j] = pack(ab[row, col], ab[row, col + 1])
    bfrag = np.stack([pack(bb[2 * t + 8 * j, g], bb[2 * t + 8 * j + 1, g]) for j in range(2)], axis=1)
    rows = np.stack([g, g, g + 8, g + 8], axis=1)
    cols = np.stack([2 * t, 2 * t + 1, 2 * t, 2 * t + 1], axis=1)
    cfrag = C[rows, cols]
    dfrag = poisoned((32, 4))
    emulate(full(MMA_RAW), [KernelLaunch("mma_raw", *WARP, ("a", "b", "c", "d"))],
            {"a": afrag, "b": bfrag, "c": np.ascontiguousarray(cfrag), "d": dfrag})
    D = np.full((16, 8), np.nan)
    D[rows, cols] = dfrag
    np.testing.assert_allclose(D, A.astype(np.float64) @ B + C, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bounds", [False, True], ids=["raw", "bounds"])
def test_tensor_core_tile_product(rng: np.random.Generator, bounds: bool) -> None:
    """cp.async -> ldmatrix (x4, x2, both .trans) -> mma builds D = A @ B + C for f16 and bf16."""
    A32 = rng.standard_normal((16, 16)).astype(np.float32)
    B32 = rng.standard_normal((16, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    inputs = {
        "f16": (A32.astype(np.float16), B32.astype(np.float16)),
        "bf16": (bf16_bits(A32), bf16_bits(B32)),
    }
    sources, launches, args, expected = [], [], {"C": C}, {}
    for dtype, (A, B) in inputs.items():
        Af = (A.astype(np.float64) if dtype == "f16" else bf16_float(A).astype(np.float64))
        Bf = (B.astype(np.float64) if dtype == "f16" else bf16_float(B).astype(np.float64))
        for variant, a_arr, b_arr in (("rk", A, B), ("tn", A.T, B.T)):
            name = f"mma_{variant}_{dtype}"
            sources.append(mma_kernel(variant, dtype))
            args |= {f"A_{name}": np.ascontiguousarray(a_arr), f"B_{name}": np.ascontiguousarray(b_arr),
                     f"D_{name}": poisoned((16, 8))}
            launches.append(KernelLaunch(name, *WARP, (f"A_{name}", f"B_{name}", "C", f"D_{name}")))
            expected[name] = Af @ Bf + C
    emulate(full(*sources), launches, args, bounds_check=bounds)
    for name, want in expected.items():
        np.testing.assert_allclose(args[f"D_{name}"], want, rtol=1e-5, atol=1e-5, err_msg=name)
