"""The CPU emulator runs hand-written kernels in the schedlib convention and matches numpy."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from emu_kernels import (
    ATOMIC_SUM,
    DYN_SMEM,
    HALF_OPS,
    INDICES,
    MATMUL,
    ROWSUM,
    VADD,
    VEC4,
    WARP_OPS,
    bf16_bits,
    bf16_float,
    full,
    needs_gxx,
    poisoned,
)

from schedlib.runtime.emulator import KernelLaunch, build, emulate
from schedlib.runtime.emulator.build import build_library, driver_source
from schedlib.runtime.emulator.pch import PCH_NAME, uses_pch
from schedlib.runtime.gpu import _device_bf16
from schedlib.runtime.kernel import _as_c_array

pytestmark = needs_gxx
MODES = pytest.mark.parametrize("bounds", [False, True], ids=["raw", "bounds"])


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@MODES
def test_vector_add(rng: np.random.Generator, bounds: bool) -> None:
    n = 1000
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    c = poisoned(n)
    emulate(full(VADD), [KernelLaunch("vadd", (cdiv(n, 256), 1, 1), (256, 1, 1), ("a", "b", "c", "n"))],
            {"a": a, "b": b, "c": c, "n": n}, bounds_check=bounds)
    np.testing.assert_array_equal(c, a + b)


def run_matmul(rng: np.random.Generator, m: int, n: int, k: int, **kw: object) -> None:
    A, B = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    C = poisoned((m, n))
    launch = KernelLaunch("matmul", (cdiv(n, 16), cdiv(m, 16), 1), (16, 16, 1), ("A", "B", "C", "M", "N", "K"))
    emulate(full(MATMUL), [launch], {"A": A, "B": B, "C": C, "M": m, "N": n, "K": k}, **kw)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)


@MODES
def test_tiled_matmul_odd_sizes(rng: np.random.Generator, bounds: bool) -> None:
    run_matmul(rng, 33, 17, 40, bounds_check=bounds)


def test_matmul_on_several_os_threads(rng: np.random.Generator) -> None:
    run_matmul(rng, 70, 90, 50, threads=3)


def test_ucontext_fallback_runs_the_same_kernel(rng: np.random.Generator) -> None:
    """The portable fiber switch (used off x86-64) is exercised here by forcing it on."""
    A, B = rng.standard_normal((20, 24), dtype=np.float32), rng.standard_normal((24, 18), dtype=np.float32)
    C = poisoned((20, 18))
    launch = KernelLaunch("matmul", (2, 2, 1), (16, 16, 1), ("A", "B", "C", "M", "N", "K"))
    emulate("#define SL_EMU_FORCE_UCONTEXT 1\n" + full(MATMUL), [launch],
            {"A": A, "B": B, "C": C, "M": 20, "N": 18, "K": 24}, threads=2)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)


def test_thread_and_block_indices_3d() -> None:
    grid, block = (2, 3, 2), (4, 3, 2)
    nb, nt = int(np.prod(grid)), int(np.prod(block))
    out = poisoned((nb, nt, 6), np.int32)
    emulate(full(INDICES), [KernelLaunch("indices", grid, block, ("out",))], {"out": out})
    tz, ty, tx = np.meshgrid(*(np.arange(d) for d in block[::-1]), indexing="ij")
    bz, by, bx = np.meshgrid(*(np.arange(d) for d in grid[::-1]), indexing="ij")
    thread = np.stack([tx.ravel(), ty.ravel(), tz.ravel()], axis=1)  # x fastest, as CUDA linearizes
    blk = np.stack([bx.ravel(), by.ravel(), bz.ravel()], axis=1)
    np.testing.assert_array_equal(out[:, :, :3], np.broadcast_to(thread, (nb, nt, 3)))
    np.testing.assert_array_equal(out[:, :, 3:], np.broadcast_to(blk[:, None, :], (nb, nt, 3)))


@MODES
def test_warp_shuffles_and_votes(bounds: bool) -> None:
    """Expected values follow the CUDA programming guide's description of each intrinsic."""
    nb, nt = 2, 64
    out = poisoned((nb, nt, 10), np.int32)
    emulate(full(WARP_OPS), [KernelLaunch("warp_ops", (nb, 1, 1), (nt, 1, 1), ("out",))], {"out": out},
            bounds_check=bounds)
    t = np.arange(nt)
    lane, base = t % 32, t - t % 32
    value = 1000 * np.arange(nb)[:, None] + base  # value of lane 0 of each thread's warp
    seg8 = lane - lane % 8
    src = [
        seg8 + (lane + 3) % 8,                             # __shfl_sync, width 8: srcLane % width in my segment
        np.where(lane % 8 < 3, lane, lane - 3),            # __shfl_up_sync 3, width 8: low lanes keep theirs
        np.where(lane % 16 + 5 >= 16, lane, lane + 5),     # __shfl_down_sync 5, width 16
        lane ^ 3,                                          # __shfl_xor_sync 3, width 4
        31 - lane,                                         # __shfl_sync from lane 31 - lane
    ]
    for j, s in enumerate(src):
        np.testing.assert_array_equal(out[:, :, j], value + s, err_msg=f"column {j}")
    assert (out[:, :, 5] == sum(1 << i for i in range(0, 32, 3))).all()
    assert (out[:, :, 6] == 3).all()  # any(lane == 7) + 2 * all(lane < 32) + 4 * all(lane < 31)
    np.testing.assert_array_equal(out[:, :, 7], value + np.where(lane == 31, lane, lane + 1))
    assert (out[:, :, 8] == np.count_nonzero(t % 5 == 0)).all()
    assert (out[:, :, 9] == 3).all()  # and(all) + 2 * or(one) + 4 * and(all but one)


@MODES
def test_block_row_sum_with_warp_shuffles(rng: np.random.Generator, bounds: bool) -> None:
    rows, cols = 37, 1000
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    out = poisoned(rows)
    emulate(full(ROWSUM), [KernelLaunch("rowsum", (rows, 1, 1), (128, 1, 1), ("x", "out", "ncols"))],
            {"x": x, "out": out, "ncols": cols}, bounds_check=bounds)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)


def test_bf16_reference_rounds_ties_to_even() -> None:
    """Pin the numpy reference itself to hand-checked values before trusting it."""
    one = np.float32(1.0)
    ties = np.array([one + 2.0**-8, one + 3 * 2.0**-8, -(one + 2.0**-8), 3.4e38], np.float32)
    np.testing.assert_array_equal(bf16_float(bf16_bits(ties)), [1.0, 1.015625, -1.0, np.inf])


def test_half_and_bf16_conversions_bit_exact(rng: np.random.Generator) -> None:
    all_halves = np.arange(65536, dtype=np.uint16).view(np.float16)
    edges = all_halves.astype(np.float64)
    finite = np.sort(edges[np.isfinite(edges)])
    mids = (finite[:-1] + finite[1:]) / 2  # exact ties between neighbouring halves
    f = np.concatenate([
        rng.integers(0, 2**32, 60000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        rng.standard_normal(20000).astype(np.float32) * np.float32(100.0),
        mids.astype(np.float32),
        np.array([65504, 65519.99, 65520, 6e-8, 2.98e-8, 2.99e-8, -0.0, np.inf, -np.inf, np.nan], np.float32),
    ])
    n = f.size
    h = np.resize(all_halves, n)
    b = rng.integers(0, 2**16, n, dtype=np.uint64).astype(np.uint16)
    f2h, h2f, f2b, b2f = poisoned(n, np.float16), poisoned(n), poisoned(n, np.uint16), poisoned(n)
    emulate(full(HALF_OPS), [
        KernelLaunch("h_convert", (cdiv(n, 256), 1, 1), (256, 1, 1), ("f", "f2h", "h", "h2f", "n")),
        KernelLaunch("bf_convert", (cdiv(n, 256), 1, 1), (256, 1, 1), ("f", "f2b", "b", "b2f", "n")),
    ], {"f": f, "f2h": f2h, "h": h, "h2f": h2f, "b": b, "f2b": f2b, "b2f": b2f, "n": n})
    with np.errstate(over="ignore"):
        want = f.astype(np.float16)
    nan = np.isnan(want)
    assert np.isnan(f2h[nan]).all()
    np.testing.assert_array_equal(f2h[~nan].view(np.uint16), want[~nan].view(np.uint16))
    np.testing.assert_array_equal(h2f.view(np.uint32), h.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(f2b, bf16_bits(f))
    np.testing.assert_array_equal(b2f.view(np.uint32), bf16_float(b).view(np.uint32))


def test_host_and_device_marshal_bf16_inputs_alike(rng: np.random.Generator) -> None:
    """Inputs given as float32 reach a bf16 kernel as the bits the emulator's own conversion gives (checked
    against it above), from the host (``run_cpu``) and from the device path alike (numpy stands in for cupy:
    the same array calls).  NaN payloads in the low bits used to become infinity, and 0xFFFFFFFF wrapped to
    zero on the device."""
    f = np.concatenate([rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.array([0x7F800001, 0xFFFFFFFF, 0x7FC00000, 0x7F7FFFFF], np.uint32).view(np.float32)])
    want = bf16_bits(f)
    np.testing.assert_array_equal(_as_c_array(f, "bfloat16"), want)
    np.testing.assert_array_equal(_device_bf16(np, f), want)
    assert np.isnan(bf16_float(want[np.isnan(f)])).all()


def test_half_and_bf16_arithmetic(rng: np.random.Generator) -> None:
    n = 5000
    f = rng.standard_normal(n).astype(np.float32) * np.float32(30.0)
    ha, hb, hc = (rng.standard_normal(n).astype(np.float16) * np.float16(8.0) for _ in range(3))
    ba, bb = bf16_bits(rng.standard_normal(n) * 50.0), bf16_bits(rng.standard_normal(n) * 50.0)
    outs = {k: poisoned(n, np.float16) for k in ("hsum", "hprod", "hfma", "hmax")}
    outs |= {"bsum": poisoned(n, np.uint16), "bprod": poisoned(n, np.uint16)}
    hpair, bpair = poisoned(4 * n), poisoned(2 * n)
    args = {"f": f, "ha": ha, "hb": hb, "hc": hc, "ba": ba, "bb": bb, "n": n, "hpair": hpair, "bpair": bpair, **outs}
    emulate(full(HALF_OPS), [
        KernelLaunch("h_arith", (cdiv(n, 128), 1, 1), (128, 1, 1),
                     ("f", "ha", "hb", "hc", "hsum", "hprod", "hfma", "hmax", "hpair", "n")),
        KernelLaunch("bf_arith", (cdiv(n, 128), 1, 1), (128, 1, 1), ("f", "ba", "bb", "bsum", "bprod", "bpair", "n")),
    ], args)
    np.testing.assert_array_equal(outs["hsum"], ha + hb)
    np.testing.assert_array_equal(outs["hprod"], ha * hb)
    np.testing.assert_array_equal(outs["hfma"], (ha.astype(np.float64) * hb + hc).astype(np.float16))
    np.testing.assert_array_equal(outs["hmax"], np.fmax(ha, hb))
    p0, p1 = f.astype(np.float16), (2 * f).astype(np.float16)
    np.testing.assert_array_equal(hpair.reshape(n, 4), np.stack([p0 + ha, p1 + hb, p0, p1], axis=1).astype(np.float32))
    fa, fb = bf16_float(ba), bf16_float(bb)
    np.testing.assert_array_equal(outs["bsum"], bf16_bits(fa + fb))
    np.testing.assert_array_equal(outs["bprod"], bf16_bits(fa * fb))
    want_pair = np.stack([bf16_float(bf16_bits(f)), bf16_float(bf16_bits(-f))], axis=1)
    np.testing.assert_array_equal(bpair.reshape(n, 2), want_pair)


@MODES
def test_dynamic_shared_memory_views(rng: np.random.Generator, bounds: bool) -> None:
    nb, nt = 5, 64
    x = rng.standard_normal(nb * nt, dtype=np.float32)
    y, idx = poisoned(nb * nt), poisoned(nb * nt, np.int32)
    launch = KernelLaunch("dyn_reverse", (nb, 1, 1), (nt, 1, 1), ("x", "y", "idx"), dynamic_smem=8 * nt)
    emulate(full(DYN_SMEM), [launch], {"x": x, "y": y, "idx": idx}, bounds_check=bounds)
    want_idx = np.arange(nb * nt).reshape(nb, nt)[:, ::-1].ravel()
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(y, 2 * x[want_idx])


@MODES
def test_float4_vector_load_store(rng: np.random.Generator, bounds: bool) -> None:
    n4 = 250
    x = rng.standard_normal(4 * n4, dtype=np.float32)
    y = poisoned(4 * n4)
    emulate(full(VEC4), [KernelLaunch("axpb4", (1, 1, 1), (256, 1, 1), ("x", "y", "n4"))],
            {"x": x, "y": y, "n4": n4}, bounds_check=bounds)
    np.testing.assert_array_equal(y, 2 * x + 1)


def test_unaligned_numpy_array_is_staged_and_written_back(rng: np.random.Generator) -> None:
    base = rng.standard_normal(4 * 64 + 1, dtype=np.float32)
    x = base[1:]  # 4-byte offset: float4 loads would fault on this address on the GPU
    y_base = poisoned(4 * 64 + 1)
    y = y_base[1:]
    emulate(full(VEC4), [KernelLaunch("axpb4", (1, 1, 1), (64, 1, 1), ("x", "y", "n4"))], {"x": x, "y": y, "n4": 64})
    np.testing.assert_array_equal(y, 2 * x + 1)
    assert np.isnan(y_base[0])


def test_atomics_across_blocks_and_os_threads(rng: np.random.Generator) -> None:
    n = 20000
    x = rng.integers(-8, 8, n).astype(np.float32)  # small integers: the float sum is exact in any order
    total, count = np.zeros(1, np.float32), np.zeros(1, np.int32)
    launch = KernelLaunch("atomic_sum", (cdiv(n, 64), 1, 1), (64, 1, 1), ("x", "total", "count", "n"))
    emulate(full(ATOMIC_SUM), [launch], {"x": x, "total": total, "count": count, "n": n}, threads=4)
    assert count[0] == n
    assert total[0] == x.sum(dtype=np.float64)


def test_library_is_cached_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      rng: np.random.Generator) -> None:
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path))
    source = full(VADD) + "\n// cache test\n"
    libs: list[object] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            libs.append(build_library(source, ["vadd"], bounds_check=False))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    workers = [threading.Thread(target=build) for _ in range(2)]  # concurrent builds of one key
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors and libs[0] == libs[1]
    mtime = os.stat(libs[0]).st_mtime_ns
    a, b, c = np.ones(10, np.float32), rng.standard_normal(10, dtype=np.float32), poisoned(10)
    launch = KernelLaunch("vadd", (1, 1, 1), (32, 1, 1), ("a", "b", "c", "n"))
    emulate(source, [launch], {"a": a, "b": b, "c": c, "n": 10})
    np.testing.assert_array_equal(c, b + 1)
    assert os.stat(libs[0]).st_mtime_ns == mtime
    assert [p.suffix for p in sorted((tmp_path / "emulator").iterdir())] == [".cu", ".so"]


def test_the_headers_are_precompiled_once_per_flag_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       rng: np.random.Generator) -> None:
    """Each library build loads the emulator headers precompiled for its flags (about a quarter of a build)
    instead of parsing them; the precompiled copy is made once per flag set and is never part of a result."""
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path))
    used: list[tuple[Path, int]] = []
    for n, bounds in ((1, False), (2, False), (3, True)):
        source = full(VADD) + f"\n// variant {n}\n"
        build_library(source, ["vadd"], bounds_check=bounds)
        pch = uses_pch(build.last_build_command)  # the command that built this very library
        assert pch is not None and pch.parent == tmp_path / "emulator-headers", build.last_build_command
        assert build.last_build_command[-5:-3] == ["-include", "sl_cuda_emu.h"]
        used.append((pch, (pch / PCH_NAME).stat().st_ino))
        a, b, c = np.ones(10, np.float32), rng.standard_normal(10, dtype=np.float32), poisoned(10)
        emulate(source, [KernelLaunch("vadd", (1, 1, 1), (32, 1, 1), ("a", "b", "c", "n"))],
                {"a": a, "b": b, "c": c, "n": 10}, bounds_check=bounds)
        np.testing.assert_array_equal(c, b + 1)
    assert used[0] == used[1] and used[2][0] != used[0][0]  # the second plain build reused the first's copy
    # g++ itself says it loads the precompiled header ("! path.gch" in its -H include trace), not the text
    (tmp_path / "kernel.cu").write_text(full(VADD))
    (tmp_path / "driver.cpp").write_text(driver_source(["vadd"]))
    cmd = [*build.last_build_command[:-3], "-H", "-fsyntax-only", "driver.cpp"]
    trace = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=True).stderr
    assert f"! {used[2][0] / PCH_NAME}" in trace.splitlines(), trace[:2000]
    sets = sorted(d for d in (tmp_path / "emulator-headers").iterdir() if not d.name.startswith("."))
    assert len(sets) == 2  # plain and bounds-checked
    assert all((d / "sl_cuda_emu.h.gch").is_file() and (d / "sl_cuda_emu.h").is_file() for d in sets)
    assert len(list((tmp_path / "emulator").glob("*.so"))) == 3
