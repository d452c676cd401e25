"""Which names a compute definition may use.

Buffer, stage, axis and dimension names become identifiers of the generated CUDA C++ (parameters, loop
variables, array names), so a name must be one the compiler accepts there and that cannot capture an
identifier the generated code relies on.
"""

from __future__ import annotations

from typing import Any

from schedlib.errors import IRError

# C, C++ (through C++20) and CUDA keywords, plus the builtin type names that parse like keywords.
_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t
    class co_await co_return co_yield compl concept const consteval constexpr constinit const_cast continue
    decltype default delete do double dynamic_cast else enum explicit export extern false float for friend
    goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private
    protected public register reinterpret_cast requires restrict return short signed sizeof static
    static_assert static_cast struct switch template this thread_local throw true try typedef typeid
    typename union unsigned using virtual void volatile wchar_t while xor xor_eq
    NULL
""".split())

# Names CUDA predefines in every kernel, and types/functions the generated code spells out, which a
# parameter or variable of the same name would shadow.
_CUDA_NAMES = frozenset("""
    threadIdx blockIdx blockDim gridDim warpSize dim3 half half2 nv_bfloat16 nv_bfloat162
    expf logf sqrtf rsqrtf tanhf erff fabsf fminf fmaxf abs min max
""".split())

# CUDA's vector types and their make_* constructors, all of them: the generated code and its macros spell
# several (SL_VLOAD casts through uint2/uint4, the emulator's threadIdx is a uint3, copies build make_uint4),
# and which ones varies with the schedule, so a buffer named uint2 compiled for one config and not another.
_VECTOR_BASES = ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "longlong", "ulonglong",
                 "float", "double")
_VECTOR_TYPES = frozenset(f"{base}{n}" for base in _VECTOR_BASES for n in range(1, 5))
_CUDA_NAMES = _CUDA_NAMES | _VECTOR_TYPES | {f"make_{t}" for t in _VECTOR_TYPES}

# Prefixes of the helpers and macros schedlib emits (``sl_floordiv``, ``SL_VLOAD``, ...).
_RESERVED_PREFIXES = ("sl_",)


def check_name(what: str, argument: str, name: Any) -> str:
    """Return ``name`` if it can name ``what`` in the IR and in generated CUDA, else raise IRError.

    ``what`` is the thing being named (``"placeholder"``, ``"var"``...) and ``argument`` the parameter
    the user passed it through, so the message points at the call to fix.
    """
    if not isinstance(name, str):
        raise IRError(f"{what}: {argument}={name!r} must be a str, got {type(name).__name__}")
    if not name.isidentifier() or not name.isascii():
        raise IRError(f"{what}: {argument}={name!r} must be an identifier (ASCII letters, digits and '_'; "
                      "no dots or spaces)")
    if name in _KEYWORDS:
        raise IRError(f"{what}: {argument}={name!r} is a C/C++/CUDA keyword; choose another name")
    if name in _CUDA_NAMES:
        raise IRError(f"{what}: {argument}={name!r} is a name CUDA or the generated code already uses; "
                      "choose another name")
    if name.lower().startswith(_RESERVED_PREFIXES):
        raise IRError(f"{what}: {argument}={name!r} starts with 'sl_', which schedlib reserves for the "
                      "helpers it generates")
    # C++ reserves identifiers with a double underscore or a leading underscore and capital letter.
    if "__" in name or (name.startswith("_") and name[1:2].isupper()):
        raise IRError(f"{what}: {argument}={name!r} is reserved by C++ (double underscore, or '_' and a "
                      "capital letter)")
    return name
