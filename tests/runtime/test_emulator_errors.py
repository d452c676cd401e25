"""Kernel bugs the emulator must report (with kernel, buffer, index, block, thread), never hang on."""

from __future__ import annotations

import re

import numpy as np
import pytest
from emu_kernels import VADD, VEC4, full, needs_gxx, poisoned

from schedlib.errors import EmulatorError
from schedlib.runtime.emulator import KernelLaunch, emulate

pytestmark = needs_gxx

DIVERGENT_SYNC = r"""
extern "C" __global__ void sync_divergent(SL_GLOBAL(float) out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1.0f;
}
"""

EARLY_EXIT_SHUFFLE = r"""
extern "C" __global__ void shfl_after_exit(SL_GLOBAL(float) out, int n) {
  if ((int)threadIdx.x >= n) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}
"""

PARTIAL_MASK = r"""
extern "C" __global__ void partial_mask(SL_GLOBAL(float) out) {
  out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, 1.0f, 1);
}
"""

GLOBAL_OVERRUN = r"""
extern "C" __global__ void write_all(SL_GLOBAL(float) c) {
  c[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}
"""

SHARED_OVERRUN = r"""
extern "C" __global__ void tile_overrun(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  SL_SHARED(float, tile, 32);
  tile[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  y[threadIdx.x] = tile[threadIdx.x];
}
"""

VIEW_OVERRUN = r"""
extern "C" __global__ void view_too_big(SL_GLOBAL(float) y) {
  SL_DYN_SHARED(smem);
  SL_SHARED_VIEW(float, buf, smem, 64, 32);
  buf[threadIdx.x] = 1.0f;
  y[threadIdx.x] = buf[threadIdx.x];
}
"""

MISALIGNED = r"""
extern "C" __global__ void misaligned(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  float4 v = SL_VLOAD(float4, x, 4 * threadIdx.x + 2);
  y[threadIdx.x] = v.x;
}
"""

BIG_STACK = r"""
extern "C" __global__ void big_stack(SL_GLOBAL(float) y) {
  volatile unsigned char scratch[96 * 1024];
  for (int i = 0; i < (int)sizeof(scratch); ++i) scratch[i] = (unsigned char)(i + threadIdx.x);
  y[threadIdx.x] = scratch[threadIdx.x * 7];
}
"""


def launch(name: str, params: tuple[str, ...], block: int = 32, grid: int = 1, smem: int = 0) -> list[KernelLaunch]:
    return [KernelLaunch(name, (grid, 1, 1), (block, 1, 1), params, dynamic_smem=smem)]


def test_barrier_in_divergent_branch_is_a_reported_deadlock() -> None:
    with pytest.raises(EmulatorError) as err:
        emulate(full(DIVERGENT_SYNC), launch("sync_divergent", ("out",)), {"out": poisoned(32)})
    msg = str(err.value)
    assert "kernel 'sync_divergent' block (0,0,0)" in msg and "deadlock" in msg
    assert "16 thread(s) wait at __syncthreads()" in msg and "16 thread(s) already exited" in msg


def test_shuffle_with_exited_lanes_is_a_reported_deadlock() -> None:
    with pytest.raises(EmulatorError, match=r"shfl_after_exit.*deadlock.*warp-synchronous"):
        emulate(full(EARLY_EXIT_SHUFFLE), launch("shfl_after_exit", ("out", "n")), {"out": poisoned(32), "n": 20})


def test_shuffle_mask_leaving_out_lanes_is_refused() -> None:
    with pytest.raises(EmulatorError, match=r"partial_mask.*__shfl_down_sync: mask 0x0000ffff"):
        emulate(full(PARTIAL_MASK), launch("partial_mask", ("out",)), {"out": poisoned(32)})


def test_bounds_mode_reports_global_overrun() -> None:
    c = poisoned(100)
    with pytest.raises(EmulatorError) as err:
        emulate(full(GLOBAL_OVERRUN), launch("write_all", ("c",), block=64, grid=2), {"c": c}, bounds_check=True)
    msg = str(err.value)
    assert "kernel 'write_all'" in msg and "global buffer 'c'" in msg and "size 100 elements" in msg
    m = re.search(r"block \((\d),0,0\) thread \((\d+),0,0\).*element index (\d+)", msg)
    assert m and int(m[1]) * 64 + int(m[2]) == int(m[3]) >= 100


def test_bounds_mode_reports_shared_overrun(rng: np.random.Generator) -> None:
    x = rng.standard_normal(64, dtype=np.float32)
    with pytest.raises(EmulatorError) as err:
        emulate(full(SHARED_OVERRUN), launch("tile_overrun", ("x", "y"), block=64), {"x": x, "y": poisoned(64)},
                bounds_check=True)
    msg = str(err.value)  # checked runs start the first block's threads last-first: thread 63 overruns first
    assert "kernel 'tile_overrun' block (0,0,0) thread (63,0,0)" in msg
    assert "shared buffer 'tile'" in msg and "element index 63" in msg and "size 32 elements" in msg


def test_bounds_mode_checks_vector_width(rng: np.random.Generator) -> None:
    x = rng.standard_normal(10, dtype=np.float32)  # the third float4 would read elements 8..11
    with pytest.raises(EmulatorError, match=r"SL_VLOAD<float4> out of bounds: elements \[8, 12\) of global buffer 'x'"):
        emulate(full(VEC4), launch("axpb4", ("x", "y", "n4"), block=3), {"x": x, "y": poisoned(12), "n4": 3},
                bounds_check=True)


def test_bounds_mode_checks_shared_view_against_launch_size() -> None:
    with pytest.raises(EmulatorError, match=r"SL_SHARED_VIEW 'buf' covers bytes \[64, 192\).* only 128 bytes"):
        emulate(full(VIEW_OVERRUN), launch("view_too_big", ("y",), smem=128), {"y": poisoned(32)}, bounds_check=True)


def test_misaligned_vector_load_is_reported(rng: np.random.Generator) -> None:
    x = rng.standard_normal(256, dtype=np.float32)
    with pytest.raises(EmulatorError, match=r"kernel 'misaligned'.*SL_VLOAD<float4>.*misaligned.*16-byte"):
        emulate(full(MISALIGNED), launch("misaligned", ("x", "y")), {"x": x, "y": poisoned(32)})


def test_fiber_stack_overflow_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDLIB_EMU_STACK_KB", "64")
    with pytest.raises(EmulatorError, match=r"big_stack.*stack overflow.*SCHEDLIB_EMU_STACK_KB"):
        emulate(full(BIG_STACK), launch("big_stack", ("y",), block=4), {"y": poisoned(4)}, threads=1)


VADD_ARGS = ("a", "b", "c", "n")


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"n": 2.5}, r"parameter 3 \('n'\): the kernel expects int32 but got a Python float"),
        ({"a": np.zeros(64)}, r"parameter 0 \('a'\): the kernel expects a pointer to float32 but got a float64 array"),
        ({"b": 7}, r"parameter 1 \('b'\): the kernel expects a pointer to float32 but got a Python int"),
        ({"n": 2**40}, r"parameter 3 \('n'\): the value 1099511627776 does not fit the kernel's int32"),
    ],
)
def test_parameter_type_mismatch_names_the_parameter(change: dict, pattern: str) -> None:
    args = {"a": np.ones(64, np.float32), "b": np.ones(64, np.float32), "c": poisoned(64), "n": 64} | change
    with pytest.raises(EmulatorError, match=r"kernel 'vadd': " + pattern):
        emulate(full(VADD), launch("vadd", VADD_ARGS, block=64), args)
    assert np.isnan(args["c"]).all()  # nothing ran


def test_read_only_array_for_writable_parameter_is_refused() -> None:
    c = poisoned(64)
    c.flags.writeable = False
    args = {"a": np.ones(64, np.float32), "b": np.ones(64, np.float32), "c": c, "n": 64}
    with pytest.raises(EmulatorError, match=r"parameter 2 \('c'\): the array is read-only"):
        emulate(full(VADD), launch("vadd", VADD_ARGS, block=64), args)


def test_wrong_parameter_count_and_missing_args() -> None:
    args = {"a": np.ones(64, np.float32), "b": np.ones(64, np.float32), "c": poisoned(64), "n": 64}
    with pytest.raises(EmulatorError, match=r"kernel 'vadd': takes 4 parameters but the launch passes 3 \(a, b, c\)"):
        emulate(full(VADD), launch("vadd", ("a", "b", "c"), block=64), args)
    with pytest.raises(EmulatorError, match=r"parameter 3 'm' has no entry in args"):
        emulate(full(VADD), launch("vadd", ("a", "b", "c", "m"), block=64), args)


def test_invalid_launch_configuration() -> None:
    args = {"a": np.ones(64, np.float32), "b": np.ones(64, np.float32), "c": poisoned(64), "n": 64}
    with pytest.raises(EmulatorError, match=r"exceeds the CUDA limits"):
        emulate(full(VADD), launch("vadd", VADD_ARGS, block=2048), args)
    with pytest.raises(EmulatorError, match=r"grid must be three ints >= 1"):
        emulate(full(VADD), [KernelLaunch("vadd", (0, 1, 1), (64, 1, 1), VADD_ARGS)], args)


def test_compile_error_carries_the_gxx_log() -> None:
    bad = full(VADD.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + undefined_name;"))
    with pytest.raises(EmulatorError, match=r"(?s)g\+\+ failed.*undefined_name"):
        emulate(bad, launch("vadd", VADD_ARGS), {})


def test_unknown_kernel_name_is_reported_before_compiling() -> None:
    with pytest.raises(EmulatorError, match=r"kernel 'vsub' is not defined in the source"):
        emulate(full(VADD), launch("vsub", VADD_ARGS), {})
