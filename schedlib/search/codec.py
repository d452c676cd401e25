"""The bridge between a rule's knob :class:`~schedlib.rules.base.Space` and Optuna's parameters.

Every knob with more than one value becomes an integer parameter over the *index* of its value
(``IntDistribution(0, len(values) - 1)``).  Why indices rather than categorical values: knob values are
ordered from small to large, so TPE's Parzen windows and CMA-ES's Gaussian see neighbours as neighbours
(a block of 64 is between 32 and 128), and CMA-ES - which cannot handle categorical parameters at all - gets
ordinal integers it can treat with a margin.  Single-valued knobs are constants and never reach Optuna.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, IntDistribution

from schedlib.rules.base import Config, Space
from schedlib.search.records import config_key

ENUMERATE_LIMIT = 200_000  # spaces whose product is larger are sampled, not listed up front
# A larger space is listed once, lazily, only when the search can no longer find an unrecorded point by
# sampling (the fp16 matmul space: 403,200 points in 0.65 s).  Past this product even that is too slow, and
# the tuner stops on repeated failed fills instead (see loop.py).
SCAN_LIMIT = 10_000_000


class SpaceCodec:
    """Encode configs as Optuna params (value indices) and back; list or sample legal points."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.names = space.names
        self.free = [k for k in space.knobs if len(k.values) > 1]
        self.fixed = {k.name: k.values[0] for k in space.knobs if len(k.values) == 1}
        self.distributions: dict[str, BaseDistribution] = {
            k.name: IntDistribution(0, len(k.values) - 1) for k in self.free}
        self._legal: list[Config] | None = None
        self._coords: np.ndarray | None = None  # legal points as scaled value indices (for spread)

    def decode(self, params: Mapping[str, Any]) -> Config:
        """Params (value indices) -> config; raises KeyError naming a missing knob."""
        config = dict(self.fixed)
        for knob in self.free:
            if knob.name not in params:
                raise KeyError(f"trial params lack knob {knob.name!r} (have {sorted(params)})")
            config[knob.name] = knob.values[int(params[knob.name])]
        return {n: config[n] for n in self.names}

    def encode(self, config: Mapping[str, Any]) -> dict[str, int]:
        """Config -> params; raises ValueError naming a value that is not one of the knob's values."""
        params = {}
        for knob in self.free:
            value = config[knob.name]
            try:
                params[knob.name] = knob.values.index(value)
            except ValueError:
                raise ValueError(f"knob {knob.name}={value!r} is not one of {list(knob.values)}") from None
        return params

    def key(self, config: Mapping[str, Any]) -> str:
        return config_key(config)

    @property
    def enumerable(self) -> bool:
        return self.space.size <= ENUMERATE_LIMIT

    def legal(self) -> list[Config]:
        """All legal points in lexicographic order (computed once; only for enumerable spaces)."""
        if self._legal is None and not self.enumerable:
            raise ValueError(f"the {self.space.rule} space has {self.space.size} points; too many to list")
        return self.scan()

    @property
    def scannable(self) -> bool:
        return self.space.size <= SCAN_LIMIT

    def scan(self) -> list[Config]:
        """All legal points, listed once even past ENUMERATE_LIMIT (for an exact "is anything left?")."""
        if self._legal is None:
            if not self.scannable:
                raise ValueError(f"the {self.space.rule} space has {self.space.size} points; too many to scan")
            self._legal = list(self.space.enumerate())
        return self._legal

    def sample(self, rng: random.Random) -> Config:
        """A uniformly random legal point."""
        if self.enumerable:
            return dict(rng.choice(self.legal()))
        return self.space.sample(rng)

    def unrecorded(self, rng: random.Random, taken: set[str] | frozenset[str], tries: int = 64) -> Config | None:
        """A random legal point whose key is not in ``taken`` (None when every legal point is taken)."""
        for _ in range(tries):
            config = self.sample(rng)
            if self.key(config) not in taken:
                return config
        listed = self.legal() if self.enumerable else self._legal  # a large space: only once scan() listed it
        if listed is None:
            return None  # not listed (yet): the caller cannot tell "none left" from "none found"
        rest = [c for c in listed if self.key(c) not in taken]
        return dict(rng.choice(rest)) if rest else None

    def spread(self, rng: random.Random, taken: set[str] | frozenset[str], n: int) -> list[Config]:
        """``n`` untried legal points, each as far as possible from the recorded ones and each other.

        Greedy max-min distance over the knobs' value indices scaled to [0, 1] (ties broken at random): a
        cost model trained on a handful of such points has seen every knob at both ends of its range, where
        random points often cluster.  Falls back to random points for spaces too large to list.
        """
        if not self.enumerable or not self.free:
            out: list[Config] = []
            for _ in range(n):
                config = self.unrecorded(rng, taken | {self.key(c) for c in out})
                if config is None:
                    break
                out.append(config)
            return out
        legal = self.legal()
        if self._coords is None:
            self._coords = np.array([[k.values.index(c[k.name]) / (len(k.values) - 1) for k in self.free]
                                     for c in legal])
        keys = [self.key(c) for c in legal]
        chosen = [i for i, key in enumerate(keys) if key in taken]
        free = np.array([key not in taken for key in keys])
        nearest = np.full(len(legal), np.inf)
        for i in chosen:
            nearest = np.minimum(nearest, ((self._coords - self._coords[i]) ** 2).sum(axis=1))
        out = []
        jitter = np.array([rng.random() for _ in legal]) * 1e-9
        for _ in range(min(n, int(free.sum()))):
            if np.isinf(nearest).all():  # nothing recorded yet: the first point is random
                i = rng.choice(np.flatnonzero(free).tolist())
            else:
                i = int(np.argmax(np.where(free, nearest + jitter, -np.inf)))
            out.append(dict(legal[i]))
            free[i] = False
            nearest = np.minimum(nearest, ((self._coords - self._coords[i]) ** 2).sum(axis=1))
        return out

    def neighbours(self, config: Mapping[str, Any]) -> Iterator[Config]:
        """Configs that differ in one knob by one step of its ordered values (legal or not)."""
        for knob in self.free:
            i = knob.values.index(config[knob.name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(knob.values):
                    yield {**config, knob.name: knob.values[j]}
