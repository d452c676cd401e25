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
    tensor_flop_per_clk_per_sm: dense tensor-core FLOP (OP for int8) per boost-clock cycle per SM, as
        (peak_tflops key, rate) pairs; peak = SMs x rate x clock.  Each rate is the lowest that any shipped
        profile of the architecture implies (peak / (sm_count x clock_mhz)), rounded down, so that an
        unprofiled part is not credited with more than a profiled one: GeForce parts run FP32 accumulate
        at half the data-center rate (on Turing only the data-center T4 is shipped, so a GeForce Turing
        part may still be overestimated), and Hopper's tensor peaks are quoted below the boost clock.
        Empty where no shipped profile of the architecture exists.  Only used for GPUs without a profile.
    """

    family: str
    fp32_lanes_per_sm: int
    l2_bytes_per_clk_per_sm: float
    shared_memory_alloc_unit: int
    reserved_shared_per_block: int
    tensor_core_shapes: tuple[str, ...]
    tensor_flop_per_clk_per_sm: tuple[tuple[str, int], ...] = ()


def _tc(fp16: int, bf16: int | None, tf32: int | None, int8: int | None) -> tuple[tuple[str, int], ...]:
    rates = {"fp16_tensor": fp16, "bf16_tensor": bf16, "tf32_tensor": tf32, "int8_tensor": int8}
    return tuple((k, v) for k, v in rates.items() if v is not None)


# The one per-architecture table.  Keyed by (major, minor); an unlisted minor falls back to the highest
# listed minor of the same major (with a warning).
ARCH_TABLE: dict[tuple[int, int], ArchTraits] = {
    (7, 0): ArchTraits("Volta", 64, 23.0, 256, 0, _SM70,  # V100 PCIe: 2545 GB/s / (80 SM x 1.38 GHz)
                       _tc(1021, None, None, None)),  # v100: 125 / (80 x 1530 MHz)
    (7, 2): ArchTraits("Volta (Xavier)", 64, 23.0, 256, 0, _SM70),  # L2 assumed = GV100
    (7, 5): ArchTraits("Turing", 64, 23.0, 256, 0, _SM75,  # L2 assumed = GV100
                       _tc(1022, None, None, 2044)),  # t4: 65 and 130 / (40 x 1590 MHz)
    (8, 0): ArchTraits("Ampere GA100", 64, 35.5, 128, 1024, _SM80,  # A100: 5400 GB/s / (108 x 1.41 GHz)
                       _tc(2048, 2048, 1024, 4097)),  # a100: 312, 312, 156, 624 / (108 x 1410 MHz)
    (8, 6): ArchTraits("Ampere GA10x", 128, 14.7, 128, 1024, _SM80,  # L2 assumed = Ada
                       _tc(511, 511, 255, 2048)),  # a10g: 70, 70, 35, 280.2 / (80 x 1710 MHz)
    (8, 7): ArchTraits("Ampere (Orin)", 128, 14.7, 128, 1024, _SM80),  # L2 assumed = Ada
    (8, 9): ArchTraits("Ada", 128, 14.7, 128, 1024, _SM80,  # L40: 5200 GB/s / (142 x 2.49 GHz)
                       _tc(512, 512, 256, 2047)),  # rtx4090: 165.2, 165.2, 82.6, 660.6 / (128 x 2520 MHz)
    (9, 0): ArchTraits("Hopper", 128, 37.1, 128, 1024, (*_SM80, "wgmma"),  # H200: 9700 / (132 x 1.98)
                       _tc(3781, 3781, 1889, 7562)),  # h100_pcie: 756.5, 756.5, 378, 1513 / (114 x 1755 MHz)
    (10, 0): ArchTraits("Blackwell datacenter", 128, 37.1, 128, 1024, _SM80),  # L2 assumed = Hopper
    (12, 0): ArchTraits("Blackwell RTX", 128, 14.7, 128, 1024, _SM80,  # L2 assumed = Ada
                        _tc(511, 511, 256, 2047)),  # rtx5090: 209.5, 209.5, 104.8, 838 / (170 x 2407 MHz)
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
    from schedlib.hw import all_profiles, ambiguous  # the package imports this module, so import at call time

    wanted = normalize_name(name)
    found = [p for p in all_profiles() if p.compute_capability == cc
             and any(normalize_name(n) == wanted for n in (p.key, p.name, *p.aliases))]
    if len(found) > 1:  # a user's copy of a shipped profile, say, that kept its aliases: say which one is used
        ambiguous(name, [p.origin or p.key for p in found])
    return found[0] if found else None


_BRANDS = frozenset({"nvidia", "tesla"})
# Words a device name adds to its chip's model for the board form factor, memory size or type, or a MIG
# slice ("A100-SXM4-40GB", "A100 80GB PCIe", "H100 NVL", "V100-PCIE-16GB"); such boards share the chip's
# per-SM rates, and what differs (SMs, clock, DRAM) detect reads from the device.
_VARIANT_WORD = re.compile(r"sxm\d?|pcie|nvl|hbm\d?e?|\d+gb|mig|\d+g\.\d+gb")


def _model(name: str) -> str | None:
    """The chip model a GPU name denotes ("a100" for "NVIDIA A100-PCIE-40GB"), or None when the name has
    words other than board variants: "RTX 4090 Laptop GPU" or "RTX A6000" is not a variant of a profile."""
    words = [w for w in re.split(r"[\s_-]+", normalize_name(name)) if w]
    while words and words[0] in _BRANDS:
        words.pop(0)
    if not words or not re.search(r"\d", words[0]) or not all(_VARIANT_WORD.fullmatch(w) for w in words[1:]):
        return None
    return words[0]


def _match_variant(name: str, cc: str, structural: Mapping[str, Any]) -> HardwareProfile | None:
    """The profile of the same chip (same model and capability) for a board no profile names, preferring
    the one with the device's SM count, then the nearest clock (an H100 NVL, 132 SMs, takes the SXM5's)."""
    from schedlib.hw import all_profiles

    model = _model(name)
    if model is None:
        return None
    candidates = [p for p in all_profiles() if p.compute_capability == cc
                  and any(_model(n) == model for n in (p.key, p.name, *p.aliases))]  # fmt: skip
    sms, clock = structural.get("sm_count"), structural.get("clock_mhz")

    def distance(p: HardwareProfile) -> tuple[float, float, str]:
        sm_gap = abs(sms - p.sm_count) if _positive(sms) else 0
        clock_gap = abs(clock - p.clock_mhz) if _positive(clock) else 0
        return sm_gap, clock_gap, p.key

    return min(candidates, key=distance, default=None)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _dram_gbs(props: Mapping[str, Any]) -> float | None:
    """DRAM bandwidth from the memory clock (kHz) and bus width (bits), or None when either is unusable."""
    mem_khz, bus_bits = props.get("memoryClockRate"), props.get("memoryBusWidth")
    if not (_positive(mem_khz) and _positive(bus_bits)):
        return None
    return 2 * mem_khz * 1e3 * bus_bits / 8 / 1e9  # double data rate x bus width


def detect(device: int = 0, properties: Mapping[str, Any] | None = None) -> HardwareProfile:
    """The profile of CUDA device ``device`` (through cupy), or of ``properties`` given as a mapping with
    the keys ``cupy.cuda.runtime.getDeviceProperties`` returns (so this is testable without a GPU).

    ``device`` is ignored when ``properties`` is given.  Raises :class:`ProfileError` when cupy or a
    GPU is missing.  Warns (:class:`ProfileWarning`) when no shipped profile matches and numbers had to
    be derived, when the device is another board of a profiled chip (``"NVIDIA A100-PCIE-40GB"`` takes
    the ``a100`` profile with its own DRAM bandwidth, SM count and clock), or when the device's SM count
    or clock differs from its profile's.
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
        return _from_profile(profile, structural, props, where, label)
    variant = _match_variant(name, cc, structural)
    if variant is not None:
        return _from_profile(variant, structural, props, where, label, device_name=name)
    return _derive(name, cc, structural, props, where, label)


def _from_profile(profile: HardwareProfile, structural: dict[str, Any], props: Mapping[str, Any], where: str,
                  label: str, device_name: str | None = None) -> HardwareProfile:  # fmt: skip
    """Structural numbers from the device, throughput and bandwidth from the matching profile.

    With ``device_name`` the profile is another board's of the same chip: the result is named after the
    device (so its tuning records stay its own) and takes the device's DRAM bandwidth where it reports one.
    """
    raw = profile.to_dict()
    raw.update(structural)
    raw["source"] = [*profile.source, f"structural limits read from {where} (cudaGetDeviceProperties); "
                     f"throughput and bandwidth from {profile.origin}"]  # fmt: skip
    derived: tuple[str, ...] = ()
    notes = []
    if device_name is not None:
        raw.update(key=_slug(device_name), name=device_name, aliases=[device_name])
        chip = f"{_model(device_name)}, compute capability {profile.compute_capability}"
        notes.append(f"{label} is not named by any shipped profile; using profile '{profile.key}' "
                     f"({profile.name}) of the same chip ({chip})")
        dram = _dram_gbs(props)
        if dram is None:
            notes.append(f"its DRAM bandwidth is the profile's {profile.bandwidth_gbs.dram} GB/s (the device "
                         f"reports no memory clock and bus width)")
        else:
            raw["bandwidth_gbs"]["dram"] = dram
            derived = ("bandwidth_gbs.dram",)
            notes.append(f"DRAM bandwidth {dram:.0f} GB/s from the device's memory clock and bus width")
            raw["source"][-1] += "; DRAM bandwidth from the device's memory clock and bus width"
    # Peak throughput and shared bandwidth are per-SM rates times the SM count times the clock, so a device
    # with fewer SMs (a MIG slice) or another clock than the profile describes scales them; the model would
    # otherwise time issue slots at the device's clock and arithmetic at the profile's.
    differences, ratio = [], 1.0
    sms, clock = raw["sm_count"], raw["clock_mhz"]
    if isinstance(sms, int) and sms != profile.sm_count and sms > 0:
        ratio *= sms / profile.sm_count
        differences.append(f"{sms} SMs where profile '{profile.key}' describes {profile.sm_count}")
    if _positive(clock) and clock != profile.clock_mhz:
        ratio *= clock / profile.clock_mhz
        differences.append(f"a {clock} MHz clock where profile '{profile.key}' describes {profile.clock_mhz} MHz")
    if differences:
        raw["peak_tflops"] = {k: v * ratio for k, v in raw["peak_tflops"].items()}
        raw["bandwidth_gbs"]["shared"] *= ratio
        derived += ("peak_tflops", "bandwidth_gbs.shared")
        kept = "L2 bandwidth was" if "bandwidth_gbs.dram" in derived else "DRAM and L2 bandwidth were"
        notes.append(f"{'it' if notes else label} has {' and '.join(differences)}; peak throughput and shared "
                     f"bandwidth were scaled by {ratio:.3f}, {kept} not")
    if notes:
        warnings.warn("; ".join(notes), ProfileWarning, stacklevel=3)
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
        if not _positive(value):
            raise ProfileError(f"{label}: device property '{key}' = {value!r}: must be a positive number")
    sms, clock_hz = structural["sm_count"], clock_khz * 1e3
    if isinstance(sms, bool) or not isinstance(sms, int) or sms <= 0:
        raise ProfileError(f"{label}: field 'sm_count' = {sms!r}: must be a positive integer")
    tensor = {k: sms * rate * clock_hz / 1e12 for k, rate in traits.tensor_flop_per_clk_per_sm}
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
            "dram": _dram_gbs(props),
            "l2": sms * traits.l2_bytes_per_clk_per_sm * clock_hz / 1e9,
            "shared": sms * SHARED_BYTES_PER_CLK_PER_SM * clock_hz / 1e9,
        },
        "peak_tflops": {"fp32_simt": sms * traits.fp32_lanes_per_sm * 2 * clock_hz / 1e12, **tensor},
        "transaction_bytes": dict(TRANSACTION_BYTES),
        "shared_banks": SHARED_BANKS,
        "tensor_core_shapes": list(traits.tensor_core_shapes),
    }
    profile = validate(raw, label)
    derived = ("bandwidth_gbs.dram", "bandwidth_gbs.l2", "bandwidth_gbs.shared", "peak_tflops.fp32_simt",
               *(f"peak_tflops.{k}" for k in tensor))  # fmt: skip
    warnings.warn(_derive_warning(label, cc, traits, derived, tensor), ProfileWarning, stacklevel=3)
    return dataclasses.replace(profile, derived=derived)


# peak_tflops tensor key -> the dtype a matmul names, for the warning below.
_TENSOR_DTYPES = {"fp16_tensor": "float16", "bf16_tensor": "bfloat16", "tf32_tensor": "float32 as TF32",
                  "int8_tensor": "int8"}


def _derive_warning(label: str, cc: str, traits: ArchTraits, derived: tuple[str, ...],
                    tensor: Mapping[str, float]) -> str:  # fmt: skip
    """What a derived profile estimated, and what a missing tensor-core peak does to a schedule."""
    text = (f"{label} (compute capability {cc}) matches no shipped hardware profile; derived estimates for "
            f"{', '.join(derived)}")
    if tensor:
        text += (f"; its tensor-core peaks are estimates (the lowest per-SM rate of any shipped "
                 f"{traits.family} profile x SMs x clock)")
    missing = [f"{k} ({dtype})" for k, dtype in _TENSOR_DTYPES.items() if k not in tensor]
    if missing:
        text += (f"; no tensor-core peak for {', '.join(missing)}, so matmuls in those types are ranked and "
                 f"scheduled on the much slower SIMT template (tensor_core=False) and peak_flops() raises for them")
    return text + ("; no fp16/bf16 SIMT peak is known, so peak_flops() raises for those. Add hwprofiles/<key>.yaml "
                   "(with its source) for accurate numbers.")
