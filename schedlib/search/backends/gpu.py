"""The ``gpu`` backend (parent side): turn a schedule into a JSON kernel description for the worker.

What the worker does with it (``bench.py``): compile, run once into outputs pre-filled with NaN, compare with
a reference output, warm up, then time repetitions with CUDA events, flushing L2 before each one by
writing a buffer twice the L2 size; median and 20th/80th percentiles are kept.  The three best configs are
re-benchmarked at the end with three times the repetitions.

Correctness reference (the design choice): ``sl.run_reference`` is a numpy loop-nest interpreter, far too
slow for 4096-sized problems, and a reduced-size problem would be a different kernel.  So the worker
computes the reference *on the device, once per worker start*, with :func:`naive_reference_schedule`: the
unscheduled func with only its leading spatial loops fused and bound to blocks and threads - no tiling, no
shared memory, no knob of any rule.  That schedule is simple enough to trust and is itself checked against
``run_reference`` on small shapes in the tests (on the CPU emulator).  Inputs are small integers times 0.5,
so fp32 accumulation is exact and tiled kernels must match to rounding of the epilogue only.
"""

from __future__ import annotations

from typing import Any

from schedlib.errors import BuildError, SchedlibError
from schedlib.hw import resolve
from schedlib.hw.profile import normalize_name
from schedlib.ir.func import Func, const_extent
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Rule
from schedlib.runtime.kernel import Kernel, build
from schedlib.search.backends.worker import SubprocessBackend
from schedlib.search.records import Measurement

HANDLER = "schedlib.search.backends.bench:KernelBench"
REFERENCE_THREADS = 128
EMULATOR_FLUSH_BYTES = 1 << 20  # the emulator's "L2" is the host cache; flushing 2x a GPU L2 only costs time


def static_shape(func: Func, name: str) -> list[int]:
    dims = [const_extent(d) for d in func.buffer(name).shape]
    if any(d is None for d in dims):
        raise SchedlibError(f"the gpu backend tunes static shapes; buffer {name} of {func.name} has shape "
                            f"{[str(d) for d in func.buffer(name).shape]} - bind its dimensions first")
    return [int(d) for d in dims if d is not None]


def naive_reference_schedule(func: Func) -> Schedule:
    """The trusted reference: each block's leading spatial loops fused, split by 128 and bound to
    ``blockIdx.x``/``threadIdx.x``; every other loop stays a plain serial loop inside the thread."""
    s = Schedule(func)
    for name in list(s.blocks):
        block = s.func.block(name)
        spatial = []
        for loop in s.get_loops(name):
            if block.loop_kind(loop) != "S":
                break
            spatial.append(loop)
        if not spatial:
            continue  # a full reduction to a scalar runs in one thread
        fused = s.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        bx, tx = s.split(fused, [None, REFERENCE_THREADS])
        s.bind(bx, "blockIdx.x")
        s.bind(tx, "threadIdx.x")
    return s


def kernel_payload(kernel: Kernel) -> dict[str, Any]:
    """Everything the worker needs to launch ``kernel`` (static shapes): source, launches, scratch buffers."""
    launches = [{"name": spec.name, "grid": list(spec.grid_for({})), "block": list(spec.block),
                 "smem": int(spec.dynamic_smem), "params": list(spec.params),
                 "tensor_maps": [{"param": m.param, "buffer": m.buffer, "dtype": m.dtype, "box": list(m.box),
                                  "swizzle": m.swizzle} for m in spec.tensor_maps]}
                for spec in kernel.launch]
    scratch = [{"name": b.name, "shape": static_shape(kernel.func, b.name), "dtype": b.dtype}
               for b in kernel.module.scratch]
    # arch: the one architecture a wgmma source builds for (sm_90a), which cupy's JIT does not target
    return {"source": kernel.source, "launches": launches, "scratch": scratch, "arch": kernel.module.arch}


def buffer_specs(func: Func, names: Any) -> list[dict[str, Any]]:
    return [{"name": n, "shape": static_shape(func, n), "dtype": func.buffer(n).dtype} for n in names]


class GpuBackend(SubprocessBackend):
    """Compile, check and time each kernel on the GPU (cupy) in a worker process.

    ``device="emulator"`` runs the very same worker code on the CPU emulator (times are host wall-clock and
    meaningless as GPU times; it exists to exercise the pipeline without a GPU, under its own study key).
    """

    name = "gpu"
    needs_schedule = True

    def __init__(self, *, timeout_s: float = 30.0, device: str = "cuda", seed: int = 0, warmup_ms: float = 25.0,
                 target_ms: float = 100.0, min_repeats: int = 10, max_repeats: int = 200,
                 rebench_factor: int = 3, flush_bytes: int | None = None) -> None:
        if device not in ("cuda", "emulator"):
            raise ValueError(f"device={device!r}; expected 'cuda' or 'emulator'")
        super().__init__(HANDLER, timeout_s=timeout_s, key="gpu" if device == "cuda" else "emulated")
        self.device = device
        self.timing = {"warmup_ms": warmup_ms, "target_ms": target_ms, "min_repeats": min_repeats,
                       "max_repeats": max_repeats}
        self.seed, self.rebench_factor, self.flush_bytes = seed, rebench_factor, flush_bytes
        self._target: Any = None

    def init_message(self, func: Func, target: Any, rule: Rule) -> dict[str, Any]:
        profile = resolve(target)
        self._target = profile
        try:
            reference = build(naive_reference_schedule(func), profile)
        except SchedlibError as exc:
            raise BuildError(f"gpu backend: cannot build the reference kernel of {func.name}: {exc}") from exc
        flush = self.flush_bytes
        if flush is None:
            flush = 2 * profile.l2_bytes if self.device == "cuda" else EMULATOR_FLUSH_BYTES
        return {"device": self.device, "seed": self.seed, "inputs": buffer_specs(func, func.inputs),
                "outputs": buffer_specs(func, func.outputs), "reference": kernel_payload(reference),
                "flush_bytes": int(flush), **self.timing}

    def open(self, func: Func, target: Any, rule: Rule) -> None:
        super().open(func, target, rule)
        if self.device == "cuda" and self.worker is not None:
            name = str(self.worker.info.get("device", ""))
            profile = self._target
            known = {normalize_name(n) for n in (profile.key, profile.name, *profile.aliases)}
            if name and normalize_name(name) not in known:
                self.close()
                raise SchedlibError(f"gpu backend: the worker measures on {name!r} but the target is "
                                    f"{profile.name} ({profile.key}); records are keyed by the target, so tune "
                                    f"with target='auto' or on the matching GPU")

    def payload(self, config: Config, schedule: Schedule | None) -> dict[str, Any]:
        if schedule is None:
            raise BuildError("the gpu backend needs the schedule of each config")
        return kernel_payload(build(schedule, self._target))

    def rebenchmark(self, items: list[tuple[Config, Schedule | None]]) -> list[Measurement]:
        out = []
        for config, schedule in items:
            try:
                payload = self.payload(config, schedule)
            except SchedlibError as exc:
                out.append(Measurement.failure("build_error", type(exc).__name__, str(exc)))
                continue
            out.append(self.request({"op": "measure", "config": config, "repeat_factor": self.rebench_factor,
                                     **payload}))
        return out
