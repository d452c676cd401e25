"""Hardware profiles: the numbers the analytical carver ranks tile configurations with.

Why data files: limits and throughputs change with every part, so they live in ``hwprofiles/<key>.yaml``
(one file per GPU, each naming its public source), never in code.  A typo there would silently skew
every ranking, so loading is strict: every field present with the right type and a sane value, unknown
fields rejected, and every error naming the file, the field and the value.  Reading the files (safe
YAML/JSON loading only; nothing read from disk is ever executed) lives in :mod:`schedlib.hw.profile_file`.
"""

from __future__ import annotations

import builtins
import difflib
import re
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from schedlib.errors import ProfileError

SUFFIXES = (".yaml", ".yml", ".json")
ENV_PATH = "SCHEDLIB_HWPROFILE_PATH"
_MISSING = object()
# YAML anchors let a small file build a list with billions of (shared) items; a plain repr() of such a
# value in an error message would never finish, so containers are shown abbreviated.
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring, _SHOW.maxother = 3, 8, 8, 200, 200

# Integer fields: inclusive sane ranges.  Wide enough for any real GPU, tight enough to catch typos
# such as a KiB value where bytes are expected.
_INT_LIMITS: dict[str, tuple[int, int]] = {
    "sm_count": (1, 1024),
    "warp_size": (32, 32),  # every CUDA GPU so far; anything else is a typo
    "clock_mhz": (100, 10_000),
    "max_threads_per_block": (32, 4096),
    "max_threads_per_sm": (32, 8192),
    "max_blocks_per_sm": (1, 256),
    "max_warps_per_sm": (1, 256),
    "registers_per_sm": (1024, 1 << 20),
    # 255 on every CUDA architecture since Kepler: ptxas cannot allot more, so a larger value would let the rules
    # pick configs that can only spill, and would be no cap at all (codegen.register_cap); and ptxas raises a cap
    # below 24 to 24 ("adjusting per thread register count of 16 to lower bound of 24"), so less is no cap either
    "max_registers_per_thread": (24, 255),
    "register_alloc_unit": (1, 4096),
    "shared_memory_per_block": (1024, 1 << 24),
    "shared_memory_per_block_optin": (1024, 1 << 24),
    "shared_memory_per_sm": (1024, 1 << 24),
    "shared_memory_reserved_per_block": (0, 1 << 16),
    "shared_memory_alloc_unit": (1, 1 << 16),
    "l2_bytes": (1 << 16, 1 << 36),
    "shared_banks": (1, 256),
}
_BANDWIDTH_KEYS = ("dram", "l2", "shared")  # GB/s (1e9 bytes/s), aggregate over the chip
# Dense peak throughput in TFLOPS (TOPS for int8); absent/null = the unit does not exist on the part.
_PEAK_KEYS = (
    "fp32_simt", "fp16_simt", "bf16_simt", "fp16_tensor", "bf16_tensor", "tf32_tensor", "int8_tensor",
)  # fmt: skip
_TRANSACTION_KEYS = ("global_sector", "global_line", "shared_bank")
_ALL_FIELDS = (
    "key", "name", "aliases", "source", "compute_capability",
    *_INT_LIMITS, "bandwidth_gbs", "peak_tflops", "transaction_bytes", "tensor_core_shapes", "disabled_templates",
)  # fmt: skip
# aliases: other names the profile answers to; disabled_templates: none by default
_OPTIONAL_FIELDS = frozenset({"aliases", "disabled_templates"})
# The matmul rule's tensor-core templates by name (its tensor_core knob: True is mma.sync), which a profile
# may turn off: a template that fails the tensor-core self-check with this card's driver, say.
TEMPLATE_NAMES = ("mma_sync", "wgmma", "wgmma_tma", "wgmma_ws")
# (dtype, tensor_core) -> peak_tflops key.  float32 on tensor cores means TF32 inputs.
_DTYPE_UNITS: dict[tuple[str, bool], str] = {
    ("float32", False): "fp32_simt", ("float32", True): "tf32_tensor",
    ("float16", False): "fp16_simt", ("float16", True): "fp16_tensor",
    ("bfloat16", False): "bf16_simt", ("bfloat16", True): "bf16_tensor",
    ("int8", True): "int8_tensor",
}  # fmt: skip
_DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
_KEY_RE = re.compile(r"[a-z0-9][a-z0-9_]*")
_CC_RE = re.compile(r"(\d{1,2})\.(\d)")
_SHAPE_RE = re.compile(r"m\d+n\d+k\d+")
_URL_RE = re.compile(r"https?://\S+")


@dataclass(frozen=True)
class Bandwidth:
    """Aggregate bandwidths in GB/s (1e9 bytes per second)."""

    dram: float
    l2: float
    shared: float


@dataclass(frozen=True)
class PeakTflops:
    """Dense (no structured sparsity) peak throughput in TFLOPS; ``None`` where the unit is absent.

    Tensor numbers assume FP32 accumulation for fp16/bf16/tf32 inputs (int8: INT32 accumulation),
    which is what a GEMM needs; GeForce parts run that at half their FP16-accumulate rate.
    """

    fp32_simt: float
    fp16_simt: float | None = None
    bf16_simt: float | None = None
    fp16_tensor: float | None = None
    bf16_tensor: float | None = None
    tf32_tensor: float | None = None
    int8_tensor: float | None = None


@dataclass(frozen=True)
class TransactionBytes:
    """Memory transaction granularities in bytes."""

    global_sector: int
    global_line: int
    shared_bank: int


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU's limits and throughputs, validated.  Build with :func:`load` or ``detect()``.

    ``origin`` says where the numbers came from (a file path or a device) and ``derived`` lists the
    fields that were estimated rather than read from a source; like ``source``, they are provenance and
    take no part in equality.
    """

    key: str
    name: str
    aliases: tuple[str, ...]
    source: tuple[str, ...] = field(compare=False)
    compute_capability: str
    sm_count: int
    warp_size: int
    clock_mhz: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    max_warps_per_sm: int
    registers_per_sm: int
    max_registers_per_thread: int
    register_alloc_unit: int
    shared_memory_per_block: int
    shared_memory_per_block_optin: int
    shared_memory_per_sm: int
    shared_memory_reserved_per_block: int
    shared_memory_alloc_unit: int
    l2_bytes: int
    bandwidth_gbs: Bandwidth
    peak_tflops: PeakTflops
    transaction_bytes: TransactionBytes
    shared_banks: int
    tensor_core_shapes: tuple[str, ...]
    disabled_templates: tuple[str, ...] = ()  # of TEMPLATE_NAMES: schedlib builds none of these here
    origin: str = field(default="", compare=False)
    derived: tuple[str, ...] = field(default=(), compare=False)

    @property
    def cc(self) -> tuple[int, int]:
        """Compute capability as ``(major, minor)``, for ordered comparisons."""
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def arch(self) -> str:
        """The nvcc/NVRTC architecture name, e.g. ``"sm_90"``."""
        major, minor = self.cc
        return f"sm_{major}{minor}"

    @property
    def clock_hz(self) -> float:
        """Boost clock in Hz (what the peak numbers assume)."""
        return self.clock_mhz * 1e6

    @property
    def dram_bytes_per_s(self) -> float:
        """Peak DRAM bandwidth in bytes per second."""
        return self.bandwidth_gbs.dram * 1e9

    @property
    def l2_bytes_per_s(self) -> float:
        """Aggregate L2 bandwidth in bytes per second."""
        return self.bandwidth_gbs.l2 * 1e9

    @property
    def shared_bytes_per_s(self) -> float:
        """Aggregate shared-memory bandwidth in bytes per second (all SMs together)."""
        return self.bandwidth_gbs.shared * 1e9

    def max_shared_per_block(self, opt_in: bool) -> int:
        """Shared memory a block may use: the 48 KiB default, or the opt-in maximum via
        ``cudaFuncSetAttribute(..., MaxDynamicSharedMemorySize, ...)``."""
        return self.shared_memory_per_block_optin if opt_in else self.shared_memory_per_block

    def shared_allocation(self, bytes_per_block: int) -> int:
        """Shared memory one block really occupies on an SM: request + driver reserve, rounded up to
        the allocation unit (the rule of CUDA's occupancy calculator)."""
        unit = self.shared_memory_alloc_unit
        return -(-(bytes_per_block + self.shared_memory_reserved_per_block) // unit) * unit

    def l1_left(self, blocks: int, shared_bytes_per_block: int) -> int:
        """Bytes of the unified L1/shared array that ``blocks`` resident blocks' shared memory leaves to the L1
        cache (the array taken as ``shared_memory_per_sm``, a little under its real size)."""
        return self.shared_memory_per_sm - blocks * self.shared_allocation(shared_bytes_per_block)

    def registers_per_warp(self, registers_per_thread: int) -> int:
        """Registers one warp occupies: registers are allocated per warp in ``register_alloc_unit`` steps."""
        unit = self.register_alloc_unit
        return -(-(registers_per_thread * self.warp_size) // unit) * unit

    def peak_flops(self, dtype: str, tensor_core: bool) -> float:
        """Dense peak throughput in FLOP/s (OP/s for int8) for ``dtype`` on tensor cores or SIMT units.

        dtype is one of "float32", "float16", "bfloat16", "int8" (float32 on tensor cores = TF32).
        Raises :class:`ProfileError` when this GPU has no such unit (e.g. bfloat16 on a V100).
        """
        canonical = _DTYPE_ALIASES.get(str(dtype), str(dtype))
        unit = _DTYPE_UNITS.get((canonical, bool(tensor_core)))
        value = getattr(self.peak_tflops, unit) if unit else None
        if value is None:
            where = f"no '{unit}' entry in peak_tflops" if unit else "schedlib models no such unit"
            known = sorted({d for d, _ in _DTYPE_UNITS})
            raise ProfileError(
                f"{self.key}: peak_flops(dtype={dtype!r}, tensor_core={bool(tensor_core)}): {where} "
                f"({self.name} lacks it or the profile does not record it); dtypes: {known}"
            )
        return value * 1e12

    def without_templates(self, names: Iterable[str]) -> HardwareProfile:
        """This profile with the matmul templates ``names`` (of :data:`TEMPLATE_NAMES`) turned off as well."""
        names = tuple(names)
        bad = [n for n in names if n not in TEMPLATE_NAMES]
        if bad:
            raise ProfileError(f"{self.key}: without_templates(names={list(names)!r}): unknown template(s) {bad}; "
                               f"the templates are {list(TEMPLATE_NAMES)}")
        merged = tuple(n for n in TEMPLATE_NAMES if n in names or n in self.disabled_templates)
        return replace(self, disabled_templates=merged)

    def to_dict(self) -> dict[str, Any]:
        """The profile in file schema (plain dicts/lists), for printing, JSON, or writing a new file."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("origin", "derived") or (f.name == "disabled_templates" and not self.disabled_templates):
                continue
            value = getattr(self, f.name)
            if isinstance(value, (Bandwidth, PeakTflops, TransactionBytes)):
                value = {k.name: getattr(value, k.name) for k in fields(value)}
                value = {k: v for k, v in value.items() if v is not None}
            elif isinstance(value, tuple):
                value = builtins.list(value)
            out[f.name] = value
        return out


def _fail(label: str, name: str, value: Any, reason: str) -> ProfileError:
    shown = "<missing>" if value is _MISSING else _SHOW.repr(value) if isinstance(value, (list, dict)) else repr(value)
    return ProfileError(f"{label}: field '{name}' = {shown}: {reason}")


def _number(label: str, name: str, value: Any, integer: bool, lo: float, hi: float) -> Any:
    kind = "an integer" if integer else "a number"
    if value is _MISSING:
        raise _fail(label, name, value, "required field is absent")
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise _fail(label, name, value, f"must be {kind}, got {type(value).__name__}")
    if value <= 0 < lo:
        raise _fail(label, name, value, f"must be a positive {'integer' if integer else 'number'}")
    if not lo <= value <= hi:
        raise _fail(label, name, value, f"must be between {lo} and {hi}")
    return value if integer else float(value)


def _strings(label: str, name: str, value: Any, allow_single: bool = False) -> tuple[str, ...]:
    if allow_single and isinstance(value, str):
        value = [value]
    if not isinstance(value, builtins.list) or not all(isinstance(s, str) and s.strip() for s in value):
        raise _fail(label, name, value, "must be a list of non-empty strings")
    return tuple(s.strip() for s in value)


def _section(label: str, name: str, raw: Mapping, keys: tuple[str, ...], required: tuple[str, ...],
             integer: bool, lo: float, hi: float) -> dict[str, Any]:  # fmt: skip
    value = raw.get(name, _MISSING)
    if not isinstance(value, Mapping):
        if value is _MISSING:
            raise _fail(label, name, value, "required field is absent")
        raise _fail(label, name, value, f"must be a mapping with keys {builtins.list(keys)}")
    for extra in sorted(value.keys() - set(keys), key=str):
        raise _fail(label, f"{name}.{extra}", value[extra], f"unknown field; allowed: {builtins.list(keys)}")
    out = {}
    for k in keys:
        item = value.get(k, _MISSING)
        if (item is _MISSING or item is None) and k in required:
            raise _fail(label, f"{name}.{k}", item, "required field is absent or null")
        absent = item is _MISSING or item is None
        out[k] = None if absent else _number(label, f"{name}.{k}", item, integer, lo, hi)
    return out


def validate(raw: Any, label: str, stem: str | None = None) -> HardwareProfile:
    """Check a parsed profile mapping and build the :class:`HardwareProfile`.

    ``label`` names the file (or device) in error messages; ``stem``, when given, must equal ``key``
    so that a profile is always found under the name its file has.
    """
    if not isinstance(raw, Mapping):
        kind = type(raw).__name__
        raise ProfileError(f"{label}: the top level must be a mapping of field names, got {kind}")
    for extra in sorted(raw.keys() - set(_ALL_FIELDS), key=str):
        hint = difflib.get_close_matches(str(extra), _ALL_FIELDS, n=1)
        reason = "unknown field" + (f" (did you mean '{hint[0]}'?)" if hint else "")
        raise _fail(label, str(extra), raw[extra], reason)
    missing = [f for f in _ALL_FIELDS if f not in raw and f not in _OPTIONAL_FIELDS]
    if len(missing) > 1:  # all at once: a profile written from scratch should not take one run per field
        raise ProfileError(f"{label}: required fields are absent: {', '.join(missing)} (see a built-in profile, "
                           "e.g. `python -m schedlib profiles show h100`, for each field's meaning and unit)")
    key = raw.get("key", _MISSING)
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise _fail(label, "key", key, "must be a lowercase identifier such as 'h100' (letters, digits, _)")
    if stem is not None and key != stem:
        raise _fail(label, "key", key, f"must equal the file name stem '{stem}' (a profile is looked up by its "
                    f"file's name: set key: {stem}, or rename the file to {key}.yaml)")
    name = raw.get("name", _MISSING)
    if not isinstance(name, str) or not name.strip():
        raise _fail(label, "name", name, "must be a non-empty string")
    aliases = _strings(label, "aliases", raw.get("aliases", []))
    source = _strings(label, "source", raw.get("source", _MISSING), allow_single=True)
    if not any(_URL_RE.search(s) for s in source):
        raise _fail(label, "source", raw["source"], "must name the public source including its URL")
    cc = raw.get("compute_capability", _MISSING)
    if not isinstance(cc, str) or not _CC_RE.fullmatch(cc) or not 3 <= int(cc.split(".")[0]) <= 20:
        raise _fail(label, "compute_capability", cc, 'must be a quoted string "major.minor" such as "9.0"')
    ints = {n: _number(label, n, raw.get(n, _MISSING), True, lo, hi) for n, (lo, hi) in _INT_LIMITS.items()}
    bandwidth = _section(label, "bandwidth_gbs", raw, _BANDWIDTH_KEYS, _BANDWIDTH_KEYS, False, 1.0, 1e6)
    peak = _section(label, "peak_tflops", raw, _PEAK_KEYS, ("fp32_simt",), False, 1e-3, 1e6)
    trans = _section(label, "transaction_bytes", raw, _TRANSACTION_KEYS, _TRANSACTION_KEYS, True, 1, 4096)
    shapes = _strings(label, "tensor_core_shapes", raw.get("tensor_core_shapes", _MISSING))
    for shape in shapes:
        if not (_SHAPE_RE.fullmatch(shape) or shape == "wgmma"):
            raise _fail(label, "tensor_core_shapes", shape, "must be an mma shape like 'm16n8k16' or 'wgmma'")
    if "wgmma" in shapes and not cc.startswith("9."):
        raise _fail(label, "tensor_core_shapes", "wgmma", f"wgmma exists only on sm_90, not on {cc}")
    disabled = _strings(label, "disabled_templates", raw.get("disabled_templates", []))
    for template in disabled:
        if template not in TEMPLATE_NAMES:
            raise _fail(label, "disabled_templates", template, f"not a template; the templates are "
                        f"{builtins.list(TEMPLATE_NAMES)}")
    _check_consistency(label, ints, bandwidth, trans)
    return HardwareProfile(
        key=key, name=name.strip(), aliases=aliases, source=source, compute_capability=cc, **ints,
        bandwidth_gbs=Bandwidth(**bandwidth), peak_tflops=PeakTflops(**peak),
        transaction_bytes=TransactionBytes(**trans), tensor_core_shapes=shapes, disabled_templates=disabled,
        origin=label,
    )  # fmt: skip


def _check_consistency(
    label: str, v: dict[str, int], bandwidth: dict[str, float], trans: dict[str, int]
) -> None:
    """Cross-field rules: a per-block limit can never exceed its per-SM counterpart, and so on."""
    rules = [
        ("max_threads_per_block", v["max_threads_per_block"] <= v["max_threads_per_sm"],
         f"exceeds max_threads_per_sm ({v['max_threads_per_sm']})"),
        ("max_threads_per_block", v["max_threads_per_block"] % v["warp_size"] == 0,
         f"must be a multiple of warp_size ({v['warp_size']})"),
        ("max_warps_per_sm", v["max_warps_per_sm"] * v["warp_size"] == v["max_threads_per_sm"],
         f"times warp_size must equal max_threads_per_sm ({v['max_threads_per_sm']})"),
        ("max_registers_per_thread", v["max_registers_per_thread"] * v["warp_size"] <= v["registers_per_sm"],
         f"one warp at this count exceeds registers_per_sm ({v['registers_per_sm']})"),
        ("register_alloc_unit", v["registers_per_sm"] % v["register_alloc_unit"] == 0,
         f"must divide registers_per_sm ({v['registers_per_sm']})"),
        ("shared_memory_per_block", v["shared_memory_per_block"] <= v["shared_memory_per_block_optin"],
         f"exceeds shared_memory_per_block_optin ({v['shared_memory_per_block_optin']})"),
        ("shared_memory_per_block_optin",
         v["shared_memory_per_block_optin"] + v["shared_memory_reserved_per_block"]
         <= v["shared_memory_per_sm"],
         f"plus shared_memory_reserved_per_block ({v['shared_memory_reserved_per_block']}) exceeds "
         f"shared_memory_per_sm ({v['shared_memory_per_sm']})"),
        ("shared_memory_alloc_unit", v["shared_memory_per_sm"] % v["shared_memory_alloc_unit"] == 0,
         f"must divide shared_memory_per_sm ({v['shared_memory_per_sm']})"),
    ]  # fmt: skip
    for name, ok, reason in rules:
        if not ok:
            raise _fail(label, name, v[name], reason)
    for level in (lv for lv in ("l2", "shared") if bandwidth[lv] <= bandwidth["dram"]):
        reason = f"an on-chip level must be faster than DRAM ({bandwidth['dram']} GB/s)"
        raise _fail(label, f"bandwidth_gbs.{level}", bandwidth[level], reason)
    if trans["global_line"] % trans["global_sector"]:
        reason = f"must be a multiple of global_sector ({trans['global_sector']})"
        raise _fail(label, "transaction_bytes.global_line", trans["global_line"], reason)


def normalize_name(text: str) -> str:
    """Case- and whitespace-insensitive form of a GPU name, for matching keys and aliases."""
    return " ".join(text.split()).casefold()
