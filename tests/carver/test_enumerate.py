"""The Roller-style growth over a knob lattice: coupled knobs, budgets, dead ends."""

from __future__ import annotations

from schedlib.carver.enumerate import Lattice, grow, smallest_legal
from schedlib.rules.base import Knob, Space


def _coupled() -> Space:
    # threads = block // per_thread must stay within 32..256: growing the block alone soon becomes
    # illegal, growing it together with the per-thread tile stays legal (a matmul's bm and tm).
    def check(c: dict) -> str | None:
        threads = c["block"] // c["per_thread"]
        return None if 32 <= threads <= 256 else f"{threads} threads"

    return Space("toy", (Knob("block", (32, 64, 128, 256, 512, 1024)), Knob("per_thread", (1, 2, 4, 8))), check)


def test_an_illegal_step_is_repaired_by_a_second_knob() -> None:
    lattice = Lattice(_coupled())
    start = lattice.index({"block": 256, "per_thread": 1})
    configs = [lattice.config(ix) for ix in lattice.neighbours(start)]
    assert {"block": 512, "per_thread": 1} not in configs  # 512 threads: illegal on its own
    assert {"block": 512, "per_thread": 2} in configs  # ... repaired by the thread tile
    assert {"block": 128, "per_thread": 1} in configs
    assert all(_coupled().is_legal(c) for c in configs)


def test_growth_reaches_the_best_point_from_the_small_end() -> None:
    space = _coupled()
    seed = smallest_legal(space)
    assert seed == {"block": 32, "per_thread": 1}
    # Cost falls with the block size (more reuse) and rises with the per-thread tile beyond 4.
    def score(c: dict) -> float:
        return 1000 / c["block"] + (c["per_thread"] > 4) * 5

    found = grow(space, score, [seed], budget=100)
    best = min(found, key=lambda cs: cs[1])[0]
    assert best == {"block": 1024, "per_thread": 4}
    assert all(space.is_legal(c) for c, _ in found)


def test_growth_respects_its_budget_and_skips_dead_ends() -> None:
    space = _coupled()
    found = grow(space, lambda c: None if c["per_thread"] == 2 else float(c["block"]),
                 [{"block": 32, "per_thread": 1}], budget=5)
    assert len(found) <= 5 and all(c["per_thread"] != 2 for c, _ in found)
