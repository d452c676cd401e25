"""The knob-space contract (``Space``/``Knob``): enumerate, size, sample, validate, reason, is_legal —
on a hand-made space with known answers and on every rule's real space."""

from __future__ import annotations

import itertools
import math
import random
import re

import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.rules import Knob, Space


def toy(check=True) -> Space:
    """a in (1, 2, 3), b in ('x', 'y'); the check forbids a == 3 with b == 'y', and a == 2 with b == 'x'."""

    def rule(c):
        if c["a"] == 3 and c["b"] == "y":
            return "a=3 needs b=x"
        if c["a"] == 2 and c["b"] == "x":
            return "a=2 needs b=y"
        return None

    return Space("toy", (Knob("a", (1, 2, 3), "first"), Knob("b", ("x", "y"), "second")), rule if check else None)


LEGAL = [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "y"}, {"a": 3, "b": "x"}]


def test_size_counts_the_full_product() -> None:
    assert toy().size == 6
    assert toy(check=False).size == 6
    assert Space("empty", ()).size == 1


def test_enumerate_yields_legal_points_in_lexicographic_order() -> None:
    assert list(toy().enumerate()) == LEGAL
    assert list(toy().enumerate(limit=2)) == LEGAL[:2]
    assert list(toy().enumerate(limit=100)) == LEGAL
    everything = [dict(zip("ab", v)) for v in itertools.product((1, 2, 3), ("x", "y"))]
    assert list(toy(check=False).enumerate()) == everything


def test_reason_and_is_legal() -> None:
    space = toy()
    assert space.names == ["a", "b"]
    assert space.knob("b").values == ("x", "y")
    with pytest.raises(KeyError, match=re.escape("the toy space has no knob 'c'; its knobs are ['a', 'b']")):
        space.knob("c")
    for c in LEGAL:
        assert space.reason(c) is None and space.is_legal(c)
    assert space.reason({"a": 3, "b": "y"}) == "a=3 needs b=x"
    assert space.reason({"a": 2, "b": "x"}) == "a=2 needs b=y"
    assert space.reason({"a": 4, "b": "x"}) == "knob a=4 is not one of [1, 2, 3]"
    assert space.reason({"b": "x"}) == "knob a is missing"
    assert space.reason({"a": 1, "b": "x", "c": 0}) == "unknown knob(s) ['c']; the toy space has ['a', 'b']"
    # a misspelt knob is named, not reported as the knob it was meant to be
    assert space.reason({"aa": 1, "b": "x"}) == "unknown knob(s) ['aa']; the toy space has ['a', 'b']"
    assert space.reason({}) == "knobs a, b are missing"
    assert not space.is_legal({"a": 1})


def test_validate_returns_a_copy_or_raises_naming_the_knob() -> None:
    space = toy()
    c = {"a": 1, "b": "y"}
    out = space.validate(c)
    assert out == c and out is not c
    with pytest.raises(sl.ScheduleError) as info:
        space.validate({"a": 1, "b": "z"})
    err = info.value
    assert (err.primitive, err.argument, err.value) == ("toy.apply", "config", {"a": 1, "b": "z"})
    assert err.reason == "knob b='z' is not one of ['x', 'y']"
    with pytest.raises(sl.ScheduleError, match="a=3 needs b=x"):
        space.validate({"a": 3, "b": "y"})


def test_sample_is_legal_reproducible_and_covers_the_space() -> None:
    space = toy()
    seen = [space.sample(random.Random(s)) for s in range(200)]
    assert all(space.is_legal(c) for c in seen)
    assert {str(c) for c in seen} == {str(c) for c in LEGAL}  # every legal point gets drawn
    assert space.sample(random.Random(7)) == space.sample(random.Random(7))


def test_sample_of_an_empty_space_raises() -> None:
    never = Space("never", (Knob("a", (1, 2)),), lambda c: "nothing is legal")
    assert list(never.enumerate()) == []
    with pytest.raises(sl.ScheduleError, match="found no legal point"):
        never.sample(random.Random(0), tries=20)


REAL = [
    ("matmul", lambda: wl.matmul(333, 200, 77, dtype="float16", trans_b=True, epilogue="gelu")),
    ("gemv", lambda: wl.gemv(4096, 1000, "float16")),
    ("gemv", lambda: wl.gemv(4096, 1000, "bfloat16", trans=True, batch=4)),
    ("reduction", lambda: wl.reduce(100, 1000, "sumsq")),
    ("reduction", lambda: wl.reduce(100, 1000, "min", axis=0)),
    ("general_reduction", lambda: wl.layernorm(8, 4096)),
    ("transpose", lambda: wl.transpose(256, 512, "float16")),
    ("elementwise", lambda: wl.elementwise((128, 128), ("add", "gelu"))),
    ("fallback", lambda: wl.softmax(16, 256)),
]


@pytest.mark.parametrize("rule_name, make", REAL, ids=[f"{r}-{i}" for i, (r, _) in enumerate(REAL)])
@pytest.mark.parametrize("target", ["h100", "t4"])
def test_every_rule_space_keeps_the_contract(rule_name, make, target) -> None:
    func = make()
    rule = rules.get_rule(rule_name)
    profile = sl.hw.load(target)
    space = rule.space(func, profile)
    assert space.rule == rule_name
    assert len(set(space.names)) == len(space.names)
    assert all(k.values and len(set(map(repr, k.values))) == len(k.values) for k in space.knobs)
    points = list(space.enumerate())
    assert 0 < len(points) <= space.size
    assert len({str(p) for p in points}) == len(points)
    # Legal must mean launchable: what each point asks of the GPU, as the rule's own tiling works it out
    # (independently of the space's check), is within the profile's limits.
    for p in points:
        t = rule.tiling(func, profile, p)
        assert t is None or (0 < t.threads <= profile.max_threads_per_block
                             and 0 <= t.shared_bytes <= profile.shared_memory_per_block), (p, t)
    rng = random.Random(1)
    for _ in range(10):
        c = space.sample(rng)
        assert c in points
    default = rule.default_config(func, profile)
    assert default in points, f"default {default} is not a legal point of the {rule_name} space"
    tiling = rule.tiling(func, profile, default)
    assert tiling is not None and 0 < tiling.threads <= profile.max_threads_per_block
    assert 0 <= tiling.shared_bytes <= profile.shared_memory_per_block


def test_a_config_read_back_from_a_carver_row_applies() -> None:
    """The carver's DataFrame holds its knob values as numpy scalars; they are the values they hold."""
    func = sl.workloads.matmul(64, 64, 64)
    rule = sl.rules.get_rule("matmul")
    row = sl.carver.carve(func, "h100", 1).iloc[0]
    config = {name: row[name] for name in rule.space(func, "h100").names}
    assert any(type(v).__module__ == "numpy" for v in config.values())
    sch = rule.apply(func, "h100", config)
    assert sch.config == row["config"] and all(type(v) in (int, bool) for v in sch.config.values())


def test_an_explicit_config_for_a_func_the_rule_does_not_take_says_why() -> None:
    gemv = sl.rules.get_rule("gemv")
    with pytest.raises(sl.ScheduleError, match=r"gemv.apply: argument func='matmul': the gemv rule does not "
                                               r"apply: no small axis"):
        gemv.apply(sl.workloads.matmul(64, 64, 64), "h100", {"rows_per_block": 4})
    assert gemv.apply(sl.workloads.matmul(64, 64, 64), "h100") is None  # the dispatcher's question: no


SMALL_BLOCKS = [wl.gemv(512, 512), wl.gemv(512, 512, trans=True), wl.gemv(512, 512, batch=4), wl.reduce(256, 512),
                wl.reduce(256, 512, axis=0), wl.reduce(4, 1 << 20), wl.softmax(64, 512, axis=0), wl.transpose(256, 256),
                wl.elementwise((256, 256)), wl.softmax(64, 512), wl.matmul(128, 128, 128)]


@pytest.mark.parametrize("func", SMALL_BLOCKS, ids=lambda f: f"{f.name}-{f.blocks[-1].kinds}")
def test_every_default_fits_a_card_with_small_thread_blocks(func: sl.Func) -> None:
    """A profile allowing 128 threads per block: each default is a legal point of the space, the one nearest
    the expert choice, and its kernel launches within the limit."""
    import dataclasses

    small = dataclasses.replace(schedlib.hw.load("a100"), max_threads_per_block=128)
    rule = rules.find_rule(func, small)
    config = rule.default_config(func, small)
    assert rule.space(func, small).reason(config) is None, config
    kernel = sl.build(rule.apply(func, small), small)
    assert all(math.prod(spec.block) <= 128 for spec in kernel.launch), [spec.block for spec in kernel.launch]
    assert config == rule.default_config(func, "a100") or any(
        config[k] < v for k, v in rule.default_config(func, "a100").items() if isinstance(v, int))


def test_a_two_stage_reduction_fits_both_kernels_to_small_thread_blocks() -> None:
    """The second stage reduces ``blocks_per_row`` partials with as many threads: on a card allowing 64 threads
    per block it may not take more partials than that (its 128-thread kernel was built and carved)."""
    import dataclasses

    small = dataclasses.replace(schedlib.hw.load("h100"), max_threads_per_block=64)
    func = wl.reduce(7, 100_000)
    rule = rules.get_rule("reduction")
    assert "the second stage reduces 128 partials with 128 threads, more than 64" in rule.space(func, small).reason(
        {"rows_per_block": 1, "threads_k": 64, "vector": 4, "blocks_per_row": 128})
    for config in [rule.default_config(func, small), *sl.carver.carve(func, small, 5)["config"]]:
        kernel = sl.build(rule.apply(func, small, config), small)
        assert all(math.prod(spec.block) <= 64 for spec in kernel.launch), (config, kernel.launch)
    with pytest.raises(sl.BuildError, match=r"has 128 threads per block; target h100 allows 64"):
        sl.build(rule.apply(func, "h100", {"rows_per_block": 1, "threads_k": 128, "vector": 4,
                                           "blocks_per_row": 1}), small)


def test_a_matmul_with_no_legal_config_on_a_card_says_why() -> None:
    """Regression: a profile whose register limits no tile meets made the matmul default a bare StopIteration."""
    import dataclasses

    tiny = dataclasses.replace(schedlib.hw.load("h100"), registers_per_sm=8192, max_registers_per_thread=32)
    func = wl.matmul(512, 512, 512)
    assert next(rules.get_rule("matmul").space(func, tiny).enumerate(), None) is None
    with pytest.raises(sl.ScheduleError, match=r"matmul.default_config: argument target='h100': no config of this "
                                               r"matmul's space is legal on it; .* registers per thread exceed 32"):
        rules.get_rule("matmul").default_config(func, tiny)
