"""Scalar data types of the IR and their numpy / CUDA C spellings.

bfloat16 has no numpy dtype; arrays of it are held as float32 whose values are rounded to bfloat16
(see :func:`round_to_dtype`), which is exactly what a CUDA kernel storing ``__nv_bfloat16`` observes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schedlib.errors import IRError

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INT_DTYPES = ("int8", "int32", "int64")
DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, "bool")

_NUMPY = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.float32,  # storage stand-in, values rounded to bf16
    "int8": np.int8,
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
}

C_TYPES = {
    "float32": "float",
    "float16": "half",
    "bfloat16": "__nv_bfloat16",
    "int8": "signed char",
    "int32": "int",
    "int64": "long long",
    "bool": "bool",
}

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int32": 4, "int64": 8, "bool": 1}


def check_dtype(dtype: str, what: str = "dtype") -> str:
    """Return ``dtype`` if it is one the IR knows, else raise IRError naming it."""
    if dtype not in DTYPES:
        raise IRError(f"{what}={dtype!r}: unknown dtype; expected one of {', '.join(DTYPES)}")
    return dtype


def canonical_dtype(dtype: Any, what: str = "dtype") -> str:
    """The IR's name for ``dtype``: a dtype name, or a numpy dtype / scalar type such as ``np.float32``.

    Everything downstream (executor, code generator) looks dtypes up by name, so numpy spellings are
    converted here rather than accepted as-is.
    """
    if not isinstance(dtype, str) and (isinstance(dtype, np.dtype)
                                       or (isinstance(dtype, type) and issubclass(dtype, np.generic))):
        dtype = np.dtype(dtype).name
    return check_dtype(dtype, what)


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that holds values of ``dtype`` (bfloat16 is held in float32)."""
    return np.dtype(_NUMPY[check_dtype(dtype)])


def bfloat16_bits(values: Any, xp: Any = np) -> Any:
    """float32 ``values`` as bfloat16 bit patterns (uint16), rounded to nearest even; ``xp`` is numpy or cupy,
    so the host and the device marshal inputs alike.  A NaN keeps its sign and top payload and is made quiet
    (as the emulator's ``__float2bfloat16_rn`` does): rounding its bits, or only truncating them, could carry
    it into infinity or zero."""
    f32 = xp.ascontiguousarray(values, dtype=xp.float32)
    bits = f32.view(xp.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16  # only a NaN's bits can wrap here: `where` drops them
    return xp.where(xp.isnan(f32), (bits >> 16) | 0x40, rounded).astype(xp.uint16)


def round_to_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """Convert ``values`` to the numpy storage of ``dtype``, rounding bfloat16 to nearest even."""
    if dtype == "bfloat16":
        return (bfloat16_bits(values).astype(np.uint32) << 16).view(np.float32)
    if is_int(dtype) and np.issubdtype(np.asarray(values).dtype, np.floating):
        # The GPU's float -> int conversion (cvt.rzi, which generated kernels use on the emulator too): toward
        # zero, NaN to 0, saturated to the 32-bit range (64-bit for int64); int8 keeps the low byte of that.
        wide = np.int64 if dtype == "int64" else np.int32
        lo, hi = np.iinfo(wide).min, np.iinfo(wide).max
        x = np.trunc(np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=np.inf, neginf=-np.inf))
        with np.errstate(invalid="ignore"):  # the saturated lanes are replaced below
            out = np.where(x >= float(hi) + 1.0, hi, np.where(x < float(lo), lo, x.astype(wide)))
        return out.astype(wide).astype(_NUMPY[dtype])  # int8: the low byte, as the GPU's byte store keeps
    with np.errstate(over="ignore"):  # a value past the type's range is inf there, as the GPU's conversion gives
        return np.asarray(values).astype(_NUMPY[check_dtype(dtype)], copy=False)


def promote(a: str, b: str) -> str:
    """The dtype of a binary arithmetic result (C-like, but half+float stays float32)."""
    if a == b:
        return a
    if a == "bool":
        return b
    if b == "bool":
        return a
    rank = {"int8": 0, "int32": 1, "int64": 2, "float16": 3, "bfloat16": 3, "float32": 4}
    if rank[a] == rank[b]:  # float16 with bfloat16: no common half type
        return "float32"
    return a if rank[a] > rank[b] else b


def int_range(dtype: str) -> tuple[int, int]:
    """The smallest and largest value of an integer dtype."""
    info = np.iinfo(_NUMPY[dtype])
    return int(info.min), int(info.max)


def fits(value: int, dtype: str) -> bool:
    """Whether the integer ``value`` is representable in the integer ``dtype``."""
    lo, hi = int_range(dtype)
    return lo <= value <= hi
