"""Zero-search expert rules.  ``apply_default`` tries them in order; ``explain`` says who took a func and why
the others declined.  Each rule also exposes its knob ``space`` for the carver and the search."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from schedlib.hw import resolve
from schedlib.ir.func import Func, require_func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling
from schedlib.rules.elementwise import ElementwiseRule
from schedlib.rules.fallback import FallbackRule
from schedlib.rules.gemv import GemvRule
from schedlib.rules.general_reduction import GeneralReductionRule
from schedlib.rules.matmul import MatmulRule
from schedlib.rules.reduction import ReductionRule
from schedlib.rules.transpose import TransposeRule

log = logging.getLogger("schedlib.rules")

RULES: list[Rule] = [MatmulRule(), GemvRule(), GeneralReductionRule(), ReductionRule(), TransposeRule(),
                     ElementwiseRule(), FallbackRule()]


def get_rule(name: str) -> Rule:
    for r in RULES:
        if r.name == name:
            return r
    raise KeyError(f"no rule named {name!r}; rules are {[r.name for r in RULES]}")


def find_rule(func: Func, target: Any) -> Rule:
    """The first rule, in dispatch order, that applies to ``func``."""
    require_func(func, "find_rule")
    profile = resolve(target)
    for rule in RULES:
        try:
            if rule.applies(func, profile) is None:
                return rule
        except Exception as exc:  # a rule that crashes while matching is skipped, never fatal
            log.warning("rule %s failed while matching %s: %s", rule.name, func.name, exc)
    raise LookupError(f"no rule applies to {func.name}")


def _apply_one(func: Func, target: Any) -> Schedule:
    require_func(func, "apply_default")
    profile = resolve(target)
    raised: list[str] = []
    for rule in RULES:
        try:
            sch = rule.apply(func, profile)
        except Exception as exc:  # logged and skipped: the dispatcher never aborts on one rule
            log.warning("rule %s raised on %s: %s: %s", rule.name, func.name, type(exc).__name__, exc)
            raised.append(f"{rule.name} raised {type(exc).__name__}: {exc}")
            continue
        if sch is not None:
            return sch
    detail = "; ".join(raised) if raised else "every rule declined"
    raise LookupError(f"no rule applies to {func.name} ({detail}); sl.rules.explain says why each declined")


def apply_default(func_or_list: Func | Sequence[Func], target: Any = "h100") -> Schedule | list[Schedule]:
    """The first applicable rule's expert schedule (for a list: one schedule per func)."""
    if isinstance(func_or_list, Func):
        return _apply_one(func_or_list, target)
    if isinstance(func_or_list, (str, bytes)) or not hasattr(func_or_list, "__iter__"):
        raise TypeError(f"apply_default: expected a Func or a list of Funcs, got {type(func_or_list).__name__}")
    return [_apply_one(f, target) for f in func_or_list]


def explain(func: Func, target: Any = "h100") -> str:
    """Which rule takes ``func`` on ``target`` and why each earlier rule declined."""
    require_func(func, "explain")
    profile = resolve(target)
    lines = [f"func {func.name} on {profile.key}:"]
    for rule in RULES:
        # the same steps as apply_default, so that a rule that matches but fails to schedule is reported as
        # skipped, as the dispatcher skips it, rather than as the one that applies
        try:
            why = rule.applies(func, profile)
            sch = rule.apply(func, profile) if why is None else None
        except Exception as exc:
            why = f"raised {type(exc).__name__}: {exc}"
        if why is None and sch is not None:
            lines.append(f"  {rule.name}: APPLIES with default config {sch.config}")
            return "\n".join(lines)
        lines.append(f"  {rule.name}: declined: {why}")
    lines.append("  no rule applies")
    return "\n".join(lines)


__all__ = ["RULES", "Config", "Knob", "Rule", "Space", "Tiling", "apply_default", "explain", "find_rule",
           "get_rule"]
