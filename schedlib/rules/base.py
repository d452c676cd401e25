"""The contract every rule keeps: a knob space, the tiling a point of it means, and ``apply``.

The three ways of choosing a schedule (rule default, carver, search) all fill the *same* :class:`Space`, so
their results are configs of one template and compare like with like.  A config is a plain JSON-able dict
``{knob name: value}``.  :meth:`Rule.tiling` tells the carver what a config means physically (tile sizes per
axis, threads, shared memory); the carver's model is generic over that.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from schedlib.errors import ScheduleError
from schedlib.hw import HardwareProfile, resolve
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule

Config = dict[str, Any]
FactsT = TypeVar("FactsT")  # what a rule's analysis returns


@dataclass(frozen=True)
class Knob:
    """One tunable with its legal values, ordered from small to large where that means anything."""

    name: str
    values: tuple[Any, ...]
    doc: str = ""

    def __post_init__(self) -> None:
        # Values built with numpy (tuple(np.arange(1, 5))) are numpy scalars, but a config is plain JSON: a
        # config read back is plain, and legality compares types (_one_of), so every such point was rejected
        # as illegal in memory and storing one raised "int64 is not JSON serializable".  Hold plain values.
        if any(isinstance(v, np.generic) for v in self.values):
            object.__setattr__(self, "values", tuple(v.item() if isinstance(v, np.generic) else v
                                                     for v in self.values))


@dataclass(frozen=True)
class Space:
    """The knobs of one rule for one func and target; ``check`` rejects combinations that cannot run."""

    rule: str
    knobs: tuple[Knob, ...]
    check: Callable[[Config], str | None] | None = field(default=None, compare=False)

    @property
    def names(self) -> list[str]:
        return [k.name for k in self.knobs]

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(f"the {self.rule} space has no knob {name!r}; its knobs are {self.names}")

    @property
    def size(self) -> int:
        """Points in the full cartesian product (before ``check``)."""
        return math.prod(len(k.values) for k in self.knobs)

    def reason(self, config: Mapping[str, Any]) -> str | None:
        """Why ``config`` is not a legal point (None when it is)."""
        if not isinstance(config, Mapping):
            return f"a config is a mapping of knob values, got {type(config).__name__}"
        config = plain_values(config)
        extra = set(config) - set(self.names)
        if extra:  # first: a misspelt knob would otherwise be reported as the one it was meant to be
            return f"unknown knob(s) {sorted(extra)}; the {self.rule} space has {self.names}"
        missing = [k.name for k in self.knobs if k.name not in config]
        if missing:
            return f"knob {missing[0]} is missing" if len(missing) == 1 else f"knobs {', '.join(missing)} are missing"
        for k in self.knobs:
            if not _one_of(config[k.name], k.values):
                return f"knob {k.name}={config[k.name]!r} is not one of {list(k.values)}"
        return self.check(dict(config)) if self.check else None

    def validate(self, config: Mapping[str, Any]) -> Config:
        """``config`` as plain Python values (a numpy integer or bool read from a DataFrame becomes an int or
        bool), or ScheduleError saying why it is not a legal point."""
        config = plain_values(config)
        why = self.reason(config)
        if why is not None:
            raise ScheduleError(f"{self.rule}.apply", "config", dict(config) if isinstance(config, Mapping)
                                else config, why)
        return dict(config)

    def is_legal(self, config: Mapping[str, Any]) -> bool:
        return self.reason(config) is None

    def enumerate(self, limit: int | None = None) -> Iterator[Config]:
        """Legal points in lexicographic order of the knob values (at most ``limit`` of them)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"{self.rule} space: enumerate(limit={limit!r}) needs None or an int >= 0")
        if limit == 0:
            return
        n = 0
        for values in itertools.product(*(k.values for k in self.knobs)):
            config = dict(zip(self.names, values))
            if self.check is None or self.check(config) is None:
                yield config
                n += 1
                if limit is not None and n >= limit:
                    return

    def sample(self, rng: random.Random, tries: int = 20000) -> Config:
        """A random legal point (rejection sampling).  Spaces whose knobs are pinned per path (the matmul's
        tensor-core and SIMT knobs) have a few legal points per thousand, hence the generous default."""
        if not hasattr(rng, "choice"):
            raise TypeError(f"{self.rule} space: sample needs a random.Random, got {type(rng).__name__}")
        for _ in range(tries):
            config = {k.name: rng.choice(k.values) for k in self.knobs}
            if self.is_legal(config):
                return config
        raise ScheduleError(f"{self.rule}.space", "sample", tries, "found no legal point")


@dataclass(frozen=True)
class Tiling:
    """What one config means on the GPU, for the analytical model.

    ``block_tile`` maps each axis of the main block to the extent one CUDA block covers (reduce axes: the
    whole extent a block reduces, i.e. extent / split_k).  ``step`` maps reduce axes to the slice loaded
    per pipeline step.  ``thread_tile`` is the per-thread share of the spatial axes.  A tensor-core tiling
    also gives ``warp_tile`` (the spatial extent one warp's mma instructions cover: what the warp reads from
    shared memory per k) and ``raster`` (block rows walked together, see the matmul rule); they stay empty
    and 1 for SIMT tilings.  ``shared_buffers`` names the loads staged in shared memory when the rule knows
    them (None: the model infers them from ``shared_bytes``).  ``rereads`` names inputs whose tile a block
    reads again after the first pass, with the number of further passes.
    """

    main_block: str
    block_tile: dict[str, int]
    thread_tile: dict[str, int]
    step: dict[str, int]
    threads: int
    shared_bytes: int
    registers: int  # estimate per thread
    vector: int = 1
    stages: int = 1
    split_k: int = 1
    tensor_core: bool = False
    warp_tile: dict[str, int] = field(default_factory=dict)
    raster: int = 1
    shared_buffers: tuple[str, ...] | None = None
    warpgroup: bool = False  # tensor cores driven by Hopper wgmma (else mma.sync)
    tma: bool = False  # operand tiles requested by one thread through the TMA (else copied by every thread)
    ahead: int | None = None  # loop steps requested ahead of the one computed (None: stages - 1)
    # Inputs a block reads from global memory again after its first pass over its tile, and how many more
    # times (a row kernel's later passes); L1 or L2 serves them when the blocks in flight keep the data.
    rereads: dict[str, int] = field(default_factory=dict)


class Rule(ABC):
    """A schedule template: ``analyze`` recognises the pattern (by S/R structure, never by names)."""

    name: str = "rule"

    # Methods that take a target: users call ``rule.space(f, "h100")`` as readily as the library passes a
    # resolved profile, so every subclass's versions accept anything ``hw.resolve`` does.
    _TARGET_METHODS = ("space", "default_config", "tiling", "applies", "template_default")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "default_config" in cls.__dict__:
            cls.default_config = _fitting_the_space(cls.__dict__["default_config"])  # type: ignore[method-assign]
        for name in cls._TARGET_METHODS:
            if name in cls.__dict__:
                setattr(cls, name, _resolving_target(cls.__dict__[name]))

    @abstractmethod
    def analyze(self, func: Func, target: HardwareProfile) -> Any:
        """The pattern facts the rule needs, or a ``str`` saying why it does not apply."""

    @abstractmethod
    def space(self, func: Func, target: Any) -> Space:
        """The knob space for this func on this target."""

    @abstractmethod
    def default_config(self, func: Func, target: Any) -> Config:
        """The expert choice, derived from the profile's numbers."""

    @abstractmethod
    def schedule(self, func: Func, facts: Any, config: Config, target: HardwareProfile) -> Schedule:
        """Build the schedule for one legal config."""

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling | None:
        """Physical meaning of ``config`` for the carver (None: not modelled)."""
        return None

    def seed_configs(self, func: Func, target: Any) -> list[Config]:
        """Where the carver's growth starts in a space too large to enumerate: the default, and a rule's
        other templates' own defaults where the default alone would leave a region of its space unvisited."""
        return [self.default_config(func, target)]

    def _require(self, facts: FactsT | str) -> FactsT:
        """The facts of an analysis, or the error every rule gives for a func it does not take (not a space
        or config that looks usable, nor an AttributeError from deep inside)."""
        if isinstance(facts, str):
            raise ValueError(f"{self.name} rule does not apply: {facts}")
        return facts

    def applies(self, func: Func, target: Any) -> str | None:
        """None when the rule applies, else the reason it declines."""
        facts = self.analyze(func, resolve(target))
        return facts if isinstance(facts, str) else None

    def apply(self, func: Func, target: Any, config: Mapping[str, Any] | None = None) -> Schedule | None:
        """The schedule for ``config`` (the expert default when None).  When the rule does not apply: None
        for the default (the dispatcher then tries the next rule), ScheduleError with the reason for an
        explicit config (a config for this rule was meant for another func)."""
        profile = resolve(target)
        facts = self.analyze(func, profile)
        if isinstance(facts, str):
            if config is None:
                return None
            raise ScheduleError(f"{self.name}.apply", "func", getattr(func, "name", func),
                                f"the {self.name} rule does not apply: {facts}")
        space = self.space(func, profile)
        chosen = self.default_config(func, profile) if config is None else space.validate(config)
        sch = self.schedule(func, facts, chosen, profile)
        sch.rule, sch.config = self.name, dict(chosen)
        return sch

    def __repr__(self) -> str:
        return f"<Rule {self.name}>"


def plain_values(config: Any) -> Any:
    """A mapping's numpy scalars as the Python values they hold (``np.int64(64)`` -> ``64``): a config read
    back from a DataFrame row has them.  Anything else is returned as it is."""
    if not isinstance(config, Mapping):
        return config
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in config.items()}


def _one_of(value: Any, values: tuple[Any, ...]) -> bool:
    """``value`` is one of ``values`` with the same type too: ``32.0`` or ``True`` equal ``32`` or ``1`` but would
    reach the schedule as a float split factor or a flag."""
    return any(value == v and type(value) is type(v) for v in values)


def _fitting_the_space(method: Callable[..., Any]) -> Callable[..., Any]:
    """A rule's default made legal for the target: the expert choices are tuned for the usual limits (1024
    threads per block), so a profile with smaller ones (a custom card file) could make them illegal.  Then the
    legal point nearest to the expert choice is taken instead (:func:`nearest_legal`)."""
    @functools.wraps(method)
    def call(self: Rule, func: Func, target: Any, *args: Any, **kwargs: Any) -> Any:
        config = method(self, func, target, *args, **kwargs)
        space = self.space(func, target)
        return config if space.is_legal(config) else nearest_legal(space, config)

    return call


def nearest_legal(space: Space, config: Mapping[str, Any], limit: int = 200_000) -> Config:
    """The legal point of ``space`` closest to ``config``: numeric knobs by how many doublings apart their
    values are, others by whether they differ; ties keep the earlier point (the smaller values)."""
    def distance(point: Config) -> float:
        total = 0.0
        for name, want in config.items():
            got = point.get(name)
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (want, got))
            total += abs(math.log2(got / want)) if numbers else float(got != want)
        return total

    best = min(space.enumerate(limit), key=distance, default=None)
    if best is None:
        raise ScheduleError(f"{space.rule}.default_config", "config", dict(config),
                            "the space has no legal point on this target")
    return {name: best[name] for name in config} if set(config) == set(best) else best


def _resolving_target(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Rule, func: Func, target: Any, *args: Any, **kwargs: Any) -> Any:
        return method(self, func, resolve(target), *args, **kwargs)

    return call


def pow2_range(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two in ``[lo, hi]``."""
    out, v = [], 1
    while v <= hi:
        if v >= lo:
            out.append(v)
        v *= 2
    return tuple(out)
