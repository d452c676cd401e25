"""The carver's best configs priced again with the registers the compiler allots them.

Why: the model reads registers per thread from the rule's estimate, and ptxas can allot more (a ragged SIMT
matmul keeps its unrolled k step in two versions and takes 20-50 registers beyond the estimate, 3 resident
blocks per SM becoming 2) or spill.  Given ``resources``, a function from a Schedule to what its compiled
kernels use (``schedlib.runtime.resources.compiled_resources(target)`` builds and runs ptxas; no GPU needed),
the best ``pool`` configs of the model's ranking are compiled, priced with those registers, and ranked
again: configs that spill go after every config that does not, as local-memory traffic the model does not
price would swamp a small edge in its estimate.  A config that fails to compile, or cannot launch with what
ptxas allots, is replaced by the next of the ranking, up to twice the pool; the compiler is not called for
the rest of the space, which keeps a ranking to seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from numbers import Integral
from typing import Any

from schedlib.carver.model import evaluate
from schedlib.errors import CompileError, SchedlibError
from schedlib.rules.base import Config

log = logging.getLogger("schedlib.carver")

Resources = Callable[[Any], Any]  # Schedule -> an object with .registers, .spill_bytes and .arch


def pool_size(topk: int) -> int:
    """How many of the model's best configs are compiled for a top-``topk`` ranking: twice as many, at least
    8, so that a config the estimate placed just below the cut can rise into it."""
    return max(2 * topk, 8)


def reprice(ctx: Any, ranked: list[Config], pool: int, resources: Resources
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows for the first ``pool`` configs of ``ranked`` (the model's order) that compile and can launch,
    priced with compiled registers, and what happened (``arch``, ``compiled``, ``failed``, ``unlaunchable``,
    ``spilling``).  A config whose kernel fails to build or compile is left out and counted, with a warning
    naming it, and the next one is tried, at most ``2 * pool`` in all; when none of the first ``pool``
    compiles, the toolchain is the likelier culprit than the configs, so that is a CompileError."""
    rows: list[dict[str, Any]] = []
    arch = getattr(resources, "arch", None)
    counts: dict[str, Any] = {"arch": arch, "compiled": 0, "failed": 0, "unlaunchable": 0, "spilling": 0}
    first_error = ""
    tried = 0
    for config in ranked:
        if len(rows) == pool or tried == 2 * pool or (tried == pool and not counts["compiled"]):
            break
        tried += 1
        try:  # (with a config, apply raises where the rule declines; it returns None only for the default)
            usage = resources(ctx.rule.apply(ctx.func, ctx.profile, config))
        except SchedlibError as err:
            counts["failed"] += 1
            why = diagnostic(err)
            first_error = first_error or why
            log.warning("carve: %s config %s did not compile, left out: %s", ctx.rule.name, config, why)
            continue
        if not (isinstance(usage.registers, Integral) and usage.registers > 0
                and isinstance(usage.spill_bytes, Integral) and usage.spill_bytes >= 0):
            raise ValueError(f"carve: resources gave registers={usage.registers!r}, spill_bytes="
                             f"{usage.spill_bytes!r} for config {config}; they must be a positive and a "
                             "non-negative int")
        counts["compiled"] += 1
        counts["arch"] = usage.arch
        tiling = ctx.tiling(config, ctx.key(config))
        problem = ctx.problem(tiling.main_block)
        memo = ctx.memo.setdefault(("traffic", problem.main), {})
        figures = evaluate(problem, replace(tiling, registers=int(usage.registers)), ctx.profile, explain=False,
                           memo=memo)
        if figures["blocks_per_sm"] == 0:
            counts["unlaunchable"] += 1
            continue
        row = ctx.row(config, figures)
        row["model_registers"] = tiling.registers
        row["spill_bytes"] = int(usage.spill_bytes)
        counts["spilling"] += row["spill_bytes"] > 0
        rows.append(row)
    if tried and not counts["compiled"]:
        raise CompileError(f"carve: none of the {tried} configs the model ranked best built and compiled"
                           f"{f' for {arch}' if arch else ''}; the first: {first_error}")
    return rows, counts


def diagnostic(err: Exception) -> str:
    """The line of a build or compiler error worth a log line: the compiler's first error or fatal line
    (a CompileError opens with the command it ran, temporary paths and all), else the error's first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return next((line for line in lines[1:] if "error" in line.lower() or "fatal" in line.lower()), lines[0])
