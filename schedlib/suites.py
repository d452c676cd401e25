"""Workload specs (``matmul:M=4096,N=4096,K=4096,dtype=float16,epilogue=bias_relu``), suite files and the
built-in suites.

A :class:`WorkloadSpec` remembers the builder and its parameters, so a report can name the workload, scale it
down for the CPU emulator, and find the vendor-library equivalent.
"""

from __future__ import annotations

import inspect
import json
import math
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from schedlib.errors import IRError
from schedlib.hw.profile_file import offending_line
from schedlib.ir.func import Func
from schedlib.ir.tensor import var
from schedlib.workloads import BUILTINS


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def build(self) -> Func:
        return BUILTINS[self.kind](**self.params)

    @property
    def name(self) -> str:
        return self.label or self.text

    @property
    def text(self) -> str:
        args = ",".join(f"{k}={_fmt(k, v)}" for k, v in self.params.items())
        return f"{self.kind}:{args}" if args else self.kind

    def scaled(self, limit: int) -> WorkloadSpec:
        """The same workload with every size capped at ``limit`` (for the CPU emulator), including the sizes
        left at the builder's defaults: ``softmax`` alone means 4096x4096.  Those defaults become explicit
        params (as the CLI's hint spells them); symbolic sizes are kept."""
        builder = inspect.signature(BUILTINS[self.kind]).parameters
        defaults = {k: p.default for k, p in builder.items()
                    if k in (*SIZE_PARAMS, "shape") and p.default is not inspect.Parameter.empty
                    and p.default is not None}  # matmul's batch=None means no batch axis, not a size
        params = {**defaults, **self.params}
        sizes = {k: min(v, limit) for k, v in params.items() if k in SIZE_PARAMS and isinstance(v, int)}
        if "shape" in params:
            sizes["shape"] = tuple(min(d, limit) if isinstance(d, int) else d for d in params["shape"])
        return WorkloadSpec(self.kind, {**params, **sizes}, self.label)


SIZE_PARAMS = {"M", "N", "K", "rows", "cols", "batch"}

# Values from a suite file shown in an error: a YAML alias can make a few lines mean a structure with billions of
# items, and a full repr of that never ends; a bounded one names the value well enough.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict = 2, 4, 4, 4
_SHORT.maxstring, _SHORT.maxother = 80, 80


def _show(value: Any) -> str:
    """``repr(value)``, shortened for a one-line error message."""
    return _SHORT.repr(value)


def _fmt(key: str, v: Any) -> str:
    """The spec-string spelling of a parameter, the inverse of :func:`_value`."""
    if isinstance(v, (list, tuple)):
        return ("+" if key == "chain" else "x").join(_fmt("", x) for x in v)
    return f"${v.name}" if hasattr(v, "name") and not isinstance(v, str) else str(v)


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _spec_size(kind: str, key: str, value: Any) -> Any:
    """One size of a spec (text or a YAML/JSON scalar): a positive int, a digit string, or ``$name`` (a
    symbolic dimension)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("$") and text[1:].isidentifier():
            return var(text[1:])
        if text.isdigit():
            value = int(text)
    if hasattr(value, "name") and not isinstance(value, str):
        return value  # already an sl.var
    if isinstance(value, bool) or not isinstance(value, int):
        # 1e3 in YAML or JSON is a float, refused as in a profile's integer fields; say how to write it
        whole = isinstance(value, float) and value.is_integer() and 1 <= value < 2**31
        hint = f" (write {int(value)})" if whole else ""
        raise IRError(f"workload {kind}: {key}={_show(value)} must be a positive int or $name (a symbolic "
                      f"size){hint}")
    if not 1 <= value < 2**31:
        raise IRError(f"workload {kind}: {key}={value} must be a positive size below 2^31")
    return value


def _coerce(kind: str, key: str, value: Any) -> Any:
    """``value`` (spec-string text or a YAML/JSON scalar) as the builder parameter ``key`` expects it; the
    parameter's default tells the type, so ``trans_a=no`` is False rather than a truthy string."""
    default = inspect.signature(BUILTINS[kind]).parameters[key].default
    text = value.strip() if isinstance(value, str) else None
    if default is None and (value is None or (text is not None and text.lower() in ("none", "null"))):
        return None
    if key in SIZE_PARAMS:
        return _spec_size(kind, key, value)
    if key == "shape":
        dims = text.split("x") if text is not None else value
        dims = [dims] if isinstance(dims, int) else dims
        if not isinstance(dims, (list, tuple)) or not dims:
            raise IRError(f"workload {kind}: shape={_show(value)} must be sizes like 64x128 (or a list)")
        return tuple(_spec_size(kind, key, d) for d in dims)
    if key == "chain":
        ops = text.split("+") if text is not None else value
        if not isinstance(ops, (list, tuple)) or not all(isinstance(o, str) and o for o in ops):
            raise IRError(f"workload {kind}: chain={_show(value)} must be ops like add+relu (or a list)")
        return tuple(o.strip() for o in ops)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise IRError(f"workload {kind}: {key}={_show(value)} must be true or false")
    if isinstance(default, int):
        if text is not None and text.lstrip("+-").isdigit():
            return int(text)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise IRError(f"workload {kind}: {key}={_show(value)} must be an int")
    if isinstance(default, float):
        return _number(kind, key, value)
    if not isinstance(value, str):  # dtype, op, epilogue: names
        raise IRError(f"workload {kind}: {key}={_show(value)} must be a name")
    return text


# Float parameters that must be above zero: eps keeps rsqrt(var + eps) finite for a constant row.
POSITIVE_FLOATS = {"eps"}
# A float parameter is a float32 constant in the kernel (fp16 and bf16 compute in float32 too, and no workload
# computes in float64): past this magnitude it is infinite there, however finite as a Python float.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _number(kind: str, key: str, value: Any) -> float:
    """A float parameter: finite (a NaN or infinite ``eps`` or ``scale`` makes every output NaN or inf, which no
    kernel check can tell from a wrong one), and above zero where :data:`POSITIVE_FLOATS` says so."""
    number = None
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
            pass
    if number is None:
        raise IRError(f"workload {kind}: {key}={_show(value)} must be a number")
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        raise IRError(f"workload {kind}: {key}={_show(value)} must be a finite number (at most {FLOAT32_MAX:.4g} "
                      "in magnitude: kernels compute in float32)")
    if key in POSITIVE_FLOATS and number <= 0:
        raise IRError(f"workload {kind}: {key}={_show(value)} must be a number above 0")
    return number


def parse_workload(text: str) -> WorkloadSpec:
    """Parse ``kind:key=value,...``; ``$M`` makes a symbolic size, ``shape=64x64``, ``chain=add+relu``."""
    if not isinstance(text, str) or not text.strip():
        raise IRError(f"workload spec {text!r} is empty")
    kind, _, rest = text.strip().partition(":")
    if kind not in BUILTINS:
        raise IRError(f"unknown workload {kind!r}; built-in workloads are {', '.join(sorted(BUILTINS))}")
    params: dict[str, Any] = {}
    items = rest.split(",") if rest else []
    if items and not items[-1].strip():
        items.pop()  # a trailing comma is harmless
    if any(not item.strip() for item in items):
        raise IRError(f"workload spec {text!r} has an empty item between commas")
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise IRError(f"workload spec {text!r}: {item!r} is not key=value")
        if key in params:
            raise IRError(f"workload spec {text!r}: {key} is given twice")
        params[key] = value
    return _checked(kind, params)


def _checked(kind: str, raw: dict[str, Any], label: str = "") -> WorkloadSpec:
    accepted = inspect.signature(BUILTINS[kind]).parameters
    unknown = [k for k in raw if k not in accepted]
    if unknown:
        raise IRError(f"workload {kind}: unknown parameter(s) {unknown}; it takes {list(accepted)}")
    spec = WorkloadSpec(kind, {k: _coerce(kind, k, v) for k, v in raw.items()}, label)
    spec.build()  # surfaces bad dtypes, epilogues and ops now, with their own messages
    return spec


class _DuplicateKey(Exception):
    """A key given twice in one JSON object (args: the key)."""


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook refusing a key given twice, which it would silently resolve to the last value."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _parse(text: str, json_text: bool) -> Any:
    """Suite text as plain data, read as strictly as hardware profiles are: no key given twice (``{M: 64, M: 128}``
    would run M=128 unsaid), and YAML numbers by the YAML 1.2 rules people write (``1e3`` is a number, ``1:04``
    is no base-60 64).  The profile reader's loader is reused, so the two kinds of file cannot drift apart."""
    from schedlib.hw.profile_file import StrictLoader  # a yaml.SafeLoader subclass: builds plain data only

    if json_text:
        return json.loads(text, object_pairs_hook=_json_object)
    return yaml.load(text, Loader=StrictLoader)


def load_suite_file(path: str | Path) -> list[WorkloadSpec]:
    """A YAML or JSON list of workload strings or ``{kind: ..., <params>, label: ...}`` mappings."""
    p = Path(path)
    try:
        # JSON and YAML are UTF-8 (not the locale's encoding); -sig accepts the mark some editors put first
        text = p.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise IRError(f"suite file {p}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise IRError(f"suite file {p}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line}, "
                      f"offset {exc.start}); save it as UTF-8") from None
    try:
        data = _parse(text, json_text=p.suffix.lower() == ".json")
    except _DuplicateKey as exc:
        raise IRError(f"suite file {p}: not valid JSON (duplicate key {exc.args[0]!r} in one object)") from None
    except RecursionError:  # both parsers recurse once per level: a suite is a flat list, never this deep
        raise IRError(f"suite file {p}: nested too deeply to read (lists or mappings inside each other "
                      f"past Python's recursion limit); a suite is a list of workloads") from None
    except json.JSONDecodeError as exc:
        raise IRError(f"suite file {p}: line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})"
                      + offending_line(text, exc.lineno - 1)) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise IRError(f"suite file {p}: {where}not valid YAML ({exc.problem or exc.context})"
                      + (offending_line(text, mark.line) if mark is not None else "")) from None
    except yaml.YAMLError as exc:
        raise IRError(f"suite file {p}: not valid YAML ({' '.join(str(exc).split())})") from None
    if isinstance(data, dict):
        data = data.get("workloads")
    if not isinstance(data, list) or not data:
        raise IRError(f"suite file {p}: expected a non-empty list of workloads (or a 'workloads:' list)")
    specs = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            try:
                specs.append(parse_workload(item))
            except IRError as exc:
                raise IRError(f"suite file {p}: entry {i}: {exc}") from None
        elif isinstance(item, dict) and "kind" in item:
            kind = item["kind"]
            if not isinstance(kind, str) or kind not in BUILTINS:
                raise IRError(f"suite file {p}: entry {i}: unknown workload {_show(kind)}; built-in workloads are "
                              f"{', '.join(sorted(BUILTINS))}")
            label = item.get("label", "")
            if not isinstance(label, (str, int, float)):  # str() of a (possibly huge) structure is no name
                raise IRError(f"suite file {p}: entry {i}: label={_show(label)} must be a name")
            params = {str(k): v for k, v in item.items() if k not in ("kind", "label")}
            try:
                specs.append(_checked(kind, params, str(label)))
            except IRError as exc:
                raise IRError(f"suite file {p}: entry {i}: {exc}") from None
        else:
            raise IRError(f"suite file {p}: entry {i} must be a spec string or a mapping with 'kind'")
    return specs


def _llm_decoder() -> list[WorkloadSpec]:
    """One layer of a 7-8B decoder (hidden 4096, 32 heads, 8 KV heads, MLP 14336), fp16.

    Prefill is M=2048 tokens; decode is batch 1 and 8, its MLP projections also with int8 weights (weight-only
    quantisation, one scale per output column), and its attention softmax one row per head and sequence over
    a 2048-token context.
    """
    h, kv, mlp, heads, seq = 4096, 1024, 14336, 32, 2048
    out: list[WorkloadSpec] = []
    for name, n, k in (("qkv_proj", h + 2 * kv, h), ("o_proj", h, h), ("gate_up_proj", 2 * mlp, h),
                       ("down_proj", h, mlp)):
        out.append(WorkloadSpec("matmul", {"M": seq, "N": n, "K": k, "dtype": "float16"}, f"prefill.{name}"))
    out.append(WorkloadSpec("rmsnorm", {"rows": seq, "cols": h, "dtype": "float16"}, "prefill.rmsnorm"))
    out.append(WorkloadSpec("softmax", {"rows": heads * 128, "cols": seq, "dtype": "float16"},
                            "prefill.attn_softmax"))
    for batch in (1, 8):
        for name, n, k in (("qkv_proj", h + 2 * kv, h), ("o_proj", h, h), ("gate_up_proj", 2 * mlp, h),
                           ("down_proj", h, mlp)):
            out.append(WorkloadSpec("gemv", {"N": n, "K": k, "dtype": "float16", "batch": batch},
                                    f"decode{batch}.{name}"))
        for name, n, k in (("gate_up_proj", 2 * mlp, h), ("down_proj", h, mlp)):
            out.append(WorkloadSpec("gemv", {"N": n, "K": k, "dtype": "float16", "batch": batch,
                                             "weight_dtype": "int8"}, f"decode{batch}.{name}.int8"))
        out.append(WorkloadSpec("rmsnorm", {"rows": batch, "cols": h, "dtype": "float16"}, f"decode{batch}.rmsnorm"))
        out.append(WorkloadSpec("softmax", {"rows": heads * batch, "cols": seq, "dtype": "float16"},
                                f"decode{batch}.attn_softmax"))
    return out


def _basic() -> list[WorkloadSpec]:
    return [
        WorkloadSpec("matmul", {"M": 1024, "N": 1024, "K": 1024, "dtype": "float32"}, "matmul_fp32"),
        WorkloadSpec("matmul", {"M": 1024, "N": 1024, "K": 1024, "dtype": "float16", "epilogue": "bias_relu"},
                     "matmul_fp16_bias_relu"),
        WorkloadSpec("gemv", {"N": 4096, "K": 4096, "dtype": "float16"}, "gemv"),
        WorkloadSpec("gemv", {"N": 4096, "K": 4096, "dtype": "float16", "trans": True}, "gemv_outer"),
        WorkloadSpec("reduce", {"rows": 4096, "cols": 4096, "op": "sum"}, "row_sum"),
        WorkloadSpec("softmax", {"rows": 4096, "cols": 4096}, "softmax"),
        WorkloadSpec("rmsnorm", {"rows": 4096, "cols": 4096}, "rmsnorm"),
        WorkloadSpec("transpose", {"M": 4096, "N": 4096}, "transpose"),
        WorkloadSpec("elementwise", {"shape": (4096, 4096), "chain": ("add", "gelu")}, "add_gelu"),
    ]


SUITES = {"llm-decoder": _llm_decoder, "basic": _basic}


SUITE_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def is_suite_file(text: str) -> bool:
    """Whether ``text`` names a suite file (by its suffix, in any case) rather than a workload or a suite."""
    return Path(text).suffix.lower() in SUITE_FILE_SUFFIXES


def suite(name_or_path: str) -> list[WorkloadSpec]:
    """A built-in suite by name, or a suite file."""
    if name_or_path in SUITES:
        return SUITES[name_or_path]()
    if is_suite_file(name_or_path):
        return load_suite_file(name_or_path)
    raise IRError(f"unknown suite {name_or_path!r}; built-in suites are {', '.join(SUITES)} (or a .yaml/.json file)")


def as_specs(items: Iterable[Any]) -> list[WorkloadSpec | Func]:
    out: list[WorkloadSpec | Func] = []
    for it in items:
        out.append(parse_workload(it) if isinstance(it, str) else it)
    return out
