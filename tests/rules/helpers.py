"""Shared checks of the rule tests: random inputs, resource limits, and emulator-vs-reference comparison.

A case is a Func plus the schedule a rule made for it.  ``check_schedule`` builds it, runs the exact CUDA
source on the CPU emulator (with bounds checking) against the numpy reference executor of the
*unscheduled* func on fresh random inputs, then compiles it with nvcc (or NVRTC) for sm_80 and sm_90 and holds
every kernel to the matching hardware profile's limits.  The emulator needs g++ only: where neither nvcc nor
NVRTC is found, the compile checks are left out and the numeric comparisons still run.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from kernel_batch import compile_together

import schedlib as sl
import schedlib.hw
from schedlib import workloads as wl
from schedlib.hw.registers import block_limit as register_cap
from schedlib.ir.dtype import is_float, numpy_dtype, round_to_dtype
from schedlib.ir.func import Func
from schedlib.ir.reference import evaluate_int
from schedlib.runtime.nvcc import KernelResources, find_nvcc, nvrtc_available

ARCH_PROFILE = {"sm_80": "a100", "sm_90": "h100"}
ARCHS = tuple(ARCH_PROFILE)

# (rtol, atol relative to the largest reference magnitude) by output dtype: float32 results only differ by
# reordered sums; half types by one rounding step of the final store.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


def input_shapes(func: Func, symbols: Mapping[str, int] | None = None) -> dict[str, tuple[int, ...]]:
    env = dict(symbols or {})
    missing = [s for s in func.symbols if s not in env]
    if missing:
        raise ValueError(f"{func.name}: no value for symbolic dimension(s) {missing}")
    return {n: tuple(evaluate_int(d, env) for d in func.buffer(n).shape) for n in func.inputs}


def random_inputs(func: Func, rng: np.random.Generator, symbols: Mapping[str, int] | None = None
                  ) -> dict[str, np.ndarray]:
    """Fresh normal values, never zero (|x| >= 0.05), rounded to the input's dtype (bf16 held in float32);
    integer inputs get small non-zero integers (|x| <= 8, negative only where the type has them), bools both
    values."""
    out = {}
    for name, shape in input_shapes(func, symbols).items():
        dtype = func.buffer(name).dtype
        if dtype == "bool":  # both values, zeros included
            out[name] = rng.integers(0, 2, shape).astype(bool)
            continue
        if is_float(dtype):
            x = rng.standard_normal(shape)
            x = np.where(np.abs(x) < 0.05, np.copysign(0.05, x), x)
            arr = round_to_dtype(x.astype(np.float32), dtype)
        else:
            x = rng.integers(1, 9, shape)
            if np.iinfo(numpy_dtype(dtype)).min < 0:
                x = x * rng.choice(np.array([-1, 1]), shape)
            arr = x.astype(numpy_dtype(dtype))
        assert arr.dtype == numpy_dtype(dtype)
        assert np.all(arr != 0)
        out[name] = arr
    return out


@functools.cache
def compiler_available() -> bool:
    """nvcc or NVRTC can compile-check a kernel (what ``Kernel.compile_check`` falls back through)."""
    return find_nvcc() is not None or nvrtc_available()


def thread_count(block: Sequence[int]) -> int:
    return int(np.prod(block))


def check_resources(kernel: sl.Kernel, *, spills_allowed: bool | int = False, archs: Sequence[str] = ARCHS) -> None:
    """nvcc-compile (or NVRTC) for every arch; registers, shared memory, threads and spills within that GPU's
    profile.  A wgmma kernel (built for sm_90a) is checked on the Hopper profile only.  Does nothing where
    neither compiler is found, with a warning in the test report so that a pass is not read as a compile
    check (a test that only compile-checks asks for the ``cuda_compiler`` fixture and is skipped instead)."""
    check_resources_together([kernel], spills_allowed=spills_allowed, archs=archs)


def check_resources_together(kernels: Sequence[sl.Kernel], *, spills_allowed: bool | int = False,
                             archs: Sequence[str] = ARCHS) -> None:
    """``check_resources`` for several kernels, compiled in one nvcc run per arch (``kernel_batch``)."""
    if not compiler_available():
        warnings.warn("compile check not run: neither nvcc nor NVRTC was found", UserWarning, stacklevel=2)
        return
    for arch in archs:
        profile = sl.hw.load(ARCH_PROFILE[arch])
        group = [k for k in kernels if k.arch != "sm_90a" or arch == "sm_90"]  # wgmma: the Hopper profile only
        for kernel, resources in zip(group, compile_together(group, arch)):
            names = {spec.name for spec in kernel.launch}
            assert names <= set(resources), f"{arch}: ptxas reported {sorted(resources)}, launched {names}"
            for spec in kernel.launch:
                where = f"{arch} kernel {spec.name} (block {spec.block})"
                _check_limits(spec, resources[spec.name], profile, where, spills_allowed)
                if "sl_setmaxnreg_inc<" in kernel_text(kernel.source, spec.name):  # the split must fit the block's
                    cap = register_cap(thread_count(spec.block))
                    assert resources[spec.name].registers == cap, \
                        f"{where}: ptxas gave {resources[spec.name].registers} registers, not the cap {cap}"


def kernel_text(source: str, name: str) -> str:
    """The text of kernel ``name`` in ``source``: from its ``__global__`` head to the next kernel's."""
    start = source.index(f") {name}(")
    end = source.find("__global__", start)
    return source[start:] if end < 0 else source[start:end]


def _check_limits(spec: Any, res: KernelResources, profile: Any, where: str, spills_allowed: bool | int) -> None:
    threads = thread_count(spec.block)
    assert 1 <= threads <= profile.max_threads_per_block, f"{where}: {threads} threads per block"
    assert res.registers <= profile.max_registers_per_thread, f"{where}: {res.registers} registers"
    # a block whose registers do not fit on one SM cannot launch at all
    warps = -(-threads // profile.warp_size)
    per_warp = -(-res.registers * profile.warp_size // profile.register_alloc_unit) * profile.register_alloc_unit
    assert warps * per_warp <= profile.registers_per_sm, \
        f"{where}: {res.registers} registers x {threads} threads exceed the SM's {profile.registers_per_sm}"
    smem = res.shared_static_bytes + spec.dynamic_smem
    # dynamic shared memory past 48 KiB is opted into at launch (runtime.gpu sets the attribute)
    limit = profile.max_shared_per_block(opt_in=spec.dynamic_smem > 0)
    assert smem <= limit, f"{where}: {smem} bytes of shared memory (limit {limit})"
    if spills_allowed is not True:  # False: none; an int: at most that many bytes each way
        budget = int(spills_allowed)
        assert res.spill_store_bytes <= budget and res.spill_load_bytes <= budget, \
            f"{where}: spills {res.spill_store_bytes} B stores / {res.spill_load_bytes} B loads (allowed {budget})"


def compare(func: Func, expected: Mapping[str, np.ndarray], got: Any, what: str) -> None:
    """Every output of ``got`` (the kernel's return) matches the reference within the dtype's tolerance."""
    got_list = list(got) if isinstance(got, tuple) else [got]
    assert len(got_list) == len(func.outputs)
    for name, g in zip(func.outputs, got_list):
        ref = np.asarray(expected[name], dtype=np.float64)
        g = np.asarray(g)
        assert g.shape == ref.shape, f"{what}: {name} shape {g.shape}, expected {ref.shape}"
        assert np.dtype(g.dtype) == numpy_dtype(func.buffer(name).dtype), f"{what}: {name} dtype {g.dtype}"
        g = g.astype(np.float64)
        assert np.all(np.isfinite(g)), f"{what}: {name} has {int((~np.isfinite(g)).sum())} unwritten/NaN elements"
        if not is_float(func.buffer(name).dtype):  # integers and bools are exact
            bad = g != ref
            assert not bad.any(), (f"{what}: {name}: {int(bad.sum())} of {ref.size} elements differ (first at "
                                   f"{np.argwhere(bad)[:4].tolist()}: got {g[bad][:4]} expected {ref[bad][:4]})")
            continue
        tol = TOLERANCE[func.buffer(name).dtype]
        atol = tol * max(1.0, float(np.abs(ref).max()))
        bad = ~np.isclose(g, ref, rtol=tol, atol=atol)
        if bad.any():
            idx = np.argwhere(bad)[:4].tolist()
            raise AssertionError(f"{what}: {name}: {int(bad.sum())} of {ref.size} elements differ "
                                 f"(first at {idx}: got {g[bad][:4]} expected {ref[bad][:4]}; atol {atol:.3g})")


def run_and_compare(func: Func, kernel: sl.Kernel, rng: np.random.Generator,
                    symbols: Mapping[str, int] | None = None) -> None:
    """One emulator run (bounds checked) on fresh inputs against the unscheduled func's reference.

    Inputs whose reference output is all zeros (a relu of a handful of negative values) would let a kernel
    that writes zeros pass, so such draws are replaced (a few times at most)."""
    for _ in range(8):
        inputs = random_inputs(func, rng, symbols)
        expected = sl.run_reference(func, inputs)
        ref_values = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in expected.values()])
        if np.any(ref_values != 0):
            break
    else:
        raise AssertionError(f"{func.name} {dict(symbols or {})}: the reference output is all zeros for 8 draws")
    got = kernel.run_cpu(*[inputs[n] for n in func.inputs], bounds_check=True)
    compare(func, expected, got, f"{func.name} {dict(symbols or {})}")


def check_schedule(func: Func, schedule: sl.Schedule, rng: np.random.Generator, *,
                   sizes: Sequence[Mapping[str, int]] = ({},), spills_allowed: bool | int = False,
                   archs: Sequence[str] = ARCHS, kernel: sl.Kernel | None = None) -> sl.Kernel:
    """Emulate against the reference at each binding of ``sizes``, then compile-check within limits (where
    nvcc or NVRTC is found)."""
    kernel = sl.build(schedule, "h100") if kernel is None else kernel
    assert kernel.launch, "the build launched no kernel"
    for symbols in sizes:
        run_and_compare(func, kernel, rng, symbols)
    check_resources(kernel, spills_allowed=spills_allowed, archs=archs)
    return kernel


@dataclass(frozen=True)
class MatmulCase:
    """One kernel case of the matmul template tests: a workload, a config (None: the rule default) and the
    symbol bindings to run it at."""

    id: str
    make: Callable[[], Func]
    config: dict[str, Any] | None = None
    sizes: tuple[Mapping[str, int], ...] = ({},)


def matmul_maker(*args: Any, **kw: Any) -> Callable[[], Func]:
    """A deferred ``workloads.matmul(*args, **kw)`` (cases are built at collection, funcs per test)."""
    return lambda: wl.matmul(*args, **kw)
