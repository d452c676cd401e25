"""``sl.build``: a scheduled Func becomes a :class:`Kernel` that runs on the GPU (cupy), on the CPU
emulator (the exact same CUDA source compiled by g++), or is only compile-checked with nvcc.

Calling convention, on every path: pass the inputs in ``func.inputs`` order; the outputs are allocated and
returned (a single array, or a tuple when there are several).  Passing inputs followed by outputs writes
into the given outputs instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from schedlib.codegen import PRELUDE_END, CudaModule, generate
from schedlib.codegen.kernel_spec import TensorMapSpec
from schedlib.errors import BuildError, CompileError, ShapeError
from schedlib.ir.dtype import numpy_dtype
from schedlib.ir.expr import Expr
from schedlib.ir.func import GRID_YZ_LIMIT, Func
from schedlib.runtime.index_range import INT32_MAX, exact_int, int32_range, symbols_text
from schedlib.runtime.launch_checks import LaunchCache, bound_symbols, check_host_overlap, launch_grids


@dataclass(frozen=True)
class LaunchSpec:
    """How one kernel of the module is launched; ``grid`` may depend on symbolic dimensions."""

    name: str
    grid: tuple[Expr, Expr, Expr]
    block: tuple[int, int, int]
    dynamic_smem: int
    params: tuple[str, ...]
    tensor_maps: tuple[TensorMapSpec, ...] = ()  # parameters the runtime fills with TMA tensor maps
    local_bytes: int = 0  # per thread, of the kernel's local arrays

    def grid_for(self, symbols: Mapping[str, int], *, empty: bool = True) -> tuple[int, int, int]:
        """The grid at these symbol values, computed in exact ints; ShapeError where it passes CUDA's limits,
        which the launch would refuse with a less telling error (a kernel that gives each of a symbolic batch
        its own blockIdx.z), where its arithmetic leaves the kernel's 32-bit ints (a wrapped grid launches too
        few blocks, silently), or where it is empty although the work is not (``empty``: some buffer has no
        elements).  An empty grid launches one block, which the kernel's guards keep from doing anything."""
        env = {k: (int(v), int(v)) for k, v in symbols.items()}

        def refuse(sub: Expr, span: tuple[int, int]) -> None:  # the kernel recomputes its loop extents in int32
            raise ShapeError(f"kernel {self.name}: at {symbols_text(symbols)} the grid computes {sub} = "
                             f"{span[1]:,}, more than the 32-bit ints the generated code indexes with hold "
                             f"(2^31-1 = {INT32_MAX:,}); too few blocks would run, so use smaller shapes or "
                             "split the computation")

        exact: list[int] = []
        for axis, e in zip("xyz", self.grid):
            span = int32_range(e, env, refuse)
            if span is None or span[0] != span[1]:
                raise ShapeError(f"kernel {self.name}: grid.{axis} = {e} has no value at {symbols_text(symbols)}")
            if span[0] < 0 or (span[0] == 0 and not empty):
                raise ShapeError(f"kernel {self.name}: grid.{axis} = {e} is {span[0]} blocks at "
                                 f"{symbols_text(symbols)}, expected at least 1 for work that is not empty")
            exact.append(max(span[0], 1))
        g = tuple(exact)
        if g[0] > INT32_MAX or g[1] > GRID_YZ_LIMIT or g[2] > GRID_YZ_LIMIT:
            raise ShapeError(f"kernel {self.name}: grid {g} at {symbols_text(symbols)} exceeds CUDA's limits "
                             f"(x < 2^31, y and z <= {GRID_YZ_LIMIT}); schedule it with fewer blocks along y/z "
                             "(a SIMT kernel built for a constant extent past the limit strides over it)")
        return g  # type: ignore[return-value]


class Kernel:
    """Generated CUDA for one scheduled Func, plus ways to run and check it."""

    def __init__(self, module: CudaModule, arch: str, target: Any = None, declared: Func | None = None) -> None:
        self.module = module
        self.func: Func = module.func
        # the func as the user wrote it, before scheduling: errors about its sizes name the user's axes (a
        # two-stage schedule's reduce axes are split and renamed)
        self.declared: Func = declared if declared is not None else module.func
        self.arch = arch
        self.target = target
        self.launch: tuple[LaunchSpec, ...] = tuple(
            LaunchSpec(k.name, k.grid, k.block, k.dynamic_smem, k.params, k.tensor_maps, k.local_bytes)
            for k in module.kernels)
        self._gpu_module: Any = None  # loaded on the first GPU call
        self._launch_cache = LaunchCache()  # symbol values already checked, and their grids

    @property
    def source(self) -> str:
        return self.module.source

    # argument handling --------------------------------------------------------------------------
    def _split_args(self, arrays: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        n_in, n_out = len(self.func.inputs), len(self.func.outputs)
        if len(arrays) not in (n_in, n_in + n_out):
            raise ShapeError(f"kernel {self.func.name} takes {n_in} inputs {list(self.func.inputs)} "
                             f"(optionally followed by {n_out} outputs {list(self.func.outputs)}), "
                             f"got {len(arrays)} arrays")
        inputs = dict(zip(self.func.inputs, arrays[:n_in]))
        outputs = dict(zip(self.func.outputs, arrays[n_in:])) if len(arrays) > n_in else None
        return inputs, outputs

    def _shapes(self, symbols: Mapping[str, int], names: Sequence[str]) -> dict[str, tuple[int, ...]]:
        return {n: tuple(exact_int(d, symbols) for d in self.func.buffer(n).shape) for n in names}

    def _check_outputs(self, outputs: Mapping[str, Any], symbols: Mapping[str, int]) -> None:
        for name, shape in self._shapes(symbols, self.func.outputs).items():
            arr = outputs[name]
            if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
                raise ShapeError(f"kernel {self.func.name}: output {name} must be an array (written in place), "
                                 f"got a {type(arr).__name__}")
            want = numpy_dtype(self.func.buffer(name).dtype)
            if tuple(arr.shape) != shape or np.dtype(arr.dtype) != want:
                raise ShapeError(f"kernel {self.func.name}: output {name} must be {want}{list(shape)}, "
                                 f"got {np.dtype(arr.dtype)}{list(arr.shape)}")

    @staticmethod
    def _result(outputs: Mapping[str, Any]) -> Any:
        values = tuple(outputs.values())
        return values[0] if len(values) == 1 else values

    # CPU emulator -----------------------------------------------------------------------------
    def run_cpu(self, *arrays: np.ndarray, bounds_check: bool = False, threads: int | None = None) -> Any:
        """Run the exact CUDA source on the CPU emulator; numpy in, numpy out."""
        from schedlib.runtime.emulator import emulate

        launches, args, outputs = self._emulator_launch(arrays)
        emulate(self.source, launches, args, bounds_check=bounds_check, threads=threads)
        for name in outputs:
            if self.func.buffer(name).dtype == "bfloat16":
                outputs[name][...] = _from_bf16_bits(args[name])
        return self._result(outputs)

    def bank_conflicts(self, *arrays: np.ndarray, blocks: int = 4, threads: int | None = None) -> Any:
        """Shared-memory bank conflicts of each access in the source, counted on the CPU emulator.

        Runs the first `blocks` blocks of each kernel on these inputs (the outputs are not produced) and
        returns a pandas DataFrame, one row per source line, buffer and operation: ``requests`` (warp-wide),
        ``wavefronts`` the GPU needs to serve them, ``ideal`` (one per phase of the warp) and ``conflict`` =
        wavefronts / ideal, 1.0 when conflict-free.  Worst first."""
        import pandas as pd

        from schedlib.runtime.emulator.banks import bank_census

        launches, args, _ = self._emulator_launch(arrays)
        sites = bank_census(self.source, launches, args, blocks=blocks, threads=threads)
        rows = [{"kernel": s.kernel, "line": s.line, "buffer": s.buffer, "op": s.op, "bytes": s.bytes,
                 "requests": s.requests, "wavefronts": s.wavefronts, "ideal": s.ideal,
                 "conflict": round(s.conflict, 3), "code": s.code} for s in sites]
        columns = ["kernel", "line", "buffer", "op", "bytes", "requests", "wavefronts", "ideal", "conflict", "code"]
        df = pd.DataFrame(rows, columns=columns)
        return df.sort_values(["conflict", "wavefronts"], ascending=False, kind="stable").reset_index(drop=True)

    def _emulator_launch(self, arrays: Sequence[np.ndarray]) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
        """The launches, the argument map and the output arrays of one emulator run on `arrays`."""
        from schedlib.runtime.emulator import KernelLaunch

        inputs, outputs = self._split_args(arrays)
        given = inputs  # as passed: a strided input copied below would hide its overlap (the GPU path refuses it)
        # np.asarray(order="C"), not np.ascontiguousarray, which turns a 0-d input into a 1-element 1-d one
        inputs = {k: np.asarray(v, order="C") for k, v in inputs.items()}
        symbols = bound_symbols(self.func, inputs, self._launch_cache, self.declared)
        if outputs is None:
            outputs = {n: np.full(s, np.nan if numpy_dtype(self.func.buffer(n).dtype).kind == "f" else 0,
                                  dtype=numpy_dtype(self.func.buffer(n).dtype))
                       for n, s in self._shapes(symbols, self.func.outputs).items()}
        else:
            self._check_outputs(outputs, symbols)
            for name, arr in outputs.items():
                if not isinstance(arr, np.ndarray):
                    raise ShapeError(f"kernel {self.func.name}: output {name} must be a numpy array for run_cpu, "
                                     f"got a {type(arr).__name__}")
                if not arr.flags.writeable:
                    raise ShapeError(f"kernel {self.func.name}: output {name} is read-only; pass a writable "
                                     "array (or no outputs, to have them allocated)")
            check_host_overlap(self.func, given, outputs)
        args: dict[str, Any] = {**{k: _as_c_array(v, self.func.buffer(k).dtype) for k, v in inputs.items()}}
        for name, arr in outputs.items():
            if not arr.flags.c_contiguous:
                raise ShapeError(f"kernel {self.func.name}: output {name} must be C-contiguous")
            bf16 = self.func.buffer(name).dtype == "bfloat16"
            args[name] = _as_c_array(arr, self.func.buffer(name).dtype) if bf16 else arr
        for buf in self.module.scratch:
            shape = tuple(exact_int(d, symbols) for d in buf.shape)
            args[buf.name] = np.zeros(shape, dtype=np.uint16 if buf.dtype == "bfloat16" else numpy_dtype(buf.dtype))
        args.update({f"${s}": int(v) for s, v in symbols.items()})  # symbol parameters are keyed "$name"
        for spec in self.launch:  # encoded by the emulator from the arrays it launches with
            args.update({tm.param: tm for tm in spec.tensor_maps})
        grids = launch_grids(self.func, self.launch, symbols, self._launch_cache)
        launches = [KernelLaunch(spec.name, grid, spec.block, spec.params, spec.dynamic_smem, spec.local_bytes)
                    for spec, grid in zip(self.launch, grids)]
        return launches, args, outputs

    # compile check ----------------------------------------------------------------------------
    def compile_check(self, arch: str | None = None) -> Any:
        """Compile with nvcc (or NVRTC) for ``arch``; returns registers, shared memory and spills.

        A source with wgmma kernels builds for sm_90a only: ``sm_90`` is read as ``sm_90a``, and any other
        architecture is refused."""
        from schedlib.runtime.nvcc import compile_check

        if not isinstance(arch, (str, type(None))):
            raise CompileError(f"kernel {self.func.name}: arch={arch!r} must be an architecture name such as "
                               "'sm_90'")
        report = compile_check(self.source, self._arch_for(arch or self.arch))
        dynamic = {spec.name: spec.dynamic_smem for spec in self.launch}
        kernels = {n: replace(k, shared_dynamic_bytes=dynamic.get(n, 0)) for n, k in report.kernels.items()}
        return replace(report, kernels=kernels)

    def loop_mix(self, arch: str | None = None, innermost_only: bool = True) -> Any:
        """The SASS instruction mix of each loop of the compiled kernels: a DataFrame with one row per loop
        (instructions by family, ``math_share``, the most frequent opcodes).  Needs a compiler and nvdisasm, no GPU
        (:mod:`schedlib.runtime.sass`).  A hot loop far below the work share its tile promises (FFMA for a
        SIMT matmul, HMMA/HGMMA for tensor cores) is paying for addressing, loads or control."""
        from schedlib.runtime.nvcc import build_cubin
        from schedlib.runtime.sass import disassemble, loop_mix

        cubin = build_cubin(self.source, self._arch_for(arch or self.arch))
        return loop_mix(disassemble(cubin), innermost_only)

    def _arch_for(self, arch: str) -> str:
        need = self.module.arch
        if need is None or arch == need:
            return arch
        if arch == need.rstrip("a"):
            return need
        raise CompileError(f"kernel {self.func.name} uses wgmma, which exists on {need} only; cannot build for {arch}")

    # GPU --------------------------------------------------------------------------------------
    def __call__(self, *arrays: Any) -> Any:
        """Run on the GPU through cupy.  Accepts cupy arrays, torch tensors or anything with DLPack or
        ``__cuda_array_interface__``."""
        from schedlib.runtime.gpu import launch_on_gpu

        return launch_on_gpu(self, arrays)

    def prepare(self, *arrays: Any) -> Any:
        """Bind ``arrays`` (as for a call) once and return a :class:`schedlib.runtime.gpu.PreparedLaunch`, whose
        ``launch()`` enqueues only the kernels: what a timing loop should repeat.  ``result()`` gives the
        outputs of the latest launch."""
        from schedlib.runtime.gpu import prepare_on_gpu

        return prepare_on_gpu(self, arrays)

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.launch)
        return f"<Kernel {self.func.name} [{names}] arch={self.arch}>"


def _as_c_array(arr: np.ndarray, dtype: str) -> np.ndarray:
    """The bytes a kernel sees: bfloat16 values (held as float32) become their 16-bit patterns."""
    if dtype != "bfloat16":
        return np.asarray(arr, order="C")  # keeps a 0-d array 0-d
    if np.dtype(arr.dtype).name == "bfloat16":
        return np.asarray(arr, order="C").view(np.uint16)
    from schedlib.ir.dtype import bfloat16_bits

    return bfloat16_bits(arr)


def _from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def build(schedule: Any, target: Any = "h100") -> Kernel:
    """Generate CUDA for a Schedule (or Func) for ``target`` (a profile name, path or HardwareProfile)."""
    func = getattr(schedule, "func", schedule)
    if not isinstance(func, Func):
        raise BuildError(f"build needs a Schedule or Func, got {type(schedule).__name__}")
    arch, profile = _arch(target)
    # the profile's register cap reaches ptxas, not only the rules' estimates (a custom profile may set 64)
    module = generate(func, profile.max_registers_per_thread if profile is not None else None)
    _check_arch(module, arch, profile)
    _check_block_limits(module, profile)
    declared = getattr(schedule, "original", None)
    return Kernel(module, module.arch or arch, profile, declared if isinstance(declared, Func) else None)


# Instructions whose kernels need a newer card than the generated code in general: mma.sync m16n8k16 (bf16 and
# f16 with f32 accumulation) and cp.async came with sm_80, ldmatrix with sm_75; wgmma is sm_90a's alone.
_SM80_CALLS = ("sl_mma_m16n8k16", "sl_cp_async_16", "sl_ldmatrix")


def _check_arch(module: CudaModule, arch: str, profile: Any) -> None:
    """Refuse a kernel the target cannot run (a schedule made for Hopper built for an A100), with the way out."""
    body = module.source.split(PRELUDE_END, 1)[-1]
    cc = int(arch.removeprefix("sm_").rstrip("a"))
    need, what = ((90, "wgmma (Hopper warpgroup MMA)") if module.arch is not None else
                  (80, "mma.sync / cp.async") if any(call in body for call in _SM80_CALLS) else (0, ""))
    if cc < need or (need == 90 and cc != 90):
        where = profile.key if profile is not None else arch
        raise BuildError(f"build: kernel {module.func.name} uses {what}, which needs sm_{need}"
                         f"{'a' if need == 90 else '+'}; target {where} is {arch}.  Schedule it for this target "
                         f"(sl.rules.apply_default(func, {where!r}) picks what the card has)")


def _check_block_limits(module: CudaModule, profile: Any) -> None:
    """Refuse a kernel asking for more threads or shared memory per block than the target has (its launch
    would fail)."""
    if profile is None:
        return
    limit = profile.max_shared_per_block(True)
    for spec in module.kernels:
        threads = math.prod(spec.block)
        if threads > profile.max_threads_per_block:
            raise BuildError(f"build: kernel {spec.name} has {threads} threads per block; target {profile.key} "
                             f"allows {profile.max_threads_per_block}.  Schedule it for the target "
                             f"(sl.rules.apply_default(func, {profile.key!r}) fits its defaults to it)")
        need = spec.static_smem + spec.dynamic_smem
        if need > limit:
            raise BuildError(f"build: kernel {spec.name} needs {need:,} bytes of shared memory per block; target "
                             f"{profile.key} allows {limit:,}.  Use smaller tiles or fewer stages (the rules size "
                             f"them for the target: sl.rules.apply_default(func, {profile.key!r}))")


def _arch(target: Any) -> tuple[str, Any]:
    if isinstance(target, str) and target.startswith("sm_"):
        return target, None
    from schedlib.hw import resolve

    profile = resolve(target)
    return profile.arch, profile
