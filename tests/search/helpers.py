"""Shared pieces of the search tests: a toy rule with a small space, synthetic recorded spaces, a counting
replay backend.  Also imported by ``child_tune.py``, which runs in a separate process."""

from __future__ import annotations

import math
import random
from typing import Any

import schedlib as sl
from schedlib.hw import resolve
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules import find_rule
from schedlib.rules.base import Config, Knob, Rule, Space
from schedlib.search.backends.replay import ReplayBackend
from schedlib.search.records import Measurement


class ToyRule(Rule):
    """Applies to any func; 4 x 4 x 3 points, those with a + b > 5 illegal (48 - 3 = 45 legal points)."""

    name = "toy"

    def analyze(self, func: Func, target: Any) -> Any:
        return True

    def space(self, func: Func, target: Any) -> Space:
        def check(c: Config) -> str | None:
            return "a + b > 5" if c["a"] + c["b"] > 5 else None

        return Space("toy", (Knob("a", (0, 1, 2, 3)), Knob("b", (0, 1, 2, 3)), Knob("c", (1, 2, 4)),
                             Knob("fixed", (True,))), check)

    def default_config(self, func: Func, target: Any) -> Config:
        return {"a": 0, "b": 0, "c": 1, "fixed": True}

    def schedule(self, func: Func, facts: Any, config: Config, target: Any) -> Schedule:
        return Schedule(func)


def toy_time(c: Config) -> float:
    """A bumpy landscape whose optimum (a=2, b=3, c=2) is not at an edge of the space."""
    return 10.0 + (c["a"] - 2) ** 2 * 3 + abs(c["b"] - 3) * 2 + abs(math.log2(c["c"]) - 1) * 5 + (c["a"] * c["c"]) % 3


def toy_func(n: int = 64) -> Func:
    return sl.workloads.matmul(n, n, n)


def toy_table(rule: Rule | None = None, func: Func | None = None) -> list[dict[str, Any]]:
    rule, func = rule or ToyRule(), func or toy_func()
    return [{"config": c, "time_us": toy_time(c)} for c in rule.space(func, resolve("h100")).enumerate()]


def matmul_time(c: Config, M: int, N: int, K: int, noise: random.Random | None = None) -> float:
    """A synthetic but structured matmul time: traffic that falls with the block tile, a per-thread tile
    sweet spot, a wave-quantization term, vector-width and block_k preferences, optional +-4 % noise."""
    blocks = math.ceil(M / c["block_m"]) * math.ceil(N / c["block_n"])
    waves = math.ceil(blocks / 132) / max(blocks / 132, 1e-9)
    traffic = M * N * K * 4 * (1 / c["block_m"] + 1 / c["block_n"]) / 3.35e6
    compute = 2 * M * N * K / 66.9e6 * (1 + 0.6 * abs(math.log2(c["thread_m"] * c["thread_n"]) - 5))
    t = max(traffic, compute) * waves * (1 + 0.15 * (c["vector"] != 4)) * (1 + 0.08 * abs(math.log2(c["block_k"]) - 4))
    return t * (noise.uniform(0.96, 1.04) if noise else 1.0)


def matmul_table(M: int = 1024, N: int = 1024, K: int = 1024, seed: int = 0) -> tuple[Func, list[dict[str, Any]]]:
    f = sl.workloads.matmul(M, N, K)
    profile = resolve("h100")
    rng = random.Random(seed)
    space = find_rule(f, profile).space(f, profile)
    return f, [{"config": c, "time_us": matmul_time(c, M, N, K, rng)} for c in space.enumerate()]


class CountingReplay(ReplayBackend):
    """A replay backend that remembers every config it measured (to prove nothing is measured twice)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.measured: list[Config] = []

    def measure(self, config: Config, schedule: Schedule | None) -> Measurement:
        self.measured.append(dict(config))
        return super().measure(config, schedule)
