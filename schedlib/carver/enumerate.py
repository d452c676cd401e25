"""Which points of a rule's knob space the carver looks at: all of them when that is cheap, else a
Roller-style best-first growth.

Roller (Zhu et al., OSDI'22) builds a tile up from a small hardware-aligned base, growing it one
aligned step at a time along the dimension that helps most, and keeps the candidates in a priority queue
ordered by memory traffic x waves.  Here the lattice is the rule's knob space (each knob's values are
ordered small to large): a point's neighbours are one step up or down of one knob, and since knobs are
coupled (a bigger block tile needs a bigger thread tile to stay within the thread limit) an illegal step
is repaired by one more step of another knob.  The queue is ordered by the model's estimated time,
which is Roller's traffic x waves priced in seconds (traffic at each level, waves and occupancy).
Illegal points are never evaluated; points that cannot launch (no resident block) are dead ends.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from schedlib.rules.base import Config, Space

# Full product size up to which every legal point is ranked.  Listing the product costs about 2 us a point
# (the check), so 100k points cost ~0.2 s, less than the growth budget's model evaluations; the matmul space
# with its mma.sync knobs (69k points, ~3k legal) is ranked exhaustively.  The fp16 space on Hopper, with
# wgmma's knobs too (242k points, ~4k legal), grows instead: 0.3 s against 1.0 s, same top-1 for 4096^3.
EXHAUSTIVE_LIMIT = 100_000
GROWTH_BUDGET = 1500  # legal points the growth evaluates at most (Roller stops at 2000 tiles)

Index = tuple[int, ...]


def exhaustive(space: Space) -> Iterator[Config]:
    """Every legal point, in lexicographic order of the knob values."""
    return space.enumerate()


class Lattice:
    """A knob space as a grid of value indices, with legality cached per point."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.names = space.names
        self.values = [k.values for k in space.knobs]
        self._index = [{_key(v): i for i, v in enumerate(vals)} for vals in self.values]
        self._legal: dict[Index, bool] = {}

    def index(self, config: Mapping[str, Any]) -> Index:
        return tuple(self._index[i][_key(config[n])] for i, n in enumerate(self.names))

    def config(self, ix: Index) -> Config:
        return {n: self.values[i][j] for i, (n, j) in enumerate(zip(self.names, ix))}

    def legal(self, ix: Index) -> bool:
        ok = self._legal.get(ix)
        if ok is None:
            check = self.space.check
            ok = check is None or check(self.config(ix)) is None
            self._legal[ix] = ok
        return ok

    def _step(self, ix: Index, i: int, d: int) -> Index | None:
        j = ix[i] + d
        if not 0 <= j < len(self.values[i]):
            return None
        return (*ix[:i], j, *ix[i + 1:])

    def neighbours(self, ix: Index) -> list[Index]:
        """Legal points one knob step away, or two steps when the first alone is illegal."""
        out: dict[Index, None] = {}
        n = len(self.names)
        for i, d in itertools.product(range(n), (1, -1)):
            nb = self._step(ix, i, d)
            if nb is None:
                continue
            if self.legal(nb):
                out[nb] = None
                continue
            for i2, d2 in itertools.product(range(n), (1, -1)):
                if i2 == i:
                    continue
                nb2 = self._step(nb, i2, d2)
                if nb2 is not None and self.legal(nb2):
                    out[nb2] = None
        return list(out)


def _key(v: Any) -> Any:
    # True == 1 in Python: keep booleans and integers apart in the index; unhashable values by repr
    try:
        hash(v)
    except TypeError:
        return (type(v).__name__, repr(v))
    return (type(v).__name__, v)


def grow(space: Space, score: Callable[[Config], float | None], seeds: Iterable[Config],
         budget: int = GROWTH_BUDGET) -> list[tuple[Config, float]]:
    """Best-first growth from ``seeds`` over the legal points of ``space``.

    ``score`` gives a point's priority (estimated time, lower is better) or None for a point that can
    be built but not launched.  Returns every scored point that was evaluated, at most ``budget``.
    """
    lattice = Lattice(space)
    scores: dict[Index, float | None] = {}
    heap: list[tuple[float, Index]] = []

    def visit(ix: Index) -> None:
        s = score(lattice.config(ix))
        scores[ix] = s
        if s is not None:
            heapq.heappush(heap, (s, ix))

    for seed in seeds:
        ix = lattice.index(seed)
        if ix not in scores and lattice.legal(ix):
            visit(ix)
    while heap and len(scores) < budget:
        _, ix = heapq.heappop(heap)
        for nb in lattice.neighbours(ix):
            if nb not in scores:
                visit(nb)
                if len(scores) >= budget:
                    break
    return [(lattice.config(ix), s) for ix, s in scores.items() if s is not None]


def smallest_legal(space: Space) -> Config | None:
    """The lexicographically first legal point (the small end of every knob): Roller's base tile."""
    return next(iter(space.enumerate(limit=1)), None)
