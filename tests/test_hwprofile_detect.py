"""Hardware profiles from a device: ``hw.detect`` on cupy's device properties (a shipped profile matched by
name and capability, or one derived from the architecture table with a warning), its failures without cupy or
a GPU, and ``hw.resolve``."""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from pathlib import Path

import pytest

import schedlib.hw as hw
from schedlib.errors import ProfileError
from schedlib.hw import ProfileWarning

REPO = Path(__file__).resolve().parents[1]
detect_module = importlib.import_module("schedlib.hw.detect")

# cudaGetDeviceProperties of an H100 SXM5 (values as cupy reports them; clocks in kHz).
H100_PROPS = {
    "name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multiProcessorCount": 132, "warpSize": 32,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiProcessor": 2048, "maxBlocksPerMultiProcessor": 32,
    "regsPerMultiprocessor": 65536, "regsPerBlock": 65536, "sharedMemPerBlock": 49152,
    "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472,
    "reservedSharedMemPerBlock": 1024, "l2CacheSize": 52428800, "clockRate": 1980000,
    "memoryClockRate": 2619000, "memoryBusWidth": 5120, "totalGlobalMem": 85017493504,
}  # fmt: skip
# A GPU with no shipped profile: GeForce RTX 3090 (82 SMs, 1695 MHz, 384-bit GDDR6X at 9751 MHz).
RTX3090_PROPS = {
    "name": "NVIDIA GeForce RTX 3090", "major": 8, "minor": 6, "multiProcessorCount": 82, "warpSize": 32,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiProcessor": 1536, "maxBlocksPerMultiProcessor": 16,
    "regsPerMultiprocessor": 65536, "sharedMemPerBlock": 49152, "sharedMemPerBlockOptin": 101376,
    "sharedMemPerMultiprocessor": 102400, "reservedSharedMemPerBlock": 1024, "l2CacheSize": 6291456,
    "clockRate": 1695000, "memoryClockRate": 9751000, "memoryBusWidth": 384,
}  # fmt: skip

@pytest.fixture(autouse=True)
def _no_user_profile_path(monkeypatch):
    monkeypatch.delenv("SCHEDLIB_HWPROFILE_PATH", raising=False)


# ---------------------------------------------------------------- detection


def test_detect_h100_matches_shipped_profile_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        detected = hw.detect(properties=H100_PROPS)
    shipped = hw.load("h100")
    assert detected == shipped  # structure from the device agrees; throughput came from the file
    assert detected.bandwidth_gbs.dram == 3350 and detected.bandwidth_gbs.l2 == 9700
    assert detected.derived == ()
    assert any("structural limits read from the given device properties" in s for s in detected.source)


def test_detect_takes_structure_from_the_device():
    props = H100_PROPS | {"name": b"NVIDIA H100 80GB HBM3\x00", "l2CacheSize": 48 * 2**20}
    props["clockRate"] = 1755000
    props.pop("memoryClockRate")  # not needed when a profile matches
    with pytest.warns(ProfileWarning, match="a 1755 MHz clock where profile 'h100' describes 1980 MHz"):
        detected = hw.detect(properties=props)
    assert detected.key == "h100"
    assert (detected.l2_bytes, detected.clock_mhz) == (48 * 2**20, 1755)
    # Regression: the peaks stayed at the profile's clock while the model timed issue slots at the device's.
    shipped = hw.load("h100")
    assert detected.peak_tflops.fp16_tensor == pytest.approx(shipped.peak_tflops.fp16_tensor * 1755 / 1980)
    assert detected.bandwidth_gbs.shared == pytest.approx(shipped.bandwidth_gbs.shared * 1755 / 1980)
    assert detected.bandwidth_gbs.dram == shipped.bandwidth_gbs.dram and "peak_tflops" in detected.derived


def test_detect_scales_per_sm_throughput_when_sm_count_differs():
    with pytest.warns(ProfileWarning, match="has 66 SMs where profile 'h100' describes 132"):
        half = hw.detect(properties=H100_PROPS | {"multiProcessorCount": 66})
    assert half.sm_count == 66
    assert half.peak_tflops.fp16_tensor == pytest.approx(989.4 / 2)
    assert half.bandwidth_gbs.shared == pytest.approx(33454 / 2)
    assert half.bandwidth_gbs.dram == 3350
    assert "peak_tflops" in half.derived


def test_detect_unknown_gpu_warns_and_derives():
    with pytest.warns(ProfileWarning, match=r"NVIDIA GeForce RTX 3090.*matches no shipped hardware profile"):
        p = hw.detect(properties=RTX3090_PROPS)
    assert p.key == "nvidia_geforce_rtx_3090" and p.compute_capability == "8.6"
    assert (p.sm_count, p.max_threads_per_sm, p.max_blocks_per_sm, p.clock_mhz) == (82, 1536, 16, 1695)
    assert p.max_warps_per_sm == 48 and p.shared_memory_per_block_optin == 101376
    assert p.bandwidth_gbs.dram == pytest.approx(936.096)  # 2 x 9751 MHz x 384 bit / 8
    assert p.peak_tflops.fp32_simt == pytest.approx(35.58, abs=0.01)  # 82 x 128 x 2 x 1695 MHz
    assert p.bandwidth_gbs.shared == pytest.approx(82 * 128 * 1.695)
    assert p.l2_bytes_per_s > p.dram_bytes_per_s
    assert "bandwidth_gbs.dram" in p.derived and "peak_tflops.fp32_simt" in p.derived
    # an unprofiled Ampere GA10x part gets the architecture's tensor rate (the a10g profile's), not nothing
    assert p.peak_flops("float16", tensor_core=True) == pytest.approx(82 * 511 * 1695e6)
    with pytest.raises(ProfileError, match="fp16_simt"):
        p.peak_flops("float16", tensor_core=False)


def test_detect_needs_name_and_capability_to_match():
    with pytest.warns(ProfileWarning, match="matches no shipped"):
        p = hw.detect(properties=H100_PROPS | {"major": 8, "minor": 0})
    assert p.key == "nvidia_h100_80gb_hbm3"


def test_detect_reports_missing_or_bad_properties():
    props = dict(RTX3090_PROPS)
    del props["multiProcessorCount"]
    with pytest.raises(ProfileError, match="'multiProcessorCount' is missing"):
        hw.detect(properties=props)
    with pytest.raises(ProfileError, match=r"RTX 3090>: field 'max_threads_per_block' = -1"):
        hw.detect(properties=RTX3090_PROPS | {"maxThreadsPerBlock": -1})
    with pytest.raises(ProfileError, match="'memoryBusWidth' = 0"):
        hw.detect(properties=RTX3090_PROPS | {"memoryBusWidth": 0})
    with pytest.raises(ProfileError, match="device property 'minor' = '0'"):
        hw.detect(properties=RTX3090_PROPS | {"minor": "0"})


def test_detect_unknown_architecture():
    with pytest.raises(ProfileError, match=r"compute capability 6\.1 is not in the architecture table"):
        hw.detect(properties=RTX3090_PROPS | {"major": 6, "minor": 1})
    with pytest.warns(ProfileWarning) as record:
        p = hw.detect(properties=RTX3090_PROPS | {"major": 12, "minor": 1, "name": "Future GPU"})
    assert any("using the 12.0" in str(w.message) for w in record)
    assert p.arch == "sm_121"


def _fake_cupy(monkeypatch, runtime: types.ModuleType) -> None:
    cupy, cuda = types.ModuleType("cupy"), types.ModuleType("cupy.cuda")
    cupy.cuda, cuda.runtime = cuda, runtime
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.runtime", runtime)


def test_detect_without_cupy(monkeypatch):
    # None in sys.modules makes the import raise ImportError, also when an earlier test imported cupy.
    for name in ("cupy", "cupy.cuda", "cupy.cuda.runtime"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ProfileError, match="cupy is not installed"):
        hw.detect()


def test_detect_without_gpu(monkeypatch):
    runtime = types.ModuleType("cupy.cuda.runtime")

    def no_device(device):
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    runtime.getDeviceProperties = no_device
    _fake_cupy(monkeypatch, runtime)
    with pytest.raises(ProfileError, match="cannot query CUDA device 0 through cupy: cudaErrorNoDevice"):
        hw.detect()
    with pytest.raises(ProfileError, match="device=-1"):
        hw.detect(device=-1)


def test_detect_live_path_fills_fields_cuda13_dropped(monkeypatch):
    """CUDA 13 removed clockRate/memoryClockRate from cudaDeviceProp: detect asks the attribute API."""
    runtime = types.ModuleType("cupy.cuda.runtime")
    props = {k: v for k, v in H100_PROPS.items() if k not in ("clockRate", "memoryClockRate")}
    props["name"] = b"NVIDIA H100 80GB HBM3"
    attributes = {13: 1980000, 36: 2619000}
    runtime.cudaDevAttrClockRate, runtime.cudaDevAttrMemoryClockRate = 13, 36
    runtime.getDeviceProperties = lambda device: dict(props)
    runtime.deviceGetAttribute = lambda attribute, device: attributes[attribute]
    _fake_cupy(monkeypatch, runtime)
    detected = hw.detect(0)
    assert detected == hw.load("h100") and "CUDA device 0" in detected.origin


# ---------------------------------------------------------------- resolve


def test_resolve(monkeypatch):
    profile = hw.load("l4")
    assert hw.resolve(profile) is profile
    assert hw.resolve("l4") == profile
    assert hw.resolve("NVIDIA L4") == profile
    assert hw.resolve(REPO / "hwprofiles" / "l4.yaml") == profile
    monkeypatch.setattr(hw, "detect", lambda: profile)
    assert hw.resolve("auto") is profile
    assert hw.resolve(" AUTO ") is profile
    with pytest.raises(ProfileError, match="resolve\\(\\): argument target=42"):
        hw.resolve(42)  # type: ignore[arg-type]


def test_detect_is_also_reachable_as_module():
    assert detect_module.detect is hw.detect
    assert set(detect_module.ARCH_TABLE) >= {(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (12, 0)}
