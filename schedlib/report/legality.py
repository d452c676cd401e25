"""Why a workload has no config to rank on a target (a profile with too few registers per thread, say): one
sentence for ``schedlib carve`` and for the rows of a comparison, instead of an empty table or an
``IndexError`` from reading the first row of an empty ranking."""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["no_legal_config", "why_nothing_legal"]


def no_legal_config(ranked: pd.DataFrame, workload: str | None = None) -> str:
    """The sentence for an empty :func:`schedlib.carver.carve` ranking, from what its ``attrs`` counted."""
    attrs = ranked.attrs
    rule, target = attrs.get("rule", "?"), attrs.get("target", "?")
    what = workload or attrs.get("func") or "this workload"
    evaluated, launchable = int(attrs.get("evaluated") or 0), int(attrs.get("launchable") or 0)
    compiled = attrs.get("compiled")
    if compiled and launchable:  # the model's launchable configs, re-priced with what ptxas allotted them
        return (f"none of the {compiled['compiled']} configs of rule {rule} for {what} compiled for "
                f"{compiled['arch']} can launch on {target} with the registers ptxas allots them")
    if evaluated and not launchable:
        return (f"none of the {evaluated} configs of rule {rule} for {what} can launch on {target}: each needs more "
                "registers, shared memory or threads than one of its SMs offers")
    return (f"no config of rule {rule} for {what} is legal on {target}: its knob space has no point within the "
            "target's limits (registers, shared memory, threads per block)")


def why_nothing_legal(func: Any, profile: Any) -> str | None:
    """:func:`no_legal_config` when the carver finds no config of ``func`` on ``profile``, else None (a method
    that failed for another reason keeps its own message)."""
    from schedlib.carver import carve

    try:
        ranked = carve(func, profile, topk=1)
    except Exception:  # asked while reporting another failure: that failure's own message stands
        return None
    return no_legal_config(ranked) if ranked.empty else None
