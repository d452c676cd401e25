"""Helpers of the codegen tests: random inputs for a Func, comparisons, and reading generated sources."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

import schedlib as sl
from schedlib.errors import BuildError
from schedlib.ir.dtype import is_float, numpy_dtype
from schedlib.ir.reference import evaluate_int
from schedlib.runtime.gpu import gpu_available, require_cupy


def input_shapes(func: sl.Func, symbols: Mapping[str, int] | None = None) -> dict[str, tuple[int, ...]]:
    env = dict(symbols or {})
    return {n: tuple(evaluate_int(d, env) for d in func.buffer(n).shape) for n in func.inputs}


def random_inputs(func: sl.Func, rng: np.random.Generator, symbols: Mapping[str, int] | None = None
                  ) -> list[np.ndarray]:
    """Fresh inputs in ``func.inputs`` order: normal floats (never all zero), integers in [-1000, 1000)."""
    out = []
    for name, shape in input_shapes(func, symbols).items():
        dtype = func.buffer(name).dtype
        if is_float(dtype):
            arr = rng.standard_normal(shape).astype(np.float32 if dtype == "bfloat16" else numpy_dtype(dtype))
            arr[arr == 0] = 0.5
        else:
            arr = rng.integers(-1000, 1000, shape).astype(numpy_dtype(dtype))
        out.append(arr)
    return out


def assert_close(got: np.ndarray, want: np.ndarray, tol: tuple[float, float], what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert np.isfinite(got.astype(np.float64)).all(), f"{what}: non-finite values (unwritten output?)"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol[0], atol=tol[1],
                               err_msg=what)


def kernel_bodies(source: str) -> dict[str, str]:
    """Each ``extern "C"`` kernel of a generated source, by name, from its signature to its closing brace."""
    heads = re.finditer(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(', source)
    return {m.group(1): enclosed(source, m.group(0)) for m in heads}


def signature(body: str) -> str:
    return body[: body.index("{")]


def code_lines(body: str) -> list[str]:
    """Non-empty lines without comments, stripped."""
    lines = [ln.split("//")[0].strip() for ln in body.splitlines()]
    return [ln for ln in lines if ln]


def enclosed(text: str, opener: str) -> str:
    """The text from ``opener`` (e.g. ``for (int C_k_0 = 0;``) to the brace closing the scope it opens."""
    start = text.index(opener)
    i, depth = text.index("{", start), 0
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
        i += 1


def events(text: str) -> list[str]:
    """Barriers and statements in order: ``"sync"`` for ``__syncthreads()``, a block's name for its body."""
    out = []
    for m in re.finditer(r"__syncthreads\(\);|// block (\w+)", text):
        out.append("sync" if m.group(1) is None else m.group(1))
    return out


@functools.lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    """None when a CUDA device is usable through cupy, else why not (schedlib's own message)."""
    if gpu_available():
        return None
    try:
        require_cupy()
    except BuildError as exc:
        return f"no CUDA device: {exc}"
    return "no CUDA device"  # pragma: no cover - gpu_available() and require_cupy() disagree


def forced(func: sl.Func, target: str, **changes: Any) -> sl.Func:
    """``func`` with a loop's (or, for a block name, the block's) fields changed directly, past the checks of
    bind and annotate: a func built by other means may hold what the primitives refuse, and the build must
    refuse it again.  ``annotate=(key, value)`` sets one annotation."""
    from dataclasses import replace

    note = changes.pop("annotate", None)
    if func.has_block(target):
        blk = func.block(target)
        if note is not None:
            changes["annotations"] = (*((k, v) for k, v in blk.annotations if k != note[0]), note)
        return func.with_block(replace(blk, **changes))
    owner, idx = func.loop_owner(target)
    loops = list(owner.loops)
    if note is not None:
        changes["annotations"] = (*((k, v) for k, v in loops[idx].annotations if k != note[0]), note)
    loops[idx] = replace(loops[idx], **changes)
    return func.with_block(replace(owner, loops=tuple(loops)))
