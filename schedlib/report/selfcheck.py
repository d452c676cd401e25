"""``sl.report.tensor_core_selfcheck``: do the matmul rule's tensor-core templates compute the right thing here?

Each template the target's space has (``"wgmma_tma"``, ``"wgmma"`` and ``"wgmma_ws"`` on Hopper, ``True`` =
mma.sync on sm_80+) is built for every operand layout (A stored M x K or K x M, B stored K x N or N x K) in
fp16, plus bf16, at a small size with partial tiles, and its result is compared with a float64 numpy product
of the same rounded inputs.  With ``backend="gpu"`` the kernels run on the device, which is the check that
matters for the templates' hardware semantics (shared-memory descriptors, fragment layouts); ``"emulator"``
runs the same source on the CPU emulator.  One row per template x case, with the error and, for a case that
fails to build or run, why.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from schedlib.hw import resolve
from schedlib.ir.dtype import round_to_dtype

# (case, trans_a, trans_b, dtype): every layout in fp16, the plain layout in bf16
CASES = (("nn_f16", False, False, "float16"), ("tn_f16", True, False, "float16"),
         ("nt_f16", False, True, "float16"), ("tt_f16", True, True, "float16"),
         ("nn_bf16", False, False, "bfloat16"))
SIZE = (200, 264, 200)  # M, N, K: partial block tiles in every dimension
TOLERANCE = 2e-2  # of the largest |reference| (one rounding of a 16-bit store, reordered fp32 sums)


def tensor_core_selfcheck(target: Any = "h100", *, backend: str = "gpu",
                          templates: tuple[Any, ...] = ("wgmma_tma", "wgmma", "wgmma_ws", True),
                          cases: tuple[str, ...] | None = None,
                          seed: int = 0) -> pd.DataFrame:
    """One row per template x case: ``ok``, ``max_err`` (relative to the largest |reference|) and ``error``.
    ``cases`` picks some of :data:`CASES` by name (None: all)."""
    from schedlib import workloads
    from schedlib.rules import get_rule
    from schedlib.runtime.kernel import build

    if backend not in ("gpu", "emulator"):
        raise ValueError(f"backend must be 'gpu' or 'emulator', got {backend!r}")
    names = [c[0] for c in CASES]
    unknown = sorted(set(cases or ()) - set(names))
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}; choose from {names}")
    profile = resolve(target)
    rule = get_rule("matmul")
    rng = np.random.default_rng(seed)
    rows = []
    for template in templates:
        for case, trans_a, trans_b, dtype in CASES:
            if cases is not None and case not in cases:
                continue
            row: dict[str, Any] = {"template": str(template), "case": case, "config": None, "ok": False,
                                   "max_err": float("nan"), "error": ""}
            func = workloads.matmul(*SIZE, dtype, trans_a=trans_a, trans_b=trans_b)
            try:
                row["config"] = config = rule.template_default(func, profile, template)
            except ValueError as exc:  # the template is not on this target
                row["error"] = f"not available: {exc}"
                rows.append(row)
                continue
            inputs = [round_to_dtype(rng.standard_normal(tuple(int(d.value) for d in func.buffer(n).shape))
                                     .astype(np.float32), dtype) for n in func.inputs]  # type: ignore[attr-defined]
            a = inputs[0].astype(np.float64)
            b = inputs[1].astype(np.float64)
            want = (a.T if trans_a else a) @ (b.T if trans_b else b)
            try:
                kernel = build(rule.apply(func, profile, config), profile)
                got = _run(kernel, inputs, backend)
                err = float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())
                row["max_err"], row["ok"] = err, bool(err <= TOLERANCE)
                if not row["ok"]:
                    row["error"] = f"result differs: max error {err:.3g} of the largest |value|"
            except Exception as exc:  # a build or launch failure is this case's finding, not the end
                row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            rows.append(row)
    return pd.DataFrame(rows, columns=["template", "case", "config", "ok", "max_err", "error"])


def _run(kernel: Any, inputs: list[np.ndarray], backend: str) -> np.ndarray:
    if backend == "emulator":
        return np.asarray(kernel.run_cpu(*inputs, bounds_check=True))
    import cupy as cp

    got = kernel(*[cp.asarray(x) for x in inputs])
    return cp.asnumpy(got)
