"""The carver's public face: ``carve`` ranks a rule's legal configs, ``estimate`` prices one, ``best``
returns the winner's Schedule.

Why a per-(func, target, rule, symbols) context: the search backend and cost-model features call
``estimate`` thousands of times on one problem, so the func analysis, the knob space and every tiling
and figure set already computed are kept (a small LRU of contexts, checked by object identity).
"""

from __future__ import annotations

import numbers
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import pandas as pd

from schedlib.carver.compiled import Resources, pool_size, reprice
from schedlib.carver.enumerate import EXHAUSTIVE_LIMIT, GROWTH_BUDGET, exhaustive, grow, smallest_legal
from schedlib.carver.model import evaluate, reason
from schedlib.carver.problem import Problem, analyze, bind_symbolic
from schedlib.errors import ScheduleError
from schedlib.hw import ENV_PATH, HardwareProfile, resolve
from schedlib.ir.func import Func, require_func
from schedlib.ir.layout import check_index_range
from schedlib.ir.schedule import Schedule
from schedlib.rules import find_rule, get_rule
from schedlib.rules.base import Config, Rule, Space, Tiling

METHODS = ("auto", "exhaustive", "grow")
_CONTEXTS: OrderedDict[tuple, _Context] = OrderedDict()
_MAX_CONTEXTS = 32
_LOCK = threading.Lock()
# keyed by (target, $SCHEDLIB_HWPROFILE_PATH, working directory): see _profile
_PROFILES: dict[tuple[str, str, str], HardwareProfile] = {}
_PROFILE_STAMPS: dict[tuple[str, str, str], tuple[int, int] | None] = {}


class _Context:
    """Everything about one (func, profile, rule, symbolic values) that does not depend on the config."""

    def __init__(self, func: Func, profile: HardwareProfile, rule: Rule, symbols: dict[str, int]) -> None:
        self.func, self.profile, self.rule, self.symbols = func, profile, rule, symbols
        why = rule.applies(func, profile)
        if why is not None:
            raise ValueError(f"rule {rule.name} does not apply to {func.name}: {why}")
        self.space: Space = rule.space(func, profile)
        self.problems: dict[str, Problem] = {}
        self.tilings: dict[tuple, Tiling] = {}
        self.figures: dict[tuple, dict[str, Any]] = {}
        self.memo: dict[tuple, dict] = {}  # the model's traffic memos, per main block

    def key(self, config: Mapping[str, Any]) -> tuple:
        return tuple(config[n] for n in self.space.names)

    def tiling(self, config: Config, key: tuple) -> Tiling:
        t = self.tilings.get(key)
        if t is None:
            t = self.rule.tiling(self.func, self.profile, config)
            if t is None:
                raise ValueError(f"rule {self.rule.name} does not describe its tiling (Rule.tiling returned "
                                 f"None), so the carver cannot model it")
            self.tilings[key] = t
        return t

    def problem(self, main: str) -> Problem:
        p = self.problems.get(main)
        if p is None:
            p = self.problems[main] = analyze(self.func, main, self.symbols)
        return p

    def figures_of(self, config: Config) -> dict[str, Any]:
        """The model's figures for a legal config (cached, without the reason sentence)."""
        key = self.key(config)
        f = self.figures.get(key)
        if f is None:
            t = self.tiling(config, key)
            problem = self.problem(t.main_block)
            memo = self.memo.setdefault(("traffic", problem.main), {})
            f = self.figures[key] = evaluate(problem, t, self.profile, explain=False, memo=memo)
        return f

    def row(self, config: Config, figures: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ranking's row for ``config``: the model's figures (or ``figures``, priced otherwise)."""
        f = dict(self.figures_of(config) if figures is None else figures)
        f["reason"] = reason(f, self.profile)
        knobs = {(n if n not in f and n not in ("rule", "config") else f"knob_{n}"): config[n]
                 for n in self.space.names}
        return {"rule": self.rule.name, "config": dict(config), **knobs, **f}


def _resolve_rule(func: Func, profile: HardwareProfile, rule: Rule | str | None) -> Rule:
    if rule is None:
        return find_rule(func, profile)
    if isinstance(rule, str):
        return get_rule(rule)
    if isinstance(rule, Rule):
        return rule
    raise TypeError(f"rule must be None, a rule name or a Rule, got {type(rule).__name__}")


def _profile(target: Any) -> HardwareProfile:
    """``resolve(target)``, remembered per target name: resolving a name scans the profile directories,
    which would dominate an ``estimate`` call.  A remembered profile is dropped when its file changes; the
    key includes what a name resolves against (the search path, the working directory for a relative path),
    so a profile directory added later shadows a built-in as it does for ``hw.load``."""
    if isinstance(target, HardwareProfile):
        return target
    name = os.fspath(target) if isinstance(target, (str, os.PathLike)) else None
    if name is None or name.strip().lower() == "auto":
        return resolve(target)
    key = (name, os.environ.get(ENV_PATH, ""), _cwd())
    hit = _PROFILES.get(key)
    if hit is not None and _stamp(hit.origin) == _PROFILE_STAMPS.get(key):
        return hit
    profile = resolve(target)
    _PROFILES[key], _PROFILE_STAMPS[key] = profile, _stamp(profile.origin)
    return profile


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # a removed working directory: relative paths resolve to nothing there anyway
        return ""


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _context(func: Func, target: Any, rule: Rule | str | None, symbolic_value: Any) -> _Context:
    require_func(func, "carver")
    profile = _profile(target)
    symbols = bind_symbolic(func, symbolic_value)
    check_index_range(func, symbols)  # no config of a func no kernel can index is worth ranking
    rule_key = rule if rule is None or isinstance(rule, str) else id(rule)
    key = (id(func), id(profile), rule_key, tuple(sorted(symbols.items())))
    with _LOCK:  # the search may estimate from several threads
        ctx = _CONTEXTS.get(key)
        if ctx is not None and ctx.func is func and ctx.profile is profile and (
                rule is None or isinstance(rule, str) or ctx.rule is rule):
            _CONTEXTS.move_to_end(key)
            return ctx
    ctx = _Context(func, profile, _resolve_rule(func, profile, rule), symbols)
    with _LOCK:
        _CONTEXTS[key] = ctx
        while len(_CONTEXTS) > _MAX_CONTEXTS:
            _CONTEXTS.popitem(last=False)
    return ctx


def estimate(func: Func, target: Any, config: Mapping[str, Any], *, rule: Rule | str | None = None,
             symbolic_value: int | Mapping[str, int] | None = None) -> dict[str, Any]:
    """Every figure of the model for one legal ``config`` (same keys as a :func:`carve` row).

    Raises :class:`ScheduleError` for a config the rule's space rejects.  Repeated calls on the same
    func and target reuse the analysis, so each new config costs well under a millisecond.
    """
    ctx = _context(func, target, rule, symbolic_value)
    chosen = ctx.space.validate(config)
    return ctx.row(chosen)


def _order(row: Mapping[str, Any]) -> tuple:
    """Best first: estimated time, then fewer issued instructions, less L2 traffic, fewer registers, the
    deeper pipeline (latency the model does not see is better hidden), the deeper k step (fewer waits and
    barriers per tile, which the model does not price: on an H200 the fp16 4096^3 wgmma kernel ran 196 us
    at block_k 64 and 232 us at 32, estimated equal), then the config itself (a stable tie-break, so equal
    estimates rank the same way every run)."""
    return (round(row["est_time_us"], 9), row["instructions"], row["l2_bytes"], row["registers_per_thread"],
            -row["pipeline_stages"], -int(row["config"].get("block_k", 0)), repr(sorted(row["config"].items())))


def carve(func: Func, target: Any, topk: int | None = 10, *, rule: Rule | str | None = None,
          symbolic_value: int | Mapping[str, int] | None = None, method: str = "auto",
          resources: Resources | None = None) -> pd.DataFrame:
    """Rank the legal, hardware-aligned configs of the rule's knob space by estimated time, best first.

    ``method``: "exhaustive" models every legal point, "grow" runs the Roller-style best-first growth
    (for spaces too large to enumerate), "auto" picks by the size of the space.  ``topk=None`` keeps
    every ranked point.  ``df.attrs`` records the target, rule, symbolic values, method and how many
    points were evaluated, legal (exhaustive only), launchable and aligned; when a problem admits no
    aligned point (odd tiny shapes) the unaligned legal points are ranked instead and
    ``df.attrs["aligned"]`` is False.

    ``resources`` (``schedlib.runtime.resources.compiled_resources(target)``) compiles the model's best
    ``max(2 * topk, 8)`` configs (the next ones in place of any that fail or cannot launch) and ranks them
    again with the registers ptxas allots, spilling configs last (:mod:`schedlib.carver.compiled`); rows
    then carry ``model_registers`` and ``spill_bytes``, and ``df.attrs["compiled"]`` what was compiled.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(topk, numbers.Integral) and not isinstance(topk, bool):
        topk = int(topk)  # a numpy integer is the int it holds
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int) or topk < 1):
        raise ValueError(f"topk must be a positive int or None, got {topk!r}")
    if resources is not None and topk is None:
        raise ValueError("carve: resources= compiles the configs it ranks; give a topk (it compiles the best "
                         "max(2 * topk, 8) of the model's ranking)")
    if resources is not None and not callable(resources):
        raise TypeError(f"resources must be a function of a Schedule (compiled_resources(target)), got "
                        f"{type(resources).__name__}")
    ctx = _context(func, target, rule, symbolic_value)
    built_for = getattr(resources, "profile", None)
    if built_for is not None and getattr(built_for, "key", None) != ctx.profile.key:
        raise ValueError(f"carve: resources builds for {built_for.key} and the ranking is for {ctx.profile.key}; "
                         f"give compiled_resources({ctx.profile.key!r})")
    space = ctx.space
    use = method if method != "auto" else ("exhaustive" if space.size <= EXHAUSTIVE_LIMIT else "grow")
    if use == "exhaustive":
        configs = list(exhaustive(space))
    else:
        def score(config: Config) -> float | None:
            f = ctx.figures_of(config)
            if f["blocks_per_sm"] == 0:
                return None
            return f["est_time_us"] * (1.0 if f["aligned"] else 1.5)  # grow through, never end on, unaligned

        seeds = [c for c in (*_seeds(ctx), smallest_legal(space)) if c is not None]
        configs = [c for c, _ in grow(space, score, seeds, GROWTH_BUDGET)]
    launchable = [c for c in configs if ctx.figures_of(c)["blocks_per_sm"] > 0]
    aligned = [c for c in launchable if ctx.figures_of(c)["aligned"]]
    ranked = aligned or launchable
    ranked.sort(key=lambda c: _order({"config": c, **ctx.figures_of(c)}))
    compiled: dict[str, Any] | None = None
    if resources is not None:
        assert topk is not None  # refused above
        rows, compiled = reprice(ctx, ranked, pool_size(topk), resources)
        rows.sort(key=lambda r: (r["spill_bytes"] > 0, *_order(r)))
        rows = rows[:topk]
    else:
        rows = [ctx.row(c) for c in (ranked if topk is None else ranked[:topk])]
    columns = list(rows[0]) if rows else _columns(ctx) + (["model_registers", "spill_bytes"] if compiled else [])
    df = pd.DataFrame(rows, columns=columns)
    df.attrs.update({
        "target": ctx.profile.key, "rule": ctx.rule.name, "func": func.name, "symbolic": dict(ctx.symbols),
        "method": use, "evaluated": len(configs), "legal": len(configs) if use == "exhaustive" else None,
        "launchable": len(launchable), "aligned_points": len(aligned),
        "aligned": bool(aligned) or not launchable,
    })  # fmt: skip
    if compiled is not None:
        df.attrs["compiled"] = compiled
    return df


def _columns(ctx: _Context) -> list[str]:
    """Column names of an empty ranking (no legal point), so callers can still index by name."""
    default = _default(ctx)
    if default is not None:
        return list(ctx.row(default))
    return ["rule", "config", *ctx.space.names, "est_time_us", "pct_of_peak", "reason"]


def _seeds(ctx: _Context) -> list[Config]:
    """The rule's legal seed configs (its default first); none where the rule's seeding fails."""
    try:
        seeds = ctx.rule.seed_configs(ctx.func, ctx.profile)
    except Exception:  # as for the default: the space is still rankable from its smallest point
        return [c for c in (_default(ctx),) if c is not None]
    return [c for c in seeds if ctx.space.is_legal(c)]


def _default(ctx: _Context) -> Config | None:
    try:
        config = ctx.rule.default_config(ctx.func, ctx.profile)
    except Exception:  # a rule whose expert default fails is still rankable from its space
        return None
    return config if ctx.space.is_legal(config) else None


def best(func: Func, target: Any, *, rule: Rule | str | None = None,
         symbolic_value: int | Mapping[str, int] | None = None, resources: Resources | None = None) -> Schedule:
    """The Schedule of the top-ranked config, ready for ``sl.build`` (``resources``: as for :func:`carve`)."""
    ctx = _context(func, target, rule, symbolic_value)
    df = carve(func, ctx.profile, topk=1, rule=ctx.rule, symbolic_value=symbolic_value, resources=resources)
    if df.empty and "compiled" in df.attrs:
        c = df.attrs["compiled"]
        raise ScheduleError("carver.best", "func", func.name,
                            f"none of the {c['compiled']} configs compiled for {c['arch']} can launch on "
                            f"{ctx.profile.key} with the registers ptxas allots them")
    if df.empty:
        raise ScheduleError("carver.best", "func", func.name,
                            f"the {ctx.rule.name} space has no legal point that can launch on {ctx.profile.key}")
    sch = ctx.rule.apply(func, ctx.profile, df.iloc[0]["config"])
    if sch is None:  # applies() was checked when the context was built; keep the failure explicit
        raise ScheduleError("carver.best", "rule", ctx.rule.name, f"declined {func.name} at apply time")
    return sch

