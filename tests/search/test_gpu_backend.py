"""The gpu backend without a GPU: its measuring logic on a fake device (flush before every timed
repetition, percentiles, typed failures), its trusted reference schedule against ``run_reference``, and the
whole pipeline (JSON payloads, worker process, checks, timing) on the CPU emulator.  One test runs on a real
GPU when there is one."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import schedlib as sl
import schedlib.search as S
from schedlib.hw import resolve
from schedlib.rules import find_rule
from schedlib.runtime.emulator import find_gxx
from schedlib.search.backends.bench import CupyDevice, KernelBench, host_input
from schedlib.search.backends.gpu import buffer_specs, kernel_payload

needs_gxx = pytest.mark.skipif(find_gxx() is None, reason="the CPU emulator needs g++")


class FakeDevice:
    """numpy memory; 'kernels' are named by their source text; time comes from a script; every call is
    logged so the test can check what happens between timed repetitions."""

    name = "fake"
    xp = np
    fault = CupyDevice.fault  # the real classification of device errors

    def __init__(self, times: list[float]) -> None:
        self.times: Iterator[float] = iter(times)
        self.log: list[str] = []

    def compile(self, source: str, names: list[str], arch: str | None = None) -> dict[str, Any]:
        if "syntax error" in source:
            raise RuntimeError("CompileException: kernel.cu(3): error: expected a ';'")
        return {n: source for n in names}

    def launch(self, fn: str, grid: Any, block: Any, params: list[tuple[str, Any]], smem: int) -> None:
        args = dict(params)
        if fn == "illegal":
            raise RuntimeError("CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered")
        if fn == "too big":
            raise RuntimeError("CUDADriverError: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested")
        out = args["A"] @ args["B"]
        if fn == "wrong":
            out[3, 5] += 1.0
        if fn == "partial":
            args["C"][:2] = out[:2]
            return
        args["C"][...] = out

    def sync(self) -> None:
        self.log.append("sync")

    def flush(self, buffer: np.ndarray, value: int) -> None:
        self.log.append(f"flush {buffer.nbytes}")

    def time_us(self, run: Any) -> float:
        run()
        self.log.append("time")
        return next(self.times)


def _kernel(source: str) -> dict[str, Any]:
    return {"source": source, "launches": [{"name": "k", "grid": [1, 1, 1], "block": [32, 1, 1], "smem": 0,
                                            "params": ["A", "B", "C"]}], "scratch": []}


def _init(**timing: float) -> dict[str, Any]:
    specs = [{"name": "A", "shape": [16, 8], "dtype": "float32"}, {"name": "B", "shape": [8, 12], "dtype": "float32"}]
    return {"device": "fake", "seed": 0, "inputs": specs, "outputs": [{"name": "C", "shape": [16, 12],
            "dtype": "float32"}], "reference": _kernel("ref"), "flush_bytes": 4096,
            **{"warmup_ms": 0.0, "target_ms": 0.0, "min_repeats": 5, "max_repeats": 50, **timing}}


def test_timed_repetitions_each_follow_an_l2_flush_and_give_percentiles() -> None:
    dev = FakeDevice([1.0, 1.0, 1.0, 50.0, 10.0, 30.0, 20.0, 40.0])  # 3 warm-up runs, then 5 timed
    bench = KernelBench(_init(), device=dev)
    dev.log.clear()
    reply = bench.handle({"op": "measure", **_kernel("good")})
    assert reply["status"] == "ok" and reply["times_us"] == [50.0, 10.0, 30.0, 20.0, 40.0]
    timed = dev.log[dev.log.index("flush 4096"):]
    assert timed == ["flush 4096", "time"] * 5, dev.log
    assert dev.log[:dev.log.index("flush 4096")] == ["sync", "time", "time", "time"]  # check, then warm-up
    m = S.backends.worker.measurement_from_reply(reply, 0.1)
    assert (m.time_us, m.p20_us, m.p80_us) == (30.0, 18.0, 42.0)


class AddressLoggingDevice(FakeDevice):
    def launch(self, fn: str, grid: Any, block: Any, params: list[tuple[str, Any]], smem: int) -> None:
        args = dict(params)
        self.log.append(f"A@{args['A'].ctypes.data} C@{args['C'].ctypes.data}")
        super().launch(fn, grid, block, params, smem)


def test_inputs_smaller_than_the_l2_are_rotated() -> None:
    """1,664 bytes of arrays against a 2,048-byte L2 (the flush is twice it): 3 sets, equal in value, each
    with outputs of its own, timed in turns so no repetition finds its arrays left by the previous one."""
    dev = AddressLoggingDevice([1.0] * 100)
    bench = KernelBench(_init(), device=dev)
    assert len(bench.input_sets) == 3
    assert all(np.array_equal(s["A"], bench.inputs["A"]) for s in bench.input_sets)
    dev.log.clear()
    assert bench.handle({"op": "measure", **_kernel("good")})["status"] == "ok"
    timed = [e for e in dev.log[dev.log.index("flush 4096"):] if e.startswith("A@")]
    assert len(timed) == 5 and len(set(timed[:3])) == 3 and timed[3:] == timed[:2]
    big = KernelBench({**_init(), "flush_bytes": 2 * 1664}, device=FakeDevice([1.0] * 100))
    assert len(big.input_sets) == 1  # one set already fills the L2


class RecordingFunction:
    """A cupy RawKernel stand-in: counts the (driver) attribute writes and the launches."""

    def __init__(self) -> None:
        self.attribute_writes: list[int] = []
        self.launches = 0

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self.attribute_writes[-1] if self.attribute_writes else 0

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self.attribute_writes.append(value)

    def __call__(self, grid: Any, block: Any, params: Any, shared_mem: int = 0) -> None:
        self.launches += 1


def test_the_gpu_device_opts_into_shared_memory_once_per_function() -> None:
    dev = object.__new__(CupyDevice)  # no cupy here: only the launch logic
    dev._opted_in = {}
    big, small = RecordingFunction(), RecordingFunction()
    for _ in range(5):
        dev.launch(big, (1, 1, 1), (128, 1, 1), [("n", 3)], 100_000)
        dev.launch(small, (1, 1, 1), (128, 1, 1), [("n", 3)], 1024)
    dev.launch(big, (1, 1, 1), (128, 1, 1), [("n", 3)], 150_000)  # more than allowed so far: asked again
    assert big.attribute_writes == [100_000, 150_000] and big.launches == 6
    assert small.attribute_writes == [] and small.launches == 5


def test_rotation_copies_and_round_robin() -> None:
    from schedlib.runtime.timing import rotation_copies, round_robin

    l2 = 50 << 20
    assert rotation_copies(l2, l2) == rotation_copies(3 * l2, l2) == rotation_copies(0, l2) == 1
    assert rotation_copies(l2 // 2, l2) == 4 and rotation_copies(l2 - 1, l2) == 3
    assert rotation_copies(1024, l2) == 8 and rotation_copies(1024, l2, limit=2) == 2
    seen: list[int] = []
    run = round_robin([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        run()
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="at least one run"):
        round_robin([])


def test_repetitions_follow_the_time_budget_and_the_rebenchmark_factor() -> None:
    dev = FakeDevice([100.0] * 1000)
    bench = KernelBench(_init(warmup_ms=1.0, target_ms=2.0, min_repeats=3, max_repeats=50), device=dev)
    assert len(bench.handle({"op": "measure", **_kernel("good")})["times_us"]) == 20  # 2 ms / 100 us
    assert len(bench.handle({"op": "measure", "repeat_factor": 3, **_kernel("good")})["times_us"]) == 60


@pytest.mark.parametrize(("source", "status", "restart"), [
    ("syntax error", "compile_error", False), ("illegal", "illegal_address", True),
    ("too big", "launch_error", False), ("wrong", "wrong_result", None), ("partial", "wrong_result", None)])
def test_failures_are_typed(source: str, status: str, restart: bool | None) -> None:
    bench = KernelBench(_init(), device=FakeDevice([1.0] * 100))
    reply = bench.handle({"op": "measure", **_kernel(source)})
    assert reply["status"] == status
    assert reply.get("restart") is restart
    if source == "partial":
        assert "never written" in reply["error"]
    if source == "wrong":
        assert "max abs error 1" in reply["error"]


def test_inputs_are_exact_in_every_dtype() -> None:
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float16", "bfloat16", "int8", "int32"):
        x = host_input({"shape": [64], "dtype": dtype}, rng)
        values = (x.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else x.astype(np.float64)
        assert set(np.unique(values)) <= {-1.0, -0.5, 0.0, 0.5, 1.0, -2.0, 2.0}, dtype


def test_the_flush_buffer_is_twice_the_l2_of_the_target() -> None:
    func = sl.workloads.matmul(64, 64, 64)
    for target in ("h100", "a100"):
        backend = S.GpuBackend()
        init = backend.init_message(func, target, find_rule(func, resolve(target)))
        assert init["flush_bytes"] == 2 * resolve(target).l2_bytes
        assert [s["name"] for s in init["inputs"]] == ["A", "B"] and init["reference"]["launches"]


def test_symbolic_shapes_are_refused_with_the_buffer_named() -> None:
    func = sl.workloads.matmul(sl.var("M"), 64, 64)
    with pytest.raises(sl.SchedlibError, match="buffer A of matmul has shape"):
        buffer_specs(func, func.inputs)


# the CPU emulator -----------------------------------------------------------------------------------------
@needs_gxx
@pytest.mark.parametrize("func", [sl.workloads.matmul(24, 40, 20, epilogue="bias_relu"),
                                  sl.workloads.matmul(16, 24, 8, dtype="float16", batch=2),
                                  sl.workloads.softmax(6, 20)], ids=["matmul_bias_relu", "bmm_fp16", "softmax"])
def test_naive_reference_schedule_matches_run_reference(func: sl.Func) -> None:
    rng = np.random.default_rng(1)
    inputs = {n: host_input({"shape": [int(d.value) for d in func.buffer(n).shape], "dtype": func.buffer(n).dtype},
                            rng) for n in func.inputs}
    want = sl.run_reference(func, inputs)
    got = sl.build(S.naive_reference_schedule(func), "h100").run_cpu(*inputs.values(), bounds_check=True)
    got = got if isinstance(got, tuple) else (got,)
    for name, arr in zip(func.outputs, got):
        np.testing.assert_allclose(np.asarray(arr, np.float64), np.asarray(want[name], np.float64),
                                   rtol=1e-3, atol=1e-3)


@needs_gxx
def test_int8_outputs_go_through_the_pipeline() -> None:
    """An int8 output starts out holding int8's minimum, not the 32-bit sentinel numpy refuses to store."""
    func = sl.workloads.elementwise((8, 40), ("add", "relu"), "int8")
    res = S.tune(func, "h100", trials=1, strategy="random", storage="memory", quiet=True, seed=0,
                 backend=S.GpuBackend(device="emulator", warmup_ms=0.0, target_ms=0.0, min_repeats=1,
                                      max_repeats=1, timeout_s=300))
    assert list(res.records["status"]) == ["ok"], res.records[["status", "error"]]


class ManglingGpuBackend(S.GpuBackend):
    """Sends the default kernel for every config, broken on purpose for some: the pipeline must catch it."""

    def __init__(self, func: sl.Func, **kwargs: Any) -> None:
        super().__init__(device="emulator", warmup_ms=0.0, target_ms=0.0, min_repeats=3, max_repeats=3, **kwargs)
        self.func = func

    def payload(self, config: dict[str, Any], schedule: Any) -> dict[str, Any]:
        base = kernel_payload(sl.build(find_rule(self.func, "h100").apply(self.func, "h100"), "h100"))
        mangled = copy.deepcopy(base)
        how = config["thread_n"]
        if how == 2:  # half the blocks: outputs never written
            mangled["launches"][0]["grid"][0] = max(1, base["launches"][0]["grid"][0] // 2)
            mangled["launches"][0]["grid"][1] = max(1, base["launches"][0]["grid"][1] // 2)
        elif how == 4:  # twice the blocks: writes past the end of C
            mangled["launches"][0]["grid"][1] *= 2
        elif how == 8:
            mangled["source"] += "\nthis is not C++;\n"
        return mangled


@needs_gxx
def test_the_whole_gpu_pipeline_on_the_emulator() -> None:
    func = sl.workloads.matmul(32, 32, 16)
    res = S.tune(func, "h100", trials=2, strategy="random", storage="memory", quiet=True, seed=0,
                 backend=S.GpuBackend(device="emulator", warmup_ms=0.0, target_ms=0.0, min_repeats=3,
                                      max_repeats=3, timeout_s=300))
    assert res.key.backend == "emulated"
    assert list(res.records["status"]) == ["ok", "ok"], res.records[["status", "error"]]
    assert res.records["source"].iloc[0] == "default"
    best_key = S.config_key(res.best_config)
    rebench = res.study.user_attrs[f"rebench:{best_key}"]
    assert rebench["status"] == "ok" and rebench["figures"]["repeats"] == 9  # 3 x the repetitions
    assert res.best_time_us == rebench["time_us"]


@needs_gxx
def test_broken_kernels_are_caught_by_the_pipeline() -> None:
    func = sl.workloads.matmul(64, 64, 16)
    backend = ManglingGpuBackend(func, timeout_s=300)
    rule = find_rule(func, resolve("h100"))
    backend.open(func, "h100", rule)
    try:
        default = rule.default_config(func, resolve("h100"))
        results = {n: backend.measure({**default, "thread_n": n}, None) for n in (1, 2, 4, 8)}
    finally:
        backend.close()
    assert results[1].status == "ok"
    assert results[2].status == "wrong_result" and "never written" in results[2].error
    assert results[4].status == "illegal_address" and "out of bounds" in results[4].error
    assert results[8].status == "compile_error"


@pytest.mark.gpu
def test_tuning_on_the_gpu(tmp_path: Path) -> None:
    from schedlib.runtime.gpu import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA device is visible")
    func = sl.workloads.matmul(1024, 1024, 1024)
    res = S.tune(func, "auto", trials=6, strategy="evolutionary", storage=tmp_path / "gpu.log", backend="gpu",
                 quiet=True)
    ok = res.records[res.records["status"] == "ok"]
    assert len(ok) >= 4 and (ok["p20_us"] <= ok["time_us"]).all() and (ok["time_us"] <= ok["p80_us"]).all()
    assert S.apply_best(func, "auto", tmp_path / "gpu.log").config == res.best_config


@needs_gxx
def test_a_tma_fed_wgmma_kernel_goes_through_the_pipeline() -> None:
    """The payload carries the architecture (sm_90a: cupy's JIT cannot build wgmma) and the tensor maps, which
    the worker builds from the very arrays it launches with."""
    func = sl.workloads.matmul(64, 64, 64, "float16")
    rule = find_rule(func, "h100")
    payload = kernel_payload(sl.build(rule.apply(func, "h100"), "h100"))
    assert payload["arch"] == "sm_90a"
    (launch,) = payload["launches"]
    assert [m["param"] for m in launch["tensor_maps"]] == ["@tmap:A", "@tmap:B"] == launch["params"][-2:]
    res = S.tune(func, "h100", trials=1, strategy="random", storage="memory", quiet=True, seed=0,
                 backend=S.GpuBackend(device="emulator", warmup_ms=0.0, target_ms=0.0, min_repeats=1,
                                      max_repeats=1, timeout_s=300))
    assert res.records["config"].iloc[0]["tensor_core"] == "wgmma_tma"
    assert list(res.records["status"]) == ["ok"], res.records[["status", "error"]]
