"""What a call checks once its arrays are bound: exact grids and 32-bit covers at symbolic sizes, outputs that
overlap inputs, 0-d inputs, byte order, and the messages of refused arguments (emulator and GPU paths)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from emu_kernels import VADD, full, needs_gxx, poisoned
from fake_cupy import install, on_device

import schedlib as sl
from schedlib.errors import EmulatorError, ShapeError
from schedlib.runtime.emulator import KernelLaunch, emulate
from schedlib.runtime.kernel import Kernel
from schedlib.runtime.launch_checks import launch_grids


def _kernel(func: sl.Func) -> Kernel:
    return sl.build(sl.rules.apply_default(func, "h100"), "h100")


@pytest.fixture(scope="module")
def axpy() -> Kernel:
    m = sl.var("M")
    x, y = sl.placeholder((m, 64), "float32", "X"), sl.placeholder((m, 64), "float32", "Y")
    z = sl.compute((m, 64), lambda i, j: x[i, j] * 2.0 + y[i, j], "Z")
    return _kernel(sl.func([x, y, z], "axpy"))


@pytest.fixture(scope="module")
def matmul() -> Kernel:
    return _kernel(sl.workloads.matmul(sl.var("M"), sl.var("N"), sl.var("K")))


# 1: grids in exact ints ----------------------------------------------------------------------------------
def test_the_grid_is_exact_below_the_32_bit_limit(axpy: Kernel) -> None:
    # M*64 = 2^31 - 1024: one tile short of 2^31 iterations, every index fits
    assert axpy.launch[0].grid_for({"M": 2**25 - 16}) == (2**21 - 1, 1, 1)
    assert launch_grids(axpy.func, axpy.launch, {"M": 2**25 - 16}) == [(2**21 - 1, 1, 1)]


@pytest.mark.parametrize("m", [2**25 - 1, 2**25, 2**26 + 3, 2**31 - 1])
def test_a_grid_whose_cover_passes_32_bits_is_refused(axpy: Kernel, m: int) -> None:
    """It used to wrap in int32 and be clamped to one block: the kernel quietly did a sliver of the work."""
    with pytest.raises(ShapeError, match=rf"kernel axpy\w*: at M={m} .*2\^31-1"):
        axpy.launch[0].grid_for({"M": m})
    with pytest.raises(ShapeError, match=rf"kernel axpy: at M={m},"):
        _cover(axpy, {"M": m})


def _cover(kernel: Kernel, symbols: dict[str, int]) -> None:
    from schedlib.runtime.index_range import check_iteration_cover

    check_iteration_cover(kernel.func, symbols, kernel.func.name)


def test_a_padded_matmul_cover_past_32_bits_is_refused(matmul: Kernel) -> None:
    symbols = {"M": 1, "N": 2**31 - 100, "K": 1}  # the buffers fit; N padded to whole tiles does not
    with pytest.raises(ShapeError, match=r"K=1, M=1, N=2147483548 .*2\^31-1"):
        for spec in matmul.launch:
            spec.grid_for(symbols)
    with pytest.raises(ShapeError, match=r"kernel matmul\w*: at K=1, M=1, N=2147483548"):
        _cover(matmul, symbols)


def test_an_empty_grid_is_refused_only_for_work_that_is_not_empty(axpy: Kernel) -> None:
    assert axpy.launch[0].grid_for({"M": 0}) == (1, 1, 1)  # nothing to do: one guarded block
    with pytest.raises(ShapeError, match=r"kernel axpy\w*: grid.x = .* is 0 blocks at M=0, expected at least 1"):
        axpy.launch[0].grid_for({"M": 0}, empty=False)
    assert launch_grids(axpy.func, axpy.launch, {"M": 0}) == [(1, 1, 1)]


@needs_gxx
def test_symbol_values_only_zero_size_arrays_allow_are_refused() -> None:
    m, n = sl.var("M"), sl.var("N")
    x = sl.placeholder((m, n), "float32", "X")
    kernel = _kernel(sl.func([x, sl.compute((m, n), lambda i, j: x[i, j] * 2.0, "Z")], "twice"))
    with pytest.raises(ShapeError, match=r"kernel twice: dimension M = 8589934592 \(from input X\) does not "
                                         r"fit the kernel's 32-bit int parameter"):
        kernel.run_cpu(np.empty((2**33, 0), np.float32))  # zero elements: every other check passes
    assert kernel.run_cpu(np.empty((5, 0), np.float32)).shape == (5, 0)


# 3: outputs overlapping inputs -------------------------------------------------------------------------
@needs_gxx
def test_an_output_overlapping_an_input_is_refused_on_the_emulator(axpy: Kernel, rng: np.random.Generator) -> None:
    x, y = rng.standard_normal((8, 64), dtype=np.float32), rng.standard_normal((8, 64), dtype=np.float32)
    with pytest.raises(ShapeError, match=r"kernel axpy: output Z overlaps input X in memory"):
        axpy.run_cpu(x, y, x)
    big = np.zeros((16, 64), np.float32)
    with pytest.raises(ShapeError, match=r"kernel axpy: output Z overlaps input Y"):
        axpy.run_cpu(x, big[4:12], big[:8])  # partial overlap of views
    np.testing.assert_array_equal(axpy.run_cpu(x, y, np.empty_like(x)), x * 2 + y)
    # a strided input is copied before the kernel runs, but its overlap is judged as given, as on the GPU path
    flat = np.zeros(8 * 128, np.float32)
    with pytest.raises(ShapeError, match=r"kernel axpy: output Z overlaps input X"):
        axpy.run_cpu(flat.reshape(8, 128)[:, ::2], y, flat[:512].reshape(8, 64))


def test_the_checks_of_one_set_of_sizes_run_once_per_kernel(axpy: Kernel, rng: np.random.Generator,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The index-range walk costs about 100 us: a GPU call of the same sizes must not pay it every time."""
    import schedlib.runtime.launch_checks as checks

    calls: list[dict] = []
    real = checks.check_index_range
    monkeypatch.setattr(checks, "check_index_range", lambda func, symbols: calls.append(symbols) or real(func, symbols))
    kernel = Kernel(axpy.module, axpy.arch, axpy.target)  # a fresh kernel: nothing checked yet
    x, y = rng.standard_normal((5, 64), dtype=np.float32), rng.standard_normal((5, 64), dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(kernel.run_cpu(x, y), x * 2 + y)
    kernel.run_cpu(x[:3], y[:3])
    assert calls == [{"M": 5}, {"M": 3}]


@needs_gxx
def test_an_output_overlapping_an_input_is_refused_on_the_gpu_path(monkeypatch: pytest.MonkeyPatch, axpy: Kernel,
                                                                    rng: np.random.Generator) -> None:
    device: SimpleNamespace = install(monkeypatch)
    x = on_device(rng.standard_normal((8, 64), dtype=np.float32))
    y = on_device(rng.standard_normal((8, 64), dtype=np.float32))
    with pytest.raises(ShapeError, match=r"kernel axpy: output Z overlaps input Y in memory"):
        axpy.prepare(x, y, y)
    pool = on_device(np.zeros((16, 64), np.float32))
    with pytest.raises(ShapeError, match=r"kernel axpy: output Z overlaps input X"):
        axpy.prepare(pool[4:12], y, pool[:8])
    with pytest.raises(ShapeError, match=r"kernel axpy: argument X is a host numpy array"):
        axpy.prepare(np.asarray(x), y)
    assert device.launches == []
    np.testing.assert_array_equal(axpy(x, y, pool[8:]), x * 2 + y)


# 5, 7, 9: 0-d inputs, byte order, messages -------------------------------------------------------------
@needs_gxx
def test_a_0d_input_is_taken_as_a_scalar(rng: np.random.Generator) -> None:
    x, s = sl.placeholder((16,), "float32", "X"), sl.placeholder((), "float32", "s")
    z = sl.compute((16,), lambda i: x[i] * s[()], "Z")
    kernel = _kernel(sl.func([x, s, z], "scale"))
    xs = rng.standard_normal(16, dtype=np.float32)
    np.testing.assert_array_equal(kernel.run_cpu(xs, np.array(3.0, np.float32)), xs * np.float32(3))
    np.testing.assert_array_equal(kernel.run_cpu(xs, np.float32(2)), xs * 2)
    assert len(kernel.bank_conflicts(xs, np.array(3.0, np.float32))) == 0


@needs_gxx
def test_emulate_converts_non_native_byte_order(rng: np.random.Generator) -> None:
    a = np.arange(64, dtype=">f4")
    b, c = np.ones(64, np.float32), poisoned(64)
    out = np.full(64, np.nan, ">f4")
    launch = KernelLaunch("vadd", (1, 1, 1), (64, 1, 1), ("a", "b", "c", "n"))
    emulate(full(VADD), [launch], {"a": a, "b": b, "c": c, "n": 64})
    np.testing.assert_array_equal(c, np.arange(64) + 1.0)
    emulate(full(VADD), [launch], {"a": b, "b": a, "c": out, "n": 64})  # written back in its own order
    np.testing.assert_array_equal(out, np.arange(64) + 1.0)


@needs_gxx
def test_refused_outputs_and_threads_are_named(axpy: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.ones((4, 64), np.float32)
    ro = np.empty_like(x)
    ro.flags.writeable = False
    with pytest.raises(ShapeError, match=r"kernel axpy: output Z is read-only; pass a writable array"):
        axpy.run_cpu(x, x, ro)
    with pytest.raises(ShapeError, match=r"kernel axpy: output Z must be an array .*got a list"):
        axpy.run_cpu(x, x, [[0.0] * 64] * 4)
    for bad in (2.5, "2"):
        with pytest.raises(EmulatorError, match=rf"threads must be an int >= 1 .*got {bad!r}"):
            axpy.run_cpu(x, x, threads=bad)  # type: ignore[arg-type]
    install(monkeypatch)
    with pytest.raises(ShapeError, match=r"kernel axpy: output Z must be C-contiguous"):
        axpy.prepare(on_device(x), on_device(x), on_device(np.ones((64, 4), np.float32)).T)


@needs_gxx
def test_an_empty_reduction_is_refused_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows to write and nothing to reduce: refused before any launch, on the emulator and on the GPU path."""
    kernel = _kernel(sl.workloads.reduce(4, sl.var("K")))
    with pytest.raises(ShapeError, match="reduces over axis r of extent K = 0"):
        kernel.run_cpu(np.zeros((4, 0), np.float32))
    device: SimpleNamespace = install(monkeypatch)
    with pytest.raises(ShapeError, match="reduces over axis r of extent K = 0"):
        kernel(on_device(np.zeros((4, 0), np.float32)))
    assert device.launches == []
    np.testing.assert_array_equal(kernel.run_cpu(np.ones((4, 5), np.float32)), np.full(4, 5.0, np.float32))


@needs_gxx
def test_an_empty_two_stage_reduction_names_the_users_axis() -> None:
    """A two-stage schedule splits and renames the reduce axis; the refusal still names the axis as declared."""
    n = sl.var("n")
    x = sl.placeholder((n,), "float32", "X")
    i = sl.reduce_axis(n, "i")
    total = sl.func([x, sl.compute((), lambda: sl.sum(x[i], axis=i), "Y")], "total")
    config = {"rows_per_block": 1, "threads_k": 64, "vector": 4, "blocks_per_row": 8}
    s = sl.rules.get_rule("reduction").apply(total, "h100", config)
    assert s is not None and "Y_rf" in s.blocks  # two stages: the partials block exists
    kernel = sl.build(s, "h100")
    with pytest.raises(ShapeError, match=r"block Y reduces over axis i of extent n = 0 .*\(n=0\)"):
        kernel.run_cpu(np.zeros((0,), np.float32))
    assert kernel.run_cpu(np.ones((5000,), np.float32)) == 5000.0


@needs_gxx
def test_a_symbol_only_in_an_affine_input_dim_binds_on_the_emulator(rng: np.random.Generator) -> None:
    # Regression: a func whose symbol appears only as N + 1 built, and every run_cpu was refused ("dimension N
    # cannot be inferred"); the kernel gets N = 37 from the 38-entry input.
    n = sl.var("N")
    p = sl.placeholder((n + 1,), "float32", "P")
    d = sl.compute((n,), lambda i: p[i + 1] - p[i], "D")
    kernel = _kernel(sl.func([p, d], "diff"))
    x = rng.standard_normal(38).astype(np.float32)
    np.testing.assert_array_equal(kernel.run_cpu(x, bounds_check=True), np.diff(x))
