"""Build a :class:`HardwareProfile` for the GPU that is actually present.

Why two sources: ``cudaGetDeviceProperties`` reports structural limits exactly (SM count, per-SM
resources, cache size, clocks) - including for cut-down or MIG-partitioned parts no datasheet covers -
but it says nothing about throughput.  So structural numbers come from the device and throughput and
bandwidth numbers from the matching shipped profile.  For a GPU no profile describes, the few numbers
that can be derived are derived (and a warning says which), from the one architecture table below.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schedlib.errors import ProfileError
from schedlib.hw.profile import HardwareProfile, normalize_name, validate


class ProfileWarning(UserWarning):
    """A detected profile rests on estimates (unknown GPU) or was adjusted (SM count differs), or a
    profile file on the search path was skipped because it does not load."""


_SM70 = ("m8n8k4",)
_SM75 = ("m16n8k8", "m8n8k4", "m8n8k16", "m8n8k32")
_SM80 = ("m16n8k16", "m16n8k8", "m16n8k4", "m16n8k32", "m16n8k64", "m8n8k4", "m8n8k16", "m8n8k32")


@dataclass(frozen=True)
class ArchTraits:
    """What one compute capability implies beyond what ``cudaGetDeviceProperties`` reports.

    fp32_lanes_per_sm: FP32 FMA results per clock per SM (CUDA C++ Programming Guide, "Arithmetic
        Instructions" throughput table); peak FP32 = SMs x lanes x 2 FLOP x clock.
    l2_bytes_per_clk_per_sm: sustained L2 read bytes per clock per SM, from the public gpu-benches
        measurements behind the shipped profiles (V100, A100, H200, L40); entries marked "assumed" reuse
        the nearest measured architecture.  Only used for GPUs without a profile.
    shared_memory_alloc_unit: shared-memory allocation granularity (CUDA toolkit cuda_occupancy.h,
        cudaOccSMemAllocationGranularity).
    reserved_shared_per_block: driver reserve per block, used only when the device does not report
        ``reservedSharedMemPerBlock``.
    """

    family: str
    fp32_lanes_per_sm: int
    l2_bytes_per_clk_per_sm: float
    shared_memory_alloc_unit: int
    reserved_shared_per_block: int
    tensor_core_shapes: tuple[str, ...]


# The one per-architecture table.  Keyed by (major, minor); an unlisted minor falls back to the highest
# listed minor of the same major (with a warning).
ARCH_TABLE: dict[tuple[int, int], ArchTraits] = {
    (7, 0): ArchTraits("Volta", 64, 23.0, 256, 0, _SM70),  # V100 PCIe: 2545 GB/s / (80 SM x 1.38 GHz)
    (7, 2): ArchTraits("Volta (Xavier)", 64, 23.0, 256, 0, _SM70),  # L2 assumed = GV100
    (7, 5): ArchTraits("Turing", 64, 23.0, 256, 0, _SM75),  # L2 assumed = GV100
    (8, 0): ArchTraits("Ampere GA100", 64, 35.5, 128, 1024, _SM80),  # A100: 5400 GB/s / (108 x 1.41 GHz)
    (8, 6): ArchTraits("Ampere GA10x", 128, 14.7, 128, 1024, _SM80),  # L2 assumed = Ada
    (8, 7): ArchTraits("Ampere (Orin)", 128, 14.7, 128, 1024, _SM80),  # L2 assumed = Ada
    (8, 9): ArchTraits("Ada", 128, 14.7, 128, 1024, _SM80),  # L40: 5200 GB/s / (142 x 2.49 GHz)
    (9, 0): ArchTraits("Hopper", 128, 37.1, 128, 1024, (*_SM80, "wgmma")),  # H200: 9700 / (132 x 1.98)
    (10, 0): ArchTraits("Blackwell datacenter", 128, 37.1, 128, 1024, _SM80),  # L2 assumed = Hopper
    (12, 0): ArchTraits("Blackwell RTX", 128, 14.7, 128, 1024, _SM80),  # L2 assumed = Ada
}

# CUDA-wide constants (the same on every architecture in ARCH_TABLE).
REGISTER_ALLOC_UNIT = 256  # registers, allocated per warp (cuda_occupancy.h)
MAX_REGISTERS_PER_THREAD = 255  # Programming Guide, technical specifications per compute capability
SHARED_BYTES_PER_CLK_PER_SM = 128  # 32 banks x 4 bytes
TRANSACTION_BYTES = {"global_sector": 32, "global_line": 128, "shared_bank": 4}
SHARED_BANKS = 32
GUIDE_URL = "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#compute-capabilities"

# cudaDeviceProp name -> profile field, for the limits the device reports exactly.
_STRUCTURAL = {
    "multiProcessorCount": "sm_count",
    "warpSize": "warp_size",
    "maxThreadsPerBlock": "max_threads_per_block",
    "maxThreadsPerMultiProcessor": "max_threads_per_sm",
    "maxBlocksPerMultiProcessor": "max_blocks_per_sm",
    "regsPerMultiprocessor": "registers_per_sm",
    "sharedMemPerBlock": "shared_memory_per_block",
    "sharedMemPerBlockOptin": "shared_memory_per_block_optin",
    "sharedMemPerMultiprocessor": "shared_memory_per_sm",
    "l2CacheSize": "l2_bytes",
}
# CUDA 13 dropped these from cudaDeviceProp; the attribute API still has them.
_ATTRIBUTE_FALLBACKS = {
    "clockRate": "cudaDevAttrClockRate",
    "memoryClockRate": "cudaDevAttrMemoryClockRate",
    "memoryBusWidth": "cudaDevAttrGlobalMemoryBusWidth",
    "reservedSharedMemPerBlock": "cudaDevAttrReservedSharedMemoryPerBlock",
}


def arch_traits(major: int, minor: int) -> ArchTraits:
    """The :data:`ARCH_TABLE` entry for a compute capability (same-major fallback, with a warning)."""
    if (major, minor) in ARCH_TABLE:
        return ARCH_TABLE[(major, minor)]
    same_major = [m for (ma, m) in ARCH_TABLE if ma == major and m <= minor]
    if not same_major:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(ARCH_TABLE))
        raise ProfileError(
            f"compute capability {major}.{minor} is not in the architecture table (known: {known}); "
            f"write a hwprofiles/<key>.yaml for this GPU and load it by path"
        )
    fallback = (major, max(same_major))
    warnings.warn(
        f"compute capability {major}.{minor} is not in the architecture table; using the "
        f"{fallback[0]}.{fallback[1]} ({ARCH_TABLE[fallback].family}) entry",
        ProfileWarning,
        stacklevel=4,
    )
    return ARCH_TABLE[fallback]


def _device_properties(device: int) -> dict[str, Any]:
    """Properties of a live CUDA device through cupy, with CUDA-13-removed fields filled in."""
    try:
        from cupy.cuda import runtime
    except ImportError as exc:
        raise ProfileError(
            "detect(): cupy is not installed, so no GPU can be queried; install cupy-cuda12x or "
            "cupy-cuda13x, pass properties=..., or load a profile by name"
        ) from exc
    try:
        props = dict(runtime.getDeviceProperties(device))
        for key, attribute in _ATTRIBUTE_FALLBACKS.items():
            if key not in props and hasattr(runtime, attribute):
                props[key] = runtime.deviceGetAttribute(getattr(runtime, attribute), device)
    except Exception as exc:  # cupy raises CUDARuntimeError when there is no driver or no such device
        raise ProfileError(f"detect(): cannot query CUDA device {device} through cupy: {exc}") from exc
    return props


def _prop(props: Mapping[str, Any], key: str, label: str) -> Any:
    if key not in props:
        raise ProfileError(f"{label}: device property '{key}' is missing from the properties")
    return props[key]


def _match(name: str, cc: str) -> HardwareProfile | None:
    """The profile whose key, name or an alias equals the device name and whose capability agrees."""
    from schedlib.hw import all_profiles  # the package imports this module, so import at call time

    wanted = normalize_name(name)
    for profile in all_profiles():
        names = (profile.key, profile.name, *profile.aliases)
        if profile.compute_capability == cc and any(normalize_name(n) == wanted for n in names):
            return profile
    return None


def detect(device: int = 0, properties: Mapping[str, Any] | None = None) -> HardwareProfile:
    """The profile of CUDA device ``device`` (through cupy), or of ``properties`` given as a mapping with
    the keys ``cupy.cuda.runtime.getDeviceProperties`` returns (so this is testable without a GPU).

    ``device`` is ignored when ``properties`` is given.  Raises :class:`ProfileError` when cupy or a
    GPU is missing.  Warns (:class:`ProfileWarning`) when no shipped profile matches and numbers had to
    be derived, or when the device's SM count differs from its profile's.
    """
    if properties is None:
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise ProfileError(f"detect(): argument device={device!r}: must be a non-negative integer")
        props, where = _device_properties(device), f"CUDA device {device}"
    else:
        props, where = dict(properties), "the given device properties"
    raw_name = _prop(props, "name", where)
    name = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)
    name = name.strip("\x00 ")
    label = f"<{where}: {name}>"
    for key in ("major", "minor"):
        value = _prop(props, key, label)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 100:
            raise ProfileError(f"{label}: device property '{key}' = {value!r}: must be a small integer")
    cc = f"{props['major']}.{props['minor']}"
    structural: dict[str, Any] = {f: _prop(props, p, label) for p, f in _STRUCTURAL.items()}
    threads, warp = structural["max_threads_per_sm"], structural["warp_size"]
    if isinstance(threads, int) and isinstance(warp, int) and warp > 0:
        structural["max_warps_per_sm"] = threads // warp
    if props.get("reservedSharedMemPerBlock") is not None:
        structural["shared_memory_reserved_per_block"] = props["reservedSharedMemPerBlock"]
    if props.get("clockRate"):
        structural["clock_mhz"] = round(props["clockRate"] / 1000)  # kHz -> MHz
    profile = _match(name, cc)
    if profile is not None:
        return _from_profile(profile, structural, where, label)
    return _derive(name, cc, structural, props, where, label)


def _from_profile(
    profile: HardwareProfile, structural: dict[str, Any], where: str, label: str
) -> HardwareProfile:
    """Structural numbers from the device, throughput and bandwidth from the matching profile."""
    raw = profile.to_dict()
    raw.update(structural)
    raw["source"] = [*profile.source, f"structural limits read from {where} (cudaGetDeviceProperties); "
                     f"throughput and bandwidth from {profile.origin}"]  # fmt: skip
    derived: tuple[str, ...] = ()
    # Peak throughput and shared bandwidth are per-SM rates times the SM count times the clock, so a device
    # with fewer SMs (a MIG slice) or another clock than the profile describes scales them; the model would
    # otherwise time issue slots at the device's clock and arithmetic at the profile's.
    differences, ratio = [], 1.0
    sms, clock = raw["sm_count"], raw["clock_mhz"]
    if isinstance(sms, int) and sms != profile.sm_count and sms > 0:
        ratio *= sms / profile.sm_count
        differences.append(f"{sms} SMs where profile '{profile.key}' describes {profile.sm_count}")
    if isinstance(clock, (int, float)) and not isinstance(clock, bool) and clock > 0 and clock != profile.clock_mhz:
        ratio *= clock / profile.clock_mhz
        differences.append(f"a {clock} MHz clock where profile '{profile.key}' describes {profile.clock_mhz} MHz")
    if differences:
        raw["peak_tflops"] = {k: v * ratio for k, v in raw["peak_tflops"].items()}
        raw["bandwidth_gbs"]["shared"] *= ratio
        derived = ("peak_tflops", "bandwidth_gbs.shared")
        warnings.warn(
            f"{label} has {' and '.join(differences)}; peak throughput and shared bandwidth were scaled by "
            f"{ratio:.3f}, DRAM and L2 bandwidth were not",
            ProfileWarning,
            stacklevel=3,
        )
    detected = validate(raw, label)
    return dataclasses.replace(detected, derived=derived)


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return slug or "unknown_gpu"


def _derive(name: str, cc: str, structural: dict[str, Any], props: Mapping[str, Any], where: str,
            label: str) -> HardwareProfile:  # fmt: skip
    """A profile for a GPU no shipped file describes: exact structure, derived throughput."""
    major, minor = (int(x) for x in cc.split("."))
    traits = arch_traits(major, minor)
    clock_khz = _prop(props, "clockRate", label)
    mem_khz, bus_bits = _prop(props, "memoryClockRate", label), _prop(props, "memoryBusWidth", label)
    for key, value in (("clockRate", clock_khz), ("memoryClockRate", mem_khz), ("memoryBusWidth", bus_bits)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ProfileError(f"{label}: device property '{key}' = {value!r}: must be a positive number")
    sms, clock_hz = structural["sm_count"], clock_khz * 1e3
    if isinstance(sms, bool) or not isinstance(sms, int) or sms <= 0:
        raise ProfileError(f"{label}: field 'sm_count' = {sms!r}: must be a positive integer")
    raw: dict[str, Any] = {
        "key": _slug(name),
        "name": name,
        "aliases": [name],
        "source": [
            f"derived from {where} (cudaGetDeviceProperties) and the {traits.family} entry of "
            f"schedlib.hw.detect.ARCH_TABLE; CUDA C++ Programming Guide: {GUIDE_URL}"
        ],
        "compute_capability": cc,
        "max_registers_per_thread": MAX_REGISTERS_PER_THREAD,
        "register_alloc_unit": REGISTER_ALLOC_UNIT,
        "shared_memory_reserved_per_block": traits.reserved_shared_per_block,
        "shared_memory_alloc_unit": traits.shared_memory_alloc_unit,
        **structural,
        "bandwidth_gbs": {
            "dram": 2 * mem_khz * 1e3 * bus_bits / 8 / 1e9,  # double data rate x bus width
            "l2": sms * traits.l2_bytes_per_clk_per_sm * clock_hz / 1e9,
            "shared": sms * SHARED_BYTES_PER_CLK_PER_SM * clock_hz / 1e9,
        },
        "peak_tflops": {"fp32_simt": sms * traits.fp32_lanes_per_sm * 2 * clock_hz / 1e12},
        "transaction_bytes": dict(TRANSACTION_BYTES),
        "shared_banks": SHARED_BANKS,
        "tensor_core_shapes": list(traits.tensor_core_shapes),
    }
    profile = validate(raw, label)
    derived = ("bandwidth_gbs.dram", "bandwidth_gbs.l2", "bandwidth_gbs.shared", "peak_tflops.fp32_simt")
    warnings.warn(
        f"{label} (compute capability {cc}) matches no shipped hardware profile; derived estimates for "
        f"{', '.join(derived)}; no fp16/bf16/tensor-core throughput is known, so peak_flops() raises for "
        f"those. Add hwprofiles/<key>.yaml (with its source) for accurate numbers.",
        ProfileWarning,
        stacklevel=3,
    )
    return dataclasses.replace(profile, derived=derived)
